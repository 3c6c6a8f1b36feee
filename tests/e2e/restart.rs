//! A crash of mmkd (kill -9) loses nothing: every job is there after the restart, jobs
//! that were running are reconciled, and the simulated node's layout comes back.

use mmk_proto::v1;
use serde_json::Value;

use crate::harness::{Daemon, PATIENCE, text, wait_state};

#[tokio::test]
async fn kill_9_then_restart_loses_nothing() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    let online = d.submit(
        "--online",
        "name: serving\ngpu_memory: 8GiB\nworkload:\n  name: resnet50-inference\n  duration: 10h\n",
    );
    let trainer = d.submit(
        "--offline",
        "name: trainer\ngpu_memory: 10GiB\nrestart_policy: on-failure\nmax_restarts: 3\n\
         command:\n  args: [sh, -c, 'echo $$ ${MMK_RESUME:-0}; exec sleep 300']\n",
    );
    // This one leaves a child behind when mmkd dies (only the main process gets
    // PR_SET_PDEATHSIG); the next mmkd finds it by its markers and kills it.
    let spawner = d.submit(
        "--offline",
        "name: spawner\ngpu_memory: 1GiB\ncommand:\n  args: [sh, -c, 'sleep 300 & echo $!; wait']\n",
    );
    let done = d.submit(
        "--offline",
        "name: done\ngpu_memory: 1GiB\nworkload:\n  name: resnet18-inference\n  duration: 1s\n",
    );
    wait_state(&mut c, online, v1::JobState::Running).await;
    let t = wait_state(&mut c, trainer, v1::JobState::Running).await;
    wait_state(&mut c, done, v1::JobState::Succeeded).await;
    let sp = wait_state(&mut c, spawner, v1::JobState::Running).await;
    let waiting = d.submit(
        "--offline",
        "name: waiting\ngpu_memory: 75GiB\nworkload:\n  name: bert-train\n  duration: 10h\n",
    );
    let before_parts = d.ctl_json(&["partitions", "show"]);

    // The trainer wrote its pid; it must die with mmkd.
    let stdout = std::path::Path::new(&t.log_dir).join("stdout.log");
    let first = std::fs::read_to_string(&stdout).expect("stdout.log");
    assert!(
        first.ends_with(" 0\n"),
        "first run without MMK_RESUME: {first:?}"
    );
    let pid: u32 = first
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a pid");
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    let sp_log = std::path::Path::new(&sp.log_dir).join("stdout.log");
    let orphan: u32 = read_first_line(&sp_log).parse().expect("the child's pid");
    drop(c);

    let sim = d.sim_gpus.clone();
    let dir = d.kill_9();
    let deadline = std::time::Instant::now() + PATIENCE;
    while std::path::Path::new(&format!("/proc/{pid}/stat")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the job process outlived mmkd"
        );
        std::thread::yield_now();
    }

    assert!(
        alive(orphan),
        "the spawner's child outlives mmkd (no PDEATHSIG)"
    );

    let d = Daemon::start_in(dir, &sim);
    assert!(
        !alive(orphan),
        "the restarted mmkd killed the job's leftover process"
    );
    let mut c = d.clients().await;
    let jobs = d.ctl_json(&["jobs"]);
    let states: Vec<(u64, String)> = jobs
        .as_array()
        .expect("list")
        .iter()
        .map(|j| {
            (
                j["id"].as_u64().unwrap_or(0),
                j["state"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(states.len(), 5, "every job is still there: {states:?}");

    let j = c
        .jobs
        .get_job(v1::GetJobRequest { id: online })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(j.state, v1::JobState::Failed as i32);
    assert_eq!(
        j.reason,
        "mmkd restarted while the job was running; its process is gone"
    );

    let j = wait_state(&mut c, trainer, v1::JobState::Running).await;
    assert_eq!(j.restarts, 1, "requeued once by its restart policy");
    let j = c
        .jobs
        .get_job(v1::GetJobRequest { id: done })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(j.state, v1::JobState::Succeeded as i32);
    let j = c
        .jobs
        .get_job(v1::GetJobRequest { id: waiting })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(j.state, v1::JobState::Queued as i32);

    // The layout the simulated node had is back (the instances, not the jobs in them).
    let after_parts = d.ctl_json(&["partitions", "show"]);
    let layout = |v: &Value| -> Vec<(String, u64)> {
        v[0]["partitions"]
            .as_array()
            .expect("partitions")
            .iter()
            .map(|p| {
                (
                    p["profile"].as_str().unwrap_or("").to_owned(),
                    p["start_slice"].as_u64().unwrap_or(99),
                )
            })
            .collect()
    };
    assert_eq!(layout(&after_parts), layout(&before_parts));

    // The restarted trainer runs with MMK_RESUME=1 and logs to the same file.
    let deadline = std::time::Instant::now() + PATIENCE;
    let lines = loop {
        let lines = std::fs::read_to_string(&stdout).expect("stdout.log");
        if lines.lines().count() >= 2 || std::time::Instant::now() > deadline {
            break lines;
        }
        std::thread::yield_now();
    };
    let runs: Vec<&str> = lines.lines().collect();
    assert_eq!(runs.len(), 2, "{lines}");
    assert!(
        runs[1].ends_with(" 1"),
        "the second run has MMK_RESUME=1: {lines}"
    );
    let out = d.ctl(&["jobs", "get", &trainer.to_string()]);
    assert!(
        text(&out.stdout).contains("restarts:     1"),
        "{}",
        text(&out.stdout)
    );
}

#[tokio::test]
async fn a_second_mmkd_on_the_same_data_dir_is_refused() {
    let d = Daemon::start("a100-80gb:1");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mmkd"))
        .args(["--backend", "sim", "--socket"])
        .arg(d.path().join("other.sock"))
        .arg("--data-dir")
        .arg(d.data_dir())
        .output()
        .expect("mmkd runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("another mmkd is using the data dir"),
        "{}",
        text(&out.stderr)
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mmkd"))
        .args(["--backend", "sim", "--socket"])
        .arg(d.socket())
        .arg("--data-dir")
        .arg(d.path().join("other-data"))
        .output()
        .expect("mmkd runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("another mmkd is listening on"),
        "{}",
        text(&out.stderr)
    );
}

/// Whether a process runs (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn read_first_line(path: &std::path::Path) -> String {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(l) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.lines().next().map(str::to_owned))
        {
            return l;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} stayed empty",
            path.display()
        );
        std::thread::yield_now();
    }
}

/// A crash in the middle of a reconfiguration: the simulated driver has made an instance
/// that mmkd has not recorded. After the restart the record follows the GPU, the
/// interrupted step is reported, and the node converges to running every job.
#[tokio::test]
async fn a_crash_between_layout_steps_converges_after_restart() {
    let d = Daemon::start_with_env(
        "a100-80gb:1",
        // Real-time MIG latency (400 ms a creation): the three submissions are in before
        // the second creation, which aborts mmkd.
        &["--planner", "first-fit", "--sim-speed", "1"],
        &[("MMK_SIM_ABORT_AFTER_CREATES", "2")],
    );
    let mut ids = Vec::new();
    for (name, gib) in [("a", 30), ("b", 15), ("c", 8)] {
        ids.push(d.submit(
            "--offline",
            &format!(
                "name: {name}\ngpu_memory: {gib}GiB\nrestart_policy: on-failure\n\
                 workload:\n  name: resnet50-train\n  duration: 10h\n"
            ),
        ));
    }
    // Each job needs an instance of its own; the second creation aborts mmkd.
    let sim = d.sim_gpus.clone();
    let (status, dir) = d.wait_exit();
    assert!(!status.success(), "the injected crash: {status:?}");

    let d = Daemon::start_in(dir, &sim);
    let startup = d.startup.join("\n");
    assert!(
        startup.contains("a reconfiguration step was under way when mmkd stopped"),
        "{startup}"
    );
    assert!(
        startup.contains("adopted=1"),
        "the unrecorded instance is adopted: {startup}"
    );

    let mut c = d.clients().await;
    for id in &ids {
        wait_state(&mut c, *id, v1::JobState::Running).await;
    }
    let parts = d.ctl_json(&["partitions", "show"]);
    let partitions = parts[0]["partitions"].as_array().expect("partitions");
    let jobs_in: Vec<u64> = partitions
        .iter()
        .flat_map(|p| p["jobs"].as_array().into_iter().flatten())
        .filter_map(|j| j["id"].as_u64())
        .collect();
    assert_eq!(jobs_in.len(), 3, "every job runs in a partition: {parts}");
    // The instance the crash left unrecorded is in use, not stray: every instance holds a
    // job.
    for p in partitions {
        let n = p["jobs"].as_array().map_or(0, Vec::len);
        assert!(n > 0, "an empty instance after recovery: {p}");
    }
    assert_eq!(
        d.ctl_json(&["jobs"]).as_array().map(Vec::len),
        Some(3),
        "nothing lost"
    );
}

/// Ended jobs' records go after `--job-history`, but for the newest of each user
/// (`--job-history-keep`); a job that has not ended stays; a restart does not bring them
/// back, and a new job gets a new ID.
#[tokio::test]
async fn ended_jobs_records_go_after_the_history_but_the_newest() {
    let d = Daemon::start_with(
        "a100-80gb:1",
        &["--job-history", "1s", "--job-history-keep", "1"],
    );
    let mut c = d.clients().await;
    let quick = "name: quick\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/true]\n";
    let first = d.submit("--offline", quick);
    wait_state(&mut c, first, v1::JobState::Succeeded).await;
    let second = d.submit("--offline", quick);
    wait_state(&mut c, second, v1::JobState::Succeeded).await;
    let waiting = d.submit(
        "--offline",
        "name: waiting\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/sleep, '600']\n",
    );
    wait_state(&mut c, waiting, v1::JobState::Running).await;
    d.wait_log("removed ended jobs' records past the history");
    let out = d.ctl(&["jobs", "get", &first.to_string()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains(&format!("job {first} not found")),
        "{}",
        text(&out.stderr)
    );
    let listed: Vec<u64> = d
        .ctl_json(&["jobs"])
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["id"].as_u64().expect("id"))
        .collect();
    assert_eq!(listed, [second, waiting]);

    let (_, dir) = d.terminate();
    let d = Daemon::start_in(dir, "a100-80gb:1");
    let out = d.ctl(&["jobs", "get", &first.to_string()]);
    assert_eq!(out.status.code(), Some(1));
    let next = d.submit("--offline", quick);
    assert!(next > waiting, "{next} after {waiting}");
}
