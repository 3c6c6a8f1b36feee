//! Invariants every planner keeps, on random nodes and jobs (proptest):
//! - a plan never loses a job: each one is placed, queued or preempted, once;
//! - placed jobs stay where they are, with their share, unless the plan moves or preempts
//!   them; only checkpointable offline jobs move or are preempted, and only for an online
//!   job the plan places;
//! - every job fits its partition's memory;
//! - MPS shares within a partition sum to at most 100 (MIGER, MISO); under MMK the online
//!   jobs' shares sum to at most 100 (the offline jobs' may go over for a job that would
//!   wait, where no online job ran);
//! - a job that asked for its partition to itself (`exclusive`) is alone in it;
//! - no partition holds jobs of two users (MPS serves one user per server);
//! - every layout the steps produce is valid for its GPU model;
//! - no instance that hosts a job is destroyed (so no slice hosting an online job changes);
//! - the plan is the same for the same input.

use std::collections::BTreeMap;
use std::sync::Arc;

use mmk_core::JobClass;
use mmk_partitioner::layout::{self, Instance, Placement};
use mmk_partitioner::{
    AnalyticModel, GpuState, JobDemand, JobProfile, NodeState, PLANNERS, Slot, Step, catalog,
    planner,
};
use proptest::prelude::*;

/// Planners whose shares are limits that must fit in a partition.
const LIMITING: [&str; 3] = ["mmk", "miger", "miso"];

#[derive(Debug, Clone)]
struct Case {
    node: NodeState,
    jobs: Vec<JobDemand>,
}

fn arb_case() -> impl Strategy<Value = Case> {
    let keys = catalog::keys();
    (
        prop::collection::vec(
            (
                0..keys.len(),
                any::<bool>(),
                prop::collection::vec((0usize..64, 0u8..8), 0..5),
            ),
            1..4,
        ),
        prop::collection::vec(
            (
                1u64..90,
                any::<bool>(),
                0.05f64..1.0,
                0.0f64..1.0,
                -2i32..3,
                0usize..4,
            ),
            0..14,
        ),
    )
        .prop_map(move |(gpus, jobs)| {
            let mut node = NodeState::new(Vec::new());
            let mut placed_jobs = Vec::new();
            let mut next_id = 1;
            for (i, (k, mig, wanted)) in gpus.into_iter().enumerate() {
                let model = catalog::model(&keys[k]).expect("model");
                let mut g = GpuState {
                    index: i as u32,
                    uuid: format!("GPU-{i}"),
                    model: model.clone(),
                    mig_enabled: mig,
                    // Every third GPU's layout cannot change (read-only backend).
                    layout_fixed: i % 3 == 2,
                    instances: Vec::new(),
                };
                if mig {
                    // Add random instances while the layout stays valid.
                    for (pick, start) in wanted {
                        let p = &model.profiles[pick % model.profiles.len()];
                        let mut l: Vec<(u32, u8)> = g
                            .instances
                            .iter()
                            .map(|x| (x.profile_id, x.placement.start))
                            .collect();
                        l.push((p.id, start));
                        if layout::validate(&model, &l).is_ok() {
                            g.instances.push(Instance {
                                id: next_id,
                                profile_id: p.id,
                                placement: Placement {
                                    start,
                                    size: p.memory_slices,
                                },
                                uuid: format!("MIG-{next_id}"),
                            });
                            next_id += 1;
                        }
                    }
                }
                node.gpus.push(g);
            }
            // Jobs: some already placed (when they fit), the rest waiting.
            let mut used: BTreeMap<Slot, (u64, u32)> = BTreeMap::new();
            let mut users_of: BTreeMap<Slot, Option<u32>> = BTreeMap::new();
            let mut out = Vec::new();
            for (n, (gib, online, sm, bw, prio, where_)) in jobs.into_iter().enumerate() {
                let class = if online {
                    JobClass::Online
                } else {
                    JobClass::Offline
                };
                let mut j = JobDemand::waiting(n as u64 + 1, class, gib * 1024);
                j.priority = prio;
                j.profile = JobProfile {
                    class,
                    sm_demand: sm,
                    bw_demand: bw,
                    solo_latency_ms: None,
                };
                // Every other offline job declared checkpointing; online jobs have an SLO
                // of two to six times their solo latency.
                j.movable = class == JobClass::Offline && n % 2 == 0;
                // One waiting job in seven wants its partition to itself.
                j.exclusive = n % 7 == 3 && where_ == 0;
                // Three users (and `None`, a simulation's); a placed job takes the user of
                // the jobs already in its partition.
                j.user = [None, Some(1000), Some(1001), Some(1002)]
                    .get(n % 4)
                    .copied()
                    .flatten();
                if online {
                    j.profile.solo_latency_ms = Some(5.0);
                    j.slo_ms = Some(10 + 5 * (n as u64 % 5));
                }
                let slots: Vec<(Slot, u64)> = node
                    .gpus
                    .iter()
                    .flat_map(|g| {
                        if g.mig_enabled {
                            g.instances
                                .iter()
                                .map(|i| {
                                    let mem =
                                        g.model.profile(i.profile_id).map_or(0, |p| p.memory_mib);
                                    (
                                        Slot {
                                            gpu: g.index,
                                            start: i.placement.start,
                                            profile_id: Some(i.profile_id),
                                        },
                                        mem,
                                    )
                                })
                                .collect::<Vec<_>>()
                        } else {
                            vec![(
                                Slot {
                                    gpu: g.index,
                                    start: 0,
                                    profile_id: None,
                                },
                                g.model.memory_mib,
                            )]
                        }
                    })
                    .collect();
                if where_ > 0 && !slots.is_empty() {
                    let (slot, mem) = slots[where_ % slots.len()];
                    let u = used.entry(slot).or_insert((0, 0));
                    if u.0 + j.memory_mib <= mem && u.1 + 30 <= 100 {
                        u.0 += j.memory_mib;
                        u.1 += 30;
                        j.user = *users_of.entry(slot).or_insert(j.user);
                        j.placed = Some(slot);
                        j.mps_share = 30;
                        placed_jobs.push(j.id);
                    }
                }
                out.push(j);
            }
            Case { node, jobs: out }
        })
}

fn memory_of(node: &NodeState, slot: Slot) -> u64 {
    let g = &node.gpus[slot.gpu as usize];
    match slot.profile_id {
        Some(id) => g.model.profile(id).map_or(0, |p| p.memory_mib),
        None => g.model.memory_mib,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn every_planner_keeps_the_invariants(case in arb_case()) {
        let model = Arc::new(AnalyticModel::default());
        for name in PLANNERS {
            let p = planner(name, model.clone()).expect("known planner");
            let plan = p.plan(&case.node, &case.jobs);

            // Nothing lost, nothing twice.
            let mut seen: Vec<u64> = plan.placements.iter().map(|x| x.job)
                .chain(plan.queued.iter().map(|q| q.job))
                .chain(plan.preempted.iter().map(|p| p.job))
                .collect();
            seen.sort_unstable();
            let mut all: Vec<u64> = case.jobs.iter().map(|j| j.id).collect();
            all.sort_unstable();
            prop_assert_eq!(&seen, &all, "{}", name);

            // Placed jobs stay, with their share, unless the plan moves them; only
            // checkpointable offline jobs move.
            for pre in &plan.preempted {
                let j = case.jobs.iter().find(|j| j.id == pre.job).expect("known job");
                prop_assert!(j.placed.is_some() && j.movable && j.class == JobClass::Offline, "{} preempted job {}, which cannot be", name, j.id);
                let by = case.jobs.iter().find(|j| j.id == pre.for_job).expect("known job");
                prop_assert!(by.class == JobClass::Online && by.placed.is_none(), "{}: job {} preempted for job {}", name, j.id, by.id);
                prop_assert!(plan.placements.iter().any(|p| p.job == by.id), "{}: job {} preempted for job {}, which waits", name, j.id, by.id);
            }
            for j in case.jobs.iter().filter(|j| j.placed.is_some() && !plan.preempted.iter().any(|p| p.job == j.id)) {
                let p = plan.placements.iter().find(|x| x.job == j.id);
                prop_assert!(p.is_some(), "{} dropped placed job {}", name, j.id);
                let stays = p.is_some_and(|p| Some(p.slot) == j.placed && p.mps_share == j.mps_share);
                prop_assert_eq!(!stays, plan.moves.contains(&j.id), "{}: job {} moved without being listed, or listed without moving", name, j.id);
                prop_assert!(stays || j.movable, "{} moved job {}, which cannot move", name, j.id);
            }

            // Memory and shares per partition.
            // (memory, online shares, offline shares, jobs, an exclusive job among them)
            let mut per_slot: BTreeMap<Slot, (u64, u32, u32, u32, bool)> = BTreeMap::new();
            let mut users: BTreeMap<Slot, Option<u32>> = BTreeMap::new();
            for pl in &plan.placements {
                let j = case.jobs.iter().find(|j| j.id == pl.job).expect("known job");
                let user = *users.entry(pl.slot).or_insert(j.user);
                prop_assert_eq!(user, j.user, "{}: {:?} holds jobs of two users", name, pl.slot);
                let e = per_slot.entry(pl.slot).or_insert((0, 0, 0, 0, false));
                e.0 += j.memory_mib;
                match j.class {
                    JobClass::Online => e.1 += u32::from(pl.mps_share),
                    JobClass::Offline => e.2 += u32::from(pl.mps_share),
                }
                e.3 += 1;
                e.4 |= j.exclusive;
                prop_assert!((10..=100).contains(&pl.mps_share), "{}: share {}", name, pl.mps_share);
            }
            for (slot, (mem, online, offline, n, exclusive)) in &per_slot {
                prop_assert!(*mem <= memory_of(&case.node, *slot), "{}: {:?} holds {} MiB", name, slot, mem);
                if name == "mmk" {
                    // The online jobs' shares never go over (the offline jobs' may, for a
                    // job that would wait where no online job ran).
                    prop_assert!(*online <= 100, "{}: {:?} online shares {}", name, slot, online);
                } else if LIMITING.contains(&name) {
                    prop_assert!(online + offline <= 100, "{}: {:?} shares {}", name, slot, online + offline);
                }
                {
                    prop_assert!(!exclusive || *n == 1, "{}: {:?} holds an exclusive job and {} others", name, slot, n - 1);
                }
            }

            // Apply the steps: every layout stays valid, and busy instances survive, but
            // for one whose jobs all stop first (moves and preemptions: a job that widens
            // into a larger instance leaves the one it ran in).
            let stops = |id: u64| {
                plan.moves.contains(&id) || plan.preempted.iter().any(|p| p.job == id)
            };
            let busy: Vec<Slot> = case
                .jobs
                .iter()
                .filter(|j| !stops(j.id))
                .filter_map(|j| j.placed)
                .collect();
            for g in &case.node.gpus {
                let mut l: Vec<(u32, u8)> = g.instances.iter().map(|i| (i.profile_id, i.placement.start)).collect();
                for s in &plan.steps {
                    match s {
                        Step::Destroy { slot, .. } if slot.gpu == g.index => {
                            prop_assert!(!busy.contains(slot), "{} destroys busy {:?}", name, slot);
                            prop_assert!(g.mig_enabled && !g.layout_fixed, "{} changes a fixed layout", name);
                            l.retain(|(p, st)| !(Some(*p) == slot.profile_id && *st == slot.start));
                        }
                        Step::Create { slot } if slot.gpu == g.index => {
                            prop_assert!(g.mig_enabled && !g.layout_fixed, "{} changes a fixed layout", name);
                            l.push((slot.profile_id.expect("a MIG profile"), slot.start));
                        }
                        _ => {}
                    }
                }
                if g.mig_enabled {
                    prop_assert!(layout::validate(&g.model, &l).is_ok(), "{}: gpu {} layout {:?}: {:?}", name, g.index, l, layout::validate(&g.model, &l));
                    // Every placement names an instance of the final layout.
                    for pl in plan.placements.iter().filter(|p| p.slot.gpu == g.index) {
                        prop_assert!(l.contains(&(pl.slot.profile_id.expect("mig"), pl.slot.start)), "{}: {:?} not in layout", name, pl.slot);
                    }
                }
            }

            // Deterministic.
            prop_assert_eq!(p.plan(&case.node, &case.jobs), plan, "{}", name);
        }
    }
}
