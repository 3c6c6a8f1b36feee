//! The reference schedule: the best a planner that knows every arrival and every job's true
//! speed finds for a small trace, and a lower bound on what any schedule of its class can
//! reach. `mmk-lab simulate --policies ...,reference` reports it beside the policies
//! (docs/simulate.md, "Distance from the best schedule").
//!
//! **The class.** Whenever the engine plans (an arrival or a completion), any waiting jobs
//! may start, each with an MPS share from [`ReferenceOptions::shares`], either in an
//! instance that exists (beside the jobs there, when its memory fits) or in a new MIG
//! instance of any profile, at the highest start where it fits beside the busy instances
//! (idle ones in its way are destroyed, the fewest first). A job runs to its end where it
//! started: no moves, no preemption. Every running online job meets its SLO on the true
//! speeds. Making and destroying instances costs what the engine charges. Default's and
//! (where it keeps SLOs) plain MPS's schedules are in the class; MISO's where its instances
//! sit at those starts; MMK's and MIGER's only where they move no job and give shares of
//! the class.
//!
//! **The search.** A pilot search gives the first schedule ([`Search::pilot`]); then depth
//! first over the choices, job by job in arrival order (each job's options, fastest first,
//! then leaving it waiting), with branch and bound on the sum of JCTs. A branch's bound:
//! the JCTs of the jobs done, and every other job ending at the earliest it could at the
//! most the truth says it can run at in any company ([`PerfModel::speed_bound`]) at its
//! share in its instance once placed, else in its best instance, from the earliest moment
//! it can run (a job left waiting waits at least until the next arrival or completion).
//! Where company never helps, that is its speed alone there; on the measured truth, whose
//! pairs sometimes ran faster together than apart, its speed alone times the largest gain
//! a co-runner was measured to bring it. The search checks the truth's every answer
//! against its bound. A search that ends before `node_limit` is exact, and one stopped
//! there keeps the best schedule it found with the least bound of the branches it left as
//! a lower bound on the class's best. A truth that breaks its own bound makes the same
//! pruning a heuristic search: its schedule stands, it is never called exact, and the
//! bound is the jobs' solo times (no job runs faster than alone on a whole GPU).
//!
//! **Prompt online jobs.** With [`ReferenceOptions::prompt_online`] (policy
//! `reference-prompt`) the class keeps online jobs from waiting, as MMK's planner does:
//! an online job that some choice starts with every SLO kept, as its partition stands,
//! starts at that moment. Its best is the best schedule that does not buy average JCT
//! with online jobs' waits, which count as out of SLO. Its search prunes far more, and
//! its class is a part of the other: the search of the whole class runs it first and
//! starts from its best.
//!
//! The schedule found is replayed through [`simulate`] by a planner that follows it
//! ([`Script`]), so its figures come from the same engine as every policy's.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Mutex;

use mmk_core::JobClass;
use mmk_partitioner::{
    CoRunner, GpuModel, JobDemand, JobPlacement, NodeState, PerfModel, Plan, Planner, QueuedJob,
    Slot, Step, catalog, layout,
};
use thiserror::Error;

use crate::engine::{RunResult, SimConfig, SimError, demand, simulate};
use crate::trace::Trace;

mod options;
mod script;

pub use script::Script;

/// The largest trace and node the search takes.
pub const MAX_JOBS: usize = 40;
pub const MAX_GPUS: u32 = 4;

/// How far the search goes.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceOptions {
    /// The MPS shares a job may start with (10 to 100).
    pub shares: Vec<u8>,
    /// Choices (one per planning moment reached) before the search stops; the search of
    /// the whole class runs the prompt class's first, each up to this.
    pub node_limit: u64,
    /// The class keeps online jobs from waiting: an online job that some choice starts
    /// with every SLO kept, as its partition stands, starts (policy `reference-prompt`).
    pub prompt_online: bool,
}

impl Default for ReferenceOptions {
    fn default() -> ReferenceOptions {
        ReferenceOptions {
            shares: vec![100, 50],
            node_limit: 2_000_000,
            prompt_online: false,
        }
    }
}

/// What the search found.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// The best schedule found, replayed through the engine (policy `reference`).
    pub run: RunResult,
    /// No schedule of the class has a smaller sum of JCTs (seconds).
    pub lower_bound_jct_sum_s: f64,
    /// The search visited every branch it did not prune: `run` is the class's best.
    pub exact: bool,
    /// Choices visited.
    pub nodes: u64,
}

impl Reference {
    /// The lower bound as an average JCT.
    pub fn lower_bound_avg_jct_s(&self) -> f64 {
        self.lower_bound_jct_sum_s / self.run.jobs.len().max(1) as f64
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum ReferenceError {
    #[error(
        "{jobs} jobs on {gpus} GPUs: the reference search takes at most {MAX_JOBS} jobs and {MAX_GPUS} GPUs"
    )]
    TooLarge { jobs: usize, gpus: u32 },
    #[error("the reference search needs MPS shares of 10 to 100 %, at least one (got {0:?})")]
    Shares(Vec<u8>),
    #[error(
        "the ground truth runs job {job} at {speed:.4} of its speed alone on a whole GPU; the reference's bound needs at most 1"
    )]
    FasterThanAlone { job: u64, speed: f64 },
    #[error(
        "the reference search found no schedule that runs every job with the online SLOs kept (within its node limit)"
    )]
    NoSchedule,
    #[error("the reference search needs a node of at least one GPU")]
    NoGpu,
    #[error(
        "the engine's replay of the reference schedule gives a JCT sum of {replayed:.3} s, the search's {searched:.3} s"
    )]
    Replay { searched: f64, replayed: f64 },
    #[error(transparent)]
    Sim(#[from] SimError),
}

/// Searches for the best schedule of `trace` on `cfg`'s node, jobs running as `truth`
/// says (module docs).
pub fn solve(
    trace: &Trace,
    cfg: &SimConfig,
    truth: &dyn PerfModel,
    opts: &ReferenceOptions,
) -> Result<Reference, ReferenceError> {
    if trace.jobs.len() > MAX_JOBS || cfg.gpus > MAX_GPUS {
        return Err(ReferenceError::TooLarge {
            jobs: trace.jobs.len(),
            gpus: cfg.gpus,
        });
    }
    if opts.shares.is_empty() || opts.shares.iter().any(|s| !(10..=100).contains(s)) {
        return Err(ReferenceError::Shares(opts.shares.clone()));
    }
    if cfg.gpus == 0 {
        return Err(ReferenceError::NoGpu);
    }
    let model = catalog::model(&cfg.gpu_model)
        .ok_or_else(|| SimError::UnknownModel(cfg.gpu_model.clone()))?;
    let largest = model.largest_instance_mib();
    if let Some((i, j)) = trace
        .jobs
        .iter()
        .enumerate()
        .find(|(_, j)| j.memory_mib > largest)
    {
        return Err(SimError::Stuck {
            job: i as u64 + 1,
            workload: j.workload.name.to_owned(),
            reason: format!(
                "needs {} MiB of GPU memory; the largest instance holds {largest} MiB",
                j.memory_mib
            ),
        }
        .into());
    }
    let mut search = Search::new(trace, cfg, model.clone(), truth, opts, false);
    let mut first_nodes = 0;
    if !opts.prompt_online {
        // The prompt class is a part of this one, and its search, pruned far harder, often
        // finds a better schedule within the node limit: its best is the first incumbent.
        let prompt = ReferenceOptions {
            prompt_online: true,
            ..opts.clone()
        };
        let mut first = Search::new(trace, cfg, model, truth, &prompt, false);
        first.run()?;
        search.best = first.best;
        search.best_decisions = first.best_decisions;
        search.premise.set(first.premise.get());
        first_nodes = first.nodes;
    }
    search.run()?;
    search.nodes += first_nodes;
    finish(search, trace, cfg, truth)
}

fn finish(
    search: Search<'_>,
    trace: &Trace,
    cfg: &SimConfig,
    truth: &dyn PerfModel,
) -> Result<Reference, ReferenceError> {
    let Some(decisions) = search.best_decisions else {
        return Err(ReferenceError::NoSchedule);
    };
    let exact = search.open_bound.is_infinite() && search.premise.get();
    // Where the premise broke, what holds whatever the truth: no job runs faster than
    // alone on a whole GPU.
    let lower_bound = if search.premise.get() {
        search.open_bound.min(search.best)
    } else {
        trace.jobs.iter().map(|j| j.duration_s).sum()
    };
    let script = Script {
        decisions,
        call: Mutex::new(0),
    };
    let run = simulate(trace, cfg, &script, truth, &mut |_, _| {})?;
    let replayed: f64 = run.jobs.iter().map(|j| j.jct_s()).sum();
    if (replayed - search.best).abs() > 1e-6 * search.best.max(1.0) {
        return Err(ReferenceError::Replay {
            searched: search.best,
            replayed,
        });
    }
    Ok(Reference {
        run,
        lower_bound_jct_sum_s: lower_bound,
        exact,
        nodes: search.nodes,
    })
}

/// A partition during the search: an instance that exists, and the jobs placed there
/// (running or starting).
#[derive(Debug, Clone)]
struct Part {
    slot: Slot,
    memory_mib: u64,
    members: Vec<usize>,
}

/// A job in the search (by its index in the trace).
#[derive(Debug, Clone)]
struct JobRun {
    remaining: f64,
    ready_at: f64,
    slot: Option<Slot>,
    share: u8,
}

/// The node and its jobs at a planning moment, as the engine has them.
#[derive(Debug, Clone)]
struct State {
    now: f64,
    /// The next job to arrive.
    next: usize,
    /// Jobs arrived and not finished, in arrival order.
    active: Vec<usize>,
    runs: Vec<JobRun>,
    /// Each GPU's instances.
    gpus: Vec<Vec<Part>>,
    /// JCTs of the jobs finished.
    jct_sum: f64,
    /// What each planning moment so far started.
    decisions: Vec<Vec<JobPlacement>>,
}

/// A planning moment being decided: the jobs it starts, and each GPU's delay (instances
/// made and destroyed), which every job it starts on that GPU waits.
#[derive(Debug, Clone)]
struct Pending {
    started: Vec<usize>,
    /// Per GPU: instances destroyed, instances made.
    steps: Vec<(u32, u32)>,
}

/// Where the engine stopped.
enum Next {
    Plan,
    Done,
    /// A running online job missed its SLO, or waiting jobs can never start.
    Infeasible,
}

struct Search<'a> {
    trace: &'a Trace,
    cfg: &'a SimConfig,
    model: GpuModel,
    truth: &'a dyn PerfModel,
    demands: Vec<JobDemand>,
    opts: &'a ReferenceOptions,
    nodes: u64,
    best: f64,
    best_decisions: Option<Vec<Vec<JobPlacement>>>,
    /// The least bound of the branches left at the node limit.
    open_bound: f64,
    /// Visit every branch, prune none (the tests' brute force).
    brute: bool,
    /// The most each job can run at in any company, by instance profile and share (the
    /// truth's [`PerfModel::speed_bound`]).
    caps: Vec<HashMap<(Option<u32>, u8), f64>>,
    /// Each job's largest cap in any instance that holds it.
    fastest: Vec<f64>,
    /// No speed the truth gave broke its bound (module docs). Where one did, the search's
    /// pruning may have cut the best schedule: the schedule found stands, but it is not
    /// called exact and the bound falls back to the solo times.
    premise: Cell<bool>,
}

/// How a new instance's place ranks: idle instances it destroys, then its start,
/// highest first.
type Place = (usize, std::cmp::Reverse<u8>);

/// One way to start a job: its partition (new or not) and share.
#[derive(Debug, Clone)]
struct Choice {
    gpu: usize,
    slot: Slot,
    /// An instance to make, and the idle ones it replaces.
    create: Option<(u64, Vec<Slot>)>,
    share: u8,
    /// The job's speed there as the partition is now (the order choices are tried in).
    speed: f64,
}

impl<'a> Search<'a> {
    /// A search of `trace` on `cfg`'s node of `model` GPUs; `brute` prunes nothing.
    fn new(
        trace: &'a Trace,
        cfg: &'a SimConfig,
        model: GpuModel,
        truth: &'a dyn PerfModel,
        opts: &'a ReferenceOptions,
        brute: bool,
    ) -> Search<'a> {
        let mut search = Search {
            trace,
            cfg,
            model,
            truth,
            demands: trace
                .jobs
                .iter()
                .enumerate()
                .map(|(i, j)| demand(i as u64 + 1, j, cfg))
                .collect(),
            opts,
            nodes: 0,
            best: f64::INFINITY,
            best_decisions: None,
            open_bound: f64::INFINITY,
            brute,
            caps: Vec::new(),
            fastest: Vec::new(),
            premise: Cell::new(true),
        };
        search.prepare();
        search
    }

    fn run(&mut self) -> Result<(), ReferenceError> {
        let n = self.trace.jobs.len();
        let mut s = State {
            now: 0.0,
            next: 0,
            active: Vec::new(),
            runs: self
                .trace
                .jobs
                .iter()
                .map(|j| JobRun {
                    remaining: j.duration_s,
                    ready_at: f64::INFINITY,
                    slot: None,
                    share: 100,
                })
                .collect(),
            gpus: vec![Vec::new(); self.cfg.gpus as usize],
            jct_sum: 0.0,
            decisions: Vec::new(),
        };
        if n == 0 {
            self.best = 0.0;
            self.best_decisions = Some(Vec::new());
            return Ok(());
        }
        match if self.arrive(&mut s) {
            Next::Plan
        } else {
            self.advance(&mut s)?
        } {
            Next::Plan => {
                if !self.brute {
                    self.pilot(s.clone())?;
                }
                let p = self.fresh();
                self.decide(&s, 0, &p)
            }
            Next::Done => {
                self.best = 0.0;
                self.best_decisions = Some(Vec::new());
                Ok(())
            }
            Next::Infeasible => Ok(()),
        }
    }

    /// Jobs arriving by now join; whether any did.
    fn arrive(&self, s: &mut State) -> bool {
        let mut any = false;
        while s.next < self.trace.jobs.len() && self.trace.jobs[s.next].arrival_s <= s.now + 1e-9 {
            s.active.push(s.next);
            s.next += 1;
            any = true;
        }
        any
    }

    fn waiting(s: &State) -> Vec<usize> {
        s.active
            .iter()
            .copied()
            .filter(|&j| s.runs[j].slot.is_none())
            .collect()
    }

    /// Decides the planning moment of `s` from its `k`-th waiting job on: each way to start
    /// it, then leaving it waiting; past the last, the moment is done and time runs to the
    /// next one.
    fn decide(&mut self, s: &State, k: usize, p: &Pending) -> Result<(), ReferenceError> {
        let waiting = Self::waiting(s);
        if !self.brute {
            let bound = self.bound(s, p, &waiting[..k]);
            if bound >= self.best - 1e-9 {
                return Ok(());
            }
            if self.nodes >= self.opts.node_limit {
                // Left unexplored: what it could still reach bounds the class's best.
                self.open_bound = self.open_bound.min(bound);
                return Ok(());
            }
        }
        if k == waiting.len() {
            return self.close(s, p);
        }
        let j = waiting[k];
        let mut choices = self.choices(s, j)?;
        choices.sort_by(|a, b| b.speed.total_cmp(&a.speed));
        let must_start = self.must_start(s, j, &choices)?;
        for c in choices {
            let (mut s2, mut p2) = (s.clone(), p.clone());
            self.start(&mut s2, &mut p2, j, &c);
            self.decide(&s2, k, &p2)?;
        }
        if must_start {
            return Ok(());
        }
        self.decide(s, k + 1, p)
    }

    /// Whether the class lets `j` wait no longer ([`ReferenceOptions::prompt_online`]):
    /// an online job one of `choices` starts with every SLO kept as its partition stands.
    fn must_start(&self, s: &State, j: usize, choices: &[Choice]) -> Result<bool, ReferenceError> {
        if !self.kept_from_waiting(j) {
            return Ok(false);
        }
        for c in choices {
            if self.demands[j].slo_met(c.speed) && self.gain(s, j, c)?.is_finite() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether the class keeps `j` from waiting where a place holds it.
    fn kept_from_waiting(&self, j: usize) -> bool {
        self.opts.prompt_online && self.demands[j].class == JobClass::Online
    }

    /// Starts `j` as `c` says, in the moment being decided.
    fn start(&self, s: &mut State, p: &mut Pending, j: usize, c: &Choice) {
        let g = c.gpu;
        if let Some((memory_mib, replaced)) = &c.create {
            s.gpus[g].retain(|part| !replaced.contains(&part.slot));
            p.steps[g].0 += replaced.len() as u32;
            p.steps[g].1 += 1;
            s.gpus[g].push(Part {
                slot: c.slot,
                memory_mib: *memory_mib,
                members: Vec::new(),
            });
        }
        if let Some(part) = s.gpus[g].iter_mut().find(|part| part.slot == c.slot) {
            part.members.push(j);
        }
        s.runs[j].slot = Some(c.slot);
        s.runs[j].share = c.share;
        p.started.push(j);
    }

    /// Ends the moment being decided (its jobs start when their GPU's instances are made)
    /// and runs time to the next.
    fn commit(&self, s: &mut State, p: &Pending) -> Result<Next, ReferenceError> {
        let mut placed = Vec::new();
        for &j in &p.started {
            let slot = s.runs[j].slot.expect("started jobs have a slot");
            s.runs[j].ready_at = s.now + self.delay(p, slot.gpu as usize);
            placed.push(JobPlacement {
                job: j as u64 + 1,
                slot,
                mps_share: s.runs[j].share,
            });
        }
        s.decisions.push(placed);
        self.advance(s)
    }

    fn fresh(&self) -> Pending {
        Pending {
            started: Vec::new(),
            steps: vec![(0, 0); self.cfg.gpus as usize],
        }
    }

    /// What the moment's steps on GPU `g` delay its jobs, summed as the engine sums them
    /// (each destroy, then each create).
    fn delay(&self, p: &Pending, g: usize) -> f64 {
        let (destroys, creates) = p.steps[g];
        let mut d = 0.0;
        for _ in 0..destroys {
            d += self.cfg.destroy_s;
        }
        for _ in 0..creates {
            d += self.cfg.create_s;
        }
        d
    }

    /// Keeps a finished schedule if it is the best so far.
    fn found(&mut self, s: State) {
        if s.jct_sum < self.best {
            self.best = s.jct_sum;
            self.best_decisions = Some(s.decisions);
        }
    }

    /// The moment's choices are made: time runs to the next one.
    fn close(&mut self, s: &State, p: &Pending) -> Result<(), ReferenceError> {
        self.nodes += 1;
        let mut s = s.clone();
        match self.commit(&mut s, p)? {
            Next::Plan => {
                let p = self.fresh();
                self.decide(&s, 0, &p)
            }
            Next::Done => {
                self.found(s);
                Ok(())
            }
            Next::Infeasible => Ok(()),
        }
    }

    /// A greedy schedule from here: each job of the moment not yet decided (and not
    /// `skipped`), then of every later moment, starts where it adds the most throughput
    /// (its own speed, less what it costs the jobs already there), or waits when that is
    /// below `least`. Its sum of JCTs, when it keeps every SLO; kept if the best so far.
    fn rollout(
        &mut self,
        mut s: State,
        mut p: Pending,
        skipped: &[usize],
        least: f64,
    ) -> Result<Option<f64>, ReferenceError> {
        let mut skipped = skipped.to_vec();
        loop {
            for j in Self::waiting(&s) {
                if skipped.contains(&j) {
                    continue;
                }
                let mut best: Option<(f64, Choice)> = None;
                // Where the class keeps `j` from waiting, any place that holds it will do.
                let least = if self.kept_from_waiting(j) {
                    f64::NEG_INFINITY
                } else {
                    least
                };
                for c in self.choices(&s, j)? {
                    if !self.demands[j].slo_met(c.speed) {
                        continue;
                    }
                    let gain = self.gain(&s, j, &c)?;
                    if gain.is_finite()
                        && gain >= least
                        && best.as_ref().is_none_or(|(g, _)| gain > *g + 1e-12)
                    {
                        best = Some((gain, c));
                    }
                }
                if let Some((_, c)) = best {
                    self.start(&mut s, &mut p, j, &c);
                }
            }
            skipped.clear();
            match self.commit(&mut s, &p)? {
                Next::Plan => p = self.fresh(),
                Next::Done => {
                    let sum = s.jct_sum;
                    self.found(s);
                    return Ok(Some(sum));
                }
                Next::Infeasible => return Ok(None),
            }
        }
    }

    /// What starting `j` as `c` adds to its partition's throughput: its own speed, less
    /// what it takes from the jobs placed there; `NEG_INFINITY` where it breaks their SLO.
    fn gain(&self, s: &State, j: usize, c: &Choice) -> Result<f64, ReferenceError> {
        let Some(part) = s.gpus[c.gpu]
            .iter()
            .find(|p| p.slot == c.slot && c.create.is_none())
        else {
            return Ok(c.speed);
        };
        let mut gain = c.speed;
        for &m in &part.members {
            let others = |with: bool| -> Vec<CoRunner> {
                part.members
                    .iter()
                    .filter(|&&o| o != m)
                    .map(|&o| (o, s.runs[o].share))
                    .chain(with.then_some((j, c.share)))
                    .map(|(o, share)| CoRunner {
                        profile: self.demands[o].profile,
                        mps_share: share,
                    })
                    .collect()
            };
            let before = self.speed(m, c.slot, s.runs[m].share, &others(false))?;
            let after = self.speed(m, c.slot, s.runs[m].share, &others(true))?;
            if !self.demands[m].slo_met(after) {
                return Ok(f64::NEG_INFINITY);
            }
            gain += after - before;
        }
        Ok(gain)
    }

    /// The pilot method: from the first moment on, each job's choice (every way to start
    /// it, or waiting) is the one whose greedy completion ([`Search::rollout`], with each
    /// of `LEAST`) is best; every completion tried is a schedule, kept if the best so far.
    /// It gives the branch and bound its first incumbent.
    fn pilot(&mut self, mut s: State) -> Result<(), ReferenceError> {
        const LEAST: [f64; 3] = [f64::NEG_INFINITY, 0.25, 0.5];
        let mut p = self.fresh();
        let mut skipped = Vec::new();
        loop {
            for j in Self::waiting(&s) {
                let choices = self.choices(&s, j)?;
                let wait = !self.must_start(&s, j, &choices)?;
                let mut options: Vec<Option<Choice>> = choices.into_iter().map(Some).collect();
                if wait {
                    options.push(None);
                }
                let mut best: Option<(f64, Option<Choice>)> = None;
                for o in options {
                    let (mut s2, mut p2, mut sk2) = (s.clone(), p.clone(), skipped.clone());
                    match &o {
                        Some(c) => self.start(&mut s2, &mut p2, j, c),
                        None => sk2.push(j),
                    }
                    for least in LEAST {
                        if let Some(v) = self.rollout(s2.clone(), p2.clone(), &sk2, least)?
                            && best.as_ref().is_none_or(|(b, _)| v < *b - 1e-9)
                        {
                            best = Some((v, o.clone()));
                        }
                    }
                }
                match best {
                    Some((_, Some(c))) => self.start(&mut s, &mut p, j, &c),
                    Some((_, None)) => skipped.push(j),
                    // No completion keeps the SLOs: the branch and bound looks further.
                    None => return Ok(()),
                }
            }
            skipped.clear();
            match self.commit(&mut s, &p)? {
                Next::Plan => p = self.fresh(),
                Next::Done | Next::Infeasible => return Ok(()),
            }
        }
    }

    /// A lower bound on the sum of JCTs of every schedule below this branch: `skipped`
    /// jobs wait at least to the next planning moment.
    fn bound(&self, s: &State, p: &Pending, skipped: &[usize]) -> f64 {
        let jobs = &self.trace.jobs;
        let waits = |j: usize| s.runs[j].slot.is_none() && skipped.contains(&j);
        // The earliest the next planning moment can come: an arrival, or a placed job's
        // end (or, before the moment closes, a job it may still start).
        let mut next_moment = jobs.get(s.next).map_or(f64::INFINITY, |j| j.arrival_s);
        let mut sum = s.jct_sum;
        for &j in &s.active {
            let r = &s.runs[j];
            let start = match r.slot {
                Some(slot) if p.started.contains(&j) => s.now + self.delay(p, slot.gpu as usize),
                Some(_) => r.ready_at.max(s.now),
                None => s.now,
            };
            if !waits(j) {
                next_moment = next_moment.min(start + r.remaining / self.cap(j, r));
            }
        }
        for &j in &s.active {
            let r = &s.runs[j];
            let start = match r.slot {
                Some(slot) if p.started.contains(&j) => s.now + self.delay(p, slot.gpu as usize),
                Some(_) => r.ready_at.max(s.now),
                None if waits(j) => next_moment,
                None => s.now,
            };
            sum += start + r.remaining / self.cap(j, r) - jobs[j].arrival_s;
        }
        for (j, job) in jobs.iter().enumerate().skip(s.next) {
            sum += job.duration_s / self.fastest[j];
        }
        sum
    }
}
#[cfg(test)]
mod tests;
