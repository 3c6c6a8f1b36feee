//! Where the interposer, the fake CUDA driver and the fake NVML library are, and (for
//! tests) how to build them.
//!
//! They are `cdylib`s, which `cargo test` does not build on its own: tests call
//! [`build_for_tests`], which runs `cargo build` for them once per test process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The interposer that mmkd puts in a job's `LD_PRELOAD`.
pub const INTERPOSER: &str = "libmmk_interposer.so";
/// The fake CUDA driver; tests install it as `libcuda.so.1` (and `libcudart.so.13`).
pub const FAKE_CUDA: &str = "libmmk_fake_cuda.so";
/// The test program that launches kernels through the fake driver the way cudart does.
pub const FAKE_APP: &str = "mmk-fake-cuda-app";
/// The fake NVML library (`mmkd --nvml-lib`) and its inspector (crate `fake-nvml`).
pub const FAKE_NVML: &str = "libmmk_fake_nvml.so";
pub const FAKE_NVML_TOOL: &str = "mmk-fake-nvml";

/// `name` in the directory of the running executable, or the one above it (where cargo
/// puts libraries when the executable is a test in `deps/`).
pub fn find_next_to_exe(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [Some(dir), dir.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Why the test artifacts could not be built.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BuildError {
    #[error("running {cargo}: {why}")]
    Spawn { cargo: String, why: String },
    #[error("cargo build of the interposer failed:\n{0}")]
    Failed(String),
    #[error("{} is missing after the build", .0.display())]
    Missing(PathBuf),
}

/// Build the interposer, the fake driver and its test program, and the fake NVML library
/// and its inspector with the cargo that runs the tests, into `target_dir`; returns the directory that holds them. Runs cargo once per
/// process; later calls return the first result.
pub fn build_for_tests(target_dir: &Path) -> Result<PathBuf, BuildError> {
    static BUILT: OnceLock<Result<PathBuf, BuildError>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
            let output = Command::new(&cargo)
                .args(["build", "--quiet", "--locked"])
                .args([
                    "-p",
                    "mmk-interposer",
                    "-p",
                    "mmk-fake-cuda",
                    "-p",
                    "mmk-fake-nvml",
                ])
                .arg("--manifest-path")
                .arg(&manifest)
                .arg("--target-dir")
                .arg(target_dir)
                .output()
                .map_err(|e| BuildError::Spawn {
                    cargo: cargo.to_string_lossy().into_owned(),
                    why: e.to_string(),
                })?;
            if !output.status.success() {
                return Err(BuildError::Failed(
                    String::from_utf8_lossy(&output.stderr).into_owned(),
                ));
            }
            let dir = target_dir.join("debug");
            for name in [INTERPOSER, FAKE_CUDA, FAKE_APP, FAKE_NVML, FAKE_NVML_TOOL] {
                if !dir.join(name).is_file() {
                    return Err(BuildError::Missing(dir.join(name)));
                }
            }
            Ok(dir)
        })
        .clone()
}
