//! `mmk-lab simulate`: replay a job trace through mmk's planners and the baselines, with no
//! GPU and no mmkd (docs/simulate.md).

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use mmk_core::workload;
use mmk_partitioner::{AnalyticModel, PLANNERS, PerfModel};
use mmk_predictor::Predictor;
use mmk_simulator::experiment::{
    self, ExperimentError, KERNEL_SCHED_POLICY, PROMPT_REFERENCE_POLICY, PolicyRun, Progress,
    REFERENCE_POLICY, Report, Setup, Spread, SweepReport, SweepRun, World, is_reference,
    measured_kernel_effect, measured_truth, relative, sweep_rows,
};
use mmk_simulator::trace::Durations;
use mmk_simulator::{KernelEffect, RunResult, SimConfig, Trace, TraceSpec, trace};
use mmk_simulator::{reference, report};

use mmk_cli::{Failure, Format};
use mmk_core::error::chain as source_chain;

use crate::print_json;

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// A named setup: `mmk-paper` (800 online + 400 offline jobs, Poisson arrivals every
    /// 40 s on average, 8 A100-80GB). Flags given with it override its values.
    #[arg(long)]
    pub preset: Option<String>,
    /// Replay this trace (CSV, docs/simulate.md) instead of generating one.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Generated trace: online jobs [default: 80].
    #[arg(long)]
    pub online: Option<usize>,
    /// Generated trace: offline jobs [default: 40].
    #[arg(long)]
    pub offline: Option<usize>,
    /// Generated trace: mean seconds between arrivals [default: 40]. Several,
    /// comma-separated, sweep the arrival rate.
    #[arg(long, value_name = "SECONDS", value_delimiter = ',')]
    pub interval: Vec<f64>,
    /// Generated trace: the seed. Several, comma-separated, run each and report the
    /// spread.
    #[arg(long, default_value = "1", value_delimiter = ',')]
    pub seed: Vec<u64>,
    /// GPUs of the simulated node [default: 8].
    #[arg(long)]
    pub gpus: Option<u32>,
    #[arg(long, default_value = "a100-80gb")]
    pub gpu_model: String,
    /// Policies to compare, comma-separated: the planners (all on the same ground truth),
    /// `mmk-ks` (MMK on its kernel scheduler's effect, `--kernel-sched`), `reference`, the
    /// best schedule a clairvoyant search finds for a small trace (at most 40 jobs and 4
    /// GPUs; docs/simulate.md, "Distance from the best schedule"), and `reference-prompt`,
    /// the same in a class that keeps online jobs from waiting [default:
    /// default,mps,miso,miger,mmk,mmk-ks; without mmk-ks with `--kernel-sched off`].
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// The planners' performance model: `forest` (trained now on generated rows of
    /// another seed than the trace), `analytic` (the ground truth itself), or a model
    /// file from `mmk-lab predictor train`.
    #[arg(long, default_value = "forest")]
    pub model: String,
    /// How fast jobs really run: `measured` (the H200 measurements in
    /// data/gpu/h200-2026-11-21, with MIG instances as SM fractions; docs/simulate.md)
    /// or `analytic` (the planner's formula with the workload table's nominal demands).
    #[arg(long, default_value = "measured", value_parser = ["measured", "analytic"])]
    pub truth: String,
    /// The kernel scheduler's effect that the policy `mmk-ks` runs on (every other policy,
    /// `mmk` too, runs without one): `measured` (mmkd's defaults in co-location rounds on
    /// an H100 and an H200, per pairing of service and training; docs/simulate.md),
    /// `h200-depth8` (an earlier configuration measured on an H200: a 1.5 ms base and the
    /// offline depth cap of 8), `off` (no `mmk-ks`), or an `mmk-lab ksim --output json`
    /// report to take the effect from the kernel-level simulator (a file named like a
    /// value: `./off`).
    #[arg(
        long,
        default_value = "measured",
        value_name = "measured|h200-depth8|off|FILE"
    )]
    pub kernel_sched: String,
    /// The most MPS share (%) an offline job gets from MMK and MIGER, as `mmkd
    /// --offline-share-max` (10 to 100, a multiple of 10) [default: 100, no cap].
    #[arg(long, value_name = "PCT", default_value_t = 100)]
    pub offline_share_max: u8,
    /// Also write the relative-JCT CDF of each policy as an SVG.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Also write the generated trace (CSV), to replay it later with --trace.
    #[arg(long, value_name = "FILE")]
    pub save_trace: Option<PathBuf>,
    /// Also write each job's times under each policy (CSV: arrival, start, finish, JCT,
    /// solo time, wait, JCT over solo time, moves).
    #[arg(long, value_name = "FILE")]
    pub jobs_out: Option<PathBuf>,
    /// Generated trace: the share of offline jobs that can checkpoint, 0 to 1 (the others
    /// are never moved or preempted).
    #[arg(long, value_name = "FRACTION", default_value_t = DEFAULT_CHECKPOINTABLE)]
    pub checkpointable: f64,
    /// How often a checkpointable job checkpoints (seconds of its run): a move or a
    /// preemption loses the work since the last checkpoint; 0: a job checkpoints as it
    /// stops, and a move loses no work.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_CHECKPOINT_EVERY_S)]
    pub checkpoint_every: f64,
    /// Generated trace: job durations lognormal with this sigma (0.1 to 3), mean the
    /// workload's nominal duration, instead of uniform within half of it.
    #[arg(long, value_name = "SIGMA")]
    pub duration_sigma: Option<f64>,
    /// Generated trace: jobs arrive in bursts of this many on average (1 to 100), 1 s apart
    /// within a burst, at the same mean interval; 1: Poisson arrivals.
    #[arg(long, value_name = "JOBS", default_value_t = 1.0)]
    pub burst: f64,
}

/// A generated trace's share of offline jobs that can checkpoint: half. Trainings that
/// checkpoint for restarts are common, not universal; the planners that move jobs must
/// not lean on every job moving.
const DEFAULT_CHECKPOINTABLE: f64 = 0.5;

/// How often a checkpointable job checkpoints, in seconds of its run: every 10 minutes, so
/// that a move loses 5 minutes of work on average besides its restart.
const DEFAULT_CHECKPOINT_EVERY_S: f64 = 600.0;

/// What to generate for one interval and seed.
fn spec(
    a: &SimulateArgs,
    (online, offline): (usize, usize),
    interval: f64,
    seed: u64,
) -> TraceSpec {
    TraceSpec {
        online,
        offline,
        mean_interval_s: interval,
        seed,
        checkpointable: a.checkpointable,
        durations: a
            .duration_sigma
            .map_or(Durations::Uniform, Durations::Lognormal),
        burst: a.burst,
    }
}

/// `--kernel-sched`: `off`, `measured`, `h200-depth8`, or a ksim report's file.
fn kernel_effect(flag: &str) -> Result<Option<KernelEffect>, Failure> {
    Ok(match flag {
        "off" => None,
        "measured" => Some(measured_kernel_effect().map_err(usage)?),
        "h200-depth8" => Some(experiment::h200_depth8_kernel_effect().map_err(usage)?),
        path => {
            let text = mmk_cli::input::read_capped_text(path.as_ref(), mmk_cli::input::MAX_DATA_BYTES).map_err(|e| {
                Failure::usage(format!(
                    "--kernel-sched: {path:?} is not `measured`, `h200-depth8`, `off` or a readable ksim report: {e}"
                ))
            })?;
            Some(
                KernelEffect::from_ksim(path, &text)
                    .map_err(|e| Failure::usage(format!("--kernel-sched: {}", source_chain(&e))))?,
            )
        }
    })
}

/// The workloads that the measured ground truth has no measurements of.
fn unmeasured(truth: &str, cfg: &SimConfig) -> Vec<&'static str> {
    if truth != "measured" {
        return Vec::new();
    }
    workload::WORKLOADS
        .iter()
        .map(|w| w.name)
        .filter(|n| !cfg.profiles.contains_key(n))
        .collect()
}

/// The reference search takes small traces only: refused, saying how large this one is.
fn check_reference_size(
    a: &SimulateArgs,
    t: &Trace,
    (online, offline): (usize, usize),
    with_reference: bool,
) -> Result<(), Failure> {
    // A generated trace (or each of a sweep's) has `online + offline` jobs.
    let (jobs, given) = match &a.trace {
        Some(_) => (t.jobs.len(), format!("the trace has {}", t.jobs.len())),
        None => (
            online + offline,
            format!("--online {online} --offline {offline}"),
        ),
    };
    let named = a.policies.iter().find(|p| is_reference(p));
    if let Some(named) = named.filter(|_| with_reference && jobs > reference::MAX_JOBS) {
        return Err(Failure::usage(format!(
            "--policies {named}: the reference search takes at most {} jobs ({given})",
            reference::MAX_JOBS
        )));
    }
    Ok(())
}

/// The flags that `run` cannot go on with, refused with the flag named; whether they ask
/// for a sweep, and for the reference schedule.
fn check(
    a: &SimulateArgs,
    intervals: &[f64],
    gpus: u32,
    jobs: usize,
) -> Result<(bool, bool), Failure> {
    if let Some(bad) = intervals.iter().find(|i| !(i.is_finite() && **i > 0.0)) {
        return Err(Failure::usage(format!(
            "--interval must be greater than zero (got {bad})"
        )));
    }
    for (flag, values) in [
        (
            "--interval",
            intervals.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
        ),
        ("--seed", a.seed.iter().map(u64::to_string).collect()),
    ] {
        let twice = values
            .iter()
            .enumerate()
            .find(|(i, v)| values[..*i].contains(v));
        if let Some((_, v)) = twice {
            return Err(Failure::usage(format!("{flag}: {v} given twice")));
        }
    }
    let sweep = intervals.len() * a.seed.len() > 1;
    if sweep && a.trace.is_some() {
        return Err(Failure::usage(
            "--trace replays one trace: several --interval or --seed values generate several",
        ));
    }
    if sweep && (a.svg.is_some() || a.save_trace.is_some() || a.jobs_out.is_some()) {
        return Err(Failure::usage(
            "--svg, --save-trace and --jobs-out need one trace: give one --interval and one --seed",
        ));
    }
    if !(10..=100).contains(&a.offline_share_max) || !a.offline_share_max.is_multiple_of(10) {
        return Err(Failure::usage(format!(
            "--offline-share-max: {} is not an MPS share mmk gives (10 to 100, a multiple of 10)",
            a.offline_share_max
        )));
    }
    if !(0.0..=1.0).contains(&a.checkpointable) {
        return Err(Failure::usage(format!(
            "--checkpointable: {} is not a share between 0 and 1",
            a.checkpointable
        )));
    }
    if !(a.checkpoint_every.is_finite() && a.checkpoint_every >= 0.0) {
        return Err(Failure::usage(format!(
            "--checkpoint-every: {} is not a number of seconds, 0 or more",
            a.checkpoint_every
        )));
    }
    if let Some(sigma) = a.duration_sigma
        && !(0.1..=3.0).contains(&sigma)
    {
        return Err(Failure::usage(format!(
            "--duration-sigma: {sigma} is not a lognormal sigma from 0.1 to 3"
        )));
    }
    if !(1.0..=100.0).contains(&a.burst) {
        return Err(Failure::usage(format!(
            "--burst: {} is not a mean burst size from 1 to 100 jobs",
            a.burst
        )));
    }
    if a.trace.is_some() && (a.duration_sigma.is_some() || a.burst != 1.0) {
        return Err(Failure::usage(
            "--duration-sigma and --burst shape a generated trace; a replayed --trace has its own",
        ));
    }
    if gpus == 0 || gpus > 128 {
        return Err(Failure::usage("--gpus must be between 1 and 128"));
    }
    for p in &a.policies {
        if !PLANNERS.contains(&p.as_str()) && !is_reference(p) && p != KERNEL_SCHED_POLICY {
            return Err(Failure::usage(format!(
                "--policies: unknown policy {p:?}; known: {}, {KERNEL_SCHED_POLICY}, {REFERENCE_POLICY}, {PROMPT_REFERENCE_POLICY}",
                PLANNERS.join(", ")
            )));
        }
        if p == KERNEL_SCHED_POLICY && a.kernel_sched == "off" {
            return Err(Failure::usage(format!(
                "--policies {KERNEL_SCHED_POLICY} runs MMK on its kernel scheduler's effect, and --kernel-sched off gives none"
            )));
        }
    }
    let named = a.policies.iter().find(|p| is_reference(p));
    let with_reference = named.is_some();
    if let Some(named) = named.filter(|_| gpus > reference::MAX_GPUS) {
        return Err(Failure::usage(format!(
            "--policies {named}: the reference search takes at most {} GPUs (--gpus {gpus})",
            reference::MAX_GPUS
        )));
    }
    if a.trace.is_none() && jobs == 0 {
        return Err(Failure::usage("--online and --offline are both 0: no jobs"));
    }
    Ok((sweep, with_reference))
}

/// The policies when `--policies` is not given: every planner on the ground truth, and
/// MMK on the kernel scheduler's effect unless `--kernel-sched off`.
fn default_policies(kernel_sched: &str) -> Vec<String> {
    [
        "default",
        "mps",
        "miso",
        "miger",
        "mmk",
        KERNEL_SCHED_POLICY,
    ]
    .iter()
    .filter(|p| kernel_sched != "off" || **p != KERNEL_SCHED_POLICY)
    .map(|p| (*p).to_owned())
    .collect()
}

pub fn run(fmt: Format, mut a: SimulateArgs) -> Result<(), Failure> {
    if a.policies.is_empty() {
        a.policies = default_policies(&a.kernel_sched);
    }
    let (mut online, mut offline, mut interval, mut gpus) = (80, 40, 40.0, 8);
    match a.preset.as_deref() {
        None => {}
        Some("mmk-paper") => (online, offline, interval, gpus) = (800, 400, 40.0, 8),
        Some(other) => {
            return Err(Failure::usage(format!(
                "--preset: unknown preset {other:?}; known: mmk-paper"
            )));
        }
    }
    let online = a.online.unwrap_or(online);
    let offline = a.offline.unwrap_or(offline);
    let intervals = if a.interval.is_empty() {
        vec![interval]
    } else {
        a.interval.clone()
    };
    let gpus = a.gpus.unwrap_or(gpus);
    let (sweep, with_reference) = check(&a, &intervals, gpus, online + offline)?;
    let generate =
        |interval: f64, seed: u64| trace::generate(spec(&a, (online, offline), interval, seed));
    // One trace to replay or generate; a sweep generates its own below.
    let t = match &a.trace {
        Some(path) => {
            let text =
                mmk_cli::input::read_capped_text(path.as_ref(), mmk_cli::input::MAX_DATA_BYTES)
                    .map_err(|e| Failure::usage(format!("cannot read {}: {e}", path.display())))?;
            Trace::parse(&text).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?
        }
        None if sweep => Trace { jobs: Vec::new() },
        None => generate(intervals[0], a.seed[0]),
    };
    check_reference_size(&a, &t, (online, offline), with_reference)?;
    if let Some(path) = &a.save_trace {
        std::fs::write(path, t.to_csv())
            .map_err(|e| Failure::usage(format!("cannot write {}: {e}", path.display())))?;
    }
    let mut cfg = SimConfig::new(&a.gpu_model, gpus);
    cfg.checkpoint_every_s = (a.checkpoint_every > 0.0).then_some(a.checkpoint_every);
    let truth: Arc<dyn PerfModel> = if a.truth == "measured" {
        let (truth, profiles) = measured_truth().map_err(usage)?;
        cfg.profiles = profiles;
        Arc::new(truth)
    } else {
        Arc::new(AnalyticModel::default())
    };
    let kernel_sched = kernel_effect(&a.kernel_sched)?;
    let jobs = experiment::planners_jobs(&cfg.profiles);
    let file_model: Option<Arc<dyn PerfModel>> = match a.model.as_str() {
        "analytic" | "forest" => None,
        path => Some(Arc::new(
            Predictor::load(std::path::Path::new(path))
                .map_err(|e| Failure::usage(source_chain(&e)))?,
        )),
    };
    // The planners' model of a world whose jobs run as `truth` says.
    let model_of = |truth: &Arc<dyn PerfModel>,
                    what: &str|
     -> Result<Arc<dyn PerfModel>, Failure> {
        if let Some(m) = &file_model {
            return Ok(m.clone());
        }
        if a.model == "analytic" {
            return Ok(truth.clone());
        }
        eprintln!(
            "training the planners' forest on 1400 rows generated from the {} ground truth{what} (seed 99)...",
            a.truth
        );
        Ok(Arc::new(
            experiment::train_forest(truth.as_ref(), &jobs).map_err(usage)?,
        ))
    };
    let plain = World {
        model: model_of(&truth, "")?,
        truth: truth.clone(),
    };
    // MMK's jobs run under its kernel scheduler, and its predictor learns from them.
    let scheduled = match &kernel_sched {
        Some(effect) if a.policies.iter().any(|p| p == KERNEL_SCHED_POLICY) => {
            let truth = experiment::with_kernel_sched(truth.clone(), effect.clone(), &jobs);
            Some(World {
                model: model_of(&truth, " with the kernel scheduler")?,
                truth,
            })
        }
        _ => None,
    };
    let unmeasured = unmeasured(&a.truth, &cfg);
    let setup = Setup {
        gpus,
        gpu_model: a.gpu_model.clone(),
        model: a.model.clone(),
        ground_truth: if a.truth == "measured" {
            "measured on an H200 (docs/simulate.md)"
        } else {
            "analytic model (docs/simulate.md)"
        },
        unmeasured,
        // Reported only where it acts.
        kernel_sched: kernel_sched.filter(|_| a.policies.iter().any(|p| p == KERNEL_SCHED_POLICY)),
        offline_share_max: a.offline_share_max,
        checkpointable: a.trace.is_none().then_some(a.checkpointable),
        duration_sigma: a.trace.is_none().then_some(a.duration_sigma).flatten(),
        burst: (a.trace.is_none() && a.burst > 1.0).then_some(a.burst),
        checkpoint_every_s: cfg.checkpoint_every_s,
    };
    if sweep {
        let worlds = (&plain, scheduled.as_ref());
        return run_sweep(fmt, &a, (online, offline), &intervals, &cfg, worlds, setup);
    }
    let runs = run_policies(
        &t,
        &cfg,
        &a.policies,
        &plain,
        scheduled.as_ref(),
        a.offline_share_max,
        "",
    )?;
    let rs: Vec<&RunResult> = runs.iter().map(|r| &r.run).collect();
    for (path, text) in [
        (&a.svg, report::cdf_svg as fn(&[&RunResult]) -> String),
        (&a.jobs_out, report::jobs_csv),
    ] {
        if let Some(path) = path {
            std::fs::write(path, text(&rs))
                .map_err(|e| Failure::usage(format!("cannot write {}: {e}", path.display())))?;
        }
    }
    let report = Report {
        jobs: t.jobs.len(),
        setup,
        policies: relative(&runs),
    };
    match fmt {
        Format::Json => print_json(&report),
        Format::Table => print_table(&report),
    }
    Ok(())
}

/// A sweep: a trace generated per interval and seed, every policy run on each.
fn run_sweep(
    fmt: Format,
    a: &SimulateArgs,
    (online, offline): (usize, usize),
    intervals: &[f64],
    cfg: &SimConfig,
    (plain, scheduled): (&World, Option<&World>),
    setup: Setup,
) -> Result<(), Failure> {
    let mut runs = Vec::new();
    for &interval in intervals {
        for &seed in &a.seed {
            let t = trace::generate(spec(a, (online, offline), interval, seed));
            let label = format!("interval {interval} s, seed {seed}: ");
            let results = run_policies(
                &t,
                cfg,
                &a.policies,
                plain,
                scheduled,
                a.offline_share_max,
                &label,
            )?;
            runs.push(SweepRun {
                interval_s: interval,
                seed,
                policies: relative(&results),
            });
        }
    }
    let report = SweepReport {
        jobs_per_run: online + offline,
        setup,
        seeds: a.seed.clone(),
        intervals_s: intervals.to_vec(),
        rows: sweep_rows(intervals, &a.policies, &runs),
        runs,
    };
    match fmt {
        Format::Json => print_json(&report),
        Format::Table => print_sweep(&report),
    }
    Ok(())
}

/// Runs the policies (experiment::run_policies) with a progress bar on a terminal and a
/// line per policy.
fn run_policies(
    t: &Trace,
    cfg: &SimConfig,
    policies: &[String],
    plain: &World,
    scheduled: Option<&World>,
    offline_share_max: u8,
    label: &str,
) -> Result<Vec<PolicyRun>, Failure> {
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut last = 0;
    experiment::run_policies(
        t,
        cfg,
        policies,
        plain,
        scheduled,
        offline_share_max,
        label,
        &mut |p| match p {
            Progress::Step {
                policy,
                done,
                total,
            } => {
                let pct = done * 100 / total.max(1);
                if tty && pct != last {
                    last = pct;
                    let bar = "#".repeat(pct / 4);
                    eprint!("\r{label}{policy:<10} [{bar:<25}] {done}/{total} jobs");
                    let _ = std::io::stderr().flush();
                }
            }
            Progress::Done {
                policy,
                jobs,
                seconds,
            } => {
                last = 0;
                if tty {
                    eprint!("\r{:<90}\r", "");
                }
                eprintln!("{label}{policy}: simulated {jobs} jobs in {seconds:.2} s");
            }
        },
    )
    .map_err(usage)
}

/// An experiment's error as mmkctl reports it, with its causes.
fn usage(e: ExperimentError) -> Failure {
    Failure::usage(source_chain(&e))
}

fn print_sweep(r: &SweepReport) {
    let seeds: Vec<String> = r.seeds.iter().map(u64::to_string).collect();
    outln!(
        "{} jobs a run, {} x {}, seeds {}; planners' model: {}, ground truth: {}",
        r.jobs_per_run,
        r.setup.gpus,
        r.setup.gpu_model,
        seeds.join(","),
        r.setup.model,
        r.setup.ground_truth
    );
    outln!("{}", kernel_line(&r.setup));
    outln!(
        "relative to MIGER but SLO MISS (a share of online time) and MIXED (a share of job time): the mean over the seeds (lowest..highest)"
    );
    outln!(
        "{:>9} {:<16} {:>9} {:>24} {:>24} {:>24} {:>22} {:>22}",
        "INTERVAL",
        "POLICY",
        "AVG JCT",
        "JCT vsMIGER",
        "MAKESPAN vsMIGER",
        "STP vsMIGER",
        "SLO MISS",
        "MIXED"
    );
    let spread = |s: &Option<Spread>| {
        s.as_ref().map_or_else(
            || "-".to_owned(),
            |s| format!("{:+.1}% ({:+.1}..{:+.1})", s.mean, s.min, s.max),
        )
    };
    let share = |s: Option<&Spread>| {
        s.map_or_else(
            || "-".to_owned(),
            |s| format!("{:.1}% ({:.1}..{:.1})", s.mean, s.min, s.max),
        )
    };
    for row in &r.rows {
        outln!(
            "{:>8}s {:<16} {:>8.0}s {:>24} {:>24} {:>24} {:>22} {:>22}",
            row.interval_s,
            row.policy,
            row.avg_jct_s.mean,
            spread(&row.jct_vs_miger_pct),
            spread(&row.makespan_vs_miger_pct),
            spread(&row.stp_vs_miger_pct),
            share(row.slo_miss_pct.as_ref()),
            share(Some(&row.mixed_pct))
        );
    }
    if r.rows.iter().any(|row| row.jct_vs_reference_pct.is_some()) {
        outln!(
            "average JCT against the reference schedule's (mean over the seeds, lowest..highest); the reference's class averages at least its bound"
        );
        for row in &r.rows {
            match (&row.lower_bound_avg_jct_s, row.exact_runs) {
                (Some(b), Some(exact)) => outln!(
                    "{:>8}s {:<16} bound {:.0} s ({:.0}..{:.0}), the search exact in {exact} of {} runs",
                    row.interval_s,
                    row.policy,
                    b.mean,
                    b.min,
                    b.max,
                    row.runs
                ),
                _ => outln!(
                    "{:>8}s {:<16} {}",
                    row.interval_s,
                    row.policy,
                    spread(&row.jct_vs_reference_pct)
                ),
            }
        }
    }
}

fn kernel_line(s: &Setup) -> String {
    let cap = if s.offline_share_max < 100 {
        format!(
            "; MMK's and MIGER's offline MPS shares at most {} %",
            s.offline_share_max
        )
    } else {
        String::new()
    };
    let line = match &s.kernel_sched {
        None => format!("kernel scheduler: off (or no {KERNEL_SCHED_POLICY} policy in the run)"),
        Some(k) => {
            let pairs: Vec<String> = k
                .pairs
                .iter()
                .map(|p| {
                    format!(
                        "{:?} beside {:?} {:.0} % / {:.0} %",
                        p.online,
                        p.offline,
                        100.0 * p.online_excess_kept,
                        100.0 * p.offline_kept
                    )
                    .to_lowercase()
                })
                .collect();
            let pairs = if pairs.is_empty() {
                String::new()
            } else {
                format!(" on average; per pairing: {}", pairs.join(", "))
            };
            format!(
                "kernel scheduler under {KERNEL_SCHED_POLICY}: an online job keeps {:.0} % of its slowdown from offline co-runners, an offline job next to online ones runs at {:.0} %{pairs} ({})",
                100.0 * k.online_excess_kept,
                100.0 * k.offline_kept,
                k.source
            )
        }
    };
    line + &cap
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:+.1}%"))
}

/// Each class apart: average JCT, the offline jobs' tail slowdown, the jobs slowed more
/// than ten times.
fn print_classes(r: &Report) {
    outln!(
        "{:<16} {:>11} {:>12} {:>17} {:>10}",
        "POLICY",
        "ONLINE JCT",
        "OFFLINE JCT",
        "OFFLINE P95 SLOW",
        "OVER 10x"
    );
    let secs = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}s"));
    for p in &r.policies {
        let s = &p.summary;
        outln!(
            "{:<16} {:>11} {:>12} {:>17} {:>9.1}%",
            s.policy,
            secs(s.online_avg_jct_s),
            secs(s.offline_avg_jct_s),
            s.offline_p95_slowdown
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}x")),
            s.slowed_10x_pct
        );
    }
}

fn print_table(r: &Report) {
    outln!(
        "{} jobs, {} x {}, planners' model: {}, ground truth: {}",
        r.jobs,
        r.setup.gpus,
        r.setup.gpu_model,
        r.setup.model,
        r.setup.ground_truth
    );
    outln!("{}", kernel_line(&r.setup));
    outln!(
        "{:<16} {:>8} {:>7} {:>7} {:>8} {:>8} {:>9} {:>7} {:>5} {:>7} {:>8} {:>6} {:>6} {:>5}",
        "POLICY",
        "AVG JCT",
        "vsDEF",
        "vsMIGER",
        "P50",
        "P99",
        "MAKESPAN",
        "vsMIGER",
        "STP",
        "vsMIGER",
        "SLO MISS",
        "MIXED",
        "RECONF",
        "MOVES"
    );
    for p in &r.policies {
        let s = &p.summary;
        outln!(
            "{:<16} {:>7.0}s {:>7} {:>7} {:>7.0}s {:>7.0}s {:>8.0}s {:>7} {:>5.2} {:>7} {:>8} {:>5.1}% {:>6} {:>5}",
            s.policy,
            s.avg_jct_s,
            pct(p.jct_vs_default_pct),
            pct(p.jct_vs_miger_pct),
            s.p50_jct_s,
            s.p99_jct_s,
            s.makespan_s,
            pct(p.makespan_vs_miger_pct),
            s.stp,
            pct(p.stp_vs_miger_pct),
            s.slo_miss_pct
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}%")),
            s.mixed_pct,
            s.reconfigurations,
            s.moves
        );
    }
    print_classes(r);
    for (policy, search) in r
        .policies
        .iter()
        .filter_map(|p| Some((&p.summary.policy, p.search?)))
    {
        let how = if search.exact {
            format!("exact ({} nodes)", search.nodes)
        } else {
            format!("the best of {} nodes", search.nodes)
        };
        outln!(
            "{policy}: {how}; no schedule of its class averages less than {:.0} s",
            search.lower_bound_avg_jct_s
        );
    }
    if r.policies.iter().any(|p| p.search.is_some()) {
        let vs: Vec<String> = r
            .policies
            .iter()
            .filter(|p| p.search.is_none())
            .map(|p| format!("{} {}", p.summary.policy, pct(p.jct_vs_reference_pct)))
            .collect();
        outln!("average JCT against the reference's: {}", vs.join(", "));
    }
}
