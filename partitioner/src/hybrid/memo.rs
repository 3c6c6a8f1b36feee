//! The memo: what the model said of partition states asked before, keyed by what the
//! answers depend on (one of the planner's shortcuts, `Hybrid::shortcuts`).

use mmk_core::JobClass;
use mmk_core::fasthash::FastMap;

use crate::layout::GpuState;
use crate::model::PartitionShape;
use crate::plan::JobDemand;

use super::Hybrid;
use super::kinds::Kinds;
use super::mps_config::Config;
use super::mps_first::Verdict;
use super::partition::{GpuPlan, Member, Part};
use super::rebalance::{Shares, movable};

/// Answers for partition states asked before, keyed by [`state_key`]. A planning pass asks
/// the same ones for every candidate layout, GPU and round, and for every waiting job of
/// the same kind; the next pass asks most of them again. The model is fixed for a
/// planner's life and deterministic, so a remembered answer is the answer. Each map starts
/// over when it holds [`MEMO_MAX`] entries.
#[derive(Debug, Default)]
pub(super) struct Memo {
    pub(super) config: FastMap<Vec<u64>, Config>,
    /// Each member's predicted performance, in the members' order.
    pub(super) perf: FastMap<Vec<u64>, Vec<f64>>,
    /// `None`: no rebalance fits.
    pub(super) rebalance: FastMap<Vec<u64>, Option<Shares>>,
    /// Whether a GPU's jobs are laid out again where nothing waits (`rebalance.rs`,
    /// `widen`): the same GPU state comes back pass after pass while they run.
    pub(super) widen: FastMap<Vec<u64>, bool>,
    /// The least share a job that cannot checkpoint takes in a partition of a shape
    /// (`mps_config.rs`, `lasting_share`).
    pub(super) lasting: FastMap<Vec<u64>, u8>,
    /// Numbers for partition states (`state_key` and more, `mps_first.rs`) and for kinds
    /// of job (`Kinds`), the same from pass to pass: they key [`Memo::answers`].
    pub(super) state_ids: FastMap<Vec<u64>, u32>,
    pub(super) kind_ids: FastMap<Vec<u64>, u32>,
    /// What MPS-first asked of a partition state for a kind of job ([`Answers`]).
    pub(super) answers: Answers,
    /// MPS-first's [`Verdict`]s by a kind's number in `kind_ids` and the round's flags
    /// (as [`Answers`]), each a list by the state's number in `state_ids`.
    pub(super) verdicts: FastMap<(u32, u32), Vec<Verdict>>,
    /// The verdicts the lists have room for together, at most [`VERDICTS_MAX`]
    /// (`remember_verdicts`).
    pub(super) verdict_slots: usize,
    /// Numbers for partitions' `state_key`s (no newcomer), for [`Memo::configs`].
    pub(super) part_ids: FastMap<Vec<u64>, u32>,
    /// `mps_config`'s answers by a partition's number in `part_ids`, the newcomer's kind
    /// in `kind_ids` and `Raise` (the layout search's; as [`Answers`]).
    pub(super) configs: FastMap<(u32, u32, u32), Config>,
    /// Numbers for the partition states MPS-first asks in a round, in order (by their
    /// numbers in `state_ids`), for [`Memo::choices`].
    pub(super) asked_ids: FastMap<Vec<u64>, u32>,
    /// The words of `asked_ids`' keys: a round on a large node asks hundreds of
    /// partitions, so the map is bounded by its words ([`ASKED_WORDS_MAX`]) too.
    pub(super) asked_words: usize,
    /// Where MPS-first puts a kind of job among the partition states of a round (by the
    /// round's number in `asked_ids`, the kind's in `kind_ids`, and the round's flags):
    /// the chosen one's position and whether it rebalances, and whether an SLO refused
    /// it somewhere (`mps_first.rs`, `choose_remembered`).
    pub(super) choices: FastMap<(u32, u32, u32), Chosen>,
    /// Numbers for GPU states ([`Hybrid::gpu_number`]), for [`Memo::unplaced`].
    pub(super) gpu_ids: FastMap<Vec<u64>, u32>,
    /// Numbers for sets of kinds of job (their numbers in `kind_ids`, sorted), for
    /// [`Memo::unplaced`].
    pub(super) kind_sets: FastMap<Vec<u64>, u32>,
    /// Sets of kinds of job of which no candidate layout of a GPU state places any, by the
    /// state's number in `gpu_ids`, the set's in `kind_sets` and `Raise`, with the kinds
    /// an SLO refused there (`layout_search.rs`, `best_layout_for`).
    pub(super) unplaced: FastMap<(u32, u32, u32), Vec<u32>>,
    /// How often the numbered maps started over. Passes may run at once (mmkd plans, dry
    /// runs and capacity views in parallel): a pass numbered its kinds under one
    /// generation and uses the numbered answers only while it lasts.
    pub(super) generation: u64,
}

/// MPS-first's choice for a kind of job among a round's partition states: the chosen
/// one's position and whether it rebalances, and whether an SLO refused the job somewhere.
pub(super) type Chosen = (Option<(u32, bool)>, bool);

/// What `mps_config` and `rebalance_shares` answered for a partition state and a kind of
/// job, by their numbers in [`Memo::state_ids`] and [`Memo::kind_ids`], for a
/// `last_resort` and a `Raise` (the third number). They depend on nothing else
/// (`mps_first.rs`, `distinct_parts`), and every pass asks most of them again: by three
/// small numbers that is several times cheaper than by the long keys.
pub(super) type Answers = FastMap<(u32, u32, u32), (Config, Option<Shares>)>;

const MEMO_MAX: usize = 1 << 15;

/// The most words `Memo::asked_ids`' keys hold before the numbered maps start over: 32 MiB.
const ASKED_WORDS_MAX: usize = 1 << 22;

/// The most verdicts `Memo::verdicts`' lists have room for (24 bytes each: 48 MiB); once
/// they are full, none is remembered until the numbered maps start over before the next
/// pass.
pub(super) const VERDICTS_MAX: usize = 1 << 21;

impl Memo {
    /// Before a pass numbers its kinds: the numbered maps start over when one is full,
    /// in a new generation. A pass that numbered under an older one no longer reads or
    /// writes them ([`Memo::answer`]).
    pub(super) fn between_passes(&mut self) {
        if self.state_ids.len() >= MEMO_MAX
            || self.kind_ids.len() >= MEMO_MAX
            || self.part_ids.len() >= MEMO_MAX
            || self.answers.len() >= 4 * MEMO_MAX
            || self.configs.len() >= 4 * MEMO_MAX
            || self.gpu_ids.len() >= MEMO_MAX
            || self.kind_sets.len() >= MEMO_MAX
            || self.asked_ids.len() >= MEMO_MAX
            || self.asked_words >= ASKED_WORDS_MAX
            || self.verdict_slots >= VERDICTS_MAX
            || self.choices.len() >= 4 * MEMO_MAX
            || self.unplaced.len() >= 4 * MEMO_MAX
        {
            self.state_ids.clear();
            self.kind_ids.clear();
            self.answers.clear();
            self.verdicts.clear();
            self.verdict_slots = 0;
            self.part_ids.clear();
            self.configs.clear();
            self.gpu_ids.clear();
            self.kind_sets.clear();
            self.asked_ids.clear();
            self.asked_words = 0;
            self.choices.clear();
            self.unplaced.clear();
            self.generation += 1;
        }
    }

    /// MPS-first's answer for `key`, if remembered in `generation`.
    pub(super) fn answer(
        &self,
        generation: u64,
        key: &(u32, u32, u32),
    ) -> Option<&(Config, Option<Shares>)> {
        (self.generation == generation)
            .then(|| self.answers.get(key))
            .flatten()
    }

    /// Remembers MPS-first's answer for `key`, unless the maps started over since
    /// `generation`.
    pub(super) fn remember_answer(
        &mut self,
        generation: u64,
        key: (u32, u32, u32),
        answer: (Config, Option<Shares>),
    ) {
        if self.generation == generation {
            self.answers.insert(key, answer);
        }
    }

    /// Remembers MPS-first's verdicts `fresh` (by state number) for a kind and flags
    /// (`key`), unless the maps started over since `generation`. A list that would take
    /// the lists past [`VERDICTS_MAX`] is not grown: the lists are full, and the numbered
    /// maps start over before the next pass.
    pub(super) fn remember_verdicts(
        &mut self,
        generation: u64,
        key: (u32, u32),
        fresh: &[(u32, Verdict)],
    ) {
        if self.generation != generation || self.verdict_slots >= VERDICTS_MAX {
            return;
        }
        let Some(longest) = fresh.iter().map(|&(id, _)| id as usize + 1).max() else {
            return;
        };
        let list = self.verdicts.entry(key).or_default();
        if longest > list.len() {
            let before = list.capacity();
            // The most growing it can take: to `longest`, or twice the room it has.
            let most = if longest <= before {
                0
            } else {
                longest.max(2 * before).max(4) - before
            };
            if self.verdict_slots + most > VERDICTS_MAX {
                self.verdict_slots = VERDICTS_MAX;
                return;
            }
            list.resize(longest, Verdict::default());
            self.verdict_slots += list.capacity() - before;
        }
        for &(id, v) in fresh {
            list[id as usize] = v;
        }
    }

    /// The number of MPS-first's round over the partition states `asked` (their numbers,
    /// in order) in `asked_ids`.
    pub(super) fn number_asked(&mut self, asked: &[u64]) -> u32 {
        let before = self.asked_ids.len();
        let id = Memo::number(&mut self.asked_ids, asked);
        if self.asked_ids.len() > before {
            self.asked_words += asked.len();
        }
        id
    }

    /// `key`'s number in `ids` (a new one if it has none).
    pub(super) fn number(ids: &mut FastMap<Vec<u64>, u32>, key: &[u64]) -> u32 {
        if let Some(&id) = ids.get(key) {
            return id;
        }
        let id = ids.len() as u32;
        ids.insert(key.to_vec(), id);
        id
    }
}

/// One of the memo's maps.
type Pick<V> = fn(&mut Memo) -> &mut FastMap<Vec<u64>, V>;

/// What the planner's answers about a partition depend on: its shape, then per member
/// (the newcomer, if any, last with share 0) the job's profile, class, SLO, share and
/// whether it may move. Job identities do not count: two jobs of the same kind get the
/// same answer.
pub(super) fn state_key(
    jobs: &[JobDemand],
    shape: &PartitionShape,
    members: &[Member],
    new: Option<usize>,
) -> Vec<u64> {
    let mut key = Vec::with_capacity(2 + 7 * (members.len() + 1));
    key.push(u64::from(shape.sm_count) << 32 | u64::from(shape.gpu_sm_count));
    key.push(u64::from(shape.memory_slices) << 8 | u64::from(shape.gpu_memory_slices));
    for m in members {
        job_words(jobs, m.job, m.share, &mut key);
    }
    if let Some(j) = new {
        // A tag no job's words begin with (the bits of a NaN SM demand), so a state with
        // a newcomer never meets one of a member more without.
        key.push(u64::MAX);
        job_words(jobs, j, 0, &mut key);
    }
    key
}

/// A job's part of a [`state_key`].
pub(super) fn job_words(jobs: &[JobDemand], j: usize, share: u8, key: &mut Vec<u64>) {
    let d = &jobs[j];
    key.push(d.profile.sm_demand.to_bits());
    key.push(d.profile.bw_demand.to_bits());
    key.push(d.profile.solo_latency_ms.map_or(u64::MAX, f64::to_bits));
    key.push(d.slo_ms.unwrap_or(u64::MAX));
    key.push(
        u64::from(d.class == JobClass::Online)
            | u64::from(d.profile.class == JobClass::Online) << 1
            | u64::from(movable(jobs, &Member { job: j, share })) << 2
            | u64::from(d.exclusive) << 3
            | u64::from(d.movable) << 4
            | u64::from(share) << 8,
    );
    key.push(d.slo_slowdown.map_or(u64::MAX, f64::to_bits));
    key.push(d.user.map_or(u64::MAX, u64::from));
}

impl Hybrid {
    pub(super) fn memo(&self) -> std::sync::MutexGuard<'_, Memo> {
        self.memo.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `part`'s number in the memo's `part_ids` (its `state_key` without a newcomer).
    pub(super) fn part_number(&self, jobs: &[JobDemand], part: &Part) -> u32 {
        let key = state_key(jobs, &part.shape, &part.members, None);
        Memo::number(&mut self.memo().part_ids, &key)
    }

    /// `gpu`'s state, as the layout search sees it with plan `now` (its model, profiles and mode,
    /// and per partition in order: its slot, whether it exists, its free memory and its
    /// number in `part_ids`), numbered in the memo's `gpu_ids`.
    pub(super) fn gpu_number(&self, jobs: &[JobDemand], gpu: &GpuState, now: &GpuPlan) -> u32 {
        let mut key: Vec<u64> = gpu
            .model
            .key
            .bytes()
            .map(u64::from)
            .chain([u64::MAX])
            .chain(gpu.model.profiles.iter().map(|p| u64::from(p.id)))
            .chain([
                u64::MAX,
                u64::from(gpu.mig_enabled) | u64::from(gpu.layout_fixed) << 1,
            ])
            .collect();
        for part in &now.parts {
            key.push(u64::from(part.slot.profile_id.unwrap_or(u32::MAX)));
            key.push(u64::from(part.slot.start) | u64::from(part.existing.is_some()) << 8);
            key.push(part.free_mib(jobs));
            key.push(u64::from(self.part_number(jobs, part)));
        }
        Memo::number(&mut self.memo().gpu_ids, &key)
    }

    /// The set of the kinds `waiting` (indices in `kinds`), numbered in the memo's
    /// `kind_sets`, if the memo is still in the generation `kinds` were numbered in.
    pub(super) fn kind_set_number(&self, waiting: &[usize], kinds: &Kinds) -> Option<u32> {
        let mut key: Vec<u64> = waiting
            .iter()
            .map(|&k| u64::from(kinds.kind_number(k)))
            .collect();
        key.sort_unstable();
        let mut memo = self.memo();
        (memo.generation == kinds.generation).then(|| Memo::number(&mut memo.kind_sets, &key))
    }

    /// `mps_config`'s answer by numbers (`Memo::configs`) given in `generation`:
    /// `ask`'s, remembered while the generation lasts.
    pub(super) fn config_by_number(
        &self,
        generation: u64,
        key: (u32, u32, u32),
        ask: impl FnOnce() -> Config,
    ) -> Config {
        {
            let memo = self.memo();
            if memo.generation == generation
                && let Some(&hit) = memo.configs.get(&key)
            {
                return hit;
            }
        }
        let answer = ask();
        let mut memo = self.memo();
        if memo.generation == generation {
            memo.configs.insert(key, answer);
        }
        answer
    }

    /// The answer `pick`'s map remembers for `key`, or `compute`'s, remembered.
    pub(super) fn recall<V: Clone>(
        &self,
        pick: Pick<V>,
        key: Vec<u64>,
        compute: impl FnOnce() -> V,
    ) -> V {
        if !self.shortcuts {
            return compute();
        }
        if let Some(hit) = pick(&mut self.memo()).get(&key) {
            return hit.clone();
        }
        let answer = compute();
        let mut memo = self.memo();
        let map = pick(&mut memo);
        if map.len() >= MEMO_MAX {
            map.clear();
        }
        map.insert(key, answer.clone());
        answer
    }
}
