//! Moves: the shares of a partition's checkpointable offline jobs chosen again, to make
//! room for a newcomer (step 2) or to grow into room left (step 4), and what moves cost.

use std::collections::BTreeSet;

use mmk_core::JobClass;

use crate::layout::GpuState;
use crate::plan::{JobDemand, NodeState};

use super::memo::state_key;
use super::mps_config::Raise;
use super::partition::{GpuPlan, Member, Part, Progress};
use super::{Hybrid, SHARE_STEP};

/// A rebalance: the members' shares (the newcomer's last), their STP, the newcomer's own
/// performance.
pub(super) type Shares = (Vec<u8>, f64, f64);

impl Hybrid {
    /// MPSConfig over a newcomer and the partition's movable jobs together: the shares of
    /// the jobs that cannot move stay, the rest is shared out again (module docs). With
    /// no newcomer (`None`, step 4) the movable jobs' shares only grow, from what they are,
    /// into the room the partition has.
    /// Returns the members (the newcomer last), their STP, the newcomer's own predicted
    /// performance (0 without one), and the movable jobs whose share changed.
    pub(super) fn rebalance(
        &self,
        jobs: &[JobDemand],
        part: &Part,
        new: Option<usize>,
    ) -> Option<(Vec<Member>, f64, f64, Vec<usize>)> {
        let shares = self.rebalance_shares(jobs, part, new)?;
        Some(rebalanced(jobs, part, new, &shares))
    }

    /// What [`Hybrid::rebalance`] chooses, as shares in the members' order (the
    /// newcomer's last): it depends on the partition's `state_key` and the newcomer's
    /// kind alone.
    pub(super) fn rebalance_shares(
        &self,
        jobs: &[JobDemand],
        part: &Part,
        new: Option<usize>,
    ) -> Option<Shares> {
        self.options.move_cost?;
        if !self.options.share_partitions {
            return None;
        }
        let key = state_key(jobs, &part.shape, &part.members, new);
        self.recall(
            |m| &mut m.rebalance,
            key,
            || self.compute_rebalance(jobs, part, new),
        )
    }

    /// [`Hybrid::rebalance`]'s search: the members' new shares in order (the newcomer's
    /// last), their STP and the newcomer's own predicted performance.
    fn compute_rebalance(
        &self,
        jobs: &[JobDemand],
        part: &Part,
        new: Option<usize>,
    ) -> Option<Shares> {
        let movable = |m: &Member| movable(jobs, m);
        let before: Vec<Member> = part.members.clone();
        let n_movable = before.iter().filter(|m| movable(m)).count();
        if n_movable == 0 || new.is_some_and(|j| part.closed_to(jobs, j)) {
            return None;
        }
        let fixed: u32 = before
            .iter()
            .filter(|m| !movable(m))
            .map(|m| u32::from(m.share))
            .sum();
        let room = 100u32.saturating_sub(fixed);
        let n_adjustable = n_movable as u32 + u32::from(new.is_some());
        if room < u32::from(SHARE_STEP) * n_adjustable {
            return None;
        }
        // With a newcomer the movable jobs start over from the least share; without one
        // they keep theirs and can only grow.
        let mut members: Vec<Member> = before
            .iter()
            .map(|m| Member {
                job: m.job,
                share: if movable(m) && new.is_some() {
                    SHARE_STEP
                } else {
                    m.share
                },
            })
            .collect();
        // A newcomer that cannot checkpoint starts at the share that lasts (`mps_config.rs`).
        let start = |job: usize| {
            if jobs[job].class == JobClass::Offline && !jobs[job].movable {
                self.lasting_share(jobs, part, job)
            } else {
                SHARE_STEP
            }
        };
        let me = new.map(|job| {
            members.push(Member {
                job,
                share: start(job),
            });
            members.len() - 1
        });
        if new
            .is_some_and(|j| u32::from(start(j)) + u32::from(SHARE_STEP) * n_movable as u32 > room)
        {
            return None;
        }
        let adjustable: Vec<usize> = (0..members.len())
            .filter(|&i| Some(i) == me || movable(&members[i]))
            .collect();
        let used =
            |ms: &[Member]| -> u32 { adjustable.iter().map(|&i| u32::from(ms[i].share)).sum() };
        let mut perf = self.predict(jobs, &part.shape, &members);
        if let (Some(new), Some(me)) = (new, me) {
            while !jobs[new].slo_met(perf[me]) {
                if used(&members) + u32::from(SHARE_STEP) > room {
                    return None;
                }
                members[me].share += SHARE_STEP;
                perf = self.predict(jobs, &part.shape, &members);
            }
        }
        if !Self::slos_met(jobs, &members, &perf) {
            return None;
        }
        let mut stp: f64 = perf.iter().sum();
        while used(&members) + u32::from(SHARE_STEP) <= room {
            let mut best: Option<(f64, usize, Vec<f64>)> = None;
            for &i in &adjustable {
                if jobs[members[i].job].class == JobClass::Offline
                    && members[i].share + SHARE_STEP > self.options.offline_share_max
                {
                    continue;
                }
                members[i].share += SHARE_STEP;
                let p = self.predict(jobs, &part.shape, &members);
                let gain = p.iter().sum::<f64>() - stp;
                if Self::slos_met(jobs, &members, &p)
                    && best.as_ref().is_none_or(|(g, ..)| gain > g + 1e-12)
                {
                    best = Some((gain, i, p));
                }
                members[i].share -= SHARE_STEP;
            }
            match best {
                Some((gain, i, p)) if gain > 1e-9 => {
                    members[i].share += SHARE_STEP;
                    stp += gain;
                    perf = p;
                }
                _ => {
                    match self.raise_past_plateau(jobs, part, &mut members, &adjustable, room, stp)
                    {
                        Some((gain, p)) => {
                            stp += gain;
                            perf = p;
                        }
                        None => break,
                    }
                }
            }
        }
        let own = me.map_or(0.0, |me| perf[me]);
        Some((members.iter().map(|m| m.share).collect(), stp, own))
    }

    /// Where no one-step raise of an adjustable member adds STP: the raise of one member
    /// by several steps that adds the most STP a step, when that is at least
    /// `plateau_gain` a step (made in `members`). Returns its gain and the members'
    /// predicted performance.
    fn raise_past_plateau(
        &self,
        jobs: &[JobDemand],
        part: &Part,
        members: &mut [Member],
        adjustable: &[usize],
        room: u32,
        stp: f64,
    ) -> Option<(f64, Vec<f64>)> {
        let per_step = self.options.plateau_gain?;
        let used: u32 = adjustable
            .iter()
            .map(|&i| u32::from(members[i].share))
            .sum();
        let mut best: Option<(f64, usize, u8, f64, Vec<f64>)> = None;
        for &i in adjustable {
            let from = members[i].share;
            let cap = if jobs[members[i].job].class == JobClass::Offline {
                self.options.offline_share_max
            } else {
                100
            };
            let mut share = from + SHARE_STEP;
            while share + SHARE_STEP <= cap && used + u32::from(share + SHARE_STEP - from) <= room {
                share += SHARE_STEP;
                members[i].share = share;
                let p = self.predict(jobs, &part.shape, members);
                let gain = p.iter().sum::<f64>() - stp;
                let steps = f64::from((share - from) / SHARE_STEP);
                if gain >= steps * per_step
                    && Self::slos_met(jobs, members, &p)
                    && best.as_ref().is_none_or(|b| gain / steps > b.3 + 1e-12)
                {
                    best = Some((gain, i, share, gain / steps, p));
                }
            }
            members[i].share = from;
        }
        let (gain, i, share, _, p) = best?;
        #[cfg(test)]
        super::tests::count(&super::tests::CLIMBED);
        members[i].share = share;
        Some((gain, p))
    }

    /// What the moves of a rebalance of `part` to `shares` cost ([`Hybrid::moves_cost`] of
    /// [`rebalanced`]'s moves), without building the new members.
    pub(super) fn moves_cost_of(
        &self,
        jobs: &[JobDemand],
        part: &Part,
        (shares, _, _): &Shares,
        moved: &BTreeSet<usize>,
    ) -> f64 {
        let new = part
            .members
            .iter()
            .zip(shares)
            .filter(|(b, share)| movable(jobs, b) && b.share != **share && !moved.contains(&b.job))
            .count();
        self.options.move_cost.unwrap_or(0.0) * new as f64
    }

    /// What restarting `moves` costs in predicted STP: `move_cost` for each job not already
    /// moved in this plan.
    pub(super) fn moves_cost(&self, moves: &[usize], moved: &BTreeSet<usize>) -> f64 {
        let new = moves.iter().filter(|m| !moved.contains(m)).count();
        self.options.move_cost.unwrap_or(0.0) * new as f64
    }

    /// Step 4 (Algorithm 1, line 6: "when jobs arrive or complete, we update the MPS
    /// settings for offline jobs"): in every partition whose shares leave room (a job
    /// left, or MPSConfig left some), the checkpointable offline jobs' shares are chosen
    /// again (past the model's plateaus: `HybridOptions::plateau_gain`), and they restart
    /// with them when the partition's predicted STP grows by more than the moves cost.
    /// Without this a job keeps the small share it got next to co-runners for its whole
    /// life, also after they leave. In a partition whose shares are spent, `lift` instead
    /// (`HybridOptions::lift_starved`).
    pub(super) fn regrow(&self, jobs: &[JobDemand], p: &mut Progress) {
        if self.options.move_cost.is_none() {
            return;
        }
        for gp in &mut p.plans {
            for part in &mut gp.parts {
                if part.share_left() < SHARE_STEP && self.options.lift_starved {
                    self.lift(jobs, part, &mut p.moved);
                    continue;
                }
                if part.share_left() < SHARE_STEP || !part.members.iter().any(|m| movable(jobs, m))
                {
                    continue;
                }
                let Some((members, stp, _, moves)) = self.rebalance(jobs, part, None) else {
                    continue;
                };
                if stp - self.moves_cost(&moves, &p.moved) - self.part_stp(jobs, part) > 1e-9 {
                    part.members = members;
                    p.moved.extend(moves);
                }
            }
        }
    }
}

impl Hybrid {
    /// Step 4 past spent shares (`HybridOptions::lift_starved`): in `part`, if no online
    /// job runs there, the checkpointable offline job whose raise to the most an offline
    /// job may take (`offline_share_max`) adds the most predicted STP moves to it, when
    /// that adds more than the move costs. MPS shares are caps, not reservations: a job
    /// that joined a crowd at 10 % crawls there while the job beside it at 100 % runs on,
    /// and step 4 above grows shares only into room the partition has.
    fn lift(&self, jobs: &[JobDemand], part: &mut Part, moved: &mut BTreeSet<usize>) {
        if part
            .members
            .iter()
            .any(|m| jobs[m.job].class == JobClass::Online)
        {
            return;
        }
        let cap = self.options.offline_share_max;
        let stp = self.part_stp(jobs, part);
        let mut best: Option<(f64, usize)> = None;
        for i in 0..part.members.len() {
            let m = part.members[i];
            if !movable(jobs, &m) || m.share >= cap || moved.contains(&m.job) {
                continue;
            }
            let mut members = part.members.clone();
            members[i].share = cap;
            let gain = self.perf(jobs, &part.shape, &members).iter().sum::<f64>() - stp;
            if best.is_none_or(|(g, _)| gain > g + 1e-12) {
                best = Some((gain, i));
            }
        }
        if let Some((gain, i)) = best
            && gain - self.options.move_cost.unwrap_or(0.0) > 1e-9
        {
            part.members[i].share = cap;
            moved.insert(part.members[i].job);
            #[cfg(test)]
            super::tests::count(&super::tests::LIFTED);
        }
    }

    /// Step 4b: where nothing waits, each GPU laid out again for the checkpointable offline
    /// jobs it runs (`repartition`), when its predicted STP grows by more than the moves
    /// cost. Without this a job that started in a small instance beside others keeps it
    /// after they leave, at a fraction of its speed (the reference schedule,
    /// docs/results.md, "Distance from the best schedule", found the case: two trainings at
    /// 2.3x and 1.7x their solo time in small instances on GPUs that had emptied around
    /// them).
    pub(super) fn widen(&self, node: &NodeState, jobs: &[JobDemand], p: &mut Progress) {
        if !p.waiting.is_empty() {
            return;
        }
        for (gi, gpu) in node.gpus.iter().enumerate() {
            // Without `repartition_busy` (MMK), only a GPU whose one busy partition, an
            // instance smaller than the GPU, holds checkpointable offline jobs alone: MMK's
            // other steps move jobs of shared GPUs, and asking every GPU made its passes on
            // 128 GPUs three times slower.
            if !self.options.repartition_busy && !self.widens(jobs, &p.plans[gi]) {
                continue;
            }
            let answer = || {
                self.repartition(
                    (gpu, &p.plans[gi]),
                    jobs,
                    &[],
                    &p.kinds,
                    &p.moved,
                    Raise::Best,
                )
                .filter(|(gain, ..)| *gain > 1e-9)
            };
            // The same GPU state comes back pass after pass while its jobs run: whether it
            // pays is remembered by what the answer depends on (the GPU model and mode, its
            // partitions and their jobs, memory included, and which of them moved already).
            let mut key: Vec<u64> = gpu.model.key.bytes().map(u64::from).collect();
            key.push(u64::from(gpu.mig_enabled) << 1 | u64::from(gpu.layout_fixed));
            for x in &p.plans[gi].parts {
                key.push(
                    u64::from(x.slot.profile_id.unwrap_or(u32::MAX)) << 16
                        | u64::from(x.slot.start) << 8
                        | u64::from(x.existing.is_some()),
                );
                key.extend(state_key(jobs, &x.shape, &x.members, None));
                key.extend(
                    x.members
                        .iter()
                        .map(|m| jobs[m.job].memory_mib << 1 | u64::from(p.moved.contains(&m.job))),
                );
            }
            if !self.recall(|m| &mut m.widen, key, || answer().is_some()) {
                continue;
            }
            let Some((_, plan, _, movers)) = answer() else {
                continue;
            };
            {
                let destroyed = std::mem::take(&mut p.plans[gi].destroyed);
                p.plans[gi] = plan;
                p.plans[gi].destroyed.extend(destroyed);
                p.moved.extend(movers);
            }
        }
    }
}

impl Hybrid {
    /// Whether a GPU as planned has one busy partition, an instance smaller than the GPU,
    /// whose jobs are all checkpointable offline ones.
    fn widens(&self, jobs: &[JobDemand], plan: &GpuPlan) -> bool {
        let mut busy = plan.parts.iter().filter(|x| !x.members.is_empty());
        let (Some(part), None) = (busy.next(), busy.next()) else {
            return false;
        };
        part.shape.sm_count < part.shape.gpu_sm_count
            && part
                .members
                .iter()
                .all(|m| movable(jobs, m) && jobs[m.job].class == JobClass::Offline)
    }

    /// A busy GPU laid out again (`HybridOptions::repartition_busy`): the partitions whose
    /// jobs are all checkpointable offline ones emptied, and those jobs (first) and
    /// `waiting` packed into the layout the search finds best on what stays. Returns the
    /// gain over the GPU as planned now, less what the moves cost; the GPU's new plan; the
    /// jobs placed (the moved ones among them); the moved jobs. `None` where nothing on
    /// the GPU can move, its layout cannot change, or the best layout leaves a moved job
    /// out.
    pub(super) fn repartition(
        &self,
        (gpu, now): (&GpuState, &GpuPlan),
        jobs: &[JobDemand],
        waiting: &[usize],
        kinds: &super::kinds::Kinds,
        moved: &BTreeSet<usize>,
        raise: Raise,
    ) -> Option<(f64, GpuPlan, Vec<usize>, Vec<usize>)> {
        if !gpu.mig_enabled || gpu.layout_fixed {
            return None;
        }
        self.options.move_cost?;
        let mut emptied = now.clone();
        let mut movers = Vec::new();
        for part in &mut emptied.parts {
            if !part.members.is_empty()
                && part
                    .members
                    .iter()
                    .all(|m| movable(jobs, m) && jobs[m.job].class == JobClass::Offline)
            {
                movers.extend(part.members.iter().map(|m| m.job));
                part.members.clear();
            }
        }
        if movers.is_empty() {
            return None;
        }
        let stp =
            |plan: &GpuPlan| -> f64 { plan.parts.iter().map(|x| self.part_stp(jobs, x)).sum() };
        let (now_stp, kept_stp) = (stp(now), stp(&emptied));
        // The moved jobs first, largest first, as the search packs: they ran here, so the
        // layouts that hold them come first.
        let mut order = movers.clone();
        order.sort_by_key(|&j| (std::cmp::Reverse(jobs[j].memory_mib), jobs[j].id));
        order.extend(waiting.iter().copied().filter(|j| !movers.contains(j)));
        // Refusals here are not the waiting jobs' reasons: the GPU as it is answers those.
        let mut scratch = vec![false; jobs.len()];
        let (gain, plan, placed) =
            self.best_layout((gpu, &emptied), jobs, &order, kinds, &mut scratch, raise)?;
        if !movers.iter().all(|m| placed.contains(m)) {
            return None;
        }
        // `gain` is over the emptied GPU: over the GPU as it is, the emptied jobs' STP is
        // given up, and each move costs.
        let gain = gain + kept_stp - now_stp - self.moves_cost(&movers, moved);
        Some((gain, plan, placed, movers))
    }
}

/// [`Hybrid::rebalance`]'s answer from its shares: the members (the newcomer last), their
/// STP, the newcomer's own performance, and the movable jobs whose share changed.
pub(super) fn rebalanced(
    jobs: &[JobDemand],
    part: &Part,
    new: Option<usize>,
    (shares, stp, own): &Shares,
) -> (Vec<Member>, f64, f64, Vec<usize>) {
    let members: Vec<Member> = part
        .members
        .iter()
        .map(|m| m.job)
        .chain(new)
        .zip(shares.iter().copied())
        .map(|(job, share)| Member { job, share })
        .collect();
    let moves = part
        .members
        .iter()
        .zip(&members)
        .filter(|(b, a)| movable(jobs, b) && b.share != a.share)
        .map(|(b, _)| b.job)
        .collect();
    (members, *stp, *own, moves)
}

/// A placed job that may be restarted with another share.
pub(super) fn movable(jobs: &[JobDemand], m: &Member) -> bool {
    jobs[m.job].movable && jobs[m.job].placed.is_some()
}

impl Hybrid {
    /// Step 4c, **starved jobs spread**: where nothing waits and at least a third of the
    /// GPUs run nothing, a checkpointable offline job that shares its partition and is
    /// predicted below `spread_below` of its speed alone (alone on the whole GPU, as the
    /// model normalizes) moves to a GPU that runs nothing, into the layout step 3 finds
    /// best for it there, when the two GPUs' predicted STP grows by more than the move
    /// costs and every SLO of the jobs it leaves still holds; one job at a time, the best
    /// move first, checking the third again before each. Without it a training that
    /// started in a crowd kept crawling there while GPUs emptied around it, and set the
    /// makespan.
    pub(super) fn spread(&self, node: &NodeState, jobs: &[JobDemand], p: &mut Progress) {
        let Some(below) = self.options.spread_below else {
            return;
        };
        if self.options.move_cost.is_none() || !p.waiting.is_empty() {
            return;
        }
        loop {
            // Idle GPUs are for the jobs that arrive next, unless a third of them are.
            if super::idle_gpus(&p.plans) * 3 < p.plans.len() {
                return;
            }
            // Idle GPUs in the same state answer alike: ask the first of each.
            let mut seen: BTreeSet<Vec<u64>> = BTreeSet::new();
            let idle: Vec<usize> = (0..p.plans.len())
                .filter(|&gi| p.plans[gi].parts.iter().all(|x| x.members.is_empty()))
                .filter(|&gi| {
                    if !self.shortcuts {
                        return true;
                    }
                    let g = &node.gpus[gi];
                    let mut key: Vec<u64> = g.model.key.bytes().map(u64::from).collect();
                    key.push(u64::from(g.mig_enabled) << 1 | u64::from(g.layout_fixed));
                    key.extend(p.plans[gi].parts.iter().map(|x| {
                        u64::from(x.slot.profile_id.unwrap_or(u32::MAX)) << 8
                            | u64::from(x.slot.start)
                    }));
                    seen.insert(key)
                })
                .collect();
            if idle.is_empty() {
                return;
            }
            let mut best: Option<(f64, usize, usize, usize, usize, GpuPlan)> = None;
            let mut blocked = vec![false; jobs.len()];
            for (gs, gp) in p.plans.iter().enumerate() {
                for (pi, part) in gp.parts.iter().enumerate() {
                    if part.members.len() < 2 {
                        continue;
                    }
                    let perf = self.perf(jobs, &part.shape, &part.members);
                    let now: f64 = perf.iter().sum();
                    for (mi, m) in part.members.iter().enumerate() {
                        let j = m.job;
                        if perf[mi] >= below {
                            continue;
                        }
                        if !movable(jobs, m)
                            || jobs[j].class != JobClass::Offline
                            || p.moved.contains(&j)
                        {
                            continue;
                        }
                        let mut rest = part.clone();
                        rest.members.remove(mi);
                        let rest_perf = self.perf(jobs, &rest.shape, &rest.members);
                        if !Self::slos_met(jobs, &rest.members, &rest_perf) {
                            continue;
                        }
                        let left =
                            rest_perf.iter().sum::<f64>() - now - self.moves_cost(&[j], &p.moved);
                        for &gi in &idle {
                            blocked[j] = false;
                            let Some((gain, plan, placed)) = self.best_layout(
                                (&node.gpus[gi], &p.plans[gi]),
                                jobs,
                                &[j],
                                &p.kinds,
                                &mut blocked,
                                Raise::Best,
                            ) else {
                                continue;
                            };
                            let total = left + gain;
                            if placed.len() == 1
                                && total > 1e-9
                                && best.as_ref().is_none_or(|b| total > b.0 + 1e-9)
                            {
                                best = Some((total, gs, pi, j, gi, plan));
                            }
                        }
                    }
                }
            }
            let Some((_, gs, pi, j, gi, plan)) = best else {
                return;
            };
            #[cfg(test)]
            super::tests::count(&super::tests::SPREAD);
            p.plans[gs].parts[pi].members.retain(|m| m.job != j);
            let destroyed = std::mem::take(&mut p.plans[gi].destroyed);
            p.plans[gi] = plan;
            p.plans[gi].destroyed.extend(destroyed);
            p.moved.insert(j);
        }
    }

    /// Step 4d, **jobs asked to leave**: a checkpointable offline job that the node asks to
    /// leave its partition (`JobDemand::leave`: the SLO control there is at its highest
    /// level and an online job's objective is still at risk) moves to the other GPU where
    /// the layout search places it with the best predicted gain, whatever the gain: the
    /// objective asks for it. One that fits on no other GPU stays.
    pub(super) fn evict(&self, node: &NodeState, jobs: &[JobDemand], p: &mut Progress) {
        if self.options.move_cost.is_none() {
            return;
        }
        loop {
            let mut best: Option<(f64, usize, usize, usize, usize, GpuPlan)> = None;
            let mut blocked = vec![false; jobs.len()];
            for (gs, gp) in p.plans.iter().enumerate() {
                for (pi, part) in gp.parts.iter().enumerate() {
                    for m in &part.members {
                        let j = m.job;
                        if !jobs[j].leave
                            || !movable(jobs, m)
                            || jobs[j].class != JobClass::Offline
                            || p.moved.contains(&j)
                        {
                            continue;
                        }
                        for gi in (0..p.plans.len()).filter(|&gi| gi != gs) {
                            blocked[j] = false;
                            let Some((gain, plan, placed)) = self.best_layout(
                                (&node.gpus[gi], &p.plans[gi]),
                                jobs,
                                &[j],
                                &p.kinds,
                                &mut blocked,
                                Raise::Best,
                            ) else {
                                continue;
                            };
                            if placed.len() == 1 && best.as_ref().is_none_or(|b| gain > b.0 + 1e-9)
                            {
                                best = Some((gain, gs, pi, j, gi, plan));
                            }
                        }
                    }
                }
            }
            let Some((_, gs, pi, j, gi, plan)) = best else {
                return;
            };
            p.plans[gs].parts[pi].members.retain(|m| m.job != j);
            let destroyed = std::mem::take(&mut p.plans[gi].destroyed);
            p.plans[gi] = plan;
            p.plans[gi].destroyed.extend(destroyed);
            p.moved.insert(j);
        }
    }
}
