//! What callers ask of the node: admission, cancel, queries and dry runs. The gRPC
//! adapters (grpc.rs, allocation.rs, k8s.rs) call these and only convert; who may call
//! what is decided there, from the caller's identity (auth.rs).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use mmk_core::spec::Task;
use mmk_core::units::format_mib;
use mmk_core::{FieldError, JobClass, JobSpec, JobState, ServiceError, ServiceResult, now_ms};
use mmk_partitioner::plan::largest_partition_mib;
use mmk_partitioner::{GpuState, JobDemand, NodeState, Plan};
use tokio::sync::broadcast;
use tracing::{info, instrument, warn};

use super::recent::JobSeries;
use super::reconciler::{demand, waiting_demand};
use super::{Cancel, Node};
use crate::job::{Change, JobRecord, Owner};
use crate::ksched;

/// The longest request id a submit may carry.
pub const MAX_REQUEST_ID: usize = 128;

/// How long `cancel` waits for a stopped job's final state beyond the runner's stop.
const CANCEL_SETTLE: Duration = Duration::from_secs(10);

impl Node {
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
        self.check_room()?;
        if owner.is_none()
            && matches!(spec.task, mmk_core::Task::Command(_))
            && crate::os::running_as_root()
        {
            return Err(ServiceError::PermissionDenied(
                "command jobs must come over mmkd's Unix socket, which tells who submits them; \
                 this connection does not"
                    .into(),
            ));
        }
        let gpus = self.gpus().await?;
        let largest = largest_partition_mib(&NodeState::new(gpus));
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
            .await?;
        let Some(ev) = ev else {
            if job.spec != spec {
                return Err(ServiceError::InvalidArgument(FieldError::new(
                    "request_id",
                    format!(
                        "was first used for job {} with a different spec; a retry must send \
                         the same job, and a new job needs a new request id",
                        job.id
                    ),
                )));
            }
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

    /// Calls `f` with the jobs that ended in the last five minutes, oldest ID first, without
    /// copying them (under a lock that every job's end takes: `f` is quick).
    pub fn with_recently_ended(&self, f: impl FnOnce(&mut dyn Iterator<Item = &JobSeries>)) {
        let mut recent = self
            .inner
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut recent.iter(now_ms()));
    }

    /// One page of every job (ids above `after`), each with the sequence number of its
    /// latest event: a watch's snapshot, read page by page after it subscribed. An event
    /// of a job whose sequence number is at most the one read with it is already in the
    /// snapshot.
    pub async fn snapshot_page(
        &self,
        after: u64,
        limit: u32,
    ) -> ServiceResult<Vec<(JobRecord, u64)>> {
        self.inner
            .store
            .list_jobs_page_with_seq(after, limit)
            .await
            .map_err(ServiceError::from)
    }

    pub async fn get(&self, id: u64) -> ServiceResult<JobRecord> {
        self.inner
            .store
            .get_job(id)
            .await
            .map_err(ServiceError::from)
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
            .map_err(ServiceError::from)
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
            .map_err(ServiceError::from)
    }

    /// Cancels a job. A queued job is cancelled at once; a running one is stopped first
    /// (SIGTERM, then SIGKILL after the grace period) and the call returns once it ended.
    /// Like admission, a cancel runs to its end even when its caller goes away, so that a
    /// job is never left half cancelled.
    pub async fn cancel(&self, id: u64, reason: &str, by: Option<u32>) -> ServiceResult<JobRecord> {
        let node = self.clone();
        let reason = reason.to_owned();
        tokio::spawn(async move { node.cancel_job(id, &reason, by).await })
            .await
            .map_err(|e| ServiceError::Internal(format!("cancel failed: {e}")))?
    }

    async fn cancel_job(&self, id: u64, reason: &str, by: Option<u32>) -> ServiceResult<JobRecord> {
        let reason = if reason.trim().is_empty() {
            "cancelled by user".to_owned()
        } else {
            format!("cancelled: {}", reason.trim())
        };
        self.stop_job(id, reason, by, JobState::Cancelled).await
    }

    /// Stops a running job that mmkd ends itself, and records it FAILED with `reason`.
    pub(super) async fn fail_job(&self, id: u64, reason: String) -> ServiceResult<JobRecord> {
        let node = self.clone();
        tokio::spawn(async move { node.stop_job(id, reason, None, JobState::Failed).await })
            .await
            .map_err(|e| ServiceError::Internal(format!("stopping job {id} failed: {e}")))?
    }

    /// Ends job `id` as `ends_as` with `reason`: at once when it is queued, else once its
    /// run is stopped.
    #[instrument(skip(self, reason))]
    async fn stop_job(
        &self,
        id: u64,
        reason: String,
        by: Option<u32>,
        ends_as: JobState,
    ) -> ServiceResult<JobRecord> {
        let mut events = self.subscribe();
        let stopping = {
            let state = self.inner.state.lock().await;
            let job = self.get(id).await?;
            if job.state.is_terminal() {
                return Err(ServiceError::FailedPrecondition(format!(
                    "job {id} has already ended ({})",
                    job.state
                )));
            }
            if self.cancelling().contains_key(&id) {
                return Err(ServiceError::FailedPrecondition(format!(
                    "job {id} is already being cancelled"
                )));
            }
            if job.state == JobState::Queued {
                let change = Change {
                    ended_by: by,
                    ..Change::default()
                };
                let job = self.transition(id, ends_as, &reason, change).await?;
                self.held().remove(&id);
                return Ok(job);
            }
            if matches!(job.spec.task, Task::Attached(_)) {
                // No process of mmk's to stop: the caller learns it at its next renewal.
                drop(state);
                return self
                    .end_allocation(id, ends_as, &reason, None, by)
                    .await?
                    .ok_or_else(|| {
                        ServiceError::FailedPrecondition(format!("job {id} has already ended"))
                    });
            }
            // Recorded for every active job, under the lock that the reconciler's writes
            // take: STARTING, the launch reads it before it starts the run and records the
            // job CANCELLED instead; RUNNING, the run is stopped, and a run that already
            // ended (its exit on the way, or a move's stop) is not started again. Its exit
            // records CANCELLED, unless the job succeeded first.
            let running = self.inner.runner.is_running(id);
            self.cancelling().insert(
                id,
                Cancel {
                    reason,
                    by,
                    stopped: running,
                    ends_as,
                },
            );
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
        caller: Owner,
    ) -> ServiceResult<(Vec<GpuState>, Plan, Vec<u64>)> {
        let now = self.planning_state().await?;
        let mut demands = now.demands;
        let ids: Vec<u64> = (0..specs.len() as u64)
            .map(|i| now.first_free + i)
            .collect();
        demands.extend(specs.iter().zip(&ids).map(|(s, id)| {
            let mut d = waiting_demand(*id, s, None);
            d.user = Some(super::reconciler::run_uid(&s.task, Some(caller)));
            d
        }));
        let plan = self.plan(now.node.clone(), demands).await?;
        Ok((now.node.gpus, plan, ids))
    }

    /// What a dry run plans from: the active jobs, the GPUs, the jobs as the planner sees
    /// them, and the first ID free for hypothetical jobs (after every stored one).
    pub(super) async fn planning_state(&self) -> ServiceResult<PlanningState> {
        let jobs = self
            .list(
                &[JobState::Queued, JobState::Starting, JobState::Running],
                None,
            )
            .await?;
        let mut node = NodeState::new(self.gpus().await?);
        node.calm_arrivals =
            self.calm_arrivals(jobs.iter().map(|j| j.id).max().unwrap_or(0), false);
        let demands = jobs
            .iter()
            .map(|j| demand(j, &self.inner.learned))
            .collect();
        let first_free = jobs.iter().map(|j| j.id).max().unwrap_or(0) + 1_000_000;
        Ok(PlanningState {
            jobs,
            node,
            demands,
            first_free,
        })
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
                ServiceError::Unavailable(format!(
                    "cannot read the gpus: {}",
                    crate::error::chain(&e)
                ))
            })
    }
}

/// See [`Node::planning_state`].
pub(super) struct PlanningState {
    pub(super) jobs: Vec<JobRecord>,
    pub(super) node: NodeState,
    pub(super) demands: Vec<JobDemand>,
    pub(super) first_free: u64,
}
