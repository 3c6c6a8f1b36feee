//! AllocationService: Fit, attached allocations and the capacity stream, for cluster
//! schedulers. The logic is in `node::attached`.

use std::pin::Pin;
use std::time::Duration;

use mmk_proto::v1::{self, allocation_service_server::AllocationService};
use mmk_proto::{spec_from_proto, timestamp};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{caller, invalid, job_view, profile_name, reason, status, until_true};
use crate::auth::{Access, Caller};
use crate::node::{AllocationView, Capacity, Node, Verdict};

/// The longest a call waits for a placement.
const MAX_WAIT: Duration = Duration::from_secs(300);
/// How long WatchCapacity lets job events settle before it reads the capacity again.
const SETTLE: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
pub struct AllocationApi {
    pub node: Node,
    pub access: std::sync::Arc<Access>,
    /// The streams open now, capped per user and in all (shared with the job service).
    pub watches: std::sync::Arc<super::watches::Watches>,
    pub unit_mib: u64,
    /// Becomes true when mmkd shuts down; open capacity streams end then.
    pub stopping: watch::Receiver<bool>,
}

fn wait(ms: u64) -> Duration {
    Duration::from_millis(ms).min(MAX_WAIT)
}

pub fn allocation_to_proto(node: &Node, a: &AllocationView, caller: &Caller) -> v1::Allocation {
    v1::Allocation {
        job: Some(job_view(node, &a.job, caller)),
        env: a.env.clone().into_iter().collect(),
        mounts: a
            .mounts
            .iter()
            .map(|m| v1::Mount {
                host_path: m.path.display().to_string(),
                container_path: m.path.display().to_string(),
                read_only: m.read_only,
            })
            .collect(),
        lease_expires_at: a.lease_expires_at.map(timestamp),
    }
}

pub fn capacity_to_proto(c: &Capacity) -> v1::Capacity {
    v1::Capacity {
        at: Some(timestamp(mmk_core::now_ms())),
        gpus: c
            .gpus
            .iter()
            .map(|g| v1::GpuCapacity {
                index: g.index,
                uuid: g.uuid.clone(),
                memory_mib: g.memory_mib,
                free_memory_mib: g.free_memory_mib,
                free_memory_slices: g.free_memory_slices,
                online_jobs: g.online_jobs,
                offline_jobs: g.offline_jobs,
            })
            .collect(),
        online_units: c.online_units,
        offline_units: c.offline_units,
        unit_mib: c.unit_mib,
        queued_jobs: c.queued_jobs,
    }
}

fn spec(s: Option<v1::JobSpec>) -> Result<mmk_core::JobSpec, Status> {
    let s = s.ok_or_else(|| invalid("spec", "missing"))?;
    // Field names as SubmitJob gives them (`gpu_memory`, `attached.pid`).
    spec_from_proto(s).map_err(|e| status(e.into()))
}

impl AllocationApi {
    /// PERMISSION_DENIED unless `caller` may act on job `id`.
    async fn authorize(&self, caller: &Caller, id: u64) -> Result<(), Status> {
        let job = self.node.get(id).await.map_err(status)?;
        caller.authorize(id, job.owner).map_err(status)
    }
}

type CapacityStream = Pin<Box<dyn Stream<Item = Result<v1::Capacity, Status>> + Send>>;

#[tonic::async_trait]
impl AllocationService for AllocationApi {
    async fn fit(&self, req: Request<v1::FitRequest>) -> Result<Response<v1::FitResponse>, Status> {
        let caller = caller(&self.access, &req)?;
        let spec = spec(req.into_inner().spec)?;
        let fit = self.node.fit(&spec, caller.owner()).await.map_err(status)?;
        let gpus = &fit.gpus;
        let verdict = match fit.verdict {
            Verdict::Now => v1::fit_response::Verdict::Now,
            Verdict::AfterReconfiguration => v1::fit_response::Verdict::AfterReconfiguration,
            Verdict::Wait => v1::fit_response::Verdict::Wait,
            Verdict::Never => v1::fit_response::Verdict::Never,
        };
        let assignment = fit.placement.map(|p| {
            let g = gpus.iter().find(|g| g.index == p.slot.gpu);
            let instance = g.and_then(|g| {
                g.instances.iter().find(|i| {
                    Some(i.profile_id) == p.slot.profile_id && i.placement.start == p.slot.start
                })
            });
            let now = fit.verdict == Verdict::Now;
            v1::Assignment {
                gpu_index: p.slot.gpu,
                gpu_uuid: g.map(|g| g.uuid.clone()).unwrap_or_default(),
                instance_id: instance.filter(|_| now).map_or(0, |i| i.id),
                device_uuid: match (now, instance, g) {
                    (false, ..) => String::new(),
                    (true, Some(i), _) => i.uuid.clone(),
                    (true, None, Some(g)) => g.uuid.clone(),
                    (true, None, None) => String::new(),
                },
                profile: profile_name(gpus, p.slot),
                start_slice: u32::from(p.slot.start),
                mps_share: u32::from(p.mps_share),
            }
        });
        let steps = fit
            .steps
            .iter()
            .map(|s| super::step_to_proto(gpus, s))
            .collect();
        Ok(Response::new(v1::FitResponse {
            verdict: verdict as i32,
            assignment,
            reason: fit.reason.clone(),
            steps,
            moves: fit.moves.clone(),
            predicted_perf: fit.predicted_perf,
            stp_before: fit.stp_before,
            stp_after: fit.stp_after,
            cost: fit.cost(),
            costs: fit
                .costs
                .iter()
                .map(|&(job_id, perf_before, perf_after)| v1::JobCost {
                    job_id,
                    perf_before,
                    perf_after,
                })
                .collect(),
            planner: self.node.planner_name().into(),
        }))
    }

    async fn allocate(
        &self,
        req: Request<v1::AllocateRequest>,
    ) -> Result<Response<v1::Allocation>, Status> {
        let caller = caller(&self.access, &req)?;
        let req = req.into_inner();
        let spec = spec(req.spec)?;
        let request_id = (!req.request_id.is_empty()).then_some(req.request_id);
        let a = self
            .node
            .allocate(spec, Some(caller.owner()), request_id, wait(req.wait_ms))
            .await
            .map_err(status)?;
        Ok(Response::new(allocation_to_proto(&self.node, &a, &caller)))
    }

    async fn get_allocation(
        &self,
        req: Request<v1::GetAllocationRequest>,
    ) -> Result<Response<v1::Allocation>, Status> {
        let caller = caller(&self.access, &req)?;
        let req = req.into_inner();
        self.authorize(&caller, req.id).await?;
        let a = self
            .node
            .allocation(req.id, wait(req.wait_ms))
            .await
            .map_err(status)?;
        Ok(Response::new(allocation_to_proto(&self.node, &a, &caller)))
    }

    async fn renew_lease(
        &self,
        req: Request<v1::RenewLeaseRequest>,
    ) -> Result<Response<v1::Allocation>, Status> {
        let caller = caller(&self.access, &req)?;
        let id = req.into_inner().id;
        self.authorize(&caller, id).await?;
        let a = self.node.renew(id).await.map_err(status)?;
        Ok(Response::new(allocation_to_proto(&self.node, &a, &caller)))
    }

    async fn release(&self, req: Request<v1::ReleaseRequest>) -> Result<Response<v1::Job>, Status> {
        let caller = caller(&self.access, &req)?;
        let req = req.into_inner();
        reason("reason", &req.reason)?;
        self.authorize(&caller, req.id).await?;
        let job = self
            .node
            .release_allocation(req.id, req.exit_code, &req.reason, Some(caller.uid))
            .await
            .map_err(status)?;
        Ok(Response::new(job_view(&self.node, &job, &caller)))
    }

    type WatchCapacityStream = CapacityStream;

    async fn watch_capacity(
        &self,
        req: Request<v1::WatchCapacityRequest>,
    ) -> Result<Response<Self::WatchCapacityStream>, Status> {
        let caller = caller(&self.access, &req)?;
        let place = self.watches.open(caller.uid)?;
        // Subscribed before the first reading: no change falls in between.
        let mut events = self.node.subscribe();
        let first = self.node.capacity(self.unit_mib).await.map_err(status)?;
        let (tx, rx) = mpsc::channel(16);
        let node = self.node.clone();
        let unit = self.unit_mib;
        let stopping = until_true(self.stopping.clone());
        tokio::spawn(async move {
            let _place = place;
            tokio::pin!(stopping);
            let mut last = first;
            if tx.send(Ok(capacity_to_proto(&last))).await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    () = &mut stopping => return,
                    () = tx.closed() => return,
                    ev = events.recv() => match ev {
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                }
                // A placement comes as several events; read the capacity once they settle.
                tokio::time::sleep(SETTLE).await;
                while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = events.try_recv()
                {
                }
                let now = match node.capacity(unit).await {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = tx.send(Err(status(e))).await;
                        return;
                    }
                };
                if now != last {
                    last = now;
                    tokio::select! {
                        r = tx.send(Ok(capacity_to_proto(&last))) => if r.is_err() { return; },
                        () = &mut stopping => return,
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
