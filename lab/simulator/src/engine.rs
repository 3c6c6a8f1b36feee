//! The discrete-event simulation: jobs arrive, the planner (the same code mmkd runs)
//! places them, the ground-truth model says how fast each runs next to its co-runners,
//! and time jumps to the next arrival, completion or end of a reconfiguration.

use std::collections::{BTreeMap, HashMap};

use mmk_core::fasthash::{FastMap, FastSet};
use mmk_partitioner::plan::{QueuedJob, apply_in_place};
use mmk_partitioner::{
    CoRunner, JobDemand, JobProfile, NodeState, PartitionShape, PerfModel, Planner, Slot, Step, mix,
};
use thiserror::Error;

use crate::trace::{Trace, TraceJob};

/// The simulated node and the costs of changing it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// A catalog model (`a100-80gb`).
    pub gpu_model: String,
    pub gpus: u32,
    /// Seconds to create / destroy a MIG instance (what the simulated backend uses).
    pub create_s: f64,
    pub destroy_s: f64,
    /// Seconds a moved job loses to checkpoint and restart.
    pub restart_s: f64,
    /// How often a checkpointable job checkpoints, in seconds of its run; a move loses the
    /// work since its last checkpoint. `None`: a move loses no work (it checkpoints as it
    /// stops).
    pub checkpoint_every_s: Option<f64>,
    /// What the planners know of a workload, by name, where it is not the workload
    /// table's nominal demands (the measured ones, with a measured ground truth).
    pub profiles: HashMap<&'static str, JobProfile>,
}

impl SimConfig {
    pub fn new(gpu_model: &str, gpus: u32) -> SimConfig {
        SimConfig {
            gpu_model: gpu_model.to_owned(),
            gpus,
            create_s: 0.4,
            destroy_s: 0.2,
            restart_s: 10.0,
            checkpoint_every_s: None,
            profiles: HashMap::new(),
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum SimError {
    #[error("unknown gpu model {0:?}")]
    UnknownModel(String),
    #[error("job {job} ({workload}) can never be placed: {reason}")]
    Stuck {
        job: u64,
        workload: String,
        reason: String,
    },
}

/// What happened to one job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOutcome {
    pub id: u64,
    pub workload: &'static str,
    pub online: bool,
    pub arrival_s: f64,
    /// When it first ran.
    pub start_s: f64,
    pub finish_s: f64,
    /// How long it takes alone on a whole GPU.
    pub solo_s: f64,
    /// How often it was stopped and restarted elsewhere (moves and preemptions).
    pub moves: u32,
}

impl JobOutcome {
    pub fn jct_s(&self) -> f64 {
        self.finish_s - self.arrival_s
    }
}

/// One policy's run over a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    pub policy: String,
    /// In order of job ID (trace order).
    pub jobs: Vec<JobOutcome>,
    /// MIG instances created or destroyed.
    pub reconfigurations: u64,
    /// Checkpoint-and-restart moves.
    pub moves: u64,
    /// Integral of the summed normalized performance of running jobs over time.
    pub stp_integral: f64,
    /// GPU-seconds during which a GPU ran at least one job: STP is `stp_integral` over
    /// this, the summed normalized progress of a busy GPU's jobs, averaged over the time
    /// GPUs are busy.
    pub gpu_busy_s: f64,
    /// Seconds online jobs with an SLO spent in the system, from arrival to finish (waiting,
    /// starting, running, or down after a move), summed over the jobs.
    pub online_run_s: f64,
    /// Of those, the seconds they missed it: not running (a request that comes then waits
    /// for the service to start), or running with a latency over the SLO
    /// ([`JobDemand::slo_met`]; the simulator's SLO is 3x the solo latency rounded up to a
    /// whole ms, so the line is a speed of 0.29-0.33 for the measured jobs).
    pub slo_miss_s: f64,
    /// Seconds jobs ran, summed over the jobs, and of those the seconds they ran in a
    /// partition with a job of the other class (online beside offline: where a kernel
    /// scheduler acts).
    pub job_run_s: f64,
    pub mixed_run_s: f64,
    pub plans: u64,
}

impl RunResult {
    /// A run of `policy` with nothing in it yet.
    pub fn empty(policy: &str) -> RunResult {
        RunResult {
            policy: policy.to_owned(),
            jobs: Vec::new(),
            reconfigurations: 0,
            moves: 0,
            stp_integral: 0.0,
            gpu_busy_s: 0.0,
            online_run_s: 0.0,
            slo_miss_s: 0.0,
            job_run_s: 0.0,
            mixed_run_s: 0.0,
            plans: 0,
        }
    }
}

/// How fast the jobs of a partition ran at an event: its running jobs and their shares
/// (`who`), each one's speed and whether it ran beside a job of the other class.
#[derive(Debug)]
struct PartitionSpeeds {
    who: Vec<(u64, u8)>,
    speeds: Vec<f64>,
    mixed: Vec<bool>,
}

#[derive(Debug)]
struct Run {
    remaining: f64,
    ready_at: f64,
    start_s: Option<f64>,
    /// Run time and work (solo seconds) since its last checkpoint.
    since_checkpoint: (f64, f64),
    moves: u32,
}

impl Run {
    /// A job that arrived and waits for its place.
    fn new(duration_s: f64) -> Run {
        Run {
            remaining: duration_s,
            ready_at: f64::INFINITY,
            start_s: None,
            since_checkpoint: (0.0, 0.0),
            moves: 0,
        }
    }

    /// Stopped for a move: the work since the last checkpoint is done again.
    fn moved(&mut self) {
        self.remaining += self.since_checkpoint.1;
        self.since_checkpoint = (0.0, 0.0);
        self.moves += 1;
    }

    /// `dt` seconds run at `speed`, checkpointing every `every` seconds of run time.
    fn ran(&mut self, dt: f64, speed: f64, every: Option<f64>) {
        self.remaining -= speed * dt;
        let Some(every) = every.filter(|e| *e > 0.0) else {
            return;
        };
        let (wall, work) = &mut self.since_checkpoint;
        *wall += dt;
        *work += speed * dt;
        if *wall >= every {
            // The last checkpoint was `wall % every` seconds ago.
            *wall %= every;
            *work = speed * *wall;
        }
    }
}

fn shape(node: &NodeState, slot: Slot) -> PartitionShape {
    let g = node.gpus.iter().find(|g| g.index == slot.gpu);
    let (gpu_sm, gpu_mem) = g.map_or((1, 1), |g| (g.model.sm_count, g.model.memory_slices));
    let (sm, mem) = match (g, slot.profile_id) {
        (Some(g), Some(p)) => g
            .model
            .profile(p)
            .map_or((gpu_sm, gpu_mem), |p| (p.sm_count, p.memory_slices)),
        _ => (gpu_sm, gpu_mem),
    };
    PartitionShape {
        sm_count: sm,
        gpu_sm_count: gpu_sm,
        memory_slices: mem,
        gpu_memory_slices: gpu_mem,
    }
}

/// A trace job as the planners see it.
pub(crate) fn demand(id: u64, j: &TraceJob, cfg: &SimConfig) -> JobDemand {
    let mut d = JobDemand::waiting(id, j.class, j.memory_mib);
    d.profile = cfg
        .profiles
        .get(j.workload.name)
        .copied()
        .unwrap_or_else(|| JobProfile::of_workload(j.workload, j.class));
    d.profile.class = j.class;
    if j.class == mmk_core::JobClass::Online {
        d.slo_ms = d.profile.solo_latency_ms.map(|l| (l * 3.0).ceil() as u64);
    }
    d.movable = j.checkpoint;
    d
}

/// How fast each of `jobs`, the running jobs of the partition at `placed`, goes beside
/// the others, as the ground truth says; and whether it runs beside the other class.
fn partition_speeds(
    node: &NodeState,
    placed: Option<Slot>,
    jobs: &[&JobDemand],
    who: Vec<(u64, u8)>,
    truth: &dyn PerfModel,
) -> PartitionSpeeds {
    let slot = placed.unwrap_or(Slot {
        gpu: 0,
        start: 0,
        profile_id: None,
    });
    let shape = shape(node, slot);
    let (speeds, mixed) = jobs
        .iter()
        .enumerate()
        .map(|(k, j)| {
            let co: Vec<CoRunner> = jobs
                .iter()
                .enumerate()
                .filter(|&(o, _)| o != k)
                .map(|(_, o)| CoRunner {
                    profile: o.profile,
                    mps_share: o.mps_share,
                })
                .collect();
            let mixed = co.iter().any(|c| c.profile.class != j.profile.class);
            let speed = truth
                .estimate(&j.profile, &shape, j.mps_share, &co)
                .max(1e-6);
            (speed, mixed)
        })
        .unzip();
    PartitionSpeeds { who, speeds, mixed }
}

/// Why a run cannot go on: the first job that waits, and the planner's reason for it.
fn stuck(trace: &Trace, active: &[JobDemand], last_queued: &[QueuedJob]) -> SimError {
    let stuck = active.iter().find(|j| j.placed.is_none());
    match stuck {
        Some(j) => SimError::Stuck {
            job: j.id,
            workload: trace.jobs[(j.id - 1) as usize].workload.name.to_owned(),
            reason: last_queued
                .iter()
                .find(|q| q.job == j.id)
                .map(|q| q.reason.to_string())
                .unwrap_or_else(|| "the planner never placed it".into()),
        },
        None => SimError::Stuck {
            job: 0,
            workload: String::new(),
            reason: "no job can make progress".into(),
        },
    }
}

/// Accounts `dt` seconds of the running jobs' progress, busy GPUs and online time in and
/// out of SLO; returns the jobs that finished.
fn account(
    result: &mut RunResult,
    (active, running): (&[JobDemand], &[usize]),
    runs: &mut FastMap<u64, Run>,
    (speeds, mixed): (&[f64], &[bool]),
    (dt, checkpoint_every): (f64, Option<f64>),
) -> Vec<u64> {
    let busy_gpus: std::collections::BTreeSet<u32> = running
        .iter()
        .filter_map(|&i| active[i].placed.map(|s| s.gpu))
        .collect();
    result.gpu_busy_s += dt * busy_gpus.len() as f64;
    let mut finished = Vec::new();
    for (k, &i) in running.iter().enumerate() {
        let id = active[i].id;
        if let Some(r) = runs.get_mut(&id) {
            r.ran(dt, speeds[k], checkpoint_every);
            result.stp_integral += speeds[k] * dt;
            result.job_run_s += dt;
            if mixed[k] {
                result.mixed_run_s += dt;
            }
            let j = &active[i];
            if j.slo_ms.is_some() && j.profile.solo_latency_ms.is_some() {
                result.online_run_s += dt;
                if !j.slo_met(speeds[k]) {
                    result.slo_miss_s += dt;
                }
            }
            if r.remaining <= 1e-6 {
                finished.push(id);
            }
        }
    }
    // An online job in the system that is not running (waiting for room, starting, or
    // restarting after a move) serves nothing: its requests wait, out of SLO.
    let mut is_running = vec![false; active.len()];
    for &i in running {
        is_running[i] = true;
    }
    for (i, j) in active.iter().enumerate() {
        if j.slo_ms.is_some() && j.profile.solo_latency_ms.is_some() && !is_running[i] {
            result.online_run_s += dt;
            result.slo_miss_s += dt;
        }
    }
    finished
}

/// When the next event comes: an arrival, a job's end at its speed, or a job ready.
fn next_event(
    now: f64,
    arriving: Option<&crate::trace::TraceJob>,
    (active, running): (&[JobDemand], &[usize]),
    runs: &FastMap<u64, Run>,
    speeds: &[f64],
) -> f64 {
    let mut t_next = f64::INFINITY;
    if let Some(j) = arriving {
        t_next = t_next.min(j.arrival_s);
    }
    for (k, &i) in running.iter().enumerate() {
        let r = &runs[&active[i].id];
        t_next = t_next.min(now + r.remaining / speeds[k]);
    }
    for j in active.iter().filter(|j| j.placed.is_some()) {
        let r = &runs[&j.id];
        if r.ready_at > now + 1e-9 {
            t_next = t_next.min(r.ready_at);
        }
    }
    t_next
}

/// How long each GPU's MIG steps of `plan` hold its new placements up.
fn step_delays(plan: &mmk_partitioner::Plan, cfg: &SimConfig) -> BTreeMap<u32, f64> {
    let mut delay: BTreeMap<u32, f64> = BTreeMap::new();
    for s in &plan.steps {
        let (gpu, cost) = match s {
            Step::Create { slot } => (slot.gpu, cfg.create_s),
            Step::Destroy { slot, .. } => (slot.gpu, cfg.destroy_s),
        };
        *delay.entry(gpu).or_default() += cost;
    }
    delay
}

/// What became of job `id`, which finished at `now`.
fn outcome(trace: &Trace, id: u64, run: Option<Run>, now: f64) -> JobOutcome {
    let tj = &trace.jobs[(id - 1) as usize];
    JobOutcome {
        id,
        workload: tj.workload.name,
        online: tj.class == mmk_core::JobClass::Online,
        arrival_s: tj.arrival_s,
        start_s: run.as_ref().and_then(|r| r.start_s).unwrap_or(now),
        finish_s: now,
        solo_s: tj.duration_s,
        moves: run.map_or(0, |r| r.moves),
    }
}

/// Runs `trace` under `planner`, with `truth` as how fast jobs really run. `progress` is
/// told (jobs finished, jobs in all) as jobs finish.
pub fn simulate(
    trace: &Trace,
    cfg: &SimConfig,
    planner: &dyn Planner,
    truth: &dyn PerfModel,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<RunResult, SimError> {
    let mut node = mix::empty_node(&cfg.gpu_model, cfg.gpus)
        .ok_or_else(|| SimError::UnknownModel(cfg.gpu_model.clone()))?;
    let total = trace.jobs.len();
    let mut active: Vec<JobDemand> = Vec::new();
    let mut runs: FastMap<u64, Run> = FastMap::default();
    let mut done: Vec<JobOutcome> = Vec::with_capacity(total);
    let mut result = RunResult::empty(planner.name());
    let mut next = 0;
    let mut now = 0.0_f64;
    let mut dirty = false;
    // The last plan's waiting jobs and reasons, for the error of a run that cannot go on.
    let mut last_queued: Vec<QueuedJob> = Vec::new();
    let mut preempted: FastSet<u64> = FastSet::default();
    let mut speeds_then: FastMap<Option<Slot>, PartitionSpeeds> = FastMap::default();
    loop {
        while next < total && trace.jobs[next].arrival_s <= now + 1e-9 {
            let j = &trace.jobs[next];
            let id = next as u64 + 1;
            active.push(demand(id, j, cfg));
            node.calm_arrivals += 1;
            runs.insert(id, Run::new(j.duration_s));
            next += 1;
            dirty = true;
        }
        if dirty {
            for j in &mut active {
                if let Some(t) = usize::try_from(j.id - 1)
                    .ok()
                    .and_then(|i| trace.jobs.get(i))
                {
                    j.age_s = now - t.arrival_s;
                }
            }
            let mut plan = planner.plan(&node, &active);
            result.plans += 1;
            let delay = step_delays(&plan, cfg);
            result.reconfigurations += plan.steps.len() as u64;
            for id in &plan.moves {
                if let Some(r) = runs.get_mut(id) {
                    r.ready_at = now + cfg.restart_s;
                    r.moved();
                    result.moves += 1;
                }
            }
            // A preempted job keeps its progress (it checkpointed) and pays the restart when
            // it is placed again.
            for p in &plan.preempted {
                preempted.insert(p.job);
                if let Some(r) = runs.get_mut(&p.job) {
                    r.moved();
                }
                result.moves += 1;
            }
            if !plan.queued.is_empty() {
                node.calm_arrivals = 0;
            }
            let was_placed: Vec<bool> = active.iter().map(|j| j.placed.is_some()).collect();
            apply_in_place(&mut node, &mut active, &plan);
            last_queued = std::mem::take(&mut plan.queued);
            for (j, was) in active.iter().zip(was_placed) {
                if let (false, Some(slot)) = (was, j.placed)
                    && let Some(r) = runs.get_mut(&j.id)
                {
                    let restart = if preempted.remove(&j.id) {
                        cfg.restart_s
                    } else {
                        0.0
                    };
                    r.ready_at = now + delay.get(&slot.gpu).copied().unwrap_or(0.0) + restart;
                    r.start_s.get_or_insert(r.ready_at);
                }
            }
            dirty = false;
        }

        // How fast each running job goes now.
        let running: Vec<usize> = active
            .iter()
            .enumerate()
            .filter(|(_, j)| {
                j.placed.is_some() && runs.get(&j.id).is_some_and(|r| r.ready_at <= now + 1e-9)
            })
            .map(|(i, _)| i)
            .collect();
        // The running jobs of each partition, as positions in `running`: a job's co-runners
        // are the others of its partition. A partition whose running jobs and shares are
        // what they were at the last event runs at the speeds it ran at then.
        let mut by_slot: FastMap<Option<Slot>, Vec<usize>> = FastMap::default();
        for (n, &i) in running.iter().enumerate() {
            by_slot.entry(active[i].placed).or_default().push(n);
        }
        let mut speeds = vec![0.0; running.len()];
        let mut mixed = vec![false; running.len()];
        let mut speeds_now: FastMap<Option<Slot>, PartitionSpeeds> = FastMap::default();
        for (placed, members) in by_slot {
            let jobs: Vec<&JobDemand> = members.iter().map(|&n| &active[running[n]]).collect();
            let who: Vec<(u64, u8)> = jobs.iter().map(|j| (j.id, j.mps_share)).collect();
            let known = speeds_then.remove(&placed).filter(|p| p.who == who);
            let part = known.unwrap_or_else(|| partition_speeds(&node, placed, &jobs, who, truth));
            for (k, &n) in members.iter().enumerate() {
                speeds[n] = part.speeds[k];
                mixed[n] = part.mixed[k];
            }
            speeds_now.insert(placed, part);
        }
        speeds_then = speeds_now;

        // The next event.
        let t_next = next_event(
            now,
            trace.jobs.get(next),
            (&active, &running),
            &runs,
            &speeds,
        );
        if t_next.is_infinite() {
            if active.is_empty() && next >= total {
                break;
            }
            return Err(stuck(trace, &active, &last_queued));
        }

        let finished = account(
            &mut result,
            (&active, &running),
            &mut runs,
            (&speeds, &mixed),
            (t_next - now, cfg.checkpoint_every_s),
        );
        now = t_next;
        if !finished.is_empty() {
            active.retain(|j| !finished.contains(&j.id));
            for id in finished {
                done.push(outcome(trace, id, runs.remove(&id), now));
            }
            progress(done.len(), total);
            dirty = true;
        }
    }
    done.sort_by_key(|o| o.id);
    result.jobs = done;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mmk_core::JobClass;
    use mmk_core::workload;
    use mmk_partitioner::{AnalyticModel, planner};

    use super::*;
    use crate::trace::{TraceSpec, generate};

    /// A move loses the work since the last checkpoint, and nothing without checkpoints.
    #[test]
    fn a_move_loses_the_work_since_the_last_checkpoint() {
        let fresh = || Run {
            remaining: 100.0,
            ready_at: 0.0,
            start_s: Some(0.0),
            since_checkpoint: (0.0, 0.0),
            moves: 0,
        };
        let mut r = fresh();
        // 25 s at half speed, checkpoints every 10 s: the last one 5 s ago.
        for _ in 0..5 {
            r.ran(5.0, 0.5, Some(10.0));
        }
        assert!((r.remaining - 87.5).abs() < 1e-9, "{r:?}");
        r.moved();
        assert!(
            (r.remaining - 90.0).abs() < 1e-9,
            "5 s at half speed is done again: {r:?}"
        );
        assert_eq!((r.moves, r.since_checkpoint), (1, (0.0, 0.0)));
        let mut r = fresh();
        r.ran(25.0, 0.5, None);
        r.moved();
        assert!((r.remaining - 87.5).abs() < 1e-9, "{r:?}");
    }

    fn job(arrival_s: f64, name: &str, duration_s: f64) -> TraceJob {
        let w = workload::find(name).unwrap();
        TraceJob {
            arrival_s,
            workload: w,
            class: if w.solo_latency_ms.is_some() {
                JobClass::Online
            } else {
                JobClass::Offline
            },
            duration_s,
            memory_mib: w.nominal_memory_mib,
            checkpoint: false,
        }
    }

    fn run(policy: &str, trace: &Trace, gpus: u32) -> RunResult {
        run_on(policy, trace, gpus, &AnalyticModel::default())
    }

    /// `run` with `truth` as how fast jobs really run (the planner still uses the
    /// analytic model).
    fn run_on(policy: &str, trace: &Trace, gpus: u32, truth: &dyn PerfModel) -> RunResult {
        let p = planner(policy, Arc::new(AnalyticModel::default())).unwrap();
        simulate(
            trace,
            &SimConfig::new("a100-80gb", gpus),
            p.as_ref(),
            truth,
            &mut |_, _| {},
        )
        .unwrap()
    }

    #[test]
    fn one_job_alone_takes_its_solo_time_plus_the_instance_it_needs() {
        let t = Trace {
            jobs: vec![job(5.0, "resnet50-train", 100.0)],
        };
        // (first-fit is left out: it gives a job the smallest instance that holds its
        // memory, whatever that costs in speed.)
        for policy in ["default", "mmk", "miger", "miso", "mps"] {
            let r = run(policy, &t, 1);
            let j = &r.jobs[0];
            let setup = r.reconfigurations as f64 * 0.4;
            assert!(
                (j.jct_s() - (100.0 + setup)).abs() < 1e-6,
                "{policy}: {} with {} steps",
                j.jct_s(),
                r.reconfigurations
            );
            assert!((j.start_s - (5.0 + setup)).abs() < 1e-6, "{policy}");
        }
    }

    /// STP is averaged over the time GPUs run jobs: one job alone at a time, with a long
    /// idle gap between, is 1 (work over makespan would be 150 / 350).
    #[test]
    fn stp_is_a_busy_gpus_summed_progress_idle_time_left_out() {
        let t = Trace {
            jobs: vec![
                job(0.0, "resnet50-train", 100.0),
                job(300.0, "bert-train", 50.0),
            ],
        };
        let r = run("default", &t, 1);
        let s = crate::report::Summary::of(&r);
        assert!((s.stp - 1.0).abs() < 1e-9, "{s:?}");
        assert!(s.makespan_s > 349.0, "{s:?}");
    }

    /// An online job's time waiting for room counts as out of its SLO: two services on one
    /// GPU under Default, the second waits for the first to finish.
    #[test]
    fn an_online_jobs_wait_is_out_of_its_slo() {
        let t = Trace {
            jobs: vec![
                job(0.0, "resnet50-inference", 100.0),
                job(1.0, "resnet18-inference", 100.0),
            ],
        };
        let r = run("default", &t, 1);
        let waited: f64 = r.jobs.iter().map(|j| j.start_s - j.arrival_s).sum();
        let in_system: f64 = r.jobs.iter().map(JobOutcome::jct_s).sum();
        assert!(waited > 99.0, "{:?}", r.jobs);
        // Alone on a whole GPU each meets its SLO: only the waits miss it.
        assert!(
            (r.slo_miss_s - waited).abs() < 1e-6,
            "{} against {waited}",
            r.slo_miss_s
        );
        assert!((r.online_run_s - in_system).abs() < 1e-6);
    }

    #[test]
    fn two_jobs_under_default_run_back_to_back() {
        let t = Trace {
            jobs: vec![
                job(0.0, "resnet50-train", 100.0),
                job(1.0, "bert-train", 50.0),
            ],
        };
        let r = run("default", &t, 1);
        let (a, b) = (&r.jobs[0], &r.jobs[1]);
        assert!(b.start_s >= a.finish_s - 1e-9, "{a:?} {b:?}");
        assert!((b.finish_s - b.start_s - 50.0).abs() < 1e-6, "{b:?}");
    }

    #[test]
    fn every_job_finishes_once_and_the_same_seed_gives_the_same_run() {
        let t = generate(TraceSpec {
            online: 40,
            offline: 20,
            mean_interval_s: 20.0,
            seed: 3,
            checkpointable: 1.0,
            durations: crate::trace::Durations::Uniform,
            burst: 1.0,
        });
        for policy in ["default", "mps", "miso", "miger", "mmk"] {
            let r = run(policy, &t, 2);
            let ids: Vec<u64> = r.jobs.iter().map(|j| j.id).collect();
            assert_eq!(ids, (1..=60).collect::<Vec<u64>>(), "{policy}");
            assert!(
                r.jobs
                    .iter()
                    .all(|j| j.finish_s >= j.start_s && j.start_s >= j.arrival_s - 1e-9),
                "{policy}"
            );
            // No job runs faster than alone on a whole GPU.
            assert!(
                r.jobs
                    .iter()
                    .all(|j| j.finish_s - j.start_s >= j.solo_s - 1e-6),
                "{policy}"
            );
            assert_eq!(r, run(policy, &t, 2), "{policy} is deterministic");
        }
    }

    /// A ground truth where every job runs at one fixed speed.
    #[derive(Debug)]
    struct Fixed(f64);
    impl PerfModel for Fixed {
        fn estimate(&self, _: &JobProfile, _: &PartitionShape, _: u8, _: &[CoRunner]) -> f64 {
            self.0
        }
    }

    #[test]
    fn online_time_out_of_slo_is_the_time_run_slower_than_the_slo_allows() {
        // The SLO is 3x the solo latency: a third of the solo speed is the line.
        let t = Trace {
            jobs: vec![
                job(0.0, "resnet50-inference", 30.0),
                job(0.0, "resnet50-train", 30.0),
            ],
        };
        let sim = |speed: f64| run_on("default", &t, 2, &Fixed(speed));
        // Its instance takes a moment to make: that wait is out of SLO too.
        let wait = |r: &RunResult| r.jobs[0].start_s - r.jobs[0].arrival_s;
        // At half speed the online job runs 60 s and meets its SLO all along; the
        // offline one counts for neither.
        let r = sim(0.5);
        assert!(wait(&r) > 0.0);
        assert!(
            (r.online_run_s - 60.0 - wait(&r)).abs() < 1e-6,
            "{}",
            r.online_run_s
        );
        assert!((r.slo_miss_s - wait(&r)).abs() < 1e-6, "{}", r.slo_miss_s);
        // At a quarter it runs 120 s, all of them out of SLO.
        let r = sim(0.25);
        assert!(
            (r.online_run_s - 120.0 - wait(&r)).abs() < 1e-6,
            "{}",
            r.online_run_s
        );
        assert!(
            (r.slo_miss_s - r.online_run_s).abs() < 1e-6,
            "{}",
            r.slo_miss_s
        );
        assert_eq!(crate::Summary::of(&r).slo_miss_pct, Some(100.0));
        // ResNet-50 inference: 6 ms alone, SLO 18 ms; the line is a speed of exactly 1/3.
        let r = sim(0.34);
        assert!((r.slo_miss_s - wait(&r)).abs() < 1e-6, "{}", r.slo_miss_s);
        let r = sim(0.33);
        assert!(
            (r.slo_miss_s - 30.0 / 0.33 - wait(&r)).abs() < 1e-6,
            "{}",
            r.slo_miss_s
        );
    }

    #[test]
    fn time_beside_a_job_of_the_other_class_is_counted() {
        // Plain MPS puts both in the GPU's one partition: 30 s together, then the
        // training 30 s alone; 60 of the 90 job-seconds are beside the other class.
        let t = Trace {
            jobs: vec![
                job(0.0, "resnet50-inference", 30.0),
                job(0.0, "resnet50-train", 60.0),
            ],
        };
        let r = run_on("mps", &t, 1, &Fixed(1.0));
        assert!((r.job_run_s - 90.0).abs() < 1e-6, "{}", r.job_run_s);
        assert!((r.mixed_run_s - 60.0).abs() < 1e-6, "{}", r.mixed_run_s);
        assert!((crate::Summary::of(&r).mixed_pct - 200.0 / 3.0).abs() < 1e-6);
        // Default gives each its own GPU: never beside each other.
        let r = run_on("default", &t, 2, &Fixed(1.0));
        assert_eq!(
            (r.mixed_run_s, crate::Summary::of(&r).mixed_pct),
            (0.0, 0.0)
        );
    }

    #[test]
    fn a_job_that_fits_nowhere_is_reported_not_looped_on() {
        let mut big = job(0.0, "bert-train", 10.0);
        big.memory_mib = 200 * 1024;
        let e = simulate(
            &Trace { jobs: vec![big] },
            &SimConfig::new("a100-80gb", 1),
            planner("mmk", Arc::new(AnalyticModel::default()))
                .unwrap()
                .as_ref(),
            &AnalyticModel::default(),
            &mut |_, _| {},
        )
        .unwrap_err();
        assert!(matches!(e, SimError::Stuck { job: 1, .. }), "{e}");
    }
}
