//! The node: what mmkd does with jobs, by concern.
//!
//! - [`service`]: what callers ask for (admission, cancel, queries, dry runs); the gRPC
//!   adapters call it and only convert.
//! - [`reconciler`]: one task that makes the node follow the plan: it plans (off the async
//!   runtime), records each MIG step as intent before it applies it, starts placed jobs
//!   and records their exits.
//! - [`recovery`]: at start, what a previous mmkd left (jobs that lost their process,
//!   steps under way, instances the record lacks).
//! - [`attached`]: allocations whose processes the caller runs (Slurm, Kubernetes).
//!
//! A job goes `mmkctl submit` -> `grpc.rs` -> [`Node::submit`] (stored QUEUED, announced)
//! -> the reconciler's pass (planned, STARTING) -> [`crate::runner`] (RUNNING) -> its exit
//! (SUCCEEDED, FAILED, requeued) in the reconciler.
//!
//! Two short locks order the writes. `state` is held around reading a job and writing its
//! next state, so that a cancel and a launch decide on the same record; it is never held
//! across a process stop, an MPS call, a GPU call or a planning run, so a cancel never
//! waits for a pass. `emit` is held around "write a state change, then announce it", so
//! that events go out in the order of their writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mmk_core::{JobState, ServiceResult, now_ms};
use mmk_partitioner::Planner;
use tokio::sync::{Notify, broadcast, mpsc};
use tokio::task::JoinHandle;
use tracing::{info, warn};

mod attached;
mod capacity;
mod disk;
mod history;
pub mod recent;
mod reconciler;
mod recovery;
mod service;
mod slo;
mod telemetry;

pub use attached::{AllocationView, Capacity, Fit, GpuCapacity, Mount, Verdict};
pub use capacity::{GpuView, PartitionView, free_memory_mib, free_slices, partitions_of};
pub use disk::DiskConfig;
pub use history::{HistoryPolicy, Pruned};
pub use recent::JobSeries;
pub use reconciler::planner_profile;
pub use service::MAX_REQUEST_ID;
pub use slo::PartitionIsolation;
pub use telemetry::NodeMetrics;

use crate::backend::GpuBackend;
use crate::job::{Change, JobRecord};
use crate::learn::sampler::{Readings, Sampler};
use crate::learn::{Learned, Profiles, Seen};
use crate::mps::Mps;
use crate::runner::{Exit, Runner};
use crate::store::{Store, StoreError};

/// A state change, as watchers see it.
#[derive(Debug, Clone)]
pub struct JobEvent {
    pub seq: u64,
    pub at: i64,
    pub job: JobRecord,
}

#[derive(Debug, Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    backend: Arc<dyn GpuBackend>,
    planner: Arc<dyn Planner>,
    runner: Runner,
    /// Where jobs are started; `None` when its thread could not be made (then on the
    /// runtime).
    spawner: Option<crate::runner::Spawner>,
    /// One MPS control daemon per partition in use.
    mps: Mps,
    events: broadcast::Sender<JobEvent>,
    /// Held around reading a job and writing its next state (module docs); never across
    /// a slow call.
    state: tokio::sync::Mutex<()>,
    /// Held only around "write a state change, then announce it", so that events go out
    /// in the order of their writes without making admissions wait for a pass.
    emit: tokio::sync::Mutex<()>,
    kick: Notify,
    /// Jobs being cancelled, with the reason to record when they stop and who cancelled.
    cancelling: Mutex<HashMap<u64, Cancel>>,
    /// Jobs a pass is stopping for a move or a preemption: the pass records how their run
    /// ended (back to the queue), not the exit that its stop causes.
    moving: Mutex<std::collections::HashSet<u64>>,
    /// Exits whose recording failed (the store refused), tried again before each pass.
    pending_exits: Mutex<Vec<Exit>>,
    /// The pause before a failed pass runs again; doubles up to RETRY_MAX, reset on success.
    retry_delay: Mutex<Duration>,
    /// Active attached allocations: their watched process, lease and environment.
    attached: Mutex<HashMap<u64, attached::Held>>,
    /// Learned profiles by job signature ([`crate::learn`]).
    learned: Profiles,
    /// Samples running jobs' gate slots into their learned profiles.
    sampler: Sampler,
    /// Latencies for `mmkd --metrics`.
    metrics: NodeMetrics,
    /// Jobs told this run that they run slower than their learned profile.
    slow_noted: Mutex<std::collections::HashSet<u64>>,
    /// How many jobs were submitted since a pass last left one waiting.
    calm: Mutex<Calm>,
    /// The data dir's disk: jobs' folders, the store's reserve; `None`: not guarded.
    disk: Option<disk::DiskState>,
    /// What the store keeps of ended jobs.
    history: HistoryPolicy,
    /// The jobs that ended in the last minutes, for the metrics.
    recent: Mutex<recent::RecentlyEnded>,
    /// The SLO control's settings; `None` when it is off.
    slo: Option<crate::slo::SloConfig>,
    /// What the SLO control keeps: the online jobs under it, a control per partition.
    slo_state: Mutex<slo::SloState>,
}

/// The node's calm for the planner (`NodeState::calm_arrivals`): jobs submitted since a
/// pass last left one waiting, or since this daemon's first pass. Job IDs only grow, so
/// the newest ID seen counts the submissions, whichever of them have ended since.
#[derive(Debug, Default)]
struct Calm {
    /// The newest job ID seen when the count last started.
    since: Option<u64>,
    /// The newest job ID seen so far.
    newest: u64,
}

impl Calm {
    /// Jobs submitted since the count started, `newest` being the newest active job's ID
    /// now. `start`: a pass, which starts the count if none has.
    fn arrivals(&mut self, newest: u64, start: bool) -> u64 {
        self.newest = self.newest.max(newest);
        let since = match self.since {
            Some(s) => s,
            None if start => *self.since.insert(self.newest),
            None => self.newest,
        };
        self.newest.saturating_sub(since)
    }

    /// A pass left a job waiting: the count starts again.
    fn waited(&mut self) {
        self.since = Some(self.newest);
    }
}

/// A cancel under way: the reason to record, who cancelled, and whether mmk stopped the
/// job's run (then CANCELLED wins over whatever the run exits with; a run that had ended
/// before the cancel decides itself whether it SUCCEEDED).
#[derive(Debug, Clone)]
struct Cancel {
    reason: String,
    by: Option<u32>,
    stopped: bool,
    /// What the job becomes: CANCELLED for a caller's cancel, FAILED when mmkd stops it
    /// (its folder took more disk than it may).
    ends_as: JobState,
}

/// Pause before a failed scheduling pass runs again, doubling up to RETRY_MAX.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// What a node is made of.
#[derive(Debug)]
pub struct Parts {
    pub store: Store,
    pub backend: Arc<dyn GpuBackend>,
    pub planner: Arc<dyn Planner>,
    pub runner: Runner,
    pub mps: Mps,
    /// The data dir's disk guard; `None`: not guarded.
    pub disk: Option<DiskConfig>,
    /// What the store keeps of ended jobs.
    pub history: HistoryPolicy,
    /// The SLO control (docs/slo.md); `None`: off.
    pub slo: Option<crate::slo::SloConfig>,
}

impl Node {
    /// Reconciles what a previous mmkd left (jobs that were running when it stopped),
    /// then starts the scheduling loop. The loop ends when `shutdown` is notified.
    pub async fn start(
        parts: Parts,
        exits: mpsc::UnboundedReceiver<Exit>,
        shutdown: Arc<Notify>,
    ) -> Result<(Node, JoinHandle<()>), StoreError> {
        let Parts {
            store,
            backend,
            planner,
            runner,
            mps,
            disk,
            history,
            slo,
        } = parts;
        let (events, _) = broadcast::channel(1024);
        let learned = Profiles::new(load_profiles(&store).await?);
        let device = Arc::clone(&backend);
        let (sampler, reports, sampling) = Sampler::start(Some(Arc::new(move || Readings {
            memory: device.process_memory(),
            bandwidth: device.dram_bandwidth(),
        })));
        let spawner = crate::runner::Spawner::start()
            .inspect_err(|e| warn!(error = %e, "cannot start the thread that starts jobs; starting them on the runtime"))
            .ok();
        let node = Node {
            inner: Arc::new(Inner {
                store,
                backend,
                planner,
                runner,
                spawner,
                mps,
                events,
                state: tokio::sync::Mutex::new(()),
                emit: tokio::sync::Mutex::new(()),
                kick: Notify::new(),
                cancelling: Mutex::default(),
                moving: Mutex::default(),
                pending_exits: Mutex::default(),
                retry_delay: Mutex::new(RETRY_FIRST),
                attached: Mutex::default(),
                learned,
                sampler,
                metrics: NodeMetrics::default(),
                slow_noted: Mutex::default(),
                calm: Mutex::default(),
                disk: disk.map(disk::DiskState::new),
                history,
                recent: Mutex::default(),
                slo,
                slo_state: Mutex::default(),
            }),
        };
        node.recover().await?;
        // The jobs that ended in the last minutes before this start, for the metrics.
        let kept_ms = i64::try_from(recent::KEPT_FOR.as_millis()).unwrap_or(i64::MAX);
        let now = mmk_core::now_ms();
        for job in node
            .inner
            .store
            .list_jobs_ended_since(now.saturating_sub(kept_ms))
            .await?
        {
            node.recent().seen(&job, now);
        }
        let looping = node.clone();
        let keeping = node.clone();
        let finishing = node.clone();
        let handle = tokio::spawn(async move {
            let (stopped, stop) = tokio::sync::oneshot::channel();
            let learning = tokio::spawn(keeping.keep_profiles(reports, stop));
            looping.run(exits, shutdown).await;
            // What the sampler saw of the jobs still running is kept before mmkd ends.
            finishing.inner.sampler.stop();
            let _ = tokio::task::spawn_blocking(move || sampling.join()).await;
            finishing.inner.sampler.unwatch_all();
            let _ = stopped.send(());
            let _ = learning.await;
        });
        tokio::spawn(node.clone().guard_disk());
        tokio::spawn(node.clone().keep_history());
        if let Some(config) = slo {
            tokio::spawn(node.clone().keep_slos(config));
        }
        node.inner.kick.notify_one();
        Ok((node, handle))
    }

    pub fn backend_kind(&self) -> &'static str {
        self.inner.backend.kind()
    }

    pub fn planner_name(&self) -> &'static str {
        self.inner.planner.name()
    }

    pub fn runner(&self) -> &Runner {
        &self.inner.runner
    }

    pub fn mps(&self) -> &Mps {
        &self.inner.mps
    }

    /// What each running job's processes did in its gate over its run (and runs that
    /// ended in the last five minutes).
    pub fn job_totals(&self) -> HashMap<u64, crate::learn::sampler::JobTotals> {
        self.inner.sampler.totals()
    }

    /// The latencies mmkd has recorded since it started.
    pub fn metrics(&self) -> &NodeMetrics {
        &self.inner.metrics
    }

    /// How many jobs the store holds in each state.
    pub async fn count_by_state(&self) -> Result<Vec<(JobState, u64)>, StoreError> {
        self.inner.store.count_by_state().await
    }

    /// The node's learned profiles.
    pub fn learned(&self) -> &Profiles {
        &self.inner.learned
    }

    /// What the planner assumes of job `j`: "learned (...)", "named W", "exclusive" or
    /// "prior".
    pub fn planner_profile(&self, j: &JobRecord) -> String {
        match self.inner.learned.for_job(j.owner, &j.spec) {
            Some(l) => l.describe(now_ms()),
            None => reconciler::planner_profile(&j.spec),
        }
    }

    /// Adds what the sampler reports to the profiles and stores them; once `stop` fires,
    /// what is left in the channel is kept and the task ends.
    async fn keep_profiles(
        self,
        mut reports: mpsc::UnboundedReceiver<Seen>,
        mut stop: tokio::sync::oneshot::Receiver<()>,
    ) {
        loop {
            tokio::select! {
                biased;
                Some(seen) = reports.recv() => self.keep(seen).await,
                _ = &mut stop => break,
            }
        }
        while let Ok(seen) = reports.try_recv() {
            self.keep(seen).await;
        }
    }

    async fn keep(&self, seen: Seen) {
        let before = self.inner.learned.get(&seen.signature);
        if let Some((ratio, now, expected)) = before
            .as_ref()
            .and_then(|p| crate::learn::slower_than_learned(p, &seen.observed))
        {
            self.note_slow(seen.job, ratio, now, expected).await;
        }
        let was_confident = before.is_some_and(|p| p.observed.confident());
        let learned = self.inner.learned.add(&seen, now_ms());
        if !was_confident && learned.observed.confident() {
            // Planned on the prior until now: the next pass plans on what was learned (a
            // running job's share changes at its next start; a checkpointable offline job
            // may be moved).
            info!(signature = %learned.signature, samples = learned.observed.samples, "learned profile confident");
            self.inner.kick.notify_one();
        }
        tracing::debug!(
            job = seen.job,
            signature = %learned.signature,
            samples = learned.observed.samples,
            "learned profile updated"
        );
        if let Err(e) = self.inner.store.put_profile(&learned).await {
            warn!(signature = %learned.signature, error = %crate::error::chain(&e), "cannot store a learned profile");
        }
    }

    /// Tells a running job's watchers, once a run, that its kernels take far longer than
    /// its learned profile says (a slower partition or share, or heavy co-runners): an
    /// event and a reason. Its profile takes the new figures in, so its next start is
    /// planned on what it does now.
    async fn note_slow(&self, job: u64, ratio: f64, now: f64, expected: f64) {
        // Under the state lock, so that a run that ends meanwhile keeps its final reason.
        let _state = self.inner.state.lock().await;
        if !matches!(self.inner.store.get_job(job).await, Ok(j) if j.state == JobState::Running) {
            return;
        }
        if !self
            .inner
            .slow_noted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(job)
        {
            return;
        }
        let reason = format!(
            "running, {ratio:.1}x slower than its learned profile: its kernels take {now:.0} us \
             against {expected:.0} us; its next start is planned on what it does now"
        );
        warn!(job, %reason, "a job runs slower than its learned profile");
        let _emit = self.inner.emit.lock().await;
        match self.inner.store.note(job, &reason, now_ms()).await {
            Ok((j, ev)) => self.emit(ev.seq, ev.at, j),
            Err(e) => {
                warn!(job, error = %crate::error::chain(&e), "cannot record that a job runs slow")
            }
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<JobEvent> {
        self.inner.events.subscribe()
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, recent::RecentlyEnded> {
        self.inner
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn emit(&self, seq: u64, at: i64, job: JobRecord) {
        self.recent().seen(&job, at);
        // No receivers is fine: nobody watches.
        let _ = self.inner.events.send(JobEvent { seq, at, job });
    }

    async fn transition(
        &self,
        id: u64,
        to: JobState,
        reason: &str,
        change: Change,
    ) -> ServiceResult<JobRecord> {
        let _emit = self.inner.emit.lock().await;
        let started = std::time::Instant::now();
        let written = self
            .inner
            .store
            .transition(id, to, reason, change, now_ms())
            .await;
        NodeMetrics::since(&self.inner.metrics.store_write, started);
        let (job, ev) = written?;
        if !matches!(to, JobState::Starting | JobState::Running) {
            // Its run is over: what was seen of it goes into its profile; its totals stay
            // with it for its next run, or for a while after its end.
            self.inner.sampler.unwatch(id, to != JobState::Queued);
            self.slo_forget(id);
            self.inner
                .slow_noted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        }
        info!(job = id, state = %to, reason, "job state changed");
        self.emit(ev.seq, ev.at, job.clone());
        Ok(job)
    }

    /// The jobs being cancelled.
    fn cancelling(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Cancel>> {
        self.inner
            .cancelling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Tells the backend that the job no longer uses its instance.
    fn release(&self, job: &JobRecord) {
        if let Some(a) = &job.assignment
            && a.slot.profile_id.is_some()
        {
            self.inner
                .backend
                .set_in_use(a.slot.gpu, a.instance_id, false);
        }
    }
}

/// The stored learned profiles; a row that cannot be read is left out with a warning that
/// names it (it is replaced when that job runs again).
async fn load_profiles(store: &Store) -> Result<Vec<Learned>, StoreError> {
    let mut good = Vec::new();
    for row in store.profiles().await? {
        match row {
            Ok(p) => good.push(p),
            Err((signature, why)) => {
                warn!(%signature, %why, "learned profile unreadable; ignored");
            }
        }
    }
    if !good.is_empty() {
        info!(profiles = good.len(), "learned profiles loaded");
    }
    Ok(good)
}

#[cfg(test)]
mod tests {
    use super::Calm;

    #[test]
    fn calm_counts_submissions_since_the_last_wait_whichever_have_ended() {
        let mut calm = Calm::default();
        // A dry run before any pass counts nothing.
        assert_eq!(calm.arrivals(5, false), 0);
        // The first pass starts the count at the newest job it sees.
        assert_eq!(calm.arrivals(5, true), 0);
        assert_eq!(calm.arrivals(9, true), 4);
        // Jobs 6 to 9 ended; only job 3 is active: the count stays.
        assert_eq!(calm.arrivals(3, true), 4);
        assert_eq!(calm.arrivals(12, true), 7);
        // A pass left a job waiting: counted again from job 12.
        calm.waited();
        assert_eq!(calm.arrivals(12, true), 0);
        assert_eq!(calm.arrivals(4, false), 0);
        assert_eq!(calm.arrivals(60, true), 48);
    }
}
