//! The fake node as an operator and a management client meet it: the `mmk-fake-nvml`
//! inspector makes and changes the state file, and the built `libmmk_fake_nvml.so`, loaded
//! through nvml-wrapper as mmkd loads the real library, reads the same state.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mmk_fake_nvml::state::STATE_ENV;
use nvml_wrapper::Nvml;

fn tool(state: &Path, verb: &str, rest: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mmk-fake-nvml"))
        .arg(verb)
        .arg(state)
        .args(rest)
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The shared library cargo built with this test, beside it in `deps/` (the package is also
/// an rlib, so it is built whenever its tests are).
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libmmk_fake_nvml.so");
    assert!(lib.is_file(), "{} is not built", lib.display());
    lib
}

#[test]
fn the_inspector_and_the_library_see_one_node() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("nvml.json");
    ok(tool(&state, "init", &["a100-80gb:2"]));
    ok(tool(&state, "create", &["1", "3g.40gb", "4"]));
    let show = ok(tool(&state, "show", &[]));
    let line = show.lines().find(|l| l.contains("3g.40gb")).unwrap();
    assert!(line.starts_with('1'), "on GPU 1: {show}");
    assert!(line.contains("4:4"), "placed at 4, 4 slices: {show}");

    // What the driver refuses, the inspector refuses with the driver's reason.
    let refused = tool(&state, "mig", &["1", "off"]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr).to_lowercase();
    assert!(why.contains("instance"), "{why}");
    let refused = tool(&state, "create", &["0", "3g.40gb", "1"]);
    assert!(!refused.status.success(), "3g.40gb cannot start at 1");

    // SAFETY: this binary's only test, and nothing else reads the environment yet.
    unsafe { std::env::set_var(STATE_ENV, &state) };
    let nvml = Nvml::builder()
        .lib_path(library().as_os_str())
        .init()
        .unwrap();
    assert_eq!(nvml.device_count().unwrap(), 2);
    let gpu = nvml.device_by_index(1).unwrap();
    assert!(
        gpu.name().unwrap().contains("A100"),
        "{}",
        gpu.name().unwrap()
    );
    assert_eq!(gpu.mig_mode().unwrap().current, 1, "MIG on");
    let total = gpu.memory_info().unwrap().total;
    assert!((79 << 30..=81 << 30).contains(&total), "{total} bytes");
}
