//! Attached allocations: mmk reserves a partition and a share, and the caller (`mmkctl
//! run`, a Slurm step, the Kubernetes device plugin) starts the process itself with the
//! environment mmk returns.
//!
//! An allocation is a job whose task is `attached`: it is admitted, planned, placed and
//! recorded like any other, so `mmkctl jobs` and `partitions show` list it and the planner
//! counts it. What differs is its end. mmk runs no process for it; instead it watches
//!
//! - the caller's process (`attached.pid`), checked with its start time so that a reused
//!   pid is not taken for it, and
//! - the lease (`attached.lease`), which the caller renews,
//!
//! and ends the allocation when the process ends (SUCCEEDED, "released: the watched
//! process N ended"), when the lease runs out (FAILED, "lease expired: ..."), or when the
//! caller releases it (SUCCEEDED, or FAILED with the exit code of its process when that is
//! not 0). An allocation that ends this way before it was placed is CANCELLED with the
//! same reason. A cancelled allocation is CANCELLED; a caller with a lease learns it at
//! its next renewal, one with only a pid is not told.
//!
//! The watch state lives in memory. After an mmkd restart a waiting allocation gets a
//! fresh lease, and its pid is looked up again by number (the start time it had is not
//! stored); one that was running has lost its MPS daemon, which the restart stops, and is
//! FAILED with that reason (see `Node::recover`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mmk_core::spec::AttachedSpec;
use mmk_core::{FieldError, JobSpec, JobState, ServiceError, ServiceResult, Task, now_ms};
use mmk_partitioner::plan::largest_partition_mib;
use mmk_partitioner::{JobDemand, Step};
use tokio::sync::broadcast;
use tracing::{info, warn};

use super::Node;
use super::reconciler::waiting_demand;
use crate::job::{Change, JobRecord, Owner};
use crate::runner::{Launch, mmk_env};

/// How often the watched processes and the leases are checked.
const CHECK_EVERY: Duration = Duration::from_millis(200);

/// A process, told apart from a later one that reuses its pid by its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Watched {
    pid: u32,
    /// Field 22 of /proc/PID/stat: clock ticks after boot.
    start: u64,
}

impl Watched {
    fn find(pid: u32) -> Option<Watched> {
        proc_start(pid).map(|start| Watched { pid, start })
    }

    fn alive(&self) -> bool {
        proc_start(self.pid) == Some(self.start)
    }
}

/// The start time of a live (not zombie) process.
fn proc_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses: state (field 3), ..., starttime (field 22).
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// What mmk keeps about an active allocation.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pid: Option<Watched>,
    lease: Option<Duration>,
    deadline: Option<Instant>,
    /// Set once it is placed.
    env: BTreeMap<String, String>,
    mounts: Vec<Mount>,
}

impl Held {
    fn new(a: &AttachedSpec) -> Result<Held, FieldError> {
        let pid = match a.pid {
            Some(pid) => Some(Watched::find(pid).ok_or_else(|| {
                FieldError::new(
                    "attached.pid",
                    format!("no process {pid} runs on this node (as mmkd sees it)"),
                )
            })?),
            None => None,
        };
        let lease = a.lease_ms.map(Duration::from_millis);
        Ok(Held {
            pid,
            lease,
            deadline: lease.map(|l| Instant::now() + l),
            env: BTreeMap::new(),
            mounts: Vec::new(),
        })
    }

    /// The watch of a stored allocation, with a fresh lease; its pid is looked up by
    /// number (one that is gone ends it at the first check).
    fn rewatched(a: Option<&AttachedSpec>) -> Held {
        let lease = a.and_then(|a| a.lease_ms).map(Duration::from_millis);
        Held {
            pid: a
                .and_then(|a| a.pid)
                .map(|pid| Watched::find(pid).unwrap_or(Watched { pid, start: 0 })),
            lease,
            deadline: lease.map(|l| Instant::now() + l),
            env: BTreeMap::new(),
            mounts: Vec::new(),
        }
    }

    /// Why the allocation must end now, if it must.
    fn expired(&self, now: Instant) -> Option<(JobState, String)> {
        if let Some(w) = self.pid
            && !w.alive()
        {
            return Some((
                JobState::Succeeded,
                format!("released: the watched process {} ended", w.pid),
            ));
        }
        match (self.deadline, self.lease) {
            (Some(d), Some(l)) if now >= d => Some((
                JobState::Failed,
                format!(
                    "lease expired: not renewed for {}",
                    humantime::format_duration(l)
                ),
            )),
            _ => None,
        }
    }
}

/// A host path the allocation's process must see at the same path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub path: PathBuf,
    pub read_only: bool,
}

/// An allocation as the API shows it.
#[derive(Debug, Clone)]
pub struct AllocationView {
    pub job: JobRecord,
    /// Empty until it runs.
    pub env: BTreeMap<String, String>,
    pub mounts: Vec<Mount>,
    /// Unix ms; `None` without a lease or once it ended.
    pub lease_expires_at: Option<i64>,
}

/// Fit's answer: where the job would go and what it would cost the jobs already there.
#[derive(Debug, Clone)]
pub struct Fit {
    pub verdict: Verdict,
    /// Where the planner puts it (for `Now`, a partition that exists).
    pub placement: Option<mmk_partitioner::JobPlacement>,
    pub reason: String,
    pub steps: Vec<Step>,
    pub moves: Vec<u64>,
    pub predicted_perf: Option<f64>,
    pub stp_before: Option<f64>,
    pub stp_after: Option<f64>,
    /// (job, perf before, perf after) of each placed job that loses performance.
    pub costs: Vec<(u64, f64, f64)>,
    /// The GPUs as planned on.
    pub gpus: Vec<mmk_partitioner::GpuState>,
}

impl Fit {
    /// The predicted performance the placed jobs lose in all.
    pub fn cost(&self) -> Option<f64> {
        // A fold from +0.0: an empty f64 sum is -0.0, which prints as "-0.000".
        self.stp_before
            .map(|_| self.costs.iter().fold(0.0, |sum, (_, b, a)| sum + (b - a)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Now,
    AfterReconfiguration,
    Wait,
    Never,
}

/// The node's capacity, as WatchCapacity streams it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    pub gpus: Vec<GpuCapacity>,
    pub online_units: u32,
    pub offline_units: u32,
    pub unit_mib: u64,
    pub queued_jobs: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuCapacity {
    pub index: u32,
    pub uuid: String,
    pub memory_mib: u64,
    pub free_memory_mib: u64,
    pub free_memory_slices: u32,
    pub online_jobs: u32,
    pub offline_jobs: u32,
}

/// The most units Capacity counts per class: a bound on the dry run's size.
const MAX_UNITS: u32 = 64;

fn attached(job: &JobRecord) -> Option<&AttachedSpec> {
    match &job.spec.task {
        Task::Attached(a) => Some(a),
        _ => None,
    }
}

fn not_an_allocation(id: u64) -> ServiceError {
    ServiceError::FailedPrecondition(format!(
        "job {id} is not an attached allocation (cancel a managed job instead)"
    ))
}

fn ended(job: &JobRecord) -> ServiceError {
    ServiceError::FailedPrecondition(format!(
        "allocation {} has ended: {} ({})",
        job.id, job.state, job.reason
    ))
}

impl Node {
    /// Checks an attached spec's process before it is stored: `Held` for the watch.
    pub(super) fn hold(spec: &JobSpec) -> ServiceResult<Option<Held>> {
        match &spec.task {
            Task::Attached(a) => Ok(Some(Held::new(a)?)),
            _ => Ok(None),
        }
    }

    pub(super) fn register(&self, id: u64, held: Held) {
        self.held().insert(id, held);
    }

    pub(super) fn held(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Held>> {
        self.inner
            .attached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// After a restart: a waiting allocation is watched again, with a fresh lease. One
    /// whose process is gone ends at the first check.
    pub(super) fn rewatch(&self, job: &JobRecord) {
        if let Some(a) = attached(job) {
            self.register(job.id, Held::rewatched(Some(a)));
        }
    }

    /// Admits an attached allocation and waits up to `wait` for its placement.
    pub async fn allocate(
        &self,
        spec: JobSpec,
        owner: Option<Owner>,
        request_id: Option<String>,
        wait: Duration,
    ) -> ServiceResult<AllocationView> {
        if !matches!(spec.task, Task::Attached(_)) {
            return Err(ServiceError::InvalidArgument(FieldError::new(
                "attached",
                "an allocation's task is attached (give a pid, a lease or both)",
            )));
        }
        let job = self.submit(spec, owner, request_id).await?;
        self.allocation(job.id, wait).await
    }

    /// The allocation `id`, after waiting up to `wait` while it is QUEUED or STARTING.
    pub async fn allocation(&self, id: u64, wait: Duration) -> ServiceResult<AllocationView> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut events = self.subscribe();
        loop {
            let job = self.get(id).await?;
            if attached(&job).is_none() {
                return Err(not_an_allocation(id));
            }
            let settled = !matches!(job.state, JobState::Queued | JobState::Starting);
            if settled || tokio::time::Instant::now() >= deadline {
                return Ok(self.view(job));
            }
            // Any event for this job, or a lagged channel, reads the job again.
            let _ = tokio::time::timeout_at(deadline, async {
                loop {
                    match events.recv().await {
                        Ok(ev) if ev.job.id != id => continue,
                        Err(broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await;
                        }
                        _ => return,
                    }
                }
            })
            .await;
        }
    }

    fn view(&self, job: JobRecord) -> AllocationView {
        let held = self.held().get(&job.id).cloned();
        let (env, mounts, lease_expires_at) = match held.filter(|_| !job.state.is_terminal()) {
            Some(h) => {
                let left = h.deadline.map(|d| {
                    let ms = d.saturating_duration_since(Instant::now()).as_millis();
                    now_ms().saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))
                });
                let placed = job.state == JobState::Running;
                (
                    if placed { h.env } else { BTreeMap::new() },
                    if placed { h.mounts } else { Vec::new() },
                    left,
                )
            }
            None => (BTreeMap::new(), Vec::new(), None),
        };
        AllocationView {
            job,
            env,
            mounts,
            lease_expires_at,
        }
    }

    /// Renews the lease of an active allocation.
    pub async fn renew(&self, id: u64) -> ServiceResult<AllocationView> {
        let job = self.get(id).await?;
        if attached(&job).is_none() {
            return Err(not_an_allocation(id));
        }
        {
            let mut held = self.held();
            match held.get_mut(&id) {
                Some(h) if !job.state.is_terminal() => {
                    h.deadline = h.lease.map(|l| Instant::now() + l);
                }
                _ => return Err(ended(&job)),
            }
        }
        Ok(self.view(job))
    }

    /// Ends an allocation at its caller's word: SUCCEEDED, or FAILED when the process
    /// exited with another code than 0; CANCELLED when it had not been placed.
    pub async fn release_allocation(
        &self,
        id: u64,
        exit_code: Option<i32>,
        reason: &str,
        by: Option<u32>,
    ) -> ServiceResult<JobRecord> {
        let job = self.get(id).await?;
        if attached(&job).is_none() {
            return Err(not_an_allocation(id));
        }
        let why = reason.trim();
        let (state, what) = match (exit_code, why.is_empty()) {
            (Some(0) | None, true) => (JobState::Succeeded, "released".to_owned()),
            (Some(0) | None, false) => (JobState::Succeeded, format!("released: {why}")),
            (Some(c), true) => (JobState::Failed, format!("released: exited with code {c}")),
            (Some(c), false) => (
                JobState::Failed,
                format!("released: exited with code {c} ({why})"),
            ),
        };
        self.end_allocation(id, state, &what, exit_code, by)
            .await?
            .ok_or_else(|| ended(&job))
    }

    /// Ends an active allocation: `state` if it was placed, CANCELLED if it waited.
    /// `None` when it had already ended.
    pub(super) async fn end_allocation(
        &self,
        id: u64,
        state: JobState,
        reason: &str,
        exit_code: Option<i32>,
        by: Option<u32>,
    ) -> ServiceResult<Option<JobRecord>> {
        let pass = self.inner.state.lock().await;
        self.end_locked(pass, id, state, reason, exit_code, by)
            .await
    }

    /// Ends an allocation the watch found expired, unless a renewal came in since.
    async fn end_expired(
        &self,
        id: u64,
        state: JobState,
        reason: &str,
    ) -> ServiceResult<Option<JobRecord>> {
        let pass = self.inner.state.lock().await;
        let still = self
            .held()
            .get(&id)
            .is_some_and(|h| h.expired(Instant::now()).is_some());
        if !still {
            return Ok(None);
        }
        self.end_locked(pass, id, state, reason, None, None).await
    }

    async fn end_locked(
        &self,
        _pass: tokio::sync::MutexGuard<'_, ()>,
        id: u64,
        state: JobState,
        reason: &str,
        exit_code: Option<i32>,
        by: Option<u32>,
    ) -> ServiceResult<Option<JobRecord>> {
        let job = self.get(id).await?;
        if job.state.is_terminal() {
            self.held().remove(&id);
            return Ok(None);
        }
        let to = if job.state == JobState::Queued {
            JobState::Cancelled
        } else {
            // Only a RUNNING allocation took its instance (`started`); a STARTING one is
            // still being made ready.
            if job.state == JobState::Running {
                self.release(&job);
            }
            state
        };
        let change = Change {
            exit_code,
            ended_by: by,
            ..Change::default()
        };
        let job = self.transition(id, to, reason, change).await?;
        self.held().remove(&id);
        info!(job = id, state = %to, reason, "allocation ended");
        self.inner.kick.notify_one();
        Ok(Some(job))
    }

    /// Places an allocation: its environment and mounts are ready for its caller.
    pub(super) async fn attach(&self, job: &JobRecord, launch: &Launch) -> ServiceResult<()> {
        let mut mounts = Vec::new();
        if let Some(pipe) = &launch.mps_pipe {
            mounts.push(Mount {
                path: pipe.clone(),
                read_only: false,
            });
        }
        if let Some(k) = &launch.ksched {
            mounts.push(Mount {
                path: k.interposer.clone(),
                read_only: true,
            });
            mounts.push(Mount {
                path: k.gate.clone(),
                read_only: false,
            });
        }
        let env = mmk_env(launch);
        let pid = {
            let mut held = self.held();
            // Its watch is gone only if a cancel's record failed: watch it again, so that
            // its lease or process ends it.
            let h = held
                .entry(job.id)
                .or_insert_with(|| Held::rewatched(attached(job)));
            h.env = env;
            h.mounts = mounts;
            h.pid.map(|w| w.pid)
        };
        self.started(job, &launch.assignment, pid, "allocated")
            .await
    }

    /// Ends the allocations whose process ended or whose lease ran out; runs until mmkd
    /// stops.
    pub(super) async fn watch_allocations(self) {
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = Instant::now();
            let due: Vec<(u64, JobState, String)> = self
                .held()
                .iter()
                .filter_map(|(id, h)| h.expired(now).map(|(s, why)| (*id, s, why)))
                .collect();
            for (id, state, why) in due {
                if let Err(e) = self.end_expired(id, state, &why).await {
                    warn!(job = id, error = %e, "cannot end an allocation; trying again");
                }
            }
        }
    }

    /// Whether `spec` fits on this node, and what it would cost the jobs already there:
    /// two dry runs of the planner, without and with it.
    pub async fn fit(&self, spec: &JobSpec, caller: Owner) -> ServiceResult<Fit> {
        spec.validate()?;
        let super::service::PlanningState {
            jobs,
            node,
            demands,
            first_free: id,
        } = self.planning_state().await?;
        let mut with = demands.clone();
        let mut newcomer = waiting_demand(id, spec, None);
        newcomer.user = Some(super::reconciler::run_uid(&spec.task, Some(caller)));
        with.push(newcomer);
        let before = self.plan(node.clone(), demands).await?;
        let after = self.plan(node.clone(), with).await?;
        let placement = after.placements.iter().find(|p| p.job == id).copied();
        let largest = largest_partition_mib(&node);
        let exists = |slot: mmk_partitioner::Slot| {
            node.gpus.iter().any(|g| {
                g.index == slot.gpu
                    && match slot.profile_id {
                        None => !g.mig_enabled,
                        Some(pid) => g
                            .instances
                            .iter()
                            .any(|i| i.profile_id == pid && i.placement.start == slot.start),
                    }
            })
        };
        let moves: Vec<u64> = after
            .moves
            .iter()
            .filter(|m| !before.moves.contains(m))
            .copied()
            .collect();
        let (verdict, reason) = match placement {
            _ if spec.gpu_memory_mib > largest => (
                Verdict::Never,
                format!(
                    "needs {} of GPU memory; the largest partition this node can make has {}",
                    mmk_core::units::format_mib(spec.gpu_memory_mib),
                    mmk_core::units::format_mib(largest)
                ),
            ),
            Some(p) if exists(p.slot) && moves.is_empty() => (Verdict::Now, String::new()),
            Some(_) => (Verdict::AfterReconfiguration, String::new()),
            None => (
                Verdict::Wait,
                after
                    .queued
                    .iter()
                    .find(|q| q.job == id)
                    .map(|q| q.reason.to_string())
                    .unwrap_or_default(),
            ),
        };
        let placed: Vec<u64> = jobs
            .iter()
            .filter(|j| j.assignment.is_some() && j.state.is_active())
            .map(|j| j.id)
            .collect();
        let perf = |plan: &mmk_partitioner::Plan, job: u64| {
            plan.perf.iter().find(|(j, _)| *j == job).map(|(_, p)| *p)
        };
        let costs = placed
            .iter()
            .filter_map(|&j| Some((j, perf(&before, j)?, perf(&after, j)?)))
            .filter(|(_, b, a)| a < b)
            .collect();
        let predicted_perf = perf(&after, id);
        Ok(Fit {
            verdict,
            placement,
            reason,
            steps: if placement.is_some() {
                after.steps
            } else {
                Vec::new()
            },
            moves,
            predicted_perf,
            stp_before: before.stp,
            stp_after: after.stp,
            costs,
            gpus: node.gpus,
        })
    }

    /// The node's capacity now: memory and jobs per GPU, and how many allocations of
    /// `unit_mib` of each class the planner would start next to the jobs the node has.
    pub async fn capacity(&self, unit_mib: u64) -> ServiceResult<Capacity> {
        let super::service::PlanningState {
            jobs,
            node,
            demands,
            first_free: first,
        } = self.planning_state().await?;
        let total_mib: u64 = node.gpus.iter().map(|g| g.model.memory_mib).sum();
        let most = u32::try_from(total_mib / unit_mib.max(1))
            .unwrap_or(u32::MAX)
            .min(MAX_UNITS);
        // Two plans with up to MAX_UNITS extra jobs each: off the runtime, as every plan.
        let planner = std::sync::Arc::clone(&self.inner.planner);
        let planned = node.clone();
        let units = move |class: mmk_core::JobClass| -> u32 {
            let mut with = demands.clone();
            let ids: Vec<u64> = (0..u64::from(most)).map(|i| first + i).collect();
            with.extend(
                ids.iter()
                    .map(|&id| JobDemand::waiting(id, class, unit_mib)),
            );
            let plan = planner.plan(&planned, &with);
            let placed = plan
                .placements
                .iter()
                .filter(|p| ids.contains(&p.job))
                .count();
            u32::try_from(placed).unwrap_or(u32::MAX)
        };
        let (online_units, offline_units) = tokio::task::spawn_blocking(move || {
            (
                units(mmk_core::JobClass::Online),
                units(mmk_core::JobClass::Offline),
            )
        })
        .await
        .map_err(|e| ServiceError::Internal(format!("the planner failed: {e}")))?;
        let queued = jobs.iter().filter(|j| j.state == JobState::Queued).count();
        // As GetNode counts them: the jobs that hold their partition now.
        let active: Vec<JobRecord> = jobs
            .iter()
            .filter(|j| matches!(j.state, JobState::Starting | JobState::Running))
            .cloned()
            .collect();
        let gpus = node
            .gpus
            .iter()
            .map(|g| {
                let here: Vec<&JobRecord> = jobs
                    .iter()
                    .filter(|j| {
                        j.state.is_active()
                            && j.assignment.as_ref().is_some_and(|a| a.slot.gpu == g.index)
                    })
                    .collect();
                let count = |c| u32::try_from(here.iter().filter(|j| j.spec.class == c).count());
                GpuCapacity {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    memory_mib: g.model.memory_mib,
                    free_memory_mib: super::free_memory_mib(g, &active),
                    free_memory_slices: super::free_slices(g),
                    online_jobs: count(mmk_core::JobClass::Online).unwrap_or(u32::MAX),
                    offline_jobs: count(mmk_core::JobClass::Offline).unwrap_or(u32::MAX),
                }
            })
            .collect();
        Ok(Capacity {
            gpus,
            online_units,
            offline_units,
            unit_mib,
            queued_jobs: u32::try_from(queued).unwrap_or(u32::MAX),
        })
    }
}
