//! The planner interface and the first-fit planner.
//!
//! A planner is a pure function from the node (GPUs and their instances) and the jobs
//! (placed and waiting) to a [`Plan`]: the steps that change the MIG layout, where each job
//! runs with which MPS share, and why the others wait. The daemon's reconciler applies it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use mmk_core::JobClass;
use mmk_core::units::format_mib;
use serde::Serialize;

use crate::layout::{self, GpuState, Placement};
use crate::model::JobProfile;

/// The node as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeState {
    pub gpus: Vec<GpuState>,
    /// Jobs that arrived since a planning pass last left a job waiting: how calm the node
    /// has been of late. 0 where the caller does not know (a daemon that just started).
    /// MMK lets a newcomer take the share its model likes best only on a calm node
    /// (`HybridOptions::best_share_when_calm`).
    pub calm_arrivals: u64,
}

impl NodeState {
    /// A node with these GPUs, nothing known of its history.
    pub fn new(gpus: Vec<GpuState>) -> NodeState {
        NodeState {
            gpus,
            calm_arrivals: 0,
        }
    }
}

/// A partition: a MIG instance identified by its GPU, start slice and profile, or a whole
/// GPU with MIG off (`profile_id: None`). Slots are stable across daemon restarts, unlike
/// the instance IDs the driver assigns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Slot {
    pub gpu: u32,
    pub start: u8,
    pub profile_id: Option<u32>,
}

/// A job as the planner sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobDemand {
    pub id: u64,
    pub class: JobClass,
    pub memory_mib: u64,
    pub priority: i32,
    /// Where the job runs now; `None` while it waits.
    pub placed: Option<Slot>,
    /// The MPS share of a placed job. A running MPS client's share cannot change.
    pub mps_share: u8,
    /// Online jobs: the latency objective, in ms.
    pub slo_ms: Option<u64>,
    /// Online jobs: the objective as a slowdown against running alone (`slo: 3x`): it
    /// holds at a normalized performance of at least 1 / slowdown.
    pub slo_slowdown: Option<f64>,
    pub profile: JobProfile,
    /// The job can be stopped and restarted elsewhere or with another share (an offline
    /// job that declared `checkpoint: true`, docs/architecture.md, item 8).
    pub movable: bool,
    /// The job has its partition to itself (`exclusive: true`): no other job joins it,
    /// and it joins no partition that runs jobs.
    pub exclusive: bool,
    /// The user whose processes the job runs as. A partition serves one user at a time:
    /// an MPS control daemon runs one user's server at a time and queues another user's
    /// clients until that server exits, and a partition's gate is its user's alone. `None`
    /// is a user too (a simulation's one user).
    pub user: Option<u32>,
    /// The node asks this job to leave its partition: its SLO control is at its highest
    /// level there and an online job's objective is still at risk (docs/slo.md). A
    /// checkpointable (`movable`) offline job moves to another GPU where it fits, whatever
    /// that does to the predicted throughput; any other job stays.
    pub leave: bool,
    /// Seconds since the job was submitted (0 where unknown). A planner may hold a GPU for
    /// an offline job that has waited long (`HybridOptions::reserve_after`).
    pub age_s: f64,
}

impl JobDemand {
    /// Whether an online job with an SLO and a known solo latency meets its SLO at this
    /// normalized performance (latency = solo / perf); other jobs always do. The planners
    /// and the simulator's report draw the same line.
    pub fn slo_met(&self, perf: f64) -> bool {
        let slowdown = match (self.class, self.slo_slowdown) {
            (JobClass::Online, Some(f)) => perf * f >= 1.0 - 1e-9,
            _ => true,
        };
        slowdown
            && match (self.class, self.slo_ms, self.profile.solo_latency_ms) {
                (JobClass::Online, Some(slo), Some(solo)) => {
                    solo / perf.max(1e-9) <= slo as f64 + 1e-9
                }
                _ => true,
            }
    }

    /// A waiting job nobody profiled (the prior): the least a planner needs.
    pub fn waiting(id: u64, class: JobClass, memory_mib: u64) -> JobDemand {
        JobDemand {
            id,
            class,
            memory_mib,
            priority: 0,
            placed: None,
            mps_share: 100,
            slo_ms: None,
            slo_slowdown: None,
            profile: JobProfile::prior(class),
            movable: false,
            exclusive: false,
            user: None,
            leave: false,
            age_s: 0.0,
        }
    }

    /// Whether this job and `other` may run in one partition at once: neither asked for a
    /// partition of its own, and both run as one user.
    pub fn shares_with(&self, other: &JobDemand) -> bool {
        !self.exclusive && !other.exclusive && self.user == other.user
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct JobPlacement {
    pub job: u64,
    pub slot: Slot,
    /// MPS active thread percentage, 10..=100.
    pub mps_share: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueuedJob {
    pub job: u64,
    /// Why it waits. Jobs that wait for the same reason share it: a node under a long
    /// queue tells thousands of jobs a handful of reasons each pass.
    pub reason: Arc<str>,
}

/// One change to a GPU's layout. Destroys come before creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Step {
    /// Destroy the instance the driver knows as `instance` (it hosts no job).
    Destroy { slot: Slot, instance: u32 },
    /// Create an instance of `slot.profile_id` at `slot.start`.
    Create { slot: Slot },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Every job that runs after the plan is applied: the ones already placed and the new.
    pub placements: Vec<JobPlacement>,
    pub queued: Vec<QueuedJob>,
    /// Predicted system throughput after the plan (sum of normalized performance), when
    /// the planner uses a performance model.
    pub stp: Option<f64>,
    /// Placed jobs the plan restarts with another partition or share (checkpoint and
    /// restart); their new place is in `placements`.
    pub moves: Vec<u64>,
    /// Running checkpointable offline jobs the plan stops (checkpoint) and sends back to
    /// the queue, to make room for an online job; they are not in `placements`.
    pub preempted: Vec<Preemption>,
    /// Predicted normalized performance of each placed job (job ID, perf), sorted by job,
    /// when the planner uses a performance model; `stp` is their sum.
    pub perf: Vec<(u64, f64)>,
}

/// A running job stopped for an online one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Preemption {
    pub job: u64,
    /// The online job it makes room for.
    pub for_job: u64,
}

/// Chooses layouts and placements. Implementations are pure and deterministic.
pub trait Planner: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &'static str;
    /// `jobs` are in submission order.
    fn plan(&self, node: &NodeState, jobs: &[JobDemand]) -> Plan;
}

/// The simple planner of the foundation: placed jobs stay; each waiting job (by priority,
/// then submission order) goes to the first partition with enough free memory, or into a
/// new instance of the smallest profile that holds it, carved from slices that host no
/// job (empty instances in the way are destroyed). Every job gets the whole partition's
/// MPS share (100 %). When nothing fits the job waits, with the reason, and later jobs may
/// still start (backfill).
#[derive(Debug, Clone, Copy, Default)]
pub struct FirstFit;

/// Why a job waits that would fit beside another user's jobs.
pub const ANOTHER_USER: &str = "the partitions with room run another user's jobs, and a \
     partition serves one user at a time (its MPS server runs one user's processes)";

#[derive(Debug, Clone)]
struct SlotUse {
    memory_mib: u64,
    used_mib: u64,
    jobs: usize,
    /// A job there has it to itself.
    exclusive: bool,
    /// The user whose jobs run there (a partition serves one user at a time).
    user: Option<Option<u32>>,
    /// The driver's instance ID when the instance exists now.
    instance: Option<u32>,
}

impl Planner for FirstFit {
    fn name(&self) -> &'static str {
        "first-fit"
    }

    fn plan(&self, node: &NodeState, jobs: &[JobDemand]) -> Plan {
        let mut slots = current_slots(node);
        let mut plan = Plan::default();

        for job in jobs.iter().filter(|j| j.placed.is_some()) {
            let slot = job.placed.expect("filtered on placed");
            if let Some(u) = slots.get_mut(&slot) {
                u.used_mib += job.memory_mib;
                u.jobs += 1;
                u.exclusive |= job.exclusive;
                u.user = Some(job.user);
            }
            plan.placements.push(JobPlacement {
                job: job.id,
                slot,
                mps_share: job.mps_share,
            });
        }

        let mut waiting: Vec<&JobDemand> = jobs.iter().filter(|j| j.placed.is_none()).collect();
        waiting.sort_by_key(|j| std::cmp::Reverse(j.priority));

        let largest = largest_partition_mib(node);
        for job in waiting {
            let fits = slots
                .iter()
                .find(|(_, u)| {
                    u.memory_mib - u.used_mib.min(u.memory_mib) >= job.memory_mib
                        && (u.jobs == 0
                            || (!u.exclusive && !job.exclusive && u.user == Some(job.user)))
                })
                .map(|(s, _)| *s);
            let slot = fits.or_else(|| carve(node, &mut slots, &mut plan.steps, job.memory_mib));
            match slot {
                Some(slot) => {
                    if let Some(u) = slots.get_mut(&slot) {
                        u.used_mib += job.memory_mib;
                        u.jobs += 1;
                        u.exclusive |= job.exclusive;
                        u.user = Some(job.user);
                    }
                    plan.placements.push(JobPlacement {
                        job: job.id,
                        slot,
                        mps_share: 100,
                    });
                }
                None => plan.queued.push(QueuedJob {
                    job: job.id,
                    reason: if slots.values().any(|u| {
                        u.jobs > 0
                            && u.user != Some(job.user)
                            && u.memory_mib - u.used_mib.min(u.memory_mib) >= job.memory_mib
                    }) {
                        format!(
                            "waiting for {} of GPU memory: {ANOTHER_USER}",
                            format_mib(job.memory_mib)
                        )
                    } else if job.memory_mib > largest {
                        format!(
                            "needs {} of GPU memory; the largest partition this node can make has {}",
                            format_mib(job.memory_mib),
                            format_mib(largest)
                        )
                    } else {
                        format!(
                            "waiting for {} of GPU memory: no partition has that much free and busy partitions leave no room for a new one",
                            format_mib(job.memory_mib)
                        )
                    }
                    .into(),
                }),
            }
        }
        plan.steps.sort_by_key(|s| matches!(s, Step::Create { .. }));
        plan
    }
}

/// The partitions the node has now.
fn current_slots(node: &NodeState) -> BTreeMap<Slot, SlotUse> {
    let mut slots = BTreeMap::new();
    for gpu in &node.gpus {
        if !gpu.mig_enabled {
            slots.insert(
                Slot {
                    gpu: gpu.index,
                    start: 0,
                    profile_id: None,
                },
                SlotUse {
                    memory_mib: gpu.model.memory_mib,
                    used_mib: 0,
                    jobs: 0,
                    exclusive: false,
                    user: None,
                    instance: None,
                },
            );
            continue;
        }
        for inst in &gpu.instances {
            let memory_mib = gpu
                .model
                .profile(inst.profile_id)
                .map_or(0, |p| p.memory_mib);
            slots.insert(
                Slot {
                    gpu: gpu.index,
                    start: inst.placement.start,
                    profile_id: Some(inst.profile_id),
                },
                SlotUse {
                    memory_mib,
                    used_mib: 0,
                    jobs: 0,
                    exclusive: false,
                    user: None,
                    instance: Some(inst.id),
                },
            );
        }
    }
    slots
}

/// The largest partition any GPU of the node has or can make.
pub fn largest_partition_mib(node: &NodeState) -> u64 {
    node.gpus
        .iter()
        .map(largest_partition_mib_of)
        .max()
        .unwrap_or(0)
}

/// The largest partition `g` can have: the whole GPU with MIG off, its largest instance
/// where mmk may not change its layout, else the largest instance its model makes.
pub fn largest_partition_mib_of(g: &GpuState) -> u64 {
    if !g.mig_enabled {
        g.model.memory_mib
    } else if g.layout_fixed {
        g.instances
            .iter()
            .filter_map(|i| g.model.profile(i.profile_id))
            .map(|p| p.memory_mib)
            .max()
            .unwrap_or(0)
    } else {
        g.model.largest_instance_mib()
    }
}

/// Makes room for a new instance that holds `memory_mib`: the smallest profile, placed on
/// slices that host no job, preferring placements that destroy nothing. Records the steps.
fn carve(
    node: &NodeState,
    slots: &mut BTreeMap<Slot, SlotUse>,
    steps: &mut Vec<Step>,
    memory_mib: u64,
) -> Option<Slot> {
    // (destroys anything, profile memory, compute slices, destroy count, gpu, start,
    // profile): lowest wins.
    type Key = (bool, u64, u8, usize, u32, u8, u32);
    let mut best: Option<(Key, Slot, Vec<Slot>)> = None;
    for gpu in node
        .gpus
        .iter()
        .filter(|g| g.mig_enabled && !g.layout_fixed)
    {
        let on_gpu: Vec<(Slot, &SlotUse)> = slots
            .iter()
            .filter(|(s, _)| s.gpu == gpu.index)
            .map(|(s, u)| (*s, u))
            .collect();
        for p in gpu
            .model
            .profiles
            .iter()
            .filter(|p| p.memory_mib >= memory_mib)
        {
            for &start in &p.starts {
                let here = Placement {
                    start,
                    size: p.memory_slices,
                };
                let size_of = |s: &Slot| {
                    s.profile_id
                        .and_then(|id| gpu.model.profile(id))
                        .map_or(0, |q| q.memory_slices)
                };
                let overlapped: Vec<(Slot, &SlotUse)> = on_gpu
                    .iter()
                    .filter(|(s, _)| {
                        here.overlaps(Placement {
                            start: s.start,
                            size: size_of(s),
                        })
                    })
                    .map(|(s, u)| (*s, *u))
                    .collect();
                if overlapped.iter().any(|(_, u)| u.jobs > 0) {
                    continue;
                }
                let mut layout: Vec<(u32, u8)> = on_gpu
                    .iter()
                    .filter(|(s, _)| !overlapped.iter().any(|(o, _)| o == s))
                    .filter_map(|(s, _)| s.profile_id.map(|id| (id, s.start)))
                    .collect();
                layout.push((p.id, start));
                if !layout::fits(&gpu.model, &layout) {
                    continue;
                }
                let key = (
                    !overlapped.is_empty(),
                    p.memory_mib,
                    p.compute_slices,
                    overlapped.len(),
                    gpu.index,
                    start,
                    p.id,
                );
                if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
                    let slot = Slot {
                        gpu: gpu.index,
                        start,
                        profile_id: Some(p.id),
                    };
                    best = Some((key, slot, overlapped.iter().map(|(s, _)| *s).collect()));
                }
            }
        }
    }
    let (_, slot, destroy) = best?;
    for s in destroy {
        if let Some(SlotUse {
            instance: Some(id), ..
        }) = slots.remove(&s)
        {
            steps.push(Step::Destroy {
                slot: s,
                instance: id,
            });
        }
    }
    let memory = node
        .gpus
        .iter()
        .find(|g| g.index == slot.gpu)
        .and_then(|g| slot.profile_id.and_then(|id| g.model.profile(id)))
        .map_or(0, |p| p.memory_mib);
    slots.insert(
        slot,
        SlotUse {
            memory_mib: memory,
            used_mib: 0,
            jobs: 0,
            exclusive: false,
            user: None,
            instance: None,
        },
    );
    steps.push(Step::Create { slot });
    Some(slot)
}

/// What the node looks like once `plan` is applied: the steps change the layouts (new
/// instances get IDs after the largest in use) and the placements set each job's
/// partition and share. The daemon's reconciler does this for real; the simulator and the
/// benchmarks use this.
pub fn apply(node: &NodeState, jobs: &[JobDemand], plan: &Plan) -> (NodeState, Vec<JobDemand>) {
    let (mut node, mut jobs) = (node.clone(), jobs.to_vec());
    apply_in_place(&mut node, &mut jobs, plan);
    (node, jobs)
}

/// [`apply`] on the caller's node and jobs, without copying them.
pub fn apply_in_place(node: &mut NodeState, jobs: &mut [JobDemand], plan: &Plan) {
    let mut next_id = node
        .gpus
        .iter()
        .flat_map(|g| g.instances.iter().map(|i| i.id))
        .max()
        .unwrap_or(0)
        + 1;
    for step in &plan.steps {
        match step {
            Step::Destroy { slot, instance } => {
                if let Some(g) = node.gpus.iter_mut().find(|g| g.index == slot.gpu) {
                    g.instances.retain(|i| i.id != *instance);
                }
            }
            Step::Create { slot } => {
                if let (Some(g), Some(pid)) = (
                    node.gpus.iter_mut().find(|g| g.index == slot.gpu),
                    slot.profile_id,
                ) {
                    let size = g.model.profile(pid).map_or(0, |p| p.memory_slices);
                    g.instances.push(crate::layout::Instance {
                        id: next_id,
                        profile_id: pid,
                        placement: Placement {
                            start: slot.start,
                            size,
                        },
                        uuid: format!("MIG-{}-{next_id}", slot.gpu),
                    });
                    next_id += 1;
                }
            }
        }
    }
    // A job's first placement, as a plan lists them.
    let mut placements: HashMap<u64, &JobPlacement> = HashMap::new();
    for p in &plan.placements {
        placements.entry(p.job).or_insert(p);
    }
    let preempted: HashSet<u64> = plan.preempted.iter().map(|p| p.job).collect();
    for j in jobs {
        if let Some(p) = placements.get(&j.id) {
            j.placed = Some(p.slot);
            j.mps_share = p.mps_share;
        } else if preempted.contains(&j.id) {
            j.placed = None;
            j.mps_share = 100;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use crate::layout::Instance;

    fn gpu(key: &str, index: u32, mig: bool) -> GpuState {
        GpuState {
            index,
            uuid: format!("GPU-{index}"),
            model: catalog::model(key).expect("known model"),
            mig_enabled: mig,
            layout_fixed: false,
            instances: vec![],
        }
    }

    fn job(id: u64, gib: u64, placed: Option<Slot>) -> JobDemand {
        JobDemand {
            placed,
            ..JobDemand::waiting(id, JobClass::Offline, gib * 1024)
        }
    }

    fn profile_name(node: &NodeState, slot: Slot) -> String {
        let g = &node.gpus[slot.gpu as usize];
        slot.profile_id
            .and_then(|id| g.model.profile(id))
            .map_or("whole".into(), |p| p.name.clone())
    }

    #[test]
    fn an_empty_gpu_gets_the_smallest_instance_that_fits() {
        let node = NodeState::new(vec![gpu("a100-80gb", 0, true)]);
        let plan = FirstFit.plan(&node, &[job(1, 15, None), job(2, 30, None)]);
        assert!(plan.queued.is_empty());
        let names: Vec<_> = plan
            .placements
            .iter()
            .map(|p| profile_name(&node, p.slot))
            .collect();
        assert_eq!(names, ["1g.20gb", "3g.40gb"]);
        assert_eq!(plan.steps.len(), 2);
        assert!(plan.steps.iter().all(|s| matches!(s, Step::Create { .. })));
    }

    #[test]
    fn jobs_share_an_instance_while_memory_lasts() {
        let mut g = gpu("a100-80gb", 0, true);
        g.instances.push(Instance {
            id: 1,
            profile_id: 0,
            placement: Placement { start: 0, size: 8 },
            uuid: "MIG-1".into(),
        });
        let node = NodeState::new(vec![g]);
        let whole = Slot {
            gpu: 0,
            start: 0,
            profile_id: Some(0),
        };
        let plan = FirstFit.plan(
            &node,
            &[job(1, 60, Some(whole)), job(2, 10, None), job(3, 30, None)],
        );
        assert_eq!(plan.placements.len(), 2);
        assert_eq!(plan.placements[1].slot, whole);
        assert_eq!(plan.queued.len(), 1);
        assert_eq!(plan.queued[0].job, 3);
        assert!(
            plan.queued[0].reason.contains("30GiB"),
            "{}",
            plan.queued[0].reason
        );
        assert!(plan.steps.is_empty(), "a busy instance is never destroyed");
    }

    #[test]
    fn empty_instances_in_the_way_are_destroyed() {
        let mut g = gpu("a100-80gb", 0, true);
        for (id, start) in [(1, 0), (2, 1)] {
            g.instances.push(Instance {
                id,
                profile_id: 19,
                placement: Placement { start, size: 1 },
                uuid: format!("MIG-{id}"),
            });
        }
        g.instances.push(Instance {
            id: 3,
            profile_id: 9,
            placement: Placement { start: 4, size: 4 },
            uuid: "MIG-3".into(),
        });
        let node = NodeState::new(vec![g]);
        let busy = Slot {
            gpu: 0,
            start: 4,
            profile_id: Some(9),
        };
        let plan = FirstFit.plan(&node, &[job(1, 35, Some(busy)), job(2, 35, None)]);
        assert!(plan.queued.is_empty(), "{:?}", plan.queued);
        assert_eq!(
            plan.steps,
            vec![
                Step::Destroy {
                    slot: Slot {
                        gpu: 0,
                        start: 0,
                        profile_id: Some(19)
                    },
                    instance: 1
                },
                Step::Destroy {
                    slot: Slot {
                        gpu: 0,
                        start: 1,
                        profile_id: Some(19)
                    },
                    instance: 2
                },
                Step::Create {
                    slot: Slot {
                        gpu: 0,
                        start: 0,
                        profile_id: Some(9)
                    }
                },
            ]
        );
    }

    #[test]
    fn a_job_larger_than_any_partition_says_so() {
        let node = NodeState::new(vec![gpu("a30-24gb", 0, true)]);
        let plan = FirstFit.plan(&node, &[job(1, 40, None)]);
        assert_eq!(plan.queued.len(), 1);
        assert!(plan.queued[0].reason.contains("largest partition"));
    }

    #[test]
    fn a_fixed_layout_is_used_as_it_is() {
        let mut g = gpu("a100-80gb", 0, true);
        g.layout_fixed = true;
        g.instances.push(Instance {
            id: 1,
            profile_id: 14,
            placement: Placement { start: 0, size: 2 },
            uuid: "MIG-1".into(),
        });
        let node = NodeState::new(vec![g]);
        assert_eq!(largest_partition_mib(&node), 19968);
        let plan = FirstFit.plan(&node, &[job(1, 15, None), job(2, 15, None)]);
        assert!(
            plan.steps.is_empty(),
            "nothing is created on a fixed layout"
        );
        assert_eq!(plan.placements.len(), 1);
        assert_eq!(plan.queued.len(), 1);
    }

    #[test]
    fn mig_off_gpu_is_one_partition() {
        let node = NodeState::new(vec![gpu("h100-80gb", 0, false)]);
        let plan = FirstFit.plan(
            &node,
            &[job(1, 40, None), job(2, 30, None), job(3, 20, None)],
        );
        assert!(plan.steps.is_empty());
        assert_eq!(plan.placements.len(), 2);
        assert!(plan.placements.iter().all(|p| p.slot.profile_id.is_none()));
        assert_eq!(plan.queued.len(), 1);
    }

    #[test]
    fn priority_goes_first_then_backfill() {
        let node = NodeState::new(vec![gpu("a100-40gb", 0, true)]);
        let mut urgent = job(3, 35, None);
        urgent.priority = 10;
        let plan = FirstFit.plan(&node, &[job(1, 30, None), job(2, 4, None), urgent]);
        assert_eq!(plan.placements[0].job, 3, "the urgent job is placed first");
        assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [1]);
        assert!(
            plan.placements.iter().any(|p| p.job == 2),
            "a small job backfills"
        );
    }

    #[test]
    fn plans_are_deterministic() {
        let node = NodeState::new(vec![gpu("h200-141gb", 0, true), gpu("h200-141gb", 1, true)]);
        let jobs: Vec<_> = (0..20).map(|i| job(i, 5 + (i * 7) % 60, None)).collect();
        assert_eq!(FirstFit.plan(&node, &jobs), FirstFit.plan(&node, &jobs));
    }
}
