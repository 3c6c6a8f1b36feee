//! A bounded load test of mmkd over its Unix socket: concurrent submitters, cancellers (of
//! jobs as they are submitted, and of running jobs while the rest drain) and watchers
//! against the simulated node; one job in eight ends after 2 s, and mmkd's own histogram
//! says how long the record of each end took. `cargo bench --bench load` (defaults below), or
//! `cargo bench --bench load -- SUBMITTERS JOBS_EACH WATCHERS`. It starts its own mmkd on a
//! temporary socket, sends nothing anywhere else, and stops after its jobs or 300 s.
//! It prints one JSON line of what it measured (docs/security.md, "Load").

use std::sync::Arc;
use std::time::{Duration, Instant};

use mmk_proto::v1;
use mmkctl::client::Clients;
use tokio::sync::Mutex;
use tokio_stream::StreamExt;

#[path = "support/mod.rs"]
mod support;

const LIMIT: Duration = Duration::from_secs(300);
/// Cancels of running jobs the test makes.
const RUNNING_CANCELS: usize = 100;

fn percentile(v: &mut [Duration], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

/// Job `i`: a 10-minute BERT training, but one in eight (offline) ends after 2 s, so that
/// jobs end, and their ends are recorded, while the rest are submitted and placed.
fn spec(i: usize) -> v1::JobSpec {
    let duration_ms = if i % 8 == 3 { 2_000 } else { 600_000 };
    support::workload_spec(format!("load-{i}"), i, duration_ms)
}

/// Cancels running jobs, one every 50 ms, RUNNING_CANCELS of them (each cancel returns
/// once the job's end is recorded); how long each took.
async fn cancel_running(mut c: Clients, run_start: Instant) -> Vec<Duration> {
    let mut lat = Vec::new();
    let mut done = std::collections::HashSet::new();
    while lat.len() < RUNNING_CANCELS && run_start.elapsed() < LIMIT {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let running = c
            .jobs
            .list_jobs(v1::ListJobsRequest {
                states: vec![v1::JobState::Running as i32],
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner()
            .jobs;
        let Some(job) = running.iter().find(|j| !done.contains(&j.id)) else {
            continue;
        };
        done.insert(job.id);
        let t = Instant::now();
        let cancelled = c
            .jobs
            .cancel_job(v1::CancelJobRequest {
                id: job.id,
                reason: "load".into(),
            })
            .await;
        if cancelled.is_ok() {
            lat.push(t.elapsed());
        }
    }
    lat
}

/// SUBMITTERS EACH WATCHERS from the command line [default: 8 250 4].
fn counts() -> (usize, usize, usize) {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let at = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    (at(0, 8), at(1, 250), at(2, 4))
}

/// Lists every job, page by page; how many there are.
async fn list_all(mut c: Clients) -> usize {
    let mut listed = 0;
    let mut token = String::new();
    loop {
        let page = c
            .jobs
            .list_jobs(v1::ListJobsRequest {
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        listed += page.jobs.len();
        if page.next_page_token.is_empty() {
            return listed;
        }
        token = page.next_page_token;
    }
}

#[tokio::main]
async fn main() {
    let (submitters, each, watchers) = counts();

    let metrics = support::free_loopback();
    let mmkd = support::start(&["--sim-speed", "1", "--metrics", &metrics]).await;
    let clients = mmkd.clients.clone();

    // Watchers: each sees the current jobs, then every event, until the end.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut watch_tasks = Vec::new();
    for _ in 0..watchers {
        let mut c = clients.clone();
        let mut stop = stop_rx.clone();
        watch_tasks.push(tokio::spawn(async move {
            let mut s = c
                .jobs
                .watch_jobs(v1::WatchJobsRequest {
                    job_id: 0,
                    include_current: true,
                })
                .await
                .expect("watch")
                .into_inner();
            let mut events = 0u64;
            loop {
                tokio::select! {
                    ev = s.next() => match ev {
                        Some(Ok(_)) => events += 1,
                        _ => break,
                    },
                    _ = stop.changed() => break,
                }
            }
            events
        }));
    }

    // Submitters; every fifth job submitted is cancelled by a canceller at once.
    let to_cancel = Arc::new(Mutex::new(Vec::<u64>::new()));
    let run_start = Instant::now();
    let mut submit_tasks = Vec::new();
    for s in 0..submitters {
        let mut c = clients.clone();
        let to_cancel = Arc::clone(&to_cancel);
        submit_tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(each);
            for k in 0..each {
                if run_start.elapsed() > LIMIT {
                    break;
                }
                let t = Instant::now();
                let job = c
                    .jobs
                    .submit_job(v1::SubmitJobRequest {
                        spec: Some(spec(s * each + k)),
                        ..Default::default()
                    })
                    .await
                    .expect("submit")
                    .into_inner()
                    .job
                    .expect("job");
                lat.push(t.elapsed());
                if k.is_multiple_of(5) {
                    to_cancel.lock().await.push(job.id);
                }
            }
            lat
        }));
    }
    let mut cancel_lat = Vec::new();
    let mut c = clients.clone();
    let canceller = tokio::spawn(async move {
        let mut lat = Vec::new();
        loop {
            let next = to_cancel.lock().await.pop();
            match next {
                Some(id) => {
                    let t = Instant::now();
                    let _ = c
                        .jobs
                        .cancel_job(v1::CancelJobRequest {
                            id,
                            reason: "load".into(),
                        })
                        .await;
                    lat.push(t.elapsed());
                }
                None if run_start.elapsed() > LIMIT => break,
                None => tokio::time::sleep(Duration::from_millis(5)).await,
            }
            if lat.len() >= submitters * each.div_ceil(5) {
                break;
            }
        }
        lat
    });
    // While the jobs are submitted and the queue is planned: cancels of running jobs (each
    // returns once the job's end is recorded), one every 50 ms, RUNNING_CANCELS of them.
    let running_canceller = tokio::spawn(cancel_running(clients.clone(), run_start));
    let mut submit_lat = Vec::new();
    for t in submit_tasks {
        submit_lat.extend(t.await.expect("submitter"));
    }
    let submit_secs = run_start.elapsed().as_secs_f64();
    let mut running_cancel_lat = running_canceller.await.expect("running canceller");
    cancel_lat.extend(canceller.await.expect("canceller"));
    let t = Instant::now();
    let listed = list_all(clients.clone()).await;
    let list_ms = t.elapsed().as_secs_f64() * 1000.0;
    let _ = stop_tx.send(true);
    let mut events = Vec::new();
    for w in watch_tasks {
        events.push(w.await.expect("watcher"));
    }
    // How long mmkd took to record the jobs' ends (its own histogram).
    let scraped = String::from_utf8_lossy(&support::scrape(&metrics)).into_owned();
    let exits = support::histogram(&scraped, "mmk_job_exit_record_seconds");
    let ms = |s: Option<f64>| s.map(|s| s * 1000.0);
    drop(mmkd);
    let n = submit_lat.len();
    println!(
        "{}",
        serde_json::json!({
            "submitters": submitters,
            "watchers": watchers,
            "submits": n,
            "submits_per_s": (n as f64 / submit_secs * 10.0).round() / 10.0,
            "submit_p50_ms": percentile(&mut submit_lat, 0.5),
            "submit_p99_ms": percentile(&mut submit_lat, 0.99),
            "cancels": cancel_lat.len(),
            "cancel_p50_ms": percentile(&mut cancel_lat, 0.5),
            "cancel_p99_ms": percentile(&mut cancel_lat, 0.99),
            "running_cancels": running_cancel_lat.len(),
            "running_cancel_p50_ms": percentile(&mut running_cancel_lat, 0.5),
            "running_cancel_p99_ms": percentile(&mut running_cancel_lat, 0.99),
            "exits_recorded": exits.last().map(|b| b.1),
            "exit_record_p50_le_ms": ms(support::bucket_quantile(&exits, 0.5)),
            "exit_record_p99_le_ms": ms(support::bucket_quantile(&exits, 0.99)),
            "list_all_ms": list_ms,
            "listed": listed,
            "watch_events_min": events.iter().min(),
        })
    );
}
