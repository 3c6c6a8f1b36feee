//! What the lab's tests share: running `mmk-lab`, and the fake driver.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mmk_kernel_sched::artifacts::{self, Built, FAKE_CUDA};

/// Runs mmk-lab in `dir`.
pub fn lab_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mmk-lab"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("mmk-lab runs")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A command's standard output as JSON, once it succeeded.
pub fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The interposer, the fake driver and its test program, built once for the test binary.
pub fn built() -> Built {
    artifacts::built_for_tests(&artifacts::ALL).unwrap_or_else(|e| panic!("{e}"))
}

/// The fake driver as `libcuda.so.1` and `libcudart.so.13` in `dir/lib`.
pub fn fake_driver_in(bin: &Built, dir: &Path) -> PathBuf {
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    std::fs::copy(bin.join(FAKE_CUDA), lib.join("libcuda.so.1")).expect("copy");
    std::fs::copy(bin.join(FAKE_CUDA), lib.join("libcudart.so.13")).expect("copy");
    lib
}
