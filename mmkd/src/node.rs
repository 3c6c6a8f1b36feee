//! The node controller: admits jobs, runs the planner, applies its plan through the GPU
//! backend and the runner, and records every state change in the store.
//!
//! One scheduling pass at a time (`sched` lock). A pass runs after every admission, exit
//! and cancellation. Intent (the plan) and observed state (the backend's instances, the
//! runner's processes) stay apart: the pass reads both, then changes one step at a time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mmk_core::spec::{RestartPolicy, Task};
use mmk_core::units::format_mib;
use mmk_core::{FieldError, JobClass, JobSpec, JobState, ServiceError, ServiceResult, now_ms};
use mmk_partitioner::plan::largest_partition_mib;
use mmk_partitioner::{GpuState, JobDemand, JobProfile, NodeState, Plan, Planner, Slot, Step};
use tokio::sync::{Notify, broadcast, mpsc};
use tokio::task::JoinHandle;
use tracing::{info, instrument, warn};

mod attached;

pub use attached::{AllocationView, Capacity, Fit, GpuCapacity, Mount, Verdict};

use crate::backend::GpuBackend;
use crate::ksched;
use crate::mps::{self, Mps};
use crate::runner::{self, Exit, Launch, Outcome, Runner};
use crate::store::{
    Assignment, Change, InstanceRecord, JobRecord, Owner, StepRecord, Store, StoreError,
};

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
    planner: Box<dyn Planner>,
    runner: Runner,
    /// One MPS control daemon per partition in use.
    mps: Mps,
    events: broadcast::Sender<JobEvent>,
    /// One scheduling pass (or exit, or cancel) at a time; held across GPU calls.
    sched: tokio::sync::Mutex<()>,
    /// Held only around "write a state change, then announce it", so that events go out
    /// in the order of their writes without making admissions wait for a pass.
    emit: tokio::sync::Mutex<()>,
    kick: Notify,
    /// Jobs being cancelled, with the reason to record when they stop.
    cancelling: Mutex<HashMap<u64, (String, Option<u32>)>>,
    /// Exits whose recording failed (the store refused), tried again before each pass.
    pending_exits: Mutex<Vec<Exit>>,
    /// The pause before a failed pass runs again; doubles up to RETRY_MAX, reset on success.
    retry_delay: Mutex<Duration>,
    /// Active attached allocations: their watched process, lease and environment.
    attached: Mutex<HashMap<u64, attached::Held>>,
}

/// How long `cancel` waits for a stopped job's final state beyond the runner's stop.
const CANCEL_SETTLE: Duration = Duration::from_secs(10);
/// Pause before a failed scheduling pass runs again, doubling up to RETRY_MAX.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The longest request id a submit may carry.
pub const MAX_REQUEST_ID: usize = 128;

impl Node {
    /// Reconciles what a previous mmkd left (jobs that were running when it stopped),
    /// then starts the scheduling loop. The loop ends when `shutdown` is notified.
    pub async fn start(
        store: Store,
        backend: Arc<dyn GpuBackend>,
        planner: Box<dyn Planner>,
        runner: Runner,
        mps: Mps,
        exits: mpsc::UnboundedReceiver<Exit>,
        shutdown: Arc<Notify>,
    ) -> Result<(Node, JoinHandle<()>), StoreError> {
        let (events, _) = broadcast::channel(1024);
        let node = Node {
            inner: Arc::new(Inner {
                store,
                backend,
                planner,
                runner,
                mps,
                events,
                sched: tokio::sync::Mutex::new(()),
                emit: tokio::sync::Mutex::new(()),
                kick: Notify::new(),
                cancelling: Mutex::default(),
                pending_exits: Mutex::default(),
                retry_delay: Mutex::new(RETRY_FIRST),
                attached: Mutex::default(),
            }),
        };
        node.recover().await?;
        let looping = node.clone();
        let handle = tokio::spawn(async move { looping.run(exits, shutdown).await });
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

    pub fn subscribe(&self) -> broadcast::Receiver<JobEvent> {
        self.inner.events.subscribe()
    }

    /// Admits a validated job: it is stored QUEUED and the planner runs.
    /// `owner` is the caller from the Unix socket's peer credentials; a command job runs
    /// as that user. A root mmkd refuses command jobs from callers it cannot identify.
    ///
    /// With a `request_id`, a retry of a submit whose answer the caller lost returns the
    /// job the first one stored. Admission runs to its end even when the caller goes away
    /// (a gRPC handler is dropped when its client disconnects): a stored job is always
    /// announced and planned.
    pub async fn submit(
        &self,
        spec: JobSpec,
        owner: Option<Owner>,
        request_id: Option<String>,
    ) -> ServiceResult<JobRecord> {
        let node = self.clone();
        tokio::spawn(async move { node.admit(spec, owner, request_id).await })
            .await
            .map_err(|e| ServiceError::Internal(format!("admission failed: {e}")))?
    }

    #[instrument(skip_all, fields(job = %spec.name, class = %spec.class))]
    async fn admit(
        &self,
        spec: JobSpec,
        owner: Option<Owner>,
        request_id: Option<String>,
    ) -> ServiceResult<JobRecord> {
        spec.validate()?;
        if let Some(rid) = &request_id
            && (rid.is_empty()
                || rid.len() > MAX_REQUEST_ID
                || !rid.chars().all(|c| c.is_ascii_graphic()))
        {
            return Err(ServiceError::InvalidArgument(FieldError::new(
                "request_id",
                format!("must be 1 to {MAX_REQUEST_ID} visible ASCII characters"),
            )));
        }
        let held = Self::hold(&spec)?;
        if owner.is_none()
            && matches!(spec.task, mmk_core::Task::Command(_))
            && runner::running_as_root()
        {
            return Err(ServiceError::PermissionDenied(
                "command jobs must come over mmkd's Unix socket, which tells who submits them; \
                 this connection does not"
                    .into(),
            ));
        }
        let gpus = self.gpus().await?;
        let largest = largest_partition_mib(&NodeState { gpus });
        if spec.gpu_memory_mib > largest {
            return Err(ServiceError::InvalidArgument(FieldError::new(
                "gpu_memory",
                format!(
                    "{} is more than the largest partition this node can make ({})",
                    format_mib(spec.gpu_memory_mib),
                    format_mib(largest)
                ),
            )));
        }
        // Stored and announced under the emit lock: a pass that sees this job can only
        // announce its placement after this QUEUED event.
        let _emit = self.inner.emit.lock().await;
        let (job, ev) = self
            .inner
            .store
            .insert_job_once(&spec, owner, request_id.as_deref(), now_ms())
            .await
            .map_err(store_error)?;
        let Some(ev) = ev else {
            info!(job = job.id, "a retried submit: the job it stored before");
            return Ok(job);
        };
        info!(job = job.id, "job admitted");
        if let Some(h) = held {
            self.register(job.id, h);
        }
        self.emit(ev.seq, ev.at, job.clone());
        self.inner.kick.notify_one();
        Ok(job)
    }

    /// Subscribes to job events and reads the jobs as they are, with no change in between:
    /// what WatchJobs with `include_current` sends.
    pub async fn subscribe_with_snapshot(
        &self,
    ) -> ServiceResult<(broadcast::Receiver<JobEvent>, Vec<JobRecord>)> {
        let _emit = self.inner.emit.lock().await;
        let rx = self.subscribe();
        let jobs = self.list(&[], None).await?;
        Ok((rx, jobs))
    }

    pub async fn get(&self, id: u64) -> ServiceResult<JobRecord> {
        self.inner.store.get_job(id).await.map_err(store_error)
    }

    /// One page of the job list: at most `limit` jobs with ids above `after`.
    pub async fn list_page(
        &self,
        states: &[JobState],
        class: Option<JobClass>,
        after: u64,
        limit: u32,
    ) -> ServiceResult<Vec<JobRecord>> {
        self.inner
            .store
            .list_jobs_page(states, class, after, limit)
            .await
            .map_err(store_error)
    }

    pub async fn list(
        &self,
        states: &[JobState],
        class: Option<JobClass>,
    ) -> ServiceResult<Vec<JobRecord>> {
        self.inner
            .store
            .list_jobs(states, class)
            .await
            .map_err(store_error)
    }

    /// Cancels a job. A queued job is cancelled at once; a running one is stopped first
    /// (SIGTERM, then SIGKILL after the grace period) and the call returns once it ended.
    #[instrument(skip(self, reason))]
    pub async fn cancel(&self, id: u64, reason: &str, by: Option<u32>) -> ServiceResult<JobRecord> {
        let reason = if reason.trim().is_empty() {
            "cancelled by user".to_owned()
        } else {
            format!("cancelled: {}", reason.trim())
        };
        let mut events = self.subscribe();
        let stopping = {
            let _pass = self.inner.sched.lock().await;
            let job = self.get(id).await?;
            if job.state.is_terminal() {
                return Err(ServiceError::FailedPrecondition(format!(
                    "job {id} has already ended ({})",
                    job.state
                )));
            }
            if self
                .inner
                .cancelling
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&id)
            {
                return Err(ServiceError::FailedPrecondition(format!(
                    "job {id} is already being cancelled"
                )));
            }
            if job.state == JobState::Queued {
                let change = Change {
                    ended_by: by,
                    ..Change::default()
                };
                let job = self
                    .transition(id, JobState::Cancelled, &reason, change)
                    .await?;
                self.held().remove(&id);
                return Ok(job);
            }
            if matches!(job.spec.task, Task::Attached(_)) {
                // No process of mmk's to stop: the caller learns it at its next renewal.
                drop(_pass);
                return self
                    .end_allocation(id, JobState::Cancelled, &reason, None, by)
                    .await?
                    .ok_or_else(|| {
                        ServiceError::FailedPrecondition(format!("job {id} has already ended"))
                    });
            }
            // Active. If its run already ended, its exit is on the way and decides the
            // state (a job that succeeded stays SUCCEEDED); otherwise stop it.
            let running = self.inner.runner.is_running(id);
            if running {
                self.inner
                    .cancelling
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, (reason, by));
            }
            running
        };
        if stopping {
            self.inner.runner.stop(id).await;
        }
        let settled = tokio::time::timeout(CANCEL_SETTLE, async {
            loop {
                match events.recv().await {
                    Ok(ev) if ev.job.id == id && ev.job.state.is_terminal() => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                    _ => {}
                }
            }
        })
        .await;
        let job = self.get(id).await?;
        if settled.is_err() && !job.state.is_terminal() {
            return Err(ServiceError::Timeout(format!(
                "job {id} did not stop in time; it is still {}",
                job.state
            )));
        }
        Ok(job)
    }

    /// A dry run: the plan if `specs` were submitted now, next to the jobs the node has.
    /// Returns the GPUs it planned on, the plan, and the IDs the specs stood under in it.
    pub async fn dry_run(
        &self,
        specs: &[JobSpec],
    ) -> ServiceResult<(Vec<GpuState>, Plan, Vec<u64>)> {
        let now = self.planning_state().await?;
        let mut demands = now.demands;
        let ids: Vec<u64> = (0..specs.len() as u64)
            .map(|i| now.first_free + i)
            .collect();
        demands.extend(specs.iter().zip(&ids).map(|(s, id)| waiting_demand(*id, s)));
        let plan = self.inner.planner.plan(&now.node, &demands);
        Ok((now.node.gpus, plan, ids))
    }

    /// What a dry run plans from: the active jobs, the GPUs, the jobs as the planner sees
    /// them, and the first ID free for hypothetical jobs (after every stored one).
    async fn planning_state(&self) -> ServiceResult<PlanningState> {
        let jobs = self
            .list(
                &[JobState::Queued, JobState::Starting, JobState::Running],
                None,
            )
            .await?;
        let node = NodeState {
            gpus: self.gpus().await?,
        };
        let demands = jobs.iter().map(demand).collect();
        let first_free = jobs.iter().map(|j| j.id).max().unwrap_or(0) + 1_000_000;
        Ok(PlanningState {
            jobs,
            node,
            demands,
            first_free,
        })
    }

    /// A placed job's run has begun: its instance is in use and it is RUNNING.
    async fn started(
        &self,
        job: &JobRecord,
        a: &Assignment,
        pid: Option<u32>,
        reason: &str,
    ) -> ServiceResult<()> {
        if a.slot.profile_id.is_some() {
            self.inner
                .backend
                .set_in_use(a.slot.gpu, a.instance_id, true);
        }
        let change = Change {
            pid,
            ..Change::default()
        };
        self.transition(job.id, JobState::Running, reason, change)
            .await?;
        Ok(())
    }

    /// The gates of these partitions (keys from `mps::instance_key`) that exist, as they
    /// are now; read off the runtime.
    pub async fn gates(&self, keys: Vec<String>) -> HashMap<String, ksched::GateView> {
        let k = self.inner.runner.kernel_sched().clone();
        tokio::task::spawn_blocking(move || {
            keys.into_iter()
                .filter_map(|key| k.read_gate(&key).map(|v| (key, v)))
                .collect()
        })
        .await
        .unwrap_or_else(|e| {
            warn!(error = %e, "cannot read the gates");
            HashMap::new()
        })
    }

    /// The GPUs as the backend reports them now.
    pub async fn gpus(&self) -> ServiceResult<Vec<GpuState>> {
        let backend = Arc::clone(&self.inner.backend);
        tokio::task::spawn_blocking(move || backend.gpus())
            .await
            .map_err(|e| ServiceError::Internal(format!("gpu inventory task failed: {e}")))?
            .map_err(|e| {
                warn!(error = %e, "cannot read the gpus");
                ServiceError::Unavailable(format!("cannot read the gpus: {e}"))
            })
    }

    fn emit(&self, seq: u64, at: i64, job: JobRecord) {
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
        let (job, ev) = self
            .inner
            .store
            .transition(id, to, reason, change, now_ms())
            .await
            .map_err(store_error)?;
        info!(job = id, state = %to, reason, "job state changed");
        self.emit(ev.seq, ev.at, job.clone());
        Ok(job)
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

    /// Jobs that were STARTING or RUNNING when the last mmkd stopped have lost their
    /// process: back to the queue if their restart policy allows, else FAILED.
    async fn recover(&self) -> Result<(), StoreError> {
        let store = &self.inner.store;
        self.reconcile_instances().await?;
        for job in store
            .list_jobs(&[JobState::Starting, JobState::Running], None)
            .await?
        {
            if matches!(job.spec.task, Task::Attached(_)) {
                // Its MPS daemon is stopped below: whatever its caller runs has lost it.
                let reason = format!(
                    "mmkd restarted while the allocation was {}; its MPS daemon was stopped",
                    job.state.as_str().to_lowercase()
                );
                store
                    .transition(
                        job.id,
                        JobState::Failed,
                        &reason,
                        Change::default(),
                        now_ms(),
                    )
                    .await?;
                info!(job = job.id, reason, "reconciled after restart");
                continue;
            }
            if matches!(job.spec.task, mmk_core::Task::Command(_)) {
                let killed = runner::kill_leftovers(job.id, &self.inner.runner.log_dir(job.id));
                if killed > 0 {
                    warn!(
                        job = job.id,
                        killed, "killed processes the previous mmkd left"
                    );
                }
            }
            let requeue = job.spec.restart_policy == RestartPolicy::OnFailure
                && job.failure_restarts() < job.spec.max_restarts;
            let (to, reason, restart) = if requeue {
                (
                    JobState::Queued,
                    format!(
                        "requeued: mmkd restarted while the job was {} (restart {} of {})",
                        job.state.as_str().to_lowercase(),
                        job.failure_restarts() + 1,
                        job.spec.max_restarts
                    ),
                    true,
                )
            } else {
                (
                    JobState::Failed,
                    format!(
                        "mmkd restarted while the job was {}; its process is gone",
                        job.state.as_str().to_lowercase()
                    ),
                    false,
                )
            };
            store
                .transition(
                    job.id,
                    to,
                    &reason,
                    Change {
                        restart,
                        ..Change::default()
                    },
                    now_ms(),
                )
                .await?;
            info!(job = job.id, state = %to, reason, "reconciled after restart");
        }
        // Waiting allocations are watched again.
        for job in store.list_jobs(&[JobState::Queued], None).await? {
            self.rewatch(&job);
        }
        // After the jobs' leftovers (MPS clients) are gone and before any job starts.
        let orphans = self.inner.mps.cleanup_orphans().await;
        if !orphans.is_empty() {
            warn!(
                partitions = %orphans.join(","),
                "stopped MPS daemons the previous mmkd left"
            );
        }
        Ok(())
    }

    /// After a crash the store's record of the MIG instances and the GPUs can disagree (a
    /// step happened but was not recorded, or was recorded but its effect is gone): steps
    /// that were under way are marked interrupted, and the record follows the GPUs.
    async fn reconcile_instances(&self) -> Result<(), StoreError> {
        let store = &self.inner.store;
        for step in store.interrupt_pending_steps(now_ms()).await? {
            warn!(
                gpu = step.gpu_index,
                kind = %step.kind,
                profile = step.profile_id,
                start = step.start,
                "a reconfiguration step was under way when mmkd stopped; the layout is re-read"
            );
        }
        let backend = Arc::clone(&self.inner.backend);
        let gpus = match tokio::task::spawn_blocking(move || backend.gpus()).await {
            Ok(Ok(g)) => g,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot read the gpus to reconcile the instance records");
                return Ok(());
            }
            Err(e) => {
                warn!(error = %e, "gpu inventory task failed");
                return Ok(());
            }
        };
        let recorded = store.instances().await?;
        let now = now_ms();
        let (mut adopted, mut dropped) = (0, 0);
        // Records of instances the GPUs do not have go first (records are keyed by GPU
        // and start slice), then the GPUs' instances the record lacks are adopted.
        for r in &recorded {
            let present = gpus.iter().any(|g| {
                g.uuid == r.gpu_uuid
                    && g.instances.iter().any(|i| {
                        i.placement.start == r.instance.placement.start
                            && i.profile_id == r.instance.profile_id
                            && i.id == r.instance.id
                    })
            });
            if !present {
                store
                    .remove_instance(&r.gpu_uuid, r.instance.placement.start)
                    .await?;
                dropped += 1;
            }
        }
        for g in gpus.iter().filter(|g| g.mig_enabled) {
            for inst in &g.instances {
                let known = recorded.iter().any(|r| {
                    r.gpu_uuid == g.uuid
                        && r.instance.placement.start == inst.placement.start
                        && r.instance.profile_id == inst.profile_id
                        && r.instance.id == inst.id
                });
                if !known {
                    let rec = InstanceRecord {
                        gpu_uuid: g.uuid.clone(),
                        gpu_index: g.index,
                        instance: inst.clone(),
                    };
                    store.add_instance(&rec, now).await?;
                    adopted += 1;
                }
            }
        }
        info!(
            adopted,
            dropped, "instance records reconciled with the gpus"
        );
        Ok(())
    }

    async fn run(self, mut exits: mpsc::UnboundedReceiver<Exit>, shutdown: Arc<Notify>) {
        let watcher = self
            .inner
            .mps
            .enabled()
            .then(|| tokio::spawn(self.clone().watch_mps()));
        let allocations = tokio::spawn(self.clone().watch_allocations());
        loop {
            tokio::select! {
                () = shutdown.notified() => break,
                () = self.inner.kick.notified() => {}
                exit = exits.recv() => match exit {
                    Some(exit) => self.handle_exit(exit).await,
                    None => break,
                },
            }
            let pending: Vec<Exit> = std::mem::take(
                &mut *self
                    .inner
                    .pending_exits
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()),
            );
            for exit in pending {
                self.handle_exit(exit).await;
            }
            self.schedule().await;
        }
        if let Some(w) = watcher {
            w.abort();
        }
        allocations.abort();
    }

    /// Checks the MPS daemons now and then; what a check finds goes into the records of
    /// the jobs that run in the partition.
    async fn watch_mps(self) {
        let mut tick = tokio::time::interval(self.inner.mps.check_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for ev in self.inner.mps.check().await {
                warn!(partition = %ev.partition.label, "{ev}");
                if let Err(e) = self
                    .note_partition(&ev.partition.key, &ev.to_string())
                    .await
                {
                    warn!(error = %e, "cannot record an mps event on its jobs");
                }
            }
        }
    }

    /// Records `what` on every job that runs in the partition `key`.
    async fn note_partition(&self, key: &str, what: &str) -> Result<(), StoreError> {
        let store = &self.inner.store;
        for job in store
            .list_jobs(&[JobState::Starting, JobState::Running], None)
            .await?
        {
            let here = job
                .assignment
                .as_ref()
                .is_some_and(|a| mps::partition_key(&a.slot, a.instance_id) == key);
            if here {
                let _emit = self.inner.emit.lock().await;
                let (job, ev) = store.note(job.id, what, now_ms()).await?;
                self.emit(ev.seq, ev.at, job);
            }
        }
        Ok(())
    }

    #[instrument(skip(self), fields(job = exit.job))]
    async fn handle_exit(&self, exit: Exit) {
        let _pass = self.inner.sched.lock().await;
        let job = match self.inner.store.get_job(exit.job).await {
            Ok(j) => j,
            Err(e) => {
                warn!(error = %e, "exit of a job the store cannot read");
                return;
            }
        };
        if !job.state.is_active() {
            return;
        }
        if exit.run != job.restarts {
            // A late exit of an earlier run (the job was restarted since).
            return;
        }
        if !matches!(exit.outcome, Outcome::NotStarted(_)) {
            // Only a run that started holds its instance.
            self.release(&job);
        }
        let cancelled = self
            .inner
            .cancelling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&exit.job);
        let change = Change {
            exit_code: exit.outcome.exit_code(),
            ended_by: cancelled.as_ref().and_then(|(_, by)| *by),
            ..Change::default()
        };
        // A job that fails next to an MPS fault says so: its client died with the server.
        let mut what = exit.outcome.describe();
        if matches!(exit.outcome, Outcome::Exited(_) | Outcome::Signaled(_))
            && !exit.outcome.success()
            && let Some(a) = &job.assignment
            && let Some(trouble) = self.inner.mps.trouble(a).await
        {
            what = format!("{what}; {trouble}");
        }
        let result = if let Some((reason, _)) = cancelled {
            self.transition(job.id, JobState::Cancelled, &reason, change)
                .await
        } else if let Outcome::NotStarted(why) = &exit.outcome {
            // Starting again would fail the same way: no restart.
            self.transition(job.id, JobState::Failed, why, change).await
        } else if exit.outcome.success() {
            self.transition(
                job.id,
                JobState::Succeeded,
                &exit.outcome.describe(),
                change,
            )
            .await
        } else if job.spec.restart_policy == RestartPolicy::OnFailure
            && job.failure_restarts() < job.spec.max_restarts
        {
            let reason = format!(
                "requeued after it {} (restart {} of {})",
                what,
                job.failure_restarts() + 1,
                job.spec.max_restarts
            );
            self.transition(
                job.id,
                JobState::Queued,
                &reason,
                Change {
                    restart: true,
                    ..change
                },
            )
            .await
        } else {
            self.transition(job.id, JobState::Failed, &what, change)
                .await
        };
        if result.is_ok() && matches!(job.spec.task, Task::Attached(_)) {
            // An allocation that could not start: nothing to watch any more.
            self.held().remove(&job.id);
        }
        if let Err(e) = result {
            warn!(error = %e, "cannot record a job's end; trying again");
            self.inner
                .pending_exits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(exit);
            self.retry_later();
        }
    }

    /// Runs a pass again after a pause that doubles with each failure.
    fn retry_later(&self) {
        let delay = {
            let mut d = self
                .inner
                .retry_delay
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let now = *d;
            *d = (*d * 2).min(RETRY_MAX);
            now
        };
        let node = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            node.inner.kick.notify_one();
        });
    }

    /// One scheduling pass: plan, change the layout step by step, start placed jobs. A
    /// pass that fails (the store or the GPU refused a step) runs again after a pause.
    async fn schedule(&self) {
        let _pass = self.inner.sched.lock().await;
        match self.schedule_locked().await {
            Ok(()) => {
                *self
                    .inner
                    .retry_delay
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = RETRY_FIRST
            }
            Err(e) => {
                warn!(error = %e, "scheduling pass failed; affected jobs stay queued");
                self.retry_later();
            }
        }
    }

    async fn schedule_locked(&self) -> ServiceResult<()> {
        let store = &self.inner.store;
        let jobs = store
            .list_jobs(
                &[JobState::Queued, JobState::Starting, JobState::Running],
                None,
            )
            .await
            .map_err(store_error)?;
        // With nothing queued a pass can still restart a checkpointable job with a larger
        // share, where a job that left made room (the planner's step 4).
        if jobs.iter().all(|j| {
            j.state != JobState::Queued && !(j.spec.checkpoint && j.spec.class == JobClass::Offline)
        }) {
            return Ok(());
        }
        let gpus = self.gpus().await?;
        let demands: Vec<JobDemand> = jobs.iter().map(demand).collect();
        let node = NodeState { gpus };
        let plan = self.inner.planner.plan(&node, &demands);

        // A step that fails leaves its partition missing; placements elsewhere go ahead.
        let mut failed: Option<ServiceError> = None;
        for step in &plan.steps {
            if let Err(e) = self.apply(&node, step).await {
                warn!(error = %e, ?step, "reconfiguration step failed");
                failed.get_or_insert(e);
            }
        }
        let gpus = if plan.steps.is_empty() {
            node.gpus
        } else {
            self.gpus().await?
        };

        let mut by_id: HashMap<u64, JobRecord> = jobs.iter().map(|j| (j.id, j.clone())).collect();
        // Moves: the job checkpoints on SIGTERM and stops, goes back to the queue with one
        // more restart, and the launches below start it at its new place.
        for id in &plan.moves {
            let (Some(job), Some(to)) = (
                by_id.get(id).filter(|j| j.state.is_active()),
                plan.placements.iter().find(|p| p.job == *id),
            ) else {
                continue;
            };
            let cancelling = self
                .inner
                .cancelling
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(id);
            // A run that already ended (its exit is on the way) or that is being
            // cancelled is not moved; the next pass sees what became of it.
            if cancelling || !self.inner.runner.is_running(*id) {
                continue;
            }
            let from = job.assignment.as_ref().map_or(100, |a| a.mps_share);
            if !self.inner.runner.stop(*id).await {
                warn!(job = id, "a job to move did not stop; it stays where it is");
                continue;
            }
            self.release(job);
            let reason = format!(
                "moved: MPS share {from}% -> {}% (checkpoint and restart)",
                to.mps_share
            );
            let change = Change {
                moved: true,
                ..Change::default()
            };
            let moved = self
                .transition(*id, JobState::Queued, &reason, change)
                .await?;
            by_id.insert(*id, moved);
        }
        for p in &plan.placements {
            let Some(job) = by_id.get(&p.job).filter(|j| j.state == JobState::Queued) else {
                continue;
            };
            match assignment(&gpus, p.slot, p.mps_share) {
                Some(a) => self.launch(job, a, &gpus).await?,
                None => {
                    let why = failed.as_ref().map_or_else(
                        || "waiting: the planned partition does not exist".to_owned(),
                        |e| format!("waiting: reconfiguration failed ({e})"),
                    );
                    store
                        .set_reason(job.id, &why, now_ms())
                        .await
                        .map_err(store_error)?;
                }
            }
        }
        // Why each queued job waits, written only where it changed, in one transaction:
        // with thousands queued a write per job would hold the pass (and cancels) up.
        let changed: Vec<(u64, String)> = plan
            .queued
            .iter()
            .filter(|q| by_id.get(&q.job).is_none_or(|j| j.reason != q.reason))
            .map(|q| (q.job, q.reason.clone()))
            .collect();
        store
            .set_reasons(&changed, now_ms())
            .await
            .map_err(store_error)?;
        failed.map_or(Ok(()), Err)
    }

    /// Applies one layout step, recorded in the store before it starts and when it ends
    /// (with the instance record in the same transaction), so that a crash in between is
    /// found at the next start.
    async fn apply(&self, node: &NodeState, step: &Step) -> ServiceResult<()> {
        let (slot, kind, instance_id) = match step {
            Step::Destroy { slot, instance } => (*slot, "destroy", Some(*instance)),
            Step::Create { slot } => (*slot, "create", None),
        };
        let Some(profile_id) = slot.profile_id else {
            return Ok(());
        };
        let record = StepRecord {
            id: 0,
            gpu_uuid: gpu_uuid(node, slot.gpu),
            gpu_index: slot.gpu,
            kind: kind.into(),
            profile_id,
            start: slot.start,
            instance_id,
        };
        let id = self
            .inner
            .store
            .begin_step(&record, now_ms())
            .await
            .map_err(store_error)?;
        let result = self.apply_step(node, step, id).await;
        if let Err(e) = &result {
            let _ = self
                .inner
                .store
                .fail_step(id, &e.to_string(), now_ms())
                .await;
        }
        result
    }

    async fn apply_step(&self, node: &NodeState, step: &Step, step_id: i64) -> ServiceResult<()> {
        let backend = Arc::clone(&self.inner.backend);
        let store = &self.inner.store;
        match step.clone() {
            Step::Destroy { slot, instance } => {
                let gpu_uuid = gpu_uuid(node, slot.gpu);
                // A running MPS server holds the instance.
                self.inner
                    .mps
                    .stop(mps::partition_key(&slot, instance))
                    .await;
                self.inner
                    .runner
                    .kernel_sched()
                    .remove(&mps::partition_key(&slot, instance));
                tokio::task::spawn_blocking(move || backend.destroy_instance(slot.gpu, instance))
                    .await
                    .map_err(|e| ServiceError::Internal(e.to_string()))?
                    .map_err(|e| ServiceError::Unavailable(e.to_string()))?;
                store
                    .finish_destroy(step_id, &gpu_uuid, slot.start, now_ms())
                    .await
                    .map_err(store_error)?;
                info!(
                    gpu = slot.gpu,
                    instance,
                    start = slot.start,
                    "destroyed gpu instance"
                );
            }
            Step::Create { slot } => {
                let Some(profile) = slot.profile_id else {
                    return Ok(());
                };
                let inst = tokio::task::spawn_blocking(move || {
                    backend.create_instance(slot.gpu, profile, slot.start)
                })
                .await
                .map_err(|e| ServiceError::Internal(e.to_string()))?
                .map_err(|e| ServiceError::Unavailable(e.to_string()))?;
                info!(
                    gpu = slot.gpu,
                    instance = inst.id,
                    profile,
                    start = slot.start,
                    "created gpu instance"
                );
                store
                    .finish_create(
                        step_id,
                        &InstanceRecord {
                            gpu_uuid: gpu_uuid(node, slot.gpu),
                            gpu_index: slot.gpu,
                            instance: inst,
                        },
                        now_ms(),
                    )
                    .await
                    .map_err(store_error)?;
            }
        }
        Ok(())
    }

    async fn launch(&self, job: &JobRecord, a: Assignment, gpus: &[GpuState]) -> ServiceResult<()> {
        let placed = format!(
            "placed on gpu {} {}@{}",
            a.slot.gpu, a.profile, a.slot.start
        );
        self.transition(
            job.id,
            JobState::Starting,
            &placed,
            Change {
                assignment: Some(a.clone()),
                ..Change::default()
            },
        )
        .await?;
        let mps_pipe = match self.inner.mps.ensure(mps::partition(gpus, &a)).await {
            Ok(pipe) => pipe,
            Err(why) => {
                self.not_started(job, why);
                return Ok(());
            }
        };
        let key = mps::partition_key(&a.slot, a.instance_id);
        // Making the gate is file I/O: off the runtime, like the MPS calls.
        let k = self.inner.runner.kernel_sched().clone();
        let sms = ksched::partition_sms(gpus, &a);
        let (profile, policy) = match &job.spec.task {
            Task::Command(c) => (c.kernel_profile.clone(), c.kernel_policy.clone()),
            Task::Attached(a) => (None, a.kernel_policy.clone()),
            Task::Workload(_) => (None, None),
        };
        let online = job.spec.class == JobClass::Online;
        let prepared = tokio::task::spawn_blocking(move || {
            let profile = profile.map(std::path::PathBuf::from);
            let tuning = if online {
                Some(ksched::OnlineTuning::from_spec(
                    policy.as_deref(),
                    profile.as_deref(),
                )?)
            } else {
                None
            };
            k.prepare(&key, sms, profile.as_deref(), tuning)
        })
        .await
        .unwrap_or_else(|e| Err(format!("kernel scheduler: {e}")));
        let ksched = match prepared {
            Ok(k) => k,
            Err(why) => {
                self.not_started(job, why);
                return Ok(());
            }
        };
        let launch = Launch {
            mps_pipe,
            ksched,
            job: job.id,
            name: job.spec.name.clone(),
            class: job.spec.class,
            task: job.spec.task.clone(),
            assignment: a.clone(),
            restarts: job.restarts,
            owner: job.owner,
            memory_mib: job.spec.gpu_memory_mib,
        };
        if matches!(job.spec.task, Task::Attached(_)) {
            return self.attach(job, &launch).await;
        }
        match self.inner.runner.start(&launch) {
            Ok(pid) => self.started(job, &a, pid, "running").await?,
            Err(why) => self.not_started(job, why),
        }
        Ok(())
    }

    /// A job that could not start: FAILED with the reason, recorded through the exit path
    /// (next loop turn), so that a store failure here cannot leave the job STARTING with
    /// nothing to end it.
    fn not_started(&self, job: &JobRecord, why: String) {
        self.inner
            .pending_exits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Exit {
                job: job.id,
                run: job.restarts,
                outcome: Outcome::NotStarted(why),
            });
        self.inner.kick.notify_one();
    }
}

/// See [`Node::planning_state`].
struct PlanningState {
    jobs: Vec<JobRecord>,
    node: NodeState,
    demands: Vec<JobDemand>,
    first_free: u64,
}

/// A job as the planner sees it: its place and share when it runs, its SLO, and the
/// profile of its workload (an unknown profile for command jobs until they are profiled).
fn demand(j: &JobRecord) -> JobDemand {
    let active = j.state.is_active();
    let mut d = waiting_demand(j.id, &j.spec);
    if let Some(a) = j.assignment.as_ref().filter(|_| active) {
        d.placed = Some(a.slot);
        d.mps_share = a.mps_share;
    }
    d
}

/// A job that waits, as the planner sees it.
fn waiting_demand(id: u64, spec: &JobSpec) -> JobDemand {
    let workload = match &spec.task {
        Task::Workload(w) => Some(w.name.as_str()),
        Task::Command(c) => c.profile.as_deref(),
        Task::Attached(a) => a.profile.as_deref(),
    };
    let profile = workload
        .and_then(mmk_core::workload::find)
        .map(|wl| JobProfile::of_workload(wl, spec.class));
    JobDemand {
        id,
        class: spec.class,
        memory_mib: spec.gpu_memory_mib,
        priority: spec.priority,
        placed: None,
        mps_share: 100,
        slo_ms: spec.slo_ms,
        profile: profile.unwrap_or_else(|| JobProfile::unknown(spec.class)),
        movable: spec.checkpoint && spec.class == JobClass::Offline,
    }
}

fn gpu_uuid(node: &NodeState, gpu: u32) -> String {
    node.gpus
        .iter()
        .find(|g| g.index == gpu)
        .map(|g| g.uuid.clone())
        .unwrap_or_default()
}

/// The assignment of a slot on the GPUs as they are now; `None` when it does not exist.
fn assignment(gpus: &[GpuState], slot: Slot, mps_share: u8) -> Option<Assignment> {
    let g = gpus.iter().find(|g| g.index == slot.gpu)?;
    match slot.profile_id {
        None => Some(Assignment {
            slot,
            gpu_uuid: g.uuid.clone(),
            instance_id: 0,
            device_uuid: g.uuid.clone(),
            profile: "whole".into(),
            mps_share,
        }),
        Some(pid) => {
            let inst = g
                .instances
                .iter()
                .find(|i| i.profile_id == pid && i.placement.start == slot.start)?;
            Some(Assignment {
                slot,
                gpu_uuid: g.uuid.clone(),
                instance_id: inst.id,
                device_uuid: inst.uuid.clone(),
                profile: g
                    .model
                    .profile(pid)
                    .map_or_else(|| pid.to_string(), |p| p.name.clone()),
                mps_share,
            })
        }
    }
}

/// Maps a store error for a client, logging internals once here.
fn store_error(e: StoreError) -> ServiceError {
    match e {
        StoreError::NotFound(id) => ServiceError::NotFound {
            what: "job",
            id: id.to_string(),
        },
        StoreError::BadTransition { id, from, to } => {
            ServiceError::FailedPrecondition(format!("job {id} is {from}; it cannot become {to}"))
        }
        full if full.is_full() => {
            tracing::error!(error = %full, source = ?std::error::Error::source(&full), "node store: no space left");
            ServiceError::ResourceExhausted(
                "the node's disk is full: nothing was stored; try again once space is freed".into(),
            )
        }
        other => {
            tracing::error!(error = %other, source = ?std::error::Error::source(&other), "node store error");
            ServiceError::Internal("the node store failed; see mmkd's log".into())
        }
    }
}
