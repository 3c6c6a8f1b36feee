//! Runs placed jobs: a `workload` job progresses in simulated time; a `command` job is a
//! real child process with its output in files under the data dir. When a job ends the
//! runner reports an [`Exit`] on a channel; it never decides what the job's state becomes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mmk_core::spec::{CommandSpec, Task};
use mmk_core::{JobClass, workload};
use mmk_mps_control::procs;
use tokio::sync::{mpsc, oneshot, watch};

use crate::job::{Assignment, Owner};
use crate::joblog::{self, JobDir, JobDirError};

/// How a job's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A simulated workload ran its full duration.
    Finished,
    /// The process exited with this code.
    Exited(i32),
    /// The process was killed by this signal.
    Signaled(i32),
    /// mmk stopped the job (cancel or shutdown) before it ended by itself.
    Stopped,
    /// The job could not be started (the program does not exist, ...): the reason.
    NotStarted(String),
}

impl Outcome {
    pub fn success(&self) -> bool {
        matches!(self, Outcome::Finished | Outcome::Exited(0))
    }

    pub fn describe(&self) -> String {
        match self {
            Outcome::Finished => "finished".into(),
            Outcome::Exited(c) => format!("exited with code {c}"),
            Outcome::Signaled(s) => format!("killed by signal {s}"),
            Outcome::Stopped => "stopped by mmk".into(),
            Outcome::NotStarted(why) => why.clone(),
        }
    }

    pub fn exit_code(&self) -> Option<i32> {
        match self {
            Outcome::Exited(c) => Some(*c),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Exit {
    pub job: u64,
    /// Which run of the job ended (its restart count when it started): an exit of an
    /// earlier run that arrives late is told apart from the current one.
    pub run: u32,
    pub outcome: Outcome,
    /// When the runner saw the end (for `mmk_job_exit_record_seconds`).
    pub ended: std::time::Instant,
}

/// What the runner needs to start a job.
#[derive(Debug, Clone)]
pub struct Launch {
    pub job: u64,
    pub name: String,
    pub class: JobClass,
    pub task: Task,
    pub assignment: Assignment,
    pub restarts: u32,
    /// Who submitted the job; a root mmkd runs the process as this user and group.
    pub owner: Option<Owner>,
    /// The pipe directory of the partition's MPS control daemon (none when MPS is off).
    pub mps_pipe: Option<PathBuf>,
    /// The job's `gpu_memory`: its MPS pinned device memory limit.
    pub memory_mib: u64,
    /// The interposer and the partition's gate (none when the kernel scheduler is off).
    pub ksched: Option<crate::ksched::JobKsched>,
}

#[derive(Debug)]
enum Stopper {
    Workload(Option<oneshot::Sender<()>>),
    /// Process group ID (the child leads its own group), and whether the group is gone:
    /// once it is, its ID may name another group, which a stop must not signal.
    Process(Procs, Arc<std::sync::atomic::AtomicBool>),
}

#[derive(Debug)]
struct Running {
    /// Which run of the job this is (its restart count at start).
    run: u32,
    stopper: Stopper,
    done: watch::Receiver<bool>,
}

/// The end of a job's output: one receiver per log copier.
#[derive(Debug)]
struct Drained(Vec<joblog::Copier>);

/// How long a job's end waits for its output to reach the logs: a process that left the
/// job's process group can keep a pipe open for ever.
const DRAIN_WAIT: Duration = Duration::from_secs(5);

impl Drained {
    /// Waits up to `limit` for the copiers to see the end of the output; then stops them
    /// (each notes in its log that later output is not kept) and waits for that.
    async fn wait(self, limit: Duration) {
        // A receiver is polled no more once it resolved (tokio's panics if it is).
        let (mut done, stops): (Vec<_>, Vec<_>) =
            self.0.into_iter().map(|c| (Some(c.done), c.stop)).unzip();
        let all = async {
            for slot in &mut done {
                if let Some(rx) = slot {
                    let _ = rx.await;
                    *slot = None;
                }
            }
        };
        if tokio::time::timeout(limit, all).await.is_err() {
            tracing::warn!(
                after = ?limit,
                "a job's output is still open after it ended (a process outside its group?); its logs are closed and its end reported now"
            );
            drop(stops);
            for rx in done.into_iter().flatten() {
                let _ = tokio::time::timeout(Duration::from_secs(1), rx).await;
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct Runner {
    jobs_dir: PathBuf,
    /// The most a job's logs take on disk (`job_log_max`).
    log_max: u64,
    sim_speed: f64,
    grace: Duration,
    /// How long a job's end waits for its output ([`DRAIN_WAIT`]).
    drain_wait: Duration,
    exits: mpsc::UnboundedSender<Exit>,
    running: Arc<Mutex<HashMap<u64, Running>>>,
    /// The kernel scheduler: the partitions' gates and the interposer jobs preload.
    ksched: crate::ksched::KernelSched,
    /// Each job's cgroup; `None`: a job is its process group.
    cgroups: Option<crate::cgroup::Cgroups>,
}

/// The thread that starts jobs: their folders, logs and fork happen here, off the state
/// lock and off the runtime's worker threads. It lives as long as mmkd: a job's process
/// gets SIGKILL when the thread that forked it ends (PR_SET_PDEATHSIG), so that a
/// crashed mmkd leaves no job behind, and a pool thread would end when idle.
#[derive(Debug, Clone)]
pub struct Spawner {
    tx: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl Spawner {
    /// Starts the thread, in the current runtime's context (a job's run is a task of it).
    pub fn start() -> std::io::Result<Spawner> {
        let runtime = tokio::runtime::Handle::current();
        let (tx, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::Builder::new()
            .name("mmkd-spawner".into())
            .spawn(move || {
                let _in_runtime = runtime.enter();
                for call in rx {
                    call();
                }
            })?;
        Ok(Spawner { tx })
    }

    /// Runs `f` on the thread and returns what it returned; `None` when the thread is gone.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .ok()?;
        rx.await.ok()
    }
}

/// A job's processes: its process group, and its cgroup where there are cgroups.
#[derive(Debug, Clone)]
struct Procs {
    pgid: i32,
    cgroup: Option<crate::cgroup::JobCgroup>,
}

impl Procs {
    fn alive(&self) -> bool {
        group_alive(self.pgid) || self.cgroup.as_ref().is_some_and(|c| c.alive())
    }

    fn signal(&self, sig: i32) {
        crate::os::signal_group(self.pgid, sig);
        if let Some(c) = &self.cgroup {
            if sig == libc::SIGKILL {
                c.kill();
            } else {
                c.signal(sig);
            }
        }
    }
}

/// The environment variables a job process inherits from mmkd; everything else comes
/// from the job spec and from mmk.
const INHERITED_ENV: [&str; 6] = ["PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ"];
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

impl Runner {
    pub fn new(
        jobs_dir: PathBuf,
        sim_speed: f64,
        grace: Duration,
        exits: mpsc::UnboundedSender<Exit>,
    ) -> Runner {
        Runner {
            jobs_dir,
            log_max: joblog::DEFAULT_JOB_LOG_MAX,
            sim_speed,
            grace,
            drain_wait: DRAIN_WAIT,
            ksched: crate::ksched::KernelSched::off(),
            cgroups: None,
            exits,
            running: Arc::default(),
        }
    }

    /// Puts each job's processes in a cgroup of its own (`crate::cgroup`).
    pub fn with_cgroups(mut self, cgroups: Option<crate::cgroup::Cgroups>) -> Runner {
        self.cgroups = cgroups;
        self
    }

    pub fn cgroups(&self) -> Option<&crate::cgroup::Cgroups> {
        self.cgroups.as_ref()
    }

    /// What a running command job's cgroup counted; `None` without one.
    pub fn usage(&self, job: u64) -> Option<crate::cgroup::Usage> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        match &running.get(&job)?.stopper {
            Stopper::Process(procs, _) => procs.cgroup.as_ref().map(|c| c.usage()),
            Stopper::Workload(_) => None,
        }
    }

    /// Wait `d` instead of [`DRAIN_WAIT`] for a job's output at its end (tests that do not
    /// wait seconds for it).
    #[cfg(test)]
    fn with_drain_wait(mut self, d: Duration) -> Runner {
        self.drain_wait = d;
        self
    }

    /// Keep each job's logs under `bytes` on disk.
    pub fn with_log_max(mut self, bytes: u64) -> Runner {
        self.log_max = bytes;
        self
    }

    /// Run managed jobs under the kernel scheduler `k` (off until this is called).
    pub fn with_kernel_sched(mut self, k: crate::ksched::KernelSched) -> Runner {
        self.ksched = k;
        self
    }

    pub fn kernel_sched(&self) -> &crate::ksched::KernelSched {
        &self.ksched
    }

    /// Where each job's folder is made (`<jobs dir>/<id>`).
    pub fn jobs_dir(&self) -> &Path {
        &self.jobs_dir
    }

    /// Where a job's stdout.log and stderr.log go.
    pub fn log_dir(&self, job: u64) -> PathBuf {
        self.jobs_dir.join(job.to_string())
    }

    /// Starts a job; returns the pid of a command job. Called on a thread that lives as
    /// long as mmkd ([`Spawner`]), in a runtime's context: a child dies with the thread that
    /// spawned it (PR_SET_PDEATHSIG), so that a crashed mmkd leaves no job behind.
    pub fn start(&self, l: &Launch) -> Result<Option<u32>, StartError> {
        let (done_tx, done_rx) = watch::channel(false);
        let (stopper, pid, run) = match &l.task {
            Task::Workload(w) => {
                let nominal = workload::find(&w.name)
                    .map(|wl| wl.nominal_duration_ms(w.batch_size.unwrap_or(wl.default_batch())))
                    .unwrap_or(60_000);
                let sim_ms = w.duration_ms.unwrap_or(nominal);
                // Durations are bounded (30 days) and the speed is at least 0.001, so this
                // fits a Duration; the fallback only guards against a bad caller.
                let wall = Duration::try_from_secs_f64(sim_ms as f64 / 1000.0 / self.sim_speed)
                    .unwrap_or(Duration::from_secs(u64::from(u32::MAX)));
                let (tx, rx) = oneshot::channel::<()>();
                let fut: std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>> =
                    Box::pin(async move {
                        tokio::select! {
                            () = tokio::time::sleep(wall) => Outcome::Finished,
                            _ = rx => Outcome::Stopped,
                        }
                    });
                (Stopper::Workload(Some(tx)), None, fut)
            }
            Task::Command(c) => {
                let (mut child, drained, cgroup) = self.spawn(l, c)?;
                let pid = child.id().ok_or(StartError::Vanished)?;
                let grace = self.grace;
                let drain_wait = self.drain_wait;
                let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let group_gone = Arc::clone(&gone);
                let procs = Procs {
                    pgid: pid as i32,
                    cgroup,
                };
                let ending = procs.clone();
                let fut: std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>> =
                    Box::pin(async move {
                        let status = child.wait().await;
                        // The job is over when its main process is; what it left in its
                        // process group and its cgroup gets SIGTERM, the grace period,
                        // then SIGKILL.
                        end_procs(&ending, grace).await;
                        group_gone.store(true, std::sync::atomic::Ordering::Release);
                        // Everything the job wrote is in its logs before its end is told.
                        drained.wait(drain_wait).await;
                        match status {
                            Ok(st) => {
                                use std::os::unix::process::ExitStatusExt;
                                match (st.code(), st.signal()) {
                                    (Some(c), _) => Outcome::Exited(c),
                                    (None, Some(s)) => Outcome::Signaled(s),
                                    (None, None) => Outcome::Exited(-1),
                                }
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot wait for a job process");
                                Outcome::Exited(-1)
                            }
                        }
                    });
                (Stopper::Process(procs, gone), Some(pid), fut)
            }
            Task::Attached(_) => {
                return Err(StartError::Attached);
            }
        };
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                l.job,
                Running {
                    run: l.restarts,
                    stopper,
                    done: done_rx,
                },
            );
        let job = l.job;
        let generation = l.restarts;
        let running = Arc::clone(&self.running);
        let exits = self.exits.clone();
        tokio::spawn(async move {
            let outcome = run.await;
            let ended = std::time::Instant::now();
            {
                // Only this run's entry: a later run of the job may have replaced it.
                let mut map = running.lock().unwrap_or_else(|p| p.into_inner());
                if map.get(&job).is_some_and(|r| r.run == generation) {
                    map.remove(&job);
                }
            }
            let _ = exits.send(Exit {
                job,
                run: generation,
                outcome,
                ended,
            });
            let _ = done_tx.send(true);
        });
        Ok(pid)
    }

    /// Starts a command job's process with its output in pipes that the log copiers
    /// read; returns the child and the copiers' completion.
    fn spawn(
        &self,
        l: &Launch,
        c: &CommandSpec,
    ) -> Result<
        (
            tokio::process::Child,
            Drained,
            Option<crate::cgroup::JobCgroup>,
        ),
        StartError,
    > {
        let program = c.args.first().ok_or(StartError::NoProgram)?;
        let dir = Arc::new(JobDir::prepare(&self.jobs_dir, l.job, l.owner)?);
        let (out_r, out_w) = joblog::pipe().map_err(StartError::Pipe)?;
        let (err_r, err_w) = joblog::pipe().map_err(StartError::Pipe)?;
        // The logs are open and their copiers run before the process starts: once it
        // runs, nothing can fail and leave it untracked. Should the start fail, dropping
        // `cmd` closes the write ends and the copiers end.
        // Each stream's live file and its previous part share the job's cap.
        let cap = (self.log_max / 4).max(1);
        let drained = Drained(vec![
            joblog::copy(Arc::clone(&dir), "stdout.log", cap, out_r)?,
            joblog::copy(Arc::clone(&dir), "stderr.log", cap, err_r)?,
        ]);
        let switch_to = l.owner.filter(|_| crate::os::running_as_root());
        let work = dir.work_dir();
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(&c.args[1..])
            .env_clear()
            .envs(job_env(l, c, dir.path()))
            .current_dir(c.workdir.as_deref().map_or(work.as_path(), Path::new))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out_w))
            .stderr(Stdio::from(err_w))
            .kill_on_drop(false);
        if let Some(o) = switch_to {
            // std drops supplementary groups (setgroups) when a root parent sets a uid.
            cmd.uid(o.uid).gid(o.gid);
        }
        // The job's cgroup, and its process list opened here (as mmkd) for the child to
        // write itself into.
        let cgroup = match &self.cgroups {
            Some(cgs) => Some(cgs.for_job(l.job).map_err(StartError::Cgroup)?),
            None => None,
        };
        let procs = match &cgroup {
            Some(cg) => Some(cg.procs_file().map_err(StartError::Cgroup)?),
            None => None,
        };
        let procs_fd = procs.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        // SAFETY: `os::job_pre_exec` makes only async-signal-safe calls, and `procs`
        // stays open until the child is spawned.
        unsafe {
            cmd.pre_exec(move || crate::os::job_pre_exec(procs_fd));
        }
        let child = cmd.spawn().map_err(|source| StartError::Spawn {
            program: program.clone(),
            source,
        })?;
        drop(procs);
        // The write ends went to the child with `cmd`; dropping it closes mmkd's copies,
        // so the copiers see the end of the output once the job's processes are gone.
        drop(cmd);
        Ok((child, drained, cgroup))
    }

    pub fn is_running(&self, job: u64) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&job)
    }

    /// Stops a job: a workload at once; a process with SIGTERM to its process group, then
    /// SIGKILL after the grace period. Returns whether the run has ended (its [`Exit`] is
    /// sent), after the grace period and a few seconds more at most.
    pub async fn stop(&self, job: u64) -> bool {
        let done = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            let Some(r) = running.get_mut(&job) else {
                return true;
            };
            match &mut r.stopper {
                Stopper::Workload(tx) => {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
                Stopper::Process(procs, gone) => {
                    signal_live(procs, gone, libc::SIGTERM);
                }
            }
            (
                r.done.clone(),
                matches!(r.stopper, Stopper::Process(..)).then_some(()),
            )
        };
        let (mut done, is_process) = done;
        if tokio::time::timeout(self.grace, done.wait_for(|d| *d))
            .await
            .is_ok()
        {
            return true;
        }
        if is_process.is_some() {
            if let Some(Running {
                stopper: Stopper::Process(procs, gone),
                ..
            }) = self
                .running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&job)
            {
                tracing::warn!(
                    job,
                    "job ignored SIGTERM for the grace period; sending SIGKILL"
                );
                signal_live(procs, gone, libc::SIGKILL);
            }
            return tokio::time::timeout(Duration::from_secs(5), done.wait_for(|d| *d))
                .await
                .is_ok();
        }
        false
    }

    /// Stops every running job (on mmkd's shutdown).
    pub async fn stop_all(&self) {
        let jobs: Vec<u64> = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        let stops: Vec<_> = jobs.into_iter().map(|j| self.stop(j)).collect();
        for s in stops {
            s.await;
        }
    }
}

/// Why a job's run could not start; its reason says so (with every cause).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the command names no program")]
    NoProgram,
    #[error("cannot prepare the job's directory")]
    JobDir(#[from] JobDirError),
    #[error("cannot make a pipe for the job's output")]
    Pipe(#[source] std::io::Error),
    #[error("cannot start {program:?}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the process exited before it could be watched")]
    Vanished,
    #[error("an attached allocation's process is started by its caller")]
    Attached,
    #[error("cannot make the job's cgroup")]
    Cgroup(#[source] std::io::Error),
}

/// Signals a job's processes unless the job's end found them gone.
fn signal_live(procs: &Procs, gone: &std::sync::atomic::AtomicBool, sig: i32) {
    if !gone.load(std::sync::atomic::Ordering::Acquire) {
        procs.signal(sig);
    }
}

/// Whether a live process of the group is left. Signal 0 checks without sending, but it
/// also counts zombies, which wait for their new parent to reap them: those are read from
/// /proc and do not count.
fn group_alive(pgid: i32) -> bool {
    crate::os::signal_group(pgid, 0) && live_member(pgid)
}

fn live_member(pgid: i32) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    procs.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // After the command name in parentheses: state, ppid, pgrp, ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            return false;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|f| f.parse::<i32>().ok());
        pgrp == Some(pgid) && state != Some("Z")
    })
}

/// Ends what is left of a job's processes (its process group, and its cgroup: processes
/// that left the group) after its main process exited: SIGTERM, up to `grace` for the rest
/// to exit, then SIGKILL; then removes its cgroup. Returns at once when nothing is left.
/// Finding what is left reads /proc: done on a blocking thread, off the runtime's workers.
async fn end_procs(procs: &Procs, grace: Duration) {
    let procs = procs.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || end_procs_now(&procs, grace)).await {
        tracing::warn!(error = %e, "ending a job's processes failed");
    }
}

/// [`end_procs`] on the calling thread.
fn end_procs_now(procs: &Procs, grace: Duration) {
    let wait_while_alive = |limit: Duration, every: Duration| {
        let deadline = std::time::Instant::now() + limit;
        while procs.alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(every);
        }
    };
    if procs.alive() {
        procs.signal(libc::SIGTERM);
        wait_while_alive(grace, Duration::from_millis(50));
        if procs.alive() {
            tracing::warn!(
                pgid = procs.pgid,
                "processes of a job outlived it and the grace period; sending SIGKILL"
            );
            procs.signal(libc::SIGKILL);
            // SIGKILL lands asynchronously: report the job's end once its processes are
            // gone.
            wait_while_alive(Duration::from_secs(5), Duration::from_millis(10));
        }
    }
    if let Some(c) = &procs.cgroup {
        c.remove();
    }
}

/// The environment of a job process: a few variables inherited from mmkd, the spec's own,
/// then mmk's (which the spec cannot override).
pub fn job_env(l: &Launch, c: &CommandSpec, log_dir: &Path) -> BTreeMap<String, String> {
    let mut env = identity_env(l.owner.filter(|_| crate::os::running_as_root()));
    env.extend(c.env.clone());
    let own_preload = env.remove("LD_PRELOAD");
    env.extend(mmk_env(l));
    // Also the marker by which a restarted mmkd finds this job's processes.
    env.insert("MMK_LOG_DIR".into(), log_dir.display().to_string());
    // Under the kernel scheduler each of the job's CUDA processes writes what the
    // interposer counted (launches, holds, waits, its own cost) into the job's own
    // directory at a normal exit (the interposer writes it from atexit).
    if l.ksched.is_some() {
        env.insert(
            "MMK_KSCHED_STATS".into(),
            log_dir
                .join(joblog::WORK_DIR)
                .join("ksched-%p.json")
                .display()
                .to_string(),
        );
    }
    // The interposer goes first; a preload the spec asked for stays after it.
    let preload = match env.remove("LD_PRELOAD") {
        Some(mmk) => mmk_core::paths::preload_first(&mmk, own_preload.as_deref()),
        None => own_preload.unwrap_or_default(),
    };
    if !preload.is_empty() {
        env.insert("LD_PRELOAD".into(), preload);
    }
    env
}

/// The variables a job starts with before its spec's: a job that runs as another user
/// than mmkd's (a root mmkd runs each job as its owner) gets that user's `HOME`, `USER`,
/// `LOGNAME` (from the node's user database; `HOME=/` for a uid it does not know) and the
/// plain `PATH`, never mmkd's own; `LANG` and `TZ` come from mmkd. A job of mmkd's own user
/// inherits all six from mmkd.
fn identity_env(runs_as: Option<Owner>) -> BTreeMap<String, String> {
    use uzers::os::unix::UserExt as _;
    let mine = crate::os::euid();
    let mut env: BTreeMap<String, String> = INHERITED_ENV
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
        .collect();
    if let Some(o) = runs_as.filter(|o| o.uid != mine) {
        for k in ["HOME", "USER", "LOGNAME"] {
            env.remove(k);
        }
        env.insert("PATH".into(), DEFAULT_PATH.into());
        match uzers::get_user_by_uid(o.uid) {
            Some(user) => {
                let name = user.name().to_string_lossy().into_owned();
                env.insert("HOME".into(), user.home_dir().display().to_string());
                env.insert("USER".into(), name.clone());
                env.insert("LOGNAME".into(), name);
            }
            None => {
                env.insert("HOME".into(), "/".into());
            }
        }
    }
    env.entry("PATH".into())
        .or_insert_with(|| DEFAULT_PATH.into());
    env
}

/// What mmk sets for a job in its partition: the device, the MPS share, client priority
/// and memory limit, the MPS pipe, the kernel scheduler's interposer (`LD_PRELOAD`, alone)
/// and gate, and the job's identity. A managed job gets these over its spec's own; an attached allocation
/// returns them to its caller.
pub fn mmk_env(l: &Launch) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let a = &l.assignment;
    env.insert("MMK_JOB_ID".into(), l.job.to_string());
    env.insert("MMK_JOB_NAME".into(), l.name.clone());
    env.insert("MMK_JOB_CLASS".into(), l.class.as_str().into());
    env.insert(
        "MMK_PARTITION".into(),
        format!("gpu{}/{}@{}", a.slot.gpu, a.profile, a.slot.start),
    );
    env.insert("CUDA_VISIBLE_DEVICES".into(), a.device_uuid.clone());
    env.insert(
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
        a.mps_share.to_string(),
    );
    // MPS's per-client priority (0 normal, 1 below normal; a hint to the MPS server):
    // offline clients yield to online ones in a shared partition.
    let priority = match l.class {
        JobClass::Online => "0",
        JobClass::Offline => "1",
    };
    env.insert("CUDA_MPS_CLIENT_PRIORITY".into(), priority.into());
    // Device 0 is the only device the job sees (CUDA_VISIBLE_DEVICES names one).
    env.insert(
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
        format!("0={}M", l.memory_mib),
    );
    if let Some(pipe) = &l.mps_pipe {
        env.insert("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.display().to_string());
    }
    if let Some(k) = &l.ksched {
        env.insert("LD_PRELOAD".into(), k.interposer.display().to_string());
        env.insert("MMK_GATE".into(), k.gate.display().to_string());
        if let Some(profile) = &k.profile {
            env.insert("MMK_KSCHED_PROFILE".into(), profile.display().to_string());
        }
    }
    if l.restarts > 0 {
        env.insert("MMK_RESUME".into(), "1".into());
    }
    env
}

/// Kills what is left of a job's processes from an earlier mmkd (its main process died with
/// that mmkd through PR_SET_PDEATHSIG; processes it started may not have). A process is
/// the job's when its environment holds both the job's `MMK_JOB_ID` and its `MMK_LOG_DIR`.
/// Returns how many processes were killed.
pub fn kill_leftovers(job: u64, log_dir: &Path) -> usize {
    let id_marker = format!("MMK_JOB_ID={job}");
    let dir_marker = format!("MMK_LOG_DIR={}", log_dir.display());
    procs::scan(|env| env.has(&id_marker) && env.has(&dir_marker))
        .into_iter()
        .filter(|pid| procs::kill(*pid, libc::SIGKILL))
        .count()
}

#[cfg(test)]
mod tests;
