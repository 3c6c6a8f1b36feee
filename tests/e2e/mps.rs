//! MPS: one control daemon per partition (the fake control program that is built into
//! mmkd), jobs launched into it, and the daemon supervised across faults and crashes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use mmk_mps_control::procs;
use mmk_proto::v1;

use crate::harness::{Daemon, text, wait_for, wait_state};

/// Sends one command to a daemon through the fake control program, as
/// `echo CMD | nvidia-cuda-mps-control` would.
fn control(pipe: &Path, command: &str) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mmkd"))
        .arg("fake-mps-control")
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("control program runs");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{command}\n").as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("control program ends");
    assert!(out.status.success(), "{command}: {}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

fn daemon_pid(pipe: &Path) -> Option<i32> {
    std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The `KEY=VALUE` lines a job printed, once it printed `lines` of them.
fn job_env(log_dir: &str, lines: usize) -> Vec<String> {
    let path = Path::new(log_dir).join("stdout.log");
    wait_for("the job's output", || {
        let out = std::fs::read_to_string(&path).ok()?;
        let v: Vec<String> = out.lines().map(str::to_owned).collect();
        (v.len() >= lines).then_some(v)
    })
}

const PRINT_ENV_AND_WAIT: &str = "name: probe\ngpu_memory: 3GiB\ncommand:\n  args: [sh, -c, 'env | grep -E \"^(CUDA_|MMK_JOB_ID|MMK_JOB_CLASS)\" | sort; exec sleep 60']\n";

fn pipe_of(env: &[String]) -> PathBuf {
    env.iter()
        .find_map(|l| l.strip_prefix("CUDA_MPS_PIPE_DIRECTORY="))
        .map(PathBuf::from)
        .expect("the job has a pipe directory")
}

#[tokio::test]
async fn a_job_starts_in_its_partitions_daemon_with_the_planned_environment() {
    let d = Daemon::start("a100-80gb:1");
    assert!(
        d.startup
            .iter()
            .any(|l| l.contains("one control daemon per partition")),
        "{:?}",
        d.startup
    );
    let mut c = d.clients().await;
    let id = d.submit("--offline", PRINT_ENV_AND_WAIT);
    let job = wait_state(&mut c, id, v1::JobState::Running).await;
    let a = job.assignment.clone().expect("placed");
    let env = job_env(&job.log_dir, 7);
    let key = format!("g{}i{}", a.gpu_index, a.instance_id);
    let pipe = d.data_dir().join("mps").join(&key).join("pipe");
    assert_eq!(
        env,
        [
            format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={}", a.mps_share),
            "CUDA_MPS_CLIENT_PRIORITY=1".to_owned(),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M".to_owned(),
            format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display()),
            format!("CUDA_VISIBLE_DEVICES={}", a.device_uuid),
            "MMK_JOB_CLASS=offline".to_owned(),
            format!("MMK_JOB_ID={id}"),
        ]
    );

    // The daemon runs for that device, with the partition's memory as its default limit.
    let pid = daemon_pid(&pipe).expect("pid file");
    assert!(procs::alive(pid));
    let parts = d.ctl_json(&["partitions", "show"]);
    let part = parts[0]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .find(|p| p["instance_id"] == a.instance_id)
        .expect("the job's partition")
        .clone();
    // Read back as the real daemon prints it: in whole GiB, rounded down.
    let mib = part["memory_mib"].as_u64().expect("memory_mib");
    assert_eq!(
        control(&pipe, "get_default_device_pinned_mem_limit 0"),
        format!("{}G", mib / 1024)
    );
    assert_eq!(
        control(&pipe, "get_default_active_thread_percentage"),
        "100.0"
    );
    assert_eq!(part["mps"]["pid"], pid);
    assert_eq!(part["mps"]["pipe_dir"], pipe.display().to_string());
    let log = std::fs::read_to_string(pipe.parent().expect("dir").join("log/control.log"))
        .expect("control.log");
    assert!(log.contains(&a.device_uuid), "{log}");

    // mmkd stops: the daemon is gone with it, and so is its directory.
    // (Off the runtime: the client's connection must close while mmkd drains.)
    drop(c);
    let (status, dir) = tokio::task::spawn_blocking(move || d.terminate())
        .await
        .expect("terminate");
    assert!(status.success());
    assert!(!procs::alive(pid));
    assert!(!dir.path().join("mps").join(&key).exists());
}

#[tokio::test]
async fn a_killed_daemon_is_restarted_and_the_job_says_so() {
    let d = Daemon::start_with("a100-80gb:1", &["--mps-check-interval", "50ms"]);
    let mut c = d.clients().await;
    let id = d.submit("--offline", PRINT_ENV_AND_WAIT);
    let job = wait_state(&mut c, id, v1::JobState::Running).await;
    let pipe = pipe_of(&job_env(&job.log_dir, 6));
    let old = daemon_pid(&pipe).expect("pid file");
    assert!(procs::kill(old, libc::SIGKILL));

    let new = wait_for("a new daemon", || {
        daemon_pid(&pipe).filter(|p| *p != old && procs::alive(*p))
    });
    let job = wait_for("the job's record", || {
        let j = d.ctl_json(&["jobs", "get", &id.to_string()]);
        j["reason"]
            .as_str()
            .is_some_and(|r| r.contains("died; restarted"))
            .then_some(j)
    });
    let reason = job["reason"].as_str().expect("reason");
    assert!(reason.contains(&format!("pid {old}")), "{reason}");
    assert!(reason.contains(&format!("pid {new}")), "{reason}");
    assert_eq!(job["state"], "RUNNING", "the job itself is not disturbed");
    // The new daemon has the partition's limits.
    assert_eq!(
        control(&pipe, "get_default_active_thread_percentage"),
        "100.0"
    );

    // A client dies with its server (seen on an H200): the job's end says why.
    let marker = format!("MMK_LOG_DIR={}", job["log_dir"].as_str().expect("log_dir"));
    for pid in procs::scan(|e| e.has(&marker)) {
        procs::kill(pid, libc::SIGKILL);
    }
    let failed = wait_state(&mut c, id, v1::JobState::Failed).await;
    assert!(
        failed
            .reason
            .starts_with("killed by signal 9; the MPS control daemon of gpu0/")
            && failed
                .reason
                .contains(&format!("(pid {old}) died; restarted as pid {new}")),
        "{}",
        failed.reason
    );
}

#[tokio::test]
async fn a_server_fault_is_recorded_on_the_jobs_of_the_partition() {
    let d = Daemon::start_with("a100-80gb:1", &["--mps-check-interval", "50ms"]);
    let mut c = d.clients().await;
    // The job connects as an MPS client would: the fake daemon starts a server for it.
    let yaml = format!(
        "name: client\ngpu_memory: 1GiB\ncommand:\n  args: [sh, -c, 'echo \"fake_client $$\" | {} fake-mps-control && echo CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY && exec sleep 60']\n",
        env!("CARGO_BIN_EXE_mmkd")
    );
    let id = d.submit("--offline", &yaml);
    let job = wait_state(&mut c, id, v1::JobState::Running).await;
    let pipe = pipe_of(&job_env(&job.log_dir, 1));
    let server = control(&pipe, "get_server_list");
    assert!(!server.is_empty(), "a server started for the client");
    control(&pipe, "fake_fault");
    let job = wait_for("the fault on the job's record", || {
        let j = d.ctl_json(&["jobs", "get", &id.to_string()]);
        j["reason"]
            .as_str()
            .is_some_and(|r| r.contains("not ready"))
            .then_some(j)
    });
    assert!(
        job["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("pid {server}"))),
        "{job}"
    );
}

#[tokio::test]
async fn kill_9_of_mmkd_leaves_daemons_that_the_next_start_stops() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    let id = d.submit("--offline", PRINT_ENV_AND_WAIT);
    let job = wait_state(&mut c, id, v1::JobState::Running).await;
    let pipe = pipe_of(&job_env(&job.log_dir, 6));
    let pid = daemon_pid(&pipe).expect("pid file");
    drop(c);
    let dir = d.kill_9();
    assert!(procs::alive(pid), "a daemon outlives a crashed mmkd");

    let d = Daemon::start_in(dir, "a100-80gb:1");
    assert!(
        d.startup
            .iter()
            .any(|l| l.contains("stopped MPS daemons the previous mmkd left")),
        "{:?}",
        d.startup
    );
    assert!(!procs::alive(pid));
    assert!(!pipe.exists());
}

#[tokio::test]
async fn a_job_that_cannot_run_fails_alone() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    let id = d.submit("--offline", PRINT_ENV_AND_WAIT);
    let job = wait_state(&mut c, id, v1::JobState::Running).await;
    let pipe = pipe_of(&job_env(&job.log_dir, 6));
    let daemon = daemon_pid(&pipe).expect("pid file");

    let script = d.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho never\n").expect("write");
    let bad = d.submit(
        "--offline",
        &format!(
            "name: noexec\ngpu_memory: 1GiB\ncommand:\n  args: [{}]\n",
            script.display()
        ),
    );
    let failed = wait_state(&mut c, bad, v1::JobState::Failed).await;
    assert!(
        failed.reason.contains("cannot start") && failed.reason.contains("ermission denied"),
        "{}",
        failed.reason
    );
    let quick = d.submit(
        "--offline",
        "name: quick\ngpu_memory: 1GiB\ncommand:\n  args: [sh, -c, 'echo bye >&2; exit 3']\n",
    );
    let failed = wait_state(&mut c, quick, v1::JobState::Failed).await;
    assert_eq!(failed.reason, "exited with code 3");

    let still = d.ctl_json(&["jobs", "get", &id.to_string()]);
    assert_eq!(still["state"], "RUNNING");
    assert_eq!(still["restarts"], 0);
    assert_eq!(daemon_pid(&pipe), Some(daemon));
    assert!(procs::alive(daemon));
}
