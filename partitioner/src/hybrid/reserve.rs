//! Step 0, **a GPU held for a job that has waited long** (`HybridOptions::reserve_after`):
//! under a steady stream of work, small jobs keep taking the memory that running jobs
//! free, and a large offline job can wait for hours behind them. The offline job that has
//! waited longest, once past `reserve_after`, tries first and alone (MPS-first, the layout
//! search, the last resort). Where nothing holds it on a node of several GPUs, the GPU
//! whose jobs hold the least memory, of those whose memory could hold it, is held for it:
//! the rest of the pass plans without that GPU, so no other waiting job starts there, and
//! as its jobs end the held job fits. The GPU chosen stays the same from pass to pass
//! (nothing new starts there, so its jobs hold less and less memory). A node of one GPU
//! holds nothing: online work must have somewhere to go.

use mmk_core::JobClass;

use crate::plan::{JobDemand, NodeState, largest_partition_mib_of};

use super::Hybrid;
use super::partition::{GpuPlan, Progress};

/// A GPU held for a job, taken out of the rest of the pass.
pub(super) struct Held {
    /// The GPU's position in the node.
    gpu: usize,
    plan: GpuPlan,
    job: usize,
}

impl Held {
    /// The node without the held GPU (positions of the others shift down by one, as the
    /// plans' do).
    pub(super) fn node_without(&self, node: &NodeState) -> NodeState {
        let mut n = node.clone();
        n.gpus.remove(self.gpu);
        n
    }

    /// Puts the GPU and its job back into the pass; what waiting jobs are told.
    pub(super) fn give_back(
        self,
        node: &NodeState,
        jobs: &[JobDemand],
        p: &mut Progress,
    ) -> String {
        p.plans.insert(self.gpu, self.plan);
        p.waiting.push(self.job);
        let job = &jobs[self.job];
        format!(
            "gpu {} is held for offline job {}, submitted {:.1} h ago, until its memory is free there",
            node.gpus[self.gpu].index,
            job.id,
            job.age_s / 3600.0
        )
    }
}

impl Hybrid {
    /// Step 0 (module docs): the job that has waited longest tries alone; where it stays
    /// waiting, the GPU held for it, taken out of `p` with the job.
    pub(super) fn reserve(
        &self,
        node: &NodeState,
        jobs: &[JobDemand],
        p: &mut Progress,
    ) -> Option<Held> {
        let after = self.options.reserve_after?;
        let aged = p
            .waiting
            .iter()
            .copied()
            .filter(|&j| jobs[j].class == JobClass::Offline && jobs[j].age_s >= after)
            .max_by(|&a, &b| {
                jobs[a]
                    .age_s
                    .total_cmp(&jobs[b].age_s)
                    .then(jobs[b].id.cmp(&jobs[a].id))
            })?;
        let all = std::mem::replace(&mut p.waiting, vec![aged]);
        self.place_waiting(node, jobs, p);
        let placed = p.waiting.is_empty();
        p.waiting = all;
        if placed {
            p.waiting.retain(|&j| j != aged);
            return None;
        }
        if node.gpus.len() < 2 {
            return None;
        }
        let used = |gi: usize| -> u64 {
            p.plans[gi]
                .parts
                .iter()
                .flat_map(|x| &x.members)
                .map(|m| jobs[m.job].memory_mib)
                .sum()
        };
        let gpu = (0..node.gpus.len())
            .filter(|&gi| largest_partition_mib_of(&node.gpus[gi]) >= jobs[aged].memory_mib)
            .min_by_key(|&gi| (used(gi), gi))?;
        p.waiting.retain(|&j| j != aged);
        let plan = p.plans.remove(gpu);
        Some(Held {
            gpu,
            plan,
            job: aged,
        })
    }
}
