//! Step 3, MIG reconfiguration: a GPU model's maximal layouts, and the candidate layout
//! that places the most for the jobs still waiting on one GPU.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::GpuModel;
use crate::layout::{self, GpuState, Placement};
use crate::plan::{JobDemand, Slot};

use super::Hybrid;
use super::kinds::Kinds;
use super::mps_config::{Raise, Refusal};
use super::partition::{GpuPlan, Member, Part, shape_of, twin};

/// A MIG layout: (profile ID, start slice) per instance.
pub(super) type Layout = Vec<(u32, u8)>;

/// What the layout search asks of a GPU for: the jobs waiting, their kinds (each once)
/// and the set of those kinds' number in the memo's `kind_sets` (`None`: not numbered),
/// the pass's kinds, the SLO marks to set (per job, and per kind for marks the memo
/// gives), and how shares rise.
pub(super) struct Asking<'a> {
    pub(super) waiting: &'a [usize],
    pub(super) kinds: &'a [usize],
    pub(super) set: Option<u32>,
    /// The GPU state's number in the memo's `gpu_ids` (with `set`).
    pub(super) gpu_number: Option<u32>,
    pub(super) of: &'a Kinds,
    pub(super) slo_blocked: &'a mut [bool],
    pub(super) marks: &'a mut [bool],
    pub(super) raise: Raise,
}

/// A GPU's best layout: its gain, the GPU's new plan, the jobs placed.
type Best = (f64, GpuPlan, Vec<usize>);

/// Per kind of job in a pass, whether it was refused (`Some`), and if so whether for an
/// SLO.
type Marks = Vec<Option<bool>>;

/// A candidate: its partitions, and the empty instances it destroys (slot, driver ID).
type Candidate = (Vec<Part>, Vec<(Slot, u32)>);

/// Every maximal layout of `model` built from profiles without media extensions (a `+me`
/// profile computes like its twin; mmk creates the plain one).
pub fn maximal_layouts(model: &GpuModel) -> Vec<Layout> {
    let mut plain = model.clone();
    plain.profiles.retain(|p| !p.media_extensions);
    let all = layout::enumerate(&plain);
    all.into_iter()
        .filter(|l| {
            !plain.profiles.iter().any(|p| {
                p.starts.iter().any(|&s| {
                    let mut more = l.clone();
                    more.push((p.id, s));
                    layout::fits(&plain, &more)
                })
            })
        })
        .collect()
}

impl Hybrid {
    fn candidates(&self, model: &GpuModel) -> Arc<Vec<Layout>> {
        let mut cache = self.layouts.lock().unwrap_or_else(|p| p.into_inner());
        let key = format!(
            "{}/{:?}",
            model.key,
            model.profiles.iter().map(|p| p.id).collect::<Vec<_>>()
        );
        Arc::clone(
            cache
                .entry(key)
                .or_insert_with(|| Arc::new(maximal_layouts(model))),
        )
    }

    /// Candidate part lists for `gpu` (see the comment inside).
    fn layout_candidates(
        &self,
        gpu: &GpuState,
        now: &GpuPlan,
        busy: &[&Part],
        empty: &[&Part],
    ) -> Vec<Candidate> {
        let model = &gpu.model;
        // Candidate part lists: the current layout, then each maximal layout that keeps
        // every busy instance, deduplicated by the profiles it adds, keeping the one with
        // the fewest steps. This is an approximation for speed: two layouts that add the
        // same profiles at other positions predict the same for a job alone in each new
        // instance, but re-packing may fill them differently.
        let mut cands: Vec<Candidate> = vec![(now.parts.clone(), Vec::new())];
        if gpu.mig_enabled && !gpu.layout_fixed {
            let mut seen: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
            for l in self.candidates(model).iter() {
                let keeps_busy = busy.iter().all(|b| {
                    let id = b.slot.profile_id.map(|id| twin(model, id));
                    l.iter().any(|&(p, s)| Some(p) == id && s == b.slot.start)
                });
                if !keeps_busy {
                    continue;
                }
                let mut parts: Vec<Part> = busy.iter().map(|p| (*p).clone()).collect();
                let mut destroyed = Vec::new();
                let mut added = Vec::new();
                for &(pid, start) in l {
                    if busy.iter().any(|b| b.slot.start == start) {
                        continue;
                    }
                    // Reuse an empty instance of the same shape at the same place.
                    if let Some(e) = empty.iter().find(|e| {
                        e.slot.start == start
                            && e.slot.profile_id.map(|id| twin(model, id)) == Some(pid)
                    }) {
                        parts.push((*e).clone());
                        continue;
                    }
                    let (shape, memory_mib) = shape_of(gpu, Some(pid));
                    let slot = Slot {
                        gpu: gpu.index,
                        start,
                        profile_id: Some(pid),
                    };
                    added.push(pid);
                    parts.push(Part {
                        slot,
                        shape,
                        memory_mib,
                        existing: None,
                        members: Vec::new(),
                    });
                }
                // Empty instances that a new one overlaps must go.
                for e in empty {
                    let ep = e.placement(model);
                    let kept = parts.iter().any(|p| p.slot == e.slot);
                    if !kept
                        && parts
                            .iter()
                            .any(|p| p.existing.is_none() && p.placement(model).overlaps(ep))
                    {
                        destroyed.push((e.slot, e.existing.unwrap_or(0)));
                    } else if !kept {
                        parts.push((*e).clone());
                    }
                }
                added.sort_unstable();
                let steps = added.len() + destroyed.len();
                match seen.get(&added) {
                    Some(&k) if cands[k].1.len() + count_new(&cands[k].0, &now.parts) <= steps => {
                        continue;
                    }
                    Some(&k) => cands[k] = (parts, destroyed),
                    None => {
                        seen.insert(added, cands.len());
                        cands.push((parts, destroyed));
                    }
                }
            }
        }
        cands
    }

    /// Step 3 for one GPU (`gpu`, and its plan `now`) and the jobs the layout search has
    /// waiting: [`Hybrid::best_layout`], but where the memo knows that no candidate
    /// layout of this GPU state places a job of the set of kinds waiting, it is not asked again
    /// (one of the planner's shortcuts, `Hybrid::shortcuts`). Under a long queue most GPUs
    /// are full and most passes place nothing there: asking each again cost a third of a
    /// pass.
    pub(super) fn best_layout_for(
        &self,
        (gpu, now): (&GpuState, &GpuPlan),
        jobs: &[JobDemand],
        a: Asking<'_>,
    ) -> Option<(f64, GpuPlan, Vec<usize>)> {
        let Asking {
            waiting,
            kinds: waiting_kinds,
            set,
            gpu_number,
            of: kinds,
            slo_blocked,
            marks,
            raise,
        } = a;
        let (Some(set), Some(number)) = (set.filter(|_| self.shortcuts), gpu_number) else {
            return self
                .layouts((gpu, now), jobs, waiting, kinds, slo_blocked, raise)
                .0;
        };
        let key = (number, set, raise as u32);
        let known = {
            let memo = self.memo();
            (memo.generation == kinds.generation)
                .then(|| memo.unplaced.get(&key).cloned())
                .flatten()
        };
        if let Some(refused_for_slo) = known {
            for &k in waiting_kinds {
                marks[k] |= refused_for_slo.contains(&kinds.kind_number(k));
            }
            #[cfg(test)]
            super::tests::count(&super::tests::LAYOUTS_SKIPPED);
            return None;
        }
        let (best, unplaced) = self.layouts((gpu, now), jobs, waiting, kinds, slo_blocked, raise);
        // Every waiting kind was asked (and refused) in every candidate.
        if let Some(u) = unplaced.filter(|u| waiting_kinds.iter().all(|&k| u[k].is_some())) {
            let refused_for_slo = waiting_kinds
                .iter()
                .filter(|&&k| u[k] == Some(true))
                .map(|&k| kinds.kind_number(k))
                .collect();
            let mut memo = self.memo();
            if memo.generation == kinds.generation {
                memo.unplaced.insert(key, refused_for_slo);
            }
        }
        best
    }

    /// Step 3 for one GPU (`gpu`, and its plan `now`): the best candidate layout for the
    /// waiting jobs, as (score gain over the GPU as it is, the GPU's new plan, jobs
    /// placed).
    pub(super) fn best_layout(
        &self,
        (gpu, now): (&GpuState, &GpuPlan),
        jobs: &[JobDemand],
        waiting: &[usize],
        kinds: &Kinds,
        slo_blocked: &mut [bool],
        raise: Raise,
    ) -> Option<(f64, GpuPlan, Vec<usize>)> {
        self.layouts((gpu, now), jobs, waiting, kinds, slo_blocked, raise)
            .0
    }

    /// [`Hybrid::best_layout`], and, where no candidate placed any job, per kind (within
    /// the pass) whether it was refused there and if so whether for an SLO: then each
    /// kind was asked of the same partitions alone, and the answer holds for any jobs of
    /// those kinds.
    fn layouts(
        &self,
        (gpu, now): (&GpuState, &GpuPlan),
        jobs: &[JobDemand],
        waiting: &[usize],
        kinds: &Kinds,
        slo_blocked: &mut [bool],
        raise: Raise,
    ) -> (Option<Best>, Option<Marks>) {
        // Per kind, OR over the candidates: refused (for an SLO) in each, while none
        // placed a job.
        let mut unplaced: Option<Marks> = Some(vec![None; kinds.count()]);
        let base: f64 = now.parts.iter().map(|p| self.part_stp(jobs, p)).sum();
        let model = &gpu.model;
        let busy: Vec<&Part> = now.parts.iter().filter(|p| !p.members.is_empty()).collect();
        let empty: Vec<&Part> = now.parts.iter().filter(|p| p.members.is_empty()).collect();

        let cands = self.layout_candidates(gpu, now, &busy, &empty);

        let mut best: Option<(f64, usize, GpuPlan, Vec<usize>)> = None;
        for (mut parts, destroyed) in cands {
            // Re-pack into empty partitions first, then into busy ones.
            parts.sort_by_key(|p| (!p.members.is_empty(), p.slot));
            // Each partition's predicted STP as packed so far, asked when first needed.
            let mut part_stp: Vec<Option<f64>> = vec![None; parts.len()];
            // Each partition's number (`Hybrid::part_number`), as packed so far: the memo
            // answers by it cheaply (with the shortcuts only).
            let mut part_ids: Vec<Option<u32>> = vec![None; parts.len()];
            let mut placed = Vec::new();
            // As in MPS-first: a kind of job refused since the last placement stays out.
            let mut refused = kinds.none_refused(self.shortcuts);
            for &j in waiting {
                if refused.skip(j, slo_blocked) {
                    continue;
                }
                let mut refused_for_slo = false;
                let mut done = false;
                for (k, part) in parts.iter_mut().enumerate() {
                    if part.free_mib(jobs) < jobs[j].memory_mib {
                        continue;
                    }
                    let ask = || self.mps_config(jobs, part, j, false, raise);
                    let config = if self.shortcuts {
                        let id = *part_ids[k].get_or_insert_with(|| self.part_number(jobs, part));
                        self.config_by_number(
                            kinds.generation,
                            (id, kinds.number(j), raise as u32),
                            ask,
                        )
                    } else {
                        ask()
                    };
                    match config {
                        Ok((share, stp, own)) => {
                            let before = match (part.members.is_empty(), part_stp[k]) {
                                (true, _) => 0.0,
                                (false, Some(v)) => v,
                                (false, None) => self.part_stp(jobs, part),
                            };
                            if !self.adds_enough(part, own, stp - before) {
                                part_stp[k] = Some(before);
                                continue;
                            }
                            part.members.push(Member { job: j, share });
                            part_stp[k] = Some(stp);
                            part_ids[k] = None;
                            placed.push(j);
                            done = true;
                            break;
                        }
                        Err(Refusal::Slo) => refused_for_slo = true,
                        Err(Refusal::Room) => {}
                    }
                }
                if done {
                    refused.placed();
                } else {
                    slo_blocked[j] |= refused_for_slo;
                    refused.refuse(j, refused_for_slo);
                }
            }
            if placed.is_empty() {
                if let Some(u) = &mut unplaced {
                    for (u, m) in u.iter_mut().zip(refused.marks()) {
                        *u = match (*u, *m) {
                            (Some(a), Some(b)) => Some(a || b),
                            (a, b) => a.or(b),
                        };
                    }
                }
                continue;
            }
            unplaced = None;
            // New instances that got no job are not created.
            parts.retain(|p| p.existing.is_some() || !p.members.is_empty());
            let mut destroyed = destroyed;
            destroyed.retain(|(s, _)| {
                let sp = Placement {
                    start: s.start,
                    size: s
                        .profile_id
                        .and_then(|id| model.profile(id))
                        .map_or(0, |p| p.memory_slices),
                };
                parts
                    .iter()
                    .any(|p| p.existing.is_none() && p.placement(model).overlaps(sp))
            });
            // Empty instances that stayed out of the way of the used new ones are kept.
            for e in &empty {
                let ep = e.placement(model);
                let gone = destroyed.iter().any(|(s, _)| *s == e.slot);
                let present = parts.iter().any(|p| p.slot == e.slot);
                if !gone && !present && !parts.iter().any(|p| p.placement(model).overlaps(ep)) {
                    parts.push((*e).clone());
                }
            }
            let layout_ids: Vec<(u32, u8)> = parts
                .iter()
                .filter_map(|p| p.slot.profile_id.map(|id| (id, p.slot.start)))
                .collect();
            if gpu.mig_enabled && !layout::fits(model, &layout_ids) {
                continue;
            }
            let steps = count_new(&parts, &now.parts) + destroyed.len();
            let stp: f64 = parts.iter().map(|p| self.part_stp(jobs, p)).sum();
            let gain = stp - self.options.reconfig_cost * steps as f64 - base;
            let better = match &best {
                None => true,
                Some((g, s, ..)) => gain > *g + 1e-9 || ((gain - *g).abs() <= 1e-9 && steps < *s),
            };
            if better {
                parts.sort_by_key(|p| p.slot);
                best = Some((gain, steps, GpuPlan { parts, destroyed }, placed));
            }
        }
        (
            best.map(|(gain, _, plan, placed)| (gain, plan, placed)),
            unplaced,
        )
    }
}

/// Instances a candidate creates beyond those `now` already plans (an earlier round of
/// the same pass may have planned some; they are paid for once).
fn count_new(parts: &[Part], now: &[Part]) -> usize {
    parts
        .iter()
        .filter(|p| p.existing.is_none() && !now.iter().any(|q| q.slot == p.slot))
        .count()
}
