//! The supervisor against the fake control program, as real processes.

// Helpers of these tests unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmk_mps_control::{
    Dirs, Health, MpsControl, Partition, Program, Supervisor, parse_pids, procs,
};

fn fake() -> Arc<Program> {
    Arc::new(Program::new(env!("CARGO_BIN_EXE_mmk-fake-mps-control")))
}

fn partition(key: &str, memory_mib: u64) -> Partition {
    Partition {
        key: key.into(),
        label: format!("gpu0/{key}"),
        device: format!("MIG-fake-{key}"),
        memory_mib,
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process that stands for a CUDA client: it registers with the daemon and sleeps.
fn client(control: &Program, dirs: &Dirs) -> std::process::Child {
    let child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    control
        .send(dirs, &format!("fake_client {}", child.id()))
        .unwrap();
    child
}

fn servers(control: &Program, dirs: &Dirs) -> Vec<u32> {
    parse_pids(
        "get_server_list",
        &control.send(dirs, "get_server_list").unwrap(),
    )
    .unwrap()
}

#[test]
fn one_daemon_per_partition_with_its_limits_then_quit() {
    let root = tempfile::tempdir().unwrap();
    let control = fake();
    let sup = Supervisor::new(control.clone(), root.path().join("mps"));
    let a = sup.ensure(&partition("g0i1", 40_000)).unwrap();
    let b = sup.ensure(&partition("g0i2", 20_000)).unwrap();
    assert_ne!(a, b);
    assert!(procs::alive(a as i32) && procs::alive(b as i32));
    // A second ensure finds the running daemon.
    assert_eq!(sup.ensure(&partition("g0i1", 40_000)).unwrap(), a);

    let dirs = sup.dirs("g0i1");
    assert_eq!(dirs.pid(), Some(a));
    assert_eq!(
        control
            .send(&dirs, "get_default_active_thread_percentage")
            .unwrap()
            .trim(),
        "100.0"
    );
    assert_eq!(
        control
            .send(&dirs, "get_default_device_pinned_mem_limit 0")
            .unwrap()
            .trim(),
        "39G"
    );
    let log = std::fs::read_to_string(dirs.log.join("control.log")).unwrap();
    assert!(log.contains("MIG-fake-g0i1"), "{log}");

    // A client starts a server; quitting stops daemon and server.
    let mut c = client(&control, &dirs);
    let server = servers(&control, &dirs)[0];
    assert!(procs::alive(server as i32));
    sup.stop("g0i1");
    assert!(!procs::alive(a as i32));
    wait_until("the server to stop", || !procs::alive(server as i32));
    assert!(!root.path().join("mps/g0i1").exists());
    assert!(procs::alive(b as i32));
    sup.stop_all();
    assert!(!procs::alive(b as i32));
    assert!(sup.daemons().is_empty());
    c.kill().unwrap();
    c.wait().unwrap();
}

#[test]
fn a_killed_daemon_is_restarted_and_its_server_stopped() {
    let root = tempfile::tempdir().unwrap();
    let control = fake();
    let sup = Supervisor::new(control.clone(), root.path().join("mps"));
    let p = partition("g0", 80_000);
    let pid = sup.ensure(&p).unwrap();
    let dirs = sup.dirs("g0");
    let mut c = client(&control, &dirs);
    let server = servers(&control, &dirs)[0];
    assert!(sup.check().is_empty(), "a healthy daemon reports nothing");

    procs::kill(pid as i32, libc::SIGKILL);
    wait_until("the daemon to die", || !procs::alive(pid as i32));
    let events = sup.check();
    assert_eq!(events.len(), 1, "{events:?}");
    let Health::ControlDied {
        old_pid,
        restarted: Ok(new_pid),
    } = events[0].health
    else {
        panic!("{events:?}");
    };
    assert_eq!(old_pid, pid);
    assert_ne!(new_pid, pid);
    assert!(procs::alive(new_pid as i32));
    assert!(
        !procs::alive(server as i32),
        "the orphaned server was stopped"
    );
    assert!(events[0].to_string().contains("gpu0/g0"), "{}", events[0]);
    // The new daemon has the partition's limits again.
    assert_eq!(
        control
            .send(&dirs, "get_default_device_pinned_mem_limit 0")
            .unwrap()
            .trim(),
        "78G"
    );
    assert_eq!(sup.daemons()[0].restarts, 1);
    sup.stop_all();
    c.kill().unwrap();
    c.wait().unwrap();
}

#[test]
fn a_faulted_server_is_reported_until_its_clients_exit() {
    let root = tempfile::tempdir().unwrap();
    let control = fake();
    let sup = Supervisor::new(control.clone(), root.path().join("mps"));
    sup.ensure(&partition("g1i3", 10_000)).unwrap();
    let dirs = sup.dirs("g1i3");
    let mut c = client(&control, &dirs);
    let server = servers(&control, &dirs)[0];
    assert!(sup.check().is_empty());

    control.send(&dirs, "fake_fault").unwrap();
    let events = sup.check();
    assert!(
        matches!(&events[..], [e] if matches!(&e.health, Health::ServerNotReady { pid, .. } if *pid == server)),
        "{events:?}"
    );
    // A new client is refused while the server is not ready.
    let err = control.send(&dirs, "fake_client 1").unwrap_err();
    assert!(
        err.to_string().contains("cudaErrorMpsServerNotReady"),
        "{err}"
    );
    assert!(sup.check().is_empty(), "reported once");

    c.kill().unwrap();
    c.wait().unwrap();
    wait_until("the server to be ready", || {
        sup.check()
            .iter()
            .any(|e| e.health == Health::ServerReady { pid: server })
    });

    control.send(&dirs, "fake_kill_server").unwrap();
    wait_until("the server's exit to be seen", || {
        sup.check()
            .iter()
            .any(|e| e.health == Health::ServerExited { pid: server })
    });
    sup.stop_all();
}

#[test]
fn daemons_of_a_crashed_supervisor_are_found_and_stopped() {
    let root = tempfile::tempdir().unwrap();
    let control = fake();
    let mps = root.path().join("mps");
    let (pid, server) = {
        let sup = Supervisor::new(control.clone(), mps.clone());
        let pid = sup.ensure(&partition("g0i1", 1_000)).unwrap();
        let dirs = sup.dirs("g0i1");
        let mut c = client(&control, &dirs);
        let server = servers(&control, &dirs)[0];
        c.kill().unwrap();
        c.wait().unwrap();
        // Dropped without stop: as if mmkd had been killed.
        (pid, server)
    };
    assert!(procs::alive(pid as i32) && procs::alive(server as i32));
    let sup = Supervisor::new(control, mps.clone());
    assert_eq!(sup.cleanup_orphans(), ["g0i1"]);
    assert!(!procs::alive(pid as i32));
    wait_until("the server to stop", || !procs::alive(server as i32));
    assert!(!mps.join("g0i1").exists());
    assert!(sup.cleanup_orphans().is_empty());
}

#[test]
fn a_control_program_that_cannot_start_says_why() {
    let root = tempfile::tempdir().unwrap();
    let sup = Supervisor::new(
        Arc::new(Program::new("/nonexistent/nvidia-cuda-mps-control")),
        root.path().join("mps"),
    );
    let err = sup.ensure(&partition("g0", 1_000)).unwrap_err();
    assert!(
        err.to_string()
            .contains("/nonexistent/nvidia-cuda-mps-control"),
        "{err}"
    );
    // A program that exits with an error.
    let sup = Supervisor::new(Arc::new(Program::new("false")), root.path().join("mps2"));
    let err = sup.ensure(&partition("g0", 1_000)).unwrap_err();
    assert!(err.to_string().contains("-d failed"), "{err}");
}

#[test]
fn the_fake_refuses_bad_commands_and_a_second_daemon() {
    let root = tempfile::tempdir().unwrap();
    let control = fake();
    let dirs = Dirs::under(&root.path().join("d"));
    control.start_daemon(&dirs, "GPU-x").unwrap();
    let err = control.start_daemon(&dirs, "GPU-x").unwrap_err();
    assert!(err.to_string().contains("already running"), "{err}");
    // As the real daemon: over 100 is 100; an unknown command is an error, told by its
    // reply.
    let reply = control
        .send(&dirs, "set_default_active_thread_percentage 140")
        .unwrap();
    assert_eq!(reply.trim(), "100.0");
    control
        .send(&dirs, "set_default_device_pinned_mem_limit 0 4096M")
        .unwrap();
    let reply = control
        .send(&dirs, "get_default_device_pinned_mem_limit 0")
        .unwrap();
    assert_eq!(reply.trim(), "4G");
    let err = control.send(&dirs, "frobnicate").unwrap_err();
    assert!(
        err.to_string().contains("Unknown command \"frobnicate\""),
        "{err}"
    );
    let pid = dirs.pid().unwrap();
    control.send(&dirs, "quit").unwrap();
    wait_until("quit", || !procs::alive(pid as i32));
    let err = control.send(&dirs, "get_server_list").unwrap_err();
    assert!(
        err.to_string().contains("Cannot find MPS control daemon"),
        "{err}"
    );
    assert!(!Path::new(&dirs.pipe.join(mmk_mps_control::PID_FILE)).exists());
}

/// As the real daemon, the fake serves one user at a time: a client of a second user is
/// held (refused here, saying `queued`) while the first user's server has clients, and
/// gets a server of its own user's once they are gone.
#[test]
fn the_fake_serves_one_user_at_a_time() {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a client of another user needs root");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let control = fake();
    let dirs = Dirs::under(&root.path().join("d"));
    control.start_daemon(&dirs, "GPU-x").unwrap();
    let mut mine = client(&control, &dirs);
    let first = servers(&control, &dirs);
    assert_eq!(first.len(), 1);
    let mut theirs = std::process::Command::new("sleep")
        .arg("60")
        .uid(65534)
        .gid(65534)
        .spawn()
        .unwrap();
    let err = control
        .send(&dirs, &format!("fake_client {}", theirs.id()))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("queued: the server of uid 0 has clients"),
        "{err}"
    );
    assert_eq!(
        servers(&control, &dirs),
        first,
        "still the first user's server"
    );
    mine.kill().unwrap();
    mine.wait().unwrap();
    control
        .send(&dirs, &format!("fake_client {}", theirs.id()))
        .unwrap();
    let second = servers(&control, &dirs);
    assert_eq!(second.len(), 1);
    assert_ne!(second, first, "a server of the second user's");
    theirs.kill().unwrap();
    theirs.wait().unwrap();
    control.send(&dirs, "quit").unwrap();
}
