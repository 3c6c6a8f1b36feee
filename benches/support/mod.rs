//! What the benchmarks that drive a real mmkd share: starting it on the simulated node
//! (8 A100s, first fit, no kernel scheduler) in a temporary directory, and the workload
//! jobs they submit.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mmk_proto::v1;
use mmkctl::client::{Clients, Target, connect};

/// An mmkd of the benchmark's own; killed when dropped.
pub struct Mmkd {
    child: Child,
    _dir: tempfile::TempDir,
    pub clients: Clients,
}

impl Drop for Mmkd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts mmkd with `extra` flags and waits until it answers on its socket.
pub async fn start(extra: &[&str]) -> Mmkd {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("mmkd.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_mmkd"))
        .args(["--backend", "sim", "--sim-gpus", "a100-80gb:8"])
        .args(["--kernel-policy", "off", "--planner", "first-fit"])
        .args(extra)
        .arg("--socket")
        .arg(&socket)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mmkd starts");
    let target = Target::Socket(socket);
    let started = Instant::now();
    let clients = loop {
        match connect(&target).await {
            Ok(c) => break c,
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("mmkd did not come up: {}", e.message),
        }
    };
    Mmkd {
        child,
        _dir: dir,
        clients,
    }
}

/// A BERT-training workload job of 4 GiB named `name`, online one time in four.
pub fn workload_spec(name: String, i: usize, duration_ms: u64) -> v1::JobSpec {
    v1::JobSpec {
        name,
        class: if i.is_multiple_of(4) {
            v1::JobClass::Online as i32
        } else {
            v1::JobClass::Offline as i32
        },
        gpu_memory_mib: 4096,
        task: Some(v1::job_spec::Task::Workload(v1::WorkloadTask {
            name: "bert-train".into(),
            duration_ms,
            ..Default::default()
        })),
        ..Default::default()
    }
}
