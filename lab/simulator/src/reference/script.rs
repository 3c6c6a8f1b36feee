//! A planner that replays a schedule (the reference's) through the simulator.

use super::*;

/// A planner that starts what the reference decided at each planning moment, in order
/// (the engine plans at the same moments the search did).
#[derive(Debug)]
pub struct Script {
    pub(super) decisions: Vec<Vec<JobPlacement>>,
    pub(super) call: Mutex<usize>,
}

impl Planner for Script {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn plan(&self, node: &NodeState, jobs: &[JobDemand]) -> Plan {
        let k = {
            let mut call = self.call.lock().unwrap_or_else(|e| e.into_inner());
            *call += 1;
            *call - 1
        };
        let started: &[JobPlacement] = self.decisions.get(k).map_or(&[], Vec::as_slice);
        let mut plan = Plan::default();
        for p in started {
            let Some(g) = node.gpus.iter().find(|g| g.index == p.slot.gpu) else {
                continue;
            };
            let exists = g.instances.iter().any(|i| {
                Some(i.profile_id) == p.slot.profile_id && i.placement.start == p.slot.start
            });
            let made = plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::Create { slot } if *slot == p.slot));
            if !exists && !made {
                let size = p
                    .slot
                    .profile_id
                    .and_then(|id| g.model.profile(id))
                    .map_or(0, |q| q.memory_slices);
                let here = layout::Placement {
                    start: p.slot.start,
                    size,
                };
                for i in g.instances.iter().filter(|i| here.overlaps(i.placement)) {
                    let slot = Slot {
                        gpu: g.index,
                        start: i.placement.start,
                        profile_id: Some(i.profile_id),
                    };
                    let gone = plan
                        .steps
                        .iter()
                        .any(|s| matches!(s, Step::Destroy { instance, .. } if *instance == i.id));
                    if !gone {
                        plan.steps.push(Step::Destroy {
                            slot,
                            instance: i.id,
                        });
                    }
                }
                plan.steps.push(Step::Create { slot: p.slot });
            }
            plan.placements.push(*p);
        }
        plan.steps.sort_by_key(|s| matches!(s, Step::Create { .. }));
        plan.queued = jobs
            .iter()
            .filter(|j| j.placed.is_none() && !started.iter().any(|p| p.job == j.id))
            .map(|j| QueuedJob {
                job: j.id,
                reason: "the reference starts it later".into(),
            })
            .collect();
        plan
    }
}
