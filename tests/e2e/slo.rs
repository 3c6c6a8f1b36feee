//! The SLO control on the fake driver: an online job's requests (its busy periods in its
//! partition's gate) over its objective raise its partition's isolation a level at a time,
//! slack lowers it again, and each change is an event of the job, its status in `mmkctl
//! jobs get` and a metric. The fake driver runs each kernel for the time the job asks, so
//! the service's latency here is what its command line says, whatever the level.

use std::time::Duration;

use mmk_kernel_sched::artifacts::{FAKE_APP, FAKE_CUDA, INTERPOSER};
use mmk_proto::v1;
use tokio_stream::StreamExt;

use crate::harness::{Daemon, wait_for, wait_state};
use crate::ksched::built;
use mmkctl::client::Clients;

/// mmkd on simulated A100s (`gpus`, as `--sim-gpus`) with the interposer, the MMK planner
/// (which puts an online and an offline job of a few GiB on one partition of one GPU) and
/// the SLO control 20 times faster (a lowering waits 1.5 s instead of 30); metrics on a
/// port of its own. Returns it, the fake app, the fake driver's folder and the metrics
/// address.
fn daemon(gpus: &str) -> (Daemon, String, String, String) {
    let bin = built();
    let interposer = bin.join(INTERPOSER).display().to_string();
    let d = Daemon::start_with(
        gpus,
        &[
            "--planner",
            "mmk",
            "--interposer",
            &interposer,
            "--slo-speed",
            "20",
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    let lib = d.path().join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    std::fs::copy(bin.join(FAKE_CUDA), lib.join("libcuda.so.1")).expect("copy");
    let app = bin.join(FAKE_APP).display().to_string();
    let line = d.wait_log("metrics listening").pop().unwrap_or_default();
    let addr = line
        .split("addr=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the metrics address")
        .to_owned();
    (d, app, lib.display().to_string(), addr)
}

/// A job of the fake app: kernels one at a time, `us` long, `gap_us` apart.
fn job(name: &str, app: &str, lib: &str, args: &str, slo: Option<&str>) -> String {
    let slo = slo.map_or_else(String::new, |s| format!("slo: {s}\n"));
    format!(
        "name: {name}\ngpu_memory: 3GiB\n{slo}command:\n  args: [{app}, --api, driver, --kernels, '10000000', {args}]\n  env: {{LD_LIBRARY_PATH: {lib}}}\n"
    )
}

/// The reasons of job `id`'s events, as a watcher gets them, from now on.
fn watch_reasons(c: &Clients, id: u64) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let mut jobs = c.jobs.clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = jobs
            .watch_jobs(v1::WatchJobsRequest {
                job_id: id,
                include_current: false,
            })
            .await
            .expect("watch")
            .into_inner();
        while let Some(Ok(ev)) = stream.next().await {
            if let Some(j) = ev.job
                && tx.send(j.reason).is_err()
            {
                return;
            }
        }
    });
    rx
}

/// Waits for a reason that contains `needle`; returns it.
async fn reason_with(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    needle: &str,
) -> String {
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(r) = rx.recv().await {
            if r.contains(needle) {
                return r;
            }
        }
        panic!("the watch ended before {needle:?}");
    })
    .await;
    found.unwrap_or_else(|_| panic!("no event says {needle:?} within 60 s"))
}

fn slo_status(d: &Daemon, id: u64) -> serde_json::Value {
    d.ctl_json(&["jobs", "get", &id.to_string()])["slo_status"].clone()
}

#[tokio::test]
async fn a_service_over_its_objective_gets_isolation_raised_a_level_at_a_time_and_lowered_with_slack()
 {
    let (d, app, lib, addr) = daemon("a100-80gb:1");
    let metrics = || crate::metrics::http_get(&addr, "/metrics");
    let mut c = d.clients().await;
    let train = d.submit(
        "--offline",
        &job(
            "train",
            &app,
            &lib,
            "--duration-us, '2000', --gap-us, '2000'",
            None,
        ),
    );
    wait_state(&mut c, train, v1::JobState::Running).await;
    // Requests of 40 ms for the first 8 s, against an objective of 20 ms; then of 1 ms.
    let serve = d.submit(
        "--online",
        &job(
            "serve",
            &app,
            &lib,
            "--duration-us, '40000', --gap-us, '1000', --then-duration-us, '1000', --after-ms, '8000'",
            Some("20ms"),
        ),
    );
    let mut reasons = watch_reasons(&c, serve);
    let running = wait_state(&mut c, serve, v1::JobState::Running).await;
    let trained = d.ctl_json(&["jobs", "get", &train.to_string()]);
    assert_eq!(
        running.assignment.as_ref().map(|a| a.instance_id),
        trained["assignment"]["instance_id"]
            .as_u64()
            .map(|i| i as u32),
        "both jobs in one partition"
    );
    // The gates are on disk here: no device wait, so the ladder goes none -> offline-cap
    // -> paused.
    let first = reason_with(&mut reasons, "isolation raised to offline-cap").await;
    assert!(
        first.contains("p99 <= 20ms"),
        "the reason names the objective: {first}"
    );
    reason_with(&mut reasons, "isolation raised to paused").await;
    let status = slo_status(&d, serve);
    assert_eq!(status["objective"], "p99 <= 20ms", "{status}");
    assert_eq!(status["target_ms"], 20.0, "{status}");
    let m = metrics();
    assert!(
        m.lines()
            .any(|l| l.starts_with("mmk_partition_isolation_level{") && l.ends_with(" 3")),
        "{m}"
    );
    // The service's requests drop to 1 ms: slack, one level down at a time.
    let down = reason_with(&mut reasons, "isolation lowered to offline-cap").await;
    assert!(down.contains("under 50 %"), "{down}");
    reason_with(&mut reasons, "isolation lowered to none").await;
    let status = wait_for("the status at none, with requests measured", || {
        let s = slo_status(&d, serve);
        (s["isolation"] == "none" && s["p99_ms"].is_f64()).then_some(s)
    });
    let p99 = status["p99_ms"].as_f64().expect("a p99");
    assert!(p99 < 10.0, "{status}");
    let m = metrics();
    for series in [
        "mmk_partition_isolation_raised_total{",
        "mmk_partition_isolation_lowered_total{",
    ] {
        assert!(
            m.lines()
                .any(|l| l.starts_with(series) && l.ends_with(" 2")),
            "{series}: {m}"
        );
    }
    assert!(
        m.lines()
            .any(|l| l.starts_with("mmk_job_slo_target_seconds{") && l.ends_with(" 0.02")),
        "{m}"
    );
    // No job was stopped for it: the training runs on, never restarted.
    let t = d.ctl_json(&["jobs", "get", &train.to_string()]);
    assert_eq!(
        (t["state"].as_str(), t["restarts"].as_u64()),
        (Some("RUNNING"), Some(0)),
        "{t}"
    );
    for id in [serve, train] {
        d.ctl(&["jobs", "cancel", &id.to_string()]);
    }
}

#[tokio::test]
async fn a_service_without_an_objective_is_measured_alone_once_and_held_to_the_default() {
    let (d, app, lib, _) = daemon("a100-80gb:1");
    let mut c = d.clients().await;
    let train = d.submit(
        "--offline",
        &job(
            "train",
            &app,
            &lib,
            "--duration-us, '2000', --gap-us, '2000'",
            None,
        ),
    );
    wait_state(&mut c, train, v1::JobState::Running).await;
    let serve = d.submit(
        "--online",
        &job(
            "serve",
            &app,
            &lib,
            "--duration-us, '2000', --gap-us, '1000'",
            None,
        ),
    );
    let mut reasons = watch_reasons(&c, serve);
    wait_state(&mut c, serve, v1::JobState::Running).await;
    // No reference alone: offline work is paused while its requests run, until it has one.
    let probe = reason_with(&mut reasons, "isolation raised to paused").await;
    assert!(probe.contains("measuring job"), "{probe}");
    assert!(probe.contains("p99 <= 4x alone (default)"), "{probe}");
    let back = reason_with(&mut reasons, "isolation lowered to none").await;
    assert!(back.contains("reference alone"), "{back}");
    let status = wait_for("the default objective's status", || {
        let s = slo_status(&d, serve);
        (s["isolation"] == "none" && s["p99_ms"].is_f64()).then_some(s)
    });
    assert_eq!(status["objective"], "p99 <= 4x alone (default)", "{status}");
    let alone = status["alone_p99_ms"].as_f64().expect("a reference");
    assert!((2.0..10.0).contains(&alone), "{status}");
    let target = status["target_ms"].as_f64().expect("a target");
    assert!((target - alone * 4.0).abs() < 1e-6, "{status}");
    // `mmkctl jobs get` says it in words too.
    let out = crate::harness::text(&d.ctl(&["jobs", "get", &serve.to_string()]).stdout);
    assert!(
        out.contains("isolation:") && out.contains("none ("),
        "{out}"
    );
    for id in [serve, train] {
        d.ctl(&["jobs", "cancel", &id.to_string()]);
    }
}

#[tokio::test]
async fn past_paused_a_checkpointable_training_is_moved_to_another_gpu() {
    let (d, app, lib, _) = daemon("a100-80gb:2");
    let mut c = d.clients().await;
    // One GPU held by a job that wants it alone: the training and the service share the
    // other; the first is freed once they run.
    let blocker = d.submit(
        "--offline",
        "name: blocker\ngpu_memory: 10GiB\nexclusive: true\ncommand:\n  args: [sleep, '600']\n",
    );
    wait_state(&mut c, blocker, v1::JobState::Running).await;
    let train = d.submit(
        "--offline",
        &job(
            "train",
            &app,
            &lib,
            "--duration-us, '2000', --gap-us, '2000'",
            None,
        )
        .replace("gpu_memory: 3GiB\n", "gpu_memory: 3GiB\ncheckpoint: true\n"),
    );
    let before = wait_state(&mut c, train, v1::JobState::Running).await;
    let serve = d.submit(
        "--online",
        &job(
            "serve",
            &app,
            &lib,
            "--duration-us, '40000', --gap-us, '1000'",
            Some("20ms"),
        ),
    );
    let mut reasons = watch_reasons(&c, serve);
    let s = wait_state(&mut c, serve, v1::JobState::Running).await;
    let (a, b) = (
        s.assignment.expect("placed"),
        before.assignment.expect("placed"),
    );
    assert_eq!(
        (a.gpu_index, a.instance_id),
        (b.gpu_index, b.instance_id),
        "both in one partition"
    );
    d.ctl(&["jobs", "cancel", &blocker.to_string()]);
    wait_state(&mut c, blocker, v1::JobState::Cancelled).await;
    reason_with(&mut reasons, "isolation raised to paused").await;
    let moved = reason_with(&mut reasons, "isolation raised to moved").await;
    assert!(moved.contains("p99"), "{moved}");
    // The training checkpoints, goes back to the queue and starts on the other GPU.
    let t = wait_for("the training on the other GPU", || {
        let t = d.ctl_json(&["jobs", "get", &train.to_string()]);
        (t["state"] == "RUNNING" && t["assignment"]["gpu"].as_u64() != Some(u64::from(a.gpu_index)))
            .then_some(t)
    });
    assert_eq!(t["restarts"], 1, "{t}");
    let s = d.ctl_json(&["jobs", "get", &serve.to_string()]);
    assert_eq!(
        s["assignment"]["gpu"].as_u64(),
        Some(u64::from(a.gpu_index)),
        "the service stays"
    );
    for id in [serve, train] {
        d.ctl(&["jobs", "cancel", &id.to_string()]);
    }
}
