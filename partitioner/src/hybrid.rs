//! MMK's hybrid partition scheduler (MMK paper, Algorithm 1) with the fixes of
//! shared/DESIGN.md items 5 to 9, and the MIGER and MISO baselines as readings of the same
//! search with different options.
//!
//! One pass, for the jobs waiting now. A running MPS client's share cannot change, so a
//! placed job changes share only by a move (checkpoint and restart), which only
//! checkpointable offline jobs make and which must pay for itself:
//!
//! 1. Waiting jobs are sorted by priority, then by memory, largest first (Algorithm 1,
//!    line 1).
//! 2. **MPS first** (lines 3-10): each job goes, if it can, into an existing partition of
//!    any GPU that runs jobs, the one where it adds the most predicted system throughput
//!    (STP). A partition meets a job when its free memory holds the job and the MPS shares
//!    of its jobs leave at least 10 % (DESIGN item 5). `MPSConfig` chooses the new job's
//!    share. Two rules keep MPS-first from locking GPUs into one big shared instance
//!    (found on the measured ground truth, experiments/2026-11-21-vm-simulate/README.md):
//!    - sharing must add throughput: a job joins running jobs only when the partition's
//!      STP grows by at least `min_colocation_gain` (MMK: half) of the newcomer's own
//!      predicted performance. When co-runners mostly slow each other down, the newcomer
//!      waits for a partition of its own instead. The layout search (step 3) applies the
//!      same rule when it packs a job next to others;
//!    - an instance without jobs is left to the layout search, which may keep it, reshape
//!      it or share it among several waiting jobs; MPS-first takes it only for a job that
//!      search left waiting.
//! 3. **MIG reconfiguration** (lines 11-21), for the jobs still waiting: for each GPU, every
//!    maximal MIG layout that keeps each busy instance where it is (so no slice that hosts
//!    a job, online or not, changes) is a candidate. Each candidate re-packs the waiting
//!    jobs first-fit decreasing on memory and runs `MPSConfig` per partition (DESIGN
//!    item 6). Its score is the GPU's predicted STP minus `reconfig_cost` per instance
//!    created or destroyed. The GPU whose best candidate gains the most takes its jobs;
//!    this repeats while some GPU gains.
//! 4. **Shares grow back** (line 6: "when jobs arrive or complete, we update the MPS
//!    settings for offline jobs"): in each partition whose shares leave room, the
//!    checkpointable offline jobs' shares grow into it, 10 % at a time to the job whose
//!    raise adds the most STP (the others' stay), and they move when the partition's STP
//!    grows by more than `move_cost` per moved job.
//! 5. A plan that breaks a predicted SLO of an online job is never chosen (DESIGN item 7).
//!
//! `MPSConfig` (lines 24-35) here: each new job starts at 10 %; online jobs with an SLO
//! are raised until their predicted latency meets it; then the remaining share goes 10 % at
//! a time to the job whose raise adds the most STP, until no raise helps. Shares of jobs
//! already running stay, unless they move (steps 2 and 4).
//!
//! Baselines, as we read their papers:
//! - **MIGER** packs jobs into MIG partitions and tunes MPS shares, like MMK, but its model
//!   ignores co-runners (it is not contention-aware), it does not prefer the current layout
//!   (no MPS-first step, no reconfiguration cost), and it has no kernel scheduler.
//! - **MISO** gives each job a MIG partition of its own (MPS is used only to profile jobs,
//!   which the simulator models, not the planner) and picks the layout that maximizes
//!   predicted throughput; jobs wait FCFS when nothing fits.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use mmk_core::JobClass;
use mmk_core::fasthash::FastMap;
use mmk_core::units::format_mib;

use crate::catalog::GpuModel;
use crate::layout::{self, GpuState, Placement};
use crate::model::{CoRunner, PartitionShape, PerfModel};
use crate::plan::{
    JobDemand, JobPlacement, NodeState, Plan, Planner, QueuedJob, Slot, Step, largest_partition_mib,
};

/// What distinguishes MMK from the baselines that share its search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HybridOptions {
    /// Several jobs share a partition through MPS (false: one job per partition).
    pub share_partitions: bool,
    /// The model sees a job's co-runners.
    pub contention_aware: bool,
    /// Predicted STP a plan pays for each instance it creates or destroys.
    pub reconfig_cost: f64,
    /// Try the current layout before any reconfiguration.
    pub mps_first: bool,
    /// Predicted STP a move costs (restarting a checkpointable job with another share);
    /// `None`: placed jobs never move.
    pub move_cost: Option<f64>,
    /// A job joins a partition that has jobs (in MPS-first and in the layout search's
    /// packing) only when the partition's predicted STP grows by at least this fraction
    /// of the newcomer's own predicted performance there: co-location must add
    /// throughput, not only move it from the jobs already there to the newcomer. 0: any
    /// gain that is not a loss.
    pub min_colocation_gain: f64,
}

/// MPS shares are chosen in steps of this many percent (DESIGN item 6).
const SHARE_STEP: u8 = 10;

#[derive(Debug)]
pub struct Hybrid {
    name: &'static str,
    model: Arc<dyn PerfModel>,
    options: HybridOptions,
    /// Maximal layouts (without `+me` profiles) per GPU model, computed once.
    layouts: Mutex<BTreeMap<String, Arc<Vec<Layout>>>>,
    /// What the model said of partition states asked before.
    memo: Mutex<Memo>,
    /// Take the two shortcuts: the memo, and skipping kinds of job refused within a pass
    /// (always, but in the test that checks them against a planner without them).
    shortcuts: bool,
}

/// Answers for partition states asked before, keyed by [`state_key`]. A planning pass asks
/// the same ones for every candidate layout, GPU and round, and for every waiting job of
/// the same kind; the next pass asks most of them again. The model is fixed for a
/// planner's life and deterministic, so a remembered answer is the answer. Each map starts
/// over when it holds [`MEMO_MAX`] entries.
#[derive(Debug, Default)]
struct Memo {
    config: FastMap<Vec<u64>, Config>,
    stp: FastMap<Vec<u64>, f64>,
    /// `None`: no rebalance fits.
    rebalance: FastMap<Vec<u64>, Option<Shares>>,
}

/// `mps_config`'s answer: the newcomer's share, the partition's STP, the newcomer's own
/// performance.
type Config = Result<(u8, f64, f64), Refusal>;

/// A rebalance: the members' shares (the newcomer's last), their STP, the newcomer's own
/// performance.
type Shares = (Vec<u8>, f64, f64);

const MEMO_MAX: usize = 1 << 15;

/// One of the memo's maps.
type Pick<V> = fn(&mut Memo) -> &mut FastMap<Vec<u64>, V>;

/// What the planner's answers about a partition depend on: its shape, then per member
/// (the newcomer, if any, last with share 0) the job's profile, class, SLO, share and
/// whether it may move. Job identities do not count: two jobs of the same kind get the
/// same answer.
fn state_key(
    jobs: &[JobDemand],
    shape: &PartitionShape,
    members: &[Member],
    new: Option<usize>,
) -> Vec<u64> {
    let mut key = Vec::with_capacity(2 + 5 * (members.len() + 1));
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
fn job_words(jobs: &[JobDemand], j: usize, share: u8, key: &mut Vec<u64>) {
    let d = &jobs[j];
    key.push(d.profile.sm_demand.to_bits());
    key.push(d.profile.bw_demand.to_bits());
    key.push(d.profile.solo_latency_ms.map_or(u64::MAX, f64::to_bits));
    key.push(d.slo_ms.unwrap_or(u64::MAX));
    key.push(
        u64::from(d.class == JobClass::Online)
            | u64::from(d.profile.class == JobClass::Online) << 1
            | u64::from(movable(jobs, &Member { job: j, share })) << 2
            | u64::from(share) << 8,
    );
}

/// Each job's kind, as a small number: jobs of one kind have the same [`job_words`] and
/// memory, which is all a waiting job's placement depends on besides the partitions, so
/// they get the same answer from the same partitions.
#[derive(Debug)]
struct Kinds {
    of: Vec<usize>,
    count: usize,
}

impl Kinds {
    fn new(jobs: &[JobDemand]) -> Kinds {
        let mut ids: FastMap<Vec<u64>, usize> = FastMap::default();
        let of = (0..jobs.len())
            .map(|j| {
                let mut key = Vec::with_capacity(6);
                job_words(jobs, j, 0, &mut key);
                key.push(jobs[j].memory_mib);
                let next = ids.len();
                *ids.entry(key).or_insert(next)
            })
            .collect();
        Kinds {
            of,
            count: ids.len(),
        }
    }

    /// Nothing refused yet; `enabled: false` never skips a job.
    fn none_refused(&self, enabled: bool) -> Refused<'_> {
        Refused {
            kinds: self,
            slo: vec![None; self.count],
            enabled,
        }
    }
}

/// The kinds of job refused since the last placement of a pass, each with whether an SLO
/// refused it: the next job of such a kind would be refused too.
struct Refused<'k> {
    kinds: &'k Kinds,
    slo: Vec<Option<bool>>,
    enabled: bool,
}

impl Refused<'_> {
    /// Whether job `j`'s kind was refused; if so, `j` gets the same SLO mark.
    fn skip(&self, j: usize, slo_blocked: &mut [bool]) -> bool {
        if !self.enabled {
            return false;
        }
        match self.slo[self.kinds.of[j]] {
            Some(slo) => {
                slo_blocked[j] |= slo;
                #[cfg(test)]
                tests::SKIPPED.set(tests::SKIPPED.get() + 1);
                true
            }
            None => false,
        }
    }

    fn refuse(&mut self, j: usize, slo: bool) {
        self.slo[self.kinds.of[j]] = Some(slo);
    }

    /// A job was placed: the partitions changed, so any kind may fit again.
    fn placed(&mut self) {
        self.slo.fill(None);
    }
}

/// A MIG layout: (profile ID, start slice) per instance.
type Layout = Vec<(u32, u8)>;

/// A candidate: its partitions, and the empty instances it destroys (slot, driver ID).
type Candidate = (Vec<Part>, Vec<(Slot, u32)>);

/// Where MPS-first puts a job: (gain, GPU, partition, the partition's new members, the
/// jobs it moves).
type Choice = (f64, usize, usize, Vec<Member>, Vec<usize>);

impl Hybrid {
    pub fn new(name: &'static str, model: Arc<dyn PerfModel>, options: HybridOptions) -> Hybrid {
        Hybrid {
            name,
            model,
            options,
            layouts: Mutex::default(),
            memo: Mutex::default(),
            shortcuts: true,
        }
    }

    /// The same planner without the memo and without skipping refused kinds: the
    /// reference the shortcuts are tested against.
    #[cfg(test)]
    fn forgetful(mut self) -> Hybrid {
        self.shortcuts = false;
        self
    }

    /// MMK: MPS first, contention-aware, reconfiguration must pay for itself.
    ///
    /// The reconfiguration cost, 0.01 of STP per instance made or destroyed, only breaks
    /// near-ties in favour of the layout there is: a MIG change takes under a second (the
    /// simulated node: 0.4 s to make an instance, 0.2 s to destroy one) against jobs of
    /// minutes to hours, and it never stops a running job. At 0.05 (until 2026-11-21) MMK
    /// kept layouts that its own model said were worse, and jobs waited: on the measured
    /// ground truth its average JCT was 0.7-8.7 % longer at 20, 40 and 80 s between
    /// arrivals in the simulation sweep (seeds 1-3; experiments/2026-11-21-vm-simulate/),
    /// and the same at 160 s.
    pub fn mmk(model: Arc<dyn PerfModel>) -> Hybrid {
        Hybrid::new(
            "mmk",
            model,
            HybridOptions {
                share_partitions: true,
                contention_aware: true,
                reconfig_cost: 0.01,
                mps_first: true,
                move_cost: Some(0.1),
                min_colocation_gain: 0.5,
            },
        )
    }

    /// MIGER, as we read it (module docs).
    pub fn miger(model: Arc<dyn PerfModel>) -> Hybrid {
        Hybrid::new(
            "miger",
            model,
            HybridOptions {
                share_partitions: true,
                contention_aware: false,
                reconfig_cost: 0.0,
                mps_first: false,
                move_cost: None,
                min_colocation_gain: 0.0,
            },
        )
    }

    /// MISO, as we read it (module docs).
    pub fn miso(model: Arc<dyn PerfModel>) -> Hybrid {
        Hybrid::new(
            "miso",
            model,
            HybridOptions {
                share_partitions: false,
                contention_aware: false,
                reconfig_cost: 0.0,
                mps_first: false,
                move_cost: None,
                min_colocation_gain: 0.0,
            },
        )
    }

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
}

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
                    layout::validate(&plain, &more).is_ok()
                })
            })
        })
        .collect()
}

/// What a pass has decided so far.
#[derive(Debug)]
struct Progress {
    plans: Vec<GpuPlan>,
    /// Jobs not placed yet (indices into the jobs).
    waiting: Vec<usize>,
    /// Jobs refused somewhere only for their SLO.
    slo_blocked: Vec<bool>,
    /// Placed jobs the plan restarts with another share.
    moved: BTreeSet<usize>,
    kinds: Kinds,
}

/// A job in a partition.
#[derive(Debug, Clone, Copy)]
struct Member {
    job: usize,
    share: u8,
}

/// A partition during the search.
#[derive(Debug, Clone)]
struct Part {
    slot: Slot,
    shape: PartitionShape,
    memory_mib: u64,
    /// The instance exists now (its driver ID); `None`: it would be created.
    existing: Option<u32>,
    members: Vec<Member>,
}

impl Part {
    fn free_mib(&self, jobs: &[JobDemand]) -> u64 {
        let used: u64 = self.members.iter().map(|m| jobs[m.job].memory_mib).sum();
        self.memory_mib.saturating_sub(used)
    }

    fn share_left(&self) -> u8 {
        let used: u32 = self.members.iter().map(|m| u32::from(m.share)).sum();
        100u32.saturating_sub(used) as u8
    }

    fn placement(&self, model: &GpuModel) -> Placement {
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

/// Why a partition refused a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Room,
    Slo,
}

/// The partitions of one GPU during the search.
#[derive(Debug, Clone)]
struct GpuPlan {
    parts: Vec<Part>,
    /// Instances the plan destroys (slot, driver ID).
    destroyed: Vec<(Slot, u32)>,
}

fn shape_of(gpu: &GpuState, profile_id: Option<u32>) -> (PartitionShape, u64) {
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
fn twin(model: &GpuModel, profile_id: u32) -> u32 {
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
    /// Predicted performance of each member of a partition.
    fn perf(&self, jobs: &[JobDemand], shape: &PartitionShape, members: &[Member]) -> Vec<f64> {
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
    fn slos_met(jobs: &[JobDemand], members: &[Member], perf: &[f64]) -> bool {
        members
            .iter()
            .zip(perf)
            .all(|(m, p)| jobs[m.job].slo_met(*p))
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, Memo> {
        self.memo.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer `pick`'s map remembers for `key`, or `compute`'s, remembered.
    fn recall<V: Clone>(&self, pick: Pick<V>, key: Vec<u64>, compute: impl FnOnce() -> V) -> V {
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

    /// MPSConfig: the share of a new job `new` joining `part` (module docs), the
    /// partition's predicted STP with it, and the newcomer's own predicted performance.
    fn mps_config(&self, jobs: &[JobDemand], part: &Part, new: usize) -> Config {
        let key = state_key(jobs, &part.shape, &part.members, Some(new));
        self.recall(
            |m| &mut m.config,
            key,
            || self.compute_mps_config(jobs, part, new),
        )
    }

    fn compute_mps_config(&self, jobs: &[JobDemand], part: &Part, new: usize) -> Config {
        if !self.options.share_partitions {
            if !part.members.is_empty() {
                return Err(Refusal::Room);
            }
            let members = [Member {
                job: new,
                share: 100,
            }];
            let perf = self.perf(jobs, &part.shape, &members);
            return if Self::slos_met(jobs, &members, &perf) {
                Ok((100, perf.iter().sum(), perf[0]))
            } else {
                Err(Refusal::Slo)
            };
        }
        let left = part.share_left();
        if left < SHARE_STEP {
            return Err(Refusal::Room);
        }
        let mut members = part.members.clone();
        members.push(Member {
            job: new,
            share: SHARE_STEP,
        });
        let me = members.len() - 1;
        let mut perf = self.perf(jobs, &part.shape, &members);
        // Raise an online job until its SLO holds.
        while !jobs[new].slo_met(perf[me]) {
            if members[me].share + SHARE_STEP > left {
                return Err(Refusal::Slo);
            }
            members[me].share += SHARE_STEP;
            perf = self.perf(jobs, &part.shape, &members);
        }
        if !Self::slos_met(jobs, &members, &perf) {
            // The newcomer breaks a running job's SLO.
            return Err(Refusal::Slo);
        }
        let mut stp: f64 = perf.iter().sum();
        while members[me].share + SHARE_STEP <= left {
            members[me].share += SHARE_STEP;
            let raised = self.perf(jobs, &part.shape, &members);
            let gain = raised.iter().sum::<f64>() - stp;
            if gain <= 1e-9 || !Self::slos_met(jobs, &members, &raised) {
                members[me].share -= SHARE_STEP;
                break;
            }
            stp += gain;
            perf = raised;
        }
        Ok((members[me].share, stp, perf[me]))
    }

    fn part_stp(&self, jobs: &[JobDemand], part: &Part) -> f64 {
        if part.members.is_empty() {
            return 0.0;
        }
        let key = state_key(jobs, &part.shape, &part.members, None);
        self.recall(
            |m| &mut m.stp,
            key,
            || self.perf(jobs, &part.shape, &part.members).iter().sum(),
        )
    }

    /// The GPUs' partitions as they are, with the placed jobs in them.
    fn current(&self, node: &NodeState, jobs: &[JobDemand]) -> Vec<GpuPlan> {
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
                for (i, j) in jobs.iter().enumerate() {
                    if let Some(slot) = j.placed.filter(|s| s.gpu == g.index)
                        && let Some(p) = parts.iter_mut().find(|p| p.slot == slot)
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

    /// Step 2: each waiting job into the existing partition where it adds the most STP,
    /// re-choosing the shares of the partition's checkpointable offline jobs when that
    /// pays for their restart (Algorithm 1, line 9; DESIGN item 8).
    fn mps_first(&self, node: &NodeState, jobs: &[JobDemand], p: &mut Progress, defer: bool) {
        let Progress {
            plans,
            waiting,
            slo_blocked,
            moved,
            kinds,
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
        for &j in waiting.iter() {
            if refused.skip(j, slo_blocked) {
                still.push(j);
                continue;
            }
            let mut best: Option<Choice> = None;
            let mut slo_here = false;
            for (gi, gp) in plans.iter().enumerate() {
                for (pi, part) in gp.parts.iter().enumerate() {
                    if part.free_mib(jobs) < jobs[j].memory_mib {
                        continue;
                    }
                    // An instance without jobs is the layout search's to keep, reshape or
                    // share out among several waiting jobs; MPS-first takes it only for a
                    // job that search left waiting.
                    if defer && part.members.is_empty() {
                        continue;
                    }
                    let now = self.part_stp(jobs, part);
                    let mut consider = |gain: f64, members: Vec<Member>, moves: Vec<usize>| {
                        if best.as_ref().is_none_or(|(g, ..)| gain > *g + 1e-12) {
                            best = Some((gain, gi, pi, members, moves));
                        }
                    };
                    match self.mps_config(jobs, part, j) {
                        Ok((share, stp, own)) => {
                            if self.adds_enough(part, own, stp - now) {
                                let mut members = part.members.clone();
                                members.push(Member { job: j, share });
                                consider(stp - now, members, Vec::new());
                            }
                        }
                        Err(Refusal::Slo) => slo_here = true,
                        Err(Refusal::Room) => {}
                    }
                    if let Some((members, stp, own, moves)) = self.rebalance(jobs, part, Some(j)) {
                        // A move must pay for its restart.
                        let gain = stp - self.moves_cost(&moves, moved) - now;
                        if gain > 0.0 && self.adds_enough(part, own, gain) {
                            consider(gain, members, moves);
                        }
                    }
                }
            }
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
                Some((gain, gi, pi, members, moves)) if carve.is_none_or(|c| c <= gain + 1e-9) => {
                    plans[gi].parts[pi].members = members;
                    moved.extend(moves);
                    refused.placed();
                }
                _ => {
                    refused.refuse(j, slo_here);
                    still.push(j);
                }
            }
        }
        *waiting = still;
    }

    /// Whether a newcomer joining `part` adds enough: `gain`, the partition's STP change,
    /// is at least `min_colocation_gain` of `own`, the newcomer's predicted performance
    /// there. A partition without jobs always takes it.
    fn adds_enough(&self, part: &Part, own: f64, gain: f64) -> bool {
        part.members.is_empty() || gain >= self.options.min_colocation_gain * own - 1e-12
    }

    /// Where a waiting job could run alone without sharing: per GPU, each profile an
    /// instance could have on slices that no job uses (free slices, or slices of instances
    /// without jobs), as (GPU index, profile ID or `None` for a GPU with MIG off, steps).
    /// Steps is the fewest reconfiguration steps it takes: 0 for an empty instance of that
    /// profile that exists, else 1 for the new instance plus each empty instance in its way.
    fn solo_options(
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
            let busy: Vec<(u32, u8)> = gp
                .parts
                .iter()
                .filter(|p| !p.members.is_empty())
                .filter_map(|p| p.slot.profile_id.map(|id| (id, p.slot.start)))
                .collect();
            for p in model.profiles.iter().filter(|p| !p.media_extensions) {
                let steps = p
                    .starts
                    .iter()
                    .filter(|&&s| {
                        let mut l = busy.clone();
                        l.push((p.id, s));
                        layout::validate(model, &l).is_ok()
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
        out
    }

    /// The most a job would add alone, at a full share, in an instance of its own
    /// (`options`, from [`Hybrid::solo_options`]), minus the reconfiguration cost of
    /// making it; `None` when none holds it.
    fn best_alone(
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

    /// MPSConfig over a newcomer and the partition's movable jobs together: the shares of
    /// the jobs that cannot move stay, the rest is shared out again (module docs). With
    /// no newcomer (`None`, step 4) the movable jobs' shares only grow, from what they are,
    /// into the room the partition has.
    /// Returns the members (the newcomer last), their STP, the newcomer's own predicted
    /// performance (0 without one), and the movable jobs whose share changed.
    fn rebalance(
        &self,
        jobs: &[JobDemand],
        part: &Part,
        new: Option<usize>,
    ) -> Option<(Vec<Member>, f64, f64, Vec<usize>)> {
        self.options.move_cost?;
        if !self.options.share_partitions {
            return None;
        }
        let key = state_key(jobs, &part.shape, &part.members, new);
        let (shares, stp, own) = self.recall(
            |m| &mut m.rebalance,
            key,
            || self.compute_rebalance(jobs, part, new),
        )?;
        let members: Vec<Member> = part
            .members
            .iter()
            .map(|m| m.job)
            .chain(new)
            .zip(shares)
            .map(|(job, share)| Member { job, share })
            .collect();
        let moves = part
            .members
            .iter()
            .zip(&members)
            .filter(|(b, a)| movable(jobs, b) && b.share != a.share)
            .map(|(b, _)| b.job)
            .collect();
        Some((members, stp, own, moves))
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
        if n_movable == 0 {
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
        let me = new.map(|job| {
            members.push(Member {
                job,
                share: SHARE_STEP,
            });
            members.len() - 1
        });
        let adjustable: Vec<usize> = (0..members.len())
            .filter(|&i| Some(i) == me || movable(&members[i]))
            .collect();
        let used =
            |ms: &[Member]| -> u32 { adjustable.iter().map(|&i| u32::from(ms[i].share)).sum() };
        let mut perf = self.perf(jobs, &part.shape, &members);
        if let (Some(new), Some(me)) = (new, me) {
            while !jobs[new].slo_met(perf[me]) {
                if used(&members) + u32::from(SHARE_STEP) > room {
                    return None;
                }
                members[me].share += SHARE_STEP;
                perf = self.perf(jobs, &part.shape, &members);
            }
        }
        if !Self::slos_met(jobs, &members, &perf) {
            return None;
        }
        let mut stp: f64 = perf.iter().sum();
        while used(&members) + u32::from(SHARE_STEP) <= room {
            let mut best: Option<(f64, usize, Vec<f64>)> = None;
            for &i in &adjustable {
                members[i].share += SHARE_STEP;
                let p = self.perf(jobs, &part.shape, &members);
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
                _ => break,
            }
        }
        let own = me.map_or(0.0, |me| perf[me]);
        Some((members.iter().map(|m| m.share).collect(), stp, own))
    }

    /// What restarting `moves` costs in predicted STP: `move_cost` for each job not already
    /// moved in this plan.
    fn moves_cost(&self, moves: &[usize], moved: &BTreeSet<usize>) -> f64 {
        let new = moves.iter().filter(|m| !moved.contains(m)).count();
        self.options.move_cost.unwrap_or(0.0) * new as f64
    }

    /// Step 4 (Algorithm 1, line 6: "when jobs arrive or complete, we update the MPS
    /// settings for offline jobs"): in every partition whose shares leave room (a job
    /// left, or MPSConfig left some), the checkpointable offline jobs' shares are chosen
    /// again, and they restart with them when the partition's predicted STP grows by more
    /// than the moves cost. Without this a job keeps the small share it got next to
    /// co-runners for its whole life, also after they leave.
    fn regrow(&self, jobs: &[JobDemand], p: &mut Progress) {
        if self.options.move_cost.is_none() {
            return;
        }
        for gp in &mut p.plans {
            for part in &mut gp.parts {
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

    /// Step 3 for one GPU: the best candidate layout for the waiting jobs, as
    /// (score gain over the GPU as it is, the GPU's new plan, jobs placed).
    fn best_layout(
        &self,
        gpu: &GpuState,
        jobs: &[JobDemand],
        now: &GpuPlan,
        waiting: &[usize],
        kinds: &Kinds,
        slo_blocked: &mut [bool],
    ) -> Option<(f64, GpuPlan, Vec<usize>)> {
        let base: f64 = now.parts.iter().map(|p| self.part_stp(jobs, p)).sum();
        let reconfigurable = gpu.mig_enabled && !gpu.layout_fixed;
        let model = &gpu.model;
        let busy: Vec<&Part> = now.parts.iter().filter(|p| !p.members.is_empty()).collect();
        let empty: Vec<&Part> = now.parts.iter().filter(|p| p.members.is_empty()).collect();

        // Candidate part lists: the current layout, then each maximal layout that keeps
        // every busy instance, deduplicated by the profiles it adds, keeping the one with
        // the fewest steps. This is an approximation for speed: two layouts that add the
        // same profiles at other positions predict the same for a job alone in each new
        // instance, but re-packing may fill them differently.
        let mut cands: Vec<Candidate> = vec![(now.parts.clone(), Vec::new())];
        if reconfigurable {
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
                for e in &empty {
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

        let mut best: Option<(f64, usize, GpuPlan, Vec<usize>)> = None;
        for (mut parts, destroyed) in cands {
            // Re-pack into empty partitions first, then into busy ones.
            parts.sort_by_key(|p| (!p.members.is_empty(), p.slot));
            // Each partition's predicted STP as packed so far, asked when first needed.
            let mut part_stp: Vec<Option<f64>> = vec![None; parts.len()];
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
                    match self.mps_config(jobs, part, j) {
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
                continue;
            }
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
            if gpu.mig_enabled && layout::validate(model, &layout_ids).is_err() {
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
        best.map(|(gain, _, plan, placed)| (gain, plan, placed))
    }
}

/// What decides a GPU's best layout, without its index: model, mode, instances (with
/// their driver IDs) and the jobs in them.
fn signature(gpu: &GpuState, plan: &GpuPlan) -> String {
    let parts: Vec<String> = plan
        .parts
        .iter()
        .map(|p| {
            let members: Vec<(usize, u8)> = p.members.iter().map(|m| (m.job, m.share)).collect();
            format!(
                "{:?}@{}#{:?}{:?}",
                p.slot.profile_id, p.slot.start, p.existing, members
            )
        })
        .collect();
    format!(
        "{}|{}|{}|{:?}|{:?}",
        gpu.model.key, gpu.mig_enabled, gpu.layout_fixed, parts, plan.destroyed
    )
}

/// A plan computed for another GPU in the same state, moved to `gpu`.
fn on_gpu(mut plan: GpuPlan, gpu: u32) -> GpuPlan {
    for p in &mut plan.parts {
        p.slot.gpu = gpu;
    }
    for (s, _) in &mut plan.destroyed {
        s.gpu = gpu;
    }
    plan
}

/// Instances a candidate creates beyond those `now` already plans (an earlier round of
/// the same pass may have planned some; they are paid for once).
fn count_new(parts: &[Part], now: &[Part]) -> usize {
    parts
        .iter()
        .filter(|p| p.existing.is_none() && !now.iter().any(|q| q.slot == p.slot))
        .count()
}

/// A placed job that may be restarted with another share.
fn movable(jobs: &[JobDemand], m: &Member) -> bool {
    jobs[m.job].movable && jobs[m.job].placed.is_some()
}

impl Planner for Hybrid {
    fn name(&self) -> &'static str {
        self.name
    }

    fn plan(&self, node: &NodeState, jobs: &[JobDemand]) -> Plan {
        let mut waiting: Vec<usize> = (0..jobs.len())
            .filter(|&i| jobs[i].placed.is_none())
            .collect();
        waiting.sort_by_key(|&i| {
            (
                std::cmp::Reverse(jobs[i].priority),
                std::cmp::Reverse(jobs[i].memory_mib),
                jobs[i].id,
            )
        });
        let mut p = Progress {
            plans: self.current(node, jobs),
            waiting,
            slo_blocked: vec![false; jobs.len()],
            moved: BTreeSet::new(),
            kinds: Kinds::new(jobs),
        };

        if self.options.mps_first {
            self.mps_first(node, jobs, &mut p, true);
        }
        while !p.waiting.is_empty() {
            let mut best: Option<(f64, usize, GpuPlan, Vec<usize>)> = None;
            // GPUs in the same state get the same answer: compute it once per round.
            let mut seen: BTreeMap<String, Option<(f64, GpuPlan, Vec<usize>)>> = BTreeMap::new();
            for (gi, gpu) in node.gpus.iter().enumerate() {
                let key = signature(gpu, &p.plans[gi]);
                let answer = match seen.get(&key) {
                    Some(a) => a
                        .clone()
                        .map(|(g, plan, j)| (g, on_gpu(plan, gpu.index), j)),
                    None => {
                        let a = self.best_layout(
                            gpu,
                            jobs,
                            &p.plans[gi],
                            &p.waiting,
                            &p.kinds,
                            &mut p.slo_blocked,
                        );
                        seen.insert(key, a.clone());
                        a
                    }
                };
                if let Some((gain, plan, placed)) = answer
                    && gain > 1e-9
                    && best.as_ref().is_none_or(|(g, ..)| gain > *g + 1e-9)
                {
                    best = Some((gain, gi, plan, placed));
                }
            }
            let Some((_, gi, plan, placed)) = best else {
                break;
            };
            let destroyed = std::mem::take(&mut p.plans[gi].destroyed);
            p.plans[gi] = plan;
            p.plans[gi].destroyed.extend(destroyed);
            p.waiting.retain(|j| !placed.contains(j));
        }
        // A job deferred to the layout search that found nothing better still takes the
        // place MPS-first had for it.
        if self.options.mps_first && !p.waiting.is_empty() {
            self.mps_first(node, jobs, &mut p, false);
        }
        self.regrow(jobs, &mut p);
        let Progress {
            plans,
            mut waiting,
            slo_blocked,
            moved,
            ..
        } = p;

        let mut out = Plan::default();
        let mut stp = 0.0;
        for gp in &plans {
            for (slot, id) in &gp.destroyed {
                out.steps.push(Step::Destroy {
                    slot: *slot,
                    instance: *id,
                });
            }
            for part in &gp.parts {
                if part.existing.is_none() {
                    out.steps.push(Step::Create { slot: part.slot });
                }
                let perf = self.perf(jobs, &part.shape, &part.members);
                stp += perf.iter().sum::<f64>();
                out.perf.extend(
                    part.members
                        .iter()
                        .zip(&perf)
                        .map(|(m, p)| (jobs[m.job].id, *p)),
                );
                for m in &part.members {
                    out.placements.push(JobPlacement {
                        job: jobs[m.job].id,
                        slot: part.slot,
                        mps_share: m.share,
                    });
                }
            }
        }
        out.steps.sort_by_key(|s| match s {
            Step::Destroy { slot, .. } => (0, *slot),
            Step::Create { slot } => (1, *slot),
        });
        // A placed job whose partition the GPUs no longer show (destroyed behind mmk's back)
        // keeps its placement: the planner never drops a job; mmkd's reconciler finds out.
        for j in jobs.iter().filter(|j| j.placed.is_some()) {
            if !out.placements.iter().any(|p| p.job == j.id)
                && let Some(slot) = j.placed
            {
                out.placements.push(JobPlacement {
                    job: j.id,
                    slot,
                    mps_share: j.mps_share,
                });
            }
        }
        out.placements.sort_by_key(|p| p.job);
        out.perf.sort_by_key(|(job, _)| *job);
        out.moves = moved
            .into_iter()
            .filter(|&j| {
                let p = out.placements.iter().find(|p| p.job == jobs[j].id);
                p.is_some_and(|p| {
                    Some(p.slot) != jobs[j].placed || p.mps_share != jobs[j].mps_share
                })
            })
            .map(|j| jobs[j].id)
            .collect();
        let largest = largest_partition_mib(node);
        waiting.sort_by_key(|&j| jobs[j].id);
        for j in waiting {
            let job = &jobs[j];
            let reason = if job.memory_mib > largest {
                format!(
                    "needs {} of GPU memory; the largest partition this node can make has {}",
                    format_mib(job.memory_mib),
                    format_mib(largest)
                )
            } else if slo_blocked[j] {
                format!(
                    "waiting: no partition can meet its SLO of {}ms now",
                    job.slo_ms.unwrap_or(0)
                )
            } else {
                format!(
                    "waiting for {} of GPU memory and an SM share: no partition has room, and no layout that keeps the busy partitions holds it",
                    format_mib(job.memory_mib)
                )
            };
            out.queued.push(QueuedJob {
                job: job.id,
                reason,
            });
        }
        out.stp = Some(stp);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use crate::layout::Instance;
    use crate::model::{AnalyticModel, JobProfile};

    thread_local! {
        /// Jobs this thread's planners skipped as of a refused kind (each test runs on a
        /// thread of its own).
        pub(super) static SKIPPED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    fn gpu(key: &str, index: u32) -> GpuState {
        GpuState {
            index,
            uuid: format!("GPU-{index}"),
            model: catalog::model(key).expect("model"),
            mig_enabled: true,
            layout_fixed: false,
            instances: vec![],
        }
    }

    fn job(id: u64, class: JobClass, gib: u64, sm: f64, bw: f64) -> JobDemand {
        JobDemand {
            profile: JobProfile {
                class,
                sm_demand: sm,
                bw_demand: bw,
                solo_latency_ms: None,
            },
            ..JobDemand::waiting(id, class, gib * 1024)
        }
    }

    fn mmk() -> Hybrid {
        Hybrid::mmk(Arc::new(AnalyticModel::default()))
    }

    fn names(node: &NodeState, plan: &Plan) -> Vec<String> {
        let mut v: Vec<String> = plan
            .placements
            .iter()
            .map(|p| {
                let g = &node.gpus[p.slot.gpu as usize];
                p.slot
                    .profile_id
                    .and_then(|id| g.model.profile(id))
                    .map_or("whole".into(), |q| q.name.clone())
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn an_empty_gpu_is_partitioned_for_its_jobs() {
        let node = NodeState {
            gpus: vec![gpu("a100-80gb", 0)],
        };
        let jobs = [
            job(1, JobClass::Offline, 30, 0.8, 0.5),
            job(2, JobClass::Offline, 10, 0.3, 0.3),
        ];
        let plan = mmk().plan(&node, &jobs);
        assert!(plan.queued.is_empty(), "{:?}", plan.queued);
        assert_eq!(plan.placements.len(), 2);
        assert!(plan.stp.is_some_and(|s| s > 1.0), "{:?}", plan.stp);
        // Each placed job's prediction, summing to the STP.
        let ids: Vec<u64> = plan.perf.iter().map(|(j, _)| *j).collect();
        assert_eq!(ids, [1, 2]);
        assert!(plan.perf.iter().all(|(_, p)| *p > 0.0 && *p <= 1.0));
        let sum: f64 = plan.perf.iter().map(|(_, p)| p).sum();
        assert!((sum - plan.stp.unwrap_or(0.0)).abs() < 1e-9);
        assert!(plan.steps.iter().all(|s| matches!(s, Step::Create { .. })));
        let shares: u32 = plan.placements.iter().map(|p| u32::from(p.mps_share)).sum();
        assert!(shares <= 200);
    }

    #[test]
    fn mps_first_uses_room_in_the_current_layout() {
        let node = NodeState {
            gpus: vec![whole_instance_gpu(0, 1)],
        };
        let whole = Slot {
            gpu: 0,
            start: 0,
            profile_id: Some(0),
        };
        let mut running = job(1, JobClass::Offline, 20, 0.4, 0.3);
        running.placed = Some(whole);
        running.mps_share = 50;
        let plan = mmk().plan(&node, &[running, job(2, JobClass::Offline, 10, 0.3, 0.2)]);
        assert!(
            plan.steps.is_empty(),
            "no reconfiguration: {:?}",
            plan.steps
        );
        let new = plan.placements.iter().find(|p| p.job == 2).expect("placed");
        assert_eq!(new.slot, whole);
        assert!(
            new.mps_share <= 50,
            "within what the running job leaves: {}",
            new.mps_share
        );
    }

    #[test]
    fn busy_instances_are_never_touched() {
        let mut g = gpu("a100-80gb", 0);
        g.instances.push(Instance {
            id: 4,
            profile_id: 14,
            placement: Placement { start: 2, size: 2 },
            uuid: "MIG-4".into(),
        });
        let node = NodeState { gpus: vec![g] };
        let slot = Slot {
            gpu: 0,
            start: 2,
            profile_id: Some(14),
        };
        let mut online = job(1, JobClass::Online, 15, 0.2, 0.2);
        online.placed = Some(slot);
        online.mps_share = 100;
        let plan = mmk().plan(&node, &[online, job(2, JobClass::Offline, 60, 0.9, 0.5)]);
        // 60 GiB needs a 7g, which would take the online job's slices: it waits.
        assert!(
            plan.steps
                .iter()
                .all(|s| !matches!(s, Step::Destroy { instance: 4, .. }))
        );
        assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [2]);
        assert!(
            plan.queued[0].reason.contains("waiting for 60GiB"),
            "{}",
            plan.queued[0].reason
        );
    }

    #[test]
    fn online_slos_are_kept_or_the_job_waits() {
        let node = NodeState {
            gpus: vec![gpu("h100-80gb", 0)],
        };
        let mut serving = job(1, JobClass::Online, 8, 0.5, 0.3);
        serving.profile.solo_latency_ms = Some(10.0);
        serving.slo_ms = Some(12);
        let plan = mmk().plan(&node, &[serving.clone()]);
        let p = plan.placements.first().expect("placed");
        let g = &node.gpus[0];
        let (shape, _) = shape_of(g, p.slot.profile_id);
        let perf = AnalyticModel::default().estimate(&serving.profile, &shape, p.mps_share, &[]);
        assert!(10.0 / perf <= 12.0, "predicted latency {} ms", 10.0 / perf);

        // An SLO no partition can meet: the job waits and says why.
        serving.slo_ms = Some(9);
        let plan = mmk().plan(&node, &[serving]);
        assert_eq!(plan.queued.len(), 1);
        assert!(
            plan.queued[0].reason.contains("SLO of 9ms"),
            "{}",
            plan.queued[0].reason
        );
    }

    #[test]
    fn miso_gives_each_job_its_own_partition() {
        let node = NodeState {
            gpus: vec![gpu("a100-80gb", 0)],
        };
        let jobs: Vec<JobDemand> = (1..=4)
            .map(|i| job(i, JobClass::Offline, 5, 0.2, 0.2))
            .collect();
        let plan = Hybrid::miso(Arc::new(AnalyticModel::default())).plan(&node, &jobs);
        let mut slots: Vec<Slot> = plan.placements.iter().map(|p| p.slot).collect();
        slots.dedup();
        assert_eq!(
            slots.len(),
            plan.placements.len(),
            "no two jobs share: {:?}",
            plan.placements
        );
        assert!(plan.placements.iter().all(|p| p.mps_share == 100));
    }

    /// The MMK paper's observation 1: with ResNet152-, ResNet50- and VGG16-like jobs,
    /// [4g.40gb, 3g.40gb] beats [3g.40gb, 2g.20gb, 2g.20gb]. A model that says so (small
    /// jobs share well, the big job needs 4 compute slices) leads the planner there.
    #[test]
    fn observation_1_the_planner_follows_the_model_to_4g_3g() {
        #[derive(Debug)]
        struct Fig1;
        impl PerfModel for Fig1 {
            fn estimate(
                &self,
                job: &JobProfile,
                p: &PartitionShape,
                share: u8,
                co: &[CoRunner],
            ) -> f64 {
                let compute = f64::from(p.sm_count) / f64::from(p.gpu_sm_count);
                let got = compute * f64::from(share) / 100.0;
                let speed = (got / job.sm_demand).min(1.0);
                // Sharing costs little for the small jobs, much for the big one.
                let penalty = if job.sm_demand > 0.5 { 0.3 } else { 0.02 };
                speed * (1.0 - penalty * co.len() as f64).max(0.1)
            }
        }
        let node = NodeState {
            gpus: vec![gpu("a100-80gb", 0)],
        };
        let jobs = [
            job(1, JobClass::Offline, 30, 0.55, 0.4), // ResNet152-like
            // The small ones each need 16 of the A100's 108 SMs: two share a 3g (42)
            // at 60 / 40 at full speed, so a 4g and a 3g beat two 2g and a 3g by the
            // model, whatever the reconfiguration cost.
            job(2, JobClass::Offline, 15, 0.15, 0.3), // ResNet50-like
            job(3, JobClass::Offline, 15, 0.15, 0.3), // VGG16-like
        ];
        let planner = Hybrid::mmk(Arc::new(Fig1));
        let plan = planner.plan(&node, &jobs);
        assert!(plan.queued.is_empty(), "{:?}", plan.queued);
        let mut made: Vec<String> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Create { slot } => slot.profile_id,
                Step::Destroy { .. } => None,
            })
            .filter_map(|id| node.gpus[0].model.profile(id).map(|p| p.name.clone()))
            .collect();
        made.sort();
        assert_eq!(
            made,
            ["3g.40gb", "4g.40gb"],
            "placements {:?}",
            names(&node, &plan)
        );
        let big = plan.placements.iter().find(|p| p.job == 1).expect("placed");
        assert_eq!(
            big.slot.profile_id,
            Some(5),
            "the ResNet152-like job gets the 4g"
        );
    }

    #[test]
    fn several_gpus_share_the_work() {
        let node = NodeState {
            gpus: (0..4).map(|i| gpu("h100-80gb", i)).collect(),
        };
        let jobs: Vec<JobDemand> = (1..=8)
            .map(|i| job(i, JobClass::Offline, 35, 0.9, 0.5))
            .collect();
        let plan = mmk().plan(&node, &jobs);
        assert!(plan.queued.is_empty(), "{:?}", plan.queued);
        let mut gpus: Vec<u32> = plan.placements.iter().map(|p| p.slot.gpu).collect();
        gpus.sort_unstable();
        gpus.dedup();
        assert_eq!(gpus, [0, 1, 2, 3]);
    }

    #[test]
    fn a_checkpointable_job_makes_room_by_moving() {
        let (node, whole) = whole_instance_node();
        let mut trainer = job(1, JobClass::Offline, 30, 0.85, 0.45);
        trainer.placed = Some(whole);
        trainer.mps_share = 100;
        let mut serving = job(2, JobClass::Online, 4, 0.25, 0.35);
        serving.profile.solo_latency_ms = Some(3.0);
        serving.slo_ms = Some(50);

        // The trainer cannot move: the partition has no share left and the 7g covers
        // every slice, so the newcomer waits.
        let plan = mmk().plan(&node, &[trainer.clone(), serving.clone()]);
        assert!(plan.moves.is_empty());
        assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [2]);

        // It declared checkpointing: it restarts with a smaller share, and both run.
        trainer.movable = true;
        let plan = mmk().plan(&node, &[trainer, serving]);
        assert_eq!(plan.moves, [1]);
        assert!(plan.queued.is_empty(), "{:?}", plan.queued);
        let t = plan
            .placements
            .iter()
            .find(|p| p.job == 1)
            .expect("trainer");
        let s = plan
            .placements
            .iter()
            .find(|p| p.job == 2)
            .expect("serving");
        assert_eq!((t.slot, s.slot), (whole, whole));
        assert!(t.mps_share < 100 && u32::from(t.mps_share) + u32::from(s.mps_share) <= 100);
        assert!(plan.steps.is_empty(), "a move needs no MIG change here");
    }

    #[test]
    fn a_checkpointable_job_left_with_room_restarts_with_a_larger_share() {
        let (node, whole) = whole_instance_node();
        // A trainer that got 30 % next to a co-runner that has since finished.
        let mut trainer = job(1, JobClass::Offline, 30, 0.85, 0.45);
        trainer.placed = Some(whole);
        trainer.mps_share = 30;
        let share_of = |plan: &Plan, id: u64| {
            plan.placements
                .iter()
                .find(|p| p.job == id)
                .map(|p| (p.slot, p.mps_share))
        };

        // It cannot restart: it keeps its share.
        let plan = mmk().plan(&node, std::slice::from_ref(&trainer));
        assert!(plan.moves.is_empty());
        assert_eq!(share_of(&plan, 1), Some((whole, 30)));

        // It can: it restarts with the partition's room.
        trainer.movable = true;
        let plan = mmk().plan(&node, std::slice::from_ref(&trainer));
        assert_eq!(plan.moves, [1]);
        assert_eq!(share_of(&plan, 1), Some((whole, 100)));
        assert!(plan.steps.is_empty());

        // Next to an online job that cannot move, it takes only what is left.
        let mut serving = job(2, JobClass::Online, 4, 0.25, 0.35);
        serving.profile.solo_latency_ms = Some(3.0);
        serving.slo_ms = Some(50);
        serving.placed = Some(whole);
        serving.mps_share = 40;
        let plan = mmk().plan(&node, &[trainer.clone(), serving.clone()]);
        assert_eq!(plan.moves, [1]);
        assert_eq!(share_of(&plan, 1), Some((whole, 60)));
        assert_eq!(share_of(&plan, 2), Some((whole, 40)));

        // Planning again after the move moves nothing: the shares are where they grow to.
        let (node2, jobs2) = crate::plan::apply(&node, &[trainer.clone(), serving.clone()], &plan);
        assert!(mmk().plan(&node2, &jobs2).moves.is_empty());

        // A trainer that would gain nothing from the room left stays where it is, and
        // one never shrinks: alone at 90 %, the analytic model's trainer (85 % of the
        // SMs) runs at full speed already.
        let mut alone = trainer.clone();
        alone.mps_share = 90;
        let plan = mmk().plan(&node, std::slice::from_ref(&alone));
        assert!(plan.moves.is_empty(), "{:?}", plan.moves);
        assert_eq!(share_of(&plan, 1), Some((whole, 90)));

        // MIGER never restarts a running job.
        trainer.mps_share = 30;
        let miger = Hybrid::miger(Arc::new(AnalyticModel::default()));
        let plan = miger.plan(&node, &[trainer, serving]);
        assert!(plan.moves.is_empty());
        assert_eq!(share_of(&plan, 1), Some((whole, 30)));
    }

    /// Speed grows as the square root of the job's fraction of the GPU's SMs (small
    /// instances are efficient), and every co-runner multiplies it by `corunner`.
    #[derive(Debug)]
    struct Concave {
        corunner: f64,
    }

    impl PerfModel for Concave {
        fn estimate(
            &self,
            _job: &JobProfile,
            part: &PartitionShape,
            share: u8,
            co: &[CoRunner],
        ) -> f64 {
            let frac =
                f64::from(share) / 100.0 * f64::from(part.sm_count) / f64::from(part.gpu_sm_count);
            frac.sqrt() * self.corunner.powi(co.len() as i32)
        }
    }

    /// An A100-80GB with one 7g instance (driver ID `id`) covering it.
    fn whole_instance_gpu(index: u32, id: u32) -> GpuState {
        let mut g = gpu("a100-80gb", index);
        g.instances.push(Instance {
            id,
            profile_id: 0,
            placement: Placement { start: 0, size: 8 },
            uuid: format!("MIG-{id}"),
        });
        g
    }

    fn whole_instance_node() -> (NodeState, Slot) {
        let g = whole_instance_gpu(0, 1);
        let slot = Slot {
            gpu: 0,
            start: 0,
            profile_id: Some(0),
        };
        (NodeState { gpus: vec![g] }, slot)
    }

    #[test]
    fn mps_first_shares_a_partition_only_when_that_adds_throughput() {
        let (node, whole) = whole_instance_node();
        let mut running = job(1, JobClass::Offline, 20, 0.5, 0.3);
        running.placed = Some(whole);
        running.mps_share = 50;
        let jobs = [running, job(2, JobClass::Offline, 10, 0.5, 0.3)];

        // Co-runners cost each other 40 %: the newcomer would mostly take what the running
        // job loses, so it waits (the 7g covers every slice: nothing to carve).
        let zero_sum = Hybrid::mmk(Arc::new(Concave { corunner: 0.6 }));
        let plan = zero_sum.plan(&node, &jobs);
        assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [2]);

        // Without interference the idle half of the partition is pure gain: it joins.
        let free = Hybrid::mmk(Arc::new(Concave { corunner: 1.0 }));
        let plan = free.plan(&node, &jobs);
        assert!(plan.queued.is_empty(), "{:?}", plan.queued);
        let new = plan.placements.iter().find(|p| p.job == 2).expect("placed");
        assert_eq!(new.slot, whole);
        assert!(new.mps_share <= 50, "{}", new.mps_share);

        // The plain greedy (MIGER's option) takes any gain.
        let greedy = Hybrid::new(
            "greedy",
            Arc::new(Concave { corunner: 0.6 }),
            HybridOptions {
                min_colocation_gain: 0.0,
                ..zero_sum.options
            },
        );
        assert!(greedy.plan(&node, &jobs).queued.is_empty());
    }

    #[test]
    fn an_empty_instance_is_reshaped_for_the_jobs_waiting() {
        // An empty 7g and three waiting jobs, on a model where small instances are
        // efficient: the 7g goes and smaller instances take all three, rather than
        // MPS-first handing the whole GPU to the first job.
        let (node, whole) = whole_instance_node();
        let jobs: Vec<JobDemand> = (1..=3)
            .map(|id| job(id, JobClass::Offline, 10, 0.5, 0.3))
            .collect();
        let plan = Hybrid::mmk(Arc::new(Concave { corunner: 0.6 })).plan(&node, &jobs);
        assert!(plan.queued.is_empty(), "{:?}", plan.queued);
        assert!(
            plan.steps
                .iter()
                .any(|s| matches!(s, Step::Destroy { slot, .. } if *slot == whole)),
            "{:?}",
            plan.steps
        );
        let slots: BTreeSet<Slot> = plan.placements.iter().map(|p| p.slot).collect();
        assert_eq!(slots.len(), 3, "one instance each: {:?}", plan.placements);

        // One waiting job still takes the empty 7g as it is.
        let plan = Hybrid::mmk(Arc::new(Concave { corunner: 0.6 })).plan(&node, &jobs[..1]);
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        assert_eq!(plan.placements[0].slot, whole);
    }

    #[test]
    fn an_idle_room_elsewhere_beats_sharing_a_busy_one() {
        // GPU 0's 7g runs a job at half its share; GPU 1 has room no job uses (no free
        // slices on either GPU): an empty 7g, a GPU with MIG off, or an empty 7g on a GPU
        // whose layout is fixed. Sharing GPU 0 would add throughput (co-runners cost
        // nothing here), but the newcomer does better alone on GPU 1, at 100 %, with no
        // reconfiguration.
        let mut mig_off = gpu("a100-80gb", 1);
        mig_off.mig_enabled = false;
        let mut fixed = whole_instance_gpu(1, 2);
        fixed.layout_fixed = true;
        for (idle, profile_id) in [
            (whole_instance_gpu(1, 2), Some(0)),
            (mig_off, None),
            (fixed, Some(0)),
        ] {
            let (mut node, busy) = whole_instance_node();
            node.gpus.push(idle);
            let mut running = job(1, JobClass::Offline, 20, 0.5, 0.3);
            running.placed = Some(busy);
            running.mps_share = 50;
            let jobs = [running, job(2, JobClass::Offline, 10, 0.9, 0.3)];
            let plan = Hybrid::mmk(Arc::new(Concave { corunner: 1.0 })).plan(&node, &jobs);
            assert!(plan.steps.is_empty(), "{:?}", plan.steps);
            let new = plan.placements.iter().find(|p| p.job == 2).expect("placed");
            assert_eq!(
                (new.slot, new.mps_share),
                (
                    Slot {
                        gpu: 1,
                        start: 0,
                        profile_id
                    },
                    100
                ),
                "{profile_id:?}"
            );
        }
    }

    /// The memo and the skipping of refused kinds only save work: a planner that has
    /// answered many passes before plans exactly as a new one, and as one without either
    /// shortcut, over jobs of repeated kinds (same profile, different SLOs, memory,
    /// movability) arriving and finishing at random.
    #[test]
    fn remembered_answers_are_the_answers() {
        use crate::plan::apply;
        let kinds = [
            (JobClass::Online, 10, 0.3, 0.2, Some((4.0, 12)), false),
            (JobClass::Online, 10, 0.3, 0.2, Some((4.0, 6)), false),
            (JobClass::Online, 10, 0.3, 0.2, None, false),
            (JobClass::Offline, 20, 0.6, 0.5, None, true),
            (JobClass::Offline, 20, 0.6, 0.5, None, false),
            (JobClass::Offline, 70, 0.6, 0.5, None, true),
            (JobClass::Offline, 40, 0.9, 0.3, None, true),
            (JobClass::Offline, 5, 0.2, 0.8, None, false),
        ];
        for make in [Hybrid::mmk, Hybrid::miger, Hybrid::miso] {
            let model: Arc<dyn PerfModel> = Arc::new(AnalyticModel::default());
            let warm = make(Arc::clone(&model));
            SKIPPED.set(0);
            let mut rng = mmk_core::rng::Rng::new(7);
            let mut node = NodeState {
                gpus: vec![gpu("a100-80gb", 0), gpu("a100-80gb", 1)],
            };
            let mut jobs: Vec<JobDemand> = Vec::new();
            let mut next = 1;
            for step in 0..60 {
                for _ in 0..rng.below(4) {
                    let (class, gib, sm, bw, lat, movable) = kinds[rng.below(kinds.len())];
                    let mut j = job(next, class, gib, sm, bw);
                    if let Some((solo, slo)) = lat {
                        j.profile.solo_latency_ms = Some(solo);
                        j.slo_ms = Some(slo);
                    }
                    j.movable = movable;
                    jobs.push(j);
                    next += 1;
                }
                let plan = warm.plan(&node, &jobs);
                let fresh = make(Arc::clone(&model)).plan(&node, &jobs);
                assert_eq!(plan, fresh, "{} at step {step}", warm.name());
                let reference = make(Arc::clone(&model)).forgetful().plan(&node, &jobs);
                assert_eq!(
                    plan,
                    reference,
                    "{} at step {step}, no shortcuts",
                    warm.name()
                );
                (node, jobs) = apply(&node, &jobs, &plan);
                // Some placed jobs finish.
                jobs.retain(|j| j.placed.is_none() || rng.below(3) > 0);
            }
            assert!(
                warm.memo().config.len() > 10,
                "{}: the memo was used",
                warm.name()
            );
            assert!(
                SKIPPED.get() > 0,
                "{}: refused kinds were skipped",
                warm.name()
            );
        }
    }

    #[test]
    fn a_job_whose_partition_vanished_is_not_lost() {
        let node = NodeState {
            gpus: vec![gpu("a100-80gb", 0)],
        };
        let mut gone = job(1, JobClass::Offline, 10, 0.5, 0.3);
        gone.placed = Some(Slot {
            gpu: 0,
            start: 4,
            profile_id: Some(9),
        });
        gone.mps_share = 60;
        let plan = mmk().plan(&node, &[gone]);
        assert_eq!(plan.placements.len(), 1);
        assert_eq!(plan.placements[0].mps_share, 60);
    }

    #[test]
    fn the_candidate_layouts_are_maximal() {
        let m = catalog::model("a100-80gb").expect("model");
        let layouts = maximal_layouts(&m);
        assert!(!layouts.is_empty());
        assert!(layouts.iter().any(|l| l == &vec![(0, 0)]), "the 7g alone");
        for l in &layouts {
            assert!(
                l.iter()
                    .all(|(id, _)| !m.profile(*id).is_some_and(|p| p.media_extensions))
            );
            let slices: u8 = l
                .iter()
                .filter_map(|(id, _)| m.profile(*id))
                .map(|p| p.memory_slices)
                .sum();
            assert!(slices >= 7, "{l:?} leaves room");
        }
    }
}
