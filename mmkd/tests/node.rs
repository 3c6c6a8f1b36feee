//! The node in-process: mmkd opened on a temporary data dir with the simulated backend
//! (MPS and the kernel scheduler off), driven through its node API as the gRPC layer drives
//! it. Each test waits for the job states it expects, from the node's events; nothing
//! sleeps for a fixed time.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Parser;
use mmk_core::yaml::parse_job_yaml;
use mmk_core::{AttachedSpec, JobClass, JobSpec, JobState, ServiceError, Task};
use mmkd::config::{Args, Config};
use mmkd::job::{Assignment, Change, JobRecord, Owner};
use mmkd::node::Node;
use mmkd::server::{Daemon, Listeners};
use mmkd::store::Store;

/// How long a test waits for what it expects before it fails.
const PATIENCE: Duration = Duration::from_secs(60);

/// mmkd's configuration in `dir`: one simulated A100 80GB, workloads at 1000x, and the
/// flags of `extra`.
fn config(dir: &Path, extra: &[&str]) -> Config {
    let data = dir.join("data");
    let socket = dir.join("mmkd.sock");
    let args = Args::try_parse_from(
        [
            "mmkd",
            "--backend",
            "sim",
            "--sim-gpus",
            "a100-80gb:1",
            "--mps",
            "off",
            "--kernel-policy",
            "off",
            "--metrics",
            "off",
            "--sim-speed",
            "1000",
            "--stop-grace",
            "2s",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--socket",
            socket.to_str().expect("utf-8"),
        ]
        .iter()
        .chain(extra),
    )
    .expect("flags");
    Config::resolve(args).expect("a valid configuration")
}

async fn open(dir: &Path) -> Daemon {
    open_with(dir, &[]).await
}

async fn open_with(dir: &Path, extra: &[&str]) -> Daemon {
    Daemon::open(config(dir, extra)).await.expect("mmkd opens")
}

fn spec(yaml: &str, class: JobClass) -> JobSpec {
    parse_job_yaml(yaml, Some(class)).expect("a valid job")
}

/// A command job of `sh -c script`, in `dir`.
fn command(name: &str, script: &str, dir: &Path) -> JobSpec {
    spec(
        &format!(
            "name: {name}\ngpu_memory: 4GiB\ncommand:\n  args: [sh, -c, '{script}']\n  workdir: {}\n",
            dir.display()
        ),
        JobClass::Offline,
    )
}

/// The test's own user: command jobs come from a user mmkd knows.
fn me() -> Option<Owner> {
    Some(Owner {
        uid: mmkd::os::euid(),
        gid: mmkd::os::egid(),
    })
}

/// Waits until job `id` is in `want`; fails if it ends in another state.
async fn wait_state(node: &Node, id: u64, want: JobState) -> JobRecord {
    let mut events = node.subscribe();
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            let job = node.get(id).await.expect("the job");
            if job.state == want {
                return job;
            }
            assert!(
                !job.state.is_terminal(),
                "job {id} ended {} ({}) while {want} was awaited",
                job.state,
                job.reason
            );
            // Any event, or a lagged channel, reads the job again.
            let _ = events.recv().await;
        }
    })
    .await;
    waited.unwrap_or_else(|_| panic!("job {id} was not {want} within {PATIENCE:?}"))
}

/// Waits for an event of job `id` whose state passes `want`.
async fn until_event(
    events: &mut tokio::sync::broadcast::Receiver<mmkd::node::JobEvent>,
    id: u64,
    want: impl Fn(JobState) -> bool,
) {
    let seen = tokio::time::timeout(PATIENCE, async {
        loop {
            match events.recv().await {
                Ok(ev) if ev.job.id == id && want(ev.job.state) => return,
                Ok(_) => {}
                Err(e) => panic!("events: {e}"),
            }
        }
    })
    .await;
    seen.unwrap_or_else(|_| panic!("no event of job {id} as awaited within {PATIENCE:?}"));
}

/// Whether process `pid` is gone (or a zombie waiting for its parent).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

async fn stop(daemon: Daemon) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = tokio::net::UnixListener::bind(dir.path().join("s")).expect("bind");
    let serving = daemon.serve(
        Listeners {
            socket,
            tcp: None,
            metrics: None,
        },
        async {
            let _ = rx.await;
        },
    );
    let _ = tx.send(());
    serving.await.expect("mmkd stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_planned_launched_and_its_end_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = open(dir.path()).await;
    let node = daemon.node().clone();

    // A workload: planned into a MIG instance that the pass creates, run, ended.
    let online = spec(
        "name: serve\ngpu_memory: 8GiB\nslo: 50ms\nworkload:\n  name: resnet50-inference\n  duration: 10s\n",
        JobClass::Online,
    );
    let id = node.submit(online, None, None).await.expect("submitted").id;
    let running = wait_state(&node, id, JobState::Running).await;
    let a = running.assignment.expect("placed");
    let gpus = node.gpus().await.expect("gpus");
    assert!(
        gpus[0].mig_enabled
            && gpus[0]
                .instances
                .iter()
                .any(|i| i.id == a.instance_id && Some(i.profile_id) == a.slot.profile_id),
        "the job's instance is on the GPU: {:?}",
        gpus[0].instances
    );
    let done = wait_state(&node, id, JobState::Succeeded).await;
    assert_eq!(done.exit_code, None, "a workload has no exit code");

    // A command: its exit code is recorded, and a failure says what it was.
    let id = node
        .submit(command("fails", "exit 3", dir.path()), me(), None)
        .await
        .expect("submitted")
        .id;
    let failed = wait_state(&node, id, JobState::Failed).await;
    assert_eq!(failed.exit_code, Some(3));
    assert!(
        failed.reason.contains("exited with code 3"),
        "{}",
        failed.reason
    );
    stop(daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconfiguration_makes_the_instances_the_jobs_are_placed_in() {
    let dir = tempfile::tempdir().expect("tempdir");
    // First fit, whose layouts a test can state: each job in the smallest instance that
    // holds it, made for it beside the one that runs.
    let daemon = open_with(dir.path(), &["--planner", "first-fit"]).await;
    let node = daemon.node().clone();
    let mut ids = Vec::new();
    for (yaml, class) in [
        (
            "name: serve\ngpu_memory: 8GiB\nslo: 50ms\nworkload:\n  name: resnet50-inference\n  duration: 10h\n",
            JobClass::Online,
        ),
        (
            "name: train\ngpu_memory: 30GiB\nworkload:\n  name: bert-train\n  duration: 10h\n",
            JobClass::Offline,
        ),
    ] {
        ids.push(
            node.submit(spec(yaml, class), None, None)
                .await
                .expect("submitted")
                .id,
        );
    }
    let mut placed = Vec::new();
    for &id in &ids {
        placed.push(
            wait_state(&node, id, JobState::Running)
                .await
                .assignment
                .expect("placed"),
        );
    }
    let gpus = node.gpus().await.expect("gpus");
    for a in &placed {
        let i = gpus[0]
            .instances
            .iter()
            .find(|i| i.id == a.instance_id)
            .unwrap_or_else(|| {
                panic!(
                    "instance {} of {a:?} in {:?}",
                    a.instance_id, gpus[0].instances
                )
            });
        assert_eq!(Some(i.profile_id), a.slot.profile_id);
        assert_eq!(i.placement.start, a.slot.start);
        let profile = gpus[0]
            .model
            .profile(i.profile_id)
            .expect("a profile of the GPU");
        assert_eq!(profile.name, a.profile);
    }
    assert_eq!(
        (placed[0].profile.as_str(), placed[1].profile.as_str()),
        ("1g.10gb", "3g.40gb")
    );
    assert_ne!(
        placed[0].instance_id, placed[1].instance_id,
        "each job has its own instance: {placed:?} in {:?}",
        gpus[0].instances
    );
    // The partitions view shows each job in its instance.
    let active = node.active_jobs().await.expect("active");
    let view = node.partitions(&active).await.expect("partitions");
    for (a, id) in placed.iter().zip(&ids) {
        let p = view[0]
            .partitions
            .iter()
            .find(|p| p.instance == Some(a.instance_id))
            .expect("the instance's partition");
        assert!(p.jobs.iter().any(|&i| active[i].id == *id), "{p:?}");
    }
    for id in ids {
        node.cancel(id, "", None).await.expect("cancelled");
    }
    stop(daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_the_job_starts_ends_it_cancelled_with_no_process_left() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = open(dir.path()).await;
    let node = daemon.node().clone();
    for round in 0..5 {
        let mut events = node.subscribe();
        let id = node
            .submit(
                command(&format!("sleeper{round}"), "exec sleep 600", dir.path()),
                me(),
                None,
            )
            .await
            .expect("submitted")
            .id;
        // The cancel goes out as soon as the job is STARTING: its partition is being
        // made ready, or its process being started.
        until_event(&mut events, id, |s| s == JobState::Starting).await;
        let cancelled = node
            .cancel(id, "changed my mind", None)
            .await
            .expect("cancelled");
        assert_eq!(cancelled.state, JobState::Cancelled, "{}", cancelled.reason);
        assert_eq!(cancelled.reason, "cancelled: changed my mind");
        // A cancel returns once the job's end is recorded, which waits for its processes.
        if let Some(pid) = cancelled.pid {
            assert!(gone(pid), "process {pid} outlived its cancel");
        }
        assert!(!node.runner().is_running(id));
    }
    stop(daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_racing_the_jobs_exit_records_one_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = open(dir.path()).await;
    let node = daemon.node().clone();
    for round in 0..10 {
        let mut events = node.subscribe();
        let id = node
            .submit(
                command(&format!("quick{round}"), "exit 0", dir.path()),
                me(),
                None,
            )
            .await
            .expect("submitted")
            .id;
        until_event(&mut events, id, JobState::is_active).await;
        // Its run may end before, while or after the cancel is taken.
        match node.cancel(id, "", None).await {
            Ok(j) => assert!(
                matches!(j.state, JobState::Cancelled | JobState::Succeeded),
                "{} ({})",
                j.state,
                j.reason
            ),
            Err(ServiceError::FailedPrecondition(why)) => {
                assert!(why.contains("has already ended"), "{why}");
            }
            Err(e) => panic!("cancel: {e}"),
        }
        let job = node.get(id).await.expect("the job");
        assert!(
            matches!(job.state, JobState::Cancelled | JobState::Succeeded),
            "{} ({})",
            job.state,
            job.reason
        );
        // Exactly one end: nothing after the first terminal state.
        let again = node.cancel(id, "", None).await;
        assert!(
            matches!(&again, Err(ServiceError::FailedPrecondition(w)) if w.contains("has already ended")),
            "{again:?}"
        );
        assert_eq!(node.get(id).await.expect("the job").state, job.state);
    }
    stop(daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_recovers_a_job_that_was_starting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    // What an mmkd that died while it started job 1 leaves: the job STARTING in the store,
    // and its process, which the new mmkd finds by its markers.
    let store = Store::open(&data.join("mmk.db")).await.expect("store");
    let job = command("interrupted", "exec sleep 600", dir.path());
    let job = JobSpec {
        restart_policy: mmk_core::RestartPolicy::OnFailure,
        max_restarts: 1,
        ..job
    };
    let (rec, _) = store.insert_job(&job, me(), 1).await.expect("stored");
    let assignment = Assignment {
        slot: mmk_partitioner::Slot {
            gpu: 0,
            start: 0,
            profile_id: None,
        },
        gpu_uuid: "GPU-0".into(),
        instance_id: 0,
        device_uuid: "GPU-0".into(),
        profile: "whole".into(),
        mps_share: 100,
    };
    store
        .transition(
            rec.id,
            JobState::Starting,
            "placed",
            Change {
                assignment: Some(assignment),
                ..Change::default()
            },
            2,
        )
        .await
        .expect("starting");
    store.close().await;
    let mut leftover = Command::new("sleep")
        .arg("600")
        .env("MMK_JOB_ID", rec.id.to_string())
        .env("MMK_LOG_DIR", data.join("jobs").join(rec.id.to_string()))
        .stdin(Stdio::null())
        .spawn()
        .expect("sleep");

    let daemon = open(dir.path()).await;
    let node = daemon.node().clone();
    // Its process was killed, and the job was requeued by its restart policy, then run
    // again.
    let status = leftover.wait().expect("wait");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the previous run's process is killed"
    );
    let running = wait_state(&node, rec.id, JobState::Running).await;
    assert_eq!(running.restarts, 1);
    node.cancel(rec.id, "", None).await.expect("cancelled");
    stop(daemon).await;
    // The job's history says what happened.
    let store = Store::open(&data.join("mmk.db")).await.expect("store");
    let events = store.job_events(rec.id).await.expect("events");
    store.close().await;
    assert!(
        events.iter().any(|e| e.state == JobState::Queued
            && e.reason
                .starts_with("requeued: mmkd restarted while the job was starting")),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_allocation_runs_while_its_lease_is_renewed_and_ends_when_it_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = open(dir.path()).await;
    let node = daemon.node().clone();
    let attached = |name: &str| JobSpec {
        task: Task::Attached(AttachedSpec {
            lease_ms: Some(1000),
            ..AttachedSpec::default()
        }),
        ..spec(
            &format!("name: {name}\ngpu_memory: 4GiB\nworkload:\n  name: bert-train\n"),
            JobClass::Offline,
        )
    };
    let view = node
        .allocate(attached("held"), None, None, PATIENCE)
        .await
        .expect("allocated");
    assert_eq!(view.job.state, JobState::Running, "{}", view.job.reason);
    assert!(
        view.env.contains_key("CUDA_VISIBLE_DEVICES"),
        "{:?}",
        view.env
    );
    assert!(view.lease_expires_at.is_some());
    let id = view.job.id;
    let renewed = node.renew(id).await.expect("renewed");
    assert_eq!(renewed.job.state, JobState::Running);

    // Not renewed any more: it ends, and says why.
    let ended = wait_state(&node, id, JobState::Failed).await;
    assert!(
        ended.reason.starts_with("lease expired"),
        "{}",
        ended.reason
    );
    assert!(
        node.renew(id).await.is_err(),
        "an ended allocation is not renewed"
    );

    // Released by its caller: SUCCEEDED, with what it said.
    let view = node
        .allocate(attached("released"), None, None, PATIENCE)
        .await
        .expect("allocated");
    let released = node
        .release_allocation(view.job.id, Some(0), "done", None)
        .await
        .expect("released");
    assert_eq!(released.state, JobState::Succeeded);
    assert_eq!(released.reason, "released: done");
    stop(daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_serves_grpc_on_the_listeners_it_is_given_and_stops_on_its_signal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = open(dir.path()).await;
    let path = dir.path().join("given.sock");
    let socket = tokio::net::UnixListener::bind(&path).expect("bind");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(daemon.serve(
        Listeners {
            socket,
            tcp: None,
            metrics: None,
        },
        async {
            let _ = rx.await;
        },
    ));
    let channel = mmk_proto::unix_channel(&path, None)
        .await
        .expect("connects");
    let mut jobs = mmk_proto::v1::job_service_client::JobServiceClient::new(channel);
    let listed = jobs
        .list_jobs(mmk_proto::v1::ListJobsRequest::default())
        .await
        .expect("listed")
        .into_inner();
    assert!(listed.jobs.is_empty(), "{listed:?}");
    let _ = tx.send(());
    tokio::time::timeout(PATIENCE, serving)
        .await
        .expect("stops in time")
        .expect("the task")
        .expect("stops cleanly");
}
