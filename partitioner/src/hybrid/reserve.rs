//! Step 0, **GPUs held for jobs that have waited long** (`HybridOptions::reserve_after`):
//! under a steady stream of work, small jobs keep taking the memory that running jobs
//! free, and a large offline job can wait for hours behind them. The offline jobs that
//! have waited past `reserve_after` try first and alone, the oldest first (MPS-first, the
//! layout search, the last resort; with the shortcuts, not a job of a kind that stayed
//! waiting, unrefused by any SLO, since the last placement: it would stay too). Where one
//! stays waiting on a node of several GPUs, a GPU is held for it: of those whose memory
//! could hold it, the one whose jobs hold the least memory. The rest of the pass plans
//! without the held GPUs, so no other waiting job starts there, and as their jobs end the
//! held jobs fit. A GPU held stays the same from pass to pass (nothing new starts there, so
//! its jobs hold less and less memory).
//!
//! One GPU is held at most while services are served promptly. While an online job has
//! waited past `reserve_after` too, every aged job that nothing holds gets a GPU, oldest
//! first, so that neither class's oldest jobs wait on the other's: the first may take any
//! GPU that could hold it, a later one only a GPU whose largest partition holds it twice
//! (a held GPU goes on serving other jobs beside the one it waited for), and one GPU is
//! never held: online work must have somewhere to go (so a node of one GPU holds
//! nothing). A job that no GPU may be held for keeps younger ones from getting one.

use std::borrow::Cow;

use mmk_core::JobClass;

use crate::plan::{JobDemand, NodeState, largest_partition_mib_of};

use super::Hybrid;
use super::partition::{GpuPlan, Progress};

/// A GPU held for a job, taken out of the rest of the pass.
pub(super) struct Held {
    /// The GPU's position in the node it was taken from (the node less the GPUs held
    /// before it; positions of the others shift down by one, as the plans' do).
    gpu: usize,
    /// The GPU's index on the node, for what waiting jobs are told.
    index: u32,
    plan: GpuPlan,
    job: usize,
}

impl Held {
    /// Puts the GPU and its job back into the pass; what waiting jobs are told.
    fn give_back(self, jobs: &[JobDemand], p: &mut Progress) -> String {
        p.plans.insert(self.gpu, self.plan);
        p.waiting.push(self.job);
        let job = &jobs[self.job];
        format!(
            "gpu {} is held for offline job {}, submitted {:.1} h ago, until its memory is free there",
            self.index,
            job.id,
            job.age_s / 3600.0
        )
    }
}

/// The GPUs held in a pass, in the order they were taken, and the node without them.
pub(super) struct Holds<'a> {
    held: Vec<Held>,
    rest: Cow<'a, NodeState>,
}

impl Holds<'_> {
    /// The node the rest of the pass plans on: the whole one without the held GPUs.
    pub(super) fn node(&self) -> &NodeState {
        &self.rest
    }

    /// Puts the GPUs and their jobs back into the pass, the last taken first; what waiting
    /// jobs are told, a line per GPU in the order they were taken.
    pub(super) fn give_back(self, jobs: &[JobDemand], p: &mut Progress) -> Vec<String> {
        let mut notes: Vec<String> = self
            .held
            .into_iter()
            .rev()
            .map(|h| h.give_back(jobs, p))
            .collect();
        notes.reverse();
        notes
    }
}

impl Hybrid {
    /// Step 0 (module docs): the offline jobs past `reserve_after` try alone, the oldest
    /// first; each that stays waiting gets a GPU held for it, taken out of `p` with the
    /// job, where the rules let one be held.
    pub(super) fn reserve<'a>(
        &self,
        node: &'a NodeState,
        jobs: &[JobDemand],
        p: &mut Progress,
    ) -> Holds<'a> {
        let mut holds = Holds {
            held: Vec::new(),
            rest: Cow::Borrowed(node),
        };
        let Some(after) = self.options.reserve_after else {
            return holds;
        };
        let mut aged: Vec<usize> = p
            .waiting
            .iter()
            .copied()
            .filter(|&j| jobs[j].class == JobClass::Offline && jobs[j].age_s >= after)
            .collect();
        aged.sort_by(|&a, &b| {
            jobs[b]
                .age_s
                .total_cmp(&jobs[a].age_s)
                .then(jobs[a].id.cmp(&jobs[b].id))
        });
        // A second GPU and more only while services wait long too.
        let online_waits_long = p
            .waiting
            .iter()
            .any(|&j| jobs[j].class == JobClass::Online && jobs[j].age_s >= after);
        // Kinds of job that tried alone and stayed waiting since the last placement, where
        // no SLO refused them (one of the planner's shortcuts): a GPU held since only took
        // places away, so a job of the same kind would stay too, and no SLO would refuse
        // it either. (Where one did, the GPU held may have been the one that refused it,
        // and the next job's reason may differ: it tries.)
        let mut stayed = vec![false; p.kinds.count()];
        for job in aged {
            if (!holds.held.is_empty() && !online_waits_long) || holds.rest.gpus.len() < 2 {
                break;
            }
            let kind = p.kinds.kind(job);
            if self.shortcuts && stayed[kind] {
                #[cfg(test)]
                super::tests::count(&super::tests::AGED_SKIPPED);
            } else if self.try_alone(&holds.rest, jobs, p, job) {
                stayed.fill(false);
                continue;
            } else {
                stayed[kind] = !p.slo_blocked[job];
            }
            let first = holds.held.is_empty();
            let Some(held) = self.hold(&holds.rest, jobs, p, job, first) else {
                // Younger jobs get no GPU held before it.
                break;
            };
            holds.rest.to_mut().gpus.remove(held.gpu);
            holds.held.push(held);
        }
        holds
    }

    /// Step 0 for one aged job: it tries alone on `node`; whether it is placed.
    fn try_alone(
        &self,
        node: &NodeState,
        jobs: &[JobDemand],
        p: &mut Progress,
        aged: usize,
    ) -> bool {
        let all = std::mem::replace(&mut p.waiting, vec![aged]);
        self.place_waiting(node, jobs, p);
        let placed = p.waiting.is_empty();
        p.waiting = all;
        if placed {
            p.waiting.retain(|&j| j != aged);
        }
        placed
    }

    /// The GPU held for an aged job that stays waiting, taken out of `p` with the job, if
    /// one may be: the first held, any GPU whose memory could hold it; later ones, one
    /// whose largest partition holds it twice.
    fn hold(
        &self,
        node: &NodeState,
        jobs: &[JobDemand],
        p: &mut Progress,
        aged: usize,
        first: bool,
    ) -> Option<Held> {
        let need = if first {
            jobs[aged].memory_mib
        } else {
            jobs[aged].memory_mib.saturating_mul(2)
        };
        let used = |gi: usize| -> u64 {
            p.plans[gi]
                .parts
                .iter()
                .flat_map(|x| &x.members)
                .map(|m| jobs[m.job].memory_mib)
                .sum()
        };
        let gpu = (0..node.gpus.len())
            .filter(|&gi| largest_partition_mib_of(&node.gpus[gi]) >= need)
            .min_by_key(|&gi| (used(gi), gi))?;
        p.waiting.retain(|&j| j != aged);
        let plan = p.plans.remove(gpu);
        Some(Held {
            gpu,
            index: node.gpus[gpu].index,
            plan,
            job: aged,
        })
    }
}
