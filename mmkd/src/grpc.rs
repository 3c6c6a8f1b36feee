//! tonic adapters: each handler extracts, calls the node, converts. No logic lives here.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use mmk_core::{FieldError, JobState, ServiceError};
use mmk_partitioner::{GpuState, Slot, Step, layout};
use mmk_proto::v1::{
    self, job_service_server::JobService, node_service_server::NodeService,
    partition_service_server::PartitionService,
};
use mmk_proto::{
    class_from_proto, class_to_proto, service_error_to_status, spec_from_proto, spec_to_proto,
    state_from_proto, state_to_proto, timestamp,
};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

mod allocation;
pub mod watches;

pub use allocation::AllocationApi;

use crate::auth::{Access, Caller};
use crate::job::JobRecord;
use crate::ksched::GateView;
use crate::learn::sampler::JobTotals;
use crate::node::{JobEvent, Node, PartitionView, free_memory_mib, free_slices};

pub(crate) fn status(e: ServiceError) -> Status {
    service_error_to_status(e)
}

fn invalid(field: &str, message: &str) -> Status {
    status(ServiceError::InvalidArgument(FieldError::new(
        field, message,
    )))
}

/// The caller: from the Unix socket's peer credentials, or over TCP from the client
/// certificate that TLS verified; UNAUTHENTICATED when there is neither.
fn caller<T>(access: &Access, req: &Request<T>) -> Result<Caller, Status> {
    if let Some(c) = req
        .extensions()
        .get::<tonic::transport::server::UdsConnectInfo>()
        .and_then(|i| i.peer_cred)
    {
        return Ok(access.caller(c.uid(), c.gid()));
    }
    let certs = req
        .extensions()
        .get::<crate::tcp::ConnInfo>()
        .and_then(|c| c.certs.clone())
        .ok_or_else(|| Status::unauthenticated("mmkd cannot tell who is calling"))?;
    let leaf = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    access.caller_from_cert(leaf.as_ref()).map_err(status)
}

/// A reason a caller gives, checked against its limit.
fn reason(field: &str, text: &str) -> Result<(), Status> {
    if text.len() > mmk_core::spec::MAX_REASON_BYTES {
        return Err(invalid(
            field,
            &format!(
                "is {} bytes; at most {}",
                text.len(),
                mmk_core::spec::MAX_REASON_BYTES
            ),
        ));
    }
    Ok(())
}

/// A job as `caller` may see it: in full when they may act on it, else only what is safe
/// (id, name, class, memory, state, times, partition, owner).
pub fn job_view(node: &Node, j: &JobRecord, caller: &Caller) -> v1::Job {
    let mut job = job_to_proto(node, j);
    if caller.may_act_on(j.owner) {
        return job;
    }
    job.spec = job.spec.map(|s| v1::JobSpec {
        name: s.name,
        class: s.class,
        gpu_memory_mib: s.gpu_memory_mib,
        ..v1::JobSpec::default()
    });
    job.reason.clear();
    job.log_dir.clear();
    job.exit_code = None;
    job.ended_by_uid = None;
    job.cpu_seconds = None;
    job.memory_bytes = None;
    job.memory_peak_bytes = None;
    job.planner_profile.clear();
    job.slo = None;
    job.redacted = true;
    job
}

/// The most jobs one ListJobs reply holds, and when no page size is asked for.
const MAX_PAGE: u32 = 1000;
const DEFAULT_PAGE: u32 = 500;
/// A ListJobs reply stops before it grows past this (gRPC's default limit is 4 MiB).
const MAX_PAGE_BYTES: usize = 2 * 1024 * 1024;

/// A job as the API shows it.
pub fn job_to_proto(node: &Node, j: &JobRecord) -> v1::Job {
    let is_command = matches!(j.spec.task, mmk_core::Task::Command(_));
    v1::Job {
        id: j.id,
        spec: Some(spec_to_proto(&j.spec)),
        state: state_to_proto(j.state) as i32,
        reason: j.reason.clone(),
        submitted_at: Some(timestamp(j.submitted_at)),
        started_at: j.started_at.map(timestamp),
        finished_at: j.finished_at.map(timestamp),
        updated_at: Some(timestamp(j.updated_at)),
        assignment: j.assignment.as_ref().map(|a| v1::Assignment {
            gpu_index: a.slot.gpu,
            gpu_uuid: a.gpu_uuid.clone(),
            instance_id: a.instance_id,
            device_uuid: a.device_uuid.clone(),
            profile: a.profile.clone(),
            start_slice: u32::from(a.slot.start),
            mps_share: u32::from(a.mps_share),
        }),
        exit_code: j.exit_code,
        restarts: j.restarts,
        log_dir: if is_command {
            node.runner().log_dir(j.id).display().to_string()
        } else {
            String::new()
        },
        owner_uid: j.owner.map(|o| o.uid),
        owner_gid: j.owner.map(|o| o.gid),
        redacted: false,
        ended_by_uid: j.ended_by,
        planner_profile: node.planner_profile(j),
        slo: node.slo_status(j.id).map(|s| slo_to_proto(&s)),
        ..usage_to_proto(node.runner().usage(j.id))
    }
}

/// What the SLO control sees of a job, as the API shows it.
fn slo_to_proto(s: &crate::slo::JobStatus) -> v1::SloStatus {
    let ms = |ns: u64| ns as f64 / 1e6;
    v1::SloStatus {
        objective: s.objective.clone(),
        target_ms: s.target_ns.map(ms),
        p99_ms: s.p99_ns.map(ms),
        alone_p99_ms: s.alone_p99_ns.map(ms),
        samples: s.samples,
        isolation: s.isolation.as_str().to_owned(),
        why: s.why.clone(),
    }
}

/// A running job's cgroup counters, as a Job's fields.
fn usage_to_proto(usage: Option<crate::cgroup::Usage>) -> v1::Job {
    match usage {
        Some(u) => v1::Job {
            cpu_seconds: Some(u.cpu_usec as f64 / 1e6),
            memory_bytes: u.memory_bytes,
            memory_peak_bytes: u.memory_peak_bytes,
            ..v1::Job::default()
        },
        None => v1::Job::default(),
    }
}

#[derive(Debug, Clone)]
pub struct JobApi {
    pub node: Node,
    pub access: Arc<Access>,
    /// The streams open now, capped per user and in all.
    pub watches: Arc<watches::Watches>,
    /// Becomes true when mmkd shuts down; open watch streams end then.
    pub stopping: watch::Receiver<bool>,
}

type EventStream = Pin<Box<dyn Stream<Item = Result<v1::JobEvent, Status>> + Send>>;

#[tonic::async_trait]
impl JobService for JobApi {
    async fn submit_job(
        &self,
        req: Request<v1::SubmitJobRequest>,
    ) -> Result<Response<v1::SubmitJobResponse>, Status> {
        let caller = caller(&self.access, &req)?;
        let req = req.into_inner();
        let spec = req.spec.ok_or_else(|| invalid("spec", "missing"))?;
        let spec = spec_from_proto(spec).map_err(|e| status(e.into()))?;
        let request_id = (!req.request_id.is_empty()).then_some(req.request_id);
        let job = self
            .node
            .submit(spec, Some(caller.owner()), request_id)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::SubmitJobResponse {
            job: Some(job_view(&self.node, &job, &caller)),
        }))
    }

    async fn get_job(&self, req: Request<v1::GetJobRequest>) -> Result<Response<v1::Job>, Status> {
        let caller = caller(&self.access, &req)?;
        let job = self.node.get(req.into_inner().id).await.map_err(status)?;
        Ok(Response::new(job_view(&self.node, &job, &caller)))
    }

    async fn list_jobs(
        &self,
        req: Request<v1::ListJobsRequest>,
    ) -> Result<Response<v1::ListJobsResponse>, Status> {
        let caller = caller(&self.access, &req)?;
        let req = req.into_inner();
        let states = req
            .states
            .iter()
            .map(|s| {
                state_from_proto(*s).ok_or_else(|| invalid("states", &format!("unknown state {s}")))
            })
            .collect::<Result<Vec<JobState>, Status>>()?;
        let class = match req.class {
            0 => None,
            c => Some(
                class_from_proto(c)
                    .ok_or_else(|| invalid("class", &format!("unknown class {c}")))?,
            ),
        };
        let size = match req.page_size {
            0 => DEFAULT_PAGE,
            n if n > MAX_PAGE => {
                return Err(invalid(
                    "page_size",
                    &format!("{n} is more than {MAX_PAGE}"),
                ));
            }
            n => n,
        };
        let after = match req.page_token.as_str() {
            "" => 0,
            t => t.parse::<u64>().map_err(|_| {
                invalid(
                    "page_token",
                    "is not a token mmkd gave (pass a reply's next_page_token)",
                )
            })?,
        };
        // One more than the page holds tells whether another page follows.
        let jobs = self
            .node
            .list_page(&states, class, after, size + 1)
            .await
            .map_err(status)?;
        let mut reply = v1::ListJobsResponse::default();
        let mut bytes = 0;
        for (i, j) in jobs.iter().enumerate() {
            let view = job_view(&self.node, j, &caller);
            bytes += prost::Message::encoded_len(&view) + 8;
            let full = i as u32 >= size || (bytes > MAX_PAGE_BYTES && !reply.jobs.is_empty());
            if full {
                reply.next_page_token = jobs[i - 1].id.to_string();
                break;
            }
            reply.jobs.push(view);
        }
        Ok(Response::new(reply))
    }

    async fn cancel_job(
        &self,
        req: Request<v1::CancelJobRequest>,
    ) -> Result<Response<v1::Job>, Status> {
        let caller = caller(&self.access, &req)?;
        let req = req.into_inner();
        reason("reason", &req.reason)?;
        let job = self.node.get(req.id).await.map_err(status)?;
        caller.authorize(job.id, job.owner).map_err(status)?;
        let job = self
            .node
            .cancel(req.id, &req.reason, Some(caller.uid))
            .await
            .map_err(status)?;
        Ok(Response::new(job_view(&self.node, &job, &caller)))
    }

    type WatchJobsStream = EventStream;

    async fn watch_jobs(
        &self,
        req: Request<v1::WatchJobsRequest>,
    ) -> Result<Response<Self::WatchJobsStream>, Status> {
        let caller = caller(&self.access, &req)?;
        let place = self.watches.open(caller.uid)?;
        let req = req.into_inner();
        // Subscribed first: an event after this is either in the snapshot read below (its
        // job's latest event then has its sequence number or a later one, and it is
        // skipped) or sent after it.
        let mut events = self.node.subscribe();
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let node = self.node.clone();
        let stopping = until_true(self.stopping.clone());
        tokio::spawn(async move {
            let _place = place;
            tokio::pin!(stopping);
            // Every send also watches for shutdown, so a client that stops reading cannot
            // hold mmkd's shutdown up.
            macro_rules! send {
                ($msg:expr) => {
                    tokio::select! {
                        r = tx.send($msg) => if r.is_err() { return; },
                        () = &mut stopping => return,
                    }
                };
            }
            // The snapshot, a page at a time: a client that reads slowly holds one page,
            // never every job.
            let mut seen: HashMap<u64, u64> = HashMap::new();
            if req.include_current {
                let mut after = if req.job_id == 0 { 0 } else { req.job_id - 1 };
                loop {
                    let limit = if req.job_id == 0 { SNAPSHOT_PAGE } else { 1 };
                    let page = match node.snapshot_page(after, limit).await {
                        Ok(page) => page,
                        Err(e) => {
                            send!(Err(status(e)));
                            return;
                        }
                    };
                    let Some(last) = page.last().map(|(j, _)| j.id) else {
                        break;
                    };
                    after = last;
                    for (j, seq) in page {
                        if req.job_id != 0 && j.id != req.job_id {
                            continue;
                        }
                        seen.insert(j.id, seq);
                        send!(Ok(v1::JobEvent {
                            seq: 0,
                            at: Some(timestamp(j.updated_at)),
                            job: Some(job_view(&node, &j, &caller)),
                        }));
                    }
                    if req.job_id != 0 {
                        break;
                    }
                }
            }
            loop {
                let ev: JobEvent = tokio::select! {
                    () = &mut stopping => return,
                    () = tx.closed() => return,
                    ev = events.recv() => match ev {
                        Ok(ev) => ev,
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            send!(Err(Status::resource_exhausted(format!(
                                "the watch fell {n} events behind; watch again with include_current"
                            ))));
                            return;
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                };
                if req.job_id != 0 && ev.job.id != req.job_id {
                    continue;
                }
                if seen.get(&ev.job.id).is_some_and(|&seq| ev.seq <= seq) {
                    continue; // the snapshot had it
                }
                send!(Ok(v1::JobEvent {
                    seq: ev.seq,
                    at: Some(timestamp(ev.at)),
                    job: Some(job_view(&node, &ev.job, &caller)),
                }));
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Events a watch buffers for a client that reads slowly (each may be a job of a few
/// hundred KiB): beyond them the watch waits, and falls behind the node's event buffer.
/// With [`SNAPSHOT_PAGE`], a watch that is never read holds at most 8 jobs (2 MiB of the
/// largest specs) and the node at most [`watches::TOTAL`] such watches.
const WATCH_BUFFER: usize = 4;
/// Jobs a watch's snapshot reads from the store at a time.
const SNAPSHOT_PAGE: u32 = 4;

/// Resolves once the flag is true (or its sender is gone).
async fn until_true(mut flag: watch::Receiver<bool>) {
    loop {
        let set = *flag.borrow_and_update();
        if set || flag.changed().await.is_err() {
            return;
        }
    }
}

#[derive(Debug, Clone)]
pub struct PartitionApi {
    pub node: Node,
    pub access: Arc<Access>,
}

fn gate_to_proto(v: &GateView) -> v1::KernelGate {
    let path = v.path.display().to_string();
    let us = |ns: u64| ns / 1_000;
    match &v.state {
        Err(_) => v1::KernelGate {
            path,
            error: v.error_text().unwrap_or_default(),
            ..v1::KernelGate::default()
        },
        Ok(s) => v1::KernelGate {
            path,
            error: String::new(),
            policy: s.config.policy.to_string(),
            device_wait: s.config.device_wait,
            hold_budget_pct: Some(s.config.hold_budget_pct),
            launches: s.totals.launches,
            held: s.totals.held,
            held_us: us(s.totals.held_ns),
            forced: s.totals.forced,
            processes: s
                .processes
                .iter()
                .map(|p| v1::GateProcess {
                    pid: p.pid,
                    class: match p.class {
                        Some(mmk_kernel_sched::Class::Online) => v1::JobClass::Online,
                        Some(mmk_kernel_sched::Class::Offline) => v1::JobClass::Offline,
                        None => v1::JobClass::Unspecified,
                    } as i32,
                    in_flight: p.inflight,
                    launches: p.launches,
                    held: p.held,
                    held_us: us(p.held_ns),
                    forced: p.forced,
                    max_held_us: us(p.max_held_ns),
                })
                .collect(),
        },
    }
}

/// A partition as ListPartitions shows it, with `jobs`' jobs in it and what each did in
/// its gate.
fn partition_to_proto(
    p: &PartitionView,
    jobs: &[JobRecord],
    totals: &HashMap<u64, JobTotals>,
) -> v1::Partition {
    let js: Vec<v1::PartitionJob> = p
        .jobs
        .iter()
        .map(|&i| {
            let j = &jobs[i];
            let t = totals.get(&j.id).copied().unwrap_or_default();
            v1::PartitionJob {
                job_id: j.id,
                name: j.spec.name.clone(),
                class: class_to_proto(j.spec.class) as i32,
                state: state_to_proto(j.state) as i32,
                mps_share: j.assignment.as_ref().map_or(0, |a| u32::from(a.mps_share)),
                gpu_memory_mib: j.spec.gpu_memory_mib,
                kernel_us: t.kernel_ns / 1000,
                launches: t.launches,
                held: t.held,
                held_us: t.held_ns / 1000,
                owner_uid: j.owner.map(|o| o.uid),
                beside_offline_us: t.beside_offline_ns / 1000,
            }
        })
        .collect();
    v1::Partition {
        instance_id: p.instance.unwrap_or(0),
        device_uuid: p.device_uuid.clone(),
        profile: p.profile.clone(),
        profile_id: p.profile_id,
        start_slice: u32::from(p.start_slice),
        size_slices: u32::from(p.size_slices),
        memory_mib: p.memory_mib,
        sm_count: p.sm_count,
        used_memory_mib: p.used_memory_mib,
        jobs: js,
        mps: p.mps.as_ref().map(|d| v1::MpsDaemon {
            pid: d.pid.unwrap_or(0),
            pipe_dir: d.pipe_dir.display().to_string(),
            restarts: d.restarts,
            servers: d.servers.clone(),
        }),
        gate: p.gate.as_ref().map(gate_to_proto),
    }
}

/// A profile's name on a GPU, or "whole" for a GPU with MIG off.
fn profile_name(gpus: &[GpuState], slot: Slot) -> String {
    let g = gpus.iter().find(|g| g.index == slot.gpu);
    match slot.profile_id {
        None => "whole".into(),
        Some(id) => g
            .and_then(|g| g.model.profile(id))
            .map_or_else(|| id.to_string(), |p| p.name.clone()),
    }
}

fn step_to_proto(gpus: &[GpuState], s: &Step) -> v1::LayoutStep {
    let (kind, slot, instance) = match s {
        Step::Create { slot } => (v1::layout_step::Kind::Create, *slot, 0),
        Step::Destroy { slot, instance } => (v1::layout_step::Kind::Destroy, *slot, *instance),
    };
    v1::LayoutStep {
        kind: kind as i32,
        gpu_index: slot.gpu,
        profile: profile_name(gpus, slot),
        start_slice: u32::from(slot.start),
        instance_id: instance,
    }
}

#[tonic::async_trait]
impl PartitionService for PartitionApi {
    async fn plan_jobs(
        &self,
        req: Request<v1::PlanJobsRequest>,
    ) -> Result<Response<v1::PlanJobsResponse>, Status> {
        let caller = caller(&self.access, &req)?;
        let req = req.into_inner();
        if req.specs.is_empty() {
            return Err(invalid("specs", "give at least one job"));
        }
        let specs = req
            .specs
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                spec_from_proto(s).map_err(|mut e| {
                    e.field = format!("specs[{i}].{}", e.field);
                    status(e.into())
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let (gpus, plan, ids) = self
            .node
            .dry_run(&specs, caller.owner())
            .await
            .map_err(status)?;
        let steps = plan.steps.iter().map(|s| step_to_proto(&gpus, s)).collect();
        let jobs = specs
            .iter()
            .zip(&ids)
            .map(|(spec, id)| {
                let placed = plan.placements.iter().find(|p| p.job == *id);
                v1::PlannedJob {
                    name: spec.name.clone(),
                    assignment: placed.map(|p| v1::Assignment {
                        gpu_index: p.slot.gpu,
                        gpu_uuid: gpus
                            .iter()
                            .find(|g| g.index == p.slot.gpu)
                            .map(|g| g.uuid.clone())
                            .unwrap_or_default(),
                        instance_id: 0,
                        device_uuid: String::new(),
                        profile: profile_name(&gpus, p.slot),
                        start_slice: u32::from(p.slot.start),
                        mps_share: u32::from(p.mps_share),
                    }),
                    reason: plan
                        .queued
                        .iter()
                        .find(|q| q.job == *id)
                        .map(|q| q.reason.to_string())
                        .unwrap_or_default(),
                }
            })
            .collect();
        Ok(Response::new(v1::PlanJobsResponse {
            steps,
            jobs,
            planner: self.node.planner_name().into(),
            stp: plan.stp,
        }))
    }

    async fn list_partitions(
        &self,
        req: Request<v1::ListPartitionsRequest>,
    ) -> Result<Response<v1::ListPartitionsResponse>, Status> {
        caller(&self.access, &req)?;
        Ok(Response::new(partitions(&self.node).await?))
    }
}

/// The GPUs' partitions now, with their jobs (and what each did in its gate), MPS daemons
/// and gates: ListPartitions's answer.
pub async fn partitions(node: &Node) -> Result<v1::ListPartitionsResponse, Status> {
    let jobs = node.active_jobs().await.map_err(status)?;
    let view = node.partitions(&jobs).await.map_err(status)?;
    let totals = node.job_totals();
    Ok(v1::ListPartitionsResponse {
        gpus: view
            .iter()
            .map(|g| v1::GpuPartitions {
                gpu_index: g.gpu.index,
                gpu_uuid: g.gpu.uuid.clone(),
                model: g.gpu.model.product_name.clone(),
                mig_enabled: g.gpu.mig_enabled,
                memory_slices: u32::from(g.gpu.model.memory_slices),
                partitions: g
                    .partitions
                    .iter()
                    .map(|p| partition_to_proto(p, &jobs, &totals))
                    .collect(),
            })
            .collect(),
    })
}

#[derive(Debug, Clone)]
pub struct NodeApi {
    pub node: Node,
    pub access: Arc<Access>,
}

#[tonic::async_trait]
impl NodeService for NodeApi {
    async fn get_node(
        &self,
        req: Request<v1::GetNodeRequest>,
    ) -> Result<Response<v1::Node>, Status> {
        caller(&self.access, &req)?;
        let gpus = self.node.gpus().await.map_err(status)?;
        let jobs = self.node.active_jobs().await.map_err(status)?;
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        Ok(Response::new(v1::Node {
            hostname,
            backend: self.node.backend_kind().into(),
            version: env!("CARGO_PKG_VERSION").into(),
            planner: self.node.planner_name().into(),
            gpus: gpus.iter().map(|g| gpu_to_proto(g, &jobs)).collect(),
        }))
    }

    async fn list_profiles(
        &self,
        req: Request<v1::ListProfilesRequest>,
    ) -> Result<Response<v1::ListProfilesResponse>, Status> {
        let caller = caller(&self.access, &req)?;
        let profiles = self
            .node
            .learned()
            .all()
            .iter()
            .filter(|p| caller.may_act_on(p.owner_uid.map(|uid| crate::job::Owner { uid, gid: 0 })))
            .map(profile_to_proto)
            .collect();
        Ok(Response::new(v1::ListProfilesResponse { profiles }))
    }
}

fn profile_to_proto(p: &crate::learn::Learned) -> v1::LearnedProfile {
    let o = &p.observed;
    v1::LearnedProfile {
        signature: p.signature.clone(),
        owner_uid: p.owner_uid,
        name: p.name.clone(),
        class: mmk_proto::class_to_proto(p.class) as i32,
        samples: o.samples,
        seconds: o.seconds,
        runs: o.runs,
        sm_mean: o.sm_mean(),
        sm_p95: o.sm_p95(),
        busy: o.busy_frac(),
        kernel_us: o.kernel_us().unwrap_or(0.0),
        launch_interval_us: o.launch_interval_us().unwrap_or(0.0),
        launches: o.launches,
        confident: o.confident(),
        created_at: Some(mmk_proto::timestamp(p.created_at)),
        updated_at: Some(mmk_proto::timestamp(p.updated_at)),
        memory_peak_mib: o.mem_peak_bytes.div_ceil(1024 * 1024),
        dram_bw: o.bw_mean(),
    }
}

fn gpu_to_proto(g: &GpuState, jobs: &[JobRecord]) -> v1::Gpu {
    let existing: Vec<(u32, u8)> = g
        .instances
        .iter()
        .map(|i| (i.profile_id, i.placement.start))
        .collect();
    v1::Gpu {
        index: g.index,
        uuid: g.uuid.clone(),
        model: g.model.product_name.clone(),
        memory_mib: g.model.memory_mib,
        sm_count: g.model.sm_count,
        mig_enabled: g.mig_enabled,
        free_memory_mib: free_memory_mib(g, jobs),
        free_memory_slices: free_slices(g),
        memory_slices: u32::from(g.model.memory_slices),
        profiles: g
            .model
            .profiles
            .iter()
            .map(|p| v1::GpuProfile {
                id: p.id,
                name: p.name.clone(),
                compute_slices: u32::from(p.compute_slices),
                memory_slices: u32::from(p.memory_slices),
                memory_mib: p.memory_mib,
                sm_count: p.sm_count,
                max_count: u32::from(p.max_count),
                starts: p.starts.iter().map(|s| u32::from(*s)).collect(),
                free_starts: if g.mig_enabled {
                    p.starts
                        .iter()
                        .filter(|&&s| {
                            let mut l = existing.clone();
                            l.push((p.id, s));
                            layout::fits(&g.model, &l)
                        })
                        .map(|s| u32::from(*s))
                        .collect()
                } else {
                    Vec::new()
                },
                media_extensions: p.media_extensions,
            })
            .collect(),
    }
}
