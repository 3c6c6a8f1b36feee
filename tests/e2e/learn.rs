//! Learned profiles end to end: a job of known kernels runs on the fake driver under the
//! interposer; mmkd's sampler turns its gate slots into a profile that `mmkctl profiles`
//! lists, that survives a restart, and that the next run of the same job is planned on.

use std::path::Path;

use mmk_kernel_sched::artifacts::{FAKE_APP, INTERPOSER};
use mmk_proto::v1;

use crate::harness::{Daemon, kernels_in, text, wait_for, wait_state};
use crate::ksched::{built, fake_driver_in};

/// Kernels of 54 blocks (one per SM: 54 of the A100's 108 SMs) that run 5 ms, one every
/// 10 ms (each waited for, then 5 ms of host time): busy half the time, so half the GPU
/// when busy and a quarter on average. Kernels of milliseconds keep the poller's delay in
/// seeing a completion (longer on a loaded machine) small beside them. The fake driver
/// logs each kernel it runs to `log` (named through env(1): a job may not set `MMK_`
/// variables).
fn job_yaml(app: &Path, lib: &Path, log: &Path) -> String {
    format!(
        "name: learner\ngpu_memory: 4GiB\ncommand:\n  args: [env, 'MMK_FAKE_CUDA_LOG={log}', {app}, --kernels, '700', --duration-us, '5000', --gap-us, '5000', --blocks, '54', --sync-every, '1']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n",
        app = app.display(),
        lib = lib.display(),
        log = log.display(),
    )
}

fn near(what: &str, got: f64, want: f64, within: f64) {
    assert!(
        (got - want).abs() <= want * within,
        "{what}: {got}, expected {want} within {} %",
        within * 100.0
    );
}

/// What the fake driver's log says of the first `n` kernels it ran (all of them with
/// `usize::MAX`): their mean time on the GPU and the mean time between their launches, in
/// us.
fn logged(log: &Path, n: usize) -> (f64, f64) {
    let kernels: Vec<(u64, u64, u64)> = kernels_in(log).into_iter().take(n).collect();
    assert!(kernels.len() >= 2, "{} kernels logged", kernels.len());
    let on_gpu = kernels.iter().map(|&(_, s, e)| e - s).sum::<u64>() as f64;
    let launches = kernels.last().map_or(0, |k| k.0) - kernels[0].0;
    (
        on_gpu / kernels.len() as f64 / 1e3,
        launches as f64 / (kernels.len() - 1) as f64 / 1e3,
    )
}

/// A learned kernel time against what the fake driver ran, `kernel_us` and
/// `interval_us` as [`logged`] gives them. Seen from the host, a kernel is in flight from
/// its launch until the poller sees it end, which a loaded machine delays, while its run
/// on the GPU never gets shorter: at least the kernels' own time (less 10 % for sampling);
/// at most that and half of the host's time between two kernels (the app's own sleep
/// after each kernel is not GPU time).
fn kernel_time_fits(what: &str, learned_us: f64, kernel_us: f64, interval_us: f64) {
    let most = kernel_us + (interval_us - kernel_us) / 2.0;
    assert!(
        learned_us >= 0.9 * kernel_us && learned_us <= most,
        "{what}: {learned_us} us learned for kernels of {kernel_us} us launched every \
         {interval_us} us (at most {most} us)"
    );
}

#[tokio::test]
async fn a_jobs_kernels_become_its_learned_profile_and_its_next_run_uses_it() {
    let bin = built();
    let interposer = bin.join(INTERPOSER).display().to_string();
    let flags = ["--interposer", interposer.as_str()];
    let d = Daemon::start_with("a100-80gb:1", &flags);
    let lib = fake_driver_in(&bin, d.path());
    let log = d.path().join("learner.kernels.csv");
    let yaml = job_yaml(&bin.join(FAKE_APP), &lib, &log);
    let mut c = d.clients().await;

    // Never seen: planned on the prior, and nothing learned yet.
    let id = d.submit("--offline", &yaml);
    let first = wait_state(&mut c, id, v1::JobState::Running).await;
    assert_eq!(first.planner_profile, "prior");
    let none = d.ctl(&["profiles"]);
    assert!(
        text(&none.stdout).contains("no learned profiles yet"),
        "{}",
        text(&none.stdout)
    );
    wait_state(&mut c, id, v1::JobState::Succeeded).await;

    // Its run's samples are stored when it ends.
    let profile = wait_for("the learned profile", || {
        let v = d.ctl_json(&["profiles"]);
        let p = v.as_array()?.first()?.clone();
        (p["runs"] == 1).then_some(p)
    });
    assert_eq!(profile["name"], "learner");
    assert_eq!(profile["class"], "offline");
    let signature = profile["signature"].as_str().expect("signature").to_owned();
    assert!(
        signature.contains("/name/learner/cmd/"),
        "kept under owner, name and command: {signature}"
    );
    let f = |k: &str| {
        profile[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k}: {profile}"))
    };
    // Measured until learned (1,500 samples, about 3 s of its 7 s, and at least the 100
    // kernels the watch for slow runs needs), then counted only.
    let launches = profile["launches"].as_u64().expect("launches");
    assert!((100..=700).contains(&launches), "{profile}");
    // What the learned figures are made of, as the fake driver ran it: kernels of 5 ms,
    // launched every 10 ms on an idle machine and further apart on a loaded one.
    let (kernel_us, interval_us) = logged(&log, launches as usize);
    assert!(
        (kernel_us - 5000.0).abs() < 1.0 && interval_us >= 10_000.0,
        "{kernel_us} us kernels every {interval_us} us"
    );
    kernel_time_fits("kernel time", f("kernel_us"), kernel_us, interval_us);
    // The launch interval over sampled time: at least the 10 ms between launches (within
    // 10 % for the sampling), and no longer than the run's (a gap between samples counts
    // 50 ms at most).
    let interval = f("launch_interval_us");
    assert!(
        interval >= 9000.0 && interval <= 1.1 * interval_us,
        "launch interval: {interval} us learned, {interval_us} us ran"
    );
    // Busy for the kernels' time of each interval, and at most half of the host's time
    // between them besides, as above (within 10 % for the sampling); half the GPU while
    // busy, so half of that on average.
    let busy = f("busy");
    let (least, most) = (
        0.9 * kernel_us / interval_us,
        1.1 * (kernel_us + interval_us) / 2.0 / interval_us,
    );
    assert!(
        busy >= least && busy <= most,
        "busy {busy} of the time with {kernel_us} us kernels every {interval_us} us"
    );
    near("mean SM demand", f("sm_mean"), 0.5 * busy, 0.1);
    near("p95 SM demand", f("sm_p95"), 0.5, 0.1);
    assert_eq!(profile["confident"], true, "{profile}");
    let table = text(&d.ctl(&["profiles"]).stdout);
    assert!(
        table.starts_with("NAME") && table.contains("learner") && table.contains(" yes "),
        "{table}"
    );

    // A restart keeps it; a corrupt row beside it is named in the log and skipped.
    let (status, dir) = d.terminate();
    assert!(status.success(), "{status}");
    corrupt_a_row(&dir.path().join("data").join("mmk.db")).await;
    let d = Daemon::start_in_with(dir, "a100-80gb:1", &flags);
    assert!(
        d.startup
            .iter()
            .any(|l| l.contains("learned profile unreadable") && l.contains("4242/key/broken")),
        "{:#?}",
        d.startup
    );
    let kept = d.ctl_json(&["profiles"]);
    assert_eq!(kept.as_array().map(Vec::len), Some(1), "{kept}");
    assert_eq!(kept[0]["signature"], signature.as_str());

    // The same job again is planned on what was learned.
    let mut c = d.clients().await;
    let id = d.submit("--offline", &yaml);
    let again = wait_state(&mut c, id, v1::JobState::Running).await;
    assert!(
        again.planner_profile.starts_with("learned (age "),
        "{}",
        again.planner_profile
    );
    let shown = text(&d.ctl(&["jobs", "get", &id.to_string()]).stdout);
    assert!(shown.contains("planned as:   learned ("), "{shown}");
    wait_state(&mut c, id, v1::JobState::Succeeded).await;
    let twice = wait_for("the second run's samples", || {
        let v = d.ctl_json(&["profiles"]);
        (v[0]["runs"] == 2).then_some(v)
    });
    // Half the GPU whenever busy, over both runs.
    near(
        "mean SM demand after two runs",
        twice[0]["sm_mean"].as_f64().expect("sm_mean"),
        0.5 * twice[0]["busy"].as_f64().expect("busy"),
        0.1,
    );
}

/// A row mmkd cannot read: its observations are not a profile.
async fn corrupt_a_row(db: &Path) {
    use sqlx::Connection as _;
    let url = format!("sqlite://{}", db.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("the node store");
    sqlx::query(
        "INSERT INTO learned_profiles VALUES ('4242/key/broken', 4242, 'broken', 'online', 'not json', 0, 0)",
    )
    .execute(&mut conn)
    .await
    .expect("insert");
    conn.close().await.expect("close");
}

/// A job that shares a profile key with one of 5 ms kernels, but whose kernels take 40 ms,
/// hears at its first report (10 s in) that it runs slower than its profile says. (Eight
/// times as long: on a loaded machine the poller sees completions late, which lengthens
/// short kernels more than long ones.)
#[tokio::test]
async fn a_run_much_slower_than_its_profile_is_reported() {
    let bin = built();
    let interposer = bin.join(INTERPOSER).display().to_string();
    let d = Daemon::start_with("a100-80gb:1", &["--interposer", interposer.as_str()]);
    let lib = fake_driver_in(&bin, d.path());
    let log = d.path().join("keyed.kernels.csv");
    let yaml = |kernels: u32, us: u32| {
        format!(
            "name: keyed\ngpu_memory: 4GiB\nprofile_key: test/slow\ncommand:\n  args: [env, 'MMK_FAKE_CUDA_LOG={log}', {app}, --kernels, '{kernels}', --duration-us, '{us}', --gap-us, '5000', --blocks, '54', --sync-every, '1']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n",
            app = bin.join(FAKE_APP).display(),
            lib = lib.display(),
            log = log.display(),
        )
    };
    let mut c = d.clients().await;
    let first = d.submit("--offline", &yaml(700, 5000));
    wait_state(&mut c, first, v1::JobState::Succeeded).await;
    let learned = wait_for("the first run's profile", || {
        let v = d.ctl_json(&["profiles"]);
        (v[0]["confident"] == true).then_some(v)
    });
    // The first run as the fake driver ran it, over the launches its profile was
    // measured on (the slow run below adds to the log).
    let measured_on = learned[0]["launches"].as_u64().expect("launches") as usize;
    let (kernel_us, interval_us) = logged(&log, measured_on);
    // Long enough for two of the sampler's reports (every 10 s) while it runs: on a loaded
    // machine the first may come before the window that shows it slow has closed.
    let slow = d.submit("--offline", &yaml(600, 40000));
    let told = wait_for("the slow run to be told", || {
        let j = d.ctl_json(&["jobs", "get", &slow.to_string()]);
        (j["state"] == "RUNNING"
            && j["reason"]
                .as_str()
                .is_some_and(|r| r.contains("slower than its learned profile")))
        .then_some(j)
    });
    let reason = told["reason"].as_str().unwrap_or_default().to_owned();
    // The profile's kernel time, as learned from the first run: its 5 ms kernels, as
    // `kernel_time_fits` bounds them.
    let learned_us: f64 = reason
        .split("against ")
        .nth(1)
        .and_then(|rest| rest.split(" us").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no learned kernel time in {reason:?}"));
    assert!(reason.starts_with("running, "), "{reason}");
    kernel_time_fits(
        &format!("the learned kernel time in {reason:?}"),
        learned_us,
        kernel_us,
        interval_us,
    );
    let cancel = d.ctl(&["jobs", "cancel", &slow.to_string()]);
    assert!(cancel.status.success(), "{}", text(&cancel.stderr));
}
