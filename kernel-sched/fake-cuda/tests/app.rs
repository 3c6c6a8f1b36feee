//! The fake driver under its test program, without the interposer: the program finds the
//! driver as cudart does, every launch runs on the simulated SMs for the duration it asks.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// A library directory with the built fake driver as `libcuda.so.1` and `libcudart.so.13`
/// (the shared library cargo built with this test, beside it in `deps/`).
fn fake_driver_in(dir: &Path) {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libmmk_fake_cuda.so");
    assert!(lib.is_file(), "{} is not built", lib.display());
    for name in ["libcuda.so.1", "libcudart.so.13"] {
        std::fs::copy(&lib, dir.join(name)).unwrap();
    }
}

#[test]
fn every_launch_runs_for_the_time_it_asks() {
    let dir = tempfile::tempdir().unwrap();
    fake_driver_in(dir.path());
    for api in ["driver", "runtime"] {
        let log = dir.path().join(format!("{api}.csv"));
        let out = Command::new(env!("CARGO_BIN_EXE_mmk-fake-cuda-app"))
            .args(["--api", api, "--kernels", "20", "--duration-us", "300"])
            .env("LD_LIBRARY_PATH", dir.path())
            .env("MMK_FAKE_CUDA_LOG", &log)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{api}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["failed"], 0, "{api}: {report}");
        let launched = report["launched"].as_u64().unwrap();
        assert!(launched >= 20, "{api}: {report}");

        // pid,kernel,stream,launch_ns,start_ns,end_ns,sm,passed_ns,passed_by_ns: one line a
        // kernel, each as long as it asked, none started before it was launched.
        let log = std::fs::read_to_string(&log).unwrap();
        let rows: Vec<[u64; 3]> = log
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                assert_eq!(f.len(), 9, "{api}: {l}");
                [3, 4, 5].map(|i| f[i].parse().unwrap())
            })
            .collect();
        assert_eq!(rows.len() as u64, launched, "{api}: {log}");
        for r in &rows {
            let [launch, start, end] = *r;
            assert!(start >= launch, "{api}: {r:?}");
            assert!(end - start >= 300_000, "{api}: ran {} ns", end - start);
        }
    }
}
