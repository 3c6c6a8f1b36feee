//! `mmkd --metrics` and `mmkctl top`: a job of known kernel time on the fake driver shows
//! up in the per-job series within 10 %; `promtool check metrics` accepts the output; a
//! real Prometheus server (Debian's `prometheus`) scrapes mmkd and answers queries on it.
//! .ci/run installs Prometheus and sets MMK_REQUIRE_PROMETHEUS=1, so in CI the last two
//! cannot pass by skipping; elsewhere the test says why it skips them.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use mmk_kernel_sched::artifacts::{FAKE_APP, INTERPOSER};
use mmk_proto::v1;

use crate::harness::{Daemon, text, wait_for, wait_state};
use crate::ksched::{built, fake_driver_in};

/// `GET path` over plain HTTP/1.1: the body of a 200 answer; `None` when there is none
/// (nothing listens yet, or another status).
fn try_get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    Some(
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_owned()
        },
    )
}

fn http_get(addr: &str, path: &str) -> String {
    try_get(addr, path).unwrap_or_else(|| panic!("GET http://{addr}{path} failed"))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

/// The value of the sample whose line starts with `series` (name and labels as far as
/// given).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// 600 kernels of 5 ms, one every 10 ms: 3 s of GPU time.
fn job_yaml(app: &Path, lib: &Path) -> String {
    format!(
        "name: metered\ngpu_memory: 4GiB\ncommand:\n  args: [{app}, --kernels, '600', --duration-us, '5000', --gap-us, '5000', --blocks, '16', --sync-every, '1']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n",
        app = app.display(),
        lib = lib.display(),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[tokio::test]
async fn metrics_attribute_gpu_time_to_jobs_and_prometheus_scrapes_them() {
    let bin = built();
    let interposer = bin.join(INTERPOSER).display().to_string();
    let d = Daemon::start_with(
        "a100-80gb:1",
        &["--interposer", &interposer, "--metrics", "127.0.0.1:0"],
    );
    let line = d.wait_log("metrics listening").pop().unwrap_or_default();
    let addr = line
        .split("addr=")
        .nth(1)
        .and_then(|a| a.split_whitespace().next())
        .expect("the metrics address")
        .to_owned();
    let lib = fake_driver_in(&bin, d.path());
    let mut c = d.clients().await;
    let id = d.submit("--offline", &job_yaml(&bin.join(FAKE_APP), &lib));
    wait_state(&mut c, id, v1::JobState::Running).await;

    // While it runs, `mmkctl top --once` shows it with its GPU time.
    let top = d.ctl(&["top", "--once", "--interval", "500ms"]);
    assert!(top.status.success(), "{}", text(&top.stderr));
    let frame = text(&top.stdout);
    assert!(frame.starts_with("mmk top\n\nGPU 0\n"), "{frame}");
    let row = frame
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{id} ")))
        .unwrap_or_else(|| panic!("job {id} in {frame}"));
    let gpu_pct: f64 = row
        .split_whitespace()
        .nth(7)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("GPU% in {row:?}"));
    assert!(
        (30.0..=70.0).contains(&gpu_pct),
        "busy half the time: {row}"
    );
    let json = d.ctl_json(&["top", "--once", "--interval", "200ms"]);
    assert_eq!(json[0]["jobs"][0]["id"], id, "{json}");

    wait_state(&mut c, id, v1::JobState::Succeeded).await;
    let m = http_get(&addr, "/metrics");
    let job = format!("job=\"{id}\"");
    let series = |name: &str| {
        m.lines()
            .find(|l| l.starts_with(name) && l.contains(&job))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} of job {id} in\n{m}"))
    };
    // 6 s of kernels: tracked until learned (about 3 s), then counted, each adding the
    // GPU time a launch took while tracked.
    let kernel = series("mmk_job_gpu_kernel_seconds_total");
    assert!(
        (kernel - 3.0).abs() <= 0.3,
        "600 kernels of 5 ms: {kernel} s"
    );
    assert_eq!(series("mmk_job_launches_total"), 600.0);
    assert!(
        m.contains(&format!("mmk_job_info{{state=\"SUCCEEDED\",{job}")),
        "{m}"
    );
    assert_eq!(sample(&m, "mmk_jobs{state=\"SUCCEEDED\"}"), Some(1.0));
    assert!(m.contains("mmk_partition_sms{gpu=\"0\",UUID=\""), "{m}");
    assert!(m.contains("mmk_planning_seconds_count"), "{m}");

    let missing: Vec<&str> = ["promtool", "prometheus"]
        .into_iter()
        .filter(|p| {
            Command::new(p)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_err()
        })
        .collect();
    if !missing.is_empty() {
        assert!(
            std::env::var_os("MMK_REQUIRE_PROMETHEUS").is_none(),
            "MMK_REQUIRE_PROMETHEUS is set but {missing:?} are missing"
        );
        eprintln!("skipped the Prometheus checks: no {missing:?} (apt install prometheus)");
        return;
    }

    // The format is Prometheus's.
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package) is installed");
    check
        .stdin
        .take()
        .expect("stdin")
        .write_all(m.as_bytes())
        .expect("write");
    let out = check.wait_with_output().expect("promtool ends");
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    // A real Prometheus server scrapes mmkd every second (keeping mmk's `job` label over
    // its own, as deploy/prometheus.yml does); its query API returns the job's launches.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: mmkd\n    honor_labels: true\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .expect("config");
    let web = format!("127.0.0.1:{}", free_port());
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus runs");
    let query = format!("/api/v1/query?query=mmk_job_launches_total%7Bjob%3D%22{id}%22%7D");
    let answer = wait_for("Prometheus to have scraped mmkd", || {
        try_get(&web, &query).filter(|body| body.contains("\"value\""))
    });
    let _ = prom.kill();
    let _ = prom.wait();
    assert!(answer.contains("\"name\":\"metered\""), "{answer}");
    assert!(answer.contains(",\"600\"]"), "{answer}");
}

/// A job without a kernel scheduler keeps its series for five minutes after it ends, as
/// docs/metrics.md says; the scrape reads the ended jobs in one look at the store.
#[tokio::test]
async fn an_ended_jobs_series_stay_for_five_minutes() {
    let d = Daemon::start_with("a100-80gb:1", &["--metrics", "127.0.0.1:0"]);
    let line = d.wait_log("metrics listening").pop().unwrap_or_default();
    let addr = line
        .split("addr=")
        .nth(1)
        .and_then(|a| a.split_whitespace().next())
        .expect("the metrics address")
        .to_owned();
    let mut c = d.clients().await;
    let id = d.submit(
        "--offline",
        "name: brief\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/true]\n",
    );
    wait_state(&mut c, id, v1::JobState::Succeeded).await;
    let text = http_get(&addr, "/metrics");
    let info = format!("mmk_job_info{{state=\"SUCCEEDED\",job=\"{id}\",name=\"brief\"");
    assert!(text.contains(&info), "{text}");
}
