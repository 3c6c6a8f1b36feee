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

// ---------------------------------------------------------------------------------------
// The GPU's side: GPM metrics over a window, and a process's memory.

/// What mmk-lab reads from the GPU while workers run.
pub trait Monitor {
    fn gpu(&self) -> Option<GpuInfo>;
    /// Waits until `end_ns` (CLOCK_MONOTONIC) and returns the GPM metrics between
    /// `start_ns` and `end_ns`.
    fn window(&self, start_ns: u64, end_ns: u64) -> Result<Gpm, MeasureError>;
    /// GPU memory a process uses, if the driver tells.
    fn process_memory(&self, pid: u32) -> Option<u64>;
}

fn sleep_until(ns: u64) {
    let now = monotonic_ns();
    if ns > now {
        std::thread::sleep(Duration::from_nanos(ns - now));
    }
}

/// No GPU metrics (`--no-gpm`, or NVML could not start): windows only wait.
#[derive(Debug)]
pub struct NoMonitor {
    pub reason: String,
}

impl Monitor for NoMonitor {
    fn gpu(&self) -> Option<GpuInfo> {
        None
    }
    fn window(&self, _start_ns: u64, end_ns: u64) -> Result<Gpm, MeasureError> {
        sleep_until(end_ns);
        Err(MeasureError::NoGpm(self.reason.clone()))
    }
    fn process_memory(&self, _pid: u32) -> Option<u64> {
        None
    }
}

/// NVML: GPM samples at the window's two ends (Hopper and newer).
pub struct NvmlMonitor {
    nvml: nvml_wrapper::Nvml,
    index: u32,
}

impl std::fmt::Debug for NvmlMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlMonitor")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl NvmlMonitor {
    pub fn new(index: u32) -> Result<NvmlMonitor, MeasureError> {
        let nvml = nvml_wrapper::Nvml::init().map_err(nvml_error("init"))?;
        nvml.device_by_index(index)
            .map_err(nvml_error(format!("GPU {index}")))?;
        Ok(NvmlMonitor { nvml, index })
    }
}

impl Monitor for NvmlMonitor {
    fn gpu(&self) -> Option<GpuInfo> {
        let d = self.nvml.device_by_index(self.index).ok()?;
        Some(GpuInfo {
            index: self.index,
            name: d.name().unwrap_or_default(),
            driver: self.nvml.sys_driver_version().unwrap_or_default(),
            memory_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
            mig_enabled: d.mig_mode().ok().map(|m| m.current == 1),
        })
    }

    fn window(&self, start_ns: u64, end_ns: u64) -> Result<Gpm, MeasureError> {
        use nvml_wrapper::enums::gpm::GpmMetricId as M;
        let d = self
            .nvml
            .device_by_index(self.index)
            .map_err(nvml_error(format!("GPU {}", self.index)))?;
        sleep_until(start_ns);
        let first = d.gpm_sample();
        sleep_until(end_ns);
        let second = d.gpm_sample();
        let (first, second) = (
            first.map_err(nvml_error("GPM sample"))?,
            second.map_err(nvml_error("GPM sample"))?,
        );
        let ids = [
            M::SmUtil,
            M::SmOccupancy,
            M::DramBwUtil,
            M::AnyTensorUtil,
            M::Fp32Util,
            M::Fp16Util,
        ];
        let got = nvml_wrapper::gpm::gpm_metrics_get(&self.nvml, &first, &second, &ids)
            .map_err(nvml_error("GPM metrics"))?;
        let v = |i: usize| {
            got.get(i)
                .and_then(|r| r.as_ref().ok())
                .map(|m| m.value)
                .filter(|v| v.is_finite())
        };
        Ok(Gpm {
            sm_util_pct: v(0),
            sm_occupancy_pct: v(1),
            dram_bw_util_pct: v(2),
            any_tensor_util_pct: v(3),
            fp32_util_pct: v(4),
            fp16_util_pct: v(5),
        })
    }

    fn process_memory(&self, pid: u32) -> Option<u64> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let d = self.nvml.device_by_index(self.index).ok()?;
        d.running_compute_processes()
            .ok()?
            .into_iter()
            .find(|p| p.pid == pid)
            .and_then(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            })
    }
}

// ---------------------------------------------------------------------------------------
// Workers.

/// How long a worker may take to build and warm a workload, and past a window's end.
const PREPARE_TIMEOUT: Duration = Duration::from_secs(300);
const MEASURE_GRACE: Duration = Duration::from_secs(120);
/// A worker's start (importing its framework) and its answer to `info`.
const INFO_TIMEOUT: Duration = Duration::from_secs(120);

struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    share: u32,
}

/// How a worker is started beyond the plan's command: a program in front of it (ncu) and
/// its environment.
#[derive(Debug, Clone, Default)]
struct Launch {
    prefix: Vec<OsString>,
    env: Vec<(String, String)>,
    env_remove: Vec<String>,
}

impl Worker {
    fn spawn(plan: &Plan, share: u32, log: &Path) -> Result<Worker, MeasureError> {
        Worker::spawn_with(plan, share, log, &Launch::default())
    }

    fn spawn_with(
        plan: &Plan,
        share: u32,
        log: &Path,
        how: &Launch,
    ) -> Result<Worker, MeasureError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| MeasureError::Io {
                op: "open",
                path: log.to_path_buf(),
                source,
            })?;
        let mut argv: Vec<OsString> = how.prefix.clone();
        argv.extend(plan.worker.iter().map(OsString::from));
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        for k in &how.env_remove {
            cmd.env_remove(k);
        }
        let mut child = cmd
            .envs(how.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&plan.dir)
            .env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", share.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                MeasureError::Worker(format!("cannot start the worker {:?}: {e}", argv[0]))
            })?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, o),
            _ => {
                return Err(MeasureError::Worker(
                    "the worker's pipes were not made".into(),
                ));
            }
        };
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A profiler in front of the worker (ncu's `==PROF==`) speaks too.
                if line.starts_with("==") {
                    eprintln!("{line}");
                    continue;
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Worker {
            child,
            stdin,
            lines,
            share,
        })
    }

    fn send(&mut self, req: &Value) -> Result<(), MeasureError> {
        writeln!(self.stdin, "{req}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| {
                MeasureError::Worker(format!("the worker at {} % is gone ({e})", self.share))
            })
    }

    fn reply(&mut self, timeout: Duration) -> Result<Map<String, Value>, MeasureError> {
        let line = match self.lines.recv_timeout(timeout) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => {
                return Err(MeasureError::Worker(format!(
                    "the worker at {} % did not answer within {}",
                    self.share,
                    humantime::format_duration(timeout)
                )));
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.try_wait().ok().flatten();
                return Err(MeasureError::Worker(format!(
                    "the worker at {} % exited{} (its log says why)",
                    self.share,
                    status.map(|s| format!(" ({s})")).unwrap_or_default()
                )));
            }
        };
        let v: Value = serde_json::from_str(&line).map_err(|e| {
            MeasureError::Worker(format!(
                "the worker at {} % answered {:?}, not JSON ({e})",
                self.share,
                truncate(&line)
            ))
        })?;
        let Value::Object(m) = v else {
            return Err(MeasureError::Worker(format!(
                "the worker at {} % answered {}, not an object",
                self.share,
                truncate(&line)
            )));
        };
        if m.get("ok") == Some(&Value::Bool(true)) {
            Ok(m)
        } else {
            Err(MeasureError::Worker(
                m.get("error")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("the worker answered {}", truncate(&line))),
            ))
        }
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(200).collect()
}

/// One worker's iterations ([end, seconds] each) as a job result.
fn job_result(
    job: JobRef,
    class: JobClass,
    reply: &Map<String, Value>,
) -> Result<JobResult, MeasureError> {
    let iters = reply
        .get("iters")
        .and_then(Value::as_array)
        .ok_or_else(|| MeasureError::Worker("the measure reply has no iters list".into()))?;
    let mut d: Vec<f64> = Vec::with_capacity(iters.len());
    for it in iters {
        let secs = it
            .as_array()
            .and_then(|a| a.get(1))
            .and_then(Value::as_f64)
            .filter(|s| s.is_finite() && *s > 0.0)
            .ok_or_else(|| {
                MeasureError::Worker(format!(
                    "iters: {} is not [END, SECONDS]",
                    truncate(&it.to_string())
                ))
            })?;
        d.push(secs);
    }
    d.sort_by(f64::total_cmp);
    let mean = if d.is_empty() {
        0.0
    } else {
        d.iter().sum::<f64>() / d.len() as f64
    };
    Ok(JobResult {
        job,
        class,
        iters: d.len() as u32,
        mean_s: mean,
        p50_s: quantile(&d, 0.5),
        p99_s: quantile(&d, 0.99),
        mem_bytes: None,
        process_mem_bytes: None,
    })
}

fn class_of(reply: &Map<String, Value>) -> Result<JobClass, MeasureError> {
    match reply.get("class").and_then(Value::as_str) {
        Some("online") => Ok(JobClass::Online),
        Some("offline") => Ok(JobClass::Offline),
        other => Err(MeasureError::Worker(format!(
            "the prepare reply's class is {other:?}, not online or offline"
        ))),
    }
}

// ---------------------------------------------------------------------------------------
// The sweep.

/// What a sweep did.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub out: String,
    pub planned: usize,
    pub measured: usize,
    pub failed: usize,
    pub kept: usize,
    pub seconds: f64,
    pub dataset: Option<String>,
    pub rows: Option<usize>,
}

/// Measures every run of `plan` not already in `done`, appending records to `out`.
pub fn sweep(
    plan: &Plan,
    monitor: &dyn Monitor,
    out: &Path,
    done: &HashSet<(Mode, Vec<JobRef>)>,
    write_header: &mut bool,
) -> Result<Summary, MeasureError> {
    let started = Instant::now();
    let log = out.with_extension("workers.log");
    let mut append = appender(out)?;
    let mut s = Summary {
        out: out.display().to_string(),
        planned: plan.runs(),
        ..Summary::default()
    };
    let total = s.planned;
    let mut n = 0;
    for g in &plan.groups {
        let todo: Vec<&Vec<(String, u32)>> = g
            .runs
            .iter()
            .filter(|r| !done.contains(&(g.mode, g.refs(r))))
            .collect();
        n += g.runs.len() - todo.len();
        s.kept += g.runs.len() - todo.len();
        if todo.is_empty() {
            continue;
        }
        let mut workers: Vec<Worker> = Vec::new();
        for run in todo {
            n += 1;
            let refs = g.refs(run);
            // A worker that died (out of memory, a crash) is started again.
            if workers.len() != g.shares.len() || !workers.iter_mut().all(Worker::alive) {
                workers.clear();
                for sh in &g.shares {
                    workers.push(Worker::spawn(plan, *sh, &log)?);
                }
                if *write_header {
                    *write_header = false;
                    let info = match info(&mut workers[0]) {
                        Ok(info) => info,
                        Err(e) => {
                            // No answer to keep in step with: start it again.
                            eprintln!("mmk-lab: warning: the worker did not say what it is: {e}");
                            workers[0] = Worker::spawn(plan, g.shares[0], &log)?;
                            BTreeMap::new()
                        }
                    };
                    append(&Record::Header(header(plan, monitor, info)))?;
                }
            }
            let label = refs
                .iter()
                .map(|r| format!("{} @ {} %", r.label(), r.share_pct))
                .collect::<Vec<_>>()
                .join(" + ");
            match measure_run(plan, g, run, &refs, &mut workers, monitor) {
                Ok(r) => {
                    eprintln!("[{n:>4}/{total}] {}", progress(&r, &label));
                    append(&Record::Run(r))?;
                    s.measured += 1;
                }
                Err(error) => {
                    // A worker may still owe a reply (its partner failed first, or it
                    // answered too late): start the group's workers afresh.
                    workers.clear();
                    eprintln!("[{n:>4}/{total}] {label}: failed: {error}");
                    append(&Record::Failed(Failed {
                        mode: g.mode,
                        jobs: refs,
                        error: error.to_string(),
                    }))?;
                    s.failed += 1;
                }
            }
            if g.mode == Mode::Alone {
                // Each workload is measured once per share: free it. A worker that does
                // not answer is started again before the next run.
                let dropped = workers.iter_mut().all(|w| {
                    w.send(&json!({"op": "drop"})).is_ok() && w.reply(PREPARE_TIMEOUT).is_ok()
                });
                if !dropped {
                    workers.clear();
                }
            }
        }
    }
    s.seconds = started.elapsed().as_secs_f64();
    Ok(s)
}

/// Appends records to `out`, each synced to disk before the next run.
fn appender(out: &Path) -> Result<impl FnMut(&Record) -> Result<(), MeasureError>, MeasureError> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .map_err(|source| MeasureError::Io {
            op: "open",
            path: out.to_path_buf(),
            source,
        })?;
    let out = out.to_path_buf();
    Ok(move |r: &Record| -> Result<(), MeasureError> {
        let line = serde_json::to_string(r).map_err(MeasureError::Json)?;
        writeln!(file, "{line}")
            .and_then(|()| file.sync_data())
            .map_err(|source| MeasureError::Io {
                op: "write",
                path: out.clone(),
                source,
            })
    })
}

/// What the worker says of itself (`{"op": "info"}`).
fn info(w: &mut Worker) -> Result<BTreeMap<String, String>, MeasureError> {
    w.send(&json!({"op": "info"}))?;
    Ok(w.reply(INFO_TIMEOUT)?
        .into_iter()
        .filter(|(k, _)| k != "ok")
        .map(|(k, v)| {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            (k, v)
        })
        .collect())
}

fn header(plan: &Plan, monitor: &dyn Monitor, worker: BTreeMap<String, String>) -> Header {
    Header {
        version: FORMAT_VERSION,
        mmk_version: env!("CARGO_PKG_VERSION").to_owned(),
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        plan: plan.file.clone(),
        gpu: monitor.gpu(),
        mps_pipe_directory: std::env::var("CUDA_MPS_PIPE_DIRECTORY").ok(),
        worker,
    }
}

fn measure_run(
    plan: &Plan,
    g: &Group,
    run: &[(String, u32)],
    refs: &[JobRef],
    workers: &mut [Worker],
    monitor: &dyn Monitor,
) -> Result<Run, MeasureError> {
    // Build and warm every job first; then all measure over the same window.
    for (w, (name, batch)) in workers.iter_mut().zip(run) {
        w.send(&json!({"op": "prepare", "workload": name, "batch": batch}))?;
    }
    let mut prepared = Vec::new();
    for (w, r) in workers.iter_mut().zip(refs) {
        let m = w
            .reply(PREPARE_TIMEOUT)
            .map_err(|e| e.in_job(format!("{}: prepare", r.label())))?;
        let class = class_of(&m).map_err(|e| e.in_job(r.label()))?;
        prepared.push((class, m.get("mem_bytes").and_then(Value::as_u64)));
    }
    let start = monotonic_ns() + plan.settle.as_nanos() as u64;
    let end = start + plan.window.as_nanos() as u64;
    for (w, (name, batch)) in workers.iter_mut().zip(run) {
        w.send(&json!({
            "op": "measure", "workload": name, "batch": batch,
            "start": start as f64 / 1e9, "end": end as f64 / 1e9,
        }))?;
    }
    let gpm = monitor.window(start, end);
    let mut jobs = Vec::new();
    for ((w, r), (class, mem)) in workers.iter_mut().zip(refs).zip(prepared) {
        let m = w
            .reply(MEASURE_GRACE)
            .map_err(|e| e.in_job(format!("{}: measure", r.label())))?;
        let mut j = job_result(r.clone(), class, &m).map_err(|e| e.in_job(r.label()))?;
        j.mem_bytes = mem;
        j.process_mem_bytes = monitor.process_memory(w.child.id());
        jobs.push(j);
    }
    let (gpm, gpm_error) = match gpm {
        Ok(g) => (Some(g), None),
        Err(e) => (None, Some(e.to_string())),
    };
    Ok(Run {
        mode: g.mode,
        window_s: plan.window.as_secs_f64(),
        jobs,
        gpm,
        gpm_error,
    })
}

fn progress(r: &Run, label: &str) -> String {
    let speeds = r
        .jobs
        .iter()
        .map(|j| format!("{:.2} ms/it ({} it)", j.mean_s * 1e3, j.iters))
        .collect::<Vec<_>>()
        .join(", ");
    let gpm = match (&r.gpm, &r.gpm_error) {
        (Some(g), _) => format!(
            "  sm {:.0} %  dram {:.0} %",
            g.sm_util_pct.unwrap_or(f64::NAN),
            g.dram_bw_util_pct.unwrap_or(f64::NAN)
        ),
        (None, Some(e)) => format!("  (no GPM metrics: {e})"),
        (None, None) => String::new(),
    };
    format!("{label}: {speeds}{gpm}")
}

/// What a measurement file already holds: its runs, and the jobs with kernels and deep
/// records.
#[derive(Debug, Default)]
struct Done {
    runs: HashSet<(Mode, Vec<JobRef>)>,
    kernels: HashSet<JobRef>,
    deep: HashSet<JobRef>,
}

fn done_runs(path: &Path) -> Result<Done, MeasureError> {
    let text = mmk_cli::input::read_capped_text(path, mmk_cli::input::MAX_DATA_BYTES).map_err(
        |source| MeasureError::Input {
            path: path.to_path_buf(),
            source,
        },
    )?;
    let recs = measured::parse(&text).map_err(|source| MeasureError::Records {
        path: path.to_path_buf(),
        source,
    })?;
    let mut done = Done::default();
    for r in recs {
        match r {
            Record::Run(run) => {
                done.runs.insert(run.key());
            }
            Record::Kernels(k) => {
                done.kernels.insert(k.job);
            }
            Record::Deep(d) => {
                done.deep.insert(d.job);
            }
            Record::Header(_) | Record::Failed(_) => {}
        }
    }
    Ok(done)
}

/// Why measurement files did not become a dataset.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: mmk_cli::input::InputError,
    },
    #[error("{path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: measured::MeasuredError,
    },
    #[error("the measurements")]
    Rows(#[source] measured::MeasuredError),
    #[error("no run gave a row ({skipped} skipped; the first: {first})")]
    NoRows { skipped: usize, first: String },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Converts measurement files into the predictor's CSV; returns the rows written and the
/// runs that gave none.
pub fn convert(inputs: &[PathBuf], out: &Path) -> Result<(usize, Vec<String>), ConvertError> {
    let mut recs = Vec::new();
    for p in inputs {
        let text = mmk_cli::input::read_capped_text(p.as_ref(), mmk_cli::input::MAX_DATA_BYTES)
            .map_err(|source| ConvertError::Read {
                path: p.clone(),
                source,
            })?;
        recs.extend(
            measured::parse(&text).map_err(|source| ConvertError::Parse {
                path: p.clone(),
                source,
            })?,
        );
    }
    let c = measured::to_dataset(&recs).map_err(ConvertError::Rows)?;
    if c.dataset.rows.is_empty() {
        return Err(ConvertError::NoRows {
            skipped: c.skipped.len(),
            first: c.skipped.first().cloned().unwrap_or_default(),
        });
    }
    let tmp = out.with_extension("csv.tmp");
    std::fs::write(&tmp, c.dataset.to_csv())
        .and_then(|()| std::fs::rename(&tmp, out))
        .map_err(|source| ConvertError::Write {
            path: out.to_owned(),
            source,
        })?;
    Ok((c.dataset.rows.len(), c.skipped))
}

pub fn run(fmt: Format, args: MeasureArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let text = mmk_cli::input::read_capped_text(args.plan.as_ref(), mmk_cli::input::MAX_DATA_BYTES)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", args.plan.display())))?;
    let dir = args
        .plan
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let mut plan = Plan::parse(&text, &dir)
        .map_err(|e| Failure::usage(format!("{}: {e}", args.plan.display())))?;
    plan.file = args.plan.display().to_string();
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
mod tests {
    use super::*;

    #[test]
    fn a_plan_is_grouped_by_share_and_bad_fields_are_named() {
        let p = Plan::parse(
            "worker: [python3, workloads.py, worker]\nwindow: 2s\nalone:\n  shares: [20, 100]\n  jobs: [resnet50-inf/32, bert-train/8]\npairs:\n  splits: [[60, 40]]\n  jobs: [[resnet50-inf/32, bert-train/8]]\n",
            Path::new("/x"),
        )
        .unwrap();
        assert_eq!(p.window, Duration::from_secs(2));
        assert_eq!(p.groups.len(), 3);
        assert_eq!(p.runs(), 5);
        assert_eq!(p.groups[2].shares, [60, 40]);
        assert_eq!(
            p.groups[2].refs(&p.groups[2].runs[0])[1],
            JobRef {
                workload: "bert-train".into(),
                batch: 8,
                share_pct: 40
            }
        );
        let bad = |t: &str| match Plan::parse(t, Path::new("/x")) {
            Err(MeasureError::Plan(why)) => why,
            other => panic!("not a plan error: {other:?}"),
        };
        assert_eq!(
            bad("worker: [w]\nalone:\n  shares: [10]\n  jobs: [a/1, b]\n"),
            "alone.jobs[1]: \"b\" is not NAME/BATCH (for example resnet50-inf/32)"
        );
        assert_eq!(
            bad("worker: [w]\nalone:\n  shares: [10, 0]\n  jobs: [a/1]\n"),
            "alone.shares[1]: 0 is outside 1..=100"
        );
        assert_eq!(
            bad("worker: [w]\npairs:\n  splits: [[50, 150]]\n  jobs: [[a/1, b/2]]\n"),
            "pairs.splits[0][1]: 150 is outside 1..=100"
        );
        assert_eq!(
            bad("worker: [w]\n"),
            "the plan measures nothing: give alone, pairs or groups"
        );
        assert_eq!(
            bad("worker: [w]\nwindow: 0s\nalone:\n  shares: [10]\n  jobs: [a/1]\n"),
            "window: 0s must be above 0 and at most 10m"
        );
        assert!(
            bad("worker: [w]\nwindo: 1s\n").starts_with("line 2:"),
            "{}",
            bad("worker: [w]\nwindo: 1s\n")
        );
    }

    /// A fake worker in sh: an iteration takes 1 / share seconds (10 ms at 100 %), twice
    /// as long next to a co-runner is not modelled; `boom/1` fails to prepare.
    const FAKE: &str = r#"
share=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
ms=$((1000 / share))
while read -r line; do
  case "$line" in
    *'"op":"info"'*) echo '{"ok":true,"torch":"fake 1.0"}' ;;
    *'"op":"prepare"'*'"workload":"boom"'*) echo '{"ok":false,"error":"KeyError: unknown workload boom"}' ;;
    *'"op":"prepare"'*) echo '{"ok":true,"class":"offline","mem_bytes":1000}' ;;
    *'"op":"measure"'*) printf '{"ok":true,"iters":[[1,0.%03d],[2,0.%03d],[3,0.%03d]]}\n' $ms $ms $ms ;;
    *'"op":"drop"'*) echo '{"ok":true}' ;;
    *'"op":"quit"'*) exit 0 ;;
  esac
done
"#;

    struct FakeGpm;
    impl Monitor for FakeGpm {
        fn gpu(&self) -> Option<GpuInfo> {
            None
        }
        fn window(&self, _s: u64, end_ns: u64) -> Result<Gpm, MeasureError> {
            sleep_until(end_ns);
            Ok(Gpm {
                sm_util_pct: Some(50.0),
                dram_bw_util_pct: Some(20.0),
                ..Gpm::default()
            })
        }
        fn process_memory(&self, _pid: u32) -> Option<u64> {
            Some(7)
        }
    }

    #[test]
    fn a_sweep_records_every_run_keeps_going_past_failures_and_resumes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fake.sh"), FAKE).unwrap();
        let plan = Plan::parse(
            "worker: [sh, fake.sh]\nwindow: 20ms\nsettle: 1ms\nalone:\n  shares: [50, 100]\n  jobs: [a/1, boom/1]\npairs:\n  splits: [[100, 50]]\n  jobs: [[boom/1, a/1], [a/1, a/1]]\n",
            dir.path(),
        )
        .unwrap();
        let out = dir.path().join("raw.jsonl");
        let s = sweep(&plan, &FakeGpm, &out, &HashSet::new(), &mut true).unwrap();
        // The pair after a failed one is measured right: no reply of the failed run is
        // left over to be taken for one of its own.
        assert_eq!((s.planned, s.measured, s.failed), (6, 3, 3));
        let recs = measured::parse(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let Record::Header(h) = &recs[0] else {
            panic!("{:?}", recs[0])
        };
        assert_eq!(h.worker["torch"], "fake 1.0");
        let runs: Vec<&Run> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Run(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(runs.len(), 3);
        // 20 ms an iteration at 50 %, 10 ms at 100 %.
        assert!((runs[0].jobs[0].mean_s - 0.020).abs() < 1e-9);
        assert!((runs[1].jobs[0].mean_s - 0.010).abs() < 1e-9);
        assert_eq!(runs[1].jobs[0].process_mem_bytes, Some(7));
        assert_eq!(runs[2].jobs.len(), 2);
        assert!(recs.iter().any(|r| matches!(r, Record::Failed(f)
            if f.error == "boom-b1: prepare: KeyError: unknown workload boom")));
        // The rows: a at 50 % runs at half speed.
        let c = measured::to_dataset(&recs).unwrap();
        assert_eq!(c.dataset.rows.len(), 4);
        assert!((c.dataset.rows[0].normalized_perf - 0.5).abs() < 1e-9);
        // Resuming measures only the failed runs again.
        let done = done_runs(&out).unwrap();
        let s = sweep(&plan, &FakeGpm, &out, &done.runs, &mut false).unwrap();
        assert_eq!((s.kept, s.measured, s.failed), (3, 0, 3));
    }

    #[test]
    fn groups_run_one_worker_per_share_and_their_bad_fields_are_named() {
        let p = Plan::parse(
            "worker: [w]\ngroups:\n  splits: [[100, 100, 100], [40, 30, 30]]\n  jobs:\n    - [resnet50-inf/32, bert-train/8, vgg19-train/32]\n    - [vgg16-inf/32, bert-train/8, resnet152-train/16]\n",
            Path::new("/x"),
        )
        .unwrap();
        assert_eq!(p.groups.len(), 2);
        assert_eq!(p.runs(), 4);
        assert!(p.groups.iter().all(|g| g.mode == Mode::Group));
        assert_eq!(p.groups[1].shares, [40, 30, 30]);
        assert_eq!(
            p.groups[1].refs(&p.groups[1].runs[1])[2],
            JobRef {
                workload: "resnet152-train".into(),
                batch: 16,
                share_pct: 30
            }
        );
        let bad = |t: &str| match Plan::parse(t, Path::new("/x")) {
            Err(MeasureError::Plan(why)) => why,
            other => panic!("not a plan error: {other:?}"),
        };
        assert_eq!(
            bad("worker: [w]\ngroups:\n  splits: [[50, 50]]\n  jobs: [[a/1, b/2]]\n"),
            "groups.jobs[0]: 2 jobs; a group has 3 to 8 (two are pairs)"
        );
        assert_eq!(
            bad(
                "worker: [w]\ngroups:\n  splits: [[50, 50, 50]]\n  jobs: [[a/1, b/2, c/3], [a/1, b/2]]\n"
            ),
            "groups.jobs[1]: 2 jobs, but groups.jobs[0] has 3: every group of a plan has as many"
        );
        assert_eq!(
            bad(
                "worker: [w]\ngroups:\n  splits: [[50, 50, 50], [50, 50]]\n  jobs: [[a/1, b/2, c/3]]\n"
            ),
            "groups.splits[1]: 2 shares for groups of 3 jobs"
        );
        assert_eq!(
            bad("worker: [w]\ngroups:\n  splits: [[50, 0, 50]]\n  jobs: [[a/1, b/2, c/3]]\n"),
            "groups.splits[0][1]: 0 is outside 1..=100"
        );
        assert_eq!(
            bad("worker: [w]\ngroups:\n  splits: [[50, 50, 50]]\n  jobs: [[a/1, b, c/3]]\n"),
            "groups.jobs[0][1]: \"b\" is not NAME/BATCH (for example resnet50-inf/32)"
        );
    }

    #[test]
    fn a_group_run_measures_every_job_over_one_window() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fake.sh"), FAKE).unwrap();
        let plan = Plan::parse(
            "worker: [sh, fake.sh]\nwindow: 20ms\nsettle: 1ms\nalone:\n  shares: [100]\n  jobs: [a/1, b/1, c/1]\ngroups:\n  splits: [[50, 25, 25]]\n  jobs: [[a/1, b/1, c/1]]\n",
            dir.path(),
        )
        .unwrap();
        let out = dir.path().join("raw.jsonl");
        let s = sweep(&plan, &FakeGpm, &out, &HashSet::new(), &mut true).unwrap();
        assert_eq!((s.planned, s.measured, s.failed), (4, 4, 0));
        let recs = measured::parse(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let Some(Record::Run(g)) = recs.last() else {
            panic!("{:?}", recs.last())
        };
        assert_eq!(g.mode, Mode::Group);
        // 20 ms an iteration at 50 %, 40 ms at 25 %.
        let means: Vec<f64> = g.jobs.iter().map(|j| j.mean_s).collect();
        assert_eq!(means, [0.020, 0.040, 0.040]);
        // Each job of the group is a row with its two co-runners.
        let c = measured::to_dataset(&recs).unwrap();
        assert_eq!(c.dataset.rows.len(), 6);
        assert!((c.dataset.rows[5].normalized_perf - 0.25).abs() < 1e-9);
        // Resuming knows the group run.
        let done = done_runs(&out).unwrap();
        let s = sweep(&plan, &FakeGpm, &out, &done.runs, &mut false).unwrap();
        assert_eq!((s.kept, s.measured), (4, 0));
    }

    #[test]
    fn a_worker_that_dies_fails_its_run_and_is_started_again() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("die.sh"),
            "read -r line; echo '{\"ok\":true}'; read -r line; exit 3\n",
        )
        .unwrap();
        let plan = Plan::parse(
            "worker: [sh, die.sh]\nwindow: 10ms\nalone:\n  shares: [100]\n  jobs: [a/1, b/1]\n",
            dir.path(),
        )
        .unwrap();
        let out = dir.path().join("raw.jsonl");
        let s = sweep(
            &plan,
            &NoMonitor {
                reason: "none".into(),
            },
            &out,
            &HashSet::new(),
            &mut true,
        )
        .unwrap();
        assert_eq!((s.measured, s.failed), (0, 2));
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.contains("exited"), "{text}");
    }
}
