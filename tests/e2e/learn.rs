//! Learned profiles end to end: a job of known kernels runs on the fake driver under the
//! interposer; mmkd's sampler turns its gate slots into a profile that `mmkctl profiles`
//! lists, that survives a restart, and that the next run of the same job is planned on.

use std::path::Path;

use mmk_kernel_sched::artifacts::{FAKE_APP, INTERPOSER};
use mmk_proto::v1;

use crate::harness::{Daemon, text, wait_for, wait_state};
use crate::ksched::{built, fake_driver_in};

/// Kernels of 54 blocks (one per SM: 54 of the A100's 108 SMs) that run 5 ms, one every
/// 10 ms (each waited for, then 5 ms of host time): busy half the time, so half the GPU
/// when busy and a quarter on average. Kernels of milliseconds keep the poller's delay in
/// seeing a completion (longer on a loaded machine) small beside them.
fn job_yaml(app: &Path, lib: &Path) -> String {
    format!(
        "name: learner\ngpu_memory: 4GiB\ncommand:\n  args: [{app}, --kernels, '700', --duration-us, '5000', --gap-us, '5000', --blocks, '54', --sync-every, '1']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n",
        app = app.display(),
        lib = lib.display(),
    )
}

fn near(what: &str, got: f64, want: f64, within: f64) {
    assert!(
        (got - want).abs() <= want * within,
        "{what}: {got}, expected {want} within {} %",
        within * 100.0
    );
}

#[tokio::test]
async fn a_jobs_kernels_become_its_learned_profile_and_its_next_run_uses_it() {
    let bin = built();
    let interposer = bin.join(INTERPOSER).display().to_string();
    let flags = ["--interposer", interposer.as_str()];
    let d = Daemon::start_with("a100-80gb:1", &flags);
    let lib = fake_driver_in(&bin, d.path());
    let yaml = job_yaml(&bin.join(FAKE_APP), &lib);
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
    near("busy", f("busy"), 0.5, 0.1);
    near("mean SM demand", f("sm_mean"), 0.25, 0.1);
    near("p95 SM demand", f("sm_p95"), 0.5, 0.1);
    near("kernel time", f("kernel_us"), 5000.0, 0.1);
    near("launch interval", f("launch_interval_us"), 10000.0, 0.1);
    // Measured until learned (1,500 samples, about 3 s of its 7 s), then counted only.
    let launches = profile["launches"].as_u64().expect("launches");
    assert!((150..=700).contains(&launches), "{profile}");
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
    near(
        "mean SM demand after two runs",
        twice[0]["sm_mean"].as_f64().expect("sm_mean"),
        0.25,
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
    let yaml = |kernels: u32, us: u32| {
        format!(
            "name: keyed\ngpu_memory: 4GiB\nprofile_key: test/slow\ncommand:\n  args: [{app}, --kernels, '{kernels}', --duration-us, '{us}', --gap-us, '5000', --blocks, '54', --sync-every, '1']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n",
            app = bin.join(FAKE_APP).display(),
            lib = lib.display(),
        )
    };
    let mut c = d.clients().await;
    let first = d.submit("--offline", &yaml(700, 5000));
    wait_state(&mut c, first, v1::JobState::Succeeded).await;
    wait_for("the first run's profile", || {
        let v = d.ctl_json(&["profiles"]);
        (v[0]["confident"] == true).then_some(v)
    });
    let slow = d.submit("--offline", &yaml(300, 40000));
    let told = wait_for("the slow run to be told", || {
        let j = d.ctl_json(&["jobs", "get", &slow.to_string()]);
        (j["state"] == "RUNNING"
            && j["reason"]
                .as_str()
                .is_some_and(|r| r.contains("slower than its learned profile")))
        .then_some(j)
    });
    let reason = told["reason"].as_str().unwrap_or_default().to_owned();
    // The profile's kernel time, as learned from the first run: 5 ms, within the 10 % a
    // learned profile keeps to (a completion seen late or early moves it).
    let learned_us: f64 = reason
        .split("against ")
        .nth(1)
        .and_then(|rest| rest.split(" us").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no learned kernel time in {reason:?}"));
    assert!(
        reason.starts_with("running, ") && (4500.0..=5500.0).contains(&learned_us),
        "{reason}"
    );
    let cancel = d.ctl(&["jobs", "cancel", &slow.to_string()]);
    assert!(cancel.status.success(), "{}", text(&cancel.stderr));
}
