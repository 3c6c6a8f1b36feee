//! Where the interposer, the fake CUDA driver and the fake NVML library are.
//!
//! They are `cdylib`s (each also an `rlib`, so that cargo builds and places the shared
//! library whenever it builds the package's integration tests), and the fakes come with
//! test programs. `cargo build --workspace` puts all of them in `target/<profile>/`, next to
//! `mmkd`; `cargo test --workspace` puts the programs there and leaves the shared libraries
//! in its `deps/`. Tests find them with [`built_for_tests`] and never run cargo themselves.

use std::path::PathBuf;

/// The interposer that mmkd puts in a job's `LD_PRELOAD`.
pub const INTERPOSER: &str = "libmmk_interposer.so";
/// The fake CUDA driver; tests install it as `libcuda.so.1` (and `libcudart.so.13`).
pub const FAKE_CUDA: &str = "libmmk_fake_cuda.so";
/// The test program that launches kernels through the fake driver the way cudart does.
pub const FAKE_APP: &str = "mmk-fake-cuda-app";
/// The fake NVML library (`mmkd --nvml-lib`) and its inspector (crate `fake-nvml`).
pub const FAKE_NVML: &str = "libmmk_fake_nvml.so";
pub const FAKE_NVML_TOOL: &str = "mmk-fake-nvml";

/// Everything the end-to-end tests need.
pub const ALL: [&str; 5] = [INTERPOSER, FAKE_CUDA, FAKE_APP, FAKE_NVML, FAKE_NVML_TOOL];

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

/// Where the test artifacts are: the running test's `target/<profile>/`, where cargo puts
/// programs, and its `deps/`, where it puts a shared library built with a package's tests
/// (and from where `cargo build` copies it up).
#[derive(Debug, Clone)]
pub struct Built {
    dir: PathBuf,
}

impl Built {
    /// The path of artifact `name`: the shared library in `deps/` (always the last one
    /// cargo built), a program (or a library no test build touched) in the directory above.
    pub fn join(&self, name: &str) -> PathBuf {
        let fresh = self.dir.join("deps").join(name);
        if name.ends_with(".so") && fresh.is_file() {
            fresh
        } else {
            self.dir.join(name)
        }
    }
}

/// Some of the artifacts a test needs are not built.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{} not built (looked in {dir} and its deps/); `cargo test --workspace` builds them, \
     or `cargo build -p mmk-interposer -p mmk-fake-cuda -p mmk-fake-nvml`",
    missing.join(", ")
)]
pub struct NotBuilt {
    pub missing: Vec<String>,
    pub dir: String,
}

/// The built artifacts `names` (see [`ALL`]) for the running test. They are what the last
/// cargo build left; a test run of the whole workspace builds them before any test runs.
pub fn built_for_tests(names: &[&str]) -> Result<Built, NotBuilt> {
    let exe = std::env::current_exe().unwrap_or_default();
    // A test runs from target/<profile>/deps/; a program from target/<profile>/.
    let dir = match exe.parent() {
        Some(d) if d.ends_with("deps") => d.parent().unwrap_or(d).to_path_buf(),
        Some(d) => d.to_path_buf(),
        None => PathBuf::new(),
    };
    let built = Built { dir };
    let missing: Vec<String> = names
        .iter()
        .filter(|n| !built.join(n).is_file())
        .map(|n| (*n).to_owned())
        .collect();
    if missing.is_empty() {
        Ok(built)
    } else {
        Err(NotBuilt {
            missing,
            dir: built.dir.display().to_string(),
        })
    }
}
