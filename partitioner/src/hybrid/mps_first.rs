//! Step 2, MPS first: each waiting job into the existing partition where it adds the most
//! predicted throughput.

use std::collections::BTreeSet;

use mmk_core::fasthash::FastMap;

use crate::plan::{JobDemand, NodeState, Slot};

use super::Hybrid;
use super::kinds::Kinds;
use super::memo::Memo;
use super::memo::state_key;
use super::mps_config::{Config, Raise, Refusal};
use super::partition::{GpuPlan, Member, Progress};
use super::rebalance::{Shares, rebalanced};

/// Where MPS-first puts a job.
struct Choice {
    gain: f64,
    /// The partition's position among those asked.
    pos: usize,
    gpu: usize,
    part: usize,
    how: Join,
}

/// How a job joins a partition.
enum Join {
    /// Beside its jobs as they are, with this share.
    At(u8),
    /// With the partition's new members (the newcomer last) and the jobs that move.
    Moving(Vec<Member>, Vec<usize>),
}

/// What a kind of job joining a partition state comes to, as `choose` weighs it: the gain
/// of joining as it is (with its share) and of joining with a rebalance, each where it is
/// allowed, and whether an SLO refused it. Like the memo's answers it depends on the state,
/// the kind and the round's flags alone, so the memo keeps it by their numbers
/// (`Memo::verdicts`), and a round's choice reads a list, not a map entry per partition.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Verdict {
    bits: u8,
    share: u8,
    at: f64,
    moving: f64,
}

impl Verdict {
    const KNOWN: u8 = 1;
    const AT: u8 = 2;
    const MOVING: u8 = 4;
    const SLO: u8 = 8;

    fn judged() -> Verdict {
        Verdict {
            bits: Verdict::KNOWN,
            ..Verdict::default()
        }
    }

    fn known(&self) -> bool {
        self.bits & Verdict::KNOWN != 0
    }

    fn join_at(&mut self, share: u8, gain: f64) {
        self.bits |= Verdict::AT;
        (self.share, self.at) = (share, gain);
    }

    fn join_moving(&mut self, gain: f64) {
        self.bits |= Verdict::MOVING;
        self.moving = gain;
    }

    fn refused_for_slo(&mut self) {
        self.bits |= Verdict::SLO;
    }

    /// Joining as it is: the share and the gain.
    fn at(&self) -> Option<(u8, f64)> {
        (self.bits & Verdict::AT != 0).then_some((self.share, self.at))
    }

    /// Joining with a rebalance: the gain, net of the moves.
    fn moving(&self) -> Option<f64> {
        (self.bits & Verdict::MOVING != 0).then_some(self.moving)
    }

    fn slo(&self) -> bool {
        self.bits & Verdict::SLO != 0
    }
}

/// What `distinct_parts` found of a partition, kept until a placement changes it.
#[derive(Debug, Clone)]
struct PartState {
    /// Its state's number in the memo's `state_ids` (its `state_key`, then its free memory
    /// and which members moved in this pass), and the memo's generation then: two states
    /// numbered in one generation are the same state when their numbers are.
    id: u32,
    generation: u64,
    free_mib: u64,
    /// Its predicted STP as it is.
    stp: f64,
}

/// Per GPU and partition, its [`PartState`] (`None`: to be found again).
type Known = Vec<Vec<Option<PartState>>>;

/// The [`PartState`]s a pass found, by slot, with the members (job, share, moved in this
/// pass) they were found for: MPS-first's rounds of a pass (and step 0's, per aged job)
/// find most partitions as the round before left them.
#[derive(Debug, Default)]
pub(super) struct PartStates {
    by_slot: FastMap<Slot, (Vec<MemberNow>, PartState)>,
    /// Per state number, the last call of `distinct_parts` that asked it, and the
    /// generation of the number: a state is asked once per call (at least once, should
    /// another pass start the memo over within this one).
    asked: Vec<(u64, u64)>,
    calls: u64,
}

/// A member as a partition's state was found for: job, share, moved in this pass.
type MemberNow = (usize, u8, bool);

/// What a round of MPS-first asks partitions with.
struct Round<'a> {
    jobs: &'a [JobDemand],
    plans: &'a [GpuPlan],
    moved: &'a BTreeSet<usize>,
    kinds: &'a Kinds,
    raise: Raise,
    /// `last_resort` and `raise`, as the memo's answers are keyed.
    flags: u32,
    defer: bool,
    last_resort: bool,
}

/// A partition MPS-first asks (one of each state), with what does not depend on the job.
struct Asked {
    gpu: usize,
    part: usize,
    /// Its state's number in the memo's `state_ids`.
    id: u32,
    free_mib: u64,
    /// The partition's predicted STP as it is.
    stp: f64,
    /// How many jobs it runs.
    members: usize,
}

impl Hybrid {
    /// Step 2: each waiting job into the existing partition where it adds the most STP,
    /// re-choosing the shares of the partition's checkpointable offline jobs when that
    /// pays for their restart (Algorithm 1, line 9; docs/architecture.md, item 8). `last_resort`: the
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
            part_states,
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
        // The partitions to ask, one of each state, with their free memory and predicted
        // STP (rebuilt after each placement).
        let mut known: Known = plans.iter().map(|gp| vec![None; gp.parts.len()]).collect();
        let mut asked = self.distinct_parts(jobs, plans, moved, (&mut known, part_states));
        let mut asked_id = self.asked_number(&asked, kinds.generation);
        let flags = u32::from(last_resort) | (*raise as u32) << 1;
        for &j in waiting.iter() {
            if refused.skip(j, slo_blocked) {
                still.push(j);
                continue;
            }
            let round = Round {
                jobs,
                plans,
                moved,
                kinds,
                raise: *raise,
                flags,
                defer,
                last_resort,
            };
            let (best, slo_here) = self.choose_remembered(&round, &asked, asked_id, j);
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
                Some(c) if carve.is_none_or(|carve| carve <= c.gain + 1e-9) => {
                    let members = &mut plans[c.gpu].parts[c.part].members;
                    match c.how {
                        Join::At(share) => members.push(Member { job: j, share }),
                        Join::Moving(all, moves) => {
                            *members = all;
                            moved.extend(moves);
                        }
                    }
                    refused.placed();
                    known[c.gpu][c.part] = None;
                    asked = self.distinct_parts(jobs, plans, moved, (&mut known, part_states));
                    asked_id = self.asked_number(&asked, kinds.generation);
                }
                _ => {
                    refused.refuse(j, slo_here);
                    still.push(j);
                }
            }
        }
        *waiting = still;
    }

    /// The number of the states `asked`, in order, in the memo's `asked_ids`, if the
    /// shortcuts are on and the memo is still in `generation`.
    fn asked_number(&self, asked: &[Asked], generation: u64) -> Option<u32> {
        if !self.shortcuts {
            return None;
        }
        let key: Vec<u64> = asked.iter().map(|a| u64::from(a.id)).collect();
        let mut memo = self.memo();
        (memo.generation == generation).then(|| memo.number_asked(&key))
    }

    /// [`Hybrid::choose`] over `asked`, remembered by the states asked (`asked_id`), the
    /// job's kind and the round's flags: the choice depends on nothing else
    /// (`distinct_parts`), and a pass asks it again in each of its MPS-first rounds, as
    /// the next pass does while the partitions stay as they are. A remembered choice is
    /// made again from its one partition.
    fn choose_remembered(
        &self,
        r: &Round<'_>,
        asked: &[Asked],
        asked_id: Option<u32>,
        j: usize,
    ) -> (Option<Choice>, bool) {
        let Some(asked_id) = asked_id else {
            return self.choose(r, asked, j, None);
        };
        let key = (
            asked_id,
            r.kinds.number(j),
            r.flags | u32::from(r.defer) << 3,
        );
        let remembered = {
            let memo = self.memo();
            (memo.generation == r.kinds.generation)
                .then(|| memo.choices.get(&key).copied())
                .flatten()
        };
        if let Some((chosen, slo_here)) = remembered {
            #[cfg(test)]
            super::tests::count(&super::tests::CHOICES_RECALLED);
            let best = chosen.and_then(|(pos, moving)| {
                let (c, _) = self.choose(r, &asked[pos as usize..=pos as usize], j, Some(moving));
                c.map(|c| Choice {
                    pos: pos as usize,
                    ..c
                })
            });
            return (best, slo_here);
        }
        let (best, slo_here) = self.choose(r, asked, j, None);
        let chosen = best
            .as_ref()
            .map(|c| (c.pos as u32, matches!(c.how, Join::Moving(..))));
        let mut memo = self.memo();
        if memo.generation == r.kinds.generation {
            memo.choices.insert(key, (chosen, slo_here));
        }
        (best, slo_here)
    }

    /// Where job `j` joins best among the partitions `asked`, and whether one refused it
    /// for an SLO. `only`: consider joining as it is (`false`) or with a rebalance
    /// (`true`) alone.
    fn choose(
        &self,
        r: &Round<'_>,
        asked: &[Asked],
        j: usize,
        only: Option<bool>,
    ) -> (Option<Choice>, bool) {
        let &Round {
            jobs,
            plans,
            kinds,
            flags,
            defer,
            last_resort,
            ..
        } = r;
        let key = (kinds.number(j), flags);
        let mut verdicts = self.verdicts(kinds.generation, key, asked);
        let mut fresh = Vec::new();
        // Strictly better (by more than a tolerance) only: of equal gains the first
        // partition's stays, which is what lets `distinct_parts` ask one of each state.
        // The gain, the position, and the share of a join as it is (`None`: a rebalance).
        let mut best: Option<(f64, usize, Option<u8>)> = None;
        let mut slo_here = false;
        for (pos, a) in asked.iter().enumerate() {
            if a.free_mib < jobs[j].memory_mib {
                continue;
            }
            // An instance without jobs is the layout search's to keep, reshape or share
            // out among several waiting jobs; MPS-first takes it only for a job that
            // search left waiting.
            if defer && a.members == 0 {
                continue;
            }
            if last_resort && self.crowded(jobs, a.members, j) {
                #[cfg(test)]
                super::tests::count(&super::tests::CROWDED);
                continue;
            }
            if verdicts[pos].known() {
                #[cfg(test)]
                super::tests::count(&super::tests::VERDICTS_RECALLED);
            } else {
                verdicts[pos] = self.verdict(r, a, j);
                fresh.push((a.id, verdicts[pos]));
            }
            let v = verdicts[pos];
            slo_here |= v.slo();
            let beats = |gain: f64, best: &Option<(f64, usize, Option<u8>)>| {
                best.is_none_or(|(b, _, _)| gain > b + 1e-12)
            };
            if let Some((share, gain)) = v.at().filter(|_| only != Some(true))
                && beats(gain, &best)
            {
                best = Some((gain, pos, Some(share)));
            }
            if let Some(gain) = v.moving().filter(|_| only != Some(false))
                && beats(gain, &best)
            {
                best = Some((gain, pos, None));
            }
        }
        if self.shortcuts && !fresh.is_empty() {
            self.memo().remember_verdicts(kinds.generation, key, &fresh);
        }
        let choice = best.and_then(|(gain, pos, share)| {
            let a = &asked[pos];
            let how = match share {
                Some(share) => Join::At(share),
                // Only a chosen rebalance builds its members.
                None => {
                    let part = &plans[a.gpu].parts[a.part];
                    let shares = self.rebalance_shares(jobs, part, Some(j))?;
                    let (members, _, _, moves) = rebalanced(jobs, part, Some(j), &shares);
                    Join::Moving(members, moves)
                }
            };
            Some(Choice {
                gain,
                pos,
                gpu: a.gpu,
                part: a.part,
                how,
            })
        });
        (choice, slo_here)
    }

    /// The verdicts the memo keeps for the kind and flags of `key` on the states `asked`,
    /// in order (not known where it keeps none, and everywhere without the shortcuts).
    fn verdicts(&self, generation: u64, key: (u32, u32), asked: &[Asked]) -> Vec<Verdict> {
        let memo = self.shortcuts.then(|| self.memo());
        let list = memo
            .as_ref()
            .filter(|m| m.generation == generation)
            .and_then(|m| m.verdicts.get(&key));
        asked
            .iter()
            .map(|a| {
                list.and_then(|l| l.get(a.id as usize))
                    .copied()
                    .unwrap_or_default()
            })
            .collect()
    }

    /// What job `j` joining partition `a` comes to ([`Verdict`]): `mps_config` and
    /// `rebalance_shares` on the partition's state (remembered in the memo's answers),
    /// judged against its STP as it is.
    fn verdict(&self, r: &Round<'_>, a: &Asked, j: usize) -> Verdict {
        let &Round {
            jobs,
            plans,
            moved,
            kinds,
            raise,
            flags,
            last_resort,
            ..
        } = r;
        let part = &plans[a.gpu].parts[a.part];
        let now = a.stp;
        let judge = |config: &Config, shares: Option<&Shares>| {
            let mut v = Verdict::judged();
            match *config {
                Ok((share, stp, own)) => {
                    let gain = stp - now;
                    if last_resort || self.adds_enough(part, own, gain) {
                        v.join_at(share, gain);
                    }
                }
                Err(Refusal::Slo) => v.refused_for_slo(),
                Err(Refusal::Room) => {}
            }
            if let Some(shares) = shares {
                let (_, stp, own) = *shares;
                // A move must pay for its restart.
                let gain = stp - self.moves_cost_of(jobs, part, shares, moved) - now;
                if gain > 0.0 && (last_resort || self.adds_enough(part, own, gain)) {
                    v.join_moving(gain);
                }
            }
            v
        };
        let key = (a.id, kinds.number(j), flags);
        if self.shortcuts {
            let memo = self.memo();
            if let Some((config, shares)) = memo.answer(kinds.generation, &key) {
                return judge(config, shares.as_ref());
            }
        }
        let config = self.mps_config(jobs, part, j, last_resort, raise);
        let shares = self.rebalance_shares(jobs, part, Some(j));
        let v = judge(&config, shares.as_ref());
        if self.shortcuts {
            self.memo()
                .remember_answer(kinds.generation, key, (config, shares));
        }
        v
    }

    /// The partitions of `plans`, in order, but only the first of those in the same state:
    /// the same shape and members' profiles, classes, SLOs, shares, movability and
    /// exclusivity (`state_key`), the same free memory, and the same members already moved
    /// in this pass. What MPS-first asks of a partition depends on nothing else: the
    /// memory check on its free memory, `mps_config`, `rebalance` and `part_stp` on its
    /// `state_key` (they are memoized by it), `moves_cost` on the moved members. So a later
    /// partition in the same state gives the same gains, which never beat the first's
    /// (`choose` takes only a strictly better gain). This holds only while those answers
    /// depend on the state key alone. Without the shortcuts, every partition. (States are
    /// told apart by their numbers: should another pass make the memo start over within
    /// this one, a state numbered again is asked twice, which changes no choice.)
    ///
    /// `known` keeps each partition's [`PartState`] between calls; a partition that
    /// changes must be forgotten there. `found` keeps them for the pass, by slot and
    /// members: a partition found as it was is not asked its state again.
    fn distinct_parts(
        &self,
        jobs: &[JobDemand],
        plans: &[GpuPlan],
        moved: &BTreeSet<usize>,
        (known, found): (&mut Known, &mut PartStates),
    ) -> Vec<Asked> {
        for (gi, gp) in plans.iter().enumerate() {
            for (pi, part) in gp.parts.iter().enumerate() {
                if known[gi][pi].is_some() {
                    continue;
                }
                let now = |m: &Member| (m.job, m.share, moved.contains(&m.job));
                if let Some((was, state)) = found.by_slot.get(&part.slot)
                    && self.shortcuts
                    && was.len() == part.members.len()
                    && was.iter().zip(&part.members).all(|(w, m)| *w == now(m))
                {
                    known[gi][pi] = Some(state.clone());
                    continue;
                }
                let members: Vec<MemberNow> = if self.shortcuts {
                    part.members.iter().map(now).collect()
                } else {
                    Vec::new()
                };
                let free_mib = part.free_mib(jobs);
                let (id, generation) = if self.shortcuts {
                    let mut key = state_key(jobs, &part.shape, &part.members, None);
                    key.push(free_mib);
                    key.extend(members.iter().map(|&(_, _, moved)| u64::from(moved)));
                    let mut memo = self.memo();
                    (Memo::number(&mut memo.state_ids, &key), memo.generation)
                } else {
                    (0, 0)
                };
                let state = PartState {
                    id,
                    generation,
                    free_mib,
                    stp: self.part_stp(jobs, part),
                };
                if self.shortcuts {
                    found.by_slot.insert(part.slot, (members, state.clone()));
                }
                known[gi][pi] = Some(state);
            }
        }
        found.calls += 1;
        let call = found.calls;
        let mut out = Vec::new();
        for (gi, parts) in known.iter().enumerate() {
            for (pi, state) in parts.iter().enumerate() {
                let Some(state) = state else {
                    continue;
                };
                if self.shortcuts {
                    let id = state.id as usize;
                    if found.asked.len() <= id {
                        found.asked.resize(id + 1, (0, 0));
                    }
                    let now = (call, state.generation);
                    if std::mem::replace(&mut found.asked[id], now) == now {
                        continue;
                    }
                }
                out.push(Asked {
                    gpu: gi,
                    part: pi,
                    id: state.id,
                    free_mib: state.free_mib,
                    stp: state.stp,
                    members: plans[gi].parts[pi].members.len(),
                });
            }
        }
        out
    }
}
