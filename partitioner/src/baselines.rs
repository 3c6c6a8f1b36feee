//! The two simplest baselines of the MMK paper's evaluation.
//!
//! - **Default**: one job per GPU, first come first served: a GPU runs a job on the whole
//!   GPU (one 7g instance when MIG is on) and the next job waits for it; a job that cannot
//!   start holds up every job behind it.
//! - **MPS**: every job on the whole GPU through MPS with no limits (share 100 %), as many
//!   as fit in memory, first fit across GPUs.
//!
//! Both use the whole-GPU instance of a MIG-enabled GPU, creating it (and destroying empty
//! instances in its way) when the GPU holds no job.

use mmk_core::units::format_mib;

use crate::layout::GpuState;
use crate::plan::{JobDemand, JobPlacement, NodeState, Plan, Planner, QueuedJob, Slot, Step};

/// The slot of a GPU's whole-GPU partition and the steps that make it, when it can exist.
fn whole_gpu(g: &GpuState, busy: bool) -> Option<(Slot, Vec<Step>, u64)> {
    if !g.mig_enabled {
        let slot = Slot {
            gpu: g.index,
            start: 0,
            profile_id: None,
        };
        return Some((slot, Vec::new(), g.model.memory_mib));
    }
    let full = g
        .model
        .profiles
        .iter()
        .filter(|p| p.memory_slices == g.model.memory_slices && !p.media_extensions)
        .max_by_key(|p| p.compute_slices)?;
    let slot = Slot {
        gpu: g.index,
        start: 0,
        profile_id: Some(full.id),
    };
    if g.instances.iter().any(|i| i.profile_id == full.id) {
        return Some((slot, Vec::new(), full.memory_mib));
    }
    if busy || g.layout_fixed {
        return None;
    }
    let mut steps: Vec<Step> = g
        .instances
        .iter()
        .map(|i| Step::Destroy {
            slot: Slot {
                gpu: g.index,
                start: i.placement.start,
                profile_id: Some(i.profile_id),
            },
            instance: i.id,
        })
        .collect();
    steps.push(Step::Create { slot });
    Some((slot, steps, full.memory_mib))
}

fn plan_whole_gpu(node: &NodeState, jobs: &[JobDemand], one_per_gpu: bool) -> Plan {
    let mut plan = Plan::default();
    // (slot, memory left, jobs, a job there wants it to itself, whose jobs run there) per
    // GPU.
    type Use = (Slot, u64, usize, bool, Option<Option<u32>>);
    let mut gpus: Vec<Option<Use>> = Vec::new();
    for g in &node.gpus {
        let on_gpu: Vec<&JobDemand> = jobs
            .iter()
            .filter(|j| j.placed.is_some_and(|s| s.gpu == g.index))
            .collect();
        for j in &on_gpu {
            if let Some(slot) = j.placed {
                plan.placements.push(JobPlacement {
                    job: j.id,
                    slot,
                    mps_share: j.mps_share,
                });
            }
        }
        match whole_gpu(g, !on_gpu.is_empty()) {
            Some((slot, steps, mem)) => {
                let used: u64 = on_gpu.iter().map(|j| j.memory_mib).sum();
                if on_gpu.is_empty() && !steps.is_empty() {
                    // Kept below only if a job lands on this GPU.
                    gpus.push(Some((slot, mem, 0, false, None)));
                    plan.steps.extend(steps);
                } else {
                    let exclusive = on_gpu.iter().any(|j| j.exclusive);
                    gpus.push(Some((
                        slot,
                        mem.saturating_sub(used),
                        on_gpu.len(),
                        exclusive,
                        on_gpu.first().map(|j| j.user),
                    )));
                }
            }
            None => gpus.push(None),
        }
    }
    let mut waiting: Vec<&JobDemand> = jobs.iter().filter(|j| j.placed.is_none()).collect();
    waiting.sort_by_key(|j| j.id);
    let mut blocked = false;
    for j in waiting {
        let target = if blocked {
            None
        } else {
            gpus.iter_mut()
                .flatten()
                .find(|(_, left, n, exclusive, user)| {
                    let alone = one_per_gpu || j.exclusive;
                    *left >= j.memory_mib
                        && (*n == 0 || (!alone && !*exclusive && *user == Some(j.user)))
                })
        };
        match target {
            Some((slot, left, n, exclusive, user)) => {
                *left -= j.memory_mib;
                *n += 1;
                *exclusive |= j.exclusive;
                *user = Some(j.user);
                plan.placements.push(JobPlacement {
                    job: j.id,
                    slot: *slot,
                    mps_share: 100,
                });
            }
            None => {
                // Default is strict FCFS: the first job that waits holds up the rest.
                blocked = one_per_gpu;
                plan.queued.push(QueuedJob {
                    job: j.id,
                    reason: format!(
                        "waiting for a whole GPU with {} of memory free",
                        format_mib(j.memory_mib)
                    )
                    .into(),
                });
            }
        }
    }
    // Keep the creation steps only of GPUs that received a job.
    let used: Vec<u32> = plan.placements.iter().map(|p| p.slot.gpu).collect();
    plan.steps.retain(|s| {
        let gpu = match s {
            Step::Destroy { slot, .. } | Step::Create { slot } => slot.gpu,
        };
        used.contains(&gpu)
    });
    plan.steps.sort_by_key(|s| matches!(s, Step::Create { .. }));
    plan.placements.sort_by_key(|p| p.job);
    plan
}

/// Default: one job per GPU, FCFS.
#[derive(Debug, Clone, Copy, Default)]
pub struct OneJobPerGpu;

impl Planner for OneJobPerGpu {
    fn name(&self) -> &'static str {
        "default"
    }

    fn plan(&self, node: &NodeState, jobs: &[JobDemand]) -> Plan {
        plan_whole_gpu(node, jobs, true)
    }
}

/// MPS: every job on the whole GPU, no limits.
#[derive(Debug, Clone, Copy, Default)]
pub struct MpsOnly;

impl Planner for MpsOnly {
    fn name(&self) -> &'static str {
        "mps"
    }

    fn plan(&self, node: &NodeState, jobs: &[JobDemand]) -> Plan {
        plan_whole_gpu(node, jobs, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use mmk_core::JobClass;

    fn node(n: u32) -> NodeState {
        NodeState {
            gpus: (0..n)
                .map(|i| GpuState {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    model: catalog::model("a100-80gb").expect("model"),
                    mig_enabled: true,
                    layout_fixed: false,
                    instances: vec![],
                })
                .collect(),
            calm_arrivals: 0,
        }
    }

    fn jobs(gib: &[u64]) -> Vec<JobDemand> {
        gib.iter()
            .enumerate()
            .map(|(i, g)| JobDemand::waiting(i as u64 + 1, JobClass::Offline, g * 1024))
            .collect()
    }

    #[test]
    fn default_runs_one_job_per_gpu_in_order() {
        let plan = OneJobPerGpu.plan(&node(2), &jobs(&[10, 10, 10]));
        assert_eq!(
            plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [3]);
        assert_eq!(
            plan.steps
                .iter()
                .filter(|s| matches!(s, Step::Create { .. }))
                .count(),
            2
        );
    }

    #[test]
    fn mps_shares_the_whole_gpu_while_memory_lasts() {
        let plan = MpsOnly.plan(&node(1), &jobs(&[30, 30, 30]));
        assert_eq!(plan.placements.len(), 2);
        assert!(
            plan.placements
                .iter()
                .all(|p| p.mps_share == 100 && p.slot.profile_id == Some(0))
        );
        assert_eq!(plan.queued.len(), 1);
    }
}
