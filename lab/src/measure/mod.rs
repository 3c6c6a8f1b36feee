//! `mmk-lab measure PLAN.yaml -o RAW.jsonl`: measure workloads on this machine's GPU under
//! MPS shares, alone, in pairs and in groups of three or more, for the predictor's dataset
//! and the simulator's ground truth (docs/measure.md).
//!
//! A worker process (the plan's `worker` command, for example lab/scripts/gpu/workloads.py)
//! runs the workloads; mmk-lab starts one per MPS share (the share is fixed when a CUDA
//! context starts), tells it what to build and when to measure over a line protocol, and
//! samples the GPU's GPM metrics over each window through NVML. Each run is appended to
//! the output as soon as it is measured, so a cut-off sweep keeps what it did and
//! `--resume` goes on from there.
//!
//! `--kernels` and `--deep` add passes that describe each job's kernels ([`kernels`]).

mod kernels;
mod sweep;
mod worker;
pub use sweep::*;
pub use worker::*;

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use clap::Args;
use mmk_core::JobClass;
use mmk_core::stats::quantile;
use mmk_kernel_sched::gate::monotonic_ns;
use mmk_predictor::measured::{
    self, FORMAT_VERSION, Failed, Gpm, GpuInfo, Header, JobRef, JobResult, Mode, Record, Run,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use mmk_cli::{Failure, Format};

#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// The measurement plan (docs/measure.md).
    pub plan: PathBuf,
    /// Where the measurements go (JSON lines, appended run by run).
    #[arg(short = 'o', long = "out", value_name = "RAW.jsonl")]
    pub out: PathBuf,
    /// Keep the runs already in the output and measure only the others.
    #[arg(long)]
    pub resume: bool,
    /// Which GPU NVML samples (its index); the workers see what CUDA_VISIBLE_DEVICES gives.
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
    /// Do not sample GPM metrics (rows need them: such runs only measure speed).
    #[arg(long)]
    pub no_gpm: bool,
    /// Only this part of the plan.
    #[arg(long, value_enum)]
    pub only: Option<Part>,
    /// Also convert everything in the output into the predictor's CSV here.
    #[arg(long, value_name = "DATA.csv")]
    pub dataset: Option<PathBuf>,
    /// Also record each job's kernels alone at 100 % with the interposer's record mode
    /// (launches, busy fraction, SM demand, duration mix).
    #[arg(long)]
    pub kernels: bool,
    /// Also profile each job's kernels alone at 100 % under Nsight Compute (occupancy,
    /// IPC, L2 hit rate, DRAM throughput); these fill the rows' kernel-level columns.
    #[arg(long)]
    pub deep: bool,
    /// The interposer for --kernels (default: the one next to mmk-lab).
    #[arg(long, value_name = "PATH")]
    pub interposer: Option<PathBuf>,
    /// The ncu program for --deep.
    #[arg(long, default_value = "ncu", value_name = "PATH")]
    pub ncu: PathBuf,
    /// --deep: how many kernels ncu profiles per job, from the window's start.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub ncu_launches: u32,
}

/// A part of the work: `alone`, `pairs` and `groups` are the plan's sections, `kernels`
/// and `deep` the passes of --kernels and --deep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Alone,
    Pairs,
    Groups,
    Kernels,
    Deep,
}

// ---------------------------------------------------------------------------------------
// The plan.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    worker: Vec<String>,
    #[serde(default)]
    window: Option<String>,
    #[serde(default)]
    settle: Option<String>,
    #[serde(default)]
    alone: Option<RawAlone>,
    #[serde(default)]
    pairs: Option<RawPairs>,
    #[serde(default)]
    groups: Option<RawGroups>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlone {
    shares: Vec<u32>,
    jobs: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPairs {
    splits: Vec<[u32; 2]>,
    jobs: Vec<[String; 2]>,
}

/// Three or more jobs side by side: every split has one share per job of a group.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroups {
    splits: Vec<Vec<u32>>,
    jobs: Vec<Vec<String>>,
}

/// The most jobs one run of `groups` may hold (one worker, one CUDA context each).
const MAX_GROUP: usize = 8;

/// A plan: the worker, the window, and the runs grouped by the workers' shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The plan file, as given (recorded in the header).
    pub file: String,
    pub worker: Vec<String>,
    /// The worker runs here (the plan file's directory).
    pub dir: PathBuf,
    pub window: Duration,
    /// How long the jobs of a run go before the window opens.
    pub settle: Duration,
    pub groups: Vec<Group>,
}

/// Runs that the same workers measure: one worker per share in `shares`.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub mode: Mode,
    pub shares: Vec<u32>,
    /// Each run's workloads, one per worker: (name, batch).
    pub runs: Vec<Vec<(String, u32)>>,
}

impl Group {
    fn refs(&self, run: &[(String, u32)]) -> Vec<JobRef> {
        run.iter()
            .zip(&self.shares)
            .map(|((w, b), s)| JobRef {
                workload: w.clone(),
                batch: *b,
                share_pct: *s,
            })
            .collect()
    }
}

/// Why a plan, a monitor, a worker or the measurement file failed.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The plan file; the message names the field (`pairs.splits[0][1]: 0 is outside
    /// 1..=100`).
    #[error("{0}")]
    Plan(String),
    #[error("NVML: {context}")]
    Nvml {
        context: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// No GPU metrics for a window (`--no-gpm`, or NVML could not start).
    #[error("{0}")]
    NoGpm(String),
    /// A worker that could not start, went away or answered what it should not; the
    /// message names it by its share.
    #[error("{0}")]
    Worker(String),
    /// What went wrong in one job of a run (`resnet50-inf/32: prepare`).
    #[error("{job}: {cause}")]
    Job {
        job: String,
        cause: Box<MeasureError>,
    },
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}")]
    Input {
        path: PathBuf,
        #[source]
        source: mmk_cli::input::InputError,
    },
    #[error("{path}")]
    Records {
        path: PathBuf,
        #[source]
        source: measured::MeasuredError,
    },
    #[error("a record cannot be written as JSON")]
    Json(#[source] serde_json::Error),
    /// Kernel statistics (ncu's report, traces); the message says which.
    #[error("{0}")]
    Kernels(String),
}

fn nvml_error(
    context: impl Into<String>,
) -> impl FnOnce(nvml_wrapper::error::NvmlError) -> MeasureError {
    let context = context.into();
    move |source| MeasureError::Nvml { context, source }
}

/// A measurement error as the command reports it, with its causes.
fn failure(e: MeasureError) -> Failure {
    Failure::usage(mmk_core::error::chain(&e))
}

impl MeasureError {
    fn in_job(self, job: impl Into<String>) -> MeasureError {
        MeasureError::Job {
            job: job.into(),
            cause: Box::new(self),
        }
    }
}

fn job_ref(field: &str, s: &str) -> Result<(String, u32), MeasureError> {
    let bad = || {
        MeasureError::Plan(format!(
            "{field}: {s:?} is not NAME/BATCH (for example resnet50-inf/32)"
        ))
    };
    let (name, batch) = s.rsplit_once('/').ok_or_else(bad)?;
    let batch: u32 = batch.trim().parse().map_err(|_| bad())?;
    let name = name.trim();
    if name.is_empty() || batch == 0 || name.contains(',') {
        return Err(bad());
    }
    Ok((name.to_owned(), batch))
}

fn share(field: &str, s: u32) -> Result<u32, MeasureError> {
    if (1..=100).contains(&s) {
        Ok(s)
    } else {
        Err(MeasureError::Plan(format!(
            "{field}: {s} is outside 1..=100"
        )))
    }
}

fn duration(field: &str, s: &Option<String>, default: Duration) -> Result<Duration, MeasureError> {
    match s {
        None => Ok(default),
        Some(s) => match humantime::parse_duration(s) {
            Ok(d) if !d.is_zero() && d <= Duration::from_secs(600) => Ok(d),
            Ok(_) => Err(MeasureError::Plan(format!(
                "{field}: {s} must be above 0 and at most 10m"
            ))),
            Err(e) => Err(MeasureError::Plan(format!(
                "{field}: {s:?} is not a duration ({e})"
            ))),
        },
    }
}

impl Plan {
    pub fn parse(text: &str, dir: &Path) -> Result<Plan, MeasureError> {
        let raw: RawPlan = serde_saphyr::from_str(text).map_err(|e| {
            let e = e.without_snippet();
            MeasureError::Plan(match e.location() {
                Some(l) => format!("line {}: {}", l.line(), first_line(&e.to_string())),
                None => first_line(&e.to_string()),
            })
        })?;
        if raw.worker.is_empty() || raw.worker[0].trim().is_empty() {
            return Err(MeasureError::Plan(
                "worker: the worker's command is required".into(),
            ));
        }
        let window = duration("window", &raw.window, Duration::from_millis(1500))?;
        let settle = duration("settle", &raw.settle, Duration::from_millis(300))?;
        let mut groups = Vec::new();
        if let Some(a) = raw.alone {
            let jobs = a
                .jobs
                .iter()
                .enumerate()
                .map(|(i, j)| job_ref(&format!("alone.jobs[{i}]"), j))
                .collect::<Result<Vec<_>, _>>()?;
            if jobs.is_empty() || a.shares.is_empty() {
                return Err(MeasureError::Plan(
                    "alone: needs at least one share and one job".into(),
                ));
            }
            for (i, s) in a.shares.iter().enumerate() {
                groups.push(Group {
                    mode: Mode::Alone,
                    shares: vec![share(&format!("alone.shares[{i}]"), *s)?],
                    runs: jobs.iter().map(|j| vec![j.clone()]).collect(),
                });
            }
        }
        if let Some(p) = raw.pairs {
            let mut pairs = Vec::new();
            for (i, [a, b]) in p.jobs.iter().enumerate() {
                pairs.push(vec![
                    job_ref(&format!("pairs.jobs[{i}][0]"), a)?,
                    job_ref(&format!("pairs.jobs[{i}][1]"), b)?,
                ]);
            }
            if pairs.is_empty() || p.splits.is_empty() {
                return Err(MeasureError::Plan(
                    "pairs: needs at least one split and one pair".into(),
                ));
            }
            for (i, [a, b]) in p.splits.iter().enumerate() {
                groups.push(Group {
                    mode: Mode::Pair,
                    shares: vec![
                        share(&format!("pairs.splits[{i}][0]"), *a)?,
                        share(&format!("pairs.splits[{i}][1]"), *b)?,
                    ],
                    runs: pairs.clone(),
                });
            }
        }
        if let Some(g) = raw.groups {
            groups.extend(parse_groups(&g)?);
        }
        if groups.is_empty() {
            return Err(MeasureError::Plan(
                "the plan measures nothing: give alone, pairs or groups".into(),
            ));
        }
        Ok(Plan {
            file: String::new(),
            worker: raw.worker,
            dir: dir.to_path_buf(),
            window,
            settle,
            groups,
        })
    }

    fn runs(&self) -> usize {
        self.groups.iter().map(|g| g.runs.len()).sum()
    }
}

/// The plan's `groups`: every group has as many jobs as every split has shares.
fn parse_groups(g: &RawGroups) -> Result<Vec<Group>, MeasureError> {
    if g.jobs.is_empty() || g.splits.is_empty() {
        return Err(MeasureError::Plan(
            "groups: needs at least one split and one group of jobs".into(),
        ));
    }
    let size = g.jobs[0].len();
    if !(3..=MAX_GROUP).contains(&size) {
        return Err(MeasureError::Plan(format!(
            "groups.jobs[0]: {size} jobs; a group has 3 to {MAX_GROUP} (two are pairs)"
        )));
    }
    let mut runs = Vec::new();
    for (i, jobs) in g.jobs.iter().enumerate() {
        if jobs.len() != size {
            return Err(MeasureError::Plan(format!(
                "groups.jobs[{i}]: {} jobs, but groups.jobs[0] has {size}: every group of a plan has as many",
                jobs.len()
            )));
        }
        runs.push(
            jobs.iter()
                .enumerate()
                .map(|(k, j)| job_ref(&format!("groups.jobs[{i}][{k}]"), j))
                .collect::<Result<Vec<_>, _>>()?,
        );
    }
    g.splits
        .iter()
        .enumerate()
        .map(|(i, split)| {
            if split.len() != size {
                return Err(MeasureError::Plan(format!(
                    "groups.splits[{i}]: {} shares for groups of {size} jobs",
                    split.len()
                )));
            }
            Ok(Group {
                mode: Mode::Group,
                shares: split
                    .iter()
                    .enumerate()
                    .map(|(k, s)| share(&format!("groups.splits[{i}][{k}]"), *s))
                    .collect::<Result<_, _>>()?,
                runs: runs.clone(),
            })
        })
        .collect()
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_owned()
}

/// The plan file, read and checked; relative paths in it are relative to it.
fn read_plan(path: &Path) -> Result<Plan, Failure> {
    let text = mmk_cli::input::read_capped_text(path, mmk_cli::input::MAX_DATA_BYTES)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", path.display())))?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let mut plan =
        Plan::parse(&text, &dir).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    plan.file = path.display().to_string();
    Ok(plan)
}

pub fn run(fmt: Format, args: MeasureArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let mut plan = read_plan(&args.plan)?;
    // The passes run on every job of the plan, alone at 100 %.
    let mut pass_jobs: Vec<(String, u32)> = Vec::new();
    for g in &plan.groups {
        for j in g.runs.iter().flatten() {
            if !pass_jobs.contains(j) {
                pass_jobs.push(j.clone());
            }
        }
    }
    let mut passes = Vec::new();
    if args.kernels || args.only == Some(Part::Kernels) {
        let interposer = crate::profile::interposer(args.interposer.as_deref())
            .map_err(|e| Failure::usage(format!("--kernels: {e}")))?;
        passes.push(kernels::Pass::Kernels { interposer });
    }
    if args.deep || args.only == Some(Part::Deep) {
        passes.push(kernels::Pass::Deep {
            ncu: args.ncu.clone(),
            launches: args.ncu_launches,
        });
    }
    match args.only {
        Some(Part::Alone) => plan.groups.retain(|g| g.mode == Mode::Alone),
        Some(Part::Pairs) => plan.groups.retain(|g| g.mode == Mode::Pair),
        Some(Part::Groups) => plan.groups.retain(|g| g.mode == Mode::Group),
        Some(Part::Kernels | Part::Deep) => plan.groups.clear(),
        None => {}
    }
    let exists = args.out.exists();
    if exists && !args.resume {
        return Err(Failure::usage(format!(
            "{} exists: give --resume to go on with it, or another -o",
            args.out.display()
        )));
    }
    let done = if exists {
        done_runs(&args.out).map_err(failure)?
    } else {
        Done::default()
    };
    if plan
        .groups
        .iter()
        .any(|g| g.shares.iter().any(|s| *s < 100))
        && std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").is_none()
        && !Path::new("/tmp/nvidia-mps").exists()
    {
        eprintln!(
            "mmk-lab: warning: no MPS control daemon found (CUDA_MPS_PIPE_DIRECTORY is unset and /tmp/nvidia-mps is missing): shares below 100 % have no effect without one"
        );
    }
    let monitor: Box<dyn Monitor> = if args.no_gpm {
        Box::new(NoMonitor {
            reason: "--no-gpm".into(),
        })
    } else {
        match NvmlMonitor::new(args.gpu) {
            Ok(m) => Box::new(m),
            Err(e) => {
                eprintln!("mmk-lab: warning: no GPM metrics ({e}); the runs give no dataset rows");
                Box::new(NoMonitor {
                    reason: e.to_string(),
                })
            }
        }
    };
    eprintln!(
        "measuring {} runs ({} already in {}), {} window each; workers log to {}",
        plan.runs(),
        done.runs.len(),
        args.out.display(),
        humantime::format_duration(plan.window),
        args.out.with_extension("workers.log").display()
    );
    let mut write_header = !exists;
    let mut s = sweep(
        &plan,
        monitor.as_ref(),
        &args.out,
        &done.runs,
        &mut write_header,
    )
    .map_err(failure)?;
    for pass in &passes {
        let done = match pass.mode() {
            Mode::Kernels => &done.kernels,
            _ => &done.deep,
        };
        eprintln!(
            "{}: {} jobs alone at 100 %, one worker each",
            pass.name(),
            pass_jobs.len()
        );
        let (measured, failed) = kernels::run_pass(
            &plan,
            pass,
            &pass_jobs,
            done,
            &args.out,
            &mut write_header,
            monitor.as_ref(),
        )
        .map_err(failure)?;
        s.planned += pass_jobs.len();
        s.measured += measured;
        s.failed += failed;
        s.kept += pass_jobs.len() - measured - failed;
    }
    s.seconds = started.elapsed().as_secs_f64();
    if let Some(csv) = &args.dataset {
        let (rows, skipped) = convert(std::slice::from_ref(&args.out), csv)
            .map_err(|e| Failure::usage(mmk_core::error::chain(&e)))?;
        for r in &skipped {
            eprintln!("no row: {r}");
        }
        s.dataset = Some(csv.display().to_string());
        s.rows = Some(rows);
    }
    match fmt {
        Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&s).unwrap_or_else(|e| e.to_string())
        ),
        Format::Table => {
            outln!(
                "{} runs measured, {} failed, {} kept from before, in {:.0} s: {}",
                s.measured,
                s.failed,
                s.kept,
                s.seconds,
                s.out
            );
            if let (Some(d), Some(r)) = (&s.dataset, s.rows) {
                outln!("{r} dataset rows: {d}");
            }
        }
    }
    if s.failed > 0 {
        return Err(Failure::usage(format!(
            "{} of {} runs failed (the output and the workers' log say why)",
            s.failed, s.planned
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
