//! Recovery at start: what a previous mmkd left. MIG steps that were under way are
//! marked interrupted and the instance records follow the GPUs; jobs that were STARTING or
//! RUNNING lost their process (requeued or FAILED, by their restart policy); attached
//! allocations lost their MPS daemon; leftover processes and MPS daemons are stopped.

use std::sync::Arc;

use mmk_core::spec::{RestartPolicy, Task};
use mmk_core::{JobState, now_ms};
use tracing::{info, warn};

use super::Node;
use crate::job::{Change, InstanceRecord};
use crate::runner;
use crate::store::StoreError;

impl Node {
    /// Jobs that were STARTING or RUNNING when the last mmkd stopped have lost their
    /// process: back to the queue if their restart policy allows, else FAILED.
    pub(super) async fn recover(&self) -> Result<(), StoreError> {
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
        let interrupted = store.interrupt_pending_steps(now_ms()).await?;
        for step in &interrupted {
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
        // The instances mmkd made, so that the backend may destroy them again: those its
        // journal shows created and not destroyed since, still with the MIG device UUID it
        // recorded (one the operator destroyed and made again at the same place has a new
        // one), and one a create step was making when mmkd stopped (the driver made it; the
        // journal did not hear back).
        let created = store.created_instances().await?;
        let recorded = store.instances().await?;
        let mut own: Vec<(String, u32)> = Vec::new();
        for g in gpus.iter().filter(|g| g.mig_enabled) {
            for inst in &g.instances {
                let same_device = recorded.iter().any(|r| {
                    r.gpu_uuid == g.uuid
                        && r.instance.id == inst.id
                        && r.instance.placement.start == inst.placement.start
                        && (r.instance.uuid.is_empty() || r.instance.uuid == inst.uuid)
                });
                let made = (same_device
                    && created.iter().any(|s| {
                        s.gpu_uuid == g.uuid
                            && s.instance_id == Some(inst.id)
                            && s.profile_id == inst.profile_id
                            && s.start == inst.placement.start
                    }))
                    || interrupted.iter().any(|s| {
                        s.kind == "create"
                            && s.gpu_uuid == g.uuid
                            && s.profile_id == inst.profile_id
                            && s.start == inst.placement.start
                    });
                if made {
                    own.push((g.uuid.clone(), inst.id));
                }
            }
        }
        // Claiming may make a compute instance: driver calls, off the async runtime.
        let backend = Arc::clone(&self.inner.backend);
        let claims = own.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || {
            for (gpu_uuid, instance) in &claims {
                backend.adopt_as_own(gpu_uuid, *instance);
            }
        })
        .await
        {
            warn!(error = %e, "claiming mmkd's own instances failed");
        }
        let own = own.len();
        // Each GPU's layout as mmkd now treats it (its own instances known).
        let backend = Arc::clone(&self.inner.backend);
        if let Ok(Ok(now_gpus)) = tokio::task::spawn_blocking(move || backend.gpus()).await {
            for g in &now_gpus {
                if let Some(note) = self.inner.backend.layout_note(g) {
                    info!(gpu = g.index, uuid = %g.uuid, instances = g.instances.len(), "{note}");
                }
            }
        }
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
            dropped, own, "instance records reconciled with the gpus"
        );
        Ok(())
    }
}
