//! What the benchmarks that drive a real mmkd share: starting it on the simulated node
//! (8 A100s, first fit, no kernel scheduler) in a temporary directory, and the workload
//! jobs they submit.

// Each benchmark uses a part of what is here.
#![allow(dead_code)]

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

impl Mmkd {
    /// The CPU time mmkd has used (user and system), from /proc.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .expect("mmkd's /proc stat");
        // The fields after the command's closing parenthesis; utime and stime are the
        // 14th and 15th of the line, the 12th and 13th after it.
        let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 =
            f[11].parse::<f64>().expect("utime") + f[12].parse::<f64>().expect("stime");
        // SAFETY: sysconf with a valid name.
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }
}

impl Drop for Mmkd {
    /// SIGTERM, as a service manager stops it (SIGKILL after 30 s), then the MPS control
    /// daemons it leaves for the next mmkd on its data dir, which a benchmark never
    /// starts: left running, they would load the next benchmark's machine.
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let began = Instant::now();
        while !matches!(self.child.try_wait(), Ok(Some(_))) {
            if began.elapsed() > Duration::from_secs(30) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        kill_processes_under(self._dir.path());
    }
}

/// Kills every process whose MPS pipe directory is under `dir`.
fn kill_processes_under(dir: &std::path::Path) {
    let marker = format!("CUDA_MPS_PIPE_DIRECTORY={}/", dir.display());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(p.path().join("environ")) else {
            continue;
        };
        if env
            .split(|b| *b == 0)
            .any(|var| var.starts_with(marker.as_bytes()))
        {
            // SAFETY: kill(2) with a pid read from /proc and a signal number.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
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

/// A free loopback address for `--metrics`.
pub fn free_loopback() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    format!("127.0.0.1:{port}")
}

/// One scrape of mmkd's metrics endpoint at `addr`: the whole response.
pub fn scrape(addr: &str) -> Vec<u8> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).expect("the metrics port");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("response");
    assert!(raw.starts_with(b"HTTP/1.1 200"), "a scrape failed");
    raw
}

/// The cumulative buckets of the histogram `name` in a scrape: (upper bound, count), in
/// order, `+Inf` last.
pub fn histogram(scraped: &str, name: &str) -> Vec<(f64, u64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    scraped
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The upper bound of the bucket that holds the `p` quantile (`None` for no samples).
pub fn bucket_quantile(buckets: &[(f64, u64)], p: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let want = (total as f64 * p).ceil() as u64;
    buckets.iter().find(|(_, n)| *n >= want).map(|(le, _)| *le)
}

/// How many jobs are in `state` (every page of the list).
pub async fn count(c: &mut Clients, state: v1::JobState) -> usize {
    let (mut n, mut token) = (0, String::new());
    loop {
        let page = c
            .jobs
            .list_jobs(v1::ListJobsRequest {
                states: vec![state as i32],
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        n += page.jobs.len();
        if page.next_page_token.is_empty() {
            return n;
        }
        token = page.next_page_token;
    }
}
