//! Partitions during the search: what a pass has decided so far, each GPU's partitions
//! and the jobs in them, and what the model predicts of a partition.

use std::collections::{BTreeMap, BTreeSet};

use mmk_core::fasthash::FastMap;

use crate::catalog::GpuModel;
use crate::layout::{GpuState, Placement};
use crate::model::{CoRunner, PartitionShape};
use crate::plan::{JobDemand, NodeState, Slot};

use super::Hybrid;
use super::kinds::Kinds;
use super::memo::state_key;
use super::mps_config::Raise;
use super::mps_first::PartStates;

/// What a pass has decided so far.
#[derive(Debug)]
pub(super) struct Progress {
    pub(super) plans: Vec<GpuPlan>,
    /// Jobs not placed yet (indices into the jobs).
    pub(super) waiting: Vec<usize>,
    /// Jobs refused somewhere only for their SLO.
    pub(super) slo_blocked: Vec<bool>,
    /// Placed jobs the plan restarts with another share.
    pub(super) moved: BTreeSet<usize>,
    /// Started jobs the plan stops for an online job (step 7): (stopped, online job).
    pub(super) preempted: Vec<(usize, usize)>,
    pub(super) kinds: Kinds,
    /// How MPSConfig raises a newcomer's share in this pass.
    pub(super) raise: Raise,
    /// The partition states MPS-first found in this pass.
    pub(super) part_states: PartStates,
    /// The GPU states the layout search numbered in this pass.
    pub(super) gpu_states: GpuStates,
}

/// Per GPU (by its index on the node), the number the layout search gave its state in a
/// pass (`Hybrid::gpu_number`), with the GPU (model and mode) and its partitions (slot,
/// instance, members and shares) as they were then: a pass asks most GPUs again as it
/// left them, once per job that has waited long and tries alone, and once for the rest.
#[derive(Debug, Default)]
pub(super) struct GpuStates(FastMap<u32, (String, u8, Vec<PartNow>, u32)>);

/// A partition as [`GpuStates`] keeps it.
type PartNow = (Slot, Option<u32>, Vec<(usize, u8)>);

impl GpuStates {
    /// The number of `gpu`'s state with plan `now`, numbered again only if its partitions
    /// changed since this pass last numbered it.
    pub(super) fn number(
        &mut self,
        hybrid: &Hybrid,
        jobs: &[JobDemand],
        gpu: &GpuState,
        now: &GpuPlan,
    ) -> u32 {
        let same = |was: &[PartNow]| {
            was.len() == now.parts.len()
                && was
                    .iter()
                    .zip(&now.parts)
                    .all(|((slot, existing, members), p)| {
                        *slot == p.slot
                            && *existing == p.existing
                            && members.len() == p.members.len()
                            && members
                                .iter()
                                .zip(&p.members)
                                .all(|(&(job, share), m)| job == m.job && share == m.share)
                    })
        };
        let mode = u8::from(gpu.mig_enabled) | u8::from(gpu.layout_fixed) << 1;
        if let Some((model, was_mode, was, number)) = self.0.get(&gpu.index)
            && *model == gpu.model.key
            && *was_mode == mode
            && same(was)
        {
            return *number;
        }
        let number = hybrid.gpu_number(jobs, gpu, now);
        let parts = now
            .parts
            .iter()
            .map(|p| {
                let members = p.members.iter().map(|m| (m.job, m.share)).collect();
                (p.slot, p.existing, members)
            })
            .collect();
        self.0
            .insert(gpu.index, (gpu.model.key.clone(), mode, parts, number));
        number
    }
}

/// A job in a partition.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub(super) job: usize,
    pub(super) share: u8,
}

/// A partition during the search.
#[derive(Debug, Clone)]
pub(super) struct Part {
    pub(super) slot: Slot,
    pub(super) shape: PartitionShape,
    pub(super) memory_mib: u64,
    /// The instance exists now (its driver ID); `None`: it would be created.
    pub(super) existing: Option<u32>,
    pub(super) members: Vec<Member>,
}

impl Part {
    pub(super) fn free_mib(&self, jobs: &[JobDemand]) -> u64 {
        let used: u64 = self.members.iter().map(|m| jobs[m.job].memory_mib).sum();
        self.memory_mib.saturating_sub(used)
    }

    /// Whether the newcomer may not join: a job has the partition to itself (`exclusive`),
    /// the newcomer wants to, or the jobs there are another user's.
    pub(super) fn closed_to(&self, jobs: &[JobDemand], new: usize) -> bool {
        self.members
            .iter()
            .any(|m| !jobs[m.job].shares_with(&jobs[new]))
    }

    pub(super) fn share_left(&self) -> u8 {
        let used: u32 = self.members.iter().map(|m| u32::from(m.share)).sum();
        100u32.saturating_sub(used) as u8
    }

    pub(super) fn placement(&self, model: &GpuModel) -> Placement {
        let size = self
            .slot
            .profile_id
            .and_then(|id| model.profile(id))
            .map_or(model.memory_slices, |p| p.memory_slices);
        Placement {
            start: self.slot.start,
            size,
        }
    }
}

/// The partitions of one GPU during the search.
#[derive(Debug, Clone)]
pub(super) struct GpuPlan {
    pub(super) parts: Vec<Part>,
    /// Instances the plan destroys (slot, driver ID).
    pub(super) destroyed: Vec<(Slot, u32)>,
}

pub(super) fn shape_of(gpu: &GpuState, profile_id: Option<u32>) -> (PartitionShape, u64) {
    let m = &gpu.model;
    match profile_id.and_then(|id| m.profile(id)) {
        Some(p) => (
            PartitionShape {
                sm_count: p.sm_count,
                gpu_sm_count: m.sm_count,
                memory_slices: p.memory_slices,
                gpu_memory_slices: m.memory_slices,
            },
            p.memory_mib,
        ),
        None => (
            PartitionShape {
                sm_count: m.sm_count,
                gpu_sm_count: m.sm_count,
                memory_slices: m.memory_slices,
                gpu_memory_slices: m.memory_slices,
            },
            m.memory_mib,
        ),
    }
}

/// A `+me` profile computes like the plain profile of the same slices.
pub(super) fn twin(model: &GpuModel, profile_id: u32) -> u32 {
    match model.profile(profile_id) {
        Some(p) if p.media_extensions => model
            .profiles
            .iter()
            .find(|q| {
                !q.media_extensions
                    && q.compute_slices == p.compute_slices
                    && q.memory_slices == p.memory_slices
            })
            .map_or(profile_id, |q| q.id),
        _ => profile_id,
    }
}

impl Hybrid {
    /// Predicted performance of each member of a partition, in the members' order.
    pub(super) fn perf(
        &self,
        jobs: &[JobDemand],
        shape: &PartitionShape,
        members: &[Member],
    ) -> Vec<f64> {
        if members.is_empty() {
            return Vec::new();
        }
        let key = state_key(jobs, shape, members, None);
        self.recall(|m| &mut m.perf, key, || self.predict(jobs, shape, members))
    }

    /// [`Hybrid::perf`], asked of the model. MPSConfig and the rebalance call this for
    /// each share they try: their own answers are memoized, and remembering every step
    /// of their searches too would fill the memo (which then starts over) with states no
    /// later pass asks.
    pub(super) fn predict(
        &self,
        jobs: &[JobDemand],
        shape: &PartitionShape,
        members: &[Member],
    ) -> Vec<f64> {
        members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let co: Vec<CoRunner> = if self.options.contention_aware {
                    members
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, o)| CoRunner {
                            profile: jobs[o.job].profile,
                            mps_share: o.share,
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                self.model
                    .estimate(&jobs[m.job].profile, shape, m.share, &co)
            })
            .collect()
    }

    /// Whether every online member meets its SLO.
    pub(super) fn slos_met(jobs: &[JobDemand], members: &[Member], perf: &[f64]) -> bool {
        members
            .iter()
            .zip(perf)
            .all(|(m, p)| jobs[m.job].slo_met(*p))
    }

    pub(super) fn part_stp(&self, jobs: &[JobDemand], part: &Part) -> f64 {
        self.perf(jobs, &part.shape, &part.members).iter().sum()
    }

    /// The GPUs' partitions as they are, with the placed jobs in them.
    pub(super) fn current(&self, node: &NodeState, jobs: &[JobDemand]) -> Vec<GpuPlan> {
        // The placed jobs by GPU, in job order.
        let mut placed: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, j) in jobs.iter().enumerate() {
            if let Some(slot) = j.placed {
                placed.entry(slot.gpu).or_default().push(i);
            }
        }
        node.gpus
            .iter()
            .map(|g| {
                let mut parts: Vec<Part> = if g.mig_enabled {
                    g.instances
                        .iter()
                        .map(|i| {
                            let (shape, memory_mib) = shape_of(g, Some(i.profile_id));
                            Part {
                                slot: Slot {
                                    gpu: g.index,
                                    start: i.placement.start,
                                    profile_id: Some(i.profile_id),
                                },
                                shape,
                                memory_mib,
                                existing: Some(i.id),
                                members: Vec::new(),
                            }
                        })
                        .collect()
                } else {
                    let (shape, memory_mib) = shape_of(g, None);
                    vec![Part {
                        slot: Slot {
                            gpu: g.index,
                            start: 0,
                            profile_id: None,
                        },
                        shape,
                        memory_mib,
                        existing: Some(0),
                        members: Vec::new(),
                    }]
                };
                parts.sort_by_key(|p| p.slot);
                for &i in placed.get(&g.index).into_iter().flatten() {
                    let j = &jobs[i];
                    if let Some(p) = j
                        .placed
                        .and_then(|slot| parts.iter_mut().find(|p| p.slot == slot))
                    {
                        p.members.push(Member {
                            job: i,
                            share: j.mps_share,
                        });
                    }
                }
                GpuPlan {
                    parts,
                    destroyed: Vec::new(),
                }
            })
            .collect()
    }
}
