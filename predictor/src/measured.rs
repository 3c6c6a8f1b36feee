//! Measurements from a GPU (`mmk-lab measure`, docs/measure.md) and how they become
//! dataset rows.
//!
//! `mmk-lab measure` writes one JSON object per line: a [`Header`], then one [`Run`] per
//! measured configuration (a job alone at an MPS share, or two jobs side by side at a
//! split of shares) or a [`Failed`] one. [`to_dataset`] turns them into the predictor's
//! rows:
//!
//! - the reference of each job is its run alone at 100 %: its throughput (iterations per
//!   second) is the denominator of `normalized_perf`, and its GPM metrics over that window
//!   are the job's demands (`job_sm_frac` = SM activity, `job_bw_frac` = DRAM bandwidth
//!   used, `occupancy_frac`, `dram_tput_frac`);
//! - a run alone at share S gives a row with no co-runners;
//! - a pair gives a row for each job, whose co-runner's demands are the co-runner's GPM
//!   metrics alone at its own share (interpolated between the shares measured);
//! - MIG is off on the measuring machine: every row has the whole GPU as its partition;
//! - a job's kernel-level columns (`occupancy_frac`, `ipc`, `l2_hit_frac`,
//!   `dram_tput_frac`) come from its [`Deep`] record (ncu, `mmk-lab measure --deep`) when
//!   there is one; otherwise occupancy and DRAM throughput come from its GPM reference and
//!   IPC and L2 hit rate are missing.
//!
//! [`Kernels`] records (the interposer's record mode, `mmk-lab measure --kernels`) describe
//! a job's kernels (count, busy fraction, SM demand, duration mix); rows do not use them.
//!
//! For an online job, normalized performance is latency alone / latency, and latency is
//! the time of one iteration (one batch served), so both classes use the same ratio of
//! iteration rates.

use std::collections::{BTreeMap, HashMap};

use mmk_core::JobClass;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::dataset::{Dataset, Row};
use crate::features::{Features, KernelFeatures};

/// The record format's version; a file of another version is refused.
pub const FORMAT_VERSION: u32 = 1;

/// The highest normalized performance the dataset takes (docs/predictor.md).
pub const MAX_PERF: f64 = 1.5;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    Header(Header),
    Run(Run),
    Failed(Failed),
    Kernels(Kernels),
    Deep(Deep),
}

/// What machine and software measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub version: u32,
    pub mmk_version: String,
    pub started_unix_s: u64,
    /// The plan file.
    pub plan: String,
    pub gpu: Option<GpuInfo>,
    /// Where the MPS control daemon's pipes are (`CUDA_MPS_PIPE_DIRECTORY`), if set.
    pub mps_pipe_directory: Option<String>,
    /// What the worker said of itself (`{"op": "info"}`): framework versions and so on.
    #[serde(default)]
    pub worker: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub driver: String,
    pub memory_bytes: u64,
    pub mig_enabled: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Alone,
    Pair,
    /// Three or more jobs side by side, one worker each (the plan's `groups`).
    Group,
    /// `--kernels` (only in `Failed` records: a measured one is a [`Kernels`] record).
    Kernels,
    /// `--deep` (only in `Failed` records: a measured one is a [`Deep`] record).
    Deep,
}

/// A job of a run: which workload at which batch, at which MPS share.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobRef {
    pub workload: String,
    pub batch: u32,
    pub share_pct: u32,
}

impl JobRef {
    /// The job whatever its share: (workload, batch).
    pub fn key(&self) -> (String, u32) {
        (self.workload.clone(), self.batch)
    }

    /// The name rows carry: `resnet50-inf-b32`.
    pub fn label(&self) -> String {
        format!("{}-b{}", self.workload, self.batch)
    }
}

/// What one job did in one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    #[serde(flatten)]
    pub job: JobRef,
    pub class: JobClass,
    /// Iterations that ended inside the window.
    pub iters: u32,
    pub mean_s: f64,
    pub p50_s: f64,
    pub p99_s: f64,
    /// The worker's own peak (PyTorch's reserved memory), if it said.
    pub mem_bytes: Option<u64>,
    /// GPU memory NVML saw the worker process use, if it could tell.
    pub process_mem_bytes: Option<u64>,
}

/// GPM metrics over a run's window, in percent (NVML's units).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Gpm {
    pub sm_util_pct: Option<f64>,
    pub sm_occupancy_pct: Option<f64>,
    pub dram_bw_util_pct: Option<f64>,
    pub any_tensor_util_pct: Option<f64>,
    pub fp32_util_pct: Option<f64>,
    pub fp16_util_pct: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub mode: Mode,
    pub window_s: f64,
    pub jobs: Vec<JobResult>,
    pub gpm: Option<Gpm>,
    /// Why there are no GPM metrics, when there are none.
    pub gpm_error: Option<String>,
}

impl Run {
    /// What identifies a run in a plan (for `--resume`).
    pub fn key(&self) -> (Mode, Vec<JobRef>) {
        (self.mode, self.jobs.iter().map(|j| j.job.clone()).collect())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failed {
    pub mode: Mode,
    pub jobs: Vec<JobRef>,
    pub error: String,
}

/// A job's kernels alone at 100 %, from the interposer's record mode over one window
/// (`mmk-lab measure --kernels`). Record mode times every launch with events, so the job
/// runs a little slower than in its [`Run`]s; these numbers describe its kernels, not
/// its speed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kernels {
    #[serde(flatten)]
    pub job: JobRef,
    pub window_s: f64,
    /// Iterations that ended inside the window.
    pub iters: u32,
    /// Launches inside the window (a graph launch counts once).
    pub launches: u64,
    /// Distinct kernels (by name) among them.
    pub distinct: u32,
    /// Launches whose run time was measured; the fractions below are over those.
    pub timed: u64,
    /// Share of the window in which at least one of the job's kernels ran.
    pub busy_frac: f64,
    /// SMs the job's kernels asked for (grid over blocks per SM), weighted by run time.
    pub sm_demand: f64,
    /// The GPU's SMs, when the worker said (`sms` in its `info`).
    pub gpu_sms: Option<u32>,
    /// Kernel run time, median and 90th percentile over launches, in microseconds.
    pub p50_us: f64,
    pub p90_us: f64,
    /// Share of the kernels' run time in kernels under 10 us, 10-100 us, 100 us-1 ms and
    /// 1 ms or more.
    pub time_by_duration: [f64; 4],
}

/// A job's top kernels alone at 100 %, measured by Nsight Compute (`mmk-lab measure
/// --deep`). Fractions are of the peak (0..1); the job's figures are averages weighted by
/// each kernel's run time over every kernel profiled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deep {
    #[serde(flatten)]
    pub job: JobRef,
    /// Launches ncu profiled (from the window's start, up to its launch count).
    pub profiled: u32,
    pub occupancy_frac: Option<f64>,
    pub ipc: Option<f64>,
    pub l2_hit_frac: Option<f64>,
    pub dram_tput_frac: Option<f64>,
    /// The kernels that took the most time, most first.
    pub top: Vec<DeepKernel>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeepKernel {
    pub name: String,
    pub launches: u32,
    /// Share of the profiled kernels' run time.
    pub time_frac: f64,
    pub occupancy_frac: Option<f64>,
    pub ipc: Option<f64>,
    pub l2_hit_frac: Option<f64>,
    pub dram_tput_frac: Option<f64>,
}

#[derive(Debug, Error)]
pub enum MeasuredError {
    #[error("line {line}: {message}")]
    Bad { line: usize, message: String },
    #[error("no runs: nothing was measured")]
    NoRuns,
}

/// Parses a measurement file (JSON lines). Blank lines are skipped; anything else that is
/// not a record of this format is refused with its line number.
pub fn parse(text: &str) -> Result<Vec<Record>, MeasuredError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Record = serde_json::from_str(line).map_err(|e| MeasuredError::Bad {
            line: i + 1,
            message: e.to_string(),
        })?;
        if let Record::Header(h) = &r
            && h.version != FORMAT_VERSION
        {
            return Err(MeasuredError::Bad {
                line: i + 1,
                message: format!(
                    "format version {} (this mmk reads version {FORMAT_VERSION})",
                    h.version
                ),
            });
        }
        let checked = match &r {
            Record::Run(run) => check_run(run),
            Record::Kernels(k) => check_kernels(k),
            Record::Deep(d) => check_deep(d),
            Record::Header(_) | Record::Failed(_) => Ok(()),
        };
        checked.map_err(|message| MeasuredError::Bad {
            line: i + 1,
            message,
        })?;
        out.push(r);
    }
    Ok(out)
}

fn check_run(run: &Run) -> Result<(), String> {
    let (fits, want) = match run.mode {
        Mode::Alone => (run.jobs.len() == 1, "1"),
        Mode::Pair => (run.jobs.len() == 2, "2"),
        Mode::Group => (run.jobs.len() >= 3, "3 or more"),
        Mode::Kernels | Mode::Deep => {
            return Err(format!(
                "a run cannot be of mode {:?}: those are kernels and deep records",
                run.mode
            ));
        }
    };
    if !fits {
        return Err(format!(
            "a {:?} run has {} jobs, not {want}",
            run.mode,
            run.jobs.len()
        ));
    }
    for j in &run.jobs {
        if !(1..=100).contains(&j.job.share_pct) {
            return Err(format!(
                "{}: share_pct {} is outside 1..=100",
                j.job.label(),
                j.job.share_pct
            ));
        }
        for (name, v) in [("mean_s", j.mean_s), ("p50_s", j.p50_s), ("p99_s", j.p99_s)] {
            if j.iters > 0 && !(v.is_finite() && v > 0.0) {
                return Err(format!(
                    "{}: {name} {v} is not a positive time",
                    j.job.label()
                ));
            }
        }
    }
    Ok(())
}

fn check_fracs<'a>(
    label: &str,
    fracs: impl IntoIterator<Item = (&'a str, Option<f64>)>,
) -> Result<(), String> {
    for (name, v) in fracs {
        if let Some(v) = v
            && !(0.0..=1.0).contains(&v)
        {
            return Err(format!("{label}: {name} {v} is outside 0..=1"));
        }
    }
    Ok(())
}

fn check_kernels(k: &Kernels) -> Result<(), String> {
    let label = k.job.label();
    check_fracs(
        &label,
        [("busy_frac", Some(k.busy_frac))].into_iter().chain(
            k.time_by_duration
                .iter()
                .map(|v| ("time_by_duration", Some(*v))),
        ),
    )?;
    for (name, v) in [
        ("sm_demand", k.sm_demand),
        ("p50_us", k.p50_us),
        ("p90_us", k.p90_us),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("{label}: {name} {v} is not a number of 0 or more"));
        }
    }
    Ok(())
}

fn check_deep(d: &Deep) -> Result<(), String> {
    let label = d.job.label();
    for (who, occ, ipc, l2, dram) in std::iter::once((
        label.clone(),
        d.occupancy_frac,
        d.ipc,
        d.l2_hit_frac,
        d.dram_tput_frac,
    ))
    .chain(d.top.iter().map(|k| {
        (
            format!("{label}: kernel {}", k.name),
            k.occupancy_frac,
            k.ipc,
            k.l2_hit_frac,
            k.dram_tput_frac,
        )
    })) {
        check_fracs(
            &who,
            [
                ("occupancy_frac", occ),
                ("l2_hit_frac", l2),
                ("dram_tput_frac", dram),
            ],
        )?;
        if let Some(v) = ipc
            && !(v.is_finite() && v >= 0.0)
        {
            return Err(format!("{who}: ipc {v} is not a number of 0 or more"));
        }
    }
    Ok(())
}

/// The rows, and a line for each run that gave none (and why).
#[derive(Debug, Default)]
pub struct Converted {
    pub dataset: Dataset,
    pub skipped: Vec<String>,
}

/// The runs among `records`; none is [`MeasuredError::NoRuns`].
pub(crate) fn runs_of(records: &[Record]) -> Result<Vec<&Run>, MeasuredError> {
    let runs: Vec<&Run> = records
        .iter()
        .filter_map(|r| match r {
            Record::Run(run) => Some(run),
            _ => None,
        })
        .collect();
    if runs.is_empty() {
        return Err(MeasuredError::NoRuns);
    }
    Ok(runs)
}

/// What a job uses alone at one share.
#[derive(Debug, Clone, Copy)]
struct Use {
    share: u32,
    sm: f64,
    bw: f64,
}

/// Turns runs into dataset rows (see the module's documentation). A run whose job has no
/// reference (alone at 100 % with GPM metrics), or that finished fewer than 2 iterations,
/// gives no row; the reason is in [`Converted::skipped`].
pub fn to_dataset(records: &[Record]) -> Result<Converted, MeasuredError> {
    let runs = runs_of(records)?;
    // A job is (workload, batch); its reference and its use at each share measured.
    type Key = (String, u32);
    let key = JobRef::key;
    let mut reference: HashMap<Key, (f64, Gpm)> = HashMap::new();
    let mut uses: HashMap<Key, Vec<Use>> = HashMap::new();
    for run in runs.iter().filter(|r| r.mode == Mode::Alone) {
        let j = &run.jobs[0];
        let (Some(gpm), true) = (run.gpm, j.iters >= 2) else {
            continue;
        };
        let (Some(sm), Some(bw)) = (gpm.sm_util_pct, gpm.dram_bw_util_pct) else {
            continue;
        };
        uses.entry(key(&j.job)).or_default().push(Use {
            share: j.job.share_pct,
            sm: sm / 100.0,
            bw: bw / 100.0,
        });
        if j.job.share_pct == 100 {
            // The last one measured wins (a later run of the same plan).
            reference.insert(key(&j.job), (j.mean_s, gpm));
        }
    }
    for u in uses.values_mut() {
        u.sort_by_key(|u| u.share);
    }
    // The last deep record of a job wins.
    let deep: HashMap<Key, &Deep> = records
        .iter()
        .filter_map(|r| match r {
            Record::Deep(d) => Some((key(&d.job), d)),
            _ => None,
        })
        .collect();

    let mut out = Converted::default();
    for run in &runs {
        for (i, j) in run.jobs.iter().enumerate() {
            let what = || {
                let with = run
                    .jobs
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| *k != i)
                    .map(|(_, o)| format!(" next to {} at {} %", o.job.label(), o.job.share_pct))
                    .collect::<String>();
                format!("{} at {} %{with}", j.job.label(), j.job.share_pct)
            };
            if j.iters < 2 {
                out.skipped
                    .push(format!("{}: {} iterations in the window", what(), j.iters));
                continue;
            }
            let Some((ref_mean, ref_gpm)) = reference.get(&key(&j.job)) else {
                out.skipped.push(format!(
                    "{}: no run of it alone at 100 % with GPM metrics",
                    what()
                ));
                continue;
            };
            let mut co_sm = 0.0;
            let mut co_bw = 0.0;
            let mut co_missing = None;
            for (_, o) in run.jobs.iter().enumerate().filter(|(k, _)| *k != i) {
                match uses.get(&key(&o.job)) {
                    Some(u) => {
                        let (sm, bw) = at_share(u, o.job.share_pct);
                        co_sm += sm;
                        co_bw += bw;
                    }
                    None => co_missing = Some(o.job.label()),
                }
            }
            if let Some(o) = co_missing {
                out.skipped.push(format!(
                    "{}: its co-runner {o} was never measured alone with GPM metrics",
                    what()
                ));
                continue;
            }
            let perf = ref_mean / j.mean_s;
            if !(perf > 0.0 && perf <= MAX_PERF) {
                out.skipped.push(format!(
                    "{}: normalized performance {perf:.3} is outside (0, {MAX_PERF}]",
                    what()
                ));
                continue;
            }
            let frac = |v: Option<f64>| v.map(|p| (p / 100.0).clamp(0.0, 1.0));
            let kernel = match deep.get(&key(&j.job)) {
                Some(d) => KernelFeatures {
                    occupancy_frac: d.occupancy_frac.or(frac(ref_gpm.sm_occupancy_pct)),
                    ipc: d.ipc,
                    l2_hit_frac: d.l2_hit_frac,
                    dram_tput_frac: d.dram_tput_frac.or(frac(ref_gpm.dram_bw_util_pct)),
                },
                None => KernelFeatures {
                    occupancy_frac: frac(ref_gpm.sm_occupancy_pct),
                    ipc: None,
                    l2_hit_frac: None,
                    dram_tput_frac: frac(ref_gpm.dram_bw_util_pct),
                },
            };
            out.dataset.rows.push(Row {
                workload: j.job.label(),
                features: Features {
                    class: j.class,
                    mps_share_pct: f64::from(j.job.share_pct),
                    partition_sm_frac: 1.0,
                    partition_mem_frac: 1.0,
                    job_sm_frac: frac(ref_gpm.sm_util_pct).unwrap_or(0.0),
                    job_bw_frac: frac(ref_gpm.dram_bw_util_pct).unwrap_or(0.0),
                    job_l2_frac: None,
                    co_runners: (run.jobs.len() - 1) as u32,
                    // Summed over the co-runners: a crowd asks for more than the GPU.
                    co_sm_frac: co_sm.clamp(0.0, 64.0),
                    co_bw_frac: co_bw.clamp(0.0, 64.0),
                    co_l2_frac: None,
                    kernel,
                },
                normalized_perf: perf,
            });
        }
    }
    Ok(out)
}

/// A job's SM and bandwidth use at `share`, linear between the two shares measured around
/// it (the nearest one outside the range measured).
fn at_share(uses: &[Use], share: u32) -> (f64, f64) {
    let first = uses[0];
    let last = uses[uses.len() - 1];
    if share <= first.share {
        return (first.sm, first.bw);
    }
    if share >= last.share {
        return (last.sm, last.bw);
    }
    for w in uses.windows(2) {
        let (a, b) = (w[0], w[1]);
        if share >= a.share && share <= b.share {
            if a.share == b.share {
                return (a.sm, a.bw);
            }
            let t = f64::from(share - a.share) / f64::from(b.share - a.share);
            return (a.sm + t * (b.sm - a.sm), a.bw + t * (b.bw - a.bw));
        }
    }
    (last.sm, last.bw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(w: &str, share: u32, class: JobClass, mean_s: f64) -> JobResult {
        JobResult {
            job: JobRef {
                workload: w.into(),
                batch: 32,
                share_pct: share,
            },
            class,
            iters: 20,
            mean_s,
            p50_s: mean_s,
            p99_s: mean_s * 1.1,
            mem_bytes: Some(1 << 30),
            process_mem_bytes: None,
        }
    }

    fn gpm(sm: f64, bw: f64) -> Option<Gpm> {
        Some(Gpm {
            sm_util_pct: Some(sm),
            sm_occupancy_pct: Some(40.0),
            dram_bw_util_pct: Some(bw),
            ..Gpm::default()
        })
    }

    fn alone(w: &str, share: u32, class: JobClass, mean_s: f64, sm: f64, bw: f64) -> Record {
        Record::Run(Run {
            mode: Mode::Alone,
            window_s: 1.5,
            jobs: vec![job(w, share, class, mean_s)],
            gpm: gpm(sm, bw),
            gpm_error: None,
        })
    }

    /// A crowd's co-runners ask for more SMs together than the GPU has: the row says so,
    /// as the planner's features do (`Features::of`), rather than cutting it at the GPU.
    #[test]
    fn a_crowds_demand_is_summed_past_the_gpu() {
        use JobClass::*;
        let recs = [
            alone("resnet50-inf", 100, Online, 0.010, 90.0, 40.0),
            alone("bert-train", 100, Offline, 0.030, 95.0, 50.0),
            alone("vit-train", 100, Offline, 0.040, 80.0, 30.0),
            Record::Run(Run {
                mode: Mode::Group,
                window_s: 1.5,
                jobs: vec![
                    job("resnet50-inf", 100, Online, 0.040),
                    job("bert-train", 100, Offline, 0.060),
                    job("vit-train", 100, Offline, 0.080),
                ],
                gpm: None,
                gpm_error: None,
            }),
        ];
        let c = to_dataset(&recs).unwrap();
        assert!(c.skipped.is_empty(), "{:?}", c.skipped);
        let r = c
            .dataset
            .rows
            .iter()
            .find(|r| r.workload == "resnet50-inf-b32" && r.features.co_runners == 2)
            .expect("the service's row in the crowd");
        assert!(
            (r.features.co_sm_frac - 1.75).abs() < 1e-9,
            "{}",
            r.features.co_sm_frac
        );
        assert!((r.normalized_perf - 0.25).abs() < 1e-9);
        // The CSV the predictor reads back keeps it.
        let back = Dataset::parse(&c.dataset.to_csv()).unwrap();
        assert!(
            back.rows
                .iter()
                .any(|r| (r.features.co_sm_frac - 1.75).abs() < 1e-9)
        );
    }

    #[test]
    fn alone_and_pair_runs_become_rows_against_the_job_alone_at_100() {
        use JobClass::*;
        let recs = [
            alone("resnet50-inf", 100, Online, 0.010, 90.0, 40.0),
            alone("resnet50-inf", 40, Online, 0.020, 40.0, 20.0),
            alone("bert-train", 100, Offline, 0.030, 95.0, 50.0),
            alone("bert-train", 20, Offline, 0.090, 20.0, 10.0),
            alone("bert-train", 60, Offline, 0.045, 60.0, 30.0),
            Record::Run(Run {
                mode: Mode::Pair,
                window_s: 1.5,
                jobs: vec![
                    job("resnet50-inf", 40, Online, 0.025),
                    job("bert-train", 60, Offline, 0.060),
                ],
                gpm: None,
                gpm_error: Some("not supported".into()),
            }),
        ];
        let text: String = recs
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        let back = parse(&text).unwrap();
        assert_eq!(back.len(), recs.len());
        let c = to_dataset(&back).unwrap();
        assert!(c.skipped.is_empty(), "{:?}", c.skipped);
        assert_eq!(c.dataset.rows.len(), 7);
        let r = &c.dataset.rows[1];
        assert_eq!(r.workload, "resnet50-inf-b32");
        assert_eq!(r.features.mps_share_pct, 40.0);
        assert!((r.normalized_perf - 0.5).abs() < 1e-9);
        assert!((r.features.job_sm_frac - 0.9).abs() < 1e-9);
        assert_eq!(r.features.co_runners, 0);
        assert_eq!(r.features.kernel.occupancy_frac, Some(0.4));
        // The online job in the pair: its co-runner BERT at 60 % (measured at 60 %).
        let r = &c.dataset.rows[5];
        assert_eq!(r.features.co_runners, 1);
        assert!((r.features.co_sm_frac - 0.6).abs() < 1e-9);
        assert!((r.features.co_bw_frac - 0.3).abs() < 1e-9);
        assert!((r.normalized_perf - 0.4).abs() < 1e-9);
        // BERT next to ResNet-50 at 40 %, measured alone at 40 %.
        let r = &c.dataset.rows[6];
        assert!((r.features.co_sm_frac - 0.4).abs() < 1e-9);
        assert!((r.normalized_perf - 0.5).abs() < 1e-9);
        // The CSV the predictor reads back.
        let csv = c.dataset.to_csv();
        assert_eq!(Dataset::parse(&csv).unwrap().rows.len(), 7);
    }

    #[test]
    fn a_co_runners_use_is_interpolated_between_the_shares_measured() {
        let u = [
            Use {
                share: 20,
                sm: 0.2,
                bw: 0.1,
            },
            Use {
                share: 60,
                sm: 0.6,
                bw: 0.5,
            },
        ];
        let (sm, bw) = at_share(&u, 50);
        assert!((sm - 0.5).abs() < 1e-9 && (bw - 0.4).abs() < 1e-9);
        assert_eq!(at_share(&u, 10), (0.2, 0.1));
        assert_eq!(at_share(&u, 100), (0.6, 0.5));
    }

    #[test]
    fn runs_without_a_reference_or_iterations_are_skipped_with_the_reason() {
        use JobClass::*;
        let mut few = alone("vgg16-inf", 40, Online, 0.5, 40.0, 20.0);
        if let Record::Run(r) = &mut few {
            r.jobs[0].iters = 1;
        }
        let recs = vec![
            alone("vgg16-inf", 100, Online, 0.01, 80.0, 30.0),
            few,
            alone("mobilenet-inf", 50, Online, 0.01, 40.0, 20.0),
        ];
        let c = to_dataset(&recs).unwrap();
        assert_eq!(c.dataset.rows.len(), 1);
        assert_eq!(
            c.skipped,
            [
                "vgg16-inf-b32 at 40 %: 1 iterations in the window",
                "mobilenet-inf-b32 at 50 %: no run of it alone at 100 % with GPM metrics"
            ]
        );
    }

    #[test]
    fn a_deep_record_fills_the_kernel_columns_and_bad_ones_are_refused() {
        use JobClass::*;
        let deep = Deep {
            job: JobRef {
                workload: "vgg16-inf".into(),
                batch: 32,
                share_pct: 100,
            },
            profiled: 200,
            occupancy_frac: Some(0.6),
            ipc: Some(1.5),
            l2_hit_frac: Some(0.7),
            dram_tput_frac: None,
            top: Vec::new(),
        };
        let recs = [
            alone("vgg16-inf", 100, Online, 0.01, 80.0, 30.0),
            alone("vgg16-inf", 50, Online, 0.02, 50.0, 20.0),
            alone("resnet18-inf", 100, Online, 0.01, 80.0, 30.0),
            Record::Deep(deep.clone()),
        ];
        let text: String = recs
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        let c = to_dataset(&parse(&text).unwrap()).unwrap();
        let k = |i: usize| c.dataset.rows[i].features.kernel;
        for i in [0, 1] {
            assert_eq!(k(i).ipc, Some(1.5));
            assert_eq!(k(i).l2_hit_frac, Some(0.7));
            assert_eq!(k(i).occupancy_frac, Some(0.6));
            // ncu gave no DRAM figure: GPM's stands.
            assert_eq!(k(i).dram_tput_frac, Some(0.3));
        }
        // A job without a deep record keeps GPM's columns and no IPC.
        assert_eq!(k(2).ipc, None);
        assert_eq!(k(2).occupancy_frac, Some(0.4));

        let mut bad = deep;
        bad.l2_hit_frac = Some(70.0);
        let e = parse(&serde_json::to_string(&Record::Deep(bad)).unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 1: vgg16-inf-b32: l2_hit_frac 70 is outside 0..=1"
        );
        let run = Record::Run(Run {
            mode: Mode::Deep,
            window_s: 1.0,
            jobs: Vec::new(),
            gpm: None,
            gpm_error: None,
        });
        let e = parse(&serde_json::to_string(&run).unwrap()).unwrap_err();
        assert!(e.to_string().contains("cannot be of mode Deep"), "{e}");
    }

    #[test]
    fn bad_files_name_the_line() {
        let e = parse("\n{\"kind\":\"run\"}\n").unwrap_err();
        assert!(e.to_string().starts_with("line 2: missing field"), "{e}");
        let mut r = alone("a", 100, JobClass::Online, 0.01, 1.0, 1.0);
        if let Record::Run(run) = &mut r {
            run.jobs[0].job.share_pct = 0;
        }
        let e = parse(&serde_json::to_string(&r).unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 1: a-b32: share_pct 0 is outside 1..=100"
        );
        let h = Record::Header(Header {
            version: 9,
            mmk_version: "x".into(),
            started_unix_s: 0,
            plan: "p".into(),
            gpu: None,
            mps_pipe_directory: None,
            worker: BTreeMap::new(),
        });
        let e = parse(&serde_json::to_string(&h).unwrap()).unwrap_err();
        assert!(e.to_string().contains("format version 9"), "{e}");
        assert!(matches!(to_dataset(&[h]), Err(MeasuredError::NoRuns)));
    }
}
