//! How long one scrape of `mmkd --metrics` takes on a node with many running jobs:
//! `cargo bench --bench scrape` (64 jobs on 8 simulated A100s), or `cargo bench --bench
//! scrape -- JOBS SCRAPES`. It starts its own mmkd on a temporary socket and a free
//! loopback port, and prints one JSON line of what it measured (docs/metrics.md).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use mmk_proto::v1;

#[path = "support/mod.rs"]
mod support;

fn scrape(addr: &str) -> usize {
    let mut s = TcpStream::connect(addr).expect("the metrics port");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("response");
    assert!(raw.starts_with(b"HTTP/1.1 200"), "a scrape failed");
    raw.len()
}

fn ms(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let jobs = args.first().copied().unwrap_or(64);
    let scrapes = args.get(1).copied().unwrap_or(200);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let addr = format!("127.0.0.1:{port}");
    let mmkd = support::start(&["--metrics", &addr]).await;
    let mut c = mmkd.clients.clone();
    let started = Instant::now();
    // Jobs of 4 GiB, two to each 1g.10gb: every one runs.
    for i in 0..jobs {
        c.jobs
            .submit_job(v1::SubmitJobRequest {
                spec: Some(support::workload_spec(format!("scrape-{i}"), i, 3_600_000)),
                ..Default::default()
            })
            .await
            .expect("submit");
    }
    let running = loop {
        let n = c
            .jobs
            .list_jobs(v1::ListJobsRequest {
                states: vec![v1::JobState::Running as i32],
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner()
            .jobs
            .len();
        if n >= jobs || started.elapsed() > Duration::from_secs(60) {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The first scrape looks the users up and sizes the buffers; it is timed on its own.
    let t = Instant::now();
    scrape(&addr);
    let first_ms = t.elapsed().as_secs_f64() * 1000.0;
    let mut times = Vec::with_capacity(scrapes);
    let mut bytes = 0;
    for _ in 0..scrapes {
        let t = Instant::now();
        bytes = scrape(&addr);
        times.push(t.elapsed());
    }
    drop(mmkd);
    println!(
        "{{\"jobs_running\":{running},\"scrapes\":{scrapes},\"first_scrape_ms\":{first_ms:.2},\"scrape_ms\":{{\"p50\":{:.2},\"p99\":{:.2},\"max\":{:.2}}},\"bytes\":{bytes}}}",
        ms(&mut times, 0.5),
        ms(&mut times, 0.99),
        ms(&mut times, 1.0)
    );
}
