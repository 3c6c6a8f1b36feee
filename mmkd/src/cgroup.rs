//! Each job's processes in a cgroup of their own (cgroup v2), so that a process a job
//! starts in a new session, by a double fork or as a daemon stays the job's: it is killed
//! with the job on a cancel, at the job's end and after an mmkd restart.
//!
//! Where the cgroups are:
//! - Under systemd (`Delegate=yes` in the unit), below mmkd's own cgroup: mmkd moves itself
//!   (and so the MPS daemons it starts) into `<own>/supervisor`, and each job goes into
//!   `<own>/jobs/<id>`, with the `cpu`, `memory` and `pids` controllers turned on for them
//!   where the system has them.
//! - Started by hand in the root cgroup (as root), in `<cgroup2 mount>/mmk-<data dir hash>`
//!   (one folder per mmkd, however many run on the host).
//! - Where neither can be written (not root, no cgroup v2, a container that does not
//!   delegate), mmkd says so at start, and a job is its process group, as before.
//!
//! A job's process joins its cgroup between fork and exec: mmkd opens the cgroup's
//! `cgroup.procs` (as root) before the fork, and the child writes itself into it after it
//! became the job's user (the kernel checks the opener's rights, Linux 5.16 and later; mmkd
//! checks this at start with a process of another user).

use std::fs::File;
use std::io::{self, Read as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{info, warn};

/// The cgroups of one mmkd's jobs.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// `<base>/jobs`.
    jobs: PathBuf,
    /// The controllers turned on for the jobs (`cpu`, `memory`, `pids`), if any.
    controllers: Vec<String>,
}

/// One job's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCgroup {
    path: PathBuf,
}

/// What a job's cgroup counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of the job's processes (`cpu.stat` usage_usec).
    pub cpu_usec: u64,
    /// Memory now and at most (`memory.current`, `memory.peak`), with the memory
    /// controller on.
    pub memory_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
}

impl Cgroups {
    /// Sets up the jobs' cgroups for the mmkd whose data dir is `data_dir`; `Err` says why
    /// jobs stay process groups (mmkd logs it).
    pub fn setup(data_dir: &Path) -> Result<Cgroups, String> {
        let mount = cgroup2_mount().ok_or("no cgroup v2 file system is mounted")?;
        let own = own_cgroup().ok_or("mmkd's own cgroup v2 is not known (/proc/self/cgroup)")?;
        let base = if own == "/" {
            mount.join(format!(
                "mmk-{:016x}",
                fnv1a(data_dir.as_os_str().as_encoded_bytes())
            ))
        } else {
            mount.join(own.trim_start_matches('/'))
        };
        let mkdir = |p: &Path| match std::fs::create_dir(p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(format!("cannot make {}: {e}", p.display())),
        };
        if own != "/" {
            // Processes may not sit beside cgroups whose controllers are on: mmkd (and the
            // MPS daemons it starts) go into a leaf of their own.
            let supervisor = base.join("supervisor");
            mkdir(&supervisor)?;
            std::fs::write(supervisor.join("cgroup.procs"), b"0")
                .map_err(|e| format!("cannot move mmkd into {}: {e}", supervisor.display()))?;
        } else {
            mkdir(&base)?;
        }
        let jobs = base.join("jobs");
        mkdir(&jobs)?;
        // The controllers the jobs get, where the system has them; none is fine.
        let available =
            std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
        let mut controllers = Vec::new();
        for c in ["cpu", "memory", "pids"] {
            if available.split_whitespace().any(|a| a == c)
                && std::fs::write(base.join("cgroup.subtree_control"), format!("+{c}")).is_ok()
                && std::fs::write(jobs.join("cgroup.subtree_control"), format!("+{c}")).is_ok()
            {
                controllers.push(c.to_owned());
            }
        }
        let cgroups = Cgroups { jobs, controllers };
        cgroups.check_another_user()?;
        info!(
            cgroups = %cgroups.jobs.display(),
            controllers = %cgroups.controllers.join(","),
            "each job in a cgroup of its own"
        );
        Ok(cgroups)
    }

    /// The cgroups of jobs, for the ones an earlier mmkd left (`<id>` folders).
    pub fn jobs_dir(&self) -> &Path {
        &self.jobs
    }

    /// A cgroup for job `id`: what an earlier run (or an earlier mmkd) left there is
    /// killed first (without waiting: a process that joins after the kill is not hit).
    pub fn for_job(&self, id: u64) -> io::Result<JobCgroup> {
        let cg = JobCgroup {
            path: self.jobs.join(id.to_string()),
        };
        match std::fs::create_dir(&cg.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => cg.kill(),
            Err(e) => return Err(e),
        }
        Ok(cg)
    }

    /// Kills and removes every job cgroup an earlier mmkd left (mmkd's jobs die with it;
    /// what they started in their cgroup goes now). Blocking: at start.
    pub fn clear_leftovers(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.jobs) else {
            return 0;
        };
        let mut killed = 0;
        for e in entries.flatten() {
            if !e.path().is_dir() {
                continue;
            }
            let cg = JobCgroup { path: e.path() };
            killed += cg.pids().len();
            cg.kill_all(Duration::from_secs(5));
            cg.remove();
        }
        killed
    }

    /// Removes the (empty) cgroups of this mmkd at its end.
    pub fn teardown(&self) {
        let _ = std::fs::remove_dir(&self.jobs);
        if let Some(base) = self.jobs.parent()
            && base
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("mmk-"))
        {
            let _ = std::fs::remove_dir(base);
        }
    }

    /// Job `id`'s cgroup, when there is one (an earlier mmkd's).
    pub fn existing(&self, id: u64) -> Option<JobCgroup> {
        let path = self.jobs.join(id.to_string());
        path.is_dir().then_some(JobCgroup { path })
    }

    /// A process of another user (nobody) must join a cgroup through a file mmkd opened:
    /// kernels before 5.16 check the writer's rights instead of the opener's.
    fn check_another_user(&self) -> Result<(), String> {
        if !crate::os::running_as_root() {
            return Ok(());
        }
        let probe = JobCgroup {
            path: self.jobs.join("probe"),
        };
        let _ = std::fs::create_dir(&probe.path);
        let joined = (|| {
            let procs = probe.procs_file().map_err(|e| e.to_string())?;
            let mut cmd = std::process::Command::new("/bin/true");
            use std::os::unix::process::CommandExt as _;
            cmd.uid(65534).gid(65534);
            let fd = std::os::fd::AsRawFd::as_raw_fd(&procs);
            // SAFETY: `os::join_cgroup` is async-signal-safe, and `procs` stays open
            // until the probe has been spawned.
            unsafe {
                cmd.pre_exec(move || crate::os::join_cgroup(fd));
            }
            let status = cmd.status().map_err(|e| {
                format!("a process of another user cannot join a job's cgroup: {e}")
            })?;
            status
                .success()
                .then_some(())
                .ok_or_else(|| format!("the probe exited with {status}"))
        })();
        probe.remove();
        joined
    }
}

/// Kills and removes the cgroups that an mmkd with data dir `data_dir`, started in the
/// root cgroup, left (one killed with SIGKILL never tore them down). For tests.
pub fn remove_left_by(data_dir: &Path) {
    let Some(mount) = cgroup2_mount() else {
        return;
    };
    let base = mount.join(format!(
        "mmk-{:016x}",
        fnv1a(data_dir.as_os_str().as_encoded_bytes())
    ));
    let cgroups = Cgroups {
        jobs: base.join("jobs"),
        controllers: Vec::new(),
    };
    cgroups.clear_leftovers();
    cgroups.teardown();
}

impl JobCgroup {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cgroup.procs`, opened for the job's first process to write itself into.
    pub fn procs_file(&self) -> io::Result<File> {
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(self.path.join("cgroup.procs"))
    }

    /// The processes in the cgroup now.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Whether a process of the job still runs (zombies waiting to be reaped do not).
    pub fn alive(&self) -> bool {
        self.pids().into_iter().any(|p| !zombie(p))
    }

    /// Sends `sig` to every process in the cgroup.
    pub fn signal(&self, sig: i32) {
        for pid in self.pids() {
            crate::os::signal(pid, sig);
        }
    }

    /// Kills every process in the cgroup (`cgroup.kill`, which also catches processes
    /// forking meanwhile; SIGKILL to each where the kernel has none).
    pub fn kill(&self) {
        if std::fs::write(self.path.join("cgroup.kill"), b"1").is_err() {
            self.signal(libc::SIGKILL);
        }
    }

    /// [`JobCgroup::kill`], then waits up to `within` for them to go (blocking).
    pub fn kill_all(&self, within: Duration) {
        self.kill();
        let deadline = std::time::Instant::now() + within;
        while self.alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Removes the cgroup once it is empty (a no-op while processes remain).
    pub fn remove(&self) {
        if let Err(e) = std::fs::remove_dir(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            warn!(cgroup = %self.path.display(), error = %e, "cannot remove a job's cgroup");
        }
    }

    /// What the cgroup counted so far.
    pub fn usage(&self) -> Usage {
        let read = |name: &str| -> Option<String> {
            let mut text = String::new();
            File::open(self.path.join(name))
                .ok()?
                .take(64 * 1024)
                .read_to_string(&mut text)
                .ok()?;
            Some(text)
        };
        let number = |name: &str| read(name).and_then(|t| t.trim().parse::<u64>().ok());
        Usage {
            cpu_usec: read("cpu.stat")
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
                })
                .unwrap_or(0),
            memory_bytes: number("memory.current"),
            memory_peak_bytes: number("memory.peak"),
        }
    }
}

fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|s| s == "Z" || s == "X")
    })
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a host
/// that mounts both versions).
fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next() == Some("cgroup2"))
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

/// mmkd's own cgroup v2 path (`/`, `/system.slice/mmkd.service`).
fn own_cgroup() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_owned())
}

/// FNV-1a, 64 bits: a stable short name from a path.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_and_own_cgroup_are_read() {
        // Whatever the host: a mount point that is absolute when there is one.
        if let Some(m) = cgroup2_mount() {
            assert!(m.is_absolute(), "{}", m.display());
        }
        if let Some(o) = own_cgroup() {
            assert!(o.starts_with('/'), "{o}");
        }
        assert_ne!(fnv1a(b"/var/lib/mmk"), fnv1a(b"/var/lib/mmk2"));
    }
}
