//! MMK's hybrid partition scheduler (MMK paper, Algorithm 1) with the fixes of
//! docs/architecture.md items 5 to 9, and the MIGER and MISO baselines as readings of the same
//! search with different options.
//!
//! One pass, for the jobs waiting now. A running MPS client's share cannot change, so a
//! placed job changes share only by a move (checkpoint and restart), which only
//! checkpointable offline jobs make and which must pay for itself:
//!
//! 0. **GPUs held for jobs that have waited long** (`reserve.rs`, MMK only): the offline
//!    jobs that have waited past `reserve_after` try first and alone, the oldest first
//!    (with the shortcuts, one of each kind while none is placed and no SLO refuses one);
//!    where nothing holds one, the GPU whose jobs hold the least memory is held for it
//!    (after the first, only for a job that fits in half of it; one GPU is never held),
//!    and the steps below plan without the held GPUs.
//! 1. Waiting jobs are sorted (`order.rs`) by priority, then (`smallest_first`, MMK) those
//!    that have waited past `reserve_after` first, the oldest first, then the others by
//!    memory, smallest first (Algorithm 1, line 1, sorts by memory without a direction;
//!    without the option, largest first).
//! 2. **MPS first** (lines 3-10): each job goes, if it can, into an existing partition of
//!    any GPU that runs jobs, the one where it adds the most predicted system throughput
//!    (STP). A partition meets a job when its free memory holds the job and the MPS shares
//!    of its jobs leave at least 10 % (docs/architecture.md, item 5). `MPSConfig` chooses the new job's
//!    share. Two rules keep MPS-first from locking GPUs into one big shared instance
//!    (found on the measured ground truth, lab/runs/2026-11-21-vm-simulate/README.md):
//!    - sharing must add throughput: a job joins running jobs only when the partition's
//!      STP grows by at least `min_colocation_gain` (MMK: half) of the newcomer's own
//!      predicted performance. When co-runners mostly slow each other down, the newcomer
//!      takes a partition of its own (step 3) where there is one, and joins them only as a
//!      last resort (step 5). The layout search applies the same rule when it packs a job
//!      next to others;
//!    - an instance without jobs is left to the layout search, which may keep it, reshape
//!      it or share it among several waiting jobs; MPS-first takes it only for a job that
//!      search left waiting.
//! 3. **MIG reconfiguration** (lines 11-21), for the jobs still waiting: for each GPU, every
//!    maximal MIG layout that keeps each busy instance where it is (so no slice that hosts
//!    a job, online or not, changes) is a candidate. Each candidate re-packs the waiting
//!    jobs first-fit decreasing on memory and runs `MPSConfig` per partition
//!    (docs/architecture.md, item 6). Its score is the GPU's predicted STP minus `reconfig_cost` per instance
//!    created or destroyed. The GPU whose best candidate gains the most takes its jobs;
//!    this repeats while some GPU gains.
//! 4. **Shares grow back** (line 6: "when jobs arrive or complete, we update the MPS
//!    settings for offline jobs"): in each partition whose shares leave room, the
//!    checkpointable offline jobs' shares grow into it, 10 % at a time to the job whose
//!    raise adds the most STP (the others' stay), and they move when the partition's STP
//!    grows by more than `move_cost` per moved job.
//!    **Starved jobs are lifted** (`rebalance.rs`, `lift`; `lift_starved`): in a
//!    partition without online jobs whose shares are spent, the checkpointable offline
//!    job whose raise to the most an offline job may take adds the most STP moves to it,
//!    as plain MPS would run it, when that adds more than `move_cost`.
//!    **Jobs alone on a GPU widen** (`rebalance.rs`, `widen`): where nothing waits, the
//!    checkpointable offline jobs of a GPU's only busy partition, an instance smaller than
//!    the GPU, move into the layout step 3 finds best for them on that GPU when its STP
//!    grows by more than the moves cost.
//!    **Starved jobs spread** (`rebalance.rs`, `spread`): where nothing waits and at least
//!    a third of the GPUs run nothing, a checkpointable offline job that shares a
//!    partition and is predicted below `spread_below` of its speed alone moves to a GPU
//!    that runs nothing, when the STP grows by more than the move costs.
//!    **Jobs asked to leave** (`rebalance.rs`, `evict`): a checkpointable offline job whose
//!    partition the node's SLO control cannot otherwise keep an online job's objective in
//!    (`JobDemand::leave`) moves to another GPU where it fits, whatever the gain.
//! 5. **No job waits while memory is free beside running jobs** (`share_before_waiting`,
//!    MMK only; docs/architecture.md, "Job profiles"): a job that steps 2 to 4 left waiting joins the
//!    partition where its memory fits and it adds the most STP, whatever the gain; where
//!    the shares are spent and no online job runs, it joins as plain MPS would take it
//!    (shares are caps, not reservations) with the share MPSConfig picks. A partition with
//!    an online job is not oversubscribed, unless the node keeps the online jobs'
//!    objectives at run time (`slo_guarded`: then an offline job joins it where every
//!    predicted SLO holds), or the newcomer is online, no more jobs wait than the node has
//!    GPUs, and every online job there keeps its predicted SLO with room to spare
//!    (`online_past_shares`: then it joins at 100 %); an offline job joins none that runs
//!    `crowd_max` jobs already. A job with `exclusive` neither joins nor is joined.
//!
//! **One user per partition**, in every step: a job joins a partition only where the jobs
//! there run as its user ([`JobDemand::shares_with`]); an MPS control daemon serves one
//! user's server at a time, and queues another user's clients until it exits.
//!
//! **Online work first** (`online_first`, MMK only): where online and offline jobs share a
//! partition, each class has 100 % of shares of its own (docs/architecture.md, item 5 holds per class),
//! and an online job joining offline ones takes all the online budget left, so that it
//! runs at least as fast as under plain MPS while the kernel gate holds offline kernels
//! behind its own. An online job never waits behind offline work for shares.
//! 6. A plan that breaks a predicted SLO of an online job is never chosen (docs/architecture.md, item 7).
//! 7. **Online precedence** (`online_first`): an online job still waiting for memory takes
//!    it from offline jobs: those placed but not started first, then checkpointable ones
//!    that run, which the plan stops and requeues (`Plan::preempted`; `preempt.rs`).
//!
//! `MPSConfig` (lines 24-35) here: each new job starts at 10 %; online jobs with an SLO
//! are raised until their predicted latency meets it; then the remaining share goes 10 % at
//! a time to the job whose raise adds the most STP, until no raise helps; on a calm node
//! (`best_share_when_calm`) the newcomer takes the share of best predicted STP instead, and
//! where more jobs wait than the node has GPUs its share climbs past a step that adds
//! nothing to one that adds `plateau_gain` a step (as running checkpointable jobs' shares
//! do in steps 2 and 4). Shares of jobs already running stay, unless they move (steps 2
//! and 4).
//!
//! Baselines, as we read their papers:
//! - **MIGER** packs jobs into MIG partitions and tunes MPS shares, like MMK, but its model
//!   ignores co-runners (it is not contention-aware), it does not prefer the current layout
//!   (no MPS-first step, no reconfiguration cost), and it has no kernel scheduler.
//! - **MISO** gives each job a MIG partition of its own (MPS is used only to profile jobs,
//!   which the simulator models, not the planner) and picks the layout that maximizes
//!   predicted throughput; jobs wait FCFS when nothing fits.
//!
//! Both move checkpointable offline jobs (`repartition_busy`): the layout search may lay a
//! busy GPU out again, restarting those jobs in the new instances, when a job arrives and
//! when one leaves (MISO checkpoints a GPU's jobs and repartitions it on both; MIGER, which
//! changes MIG sizes and MPS shares as jobs come and go, can only do so with running jobs
//! by the same checkpoints), and MIGER chooses its movable jobs' shares again (step 4),
//! each move paying `move_cost` as MMK's do. Neither moves a job that cannot checkpoint.
//!
//! The code follows the steps, a file each beside this one: `reserve.rs` (step 0),
//! `mps_first.rs` (step 2),
//! `layout_search.rs` (step 3, with the candidate layouts), `rebalance.rs` (moves, and
//! step 4); `mps_config.rs` (MPSConfig, which steps 2 and 3 ask), `alone.rs` (what a job
//! would add in an instance of its own, which step 2 weighs), `partition.rs` (partitions
//! during the search, and what the model predicts of one), and the shortcuts: `memo.rs`
//! (with answers by numbered partition states and kinds of job, which steps 2 and 3 ask
//! pass after pass), `kinds.rs`, MPS-first asking one partition of each state and
//! remembering each kind's choice (`mps_first.rs`, `distinct_parts`, `choose_remembered`),
//! the layout search remembering GPU states that place none of the kinds waiting
//! (`layout_search.rs`, `best_layout_for`, with each GPU's state numbered once a pass
//! while it stays as it was: `partition.rs`, `GpuStates`), step 0 not trying alone a job
//! of a kind that stayed waiting since the last placement, unless an SLO refused it
//! (`reserve.rs`), and step 7 asking once per kind; `preempt.rs`
//! (step 7) and `reasons.rs` (why a job waits). This file
//! holds the options, the constructors and the pass itself (`Planner::plan`), which runs
//! the steps in order.

mod alone;
mod kinds;
mod layout_search;
mod memo;
mod mps_config;
mod mps_first;
mod order;
mod partition;
mod preempt;
mod reasons;
mod rebalance;
mod reserve;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use mmk_core::JobClass;
use mmk_core::fasthash::{FastMap, FastSet};

use crate::layout::GpuState;
use crate::model::PerfModel;
use crate::plan::{
    JobDemand, JobPlacement, NodeState, Plan, Planner, Preemption, QueuedJob, Step,
    largest_partition_mib,
};

use kinds::Kinds;
pub use layout_search::maximal_layouts;
use layout_search::{Asking, Layout};
use memo::Memo;
use mps_config::Raise;
use partition::{GpuPlan, Progress};
use reasons::{Crowd, waiting_reason};

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
    /// Step 5 of the module docs: a job that every other step left waiting joins a
    /// partition where its memory fits and every SLO there holds, even if sharing adds
    /// less than `min_colocation_gain`, and even where the shares are spent if no online
    /// job runs there (`mps_config.rs`).
    pub share_before_waiting: bool,
    /// Where online and offline jobs meet in a partition, each class has 100 % of shares of
    /// its own, and an online newcomer takes all its class leaves (`mps_config.rs`): it
    /// runs at least as fast as under plain MPS, and the kernel gate gives its kernels
    /// precedence.
    pub online_first: bool,
    /// On a node where at least this many jobs arrived since one last had to wait
    /// (`NodeState::calm_arrivals`), at least a quarter of the GPUs run nothing and every
    /// waiting job could have one of them, a newcomer takes the MPS share the model
    /// predicts best (`mps_config::Raise`); else, and with `None`, its share grows while a
    /// step adds throughput.
    pub best_share_when_calm: Option<u64>,
    /// An offline job's MPS share is at most this many percent (a multiple of 10): its
    /// kernels never take more of the partition's SMs, so online jobs that join later find
    /// the rest free of them (a running client's share cannot change; under `online_first`
    /// an online newcomer's own share is not affected). 100: no cap (`mmkd
    /// --offline-share-max`).
    pub offline_share_max: u8,
    /// Step 5 lets an offline job join a partition only while it runs fewer than this
    /// many jobs ([`CROWD_MAX`] for MMK); `None`: any number.
    pub crowd_max: Option<usize>,
    /// Step 4c (`rebalance.rs`, `spread`): where nothing waits and a third of the GPUs run
    /// nothing, a checkpointable offline job that shares its partition and is predicted
    /// below this fraction of its speed alone moves to an idle GPU when that pays
    /// ([`STARVED`] for MMK); `None`: never.
    pub spread_below: Option<f64>,
    /// Where raising a share one step adds no throughput (the model's predictions have
    /// plateaus and dips), the share still grows to a higher one that adds at least this
    /// much STP a step ([`PLATEAU_GAIN`] for MMK); `None`: a raise stops at the first step
    /// that adds nothing.
    pub plateau_gain: Option<f64>,
    /// The node keeps online jobs' latency objectives at run time (mmkd's SLO control,
    /// docs/slo.md), holding a job that gives none to this slowdown against running alone:
    /// in step 5 an offline job that would wait joins a partition where online jobs run
    /// even past its class's shares, as plain MPS would take it, where every predicted SLO
    /// there holds, the default one included (`mps_config.rs`). `None` (the simulator's
    /// planners, or mmkd without the control): it does not.
    pub slo_guarded: Option<f64>,
    /// **Busy GPUs repartitioned** (`rebalance.rs`, `repartition`): the layout search may
    /// also lay a GPU out again with its checkpointable offline jobs moved, for the jobs
    /// that wait (step 3), and, where nothing waits, for the jobs it runs when one left
    /// (step 4b), when the predicted STP grows by more than the moves cost. MISO's way
    /// (it checkpoints a GPU's jobs and repartitions it as jobs arrive and finish) and, as
    /// we read it, MIGER's. Without it (MMK) step 3 keeps busy instances, and step 4b
    /// lays out again only a GPU whose one busy partition, smaller than the GPU, holds
    /// checkpointable offline jobs alone: asking every GPU in every pass made MMK's passes
    /// on 128 GPUs at least three times slower.
    pub repartition_busy: bool,
    /// An offline job that cannot checkpoint keeps the share it starts with for life,
    /// also after its co-runners leave: it starts at least at the share at which, alone in
    /// its partition, it is predicted this fraction of its speed at the most it could take
    /// there ([`LASTING`] for MMK; `mps_config.rs`). `None`: no floor.
    pub lasting_share: Option<f64>,
    /// Step 0 (`reserve.rs`): the offline jobs that have waited this many seconds
    /// ([`RESERVE_AFTER`] for MMK) try first and alone, the oldest first; where nothing
    /// holds one on a node of several GPUs, the GPU whose jobs hold the least memory is
    /// held for it (after the first, only for a job that fits in half of it, and never the
    /// last GPU not held): no other waiting job starts there until it does. `None`: no job
    /// is held for.
    pub reserve_after: Option<f64>,
    /// Step 5 for online jobs: where no more jobs wait than the node has GPUs, an online
    /// job that would wait joins a partition where online jobs run even past its class's
    /// shares, at 100 % as plain MPS would take it, where every online job there is
    /// predicted to meet its SLO with this factor to spare (its predicted performance
    /// divided by it still meets the SLO; [`ONLINE_PAST_SHARES`] for MMK). `None`: an
    /// online job waits for shares.
    pub online_past_shares: Option<f64>,
    /// Step 4 past spent shares (`rebalance.rs`, `lift`): in a partition without online
    /// jobs whose shares are spent, the checkpointable offline job whose raise to the most
    /// an offline job may take adds the most predicted STP moves to it, as plain MPS would
    /// run it, when that adds more than the move costs. Without it a job that joined a
    /// crowd at 10 % kept crawling there after its co-runners left, while the one that
    /// took the rest ran on.
    pub lift_starved: bool,
    /// Step 1: waiting jobs of one priority are tried smallest memory first, after those
    /// that have waited past `reserve_after`, oldest first ([`SMALLEST_FIRST`] for MMK).
    /// `false`: largest memory first, as first-fit decreasing packs.
    pub smallest_first: bool,
}

/// What a move (checkpoint and restart) costs in predicted STP, for MMK and for the
/// baselines that move jobs: a tenth of a job's speed alone on a whole GPU, so that a move
/// that adds less does not happen.
const MOVE_COST: f64 = 0.1;

/// MPS shares are chosen in steps of this many percent (docs/architecture.md, item 6).
const SHARE_STEP: u8 = 10;

/// MMK's `crowd_max`: the most jobs a partition runs before the last resort (step 5)
/// stops adding offline jobs to it. Past the shares, each job of a crowd gets its share
/// scaled down and is slowed by every co-runner; the forests have seen at most two
/// co-runners (mmkd's built-in one, one; the measurements, three), so they cannot tell
/// where a crowd stops paying. Where memory lets crowds grow (the H200's 141 GB), trainings
/// joined partitions of more than eight jobs and crawled there: at 20 and 40 s between
/// arrivals MMK's makespan was 22 % and 16 % behind MISO's on the measured ground truth.
/// The cap was chosen on that case and on 10 % online jobs (whose trainings gain from
/// sharing): at 4 or 5 MMK's mean JCT with 10 % online rose 15-27 %, at 8 the H200 stayed
/// 5 % behind at 20 s, at 6 the H200 came within 1.4 % of MISO's makespan at 20 s and 6 %
/// ahead at 40 s. The other setups moved by 2.5 % or less, but for 128 GPUs at 2.5 s, whose
/// makespan grew 4.4 % (one seed; lab/runs/2026-11-26-vm-crowd-cap), which starved jobs
/// spreading ([`STARVED`]) more than took back.
pub const CROWD_MAX: usize = 6;

/// MMK's `lasting_share`: an offline job that cannot checkpoint starts at a share at which,
/// alone in its partition, it would run at least at 0.7 of its speed with the most it could
/// take there. Joining a crowd past the shares at 10 %, a transformer training that could
/// not move ran at 0.065 of its solo speed for hours after its co-runners had left, and set
/// the makespan (16x its solo time). At half its speed (0.5), a ResNet-152 training that
/// joined two services at 30 % ran at 0.55 of its solo speed for its whole life, long
/// after they had ended: with online jobs joining each other past the shares
/// (`online_past_shares`) that came more often, and MMK's average JCT on 5- and 6-job
/// traces on 2 GPUs (seeds 1-30) grew 0.5-3.3 % at 20-80 s. At 0.7 it is within 1.4 % of
/// what it was without that rule, with the online time out of SLO cut from 9-36 % to
/// 7-14 %, and on the paper's setup (seeds 1-5) MMK's offline JCT moves 0.2-2.4 points
/// toward the best baseline's, or further ahead of it, at every rate (on held-out seeds,
/// with the other two rules, it moved 1.0 and 6.1 points away at 20 and 40 s). At 0.85 the 5-job
/// traces ran up to 0.9 % faster still and the 6-job ones spent up to 1.6 points more
/// online time out of SLO (docs/results.md, "Why MMK's rules").
pub const LASTING: f64 = 0.7;

/// MMK's `reserve_after`: offline jobs submitted 3 hours ago and still waiting get GPUs
/// held for them (`reserve.rs`). Under the paper's load (a job every 20-40 s on 8 GPUs)
/// MMK's services took the memory trainings needed; with one GPU held, for the oldest job
/// past 4 h, the slowest 5 % of offline jobs still took 47x and 31x their solo time, 11 %
/// and 23 % more than the best baseline. Held for every job past 3 h while services wait
/// that long too (after the first, for jobs that fit in half a GPU), that tail came to 36x
/// and 23x, 6-15 % ahead of every baseline, and the makespan and STP ahead too, for online
/// JCT 1.8-2.5x longer (still 21-53 % below the best baseline's), on the seeds the rule was
/// set on (1-5) and on held-out ones (81-85; docs/results.md, "On equal terms"). Holding
/// for jobs of more than half a GPU, an A30 node's services waited 4-40x longer; holding
/// while services were served promptly, an A100-40GB node's online JCT fell 16 % behind the
/// best baseline's (with the rule, 5.5 %); past 2 h, online JCT grew more than the tail
/// fell. At lighter loads no job waits that long.
pub const RESERVE_AFTER: f64 = 3.0 * 3600.0;

/// MMK's `smallest_first`: Algorithm 1 sorts the waiting jobs by memory (line 1) without a
/// direction. Served largest first, the large jobs took the memory that ending jobs freed
/// while several small ones waited. Served smallest first (found on seeds 1-3 of twelve
/// cells of the grid and of the paper's setup, seeds 1-5 of 20-job traces; measured on
/// held-out seeds), MMK's average JCT over those cells at 20-80 s and the paper's setup at
/// 20-160 s fell 12.0 % on the mean (52 % at most; longer in 5 of the 40 cells, by 2.3 %
/// at most), online JCT 22.9 % and offline JCT 2.3 %; the mean gap to the best schedules
/// of 20-job traces went from 39 / 30 / 23 / 19 % to 27 / 25 / 19 / 20 % at 20 / 40 / 80 /
/// 160 s. Over the grid's 360 cells, offline JCT is more than 1 % behind the best baseline
/// in 111 (was 133) and the makespan in 26 (was 11; by 2.4 % in the median cell, 9.3 % at
/// most): a large job waits while smaller ones take the memory that frees
/// (lab/runs/2026-11-29-vm-smallest-first). Jobs that have waited past `reserve_after` go
/// first whatever their size.
pub const SMALLEST_FIRST: bool = true;

/// MMK's `spread_below`: a checkpointable offline job predicted below a quarter of its
/// speed alone moves to a GPU that runs nothing, where nothing waits, at least a third of
/// the GPUs run nothing, and the move pays. Every sharing job (no threshold) cost the 10 %
/// online case 13 % of average JCT at 80 s and 12 % at 160 s, and its online jobs' SLO:
/// spread jobs took the idle GPUs that later arrivals needed. With no idle share asked,
/// the paper's setup lost 2.6 % of average JCT at 40 s; with a quarter of the GPUs idle,
/// 1.1 %; with a third, nothing (lab/runs/2026-11-26-vm-spread).
pub const STARVED: f64 = 0.25;

/// MMK's `plateau_gain`: where a share one step higher adds nothing, a higher one that
/// adds 0.01 of STP a step is still taken. The forest's predictions for a job have plateaus
/// (ResNet-152 training alone at 0.77 of its solo speed at 50 % and at 60 %, 0.95 at 100 %,
/// `mps_config::Raise`), and a raise that stopped on one left the job there for its whole
/// life: on the A30, trainings that no other job's memory fits beside ran alone on their
/// GPUs at 50 %, and MMK's makespan was 3 % behind MISO's at 20 and 40 s between arrivals.
/// Running checkpointable jobs climb wherever their shares are chosen again (steps 2 and
/// 4, `rebalance.rs`); a newcomer climbs only where more jobs wait than the node has GPUs
/// (`Raise::Climb`). Newcomers climbing wherever a job waited for a GPU cost
/// 10 % online jobs at 160 s 1.0 % of average JCT and their online time out of SLO went
/// from 6.6 % to 12.9 %: the online jobs that came later ran beside the larger shares
/// (lab/runs/2026-11-27-vm-plateau).
pub const PLATEAU_GAIN: f64 = 0.01;

/// MMK's `online_past_shares`: past its class's shares an online job joins online ones
/// only where each is predicted to meet its SLO at 1 / 1.3 of its predicted performance.
/// The planners' forest is least sure of crowds. On the paper's setup at 80 s between
/// arrivals (seeds 1-5), with no margin, services that joined others ran below their SLO
/// on the ground truth, and MMK's online time out of SLO went from 8.6 points below the
/// best baseline's to 6.6 above; with 1.3 it is 11.1 below (12.2 with `lift_starved`;
/// 1.15: 9.7, 1.45: 12.2, 1.6: 9.1), and on 20-job traces on 2 GPUs 1.45 and 1.6 left
/// more of the services' time out of SLO than 1.3 (docs/results.md, "Why MMK's rules").
/// Where more jobs wait than the node has GPUs (`Raise::Climb`) no online job joins past
/// the shares: letting them there too put MMK's offline JCT on the paper's setup at 20 s
/// 32 % behind the best baseline's, against 20 %, and on the H200 at 40 s 48 % against 36 %.
pub const ONLINE_PAST_SHARES: f64 = 1.3;

/// MMK's `best_share_when_calm`: arrivals without a wait before a newcomer may take the
/// share the model likes best. On the measured ground truth (`mmk-lab simulate --preset
/// mmk-paper`, seeds 1-5), the best share whenever every waiting job had an idle GPU cost
/// 2-7 % of mean JCT at 20-80 s between arrivals: the jobs placed at calm moments, the
/// first ones above all, hold shares that the arrivals after them need. With 48 calm
/// arrivals and a quarter of the GPUs idle, 20-80 s are within 0.1 % of the greedy raise
/// and 160 and 240 s gain 3-4 % (16 to 96 arrivals gave the same within 1.5 %;
/// docs/results.md, "Why MMK's rules").
const CALM_ARRIVALS: u64 = 48;

#[derive(Debug)]
pub struct Hybrid {
    name: &'static str,
    model: Arc<dyn PerfModel>,
    options: HybridOptions,
    /// Maximal layouts (without `+me` profiles) per GPU model, computed once.
    layouts: Mutex<BTreeMap<String, Arc<Vec<Layout>>>>,
    /// What the model said of partition states asked before.
    memo: Mutex<Memo>,
    /// Take the shortcuts: the memo, skipping kinds of job refused within a pass, and
    /// MPS-first asking one partition of each state (always, but in the test that checks
    /// them against a planner without them, `remembered_answers_are_the_answers`).
    shortcuts: bool,
}

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

    /// The same planner with offline jobs' MPS shares capped at `pct` %
    /// (`HybridOptions::offline_share_max`; rounded down to a multiple of 10, at least 10).
    pub fn with_offline_share_max(mut self, pct: u8) -> Hybrid {
        self.options.offline_share_max = (pct.min(100) / SHARE_STEP).max(1) * SHARE_STEP;
        self
    }

    /// See [`HybridOptions::slo_guarded`]: `default_slowdown` is the objective the node
    /// holds an online job that gives none to; `None` turns the guard off.
    pub fn with_slo_guard(mut self, default_slowdown: Option<f64>) -> Hybrid {
        self.options.slo_guarded = default_slowdown;
        self
    }

    /// The same planner without the memo, without skipping refused kinds and asking every
    /// partition: the reference the shortcuts are tested against.
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
    /// arrivals in the simulation sweep (seeds 1-3; lab/runs/2026-11-21-vm-simulate/),
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
                move_cost: Some(MOVE_COST),
                min_colocation_gain: 0.5,
                share_before_waiting: true,
                online_first: true,
                best_share_when_calm: Some(CALM_ARRIVALS),
                offline_share_max: 100,
                slo_guarded: None,
                crowd_max: Some(CROWD_MAX),
                spread_below: Some(STARVED),
                plateau_gain: Some(PLATEAU_GAIN),
                repartition_busy: false,
                lasting_share: Some(LASTING),
                reserve_after: Some(RESERVE_AFTER),
                online_past_shares: Some(ONLINE_PAST_SHARES),
                lift_starved: true,
                smallest_first: SMALLEST_FIRST,
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
                move_cost: Some(MOVE_COST),
                min_colocation_gain: 0.0,
                share_before_waiting: false,
                online_first: false,
                best_share_when_calm: None,
                offline_share_max: 100,
                slo_guarded: None,
                crowd_max: None,
                spread_below: None,
                plateau_gain: None,
                repartition_busy: true,
                lasting_share: None,
                reserve_after: None,
                online_past_shares: None,
                lift_starved: false,
                smallest_first: false,
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
                move_cost: Some(MOVE_COST),
                min_colocation_gain: 0.0,
                share_before_waiting: false,
                online_first: false,
                best_share_when_calm: None,
                offline_share_max: 100,
                slo_guarded: None,
                crowd_max: None,
                spread_below: None,
                plateau_gain: None,
                repartition_busy: true,
                lasting_share: None,
                reserve_after: None,
                online_past_shares: None,
                lift_starved: false,
                smallest_first: false,
            },
        )
    }
}

/// What decides a GPU's best layout, without its index: model, mode, instances (with
/// their driver IDs) and the jobs in them, and the instances the plan destroys.
type Signature<'a> = (
    &'a str,
    bool,
    bool,
    Vec<(Option<u32>, u8, Option<u32>, Vec<(usize, u8)>)>,
    &'a [(crate::plan::Slot, u32)],
);

fn signature<'a>(gpu: &'a GpuState, plan: &'a GpuPlan) -> Signature<'a> {
    let parts = plan
        .parts
        .iter()
        .map(|p| {
            let members = p.members.iter().map(|m| (m.job, m.share)).collect();
            (p.slot.profile_id, p.slot.start, p.existing, members)
        })
        .collect();
    (
        &gpu.model.key,
        gpu.mig_enabled,
        gpu.layout_fixed,
        parts,
        &plan.destroyed,
    )
}

impl Hybrid {
    /// How MPSConfig raises newcomers' shares in a pass over `waiting` jobs
    /// (`HybridOptions::best_share_when_calm`): the best share on a calm node where at
    /// least a quarter of the GPUs, and one per waiting job, run nothing; where more jobs
    /// wait than the node has GPUs, past plateaus (`HybridOptions::plateau_gain`; without
    /// it, as `Greedy`) and no online job past the shares (`online_past_shares`); else a
    /// step at a time while a step adds.
    fn raise(&self, node: &NodeState, plans: &[GpuPlan], waiting: usize) -> Raise {
        let idle = idle_gpus(plans);
        match self.options.best_share_when_calm {
            Some(calm)
                if node.calm_arrivals >= calm && waiting <= idle && idle * 4 >= plans.len() =>
            {
                Raise::Best
            }
            _ if waiting > plans.len() => Raise::Climb,
            _ => Raise::Greedy,
        }
    }

    /// The layout search (step 3), GPU by GPU: each round the GPU whose best layout gains
    /// the most takes it, until no layout gains or no job waits.
    fn search_layouts(&self, node: &NodeState, jobs: &[JobDemand], p: &mut Progress) {
        while !p.waiting.is_empty() {
            // Candidates are packed first-fit decreasing, whatever order step 1 serves in.
            let packing = self.packing_order(jobs, &p.waiting);
            let mut best: Option<LayoutChoice> = None;
            // GPUs in the same state get the same answer: only the first of them is asked,
            // since a later one's equal gain never beats it.
            let mut seen: FastSet<Signature> = FastSet::default();
            let waiting_kinds = p.kinds.distinct(&p.waiting);
            let set = self
                .shortcuts
                .then(|| self.kind_set_number(&waiting_kinds, &p.kinds))
                .flatten();
            // SLO marks per kind, from what the memo knew of GPU states.
            let mut marks = vec![false; p.kinds.count()];
            for (gi, gpu) in node.gpus.iter().enumerate() {
                // A GPU that runs a job is in a state of its own (a job runs in one
                // partition): with the shortcuts, only GPUs without jobs are told apart.
                let own_state =
                    self.shortcuts && p.plans[gi].parts.iter().any(|x| !x.members.is_empty());
                if !own_state && !seen.insert(signature(gpu, &p.plans[gi])) {
                    continue;
                }
                let gpu_number = set.map(|_| p.gpu_states.number(self, jobs, gpu, &p.plans[gi]));
                let asking = Asking {
                    waiting: &packing,
                    kinds: &waiting_kinds,
                    set,
                    gpu_number,
                    of: &p.kinds,
                    slo_blocked: &mut p.slo_blocked,
                    marks: &mut marks,
                    raise: p.raise,
                };
                let answer = self.best_layout_for((gpu, &p.plans[gi]), jobs, asking);
                if let Some((gain, plan, placed)) = answer
                    && gain > 1e-9
                    && best.as_ref().is_none_or(|(g, ..)| gain > *g + 1e-9)
                {
                    best = Some((gain, gi, plan, placed, Vec::new()));
                }
                // The same GPU laid out again with its checkpointable jobs moved.
                if !self.options.repartition_busy {
                    continue;
                }
                let answer = self.repartition(
                    (gpu, &p.plans[gi]),
                    jobs,
                    &packing,
                    &p.kinds,
                    &p.moved,
                    p.raise,
                );
                if let Some((gain, plan, placed, movers)) = answer
                    && gain > 1e-9
                    && placed.iter().any(|j| p.waiting.contains(j))
                    && best.as_ref().is_none_or(|(g, ..)| gain > *g + 1e-9)
                {
                    best = Some((gain, gi, plan, placed, movers));
                }
            }
            for &j in &p.waiting {
                p.slo_blocked[j] |= marks[p.kinds.kind(j)];
            }
            let Some((_, gi, plan, placed, movers)) = best else {
                break;
            };
            let destroyed = std::mem::take(&mut p.plans[gi].destroyed);
            p.plans[gi] = plan;
            p.plans[gi].destroyed.extend(destroyed);
            p.waiting.retain(|j| !placed.contains(j));
            p.moved.extend(movers);
        }
    }
}

/// A GPU's best layout in a round of the search: its gain, the GPU, its new plan, the jobs
/// placed, the jobs moved.
type LayoutChoice = (f64, usize, GpuPlan, Vec<usize>, Vec<usize>);

impl Hybrid {
    /// Steps 2, 3 and 5 for the jobs `p` has waiting: MPS-first, the layout search, and
    /// the last resort.
    fn place_waiting(&self, node: &NodeState, jobs: &[JobDemand], p: &mut Progress) {
        if self.options.mps_first {
            self.mps_first(node, jobs, p, true, false);
        }
        self.search_layouts(node, jobs, p);
        // A job deferred to the layout search that found nothing better still takes the
        // place MPS-first had for it.
        if self.options.mps_first && !p.waiting.is_empty() {
            self.mps_first(node, jobs, p, false, false);
        }
        // No job waits while memory beside running jobs would hold it.
        if self.options.share_before_waiting && !p.waiting.is_empty() {
            self.mps_first(node, jobs, p, false, true);
        }
    }

    /// The pass's steps, in order (module docs), on `p`. Returns what waiting jobs are told
    /// of the GPUs held for jobs that have waited long (step 0), a line each.
    fn steps(&self, node: &NodeState, jobs: &[JobDemand], p: &mut Progress) -> Vec<String> {
        // Offline jobs that have waited long go first; for those that nothing holds, GPUs
        // are held: the rest of the pass plans without them.
        let holds = self.reserve(node, jobs, p);
        let node = holds.node();
        self.place_waiting(node, jobs, p);
        self.regrow(jobs, p);
        self.widen(node, jobs, p);
        self.spread(node, jobs, p);
        self.evict(node, jobs, p);
        // An online job never waits for memory that checkpointable offline work holds.
        if self.options.online_first && p.waiting.iter().any(|&j| jobs[j].class == JobClass::Online)
        {
            self.preempt_for_online(jobs, p);
        }
        holds.give_back(jobs, p)
    }
}

/// The GPUs of `plans` that run nothing.
fn idle_gpus(plans: &[GpuPlan]) -> usize {
    plans
        .iter()
        .filter(|gp| gp.parts.iter().all(|p| p.members.is_empty()))
        .count()
}

impl Planner for Hybrid {
    fn name(&self) -> &'static str {
        self.name
    }

    fn plan(&self, node: &NodeState, jobs: &[JobDemand]) -> Plan {
        let waiting = self.served_order(jobs);
        let plans = self.current(node, jobs);
        let raise = self.raise(node, &plans, waiting.len());
        let kinds = {
            let mut memo = self.memo();
            memo.between_passes();
            Kinds::new(jobs, &mut memo)
        };
        let mut p = Progress {
            plans,
            waiting,
            slo_blocked: vec![false; jobs.len()],
            moved: BTreeSet::new(),
            preempted: Vec::new(),
            kinds,
            raise,
            part_states: Default::default(),
            gpu_states: Default::default(),
        };

        let held_notes = self.steps(node, jobs, &mut p);
        let Progress {
            plans,
            mut waiting,
            slo_blocked,
            moved,
            preempted,
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
        out.preempted = preempted
            .iter()
            .map(|&(j, by)| Preemption {
                job: jobs[j].id,
                for_job: jobs[by].id,
            })
            .collect();
        let mut planned: BTreeSet<u64> = out
            .placements
            .iter()
            .map(|p| p.job)
            .chain(out.preempted.iter().map(|p| p.job))
            .collect();
        for j in jobs.iter().filter(|j| j.placed.is_some()) {
            if let Some(slot) = j.placed
                && planned.insert(j.id)
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
                // The job's first placement (placements are sorted by job).
                let id = jobs[j].id;
                let first = out.placements.partition_point(|p| p.job < id);
                let p = out.placements.get(first).filter(|p| p.job == id);
                p.is_some_and(|p| {
                    Some(p.slot) != jobs[j].placed || p.mps_share != jobs[j].mps_share
                })
            })
            .map(|j| jobs[j].id)
            .collect();
        let largest = largest_partition_mib(node);
        // The cap keeps jobs out only in the last resort.
        let cap = self
            .options
            .crowd_max
            .filter(|_| self.options.share_before_waiting);
        let crowd = Crowd::of(jobs, &plans, cap, self.options.online_past_shares.is_some());
        waiting.sort_unstable_by_key(|&j| (jobs[j].id, j));
        // Jobs that ask for the same wait for the same reason: each reason is written once.
        // What a job asks, as far as why it waits goes: memory, SLO blocked, SLO,
        // exclusive, online, user.
        type Asks = (u64, bool, Option<u64>, bool, bool, Option<u32>);
        let mut reasons: FastMap<Asks, Arc<str>> = FastMap::default();
        let held = held_notes.join("; ");
        for j in waiting {
            let job = &jobs[j];
            let asks: Asks = (
                job.memory_mib,
                slo_blocked[j],
                job.slo_ms,
                job.exclusive,
                job.class == JobClass::Online,
                job.user,
            );
            let reason = reasons.entry(asks).or_insert_with(|| {
                let reason = waiting_reason(jobs, &crowd, largest, slo_blocked[j], j);
                if held.is_empty() {
                    reason.into()
                } else {
                    format!("{reason}; {held}").into()
                }
            });
            out.queued.push(QueuedJob {
                job: job.id,
                reason: reason.clone(),
            });
        }
        out.stp = Some(stp);
        out
    }
}
