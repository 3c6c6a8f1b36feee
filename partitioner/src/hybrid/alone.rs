//! A job alone: where a waiting job could have an instance of its own, and the most it
//! would add there, which MPS-first (step 2) weighs against sharing.

use mmk_core::fasthash::FastSet;

use crate::catalog::GpuModel;
use crate::layout::{self, Placement};
use crate::plan::{JobDemand, NodeState};

use super::Hybrid;
use super::partition::{GpuPlan, Part, shape_of, twin};

impl Hybrid {
    /// Where a waiting job could run alone without sharing: per GPU, each profile an
    /// instance could have on slices that no job uses (free slices, or slices of instances
    /// without jobs), as (GPU index, profile ID or `None` for a GPU with MIG off, steps).
    /// Steps is the fewest reconfiguration steps it takes: 0 for an empty instance of that
    /// profile that exists, else 1 for the new instance plus each empty instance in its way.
    /// With the shortcuts, one option of each instance shape, memory and steps.
    pub(super) fn solo_options(
        &self,
        node: &NodeState,
        plans: &[GpuPlan],
    ) -> Vec<(usize, Option<u32>, usize)> {
        let mut out = Vec::new();
        for (gi, (g, gp)) in node.gpus.iter().zip(plans).enumerate() {
            let model = &g.model;
            let empty: Vec<&Part> = gp.parts.iter().filter(|p| p.members.is_empty()).collect();
            if !g.mig_enabled || g.layout_fixed {
                // Only the instances there are (or the whole GPU).
                for e in empty {
                    out.push((gi, e.slot.profile_id.map(|id| twin(model, id)), 0));
                }
                continue;
            }
            let mut busy: Vec<(u32, u8)> = gp
                .parts
                .iter()
                .filter(|p| !p.members.is_empty())
                .filter_map(|p| p.slot.profile_id.map(|id| (id, p.slot.start)))
                .collect();
            // The slices busy instances take: an instance on any of them cannot fit (most
            // GPUs of a node under a long queue have no slice free).
            let taken = taken(model, &busy);
            for p in model.profiles.iter().filter(|p| !p.media_extensions) {
                let steps = p
                    .starts
                    .iter()
                    .filter(|&&s| {
                        if taken & slices(s, p.memory_slices) != 0 {
                            return false;
                        }
                        busy.push((p.id, s));
                        let fits = layout::fits(model, &busy);
                        busy.pop();
                        fits
                    })
                    .map(|&s| {
                        let here = Placement {
                            start: s,
                            size: p.memory_slices,
                        };
                        if empty.iter().any(|e| {
                            e.slot.start == s
                                && e.slot.profile_id.map(|id| twin(model, id)) == Some(p.id)
                        }) {
                            0
                        } else {
                            1 + empty
                                .iter()
                                .filter(|e| e.placement(model).overlaps(here))
                                .count()
                        }
                    })
                    .min();
                if let Some(steps) = steps {
                    out.push((gi, Some(p.id), steps));
                }
            }
        }
        // What a job adds in an option depends on the instance's shape and memory and the
        // steps alone (`best_alone`): one option of each is enough.
        let mut seen = FastSet::default();
        out.retain(|&(gi, profile, steps)| {
            if !self.shortcuts {
                return true;
            }
            let (shape, memory_mib) = shape_of(&node.gpus[gi], profile);
            let shape = (
                shape.sm_count,
                shape.gpu_sm_count,
                shape.memory_slices,
                shape.gpu_memory_slices,
            );
            seen.insert((shape, memory_mib, steps))
        });
        out
    }

    /// The most a job would add alone, at a full share, in an instance of its own
    /// (`options`, from [`Hybrid::solo_options`]), minus the reconfiguration cost of
    /// making it; `None` when none holds it.
    pub(super) fn best_alone(
        &self,
        node: &NodeState,
        options: &[(usize, Option<u32>, usize)],
        jobs: &[JobDemand],
        j: usize,
    ) -> Option<f64> {
        let job = &jobs[j];
        let mut best: Option<f64> = None;
        for &(gi, profile, steps) in options {
            let (shape, memory_mib) = shape_of(&node.gpus[gi], profile);
            if memory_mib < job.memory_mib {
                continue;
            }
            let perf = self.model.estimate(&job.profile, &shape, 100, &[]);
            if !job.slo_met(perf) {
                continue;
            }
            let gain = perf - self.options.reconfig_cost * steps as f64;
            if best.is_none_or(|b| gain > b) {
                best = Some(gain);
            }
        }
        best
    }
}

/// The memory slices instances `(profile ID, start)` of `model` take, as bits of a word.
pub(super) fn taken(model: &GpuModel, instances: &[(u32, u8)]) -> u64 {
    instances
        .iter()
        .filter_map(|&(id, start)| model.profile(id).map(|p| slices(start, p.memory_slices)))
        .fold(0, |a, b| a | b)
}

/// Slices `start..start + size` as bits of a word (slices past 63 are not marked).
pub(super) fn slices(start: u8, size: u8) -> u64 {
    (u32::from(start)..u32::from(start) + u32::from(size))
        .filter(|&s| s < 64)
        .fold(0, |a, s| a | 1 << s)
}
