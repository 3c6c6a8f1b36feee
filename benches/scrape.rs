//! How long one scrape of `mmkd --metrics` takes, and the CPU it costs mmkd, on a node
//! with many running jobs and many that ended in the last five minutes (whose series a
//! scrape still carries): `cargo bench --bench scrape` (1,000 ended jobs, then 64 running
//! on 8 simulated A100s), or `cargo bench --bench scrape -- JOBS SCRAPES ENDED`. It
//! starts its own mmkd on a temporary socket and a free loopback port, and prints one
//! JSON line of what it measured (docs/metrics.md).

use std::time::{Duration, Instant};

use mmk_proto::v1;

#[path = "support/mod.rs"]
mod support;

fn scrape(addr: &str) -> usize {
    support::scrape(addr).len()
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
    let ended = args.get(2).copied().unwrap_or(1000);
    let addr = support::free_loopback();
    let mmkd = support::start(&["--metrics", &addr]).await;
    let mut c = mmkd.clients.clone();
    // Jobs that end at once (10 ms of simulated work), all ended before the timing.
    for i in 0..ended {
        c.jobs
            .submit_job(v1::SubmitJobRequest {
                spec: Some(support::workload_spec(format!("ended-{i}"), i, 10)),
                ..Default::default()
            })
            .await
            .expect("submit");
    }
    let started = Instant::now();
    let succeeded = loop {
        let n = support::count(&mut c, v1::JobState::Succeeded).await;
        if n >= ended || started.elapsed() > Duration::from_secs(120) {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
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
        let n = support::count(&mut c, v1::JobState::Running).await;
        if n >= jobs || started.elapsed() > Duration::from_secs(60) {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("{running} running, {succeeded} ended: scraping");
    // The first scrape looks the users up and sizes the buffers; it is timed on its own.
    let t = Instant::now();
    scrape(&addr);
    let first_ms = t.elapsed().as_secs_f64() * 1000.0;
    let mut times = Vec::with_capacity(scrapes);
    let mut bytes = 0;
    let cpu = mmkd.cpu_seconds();
    for _ in 0..scrapes {
        let t = Instant::now();
        bytes = scrape(&addr);
        times.push(t.elapsed());
    }
    let cpu_ms = (mmkd.cpu_seconds() - cpu) * 1000.0 / scrapes as f64;
    drop(mmkd);
    println!(
        "{{\"jobs_running\":{running},\"jobs_ended\":{succeeded},\"scrapes\":{scrapes},\"first_scrape_ms\":{first_ms:.2},\"scrape_ms\":{{\"p50\":{:.2},\"p99\":{:.2},\"max\":{:.2}}},\"mmkd_cpu_ms_per_scrape\":{cpu_ms:.2},\"bytes\":{bytes}}}",
        ms(&mut times, 0.5),
        ms(&mut times, 0.99),
        ms(&mut times, 1.0)
    );
}
