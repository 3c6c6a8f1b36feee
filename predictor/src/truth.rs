//! A ground-truth performance model read from GPU measurements (`mmk-lab measure`), for
//! the simulator: how fast a measured job runs at an MPS share next to co-runners, taken
//! from what the GPU did rather than from a formula.
//!
//! - **Alone:** a job's normalized performance at share `s` is its measured curve, linear
//!   between the shares measured (0 at 0 %; 1 at 100 %). The curve is made monotone (a
//!   running maximum, at most 1): a job is never slower at a larger share; the measured
//!   dips are noise (data README).
//! - **Partitions:** MIG was off when measuring, so a MIG instance with a fraction `f` of
//!   the GPU's SMs counts as a share of `f` (a job at share `s` in it as `s × f`). This is
//!   the proxy of docs/measure.md: it keeps the compute limit and misses the instance's
//!   own memory bandwidth and L2.
//! - **Shares that add up to more than 100 %** are scaled down to fit (each `× 100 / Σ`):
//!   such jobs compete for the SMs.
//! - **Co-runners:** each has a measured ratio: the job's performance in its pair run with
//!   that co-runner over its curve at its (scaled) share, from the measured split nearest
//!   the one asked for. A pair that was never measured takes the mean ratio of measured
//!   pairs of the same classes and split kind (shares within 100 % or over). A job next
//!   to one co-runner runs as its pair run measured. Next to several:
//!   - shares within 100 % (each job has SMs of its own; they meet in memory bandwidth
//!     and L2): the co-runners count together. Each one's ratio is taken at the split
//!     of the job against all of them (own share, the co-runners' sum), and the ratios
//!     are averaged geometrically, weighted by share. Two co-runners at 25 % cost a job
//!     at 50 % what one at 50 % does, not twice that;
//!   - shares over 100 % (they take turns on the SMs): losses (ratios under 1) multiply;
//!     a gain (a ratio above 1: the co-runner left idle SMs that the job used, which
//!     scaling the shares does not see) counts once, the largest.
//!
//!   [`MeasuredTruth::check`] compares this with groups of three and four measured on
//!   the same GPU (data/gpu/h200-2026-11-21/README.md, "Groups").
//! - A job that was not measured (its profile is none of the table's) gets
//!   `fallback`, the analytic model.
//!
//! Jobs are told apart by their profile (class, SM and bandwidth demand), which the
//! simulator takes from [`MeasuredTruth::jobs`]: the planner sees the same measured
//! demands that `mmk-lab predictor import` puts in the rows.

use std::collections::HashMap;

use mmk_core::JobClass;
use mmk_partitioner::{AnalyticModel, CoRunner, JobProfile, PartitionShape, PerfModel};

use crate::measured::{JobRef, JobResult, Mode, Record};

/// One measured job.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredJob {
    /// `resnet50-inf-b32`.
    pub label: String,
    pub workload: String,
    pub batch: u32,
    /// Class, SM and bandwidth demand (GPM alone at 100 %), and for online jobs the
    /// latency of one iteration alone.
    pub profile: JobProfile,
    /// Memory the worker reserved at its peak, MiB, when it said.
    pub memory_mib: Option<u64>,
    /// (share 0..1, normalized performance), sorted, monotone, starting at (0, 0).
    curve: Vec<(f64, f64)>,
}

impl MeasuredJob {
    /// Performance alone at a share of `frac` (0..1) of the GPU.
    pub fn alone(&self, frac: f64) -> f64 {
        let f = frac.clamp(0.0, 1.0);
        for w in self.curve.windows(2) {
            let ((s0, p0), (s1, p1)) = (w[0], w[1]);
            if f <= s1 {
                return if s1 > s0 {
                    p0 + (p1 - p0) * (f - s0) / (s1 - s0)
                } else {
                    p1
                };
            }
        }
        self.curve.last().map_or(1.0, |c| c.1)
    }
}

/// A pair run's ratio, seen from one job.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PairRatio {
    own: u32,
    other: u32,
    ratio: f64,
}

#[derive(Debug, Clone)]
pub struct MeasuredTruth {
    jobs: Vec<MeasuredJob>,
    /// (job, co-runner) index → its measured splits.
    pairs: HashMap<(usize, usize), Vec<PairRatio>>,
    /// (job class, co-runner class, shares over 100 %) → mean ratio.
    class_means: HashMap<(JobClass, JobClass, bool), f64>,
    fallback: AnalyticModel,
}

fn scaled(own: u32, total: u32) -> f64 {
    let own = f64::from(own) / 100.0;
    if total > 100 {
        own * 100.0 / f64::from(total)
    } else {
        own
    }
}

/// Why measurements do not make a ground truth.
#[derive(Debug, thiserror::Error)]
pub enum TruthError {
    #[error("measurement file")]
    Parse(#[source] crate::measured::MeasuredError),
    #[error("no job was measured alone at 100 % (with GPM metrics) and at another share")]
    NoJobs,
    #[error("{0} and {1} have the same profile: the model cannot tell them apart")]
    SameProfile(String, String),
}

impl MeasuredTruth {
    /// Builds the model from measurement records (alone and pair runs). A job needs a run
    /// alone at 100 % with GPM metrics (its profile) and at least one other share.
    pub fn from_records(records: &[Record]) -> Result<MeasuredTruth, TruthError> {
        type Key = (String, u32);
        let key = JobRef::key;
        let mut points: HashMap<Key, Vec<(u32, f64)>> = HashMap::new();
        let mut reference: HashMap<Key, (f64, JobProfile, Option<u64>)> = HashMap::new();
        for r in records {
            let Record::Run(run) = r else { continue };
            let Some(j) = run.jobs.first() else { continue };
            if run.mode != Mode::Alone || j.iters < 2 {
                continue;
            }
            points
                .entry(key(&j.job))
                .or_default()
                .push((j.job.share_pct, j.mean_s));
            if j.job.share_pct == 100
                && let Some(g) = run.gpm
                && let (Some(sm), Some(bw)) = (g.sm_util_pct, g.dram_bw_util_pct)
            {
                let profile = JobProfile {
                    class: j.class,
                    sm_demand: (sm / 100.0).clamp(0.01, 1.0),
                    bw_demand: (bw / 100.0).clamp(0.0, 1.0),
                    solo_latency_ms: (j.class == JobClass::Online).then_some(j.mean_s * 1e3),
                };
                let mem = j.mem_bytes.map(|b| b.div_ceil(1 << 20));
                reference.insert(key(&j.job), (j.mean_s, profile, mem));
            }
        }
        let mut jobs = Vec::new();
        let mut index: HashMap<Key, usize> = HashMap::new();
        let mut keys: Vec<&Key> = reference.keys().collect();
        keys.sort();
        for k in keys {
            let (ref_mean, profile, memory_mib) = reference[k];
            let mut pts: Vec<(u32, f64)> = points[k].clone();
            pts.sort_by_key(|p| p.0);
            let mut curve = vec![(0.0, 0.0)];
            let mut best: f64 = 0.0;
            for (share, mean) in pts {
                best = best.max((ref_mean / mean).min(1.0));
                match curve.last_mut() {
                    Some(last) if last.0 == f64::from(share) / 100.0 => last.1 = best,
                    _ => curve.push((f64::from(share) / 100.0, best)),
                }
            }
            if curve.len() < 3 {
                continue;
            }
            index.insert(k.clone(), jobs.len());
            jobs.push(MeasuredJob {
                label: format!("{}-b{}", k.0, k.1),
                workload: k.0.clone(),
                batch: k.1,
                profile,
                memory_mib,
                curve,
            });
        }
        if jobs.is_empty() {
            return Err(TruthError::NoJobs);
        }
        for (i, a) in jobs.iter().enumerate() {
            for b in &jobs[i + 1..] {
                if a.profile == b.profile {
                    return Err(TruthError::SameProfile(a.label.clone(), b.label.clone()));
                }
            }
        }
        let mut pairs: HashMap<(usize, usize), Vec<PairRatio>> = HashMap::new();
        let mut sums: HashMap<(JobClass, JobClass, bool), (f64, u32)> = HashMap::new();
        for r in records {
            let Record::Run(run) = r else { continue };
            if run.mode != Mode::Pair || run.jobs.iter().any(|j| j.iters < 2) {
                continue;
            }
            let (Some(a), Some(b)) = (run.jobs.first(), run.jobs.get(1)) else {
                continue;
            };
            let (Some(&ia), Some(&ib)) = (index.get(&key(&a.job)), index.get(&key(&b.job))) else {
                continue;
            };
            let total = run.jobs[0].job.share_pct + run.jobs[1].job.share_pct;
            for (me, other, (i, o)) in [(0, 1, (ia, ib)), (1, 0, (ib, ia))] {
                let (j, oj) = (&run.jobs[me], &run.jobs[other]);
                let Some((ref_mean, _, _)) = reference.get(&key(&j.job)) else {
                    continue;
                };
                let base = jobs[i].alone(scaled(j.job.share_pct, total));
                if base <= 0.0 {
                    continue;
                }
                let ratio = (ref_mean / j.mean_s) / base;
                pairs.entry((i, o)).or_default().push(PairRatio {
                    own: j.job.share_pct,
                    other: oj.job.share_pct,
                    ratio,
                });
                let e = sums.entry((j.class, oj.class, total > 100)).or_default();
                e.0 += ratio;
                e.1 += 1;
            }
        }
        Ok(MeasuredTruth {
            jobs,
            pairs,
            class_means: sums
                .into_iter()
                .map(|(k, (s, n))| (k, s / f64::from(n)))
                .collect(),
            fallback: AnalyticModel::default(),
        })
    }

    /// Parses measurement files' text (JSON lines) and builds the model.
    pub fn from_texts<'a>(
        texts: impl IntoIterator<Item = &'a str>,
    ) -> Result<MeasuredTruth, TruthError> {
        let mut records = Vec::new();
        for t in texts {
            records.extend(crate::measured::parse(t).map_err(TruthError::Parse)?);
        }
        MeasuredTruth::from_records(&records)
    }

    /// The measured jobs, sorted by label.
    pub fn jobs(&self) -> &[MeasuredJob] {
        &self.jobs
    }

    /// The measured job with this profile; the class is not compared (a trace may run a
    /// workload as the other class).
    fn find(&self, p: &JobProfile) -> Option<usize> {
        self.jobs.iter().position(|j| {
            j.profile.sm_demand == p.sm_demand
                && j.profile.bw_demand == p.bw_demand
                && j.profile.solo_latency_ms == p.solo_latency_ms
        })
    }

    /// The ratio a co-runner `o` at share `other` imposes on job `i` at share `own`.
    fn ratio(&self, i: usize, o: Option<usize>, co_class: JobClass, own: u8, other: u8) -> f64 {
        let over = u32::from(own) + u32::from(other) > 100;
        if let Some(o) = o
            && let Some(measured) = self.pairs.get(&(i, o))
        {
            // The nearest split; of equally near ones, one of the same kind (within 100 %
            // or over), then the one nearest in the co-runner's share (what it costs
            // depends most on how much of the GPU it has), so that the order of the
            // measurements never decides.
            let (own, other) = (u32::from(own), u32::from(other));
            let nearness = |p: &&PairRatio| {
                (
                    p.own.abs_diff(own) + p.other.abs_diff(other),
                    (p.own + p.other > 100) != over,
                    p.other.abs_diff(other),
                )
            };
            if let Some(p) = measured.iter().min_by_key(nearness) {
                return p.ratio;
            }
        }
        let class = self.jobs[i].profile.class;
        self.class_means
            .get(&(class, co_class, over))
            .or_else(|| self.class_means.get(&(class, co_class, !over)))
            .copied()
            .unwrap_or(1.0)
    }
}

/// Several co-runners' ratios as one factor: losses multiply, the largest gain counts once.
fn combine(ratios: impl IntoIterator<Item = f64>) -> f64 {
    let (mut loss, mut gain) = (1.0_f64, 1.0_f64);
    for r in ratios {
        loss *= r.min(1.0);
        gain = gain.max(r);
    }
    loss * gain
}

/// One job of a measured run, next to what the truth predicts for it.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedJob {
    /// `resnet50-inf-b32 @ 34 % + bert-train-b8 @ 33 % + ...`, this job first.
    pub run: String,
    /// How many jobs the run had.
    pub jobs: usize,
    /// The shares of the run's jobs, in the run's order.
    pub shares: Vec<u32>,
    /// Its iteration time alone at 100 % over the one in the run, both from the checked
    /// records (the same lease of the GPU).
    pub measured: f64,
    pub predicted: f64,
}

impl CheckedJob {
    /// (predicted - measured) / measured.
    pub fn error(&self) -> f64 {
        (self.predicted - self.measured) / self.measured
    }
}

impl MeasuredTruth {
    /// What the model predicts for each job of the pair and group runs in `records`
    /// (measurements it was not built from, such as data/gpu/h200-2026-11-21/
    /// raw-groups.jsonl), against what they measured. A job is normalized by its run
    /// alone at 100 % in `records`; a job without one, or not in the model, is left out.
    pub fn check(&self, records: &[Record]) -> Vec<CheckedJob> {
        let mut reference: HashMap<(String, u32), f64> = HashMap::new();
        for r in records {
            if let Record::Run(run) = r
                && run.mode == Mode::Alone
                && let Some(j) = run.jobs.first()
                && j.job.share_pct == 100
                && j.iters >= 2
            {
                reference.insert(j.job.key(), j.mean_s);
            }
        }
        let whole = PartitionShape {
            sm_count: 1,
            gpu_sm_count: 1,
            memory_slices: 1,
            gpu_memory_slices: 1,
        };
        let mut out = Vec::new();
        for r in records {
            let Record::Run(run) = r else { continue };
            if !matches!(run.mode, Mode::Pair | Mode::Group) || run.jobs.iter().any(|j| j.iters < 2)
            {
                continue;
            }
            let idx: Vec<Option<usize>> = run
                .jobs
                .iter()
                .map(|j| {
                    self.jobs
                        .iter()
                        .position(|m| m.workload == j.job.workload && m.batch == j.job.batch)
                })
                .collect();
            let share = |k: usize| u8::try_from(run.jobs[k].job.share_pct).unwrap_or(100);
            for (k, j) in run.jobs.iter().enumerate() {
                let (Some(i), Some(alone)) = (idx[k], reference.get(&j.job.key())) else {
                    continue;
                };
                let co: Vec<CoRunner> = (0..run.jobs.len())
                    .filter(|&o| o != k)
                    .filter_map(|o| {
                        idx[o].map(|m| CoRunner {
                            profile: self.jobs[m].profile,
                            mps_share: share(o),
                        })
                    })
                    .collect();
                if co.len() + 1 != run.jobs.len() {
                    continue;
                }
                let label = |x: &JobResult| format!("{} @ {} %", x.job.label(), x.job.share_pct);
                let run_label = std::iter::once(label(j))
                    .chain(
                        run.jobs
                            .iter()
                            .enumerate()
                            .filter(|(o, _)| *o != k)
                            .map(|(_, x)| label(x)),
                    )
                    .collect::<Vec<_>>()
                    .join(" + ");
                out.push(CheckedJob {
                    run: run_label,
                    jobs: run.jobs.len(),
                    shares: run.jobs.iter().map(|x| x.job.share_pct).collect(),
                    measured: alone / j.mean_s,
                    predicted: self.estimate(&self.jobs[i].profile, &whole, share(k), &co),
                });
            }
        }
        out
    }
}

impl PerfModel for MeasuredTruth {
    fn estimate(
        &self,
        job: &JobProfile,
        partition: &PartitionShape,
        mps_share: u8,
        co_runners: &[CoRunner],
    ) -> f64 {
        let Some(i) = self.find(job) else {
            return self
                .fallback
                .estimate(job, partition, mps_share, co_runners);
        };
        let part = f64::from(partition.sm_count) / f64::from(partition.gpu_sm_count.max(1));
        let total: u32 = u32::from(mps_share)
            + co_runners
                .iter()
                .map(|c| u32::from(c.mps_share))
                .sum::<u32>();
        let alone = self.jobs[i].alone(scaled(u32::from(mps_share), total) * part);
        let others = total - u32::from(mps_share);
        let factor = if total <= 100 && co_runners.len() > 1 && others > 0 {
            // Within 100 %: each co-runner's ratio at the split against all of them
            // together, weighted by its share (a geometric mean).
            let agg = u8::try_from(others).unwrap_or(100);
            co_runners
                .iter()
                .map(|c| {
                    let r = self.ratio(i, self.find(&c.profile), c.profile.class, mps_share, agg);
                    r.max(1e-9).ln() * f64::from(c.mps_share) / f64::from(others)
                })
                .sum::<f64>()
                .exp()
        } else {
            combine(co_runners.iter().map(|c| {
                self.ratio(
                    i,
                    self.find(&c.profile),
                    c.profile.class,
                    mps_share,
                    c.mps_share,
                )
            }))
        };
        (alone * factor).clamp(1e-6, 1.0)
    }

    /// The job's curve at its share of the partition (company only scales a share down,
    /// and the curve is monotone) times the largest gain any co-runner can bring it: the
    /// largest of its measured pair ratios and of its class's means, at least 1. A
    /// weighted geometric mean of ratios, or losses times the largest gain, is never above
    /// that.
    fn speed_bound(&self, job: &JobProfile, partition: &PartitionShape, mps_share: u8) -> f64 {
        let Some(i) = self.find(job) else {
            return self.fallback.speed_bound(job, partition, mps_share);
        };
        let part = f64::from(partition.sm_count) / f64::from(partition.gpu_sm_count.max(1));
        let alone = self.jobs[i].alone(f64::from(mps_share) / 100.0 * part);
        let class = self.jobs[i].profile.class;
        let gain = self
            .pairs
            .iter()
            .filter(|((me, _), _)| *me == i)
            .flat_map(|(_, ratios)| ratios.iter().map(|p| p.ratio))
            .chain(
                self.class_means
                    .iter()
                    .filter(|((c, _, _), _)| *c == class)
                    .map(|(_, r)| *r),
            )
            .fold(1.0_f64, f64::max);
        (alone * gain).clamp(1e-6, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measured::{Gpm, JobResult, Run};

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
            p99_s: mean_s,
            mem_bytes: Some(3 << 30),
            process_mem_bytes: None,
        }
    }

    fn alone(w: &str, share: u32, class: JobClass, mean_s: f64, sm: f64) -> Record {
        Record::Run(Run {
            mode: Mode::Alone,
            window_s: 1.5,
            jobs: vec![job(w, share, class, mean_s)],
            gpm: Some(Gpm {
                sm_util_pct: Some(sm),
                dram_bw_util_pct: Some(30.0),
                ..Gpm::default()
            }),
            gpm_error: None,
        })
    }

    fn pair(a: (&str, u32, f64), b: (&str, u32, f64)) -> Record {
        Record::Run(Run {
            mode: Mode::Pair,
            window_s: 1.5,
            jobs: vec![
                job(a.0, a.1, JobClass::Online, a.2),
                job(b.0, b.1, JobClass::Offline, b.2),
            ],
            gpm: None,
            gpm_error: None,
        })
    }

    /// A whole H200, as the measurements ran.
    const WHOLE: PartitionShape = PartitionShape {
        sm_count: 132,
        gpu_sm_count: 132,
        memory_slices: 8,
        gpu_memory_slices: 8,
    };

    fn truth() -> MeasuredTruth {
        use JobClass::*;
        MeasuredTruth::from_records(&[
            alone("svc", 100, Online, 0.010, 80.0),
            alone("svc", 50, Online, 0.020, 50.0),
            // A noisy dip: slower at 80 % than at 50 % would say.
            alone("svc", 80, Online, 0.025, 70.0),
            alone("train", 100, Offline, 0.100, 90.0),
            alone("train", 50, Offline, 0.160, 50.0),
            alone("other", 100, Offline, 0.100, 60.0),
            alone("other", 50, Offline, 0.125, 40.0),
            // svc at 50 % next to train at 50 %: 0.4 (its curve says 0.5).
            pair(("svc", 50, 0.025), ("train", 50, 0.200)),
        ])
        .unwrap()
    }

    #[test]
    fn alone_the_measured_curve_is_followed_and_made_monotone() {
        let t = truth();
        let svc = &t.jobs()[1];
        assert_eq!(svc.label, "svc-b32");
        assert_eq!(svc.profile.solo_latency_ms, Some(10.0));
        assert_eq!(svc.memory_mib, Some(3072));
        let p = svc.profile;
        assert!((t.estimate(&p, &WHOLE, 100, &[]) - 1.0).abs() < 1e-12);
        assert!((t.estimate(&p, &WHOLE, 50, &[]) - 0.5).abs() < 1e-12);
        assert!((t.estimate(&p, &WHOLE, 25, &[]) - 0.25).abs() < 1e-12);
        // The dip at 80 % (0.4) is lifted to the 0.5 measured below it.
        assert!((t.estimate(&p, &WHOLE, 80, &[]) - 0.5).abs() < 1e-12);
        // Half the SMs as a MIG instance is half the share.
        let half = PartitionShape {
            sm_count: 66,
            ..WHOLE
        };
        assert!((t.estimate(&p, &half, 100, &[]) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn co_runners_apply_the_measured_ratio_or_the_class_mean() {
        let t = truth();
        let by = |l: &str| t.jobs().iter().find(|j| j.label == l).unwrap().profile;
        let co = |l: &str, s: u8| CoRunner {
            profile: by(l),
            mps_share: s,
        };
        // Measured: 0.4 where the curve says 0.5.
        let with_train = t.estimate(&by("svc-b32"), &WHOLE, 50, &[co("train-b32", 50)]);
        assert!((with_train - 0.4).abs() < 1e-9, "{with_train}");
        // Never measured with "other": the mean of online-next-to-offline pairs (0.8).
        let with_other = t.estimate(&by("svc-b32"), &WHOLE, 50, &[co("other-b32", 50)]);
        assert!((with_other - 0.4).abs() < 1e-9, "{with_other}");
        // Shares over 100 % are scaled: 100 + 100 runs each at 50 %.
        let both = t.estimate(&by("svc-b32"), &WHOLE, 100, &[co("train-b32", 100)]);
        assert!((both - 0.4).abs() < 1e-9, "{both}");
        // An unknown job gets the analytic model.
        let unknown = JobProfile::exclusive(JobClass::Offline);
        assert_eq!(
            t.estimate(&unknown, &WHOLE, 100, &[]),
            AnalyticModel::default().estimate(&unknown, &WHOLE, 100, &[])
        );
    }

    /// A model of an online "svc" (half speed at 50 %), a "light" offline job (29 % of the
    /// SMs) and a "heavy" one, alone at 100 % and 50 %, with `pairs`.
    fn with_svc_light_heavy(pairs: [Record; 2]) -> MeasuredTruth {
        use JobClass::*;
        let mut records = vec![
            alone("svc", 100, Online, 0.010, 80.0),
            alone("svc", 50, Online, 0.020, 50.0),
            alone("light", 100, Offline, 0.100, 30.0),
            alone("light", 50, Offline, 0.100, 29.0),
            alone("heavy", 100, Offline, 0.100, 95.0),
            alone("heavy", 50, Offline, 0.200, 50.0),
        ];
        records.extend(pairs);
        MeasuredTruth::from_records(&records).unwrap()
    }

    #[test]
    fn a_light_co_runner_gains_once_and_losses_compound() {
        let pair100 = |svc_s: f64, other: &str| pair(("svc", 100, svc_s), (other, 100, 0.3));
        let t = with_svc_light_heavy([
            // Next to "light" svc ran at 0.7, where half the GPU gives 0.5: ratio 1.4.
            pair100(0.010 / 0.7, "light"),
            // Next to "heavy" at 0.4: ratio 0.8.
            pair100(0.010 / 0.4, "heavy"),
        ]);
        let by = |l: &str| t.jobs().iter().find(|j| j.label == l).unwrap().profile;
        let co = |l: &str| CoRunner {
            profile: by(l),
            mps_share: 100,
        };
        let svc = by("svc-b32");
        let est = |c: &[CoRunner]| t.estimate(&svc, &WHOLE, 100, c);
        // One co-runner: what the pair run measured, gain included.
        assert!((est(&[co("light-b32")]) - 0.7).abs() < 1e-9);
        assert!((est(&[co("heavy-b32")]) - 0.4).abs() < 1e-9);
        // Three at 100 % each: a third of the GPU (1/3), the loss, the gain once.
        let both = est(&[co("light-b32"), co("heavy-b32")]);
        assert!((both - 1.0 / 3.0 * 0.8 * 1.4).abs() < 1e-9, "{both}");
        let two_light = est(&[co("light-b32"), co("light-b32")]);
        assert!((two_light - 1.0 / 3.0 * 1.4).abs() < 1e-9, "{two_light}");
    }

    #[test]
    fn within_100_percent_co_runners_count_together_by_share() {
        let t = with_svc_light_heavy([
            // At 50 / 50, svc ran at 0.45 next to "light" (ratio 0.9) and at 0.3 next to
            // "heavy" (ratio 0.6), where its curve gives 0.5.
            pair(("svc", 50, 0.010 / 0.45), ("light", 50, 0.2)),
            pair(("svc", 50, 0.010 / 0.3), ("heavy", 50, 0.4)),
        ]);
        let by = |l: &str| t.jobs().iter().find(|j| j.label == l).unwrap().profile;
        let co = |l: &str, share: u8| CoRunner {
            profile: by(l),
            mps_share: share,
        };
        let svc = by("svc-b32");
        let est = |c: &[CoRunner]| t.estimate(&svc, &WHOLE, 50, c);
        // One co-runner at 50 %: the pair run.
        assert!((est(&[co("light-b32", 50)]) - 0.45).abs() < 1e-9);
        // Two at 25 % each hold the other half together: each one's ratio at 50 / 50,
        // weighted by its share (a geometric mean), not their product (0.27).
        let both = est(&[co("light-b32", 25), co("heavy-b32", 25)]);
        assert!((both - 0.5 * (0.9_f64 * 0.6).sqrt()).abs() < 1e-9, "{both}");
        let mostly_light = est(&[co("light-b32", 40), co("heavy-b32", 10)]);
        let expected = 0.5 * 0.9_f64.powf(0.8) * 0.6_f64.powf(0.2);
        assert!((mostly_light - expected).abs() < 1e-9, "{mostly_light}");
        // Over 100 % the losses still compound: 50 + 50 + 50 scales each to a third.
        let over = est(&[co("light-b32", 50), co("heavy-b32", 50)]);
        let third = t
            .jobs()
            .iter()
            .find(|j| j.label == "svc-b32")
            .unwrap()
            .alone(1.0 / 3.0);
        assert!((over - third * 0.9 * 0.6).abs() < 1e-9, "{over}");
    }

    /// The model of the shipped measurements (data/gpu/h200-2026-11-21, alone and pair
    /// runs), as the simulator builds it.
    fn shipped() -> MeasuredTruth {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/gpu/h200-2026-11-21/");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}{f}")).unwrap();
        let (a, p) = (read("raw-alone.jsonl"), read("raw-pairs.jsonl"));
        MeasuredTruth::from_texts([a.as_str(), p.as_str()]).unwrap()
    }

    #[test]
    fn the_shipped_h200_measurements_build_a_model_of_every_job() {
        let t = shipped();
        assert_eq!(t.jobs().len(), 28);
        assert!(
            t.jobs()
                .iter()
                .all(|j| j.alone(1.0) == 1.0 && j.alone(0.1) < 0.5)
        );
    }

    /// The bound holds for every job of the shipped model beside every one, two or three
    /// co-runners of it, at every share and in partitions of a third, a half and the
    /// whole GPU; some of them run faster together than alone, so it must be above the job
    /// alone.
    #[test]
    fn the_shipped_model_never_runs_a_job_past_its_bound() {
        let t = shipped();
        let jobs: Vec<JobProfile> = t.jobs().iter().map(|j| j.profile).collect();
        let (mut above_alone, mut faster_together) = (0, 0);
        for sm in [44, 66, 132] {
            let part = PartitionShape {
                sm_count: sm,
                gpu_sm_count: 132,
                memory_slices: 8,
                gpu_memory_slices: 8,
            };
            for job in &jobs {
                for share in [25, 50, 100] {
                    let bound = t.speed_bound(job, &part, share);
                    let alone = t.estimate(job, &part, share, &[]);
                    assert!(bound >= alone - 1e-12 && bound <= 1.0);
                    above_alone += usize::from(bound > alone + 1e-9);
                    for (k, c) in jobs.iter().enumerate() {
                        for co_share in [25, 50, 100] {
                            let co = |p: &JobProfile| CoRunner {
                                profile: *p,
                                mps_share: co_share,
                            };
                            let groups = [
                                vec![co(c)],
                                vec![co(c), co(&jobs[(k + 7) % jobs.len()])],
                                vec![co(c), co(&jobs[(k + 3) % jobs.len()]), co(&jobs[0])],
                            ];
                            for g in &groups {
                                let v = t.estimate(job, &part, share, g);
                                assert!(v <= bound + 1e-12, "{v} over its bound {bound}");
                                faster_together += usize::from(v > alone + 1e-9);
                            }
                        }
                    }
                }
            }
        }
        // Company does make jobs faster here: a bound of the job alone would not hold.
        assert!(
            faster_together > 0,
            "no co-located job ran faster than alone"
        );
        assert!(above_alone > 0);
    }

    /// The shipped model (alone and pair runs) and the checked runs of `files`, from
    /// data/gpu/h200-2026-11-21/, with a table per split as the data README quotes it.
    fn checked(files: &[&str]) -> Vec<CheckedJob> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/gpu/h200-2026-11-21/");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}{f}")).unwrap();
        let t = shipped();
        let records: Vec<Record> = files
            .iter()
            .flat_map(|f| crate::measured::parse(&read(f)).unwrap())
            .collect();
        let checked = t.check(&records);
        println!("| split | jobs | measured | predicted | mean abs error | bias |");
        println!("| --- | --- | --- | --- | --- | --- |");
        for split in splits(&checked) {
            let v = of_split(&checked, &split);
            println!(
                "| {split:?} | {} | {:.3} | {:.3} | {:.1} % | {:+.1} % |",
                v.len(),
                mean(&v, |c| c.measured),
                mean(&v, |c| c.predicted),
                100.0 * mean(&v, |c| c.error().abs()),
                100.0 * mean(&v, CheckedJob::error),
            );
        }
        checked
    }

    /// The splits of `checked`, in the order they first come.
    fn splits(checked: &[CheckedJob]) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = Vec::new();
        for c in checked {
            if !out.contains(&c.shares) {
                out.push(c.shares.clone());
            }
        }
        out
    }

    fn of_split<'c>(checked: &'c [CheckedJob], split: &[u32]) -> Vec<&'c CheckedJob> {
        checked.iter().filter(|c| c.shares == split).collect()
    }

    fn mean(v: &[&CheckedJob], f: impl Fn(&CheckedJob) -> f64) -> f64 {
        v.iter().map(|c| f(c)).sum::<f64>() / v.len() as f64
    }

    /// The model against runs it was not built from: the pairs at 100 / 100 and 14 groups
    /// of three at three splits, measured again on another lease of the same H200
    /// (raw-groups.jsonl). `--nocapture` prints the table that data/gpu/h200-2026-11-21/
    /// README.md quotes. The rule within 100 % was chosen on these groups.
    #[test]
    fn the_shipped_model_predicts_pairs_and_groups_measured_on_another_lease() {
        let checked = checked(&["raw-groups.jsonl"]);
        let pairs: Vec<&CheckedJob> = checked.iter().filter(|c| c.jobs == 2).collect();
        let threes: Vec<&CheckedJob> = checked.iter().filter(|c| c.jobs == 3).collect();
        // 30 pairs and 14 groups x 3 splits, two and three jobs each.
        assert_eq!((pairs.len(), threes.len()), (60, 126));
        // A pair as measured before, up to the lease-to-lease noise (data README: a job
        // alone differs by 4.8 % between sweeps on average).
        let pair_error = mean(&pairs, |c| c.error().abs());
        assert!(pair_error < 0.06, "pairs: {pair_error}");
        // Groups: within 12 % on average (every co-runner's loss multiplied at every
        // split: 15.9 %; every ratio capped at 1, as before that, 19.5 %).
        let group_error = mean(&threes, |c| c.error().abs());
        assert!(group_error < 0.12, "groups: {group_error}");
        // Unbiased within 8 % at every split: at 100 / 100 / 100 a plain product of every
        // ratio is 9 % too fast; within 100 % a product of the losses is 12-15 % too slow.
        for split in splits(&threes.iter().map(|c| (*c).clone()).collect::<Vec<_>>()) {
            let bias = mean(&of_split(&checked, &split), CheckedJob::error);
            assert!(bias.abs() < 0.08, "{split:?}: bias {bias}");
        }
    }

    /// The same model against groups measured after its rule was chosen, on a fifth lease
    /// (raw-groups-b.jsonl: the 14 groups of three at 60 / 20 / 20, 20 / 40 / 40 and
    /// 70 / 70 / 30; raw-groups-four.jsonl: 7 groups of four at 25 x 4 and 100 x 4, with
    /// pairs in them that were never measured).
    #[test]
    fn the_shipped_model_predicts_groups_at_splits_it_was_not_chosen_on() {
        let checked = checked(&["raw-groups-b.jsonl", "raw-groups-four.jsonl"]);
        let threes = checked.iter().filter(|c| c.jobs == 3).count();
        let fours = checked.iter().filter(|c| c.jobs == 4).count();
        assert_eq!((threes, fours), (126, 56));
        // Within 100 % (the splits MMK's planner makes): within 11 % on average and
        // unbiased within 5 % at each split. Losses multiplied, the rule before, were
        // 21-24 % off and 16-22 % too slow there.
        for split in splits(&checked) {
            if split.iter().sum::<u32>() > 100 {
                continue;
            }
            let v = of_split(&checked, &split);
            let (error, bias) = (mean(&v, |c| c.error().abs()), mean(&v, CheckedJob::error));
            assert!(
                error < 0.11 && bias.abs() < 0.05,
                "{split:?}: {error} {bias}"
            );
        }
    }
}
