//! How close the model comes with each source of a job's profile.
//!
//! The planner asks the model about a job from its profile, its SM and bandwidth demand
//! ([`JobProfile`]), and that profile comes from one of three places: the workload table,
//! for a job that names a workload (`named`); what mmkd learned of the job
//! ([`JobProfile::learned`]: its SM demand from its own launches, and its DRAM bandwidth
//! from NVML GPM while it ran alone, `learned-bw`, or without GPM the prior's scaled,
//! `learned`); or nothing (the class's `prior`). This
//! asks the model the planner's question for every measured configuration of a
//! measurement file (each job alone at its share, and each job of a pair or group beside
//! the others at theirs, on the whole GPU) with the jobs' profiles from each source, and
//! compares the answers with what was measured. `gpm`, the demands GPM measured with the
//! job alone (what the model was trained on), is the reference.
//!
//! The learned profile of a job is read from its [`Kernels`] record (the interposer's
//! record mode, alone at 100 %): the SMs its kernels asked for while they ran, as a
//! fraction of the GPU (at most 1), times the share of the time they ran. That is what
//! mmkd's sampler averages (the demand of the kernels in flight, idle time counted as 0),
//! measured by timing each kernel rather than by sampling the gate. Its measured
//! bandwidth (`learned-bw`) is GPM's with the job alone at 100 %, which is what mmkd reads
//! while a job runs alone in its partition.

use std::collections::{BTreeSet, HashMap};

use mmk_core::JobClass;
use mmk_core::workload;
use mmk_partitioner::{CoRunner, JobProfile, PartitionShape, PerfModel};
use serde::Serialize;

use crate::eval::Errors;
use crate::measured::{JobResult, MAX_PERF, MeasuredError, Mode, Record, runs_of};

/// Where a job's profile comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    Named,
    Learned,
    LearnedBw,
    Prior,
    Gpm,
}

impl Source {
    pub const ALL: [Source; 5] = [
        Source::Named,
        Source::Learned,
        Source::LearnedBw,
        Source::Prior,
        Source::Gpm,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Named => "named",
            Source::Learned => "learned",
            Source::LearnedBw => "learned-bw",
            Source::Prior => "prior",
            Source::Gpm => "gpm",
        }
    }
}

/// The model's errors with one source's profiles.
#[derive(Debug, Clone, Serialize)]
pub struct SourceScore {
    pub source: Source,
    pub overall: Errors,
    pub online: Errors,
    pub offline: Errors,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// In the order of [`Source::ALL`].
    pub scores: Vec<SourceScore>,
    /// The jobs asked about, `resnet50-inf-b32`.
    pub jobs: Vec<String>,
    /// Jobs, and configurations, left out, and why.
    pub left_out: Vec<String>,
}

/// A job's profile from each source, in the order of [`Source::ALL`].
type Profiles = [JobProfile; 5];

/// Asks `model` about every measured configuration of `records` with each source's
/// profiles (see the module docs). Only jobs that every source knows are asked about:
/// each needs a run alone at 100 % with GPM metrics, a [`Kernels`] record and a workload
/// of the table; a configuration with a job that lacks one is left out, and said so.
pub fn compare(records: &[Record], model: &dyn PerfModel) -> Result<Comparison, MeasuredError> {
    let runs = runs_of(records)?;
    type Key = (String, u32);
    let key = |j: &JobResult| j.job.key();
    let label = |k: &Key| format!("{}-b{}", k.0, k.1);
    // Each job's class, its time per iteration alone at 100 % and its GPM demands then
    // (the last run wins, as in the dataset).
    let mut class: HashMap<Key, JobClass> = HashMap::new();
    let mut reference: HashMap<Key, (f64, JobProfile)> = HashMap::new();
    for run in &runs {
        for j in &run.jobs {
            class.insert(key(j), j.class);
        }
        let [j] = run.jobs.as_slice() else {
            continue;
        };
        let gpm = run
            .gpm
            .and_then(|g| Some((g.sm_util_pct?, g.dram_bw_util_pct?)));
        if run.mode != Mode::Alone || j.job.share_pct != 100 || j.iters < 2 {
            continue;
        }
        if let Some((sm, bw)) = gpm {
            let profile = JobProfile {
                class: j.class,
                sm_demand: (sm / 100.0).clamp(0.01, 1.0),
                bw_demand: (bw / 100.0).clamp(0.0, 1.0),
                solo_latency_ms: None,
            };
            reference.insert(key(j), (j.mean_s, profile));
        }
    }
    let kernels: HashMap<Key, f64> = records
        .iter()
        .filter_map(|r| match r {
            Record::Kernels(k) => {
                let sms = f64::from(k.gpu_sms?.max(1));
                Some((k.job.key(), (k.sm_demand / sms).min(1.0) * k.busy_frac))
            }
            _ => None,
        })
        .collect();

    let mut left_out = Vec::new();
    let mut profiles: HashMap<Key, (f64, Profiles)> = HashMap::new();
    let all: BTreeSet<&Key> = class.keys().collect();
    for k in all {
        let c = class[k];
        let why = match (
            reference.get(k),
            kernels.get(k),
            workload::find_measured(&k.0),
        ) {
            (None, _, _) => "no run alone at 100 % with GPM metrics",
            (_, None, _) => "no kernels record (learned profile)",
            (_, _, None) => "no workload of that name in the table",
            (Some((mean_s, gpm)), Some(&sm_mean), Some(w)) => {
                let p = [
                    JobProfile::of_workload(w, c),
                    JobProfile::learned(c, sm_mean, None),
                    JobProfile::learned(c, sm_mean, Some(gpm.bw_demand)),
                    JobProfile::prior(c),
                    *gpm,
                ];
                profiles.insert(k.clone(), (*mean_s, p));
                continue;
            }
        };
        left_out.push(format!("{}: {why}", label(k)));
    }

    // Every run had the whole GPU (MIG off); the model sees only the fractions, 1 and 1.
    let whole = PartitionShape {
        sm_count: 132,
        gpu_sm_count: 132,
        memory_slices: 8,
        gpu_memory_slices: 8,
    };
    let mut actual: Vec<(JobClass, f64)> = Vec::new();
    let mut predicted: [Vec<f64>; 5] = Default::default();
    for run in &runs {
        for (i, j) in run.jobs.iter().enumerate() {
            let others: Vec<&JobResult> = run
                .jobs
                .iter()
                .enumerate()
                .filter(|(o, _)| *o != i)
                .map(|(_, o)| o)
                .collect();
            let Some((ref_mean, mine)) = profiles.get(&key(j)) else {
                continue;
            };
            if others.iter().any(|o| !profiles.contains_key(&key(o))) || j.iters < 2 {
                continue;
            }
            let perf = ref_mean / j.mean_s;
            if !(perf > 0.0 && perf <= MAX_PERF) {
                left_out.push(format!(
                    "{} at {} %: normalized performance {perf:.3} is outside (0, {MAX_PERF}]",
                    label(&key(j)),
                    j.job.share_pct
                ));
                continue;
            }
            actual.push((j.class, perf));
            for (s, out) in predicted.iter_mut().enumerate() {
                let co: Vec<CoRunner> = others
                    .iter()
                    .map(|o| CoRunner {
                        profile: profiles[&key(o)].1[s],
                        mps_share: share(o),
                    })
                    .collect();
                out.push(model.estimate(&mine[s], &whole, share(j), &co));
            }
        }
    }
    let errors = |pred: &[f64], which: Option<JobClass>| {
        let (p, a): (Vec<f64>, Vec<f64>) = pred
            .iter()
            .zip(&actual)
            .filter(|(_, (c, _))| which.is_none_or(|w| *c == w))
            .map(|(p, (_, a))| (*p, *a))
            .unzip();
        Errors::of(&p, &a)
    };
    let scores = Source::ALL
        .iter()
        .zip(&predicted)
        .map(|(&source, pred)| SourceScore {
            source,
            overall: errors(pred, None),
            online: errors(pred, Some(JobClass::Online)),
            offline: errors(pred, Some(JobClass::Offline)),
        })
        .collect();
    let mut jobs: Vec<String> = profiles.keys().map(label).collect();
    jobs.sort();
    Ok(Comparison {
        scores,
        jobs,
        left_out,
    })
}

/// A job's MPS share as the model takes it (1-100 %).
fn share(j: &JobResult) -> u8 {
    u8::try_from(j.job.share_pct.clamp(1, 100)).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measured::parse;

    fn shipped_records() -> Vec<Record> {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/gpu/h200-2026-11-21");
        ["raw-alone.jsonl", "raw-pairs.jsonl", "raw-kernels.jsonl"]
            .iter()
            .flat_map(|f| parse(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap())
            .collect()
    }

    /// The target: with the profiles mmkd learns, the shipped forest is no further
    /// from the measured dataset than with the table's named profiles.
    #[test]
    fn learned_profiles_predict_the_shipped_dataset_no_worse_than_named_ones() {
        let model = crate::shipped::load().unwrap();
        let c = compare(&shipped_records(), &model).unwrap();
        assert_eq!(c.jobs.len(), 28, "{:?}", c.left_out);
        let score = |s: Source| c.scores.iter().find(|x| x.source == s).unwrap();
        let (named, learned) = (score(Source::Named), score(Source::Learned));
        let with_bw = score(Source::LearnedBw);
        // 28 jobs alone at six shares, and both jobs of 38 pairs at four splits.
        assert!(named.overall.rows > 400, "{:?}", named.overall);
        assert!(
            learned.overall.rel_error_pct <= named.overall.rel_error_pct,
            "learned {:?} against named {:?}",
            learned.overall,
            named.overall
        );
        assert!(
            with_bw.overall.rel_error_pct <= learned.overall.rel_error_pct,
            "with bandwidth {:?} against without {:?}",
            with_bw.overall,
            learned.overall
        );
    }

    #[test]
    fn a_job_missing_a_source_is_left_out_with_the_reason() {
        let mut records = shipped_records();
        records.retain(|r| !matches!(r, Record::Kernels(k) if k.job.workload == "vgg16-inf"));
        let model = crate::shipped::load().unwrap();
        let c = compare(&records, &model).unwrap();
        assert_eq!(c.jobs.len(), 26);
        assert!(
            c.left_out
                .iter()
                .any(|l| l == "vgg16-inf-b32: no kernels record (learned profile)"),
            "{:?}",
            c.left_out
        );
        assert!(matches!(compare(&[], &model), Err(MeasuredError::NoRuns)));
    }
}
