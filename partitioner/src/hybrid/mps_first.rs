//! Step 2, MPS first: each waiting job into the existing partition where it adds the most
//! predicted throughput.

use crate::plan::{JobDemand, NodeState};

use super::Hybrid;
use super::mps_config::Refusal;
use super::partition::{Member, Progress};

/// Where MPS-first puts a job: (gain, GPU, partition, the partition's new members, the
/// jobs it moves).
type Choice = (f64, usize, usize, Vec<Member>, Vec<usize>);

impl Hybrid {
    /// Step 2: each waiting job into the existing partition where it adds the most STP,
    /// re-choosing the shares of the partition's checkpointable offline jobs when that
    /// pays for their restart (Algorithm 1, line 9; DESIGN item 8). `last_resort`: the
    /// pass for the jobs every other step left waiting (`share_before_waiting`), where
    /// joining need not add `min_colocation_gain` and may oversubscribe a partition
    /// without online jobs (`compute_mps_config`).
    pub(super) fn mps_first(
        &self,
        node: &NodeState,
        jobs: &[JobDemand],
        p: &mut Progress,
        defer: bool,
        last_resort: bool,
    ) {
        let Progress {
            plans,
            waiting,
            slo_blocked,
            moved,
            kinds,
            raise,
            ..
        } = p;
        let mut still = Vec::new();
        // Where a job could run alone: placing jobs in busy partitions does not change it.
        let solo = if defer {
            self.solo_options(node, plans)
        } else {
            Vec::new()
        };
        // Kinds of job that stayed waiting since the last placement (with whether an SLO
        // refused them): the next job of the same kind would stay too.
        let mut refused = kinds.none_refused(self.shortcuts);
        for &j in waiting.iter() {
            if refused.skip(j, slo_blocked) {
                still.push(j);
                continue;
            }
            let mut best: Option<Choice> = None;
            let mut slo_here = false;
            for (gi, gp) in plans.iter().enumerate() {
                for (pi, part) in gp.parts.iter().enumerate() {
                    if part.free_mib(jobs) < jobs[j].memory_mib {
                        continue;
                    }
                    // An instance without jobs is the layout search's to keep, reshape or
                    // share out among several waiting jobs; MPS-first takes it only for a
                    // job that search left waiting.
                    if defer && part.members.is_empty() {
                        continue;
                    }
                    let now = self.part_stp(jobs, part);
                    let mut consider = |gain: f64, members: Vec<Member>, moves: Vec<usize>| {
                        if best.as_ref().is_none_or(|(g, ..)| gain > *g + 1e-12) {
                            best = Some((gain, gi, pi, members, moves));
                        }
                    };
                    match self.mps_config(jobs, part, j, last_resort, *raise) {
                        Ok((share, stp, own)) => {
                            if last_resort || self.adds_enough(part, own, stp - now) {
                                let mut members = part.members.clone();
                                members.push(Member { job: j, share });
                                consider(stp - now, members, Vec::new());
                            }
                        }
                        Err(Refusal::Slo) => slo_here = true,
                        Err(Refusal::Room) => {}
                    }
                    if let Some((members, stp, own, moves)) = self.rebalance(jobs, part, Some(j)) {
                        // A move must pay for its restart.
                        let gain = stp - self.moves_cost(&moves, moved) - now;
                        if gain > 0.0 && (last_resort || self.adds_enough(part, own, gain)) {
                            consider(gain, members, moves);
                        }
                    }
                }
            }
            // MPS first, unless an instance of its own (an empty one, or one made on
            // slices no job uses) would do better for this job even after paying for the
            // reconfiguration: then the layout search (step 3) decides.
            slo_blocked[j] |= slo_here;
            let carve = if defer {
                self.best_alone(node, &solo, jobs, j)
            } else {
                None
            };
            match best {
                Some((gain, gi, pi, members, moves)) if carve.is_none_or(|c| c <= gain + 1e-9) => {
                    plans[gi].parts[pi].members = members;
                    moved.extend(moves);
                    refused.placed();
                }
                _ => {
                    refused.refuse(j, slo_here);
                    still.push(j);
                }
            }
        }
        *waiting = still;
    }
}
