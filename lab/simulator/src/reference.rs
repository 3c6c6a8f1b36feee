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
//! the JCTs of the jobs done, and every other job ending at the earliest it could at its
//! speed alone at its share in its instance once placed, else alone in its best instance,
//! from the earliest moment it can run (a job left waiting waits at least until the next
//! arrival or completion). That needs company never to make a job faster
//! ([`PerfModel::company_never_helps`]); the search also checks the truth's every answer
//! against it. Where the truth guarantees it, a search that ends before `node_limit` is
//! exact, and one stopped there keeps the best schedule it found with the least bound of
//! the branches it left as a lower bound on the class's best. Where it does not (the
//! measured truth, whose pairs sometimes ran faster together than apart), the same
//! pruning makes a heuristic search: its schedule stands, it is never called exact, and
//! the bound is the jobs' solo times (no job runs faster than alone on a whole GPU).
//!
//! The schedule found is replayed through [`simulate`] by a planner that follows it
//! ([`Script`]), so its figures come from the same engine as every policy's.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Mutex;

use mmk_partitioner::{
    CoRunner, GpuModel, JobDemand, JobPlacement, NodeState, PartitionShape, PerfModel, Plan,
    Planner, QueuedJob, Slot, Step, catalog, layout,
};
use thiserror::Error;

use crate::engine::{RunResult, SimConfig, SimError, demand, simulate};
use crate::trace::Trace;

/// The largest trace and node the search takes.
pub const MAX_JOBS: usize = 40;
pub const MAX_GPUS: u32 = 4;

/// How far the search goes.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceOptions {
    /// The MPS shares a job may start with (10 to 100).
    pub shares: Vec<u8>,
    /// Choices (one per planning moment reached) before the search stops.
    pub node_limit: u64,
}

impl Default for ReferenceOptions {
    fn default() -> ReferenceOptions {
        ReferenceOptions {
            shares: vec![100, 50],
            node_limit: 2_000_000,
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
    let mut search = Search::new(trace, cfg, model, truth, opts, false);
    search.run()?;
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
    /// Each job's speed alone, by instance profile and share: the bound takes it as the
    /// most the job can reach there (`premise`).
    alone: Vec<HashMap<(Option<u32>, u8), f64>>,
    /// Each job's best speed alone in any instance that holds it.
    fastest: Vec<f64>,
    /// The truth guarantees that company never makes a job faster, and no speed it gave
    /// broke that (module docs). Without it the search's pruning may have cut the best
    /// schedule: the schedule found stands, but it is not called exact and the bound falls
    /// back to the solo times.
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
            alone: Vec::new(),
            fastest: Vec::new(),
            premise: Cell::new(truth.company_never_helps()),
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
        for c in choices {
            let (mut s2, mut p2) = (s.clone(), p.clone());
            self.start(&mut s2, &mut p2, j, &c);
            self.decide(&s2, k, &p2)?;
        }
        self.decide(s, k + 1, p)
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
                let mut options: Vec<Option<Choice>> =
                    self.choices(&s, j)?.into_iter().map(Some).collect();
                options.push(None);
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

    /// Every way `j` can start now.
    fn choices(&self, s: &State, j: usize) -> Result<Vec<Choice>, ReferenceError> {
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

    fn choice(
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

    /// The most `j` can run at from now on: alone at its share in its instance once
    /// placed, else alone in the best instance.
    fn cap(&self, j: usize, r: &JobRun) -> f64 {
        match r.slot {
            Some(slot) => self.alone_at(j, slot.profile_id, r.share),
            None => self.fastest[j],
        }
    }

    /// `j`'s speed alone in an instance of `profile` at `share`.
    fn alone_at(&self, j: usize, profile: Option<u32>, share: u8) -> f64 {
        self.alone[j].get(&(profile, share)).copied().unwrap_or(1.0)
    }

    /// Fills `alone` and `fastest`.
    fn prepare(&mut self) {
        let mut shares = self.opts.shares.clone();
        shares.push(100);
        let mut alone = Vec::with_capacity(self.demands.len());
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
                        .estimate(&d.profile, &self.shape(slot), share, &[])
                        .clamp(1e-6, 1.0);
                    m.insert((Some(q.id), share), v);
                    if q.memory_mib >= d.memory_mib {
                        best = best.max(v);
                    }
                }
            }
            alone.push(m);
            fastest.push(if best > 0.0 { best } else { 1.0 });
        }
        self.alone = alone;
        self.fastest = fastest;
    }

    fn shape(&self, slot: Slot) -> PartitionShape {
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
    fn speed(
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
        if v > self.alone_at(j, slot.profile_id, share) + 1e-9 {
            self.premise.set(false);
        }
        Ok(v)
    }

    /// Runs time from a planning moment to the next, as the engine does.
    fn advance(&self, s: &mut State) -> Result<Next, ReferenceError> {
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

/// A planner that starts what the reference decided at each planning moment, in order
/// (the engine plans at the same moments the search did).
#[derive(Debug)]
pub struct Script {
    decisions: Vec<Vec<JobPlacement>>,
    call: Mutex<usize>,
}

impl Planner for Script {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn plan(&self, node: &NodeState, jobs: &[JobDemand]) -> Plan {
        let k = {
            let mut call = self.call.lock().unwrap_or_else(|e| e.into_inner());
            *call += 1;
            *call - 1
        };
        let started: &[JobPlacement] = self.decisions.get(k).map_or(&[], Vec::as_slice);
        let mut plan = Plan::default();
        for p in started {
            let Some(g) = node.gpus.iter().find(|g| g.index == p.slot.gpu) else {
                continue;
            };
            let exists = g.instances.iter().any(|i| {
                Some(i.profile_id) == p.slot.profile_id && i.placement.start == p.slot.start
            });
            let made = plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::Create { slot } if *slot == p.slot));
            if !exists && !made {
                let size = p
                    .slot
                    .profile_id
                    .and_then(|id| g.model.profile(id))
                    .map_or(0, |q| q.memory_slices);
                let here = layout::Placement {
                    start: p.slot.start,
                    size,
                };
                for i in g.instances.iter().filter(|i| here.overlaps(i.placement)) {
                    let slot = Slot {
                        gpu: g.index,
                        start: i.placement.start,
                        profile_id: Some(i.profile_id),
                    };
                    let gone = plan
                        .steps
                        .iter()
                        .any(|s| matches!(s, Step::Destroy { instance, .. } if *instance == i.id));
                    if !gone {
                        plan.steps.push(Step::Destroy {
                            slot,
                            instance: i.id,
                        });
                    }
                }
                plan.steps.push(Step::Create { slot: p.slot });
            }
            plan.placements.push(*p);
        }
        plan.steps.sort_by_key(|s| matches!(s, Step::Create { .. }));
        plan.queued = jobs
            .iter()
            .filter(|j| j.placed.is_none() && !started.iter().any(|p| p.job == j.id))
            .map(|j| QueuedJob {
                job: j.id,
                reason: "the reference starts it later".into(),
            })
            .collect();
        plan
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mmk_core::workload;
    use mmk_partitioner::{AnalyticModel, planner};

    use super::*;
    use crate::trace::{TraceJob, TraceSpec, generate};

    fn job(arrival_s: f64, name: &str, duration_s: f64) -> TraceJob {
        let w = workload::find(name).expect("workload");
        TraceJob {
            arrival_s,
            workload: w,
            class: w.class(),
            duration_s,
            memory_mib: w.nominal_memory_mib,
            checkpoint: false,
        }
    }

    fn jct_sum(r: &RunResult) -> f64 {
        r.jobs.iter().map(|j| j.jct_s()).sum()
    }

    /// The search with nothing pruned: every schedule of the class.
    fn brute(
        trace: &Trace,
        cfg: &SimConfig,
        truth: &dyn PerfModel,
        opts: &ReferenceOptions,
    ) -> Reference {
        let model = catalog::model(&cfg.gpu_model).expect("model");
        let mut s = Search::new(trace, cfg, model, truth, opts, true);
        s.run().expect("searched");
        finish(s, trace, cfg, truth).expect("a schedule")
    }

    /// Small traces of the generator's mix, their jobs cut short so that they overlap.
    fn small(n: usize, seed: u64, interval: f64) -> Trace {
        let mut t = generate(TraceSpec {
            online: n - n / 3,
            offline: n / 3,
            mean_interval_s: interval,
            seed,
        });
        for j in &mut t.jobs {
            j.duration_s = j.duration_s.min(300.0);
        }
        t
    }

    #[test]
    fn branch_and_bound_finds_what_brute_force_finds() {
        let truth = AnalyticModel::default();
        let opts = ReferenceOptions {
            shares: vec![100, 50],
            node_limit: u64::MAX,
        };
        for (gpus, seed) in [(1, 1), (1, 2), (2, 3), (2, 4)] {
            let t = small(3, seed, 30.0);
            let cfg = SimConfig::new("a100-80gb", gpus);
            let exact = solve(&t, &cfg, &truth, &opts).expect("solved");
            let all = brute(&t, &cfg, &truth, &opts);
            assert!(exact.exact);
            assert!(
                (jct_sum(&exact.run) - jct_sum(&all.run)).abs() < 1e-6,
                "{gpus} GPUs, seed {seed}: {} against brute force {}",
                jct_sum(&exact.run),
                jct_sum(&all.run)
            );
            assert!(
                exact.nodes < all.nodes,
                "{gpus} GPUs, seed {seed}: the bound pruned nothing"
            );
            assert!((exact.lower_bound_jct_sum_s - jct_sum(&exact.run)).abs() < 1e-6);
        }
    }

    /// The search simulates as the engine does: the schedule it found, replayed through
    /// `simulate`, has the JCTs it computed (`solve` checks, and fails otherwise).
    #[test]
    fn the_engine_replays_the_schedule_the_search_found() {
        let truth = AnalyticModel::default();
        for (gpus, seed) in [(1, 5), (2, 6), (2, 7)] {
            let t = small(6, seed, 20.0);
            let cfg = SimConfig::new("a100-80gb", gpus);
            let r = solve(
                &t,
                &cfg,
                &truth,
                &ReferenceOptions {
                    node_limit: 2_000,
                    ..ReferenceOptions::default()
                },
            )
            .expect("solved and replayed");
            assert_eq!(r.run.policy, "reference");
            assert_eq!(r.run.jobs.len(), t.jobs.len());
            assert_eq!(r.run.moves, 0);
            assert!(r.lower_bound_jct_sum_s <= jct_sum(&r.run) + 1e-6);
        }
    }

    /// Default's schedules are in the class, so the exact reference is never behind them.
    #[test]
    fn default_never_beats_the_exact_reference() {
        let truth = AnalyticModel::default();
        for seed in 1..=3 {
            let t = small(4, seed, 40.0);
            let cfg = SimConfig::new("a100-80gb", 2);
            let r = solve(&t, &cfg, &truth, &ReferenceOptions::default()).expect("solved");
            assert!(r.exact);
            let p = planner("default", Arc::new(AnalyticModel::default())).expect("planner");
            let run = simulate(&t, &cfg, p.as_ref(), &truth, &mut |_, _| {}).expect("run");
            assert!(
                jct_sum(&r.run) <= jct_sum(&run) + 1e-6,
                "seed {seed}: reference {} behind default {}",
                jct_sum(&r.run),
                jct_sum(&run)
            );
        }
    }

    /// A truth where company speeds a job up breaks the bound's premise: the schedule
    /// found stands, but it is not called exact, and the bound is the solo times.
    #[test]
    fn a_truth_where_company_helps_gets_no_exact_claim() {
        #[derive(Debug)]
        struct Company;
        impl PerfModel for Company {
            fn estimate(
                &self,
                _: &mmk_partitioner::JobProfile,
                p: &PartitionShape,
                _: u8,
                co: &[CoRunner],
            ) -> f64 {
                let frac = f64::from(p.sm_count) / f64::from(p.gpu_sm_count);
                (frac * 0.5 * (1.0 + co.len() as f64)).min(1.0)
            }
        }
        let t = small(3, 2, 10.0);
        let cfg = SimConfig::new("a100-80gb", 1);
        let r = solve(&t, &cfg, &Company, &ReferenceOptions::default()).expect("solved");
        assert!(!r.exact);
        let solo: f64 = t.jobs.iter().map(|j| j.duration_s).sum();
        assert!((r.lower_bound_jct_sum_s - solo).abs() < 1e-6);
    }

    #[test]
    fn two_jobs_on_one_gpu_share_it_or_queue_as_their_speeds_say() {
        // Two trainings arriving together on one GPU. Nothing slows a co-runner: they
        // share the GPU. Co-runners that crawl: one after the other.
        #[derive(Debug)]
        struct Corunner(f64);
        impl PerfModel for Corunner {
            fn estimate(
                &self,
                _: &mmk_partitioner::JobProfile,
                p: &PartitionShape,
                share: u8,
                co: &[CoRunner],
            ) -> f64 {
                let frac = f64::from(p.sm_count) / f64::from(p.gpu_sm_count);
                (frac * f64::from(share) / 100.0 * self.0.powi(co.len() as i32)).min(1.0)
            }
            fn company_never_helps(&self) -> bool {
                self.0 <= 1.0
            }
        }
        let t = Trace {
            jobs: vec![
                job(0.0, "resnet50-train", 100.0),
                job(0.0, "bert-train", 100.0),
            ],
        };
        let cfg = SimConfig::new("a100-80gb", 1);
        let opts = ReferenceOptions {
            shares: vec![100],
            node_limit: u64::MAX,
        };
        let setup = cfg.create_s;
        // The 7g.80gb instance has 98 of the A100's 108 SMs.
        let solo = 100.0 * 108.0 / 98.0;
        let r = solve(&t, &cfg, &Corunner(1.0), &opts).expect("solved");
        assert!(r.exact);
        assert!(
            (jct_sum(&r.run) - 2.0 * (solo + setup)).abs() < 1e-6,
            "{:?}",
            r.run.jobs
        );
        let r = solve(&t, &cfg, &Corunner(0.3), &opts).expect("solved");
        assert!(
            (jct_sum(&r.run) - (solo + setup + 2.0 * solo + setup)).abs() < 1e-6,
            "{:?}",
            r.run.jobs
        );
    }

    #[test]
    fn a_search_cut_short_keeps_its_best_and_a_bound_below_it() {
        let truth = AnalyticModel::default();
        let t = small(8, 3, 15.0);
        let cfg = SimConfig::new("a100-80gb", 2);
        let r = solve(
            &t,
            &cfg,
            &truth,
            &ReferenceOptions {
                node_limit: 50,
                ..ReferenceOptions::default()
            },
        )
        .expect("solved");
        assert!(!r.exact);
        assert_eq!(r.nodes, 50);
        assert!(r.lower_bound_jct_sum_s < jct_sum(&r.run));
        let solo: f64 = t.jobs.iter().map(|j| j.duration_s).sum();
        assert!(r.lower_bound_jct_sum_s >= solo - 1e-6);
    }

    #[test]
    fn bad_requests_are_refused() {
        let truth = AnalyticModel::default();
        let t = small(4, 1, 30.0);
        let e = solve(
            &t,
            &SimConfig::new("a100-80gb", 5),
            &truth,
            &ReferenceOptions::default(),
        )
        .expect_err("too many GPUs");
        assert!(e.to_string().contains("at most 40 jobs and 4 GPUs"), "{e}");
        let e = solve(
            &t,
            &SimConfig::new("a100-80gb", 1),
            &truth,
            &ReferenceOptions {
                shares: vec![0],
                ..ReferenceOptions::default()
            },
        )
        .expect_err("no share");
        assert_eq!(e, ReferenceError::Shares(vec![0]));
        #[derive(Debug)]
        struct Fast;
        impl PerfModel for Fast {
            fn estimate(
                &self,
                _: &mmk_partitioner::JobProfile,
                _: &PartitionShape,
                _: u8,
                _: &[CoRunner],
            ) -> f64 {
                1.5
            }
        }
        let e = solve(
            &t,
            &SimConfig::new("a100-80gb", 1),
            &Fast,
            &ReferenceOptions::default(),
        )
        .expect_err("faster than alone");
        assert!(matches!(e, ReferenceError::FasterThanAlone { .. }), "{e}");
    }
}
