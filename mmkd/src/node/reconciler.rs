//! The reconciler: one task that makes the node follow the plan. Each turn it records
//! the exits that came in, then runs a pass: read the jobs and the GPUs, plan (off the
//! runtime), apply the plan's MIG steps (each recorded as intent before it starts and
//! when it ends), move checkpointable jobs, and start placed jobs through the runner.
//! A pass runs after every admission, exit and cancellation, and again after a pause
//! when one fails. Intent (the plan) and observed state (the backend's instances, the
//! runner's processes) stay apart: a pass reads both, then changes one step at a time.

use std::collections::HashMap;
use std::sync::Arc;

use mmk_core::spec::{RestartPolicy, Task};
use mmk_core::{JobClass, JobSpec, JobState, ServiceError, ServiceResult, now_ms};
use mmk_kernel_sched::gate::GateOwner;
use mmk_partitioner::{GpuState, JobDemand, JobProfile, NodeState, Plan, Slot, Step};
use tokio::sync::{Notify, mpsc};
use tracing::{info, instrument, warn};

use super::NodeMetrics;
use super::{Node, RETRY_FIRST, RETRY_MAX};
use crate::job::{Assignment, Change, InstanceRecord, JobRecord, Owner, StepRecord};
use crate::ksched;
use crate::learn::sampler::Watch;
use crate::learn::{self, Learned, Profiles};
use crate::mps;
use crate::runner::{Exit, Launch, Outcome};
use crate::store::StoreError;

mod launch;

impl Node {
    pub(super) async fn run(self, mut exits: mpsc::UnboundedReceiver<Exit>, shutdown: Arc<Notify>) {
        let watcher = self
            .inner
            .mps
            .enabled()
            .then(|| tokio::spawn(self.clone().watch_mps()));
        let allocations = tokio::spawn(self.clone().watch_allocations());
        // A job's end is recorded as it comes, not between passes: a cancel of a running
        // job, which waits for the end, does not wait for a pass over a long queue. Each
        // change a pass makes re-reads its job under the state lock, as with a cancel.
        let recorder = {
            let node = self.clone();
            tokio::spawn(async move {
                while let Some(exit) = exits.recv().await {
                    node.handle_exit(exit).await;
                    node.inner.kick.notify_one();
                }
            })
        };
        loop {
            tokio::select! {
                () = shutdown.notified() => break,
                () = self.inner.kick.notified() => {}
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
        recorder.abort();
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
        // A job that fails next to an MPS fault says so: its client died with the server.
        // Asked before the state lock is taken (an MPS health check may run commands).
        let mut what = exit.outcome.describe();
        if matches!(exit.outcome, Outcome::Exited(_) | Outcome::Signaled(_))
            && !exit.outcome.success()
            && let Ok(job) = self.inner.store.get_job(exit.job).await
            && let Some(a) = &job.assignment
            && let Some(trouble) = self.inner.mps.trouble(a).await
        {
            what = format!("{what}; {trouble}");
        }
        let _state = self.inner.state.lock().await;
        let moving = self.moving().contains(&exit.job);
        if moving {
            // Stopped by a pass for a move or a preemption, which records its end.
            return;
        }
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
        // Left in place until the end is recorded: a retry must still record CANCELLED.
        let cancelled = self.cancelling().get(&exit.job).cloned();
        let change = Change {
            exit_code: exit.outcome.exit_code(),
            ended_by: cancelled.as_ref().and_then(|c| c.by),
            ..Change::default()
        };
        let result = if let Some(c) = cancelled
            .as_ref()
            .filter(|c| c.stopped || !exit.outcome.success())
        {
            self.transition(job.id, c.ends_as, &c.reason, change).await
        } else if exit.outcome.success() {
            // Also a job whose run had succeeded before its cancel came.
            self.transition(
                job.id,
                JobState::Succeeded,
                &exit.outcome.describe(),
                change,
            )
            .await
        } else if let Outcome::NotStarted(why) = &exit.outcome {
            // Starting again would fail the same way: no restart.
            self.transition(job.id, JobState::Failed, why, change).await
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
        if result.is_ok() {
            NodeMetrics::since(&self.inner.metrics.exit_record, exit.ended);
            self.cancelling().remove(&job.id);
            if matches!(job.spec.task, Task::Attached(_)) {
                // An allocation that could not start: nothing to watch any more.
                self.held().remove(&job.id);
            }
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
        match self.pass().await {
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

    /// Reads the jobs and the GPUs, plans, applies the plan's steps, moves and starts jobs.
    /// Holds no lock across its slow calls; each change of a job's state re-reads the job
    /// under the state lock (a cancel may have come in since the read).
    async fn pass(&self) -> ServiceResult<()> {
        let store = &self.inner.store;
        let jobs = store
            .list_jobs(
                &[JobState::Queued, JobState::Starting, JobState::Running],
                None,
            )
            .await?;
        // With nothing queued a pass can still restart a checkpointable job with a larger
        // share, where a job that left made room (the planner's step 4).
        if jobs.iter().all(|j| {
            j.state != JobState::Queued && !(j.spec.checkpoint && j.spec.class == JobClass::Offline)
        }) {
            return Ok(());
        }
        let gpus = self.gpus().await?;
        let leaving = self.leaving_partitions();
        let demands: Vec<JobDemand> = jobs
            .iter()
            .map(|j| {
                let mut d = demand(j, &self.inner.learned);
                // The SLO control asks the checkpointable offline jobs of these partitions
                // to leave them.
                d.leave = d.movable
                    && j.assignment.as_ref().is_some_and(|a| {
                        leaving.contains(&mps::partition_key(&a.slot, a.instance_id))
                    });
                d
            })
            .collect();
        let newest = jobs.iter().map(|j| j.id).max().unwrap_or(0);
        let mut node = NodeState::new(gpus);
        node.calm_arrivals = self.calm_arrivals(newest, true);
        let plan = self.plan(node.clone(), demands).await?;
        if !plan.queued.is_empty() {
            self.inner
                .calm
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .waited();
        }

        let mut by_id: HashMap<u64, JobRecord> = jobs.iter().map(|j| (j.id, j.clone())).collect();
        // Moves and preemptions stop their jobs before the layout changes: a job that moves
        // to a larger instance leaves the one the plan destroys. Moves: the job checkpoints
        // on SIGTERM and stops, goes back to the queue with one more restart, and the
        // launches below start it at its new place.
        for id in &plan.moves {
            let (Some(job), Some(to)) = (
                by_id.get(id).filter(|j| j.state.is_active()),
                plan.placements.iter().find(|p| p.job == *id),
            ) else {
                continue;
            };
            let from = job.assignment.as_ref().map_or(100, |a| a.mps_share);
            let reason = if job.assignment.as_ref().is_some_and(|a| a.slot != to.slot) {
                format!(
                    "moved: to {}, MPS share {from}% -> {}% (checkpoint and restart)",
                    partition_name(&node, to.slot),
                    to.mps_share
                )
            } else {
                format!(
                    "moved: MPS share {from}% -> {}% (checkpoint and restart)",
                    to.mps_share
                )
            };
            let Some(moved) = self.stop_and_requeue(job, &reason).await? else {
                continue;
            };
            by_id.insert(*id, moved);
        }
        // Preemptions: the offline job checkpoints on SIGTERM and stops, and waits in the
        // queue while the online job it made room for runs. An online job whose room was
        // not made (a job did not stop) waits for the next pass.
        let mut no_room = Vec::new();
        for p in &plan.preempted {
            let Some(job) = by_id.get(&p.job).filter(|j| j.state.is_active()) else {
                continue;
            };
            let reason = format!(
                "preempted for online job {} (checkpointed; waits for room)",
                p.for_job
            );
            match self.stop_and_requeue(job, &reason).await? {
                Some(stopped) => {
                    by_id.insert(p.job, stopped);
                }
                None => no_room.push(p.for_job),
            }
        }
        let waiting_gpus = gpus_waiting_for_an_end(&plan, &by_id);
        // A step that fails leaves its partition missing; placements elsewhere go ahead.
        let mut failed: Option<ServiceError> = None;
        for step in &plan.steps {
            let gpu = match step {
                Step::Destroy { slot, .. } | Step::Create { slot } => slot.gpu,
            };
            if waiting_gpus.contains(&gpu) {
                continue;
            }
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

        for p in &plan.placements {
            let Some(job) = by_id.get(&p.job).filter(|j| j.state == JobState::Queued) else {
                continue;
            };
            if no_room.contains(&p.job) {
                self.retry_later();
                continue;
            }
            // Its partition comes with the layout change that waits: so does it.
            if waiting_gpus.contains(&p.slot.gpu) && assignment(&gpus, p.slot, 0).is_none() {
                continue;
            }
            match assignment(&gpus, p.slot, p.mps_share) {
                Some(a) => self.launch(job, a, &gpus).await?,
                None => {
                    let why = match (failed.as_ref(), no_device(&gpus, p.slot)) {
                        (_, Some(instance)) => format!(
                            "waiting: gpu {} instance {instance} has no compute instance, so no MIG device to run on",
                            p.slot.gpu
                        ),
                        (Some(e), None) => format!("waiting: reconfiguration failed ({e})"),
                        (None, None) => "waiting: the planned partition does not exist".to_owned(),
                    };
                    store.set_reason(job.id, &why, now_ms()).await?;
                }
            }
        }
        // Why each queued job waits, written only where it changed, in one transaction:
        // with thousands queued a write per job would hold the pass (and cancels) up.
        let changed: Vec<(u64, String)> = plan
            .queued
            .iter()
            .filter(|q| by_id.get(&q.job).is_none_or(|j| *j.reason != *q.reason))
            .map(|q| (q.job, q.reason.to_string()))
            .collect();
        store.set_reasons(&changed, now_ms()).await?;
        failed.map_or(Ok(()), Err)
    }

    /// Stops a running checkpointable job (SIGTERM: it checkpoints) and puts it back in
    /// the queue with one more restart, counted as a move, with `reason`. `None` when it
    /// stays: its run already ended (its exit is on the way), it is being cancelled, or it
    /// did not stop.
    async fn stop_and_requeue(
        &self,
        job: &JobRecord,
        reason: &str,
    ) -> ServiceResult<Option<JobRecord>> {
        let id = job.id;
        {
            // Marked under the state lock, as a cancel is: the exit its stop causes is
            // this pass's to record from here on.
            let _state = self.inner.state.lock().await;
            let cancelling = self.cancelling().contains_key(&id);
            if cancelling || !self.inner.runner.is_running(id) {
                return Ok(None);
            }
            self.moving().insert(id);
        }
        let stopped = self.inner.runner.stop(id).await;
        let _state = self.inner.state.lock().await;
        self.moving().remove(&id);
        // A run that ended just after the stop gave up waiting ended all the same (and
        // its exit may have come while the job was still marked).
        let stopped = stopped || !self.inner.runner.is_running(id);
        if !stopped {
            warn!(
                job = id,
                "a job to stop for a move or an online job did not stop; it stays where it is"
            );
            return Ok(None);
        }
        // Its run ended (by the stop, or by itself just before): the job as it is now.
        let now = self.get(id).await?;
        if !now.state.is_active() || now.restarts != job.restarts {
            return Ok(None);
        }
        self.release(job);
        let cancelled = self.cancelling().get(&id).cloned();
        if let Some(c) = cancelled {
            // Cancelled while it stopped: recorded here, the exit having been this pass's.
            let change = Change {
                ended_by: c.by,
                ..Change::default()
            };
            self.transition(id, c.ends_as, &c.reason, change).await?;
            self.cancelling().remove(&id);
            return Ok(None);
        }
        let change = Change {
            moved: true,
            ..Change::default()
        };
        Ok(Some(
            self.transition(id, JobState::Queued, reason, change)
                .await?,
        ))
    }

    /// The jobs a pass is stopping for a move or a preemption.
    fn moving(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<u64>> {
        self.inner.moving.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Jobs submitted since a pass last left one waiting (or since this daemon's first
    /// pass), `newest` being the newest active job's ID now (`NodeState::calm_arrivals`).
    /// `first`: a pass, which starts the count if none has.
    pub(super) fn calm_arrivals(&self, newest: u64, first: bool) -> u64 {
        self.inner
            .calm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .arrivals(newest, first)
    }

    /// Runs the planner off the async runtime: with thousands of jobs a plan takes long
    /// enough to hold up every request served on the runtime's threads.
    pub(super) async fn plan(
        &self,
        node: NodeState,
        demands: Vec<JobDemand>,
    ) -> ServiceResult<Plan> {
        let planner = Arc::clone(&self.inner.planner);
        let started = std::time::Instant::now();
        let plan = tokio::task::spawn_blocking(move || planner.plan(&node, &demands)).await;
        NodeMetrics::since(&self.inner.metrics.planning, started);
        plan.map_err(|e| {
            warn!(error = %e, "the planner failed");
            ServiceError::Internal("the planner failed; see mmkd's log".into())
        })
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
        let id = self.inner.store.begin_step(&record, now_ms()).await?;
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
                let started = std::time::Instant::now();
                let destroyed = tokio::task::spawn_blocking(move || {
                    backend.destroy_instance(slot.gpu, instance)
                })
                .await;
                NodeMetrics::since(&self.inner.metrics.reconfiguration, started);
                destroyed.map_err(|e| ServiceError::Internal(e.to_string()))??;
                store
                    .finish_destroy(step_id, &gpu_uuid, slot.start, now_ms())
                    .await?;
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
                let started = std::time::Instant::now();
                let created = tokio::task::spawn_blocking(move || {
                    backend.create_instance(slot.gpu, profile, slot.start)
                })
                .await;
                NodeMetrics::since(&self.inner.metrics.reconfiguration, started);
                let inst = created.map_err(|e| ServiceError::Internal(e.to_string()))??;
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
                    .await?;
            }
        }
        Ok(())
    }
}

/// A job as the planner sees it: its place and share when it runs, its SLO, and the
/// profile it is planned on (see [`waiting_demand`]).
pub(super) fn demand(j: &JobRecord, learned: &Profiles) -> JobDemand {
    let active = j.state.is_active();
    let mut d = waiting_demand(j.id, &j.spec, learned.for_job(j.owner, &j.spec).as_ref());
    d.user = Some(run_uid(&j.spec.task, j.owner));
    // Milliseconds since submission; a clock set back counts as none.
    d.age_s = mmk_core::now_ms().saturating_sub(j.submitted_at).max(0) as f64 / 1000.0;
    if let Some(a) = j.assignment.as_ref().filter(|_| active) {
        d.placed = Some(a.slot);
        d.mps_share = a.mps_share;
    }
    d
}

/// The Table III workload a job names for the planner, if any.
fn named_workload(spec: &JobSpec) -> Option<&'static mmk_core::workload::Workload> {
    let name = match &spec.task {
        Task::Workload(w) => Some(w.name.as_str()),
        Task::Command(c) => c.profile.as_deref(),
        Task::Attached(a) => a.profile.as_deref(),
    };
    name.and_then(mmk_core::workload::find)
}

/// What the planner assumes of a job without a confident learned profile: `named W` (a
/// Table III workload its spec names), `exclusive` or `prior` (see [`waiting_demand`]).
pub fn planner_profile(spec: &JobSpec) -> String {
    match named_workload(spec) {
        Some(w) => format!("named {}", w.name),
        None if spec.exclusive => "exclusive".into(),
        None => "prior".into(),
    }
}

/// The GPUs whose layout change waits: a job that was to stop for a move or a preemption
/// and has not still holds an instance the plan destroys.
fn gpus_waiting_for_an_end(plan: &Plan, by_id: &HashMap<u64, JobRecord>) -> Vec<u32> {
    // A job that was to stop for a move or a preemption and has not (its run is ending
    // by itself, or it is being cancelled) still holds its instance: the layout of its
    // GPU waits, with the placements there, for the pass its end starts.
    let held = |gpu: u32, instance: u32| {
        by_id.values().any(|j| {
            matches!(j.state, JobState::Starting | JobState::Running)
                && j.assignment
                    .as_ref()
                    .is_some_and(|a| a.slot.gpu == gpu && a.instance_id == instance)
        })
    };
    let waiting_gpus: Vec<u32> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Destroy { slot, instance } if held(slot.gpu, *instance) => Some(slot.gpu),
            _ => None,
        })
        .collect();
    if !waiting_gpus.is_empty() {
        info!(
            gpus = ?waiting_gpus,
            "a job that was to stop still holds its instance: the layout change waits for its end"
        );
    }
    waiting_gpus
}

/// A job that waits, as the planner sees it: planned on its learned profile once that is
/// confident, else on the workload its spec names, else on its class's prior; an
/// exclusive job fills its partition.
pub(super) fn waiting_demand(id: u64, spec: &JobSpec, learned: Option<&Learned>) -> JobDemand {
    let profile = learned
        .map(|l| l.job_profile(spec.class))
        .or_else(|| named_workload(spec).map(|wl| JobProfile::of_workload(wl, spec.class)));
    JobDemand {
        id,
        class: spec.class,
        memory_mib: spec.gpu_memory_mib,
        priority: spec.priority,
        placed: None,
        mps_share: 100,
        slo_ms: spec.slo_ms,
        slo_slowdown: spec.slo_slowdown_pct.map(|pct| f64::from(pct) / 100.0),
        profile: profile.unwrap_or_else(|| {
            if spec.exclusive {
                JobProfile::exclusive(spec.class)
            } else {
                JobProfile::prior(spec.class)
            }
        }),
        movable: spec.checkpoint && spec.class == JobClass::Offline,
        exclusive: spec.exclusive,
        user: None,
        leave: false,
        age_s: 0.0,
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
/// The instance at `slot` when it exists but has no MIG device (a GPU instance without a
/// compute instance): a job placed there would see no GPU.
fn no_device(gpus: &[GpuState], slot: Slot) -> Option<u32> {
    let g = gpus.iter().find(|g| g.index == slot.gpu)?;
    let pid = slot.profile_id?;
    g.instances
        .iter()
        .find(|i| i.profile_id == pid && i.placement.start == slot.start && i.uuid.is_empty())
        .map(|i| i.id)
}

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
                .find(|i| i.profile_id == pid && i.placement.start == slot.start)
                .filter(|i| !i.uuid.is_empty())?;
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

/// A partition as a user reads it: `gpu 0 7g.80gb`, or `gpu 0 whole GPU` with MIG off.
fn partition_name(node: &NodeState, slot: Slot) -> String {
    let profile = node
        .gpus
        .iter()
        .find(|g| g.index == slot.gpu)
        .and_then(|g| slot.profile_id.and_then(|id| g.model.profile(id)))
        .map_or_else(|| "whole GPU".to_owned(), |p| p.name.clone());
    format!("gpu {} {profile}", slot.gpu)
}

/// The user a job's processes run as: the caller's own for an allocation; a managed job's
/// owner when mmkd is root (it switches to them); `None`: mmkd's own user.
fn runs_as(job: &JobRecord) -> Option<Owner> {
    user_running(&job.spec.task, job.owner)
}

fn user_running(task: &Task, owner: Option<Owner>) -> Option<Owner> {
    match (task, owner) {
        (Task::Attached(_), Some(o)) => Some(o),
        (_, Some(o)) if crate::os::running_as_root() => Some(o),
        _ => None,
    }
}

/// The uid a job of `owner` with this task runs as (see [`runs_as`]): the user the planner
/// keeps its partition for.
pub(super) fn run_uid(task: &Task, owner: Option<Owner>) -> u32 {
    user_running(task, owner).map_or_else(crate::os::euid, |o| o.uid)
}
