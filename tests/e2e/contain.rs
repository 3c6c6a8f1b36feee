//! Every process of a job is the job's, whatever it does to leave: a new session
//! (`setsid`), a double fork, a daemon. A cancel, the job's own end and an mmkd restart end
//! them all (each job runs in a cgroup of its own, mmkd/src/cgroup.rs).

use mmk_proto::v1;

use crate::harness::{Daemon, wait_for, wait_state};

/// Whether a process runs `sleep <marker>`.
fn sleeping(marker: &str) -> bool {
    let want = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc").is_ok_and(|procs| {
        procs.flatten().any(|p| {
            std::fs::read(p.path().join("cmdline"))
                .is_ok_and(|c| c.windows(want.len()).any(|w| w == want.as_bytes()))
        })
    })
}

#[tokio::test]
async fn every_process_of_a_job_ends_with_it() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "containment needs root (cgroups); CI runs as root"
        );
        eprintln!("skipped: cgroups need root");
        return;
    }
    let d = Daemon::start("a100-80gb:1");
    assert!(
        d.startup
            .iter()
            .any(|l| l.contains("each job in a cgroup of its own")),
        "{:#?}",
        d.startup
    );
    let mut c = d.clients().await;
    // Markers no other test uses: sleep durations made of this process's id.
    let base = 600_000 + std::process::id() % 100_000;
    let m = |k: u32| format!("{base}.{k}");
    let job = |name: &str, script: String| {
        format!("name: {name}\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/sh, -c, '{script}']\n")
    };

    // A cancel: a new session, a double fork and a daemon's way out, all ended.
    let escapes = format!(
        "setsid sleep {} & (sleep {} &) ; setsid sh -c \"sleep {} & exit 0\" </dev/null >/dev/null 2>&1 & exec sleep 600",
        m(1),
        m(2),
        m(3)
    );
    let id = d.submit("--offline", &job("escapes", escapes));
    wait_state(&mut c, id, v1::JobState::Running).await;
    wait_for("the job's escapees", || {
        (sleeping(&m(1)) && sleeping(&m(2)) && sleeping(&m(3))).then_some(())
    });
    // Its cgroup counts its processes' CPU time, for `jobs get` and the metrics.
    let shown = d.ctl_json(&["jobs", "get", &id.to_string()]);
    assert!(shown["cpu_seconds"].as_f64().is_some(), "{shown}");
    let out = d.ctl(&["jobs", "cancel", &id.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        crate::harness::text(&out.stderr)
    );
    wait_for("the escapees to end with the cancel", || {
        (!sleeping(&m(1)) && !sleeping(&m(2)) && !sleeping(&m(3))).then_some(())
    });

    // The job's own end.
    let id = d.submit(
        "--offline",
        &job("leaves", format!("setsid sleep {} & exit 0", m(4))),
    );
    wait_state(&mut c, id, v1::JobState::Succeeded).await;
    wait_for("the process it left to end with it", || {
        (!sleeping(&m(4))).then_some(())
    });

    // An mmkd restart: the job dies with mmkd; what it started in a new session goes
    // when mmkd comes back.
    let id = d.submit(
        "--offline",
        &job(
            "restarts",
            format!("setsid sleep {} & exec sleep 600", m(5)),
        ),
    );
    wait_state(&mut c, id, v1::JobState::Running).await;
    wait_for("the job's escapee", || sleeping(&m(5)).then_some(()));
    let dir = d.kill_9();
    assert!(sleeping(&m(5)), "it outlives mmkd for now");
    let d = Daemon::start_in(dir, "a100-80gb:1");
    wait_for("the escapee to end at the restart", || {
        (!sleeping(&m(5))).then_some(())
    });
    drop(d);
}
