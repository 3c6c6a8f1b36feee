//! Step 7 (`online_first`, MMK only): an online job that every other step left waiting
//! for memory takes it from offline jobs. In the partition where it needs the fewest,
//! offline jobs leave until its memory fits: first those the plan placed but that have not
//! started (they go back to waiting), then checkpointable ones that run (the plan stops
//! them, they checkpoint and go back to the queue; `Plan::preempted`). Among those, the
//! lowest priority first, then the largest, so that as few jobs as possible stop. An
//! offline job of higher priority than the online job is never stopped for it, nor is one
//! that cannot checkpoint; the online job then waits, and its reason names the offline
//! jobs in the way. An online job of the kind and priority of one that found no room is
//! not asked again until an eviction changes the partitions (one of the planner's
//! shortcuts, `Hybrid::shortcuts`): under a long queue, thousands of services wait.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use mmk_core::JobClass;

use crate::plan::JobDemand;

use super::Hybrid;
use super::mps_config::Raise;
use super::partition::{Member, Part, Progress};

/// One way to make room: where, who leaves, and the members after.
struct Eviction {
    gi: usize,
    pi: usize,
    /// Jobs that leave, started ones among them.
    leave: Vec<usize>,
    members: Vec<Member>,
    /// (jobs stopped, jobs leaving, MiB freed): the fewest stops, then the fewest
    /// leaving, then the least freed.
    cost: (usize, usize, u64),
}

impl Hybrid {
    pub(super) fn preempt_for_online(&self, jobs: &[JobDemand], p: &mut Progress) {
        let online: Vec<usize> = p
            .waiting
            .iter()
            .copied()
            .filter(|&j| jobs[j].class == JobClass::Online)
            .collect();
        // (kind, priority) of online jobs that found no room since the last eviction.
        let mut refused: BTreeSet<(usize, i32)> = BTreeSet::new();
        for new in online {
            let asks = (p.kinds.kind(new), jobs[new].priority);
            if self.shortcuts && refused.contains(&asks) {
                #[cfg(test)]
                super::tests::count(&super::tests::PREEMPT_SKIPPED);
                continue;
            }
            let mut best: Option<Eviction> = None;
            for (gi, gp) in p.plans.iter().enumerate() {
                for (pi, part) in gp.parts.iter().enumerate() {
                    if let Some(e) = self.eviction(jobs, part, new, gi, pi, p.raise)
                        && best.as_ref().is_none_or(|b| e.cost < b.cost)
                    {
                        best = Some(e);
                    }
                }
            }
            let Some(e) = best else {
                refused.insert(asks);
                continue;
            };
            refused.clear();
            p.plans[e.gi].parts[e.pi].members = e.members;
            p.waiting.retain(|&j| j != new);
            for j in e.leave {
                p.moved.remove(&j);
                if jobs[j].placed.is_some() {
                    p.preempted.push((j, new));
                } else {
                    p.waiting.push(j);
                }
            }
        }
    }

    /// The offline jobs that would leave `part` for online job `new`, if that makes room.
    fn eviction(
        &self,
        jobs: &[JobDemand],
        part: &Part,
        new: usize,
        gi: usize,
        pi: usize,
        raise: Raise,
    ) -> Option<Eviction> {
        let need = jobs[new].memory_mib;
        if part.memory_mib < need || part.free_mib(jobs) >= need {
            // Too small, or it has room and refused for another reason (shares, SLOs).
            return None;
        }
        let may_leave = |m: &Member| {
            let j = &jobs[m.job];
            j.class == JobClass::Offline
                && j.priority <= jobs[new].priority
                && (j.placed.is_none() || j.movable)
        };
        let mut candidates: Vec<usize> = part
            .members
            .iter()
            .filter(|m| may_leave(m))
            .map(|m| m.job)
            .collect();
        // Not started first, then the lowest priority, then the largest.
        candidates.sort_by_key(|&j| {
            (
                jobs[j].placed.is_some(),
                jobs[j].priority,
                Reverse(jobs[j].memory_mib),
                jobs[j].id,
            )
        });
        let mut free = part.free_mib(jobs);
        let mut leave = Vec::new();
        for j in candidates {
            if free >= need {
                break;
            }
            free += jobs[j].memory_mib;
            leave.push(j);
        }
        if free < need {
            return None;
        }
        let after = Part {
            members: part
                .members
                .iter()
                .filter(|m| !leave.contains(&m.job))
                .copied()
                .collect(),
            ..part.clone()
        };
        if after.closed_to(jobs, new) {
            return None;
        }
        let (share, _, _) = self.mps_config(jobs, &after, new, false, raise).ok()?;
        let mut members = after.members;
        members.push(Member { job: new, share });
        let stopped = leave.iter().filter(|&&j| jobs[j].placed.is_some()).count();
        let freed = leave.iter().map(|&j| jobs[j].memory_mib).sum();
        Some(Eviction {
            gi,
            pi,
            cost: (stopped, leave.len(), freed),
            leave,
            members,
        })
    }
}
