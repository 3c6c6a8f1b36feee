//! A standard client: Python's grpcio on mmkd's Unix socket, through the example that
//! docs/api.md gives.

use std::process::Command;

use crate::harness::{Daemon, text};

/// Whether python3 can import grpc; without it the test skips, unless
/// MMK_REQUIRE_PYTHON_GRPC is set (CI installs grpcio and sets it).
fn grpcio() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import grpc"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("MMK_REQUIRE_PYTHON_GRPC").is_none(),
            "MMK_REQUIRE_PYTHON_GRPC is set but python3 cannot import grpc (pip install grpcio)"
        );
        eprintln!("skipped: python3 cannot import grpc (pip install grpcio)");
    }
    ok
}

#[tokio::test]
async fn the_python_example_calls_mmkd_over_its_socket() {
    if !grpcio() {
        return;
    }
    let d = Daemon::start("a100-80gb:1");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/python/get_node.py");
    let out = Command::new("python3")
        .arg(example)
        .arg(d.socket())
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    assert!(printed.contains("backend=sim"), "{printed}");
    assert!(printed.starts_with("hostname="), "{printed}");
}
