//! An experiment of `mmk-lab simulate`: the ground truth and the planners' model it runs
//! on, the policies it runs on a trace, and its report (each policy's figures, and
//! relative to Default and MIGER; over a sweep, the spread over seeds). mmkctl parses
//! the arguments, reads the files a user names and prints; this is the rest.

use std::collections::HashMap;
use std::sync::Arc;

use mmk_core::workload;
use mmk_partitioner::{JobProfile, PerfModel, planner_with};
use mmk_predictor::truth::MeasuredTruth;
use mmk_predictor::{ModelError, Predictor, TrainOptions, groundtruth};
use serde::Serialize;

use crate::kernel::{KernelEffect, WithKernelSched};
use crate::report::{Summary, change_pct};
use crate::{RunResult, SimConfig, SimError, Trace, simulate};

/// Why an experiment could not run.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("the shipped H200 measurements")]
    Measurements(#[source] mmk_predictor::truth::TruthError),
    #[error("the shipped co-location rounds")]
    Rounds(#[source] crate::kernel::KernelEffectError),
    #[error("training the planners' forest")]
    Train(#[source] ModelError),
    #[error("unknown policy {0}")]
    UnknownPolicy(String),
    #[error("{label}the reference schedule")]
    Reference {
        label: String,
        #[source]
        source: crate::reference::ReferenceError,
    },
    #[error("{label}{policy}")]
    Simulate {
        label: String,
        policy: String,
        #[source]
        source: SimError,
    },
}

/// MMK's planner on its kernel scheduler's effect (`--kernel-sched`); the policy `mmk` is
/// the same planner on the ground truth every baseline runs on.
pub const KERNEL_SCHED_POLICY: &str = "mmk-ks";

/// The planner a policy runs: its own name, but for [`KERNEL_SCHED_POLICY`] (MMK's).
pub fn planner_of(policy: &str) -> &str {
    if policy == KERNEL_SCHED_POLICY {
        "mmk"
    } else {
        policy
    }
}

/// The policy name of the reference schedule ([`crate::reference`]), which runs beside the
/// planners on small traces.
pub const REFERENCE_POLICY: &str = "reference";

/// The reference schedule of a class that keeps online jobs from waiting
/// ([`crate::reference::ReferenceOptions::prompt_online`]).
pub const PROMPT_REFERENCE_POLICY: &str = "reference-prompt";

/// Whether `policy` is one of the reference searches.
pub fn is_reference(policy: &str) -> bool {
    policy == REFERENCE_POLICY || policy == PROMPT_REFERENCE_POLICY
}

/// One policy's run of a trace, and the wall time it took; for the reference, what its
/// search came to.
#[derive(Debug)]
pub struct PolicyRun {
    pub run: RunResult,
    pub seconds: f64,
    pub search: Option<SearchNote>,
}

/// What the reference's search came to (the reference row of a report).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SearchNote {
    /// The search ended: the schedule is the best of its class.
    pub exact: bool,
    pub nodes: u64,
    /// No schedule of the class has a smaller average JCT.
    pub lower_bound_avg_jct_s: f64,
}

/// How fast jobs run, and the planners' model of it.
#[derive(Debug)]
pub struct World {
    pub model: Arc<dyn PerfModel>,
    pub truth: Arc<dyn PerfModel>,
}

/// The planners' forest for a world whose jobs run as `truth` says: trained on 1,400 rows
/// generated from it (seed 99), for the workloads `jobs` as the planners see them.
pub fn train_forest(
    truth: &dyn PerfModel,
    jobs: &[(String, JobProfile)],
) -> Result<Predictor, ExperimentError> {
    let rows = groundtruth::generate_with(truth, jobs, 1400, 99);
    Predictor::train(&rows, &TrainOptions::standard(99)).map_err(ExperimentError::Train)
}

/// MMK's world: its jobs, the workloads `jobs` as they carry them ([`planners_jobs`]), run
/// under the kernel scheduler (`effect`) over `truth`.
pub fn with_kernel_sched(
    truth: Arc<dyn PerfModel>,
    effect: KernelEffect,
    jobs: &[(String, JobProfile)],
) -> Arc<dyn PerfModel> {
    Arc::new(WithKernelSched::new(truth, effect, jobs))
}

/// Where a run of [`run_policies`] is: a step of a policy's simulation (jobs done of
/// all), or a policy done (its wall time).
#[derive(Debug)]
pub enum Progress<'a> {
    Step {
        policy: &'a str,
        done: usize,
        total: usize,
    },
    Done {
        policy: &'a str,
        jobs: usize,
        seconds: f64,
    },
}

/// The reference schedule of `t` on `cfg`'s node, jobs running as `truth` says.
fn reference_run(
    t: &Trace,
    cfg: &SimConfig,
    truth: &dyn PerfModel,
    policy: &str,
    label: &str,
) -> Result<(RunResult, SearchNote), ExperimentError> {
    let opts = crate::reference::ReferenceOptions {
        prompt_online: policy == PROMPT_REFERENCE_POLICY,
        ..crate::reference::ReferenceOptions::default()
    };
    let mut r = crate::reference::solve(t, cfg, truth, &opts).map_err(|source| {
        ExperimentError::Reference {
            label: label.to_owned(),
            source,
        }
    })?;
    r.run.policy = policy.to_owned();
    let note = SearchNote {
        exact: r.exact,
        nodes: r.nodes,
        lower_bound_avg_jct_s: r.lower_bound_avg_jct_s(),
    };
    Ok((r.run, note))
}

/// Simulates `t` under each policy; each run's result and wall time. The policy that runs
/// the kernel scheduler runs in `scheduled` when given, the others in `plain`; the
/// reference searches in `plain` (it knows the truth, and runs no kernel scheduler).
/// `label` prefixes errors (a sweep's interval and seed). `offline_share_max` caps the
/// offline jobs' MPS shares in the planners that choose them (100: no cap).
#[allow(clippy::too_many_arguments)]
pub fn run_policies(
    t: &Trace,
    cfg: &SimConfig,
    policies: &[String],
    plain: &World,
    scheduled: Option<&World>,
    offline_share_max: u8,
    label: &str,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Vec<PolicyRun>, ExperimentError> {
    let mut runs = Vec::new();
    for name in policies {
        if is_reference(name) {
            let started = std::time::Instant::now();
            let (run, note) = reference_run(t, cfg, plain.truth.as_ref(), name, label)?;
            let seconds = started.elapsed().as_secs_f64();
            progress(Progress::Done {
                policy: name,
                jobs: run.jobs.len(),
                seconds,
            });
            runs.push(PolicyRun {
                run,
                seconds,
                search: Some(note),
            });
            continue;
        }
        let world = match scheduled {
            Some(w) if name == KERNEL_SCHED_POLICY => w,
            _ => plain,
        };
        let p = planner_with(planner_of(name), world.model.clone(), offline_share_max)
            .ok_or_else(|| ExperimentError::UnknownPolicy(name.clone()))?;
        let started = std::time::Instant::now();
        let mut r = simulate(
            t,
            cfg,
            p.as_ref(),
            world.truth.as_ref(),
            &mut |done, total| {
                progress(Progress::Step {
                    policy: name,
                    done,
                    total,
                })
            },
        )
        .map_err(|source| ExperimentError::Simulate {
            label: label.to_owned(),
            policy: name.clone(),
            source,
        })?;
        let seconds = started.elapsed().as_secs_f64();
        r.policy.clone_from(name);
        progress(Progress::Done {
            policy: name,
            jobs: r.jobs.len(),
            seconds,
        });
        runs.push(PolicyRun {
            run: r,
            seconds,
            search: None,
        });
    }
    Ok(runs)
}

/// The workloads of the table as the planners see them: their profile in `profiles` (the
/// measured truth's), else the table's nominal one.
pub fn planners_jobs(profiles: &HashMap<&'static str, JobProfile>) -> Vec<(String, JobProfile)> {
    workload::WORKLOADS
        .iter()
        .map(|w| {
            let p = profiles
                .get(w.name)
                .copied()
                .unwrap_or_else(|| JobProfile::of_workload(w, w.class()));
            (w.name.to_owned(), p)
        })
        .collect()
}

/// One policy's run: its summary, its figures relative to Default and MIGER (when they
/// ran), and the wall time the simulation took.
#[derive(Debug, Serialize)]
pub struct PolicyReport {
    #[serde(flatten)]
    pub summary: Summary,
    pub jct_vs_default_pct: Option<f64>,
    pub jct_vs_miger_pct: Option<f64>,
    pub makespan_vs_miger_pct: Option<f64>,
    pub stp_vs_miger_pct: Option<f64>,
    /// Average JCT against the reference schedule's, when it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jct_vs_reference_pct: Option<f64>,
    /// The reference's row: what its search came to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchNote>,
    pub seconds: f64,
}

/// Lowest, mean and highest of one figure over a sweep's seeds.
#[derive(Debug, Serialize)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(v: &[f64]) -> Option<Spread> {
        if v.is_empty() {
            return None;
        }
        Some(Spread {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }
}

/// One policy at one arrival interval, over the seeds.
#[derive(Debug, Serialize)]
pub struct SweepRow {
    pub interval_s: f64,
    pub policy: String,
    pub runs: usize,
    pub avg_jct_s: Spread,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jct_vs_miger_pct: Option<Spread>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub makespan_vs_miger_pct: Option<Spread>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stp_vs_miger_pct: Option<Spread>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo_miss_pct: Option<Spread>,
    /// The share of the jobs' run time beside a job of the other class, in percent.
    pub mixed_pct: Spread,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jct_vs_reference_pct: Option<Spread>,
    /// The reference's row: the lower bound on its class's average JCT, and in how many
    /// runs its search was exact.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lower_bound_avg_jct_s: Option<Spread>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact_runs: Option<usize>,
}

/// One trace of a sweep (an interval and a seed) under every policy.
#[derive(Debug, Serialize)]
pub struct SweepRun {
    pub interval_s: f64,
    pub seed: u64,
    pub policies: Vec<PolicyReport>,
}

/// What every report says of the setup it ran on.
#[derive(Debug, Serialize)]
pub struct Setup {
    pub gpus: u32,
    pub gpu_model: String,
    pub model: String,
    pub ground_truth: &'static str,
    /// Workloads the measured ground truth does not have (they get the analytic model).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unmeasured: Vec<&'static str>,
    /// What the kernel scheduler does under MMK; none with `--kernel-sched off`.
    pub kernel_sched: Option<KernelEffect>,
    /// The most MPS share (%) an offline job gets from MMK and MIGER (100: no cap).
    pub offline_share_max: u8,
    /// A generated trace's share of checkpointable offline jobs (a replayed trace says
    /// per job).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpointable: Option<f64>,
    /// How often checkpointable jobs checkpoint; none: a move loses no work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_every_s: Option<f64>,
    /// A generated trace's lognormal duration sigma; none: uniform durations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_sigma: Option<f64>,
    /// A generated trace's mean burst size; none: Poisson arrivals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<f64>,
}

/// A sweep over arrival intervals and seeds.
#[derive(Debug, Serialize)]
pub struct SweepReport {
    pub jobs_per_run: usize,
    #[serde(flatten)]
    pub setup: Setup,
    pub seeds: Vec<u64>,
    pub intervals_s: Vec<f64>,
    pub rows: Vec<SweepRow>,
    pub runs: Vec<SweepRun>,
}

/// One trace under every policy.
#[derive(Debug, Serialize)]
pub struct Report {
    pub jobs: usize,
    #[serde(flatten)]
    pub setup: Setup,
    pub policies: Vec<PolicyReport>,
}

/// Each policy's summary with its figures relative to Default, to MIGER and to the
/// reference (when they ran).
pub fn relative(runs: &[PolicyRun]) -> Vec<PolicyReport> {
    let sums: Vec<(Summary, f64, Option<SearchNote>)> = runs
        .iter()
        .map(|r| (Summary::of(&r.run), r.seconds, r.search))
        .collect();
    let base = |policy: &str| {
        sums.iter()
            .find(|(s, ..)| s.policy == policy)
            .map(|(s, ..)| s.clone())
    };
    // Against `reference`, or `reference-prompt` where only it ran.
    let (default, miger) = (base("default"), base("miger"));
    let reference = base(REFERENCE_POLICY).or_else(|| base(PROMPT_REFERENCE_POLICY));
    sums.into_iter()
        .map(|(s, seconds, search)| PolicyReport {
            jct_vs_reference_pct: reference
                .as_ref()
                .map(|r| change_pct(s.avg_jct_s, r.avg_jct_s)),
            search,
            jct_vs_default_pct: default
                .as_ref()
                .map(|d| change_pct(s.avg_jct_s, d.avg_jct_s)),
            jct_vs_miger_pct: miger.as_ref().map(|m| change_pct(s.avg_jct_s, m.avg_jct_s)),
            makespan_vs_miger_pct: miger
                .as_ref()
                .map(|m| change_pct(s.makespan_s, m.makespan_s)),
            stp_vs_miger_pct: miger.as_ref().map(|m| change_pct(s.stp, m.stp)),
            summary: s,
            seconds,
        })
        .collect()
}

/// Per interval and policy, the spread over the seeds.
pub fn sweep_rows(intervals: &[f64], policies: &[String], runs: &[SweepRun]) -> Vec<SweepRow> {
    let mut rows = Vec::new();
    for &interval in intervals {
        for policy in policies {
            let reports: Vec<&PolicyReport> = runs
                .iter()
                .filter(|r| r.interval_s == interval)
                .flat_map(|r| r.policies.iter().filter(|p| &p.summary.policy == policy))
                .collect();
            let of = |f: &dyn Fn(&PolicyReport) -> Option<f64>| {
                let v: Vec<f64> = reports.iter().filter_map(|p| f(p)).collect();
                Spread::of(&v)
            };
            let (Some(avg_jct_s), Some(mixed_pct)) = (
                of(&|p| Some(p.summary.avg_jct_s)),
                of(&|p| Some(p.summary.mixed_pct)),
            ) else {
                continue;
            };
            rows.push(SweepRow {
                interval_s: interval,
                policy: policy.clone(),
                runs: reports.len(),
                avg_jct_s,
                jct_vs_miger_pct: of(&|p| p.jct_vs_miger_pct),
                makespan_vs_miger_pct: of(&|p| p.makespan_vs_miger_pct),
                stp_vs_miger_pct: of(&|p| p.stp_vs_miger_pct),
                slo_miss_pct: of(&|p| p.summary.slo_miss_pct),
                mixed_pct,
                jct_vs_reference_pct: of(&|p| p.jct_vs_reference_pct),
                lower_bound_avg_jct_s: of(&|p| p.search.map(|s| s.lower_bound_avg_jct_s)),
                exact_runs: is_reference(policy).then(|| {
                    reports
                        .iter()
                        .filter(|p| p.search.is_some_and(|s| s.exact))
                        .count()
                }),
            });
        }
    }
    rows
}

/// The measurements shipped in data/gpu/h200-2026-11-21 as the ground truth, and each
/// workload of the table as the planners see it there: the measured job of the same
/// model and phase at the batch nearest the workload's default batch.
pub fn measured_truth()
-> Result<(MeasuredTruth, HashMap<&'static str, JobProfile>), ExperimentError> {
    const ALONE: &str = include_str!("../../../data/gpu/h200-2026-11-21/raw-alone.jsonl");
    const PAIRS: &str = include_str!("../../../data/gpu/h200-2026-11-21/raw-pairs.jsonl");
    let truth = MeasuredTruth::from_texts([ALONE, PAIRS]).map_err(ExperimentError::Measurements)?;
    let mut profiles = HashMap::new();
    for w in workload::WORKLOADS {
        let stem = w.measured_name();
        let batch = w.default_batch();
        if let Some(j) = truth
            .jobs()
            .iter()
            .filter(|j| j.workload == stem)
            .min_by_key(|j| j.batch.abs_diff(batch))
        {
            profiles.insert(w.name, j.profile);
        }
    }
    Ok((truth, profiles))
}

/// The kernel scheduler's effect under mmkd's defaults with the SLO control off
/// (`mmk-noslo`) against plain MPS, per pairing of a graph-replaying service at a quarter
/// of its capacity with a training (docs/results.md, "The kernel scheduler's effect per
/// pairing"): a ResNet-50 service beside BERT training (two calls on an H100,
/// lab/data/kernel-sched/h100-2026-11-28, and one on an H200), beside ResNet-152 training,
/// and the transformer services, a BERT service and a decoder, beside each (H200,
/// lab/data/kernel-sched/h200-2026-11-28 and h200-2026-11-29; each call counts once).
pub fn measured_kernel_effect() -> Result<KernelEffect, ExperimentError> {
    use crate::kernel::Family::{Convolutional as Conv, Transformer};
    macro_rules! h200 {
        ($pair:literal) => {
            h200!("2026-11-28", $pair)
        };
        ($day:literal, $pair:literal) => {
            (
                concat!("h200-", $pair),
                include_str!(concat!(
                    "../../data/kernel-sched/h200-",
                    $day,
                    "/",
                    $pair,
                    ".rounds.json"
                )),
            )
        };
    }
    let resnet_bert = [
        (
            "h100-call-1",
            include_str!("../../data/kernel-sched/h100-2026-11-28/call-1.rounds.json"),
        ),
        (
            "h100-call-2",
            include_str!("../../data/kernel-sched/h100-2026-11-28/call-2.rounds.json"),
        ),
        h200!("resnet50-bert"),
    ];
    let resnet_resnet = [h200!("resnet50-resnet152")];
    let bert_bert = [
        h200!("bert-bert"),
        h200!("2026-11-29", "decoder-bert-call-1"),
        h200!("2026-11-29", "decoder-bert-call-2"),
    ];
    let bert_resnet = [
        h200!("bert-resnet152"),
        h200!("2026-11-29", "decoder-resnet152"),
    ];
    KernelEffect::by_pairing(
        &[
            (Conv, Transformer, &resnet_bert),
            (Conv, Conv, &resnet_resnet),
            (Transformer, Transformer, &bert_bert),
            (Transformer, Conv, &bert_resnet),
        ],
        "mmk-noslo",
    )
    .map_err(ExperimentError::Rounds)
}

/// The kernel scheduler's effect in the co-location rounds measured on the H200
/// (docs/results.md, "A graph-replaying service beside BERT training"), shipped in
/// lab/data/kernel-sched/h200-2026-11-21: the graph-replaying ResNet-50 service beside
/// BERT training on plain MPS, `mmk` with a 1,500 us base and the offline depth cap of 8
/// (not mmkd's defaults), in every call that ran that configuration.
pub fn h200_depth8_kernel_effect() -> Result<KernelEffect, ExperimentError> {
    macro_rules! rounds {
        ($($run:literal),*) => {
            [$((
                concat!("h200-", $run),
                include_str!(concat!("../../data/kernel-sched/h200-2026-11-21/", $run, ".rounds.json")),
            )),*]
        };
    }
    let files = rounds!("depth-2", "depth-3", "depth-4", "ab-1", "ab-2", "slice-2");
    KernelEffect::from_rounds(&files, "ksfull-mmk-cprio-base1500-depth8")
        .map_err(ExperimentError::Rounds)
}
