//! One control daemon per partition: started with the partition's limits, checked,
//! restarted with backoff, quit; and the daemons of a crashed mmkd found and stopped.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::control::{Dirs, MpsControl, MpsError, Result, ServerStatus, parse_mem, parse_pids};
use crate::procs;

/// A partition that gets a daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Short and unique on the node; names the daemon's directory (`g0`, `g1i5`).
    pub key: String,
    /// For people: `gpu0/3g.71gb@4`.
    pub label: String,
    /// What `CUDA_VISIBLE_DEVICES` names: the MIG device UUID, or the GPU's.
    pub device: String,
    /// The partition's memory: the daemon's default pinned memory limit.
    pub memory_mib: u64,
}

/// A daemon as the supervisor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonInfo {
    pub partition: Partition,
    /// `None` while it is down and waiting for its next restart.
    pub pid: Option<u32>,
    pub pipe_dir: PathBuf,
    pub servers: Vec<u32>,
    /// Restarts after it died.
    pub restarts: u32,
}

/// What a health check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// The control daemon is gone; `restarted` is the new daemon's pid, or why it could
    /// not be started (it is tried again after a backoff).
    ControlDied {
        old_pid: u32,
        restarted: std::result::Result<u32, String>,
    },
    /// A restart after an earlier failure to restart.
    ControlRestarted { pid: u32 },
    /// A server exited while the daemon lives.
    ServerExited { pid: u32 },
    /// A server stopped accepting clients (a client's fatal fault).
    ServerNotReady { pid: u32, status: String },
    /// A server that was not ready accepts clients again.
    ServerReady { pid: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    pub partition: Partition,
    pub health: Health,
}

impl std::fmt::Display for HealthEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.partition.label;
        match &self.health {
            Health::ControlDied {
                old_pid,
                restarted: Ok(pid),
            } => write!(
                f,
                "the MPS control daemon of {p} (pid {old_pid}) died; restarted as pid {pid}"
            ),
            Health::ControlDied {
                old_pid,
                restarted: Err(why),
            } => write!(
                f,
                "the MPS control daemon of {p} (pid {old_pid}) died and could not be restarted: {why}"
            ),
            Health::ControlRestarted { pid } => {
                write!(
                    f,
                    "the MPS control daemon of {p} was restarted as pid {pid}"
                )
            }
            Health::ServerExited { pid } => {
                write!(f, "the MPS server of {p} (pid {pid}) exited")
            }
            Health::ServerNotReady { pid, status } => write!(
                f,
                "the MPS server of {p} (pid {pid}) is not ready ({status}): a client hit a fatal fault; new clients wait until the faulting ones exit"
            ),
            Health::ServerReady { pid } => {
                write!(f, "the MPS server of {p} (pid {pid}) accepts clients again")
            }
        }
    }
}

#[derive(Debug)]
struct Daemon {
    partition: Partition,
    dirs: Dirs,
    /// 0 while down.
    pid: u32,
    started: Instant,
    restarts: u32,
    backoff: Duration,
    next_try: Instant,
    servers: BTreeMap<u32, ServerStatus>,
    /// The last thing that went wrong, and when.
    last_trouble: Option<(Instant, String)>,
    /// Quit by `stop` (or replaced): checks leave it alone.
    stopped: bool,
}

impl Daemon {
    fn new(partition: &Partition, dirs: Dirs) -> Daemon {
        Daemon {
            partition: partition.clone(),
            dirs,
            pid: 0,
            started: Instant::now(),
            restarts: 0,
            backoff: BACKOFF_FIRST,
            next_try: Instant::now(),
            servers: BTreeMap::new(),
            last_trouble: None,
            stopped: false,
        }
    }
}

/// One daemon behind its own lock: a health check of one partition (which runs control
/// commands) does not hold up the launches of another.
type Entry = Arc<Mutex<Daemon>>;

fn lock(e: &Entry) -> std::sync::MutexGuard<'_, Daemon> {
    e.lock().unwrap_or_else(|p| p.into_inner())
}

/// The first pause before restarting a daemon that died again soon after a restart;
/// doubles up to BACKOFF_MAX, back to the first after a daemon has lived HEALTHY_AFTER.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// The pause before the next restart after one now, and the pause after that, given the
/// current one: the first pause again once the daemon that died had lived
/// [`HEALTHY_AFTER`], else the current one, doubling up to [`BACKOFF_MAX`].
fn backoff_after(current: Duration, lived_long: bool) -> (Duration, Duration) {
    let pause = if lived_long { BACKOFF_FIRST } else { current };
    (pause, (pause * 2).min(BACKOFF_MAX))
}
/// How long a started daemon may take to write its pid file, and a quit daemon to exit.
const SETTLE: Duration = Duration::from_secs(5);

/// The daemons of one node. Every method blocks.
#[derive(Debug)]
pub struct Supervisor {
    control: Arc<dyn MpsControl>,
    root: PathBuf,
    daemons: Mutex<BTreeMap<String, Entry>>,
    /// What [`Supervisor::daemons`] last read of each daemon, for when a check or a launch
    /// holds it (a check runs control commands, which take a while).
    seen: Mutex<BTreeMap<String, DaemonInfo>>,
}

impl Supervisor {
    /// Daemons get their directories under `root` (one subdirectory per partition).
    pub fn new(control: Arc<dyn MpsControl>, root: PathBuf) -> Supervisor {
        Supervisor {
            control,
            root,
            daemons: Mutex::default(),
            seen: Mutex::default(),
        }
    }

    /// The daemon directories of a partition.
    pub fn dirs(&self, key: &str) -> Dirs {
        Dirs::under(&self.root.join(key))
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.daemons.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, key: &str) -> Option<Entry> {
        self.map().get(key).cloned()
    }

    /// Removes `key` from the map if it still holds `e`.
    fn forget(&self, key: &str, e: &Entry) {
        let mut map = self.map();
        if map.get(key).is_some_and(|cur| Arc::ptr_eq(cur, e)) {
            map.remove(key);
        }
    }

    /// Makes sure the partition's daemon runs, starting it with the partition's limits;
    /// returns its pid. A daemon left for another device in the same directory is
    /// stopped first.
    #[tracing::instrument(skip_all, fields(partition = %p.label))]
    pub fn ensure(&self, p: &Partition) -> Result<u32> {
        if let Some(e) = self.entry(&p.key) {
            let mut d = lock(&e);
            if !d.stopped && d.partition == *p {
                if d.pid != 0 && procs::alive(d.pid as i32) {
                    return Ok(d.pid);
                }
                // Down: a job needs it now, so no waiting for the backoff.
                let pid = self.start(p, &d.dirs)?;
                d.pid = pid;
                d.started = Instant::now();
                d.servers.clear();
                return Ok(pid);
            }
            if !d.stopped {
                d.stopped = true;
                self.quit(&d.dirs, d.pid);
            }
            drop(d);
            self.forget(&p.key, &e);
        }
        let e: Entry = Arc::new(Mutex::new(Daemon::new(p, self.dirs(&p.key))));
        let mut d = lock(&e);
        {
            let mut map = self.map();
            if map.contains_key(&p.key) {
                // Another caller got there first: use its daemon.
                drop(map);
                drop(d);
                return self.ensure(p);
            }
            map.insert(p.key.clone(), Arc::clone(&e));
        }
        match self.start(p, &d.dirs) {
            Ok(pid) => {
                d.pid = pid;
                d.started = Instant::now();
                Ok(pid)
            }
            Err(err) => {
                d.stopped = true;
                drop(d);
                self.forget(&p.key, &e);
                Err(err)
            }
        }
    }

    /// Starts a daemon, waits for its pid file and sets its limits.
    fn start(&self, p: &Partition, dirs: &Dirs) -> Result<u32> {
        // Whatever still answers in this directory is stale.
        if let Some(old) = dirs.pid().filter(|pid| procs::alive(*pid as i32)) {
            self.quit(dirs, old);
        }
        let _ = std::fs::remove_file(dirs.pipe.join(crate::PID_FILE));
        self.control.start_daemon(dirs, &p.device)?;
        let deadline = Instant::now() + SETTLE;
        let pid = loop {
            if let Some(pid) = dirs.pid().filter(|pid| procs::alive(*pid as i32)) {
                break pid;
            }
            if Instant::now() >= deadline {
                return Err(MpsError::NoPid {
                    pipe: dirs.pipe.clone(),
                    after: SETTLE,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if let Err(e) = self.set_limits(p, dirs) {
            self.quit(dirs, pid);
            return Err(e);
        }
        info!(pid, device = %p.device, "mps control daemon started");
        Ok(pid)
    }

    /// Sets the daemon's defaults to the whole partition (each job's environment narrows
    /// them) and reads them back: the real client exits 0 whatever the daemon answered.
    fn set_limits(&self, p: &Partition, dirs: &Dirs) -> Result<()> {
        let mem = p.memory_mib << 20;
        self.control
            .send(dirs, "set_default_active_thread_percentage 100")?;
        self.control.send(
            dirs,
            &format!("set_default_device_pinned_mem_limit 0 {}M", p.memory_mib),
        )?;
        let check = |command: &str, ok: &dyn Fn(&str) -> bool| -> Result<()> {
            let reply = self.control.send(dirs, command)?;
            if ok(reply.trim()) {
                Ok(())
            } else {
                Err(MpsError::Reply {
                    command: command.to_owned(),
                    reply,
                })
            }
        };
        check("get_default_active_thread_percentage", &|r| {
            r.parse::<f64>().is_ok_and(|v| v == 100.0)
        })?;
        // The daemon reads a limit back rounded down to whole units of its largest unit.
        check("get_default_device_pinned_mem_limit 0", &|r| {
            parse_mem(r).is_some_and(|got| got <= mem && mem - got < 1 << 30)
        })
    }

    /// Checks every daemon: restarts the dead ones whose backoff has passed, and reports
    /// servers that exited or stopped accepting clients.
    pub fn check(&self) -> Vec<HealthEvent> {
        let mut events = Vec::new();
        let entries: Vec<Entry> = self.map().values().cloned().collect();
        for e in entries {
            let mut d = lock(&e);
            if d.stopped {
                continue;
            }
            for health in self.check_one(&mut d) {
                let ev = HealthEvent {
                    partition: d.partition.clone(),
                    health,
                };
                if !matches!(ev.health, Health::ServerReady { .. }) {
                    d.last_trouble = Some((Instant::now(), ev.to_string()));
                }
                events.push(ev);
            }
        }
        events
    }

    /// One daemon's check (see `check`).
    fn check_one(&self, d: &mut Daemon) -> Vec<Health> {
        let mut found = Vec::new();
        'checks: {
            let mut report = |health| found.push(health);
            if d.pid == 0 || !procs::alive(d.pid as i32) {
                if Instant::now() < d.next_try {
                    break 'checks;
                }
                let old_pid = d.pid;
                // Its servers cannot be managed without it, and a new daemon would start a
                // second server on the same device; a daemon of this directory that mmkd
                // lost track of would refuse the new one ("already running").
                kill_daemon_processes(&d.dirs);
                d.servers.clear();
                // The pause grows with each restart until a daemon lives HEALTHY_AFTER; a
                // start that failed does not count as having lived.
                let lived_long = old_pid != 0 && d.started.elapsed() >= HEALTHY_AFTER;
                let (pause, next) = backoff_after(d.backoff, lived_long);
                d.backoff = next;
                let result = self.start(&d.partition, &d.dirs);
                match result {
                    Ok(pid) => {
                        d.pid = pid;
                        d.restarts += 1;
                        d.started = Instant::now();
                        d.next_try = Instant::now() + pause;
                        report(if old_pid == 0 {
                            Health::ControlRestarted { pid }
                        } else {
                            Health::ControlDied {
                                old_pid,
                                restarted: Ok(pid),
                            }
                        });
                    }
                    Err(e) => {
                        warn!(partition = %d.partition.label, error = %e, retry_in = ?pause, "cannot restart an mps control daemon");
                        d.pid = 0;
                        d.next_try = Instant::now() + pause;
                        if old_pid != 0 {
                            report(Health::ControlDied {
                                old_pid,
                                restarted: Err(e.to_string()),
                            });
                        }
                    }
                }
                break 'checks;
            }
            let servers = match self
                .control
                .send(&d.dirs, "get_server_list")
                .and_then(|r| parse_pids("get_server_list", &r))
            {
                Ok(s) => s,
                Err(e) => {
                    warn!(partition = %d.partition.label, error = %e, "mps health check failed");
                    break 'checks;
                }
            };
            let gone: Vec<u32> = d
                .servers
                .keys()
                .filter(|p| !servers.contains(p))
                .copied()
                .collect();
            for pid in gone {
                d.servers.remove(&pid);
                report(Health::ServerExited { pid });
            }
            for pid in servers {
                let Ok(reply) = self
                    .control
                    .send(&d.dirs, &format!("get_server_status {pid}"))
                else {
                    continue;
                };
                let Some(now) = ServerStatus::parse(&reply) else {
                    // Gone since the list was read: the next check reports it.
                    continue;
                };
                let before = d.servers.insert(pid, now.clone());
                match (&before, &now) {
                    (Some(ServerStatus::NotReady(_)), ServerStatus::Active) => {
                        report(Health::ServerReady { pid })
                    }
                    (Some(ServerStatus::Active) | None, ServerStatus::NotReady(status)) => {
                        report(Health::ServerNotReady {
                            pid,
                            status: status.clone(),
                        })
                    }
                    _ => {}
                }
            }
        }
        found
    }

    /// What is wrong with a partition's daemon now, or went wrong in the last `within`:
    /// said next to the exit of a job that failed there (a client dies with its server,
    /// often before a health check sees why).
    pub fn trouble(&self, key: &str, within: Duration) -> Option<String> {
        let e = self.entry(key)?;
        let d = lock(&e);
        let label = &d.partition.label;
        if d.pid == 0 {
            return Some(format!("the MPS control daemon of {label} is down"));
        }
        if !procs::alive(d.pid as i32) {
            return Some(format!(
                "the MPS control daemon of {label} (pid {}) has died",
                d.pid
            ));
        }
        d.last_trouble
            .as_ref()
            .filter(|(at, _)| at.elapsed() < within)
            .map(|(_, what)| what.clone())
    }

    /// Quits a partition's daemon (before its MIG instance is destroyed).
    #[tracing::instrument(skip(self))]
    pub fn stop(&self, key: &str) {
        let e = self.map().remove(key);
        if let Some(e) = e {
            let mut d = lock(&e);
            d.stopped = true;
            self.quit(&d.dirs, d.pid);
            let _ = std::fs::remove_dir_all(self.root.join(key));
            info!(partition = %d.partition.label, "mps control daemon stopped");
        }
    }

    /// Quits every daemon (at shutdown).
    pub fn stop_all(&self) {
        let keys: Vec<String> = self.map().keys().cloned().collect();
        for k in keys {
            self.stop(&k);
        }
    }

    /// `quit`, then SIGKILL for whatever of the daemon is left after SETTLE.
    fn quit(&self, dirs: &Dirs, pid: u32) {
        if pid != 0
            && procs::alive(pid as i32)
            && let Err(e) = self.control.send(dirs, "quit")
        {
            warn!(error = %e, pipe = %dirs.pipe.display(), "mps quit failed; killing the daemon");
        }
        let deadline = Instant::now() + SETTLE;
        while pid != 0 && procs::alive(pid as i32) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if pid != 0 && procs::alive(pid as i32) {
            procs::kill(pid as i32, libc::SIGKILL);
        }
        kill_daemon_processes(dirs);
    }

    /// Finds and stops what an earlier mmkd left under the root: daemons (and their
    /// servers) in every partition directory; removes the directories. Returns the
    /// partition directories that still had a daemon running.
    pub fn cleanup_orphans(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            if !path.is_dir() {
                continue;
            }
            let key = e.file_name().to_string_lossy().into_owned();
            let dirs = Dirs::under(&path);
            let pid = dirs.pid().filter(|p| procs::alive(*p as i32));
            let leftovers = daemon_processes(&dirs);
            if pid.is_some() || !leftovers.is_empty() {
                found.push(key);
                self.quit(&dirs, pid.unwrap_or(0));
            }
            let _ = std::fs::remove_dir_all(&path);
        }
        found
    }

    /// What runs now, by partition key.
    pub fn daemons(&self) -> Vec<DaemonInfo> {
        let entries: Vec<(String, Entry)> = self
            .map()
            .iter()
            .map(|(k, e)| (k.clone(), Arc::clone(e)))
            .collect();
        let info = |d: &Daemon| DaemonInfo {
            partition: d.partition.clone(),
            pid: (d.pid != 0).then_some(d.pid),
            pipe_dir: d.dirs.pipe.clone(),
            servers: d.servers.keys().copied().collect(),
            restarts: d.restarts,
        };
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|k, _| entries.iter().any(|(key, _)| key == k));
        entries
            .iter()
            .map(|(key, e)| {
                // A daemon under a check or a launch is shown as it was last read, rather
                // than waiting for its control commands.
                let now = match e.try_lock() {
                    Ok(d) => info(&d),
                    Err(std::sync::TryLockError::Poisoned(p)) => info(&p.into_inner()),
                    Err(std::sync::TryLockError::WouldBlock) => match seen.get(key) {
                        Some(last) => return last.clone(),
                        None => info(&lock(e)),
                    },
                };
                seen.insert(key.clone(), now.clone());
                now
            })
            .collect()
    }
}

/// Processes of a daemon directory that are not jobs: the control daemon and its servers
/// (they run with the directory in `CUDA_MPS_PIPE_DIRECTORY`; job processes do too, but
/// also carry `MMK_JOB_ID`).
fn daemon_processes(dirs: &Dirs) -> Vec<i32> {
    let marker = format!("CUDA_MPS_PIPE_DIRECTORY={}", dirs.pipe.display());
    procs::scan(|env| env.has(&marker) && !env.has_key("MMK_JOB_ID"))
}

fn kill_daemon_processes(dirs: &Dirs) {
    for pid in daemon_processes(dirs) {
        procs::kill(pid, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_until_a_daemon_lives_long_enough() {
        let mut pauses = Vec::new();
        let mut b = BACKOFF_FIRST;
        for _ in 0..9 {
            let (pause, next) = backoff_after(b, false);
            pauses.push(pause.as_millis());
            b = next;
        }
        assert_eq!(
            pauses,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000],
            "failed starts never reset it"
        );
        assert_eq!(backoff_after(b, true), (BACKOFF_FIRST, BACKOFF_FIRST * 2));
    }
}
