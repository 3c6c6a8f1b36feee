use super::*;
use mmk_core::spec::WorkloadSpec;
use mmk_partitioner::Slot;

fn launch(job: u64, task: Task) -> Launch {
    Launch {
        job,
        name: format!("job{job}"),
        class: JobClass::Offline,
        task,
        assignment: Assignment {
            slot: Slot {
                gpu: 0,
                start: 0,
                profile_id: Some(9),
            },
            gpu_uuid: "GPU-0".into(),
            instance_id: 1,
            device_uuid: "MIG-abc".into(),
            profile: "3g.40gb".into(),
            mps_share: 50,
        },
        restarts: 0,
        owner: None,
        mps_pipe: None,
        ksched: None,
        memory_mib: 2048,
    }
}

fn runner(dir: &Path) -> (Runner, mpsc::UnboundedReceiver<Exit>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Runner::new(dir.to_path_buf(), 1000.0, Duration::from_secs(2), tx),
        rx,
    )
}

fn cmd(args: &[&str]) -> Task {
    Task::Command(CommandSpec {
        args: args.iter().map(|s| s.to_string()).collect(),
        env: [("GREETING".to_string(), "hi".to_string())].into(),
        workdir: None,
        ..CommandSpec::default()
    })
}

#[test]
fn a_scheduled_job_writes_its_interposer_stats_beside_its_logs() {
    let c = CommandSpec {
        args: vec!["true".into()],
        ..Default::default()
    };
    let mut l = launch(1, Task::Command(c.clone()));
    let dir = Path::new("/var/lib/mmk/jobs/1");
    assert!(!job_env(&l, &c, dir).contains_key("MMK_KSCHED_STATS"));
    l.ksched = Some(crate::ksched::JobKsched {
        interposer: "/opt/mmk/libmmk_interposer.so".into(),
        gate: "/dev/shm/mmk/g0.gate".into(),
        profile: None,
    });
    let env = job_env(&l, &c, dir);
    assert_eq!(
        env["MMK_KSCHED_STATS"],
        "/var/lib/mmk/jobs/1/work/ksched-%p.json"
    );
    assert_eq!(env["LD_PRELOAD"], "/opt/mmk/libmmk_interposer.so");
}

#[test]
fn a_job_of_another_user_gets_that_users_home_and_the_plain_path() {
    use uzers::os::unix::UserExt as _;
    let nobody = Owner {
        uid: 65534,
        gid: 65534,
    };
    let env = identity_env(Some(nobody));
    assert_eq!(env["PATH"], DEFAULT_PATH);
    let user = uzers::get_user_by_uid(65534);
    match user {
        Some(u) => {
            assert_eq!(env["HOME"], u.home_dir().display().to_string());
            assert_eq!(env["USER"], u.name().to_string_lossy());
            assert_eq!(env["LOGNAME"], env["USER"]);
        }
        None => assert_eq!(env["HOME"], "/"),
    }
    // mmkd's own user's job inherits mmkd's.
    let me = crate::os::euid();
    let own = identity_env(Some(Owner { uid: me, gid: 0 }));
    assert_eq!(own.get("HOME"), std::env::var("HOME").ok().as_ref());
    assert_eq!(own, identity_env(None));
}

#[test]
fn mps_client_priority_follows_the_class() {
    let mut l = launch(1, cmd(&["true"]));
    assert_eq!(mmk_env(&l)["CUDA_MPS_CLIENT_PRIORITY"], "1");
    l.class = JobClass::Online;
    assert_eq!(mmk_env(&l)["CUDA_MPS_CLIENT_PRIORITY"], "0");
}

#[tokio::test]
async fn a_process_gets_its_environment_and_logs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (r, mut rx) = runner(dir.path());
    let pid = r
        .start(&launch(1, cmd(&["/bin/sh", "-c", "echo $GREETING $MMK_JOB_ID $CUDA_VISIBLE_DEVICES $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $CUDA_MPS_CLIENT_PRIORITY; echo oops >&2; exit 3"])))
        .expect("started");
    assert!(pid.is_some());
    let exit = rx.recv().await.expect("exit");
    assert_eq!(exit.outcome, Outcome::Exited(3));
    let out = std::fs::read_to_string(dir.path().join("1/stdout.log")).expect("stdout");
    assert_eq!(
        out, "hi 1 MIG-abc 50 1\n",
        "an offline job's MPS priority is below normal"
    );
    let err = std::fs::read_to_string(dir.path().join("1/stderr.log")).expect("stderr");
    assert_eq!(err, "oops\n");
}

#[tokio::test]
async fn output_held_open_outside_the_group_is_cut_off_after_the_end() {
    // The job leaves a process in a session of its own that keeps stdout open and
    // writes on: the job's end is reported after the drain wait, and the copier stops
    // with a note, so that no thread writes the log file after the run.
    let dir = tempfile::tempdir().expect("tempdir");
    let (r, mut rx) = runner(dir.path());
    let drain_wait = Duration::from_millis(500);
    let r = r.with_drain_wait(drain_wait);
    // The main process waits until the other is in its own session (it makes `mark`
    // after setsid), or the end of the group would take it too.
    // It writes without a pause, so that the copier always has data waiting.
    let script = "setsid sh -c 'touch mark; while true; do echo tick; done' & \
                  while [ ! -e mark ]; do sleep 0.05; done; echo started";
    r.start(&launch(8, cmd(&["/bin/sh", "-c", script])))
        .expect("started");
    let exit = tokio::time::timeout(drain_wait + Duration::from_secs(10), rx.recv())
        .await
        .expect("the end is reported after the drain wait")
        .expect("exit");
    assert_eq!(exit.outcome, Outcome::Exited(0));
    let log = dir.path().join("8/stdout.log");
    let out = std::fs::read_to_string(&log).expect("stdout");
    assert!(out.contains("started\n"), "{out}");
    assert!(out.ends_with("its output, which is not kept]\n"), "{out}");
    // Nothing is written after that.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(std::fs::read_to_string(&log).expect("stdout"), out);
    // The left-over process now writes into a closed pipe and ends.
    let _ = std::process::Command::new("pkill")
        .args(["-f", "while true; do echo tick"])
        .status();
}

#[tokio::test]
async fn a_missing_program_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (r, _rx) = runner(dir.path());
    let err = r
        .start(&launch(2, cmd(&["/no/such/program"])))
        .expect_err("must fail");
    let err = crate::error::chain(&err);
    assert!(
        err.starts_with("cannot start \"/no/such/program\": No such file"),
        "{err}"
    );
    assert!(!r.is_running(2));
}

fn gone(pid: i32) -> bool {
    // Gone, or a zombie waiting for its new parent to reap it.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
}

async fn first_line(path: &Path) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if let Some(l) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.lines().next().map(str::to_owned))
        {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} stayed empty", path.display());
}

#[tokio::test]
async fn stop_terminates_the_whole_process_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (r, mut rx) = runner(dir.path());
    r.start(&launch(
        3,
        cmd(&["/bin/sh", "-c", "sleep 30 & echo $!; wait"]),
    ))
    .expect("started");
    let child: i32 = first_line(&dir.path().join("3/stdout.log"))
        .await
        .parse()
        .expect("pid");
    assert!(!gone(child));
    r.stop(3).await;
    let exit = rx.recv().await.expect("exit");
    assert_eq!(exit.outcome, Outcome::Signaled(libc::SIGTERM));
    assert!(!r.is_running(3));
    assert!(gone(child), "the background sleep was signalled too");
}

#[tokio::test]
async fn what_a_job_leaves_behind_is_ended_with_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (r, mut rx) = runner(dir.path());
    // The main process exits at once and leaves a child that ignores SIGTERM.
    let script = "sh -c 'trap \"\" TERM; echo $$; sleep 30' & sleep 0.2";
    r.start(&launch(6, cmd(&["/bin/sh", "-c", script])))
        .expect("started");
    let child: i32 = first_line(&dir.path().join("6/stdout.log"))
        .await
        .parse()
        .expect("pid");
    let exit = rx.recv().await.expect("exit");
    assert_eq!(exit.outcome, Outcome::Exited(0));
    assert!(
        gone(child),
        "the leftover got SIGKILL after the grace period"
    );
}

#[tokio::test]
async fn leftovers_of_an_earlier_mmkd_are_found_by_their_markers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log_dir = dir.path().join("7");
    let mut p = std::process::Command::new("sleep")
        .arg("30")
        .env("MMK_JOB_ID", "7")
        .env("MMK_LOG_DIR", &log_dir)
        .spawn()
        .expect("sleep");
    // Until it has exec'd, the child's environment is this test's: wait for its own.
    let environ = format!("/proc/{}/environ", p.id());
    let began = std::time::Instant::now();
    while !std::fs::read(&environ)
        .unwrap_or_default()
        .windows(12)
        .any(|w| w == b"MMK_JOB_ID=7")
    {
        assert!(began.elapsed() < Duration::from_secs(60), "sleep never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        kill_leftovers(7, &dir.path().join("other")),
        0,
        "another node's job 7"
    );
    assert_eq!(kill_leftovers(8, &log_dir), 0, "another job");
    assert_eq!(kill_leftovers(7, &log_dir), 1);
    let st = p.wait().expect("wait");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(libc::SIGKILL)
    );
}

#[tokio::test]
async fn workloads_finish_in_scaled_time_or_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (r, mut rx) = runner(dir.path());
    let w = |ms| {
        Task::Workload(WorkloadSpec {
            name: "resnet50-train".into(),
            batch_size: None,
            duration_ms: Some(ms),
        })
    };
    r.start(&launch(4, w(50))).expect("started");
    assert_eq!(rx.recv().await.expect("exit").outcome, Outcome::Finished);
    r.start(&launch(5, w(3_600_000))).expect("started");
    r.stop(5).await;
    assert_eq!(rx.recv().await.expect("exit").outcome, Outcome::Stopped);
}
