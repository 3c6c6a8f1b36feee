//! MPSConfig (module docs): the share a new job gets in a partition, and whether joining
//! adds enough throughput (`min_colocation_gain`); steps 2 and 3 ask both.

use mmk_core::JobClass;

use crate::plan::JobDemand;

use super::memo::state_key;
use super::partition::{Member, Part};
use super::{Hybrid, SHARE_STEP};

/// `mps_config`'s answer: the newcomer's share, the partition's STP, the newcomer's own
/// performance.
pub(super) type Config = Result<(u8, f64, f64), Refusal>;

/// How far MPSConfig raises a newcomer's share once every SLO holds.
///
/// The model's predictions are not monotone in the share: on the measured ground truth the
/// forest has ResNet-152 training alone on a 7g.80gb at 0.77 of its solo speed at 50 %,
/// 0.77 at 60 % and 0.95 at 100 %. A raise that stops at the first step that adds nothing
/// stops at 50 %, and a 4g.40gb at 90 % (0.82) then looks better than the whole GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Raise {
    /// 10 % at a time while a step adds STP: what is not taken stays for the jobs that
    /// queue (the node is busy).
    Greedy,
    /// Where more jobs wait than the node has GPUs: as `Greedy`, and past a step that adds
    /// nothing to a higher share that adds at least `plateau_gain` a step
    /// (`HybridOptions::plateau_gain`; without it, as `Greedy`). That queue waits for
    /// memory and GPUs, not for what a share leaves. No online job joins past the shares
    /// (`HybridOptions::online_past_shares`).
    Climb,
    /// Every share up to what is left; the one with the best STP where every SLO holds
    /// (the lowest among equals). For a calm node, where no queue misses what a newcomer
    /// takes (`HybridOptions::best_share_when_calm`).
    Best,
}

/// Why a partition refused a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    Room,
    Slo,
}

impl Hybrid {
    /// MPSConfig: the share of a new job `new` joining `part` (module docs), the
    /// partition's predicted STP with it, and the newcomer's own predicted performance.
    /// `oversubscribe`: the newcomer would wait otherwise (`share_before_waiting`).
    /// `raise`: how far its share grows once every SLO holds.
    pub(super) fn mps_config(
        &self,
        jobs: &[JobDemand],
        part: &Part,
        new: usize,
        oversubscribe: bool,
        raise: Raise,
    ) -> Config {
        let mut key = state_key(jobs, &part.shape, &part.members, Some(new));
        key.push(u64::from(oversubscribe));
        key.push(raise as u64);
        self.recall(
            |m| &mut m.config,
            key,
            || self.compute_mps_config(jobs, part, new, oversubscribe, raise),
        )
    }

    /// With `online_first`, a newcomer in a partition that runs jobs of the other class
    /// has 100 % of its own class (an online newcomer takes all of it that is left). With
    /// `oversubscribe`, a newcomer that finds the partition's shares spent still joins
    /// where no online job runs, as plain MPS would take it (MPS thread percentages are
    /// caps on each client, not reservations): an online one at 100 %, an offline one at
    /// the most an offline job may take (`offline_share_max`). Its share is a cap for its
    /// life, and a crowd is where the model is least sure of what a lower share would give
    /// the others.
    /// A partition with an online job is oversubscribed by an offline newcomer only where
    /// the node keeps its objective at run time (`slo_guarded`), and by an online one only
    /// while the queue is short (`raise` is not `Climb`) and every online job there keeps
    /// its predicted SLO with room to spare (`online_past_shares`); always only where every
    /// predicted SLO holds.
    fn compute_mps_config(
        &self,
        jobs: &[JobDemand],
        part: &Part,
        new: usize,
        oversubscribe: bool,
        raise: Raise,
    ) -> Config {
        if !self.options.share_partitions {
            return self.config_alone(jobs, part, new);
        }
        if part.closed_to(jobs, new) {
            return Err(Refusal::Room);
        }
        let online = jobs[new].class == JobClass::Online;
        let used = |class: JobClass| -> u32 {
            part.members
                .iter()
                .filter(|m| jobs[m.job].class == class)
                .map(|m| u32::from(m.share))
                .sum()
        };
        let online_there = part
            .members
            .iter()
            .any(|m| jobs[m.job].class == JobClass::Online);
        let other_there = part
            .members
            .iter()
            .any(|m| jobs[m.job].class != jobs[new].class);
        let mut left = part.share_left();
        let mut start = SHARE_STEP;
        // A job that would wait, beside online jobs whose objectives hold past the shares:
        // shares are caps, not reservations.
        let guarded = oversubscribe && self.passes_online_shares(online, raise);
        // Whether it joins past the shares beside online jobs (the guard above).
        let mut past_shares = false;
        if self.options.online_first && other_there {
            // Where online and offline jobs meet, each class has 100 % of its own, and the
            // kernel gate holds offline kernels while online ones run. An online newcomer
            // takes all its class leaves, as under plain MPS.
            let own = used(jobs[new].class);
            left = 100u32.saturating_sub(own) as u8;
            if left < SHARE_STEP {
                if !guarded {
                    return Err(Refusal::Room);
                }
                left = 100;
                past_shares = online_there;
            }
            if online {
                start = left;
            }
        } else if left < SHARE_STEP {
            if !oversubscribe || (online_there && !guarded) {
                return Err(Refusal::Room);
            }
            past_shares = online_there;
            left = 100;
            if online {
                start = 100;
            } else if !online_there {
                start = self.options.offline_share_max;
            }
        }
        if !online {
            // What an offline job leaves stays for online jobs that join later.
            left = left.min(self.options.offline_share_max);
        }
        let mut members = part.members.clone();
        members.push(Member {
            job: new,
            share: start,
        });
        let me = members.len() - 1;
        let mut perf = self.predict(jobs, &part.shape, &members);
        // Raise an online job until its SLO holds.
        while !jobs[new].slo_met(perf[me]) {
            if members[me].share + SHARE_STEP > left {
                return Err(Refusal::Slo);
            }
            members[me].share += SHARE_STEP;
            perf = self.predict(jobs, &part.shape, &members);
        }
        if !Self::slos_met(jobs, &members, &perf) {
            // The newcomer breaks a running job's SLO.
            return Err(Refusal::Slo);
        }
        if past_shares && online && !self.slos_keep_room(jobs, &members, &perf) {
            return Err(Refusal::Slo);
        }
        #[cfg(test)]
        if past_shares && online {
            super::tests::count(&super::tests::ONLINE_PAST);
        }
        if past_shares && !self.default_slos_met(jobs, &members, &perf) {
            // Past the shares, an online job that gave no objective is held to the node's.
            return Err(Refusal::Slo);
        }
        // A job that cannot checkpoint keeps its share for life, also once its co-runners
        // have left: it starts at the share that will serve it then, or not here.
        if !online && !jobs[new].movable {
            let floor = self.lasting_share(jobs, part, new);
            if floor > left {
                // It would wait otherwise: past the shares, as plain MPS would take it,
                // where no online job runs or the node keeps their objectives.
                if !oversubscribe || (online_there && !guarded) {
                    return Err(Refusal::Room);
                }
                left = self.options.offline_share_max;
            }
            if floor > members[me].share {
                members[me].share = floor;
                let raised = self.predict(jobs, &part.shape, &members);
                if Self::slos_met(jobs, &members, &raised)
                    && (!online_there || self.default_slos_met(jobs, &members, &raised))
                {
                    perf = raised;
                } else {
                    // Below the floor it would crawl once alone; above it an SLO breaks.
                    return Err(Refusal::Slo);
                }
            }
        }
        let mut stp: f64 = perf.iter().sum();
        let mut best = (members[me].share, stp, perf[me]);
        match raise {
            Raise::Greedy | Raise::Climb => {
                // From the share reached, the next one up that adds STP; climbing, across
                // a plateau or a dip, one that adds `plateau_gain` a step.
                let climb = self.options.plateau_gain.filter(|_| raise == Raise::Climb);
                'raise: loop {
                    let from = best.0;
                    let mut share = from;
                    while share + SHARE_STEP <= left {
                        let needed = match (share == from, climb) {
                            (true, _) => 1e-9,
                            (false, Some(per_step)) => {
                                f64::from((share + SHARE_STEP - from) / SHARE_STEP) * per_step
                            }
                            (false, None) => break,
                        };
                        share += SHARE_STEP;
                        members[me].share = share;
                        let raised = self.predict(jobs, &part.shape, &members);
                        let gain = raised.iter().sum::<f64>() - stp;
                        if gain > needed && Self::slos_met(jobs, &members, &raised) {
                            #[cfg(test)]
                            if share - from > SHARE_STEP {
                                super::tests::count(&super::tests::CLIMBED);
                            }
                            stp += gain;
                            best = (share, stp, raised[me]);
                            continue 'raise;
                        }
                    }
                    break;
                }
            }
            Raise::Best => {
                while members[me].share + SHARE_STEP <= left {
                    members[me].share += SHARE_STEP;
                    let raised = self.predict(jobs, &part.shape, &members);
                    let stp_then: f64 = raised.iter().sum();
                    if Self::slos_met(jobs, &members, &raised) && stp_then > best.1 + 1e-9 {
                        best = (members[me].share, stp_then, raised[me]);
                    }
                }
            }
        }
        Ok(best)
    }

    /// Whether a newcomer (`online` or not) that would wait may join a partition where
    /// online jobs run past the shares: an offline one where the node keeps their
    /// objectives at run time (`slo_guarded`), an online one while no more jobs wait than
    /// the node has GPUs (`online_past_shares`; `raise` is `Climb` otherwise).
    fn passes_online_shares(&self, online: bool, raise: Raise) -> bool {
        if online {
            self.options.online_past_shares.is_some() && raise != Raise::Climb
        } else {
            self.options.slo_guarded.is_some()
        }
    }

    /// Whether every online member keeps its predicted SLO with the room to spare that
    /// `online_past_shares` asks of an online newcomer past the shares (its predicted
    /// performance divided by it still meets the SLO). An online job whose SLO the planner
    /// cannot check (none given, or a latency without its solo latency) is held to the
    /// node's default slowdown (`slo_guarded`) with the same room, and where the node
    /// keeps none, no online job joins it past the shares.
    fn slos_keep_room(&self, jobs: &[JobDemand], members: &[Member], perf: &[f64]) -> bool {
        let spare = self.options.online_past_shares.unwrap_or(1.0).max(1.0);
        members.iter().zip(perf).all(|(m, p)| {
            let j = &jobs[m.job];
            let checkable = j.slo_slowdown.is_some()
                || (j.slo_ms.is_some() && j.profile.solo_latency_ms.is_some());
            match (j.class, checkable, self.options.slo_guarded) {
                (JobClass::Offline, ..) => true,
                (JobClass::Online, true, _) => j.slo_met(p / spare),
                (JobClass::Online, false, Some(slowdown)) => p / spare * slowdown >= 1.0 - 1e-9,
                (JobClass::Online, false, None) => false,
            }
        })
    }

    /// MPSConfig where partitions are not shared: `new` alone in `part` at 100 %, if `part`
    /// runs nothing and its SLO holds there.
    fn config_alone(&self, jobs: &[JobDemand], part: &Part, new: usize) -> Config {
        if !part.members.is_empty() {
            return Err(Refusal::Room);
        }
        let members = [Member {
            job: new,
            share: 100,
        }];
        let perf = self.predict(jobs, &part.shape, &members);
        if Self::slos_met(jobs, &members, &perf) {
            Ok((100, perf.iter().sum(), perf[0]))
        } else {
            Err(Refusal::Slo)
        }
    }

    /// The least share of offline job `new` that `lasting_share` allows in `part`: the
    /// smallest at which, alone there, it is predicted at least that fraction of its speed
    /// at the most an offline job may take (`offline_share_max`); 10 % when the option is
    /// off.
    pub(super) fn lasting_share(&self, jobs: &[JobDemand], part: &Part, new: usize) -> u8 {
        let Some(fraction) = self.options.lasting_share else {
            return SHARE_STEP;
        };
        let alone = |share: u8| {
            self.predict(jobs, &part.shape, &[Member { job: new, share }])
                .first()
                .copied()
                .unwrap_or(0.0)
        };
        let cap = self.options.offline_share_max;
        let key = state_key(jobs, &part.shape, &[], Some(new));
        self.recall(
            |m| &mut m.lasting,
            key,
            || {
                let most = alone(cap);
                (1..=cap / SHARE_STEP)
                    .map(|k| k * SHARE_STEP)
                    .find(|&share| alone(share) >= fraction * most - 1e-12)
                    .unwrap_or(cap)
            },
        )
    }

    /// Whether a newcomer joining `part` adds enough: `gain`, the partition's STP change,
    /// is at least `min_colocation_gain` of `own`, the newcomer's predicted performance
    /// there. A partition without jobs always takes it.
    pub(super) fn adds_enough(&self, part: &Part, own: f64, gain: f64) -> bool {
        part.members.is_empty() || gain >= self.options.min_colocation_gain * own - 1e-12
    }

    /// Whether a partition of `members` jobs runs too many for offline job `j` to join it
    /// in the last resort (`crowd_max`). Online jobs are never kept out by it.
    pub(super) fn crowded(&self, jobs: &[JobDemand], members: usize, j: usize) -> bool {
        jobs[j].class == JobClass::Offline
            && self.options.crowd_max.is_some_and(|max| members >= max)
    }

    /// Whether every online member that gives no objective of its own runs at least at
    /// 1 / the node's default slowdown ([`super::HybridOptions::slo_guarded`]).
    fn default_slos_met(&self, jobs: &[JobDemand], members: &[Member], perf: &[f64]) -> bool {
        let Some(slowdown) = self.options.slo_guarded else {
            return true;
        };
        members.iter().zip(perf).all(|(m, p)| {
            let j = &jobs[m.job];
            j.class != JobClass::Online
                || j.slo_ms.is_some()
                || j.slo_slowdown.is_some()
                || p * slowdown >= 1.0 - 1e-9
        })
    }
}
