//! The search's choices for a job (partitions, shares) and how fast jobs run in them: speeds, caps, the state's advance to the next event.

use mmk_partitioner::PartitionShape;

use super::*;

impl Search<'_> {
    /// Every way `j` can start now.
    pub(super) fn choices(&self, s: &State, j: usize) -> Result<Vec<Choice>, ReferenceError> {
        let mem = self.demands[j].memory_mib;
        let mut out = Vec::new();
        for (g, parts) in s.gpus.iter().enumerate() {
            // GPUs alike (no instance, or the same idle ones) are one choice.
            let idle = |ps: &[Part]| ps.iter().all(|p| p.members.is_empty());
            if idle(parts)
                && s.gpus[..g].iter().any(|other| {
                    idle(other)
                        && other.len() == parts.len()
                        && other.iter().zip(parts).all(|(a, b)| {
                            a.slot.start == b.slot.start && a.slot.profile_id == b.slot.profile_id
                        })
                })
            {
                continue;
            }
            for part in parts {
                let used: u64 = part
                    .members
                    .iter()
                    .map(|&m| self.demands[m].memory_mib)
                    .sum();
                if used + mem <= part.memory_mib {
                    for &share in &self.opts.shares {
                        out.push(self.choice(s, j, g, part.slot, None, share)?);
                    }
                }
            }
            for prof in self
                .model
                .profiles
                .iter()
                .filter(|q| !q.media_extensions && q.memory_mib >= mem)
            {
                // The profile's one place in the class: the highest start that fits
                // beside the busy instances, destroying the fewest idle ones.
                let mut best: Option<(Place, Slot, Vec<Slot>)> = None;
                for &start in &prof.starts {
                    let here = layout::Placement {
                        start,
                        size: prof.memory_slices,
                    };
                    let slot = Slot {
                        gpu: g as u32,
                        start,
                        profile_id: Some(prof.id),
                    };
                    let size = |s: &Slot| {
                        s.profile_id
                            .and_then(|id| self.model.profile(id))
                            .map_or(0, |q| q.memory_slices)
                    };
                    let (over, kept): (Vec<&Part>, Vec<&Part>) = parts.iter().partition(|p| {
                        here.overlaps(layout::Placement {
                            start: p.slot.start,
                            size: size(&p.slot),
                        })
                    });
                    if over.iter().any(|p| !p.members.is_empty()) {
                        continue;
                    }
                    let mut l: Vec<(u32, u8)> = kept
                        .iter()
                        .filter_map(|p| p.slot.profile_id.map(|id| (id, p.slot.start)))
                        .collect();
                    l.push((prof.id, start));
                    if layout::validate(&self.model, &l).is_err() {
                        continue;
                    }
                    let key = (over.len(), std::cmp::Reverse(start));
                    if best.as_ref().is_none_or(|(k, ..)| key < *k) {
                        best = Some((key, slot, over.iter().map(|p| p.slot).collect()));
                    }
                }
                // An idle instance of this profile there already is a join, above.
                if let Some((_, slot, replaced)) = best
                    && !parts.iter().any(|p| p.slot == slot)
                {
                    for &share in &self.opts.shares {
                        out.push(self.choice(
                            s,
                            j,
                            g,
                            slot,
                            Some((prof.memory_mib, replaced.clone())),
                            share,
                        )?);
                    }
                }
            }
        }
        Ok(out)
    }

    pub(super) fn choice(
        &self,
        s: &State,
        j: usize,
        gpu: usize,
        slot: Slot,
        create: Option<(u64, Vec<Slot>)>,
        share: u8,
    ) -> Result<Choice, ReferenceError> {
        let co: Vec<CoRunner> = s.gpus[gpu]
            .iter()
            .find(|p| p.slot == slot && create.is_none())
            .map(|p| {
                p.members
                    .iter()
                    .map(|&m| CoRunner {
                        profile: self.demands[m].profile,
                        mps_share: s.runs[m].share,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let speed = self.speed(j, slot, share, &co)?;
        Ok(Choice {
            gpu,
            slot,
            create,
            share,
            speed,
        })
    }

    /// The most `j` can run at from now on: its cap at its share in its instance once
    /// placed, else in the best instance.
    pub(super) fn cap(&self, j: usize, r: &JobRun) -> f64 {
        match r.slot {
            Some(slot) => self.cap_at(j, slot.profile_id, r.share),
            None => self.fastest[j],
        }
    }

    /// The most `j` can run at, in any company, in an instance of `profile` at `share`.
    pub(super) fn cap_at(&self, j: usize, profile: Option<u32>, share: u8) -> f64 {
        self.caps[j].get(&(profile, share)).copied().unwrap_or(1.0)
    }

    /// Fills `caps` and `fastest`.
    pub(super) fn prepare(&mut self) {
        let mut shares = self.opts.shares.clone();
        shares.push(100);
        let mut caps = Vec::with_capacity(self.demands.len());
        let mut fastest = Vec::with_capacity(self.demands.len());
        for d in &self.demands {
            let mut m = HashMap::new();
            let mut best = 0.0_f64;
            for q in self.model.profiles.iter().filter(|q| !q.media_extensions) {
                let slot = Slot {
                    gpu: 0,
                    start: 0,
                    profile_id: Some(q.id),
                };
                for &share in &shares {
                    let v = self
                        .truth
                        .speed_bound(&d.profile, &self.shape(slot), share)
                        .clamp(1e-6, 1.0);
                    m.insert((Some(q.id), share), v);
                    if q.memory_mib >= d.memory_mib {
                        best = best.max(v);
                    }
                }
            }
            caps.push(m);
            fastest.push(if best > 0.0 { best } else { 1.0 });
        }
        self.caps = caps;
        self.fastest = fastest;
    }

    pub(super) fn shape(&self, slot: Slot) -> PartitionShape {
        let m = &self.model;
        let (sm, mem) = slot
            .profile_id
            .and_then(|id| m.profile(id))
            .map_or((m.sm_count, m.memory_slices), |p| {
                (p.sm_count, p.memory_slices)
            });
        PartitionShape {
            sm_count: sm,
            gpu_sm_count: m.sm_count,
            memory_slices: mem,
            gpu_memory_slices: m.memory_slices,
        }
    }

    /// The truth's speed of `j`, as the engine asks it, checked against the bound's
    /// premise.
    pub(super) fn speed(
        &self,
        j: usize,
        slot: Slot,
        share: u8,
        co: &[CoRunner],
    ) -> Result<f64, ReferenceError> {
        let v = self
            .truth
            .estimate(&self.demands[j].profile, &self.shape(slot), share, co)
            .max(1e-6);
        if v > 1.0 + 1e-9 {
            return Err(ReferenceError::FasterThanAlone {
                job: j as u64 + 1,
                speed: v,
            });
        }
        if v > self.cap_at(j, slot.profile_id, share) + 1e-9 {
            self.premise.set(false);
        }
        Ok(v)
    }

    /// Runs time from a planning moment to the next, as the engine does.
    pub(super) fn advance(&self, s: &mut State) -> Result<Next, ReferenceError> {
        let total = self.trace.jobs.len();
        loop {
            let running: Vec<usize> = s
                .active
                .iter()
                .copied()
                .filter(|&j| s.runs[j].slot.is_some() && s.runs[j].ready_at <= s.now + 1e-9)
                .collect();
            let mut speeds = Vec::with_capacity(running.len());
            for &j in &running {
                let slot = s.runs[j].slot.expect("running jobs have a slot");
                let co: Vec<CoRunner> = running
                    .iter()
                    .filter(|&&k| k != j && s.runs[k].slot == Some(slot))
                    .map(|&k| CoRunner {
                        profile: self.demands[k].profile,
                        mps_share: s.runs[k].share,
                    })
                    .collect();
                let v = self.speed(j, slot, s.runs[j].share, &co)?;
                if !self.demands[j].slo_met(v) {
                    return Ok(Next::Infeasible);
                }
                speeds.push(v);
            }
            let mut t_next = f64::INFINITY;
            if s.next < total {
                t_next = t_next.min(self.trace.jobs[s.next].arrival_s);
            }
            for (k, &j) in running.iter().enumerate() {
                t_next = t_next.min(s.now + s.runs[j].remaining / speeds[k]);
            }
            for &j in &s.active {
                let r = &s.runs[j];
                if r.slot.is_some() && r.ready_at > s.now + 1e-9 {
                    t_next = t_next.min(r.ready_at);
                }
            }
            if t_next.is_infinite() {
                return Ok(if s.active.is_empty() && s.next >= total {
                    Next::Done
                } else {
                    Next::Infeasible
                });
            }
            let dt = t_next - s.now;
            let mut finished = Vec::new();
            for (k, &j) in running.iter().enumerate() {
                s.runs[j].remaining -= speeds[k] * dt;
                if s.runs[j].remaining <= 1e-6 {
                    finished.push(j);
                }
            }
            s.now = t_next;
            let mut dirty = !finished.is_empty();
            if dirty {
                s.active.retain(|j| !finished.contains(j));
                for &j in &finished {
                    s.jct_sum += s.now - self.trace.jobs[j].arrival_s;
                    if let Some(slot) = s.runs[j].slot
                        && let Some(part) = s.gpus[slot.gpu as usize]
                            .iter_mut()
                            .find(|p| p.slot == slot)
                    {
                        part.members.retain(|&m| m != j);
                    }
                }
            }
            dirty |= self.arrive(s);
            if dirty {
                return Ok(if s.active.is_empty() && s.next >= total {
                    Next::Done
                } else {
                    Next::Plan
                });
            }
        }
    }
}
