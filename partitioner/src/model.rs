//! The performance model the planner asks: how well does a job run in a partition, at an
//! MPS share, next to other jobs?
//!
//! Performance is normalized to the job running alone on the whole GPU (docs/architecture.md, item 7):
//! an offline job's throughput over its throughput alone, an online job's latency alone over
//! its latency. 1.0 is "as good as alone on the whole GPU"; the sum over jobs is the
//! system throughput (STP) the planner maximizes.
//!
//! The predictor crate implements [`PerfModel`] with a trained random forest. Until then
//! [`AnalyticModel`] stands in: a small roofline-style formula, documented below, over
//! the nominal demands in [`JobProfile`].

use mmk_core::JobClass;
use serde::Serialize;

/// What the model knows of a job.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct JobProfile {
    pub class: JobClass,
    /// Fraction of a whole GPU's SMs the job keeps busy alone, in (0, 1].
    pub sm_demand: f64,
    /// Fraction of the time the job would keep the whole GPU's memory bandwidth busy
    /// alone, in [0, 1].
    pub bw_demand: f64,
    /// Online jobs: latency of one request alone on the whole GPU, in ms, when known.
    pub solo_latency_ms: Option<f64>,
}

impl JobProfile {
    /// A job of `class` running a workload of the table, with the table's nominal demands.
    pub fn of_workload(w: &mmk_core::workload::Workload, class: JobClass) -> JobProfile {
        JobProfile {
            class,
            sm_demand: w.sm_demand,
            bw_demand: w.bw_demand,
            solo_latency_ms: w.solo_latency_ms,
        }
    }

    /// The prior for a job nobody profiled: the median demands of the shipped dataset's
    /// workloads of its class ([`PRIOR_ONLINE`], [`PRIOR_OFFLINE`]). It shares a partition
    /// like any other job.
    pub fn prior(class: JobClass) -> JobProfile {
        let (sm_demand, bw_demand) = match class {
            JobClass::Online => PRIOR_ONLINE,
            JobClass::Offline => PRIOR_OFFLINE,
        };
        JobProfile {
            class,
            sm_demand,
            bw_demand,
            solo_latency_ms: None,
        }
    }

    /// A job whose demands mmkd learned: `sm_mean` from its own launches (the
    /// time-weighted mean of what its kernels in flight asked for, idle time included, as
    /// a fraction of the GPU), `bw_mean` from the driver while it ran alone in its
    /// partition (NVML GPM's DRAM bandwidth use, as a fraction of the GPU's). Without
    /// a measured bandwidth, its class's prior scaled by the SM demand's ratio.
    pub fn learned(class: JobClass, sm_mean: f64, bw_mean: Option<f64>) -> JobProfile {
        let prior = JobProfile::prior(class);
        let sm = sm_mean.clamp(0.01, 1.0);
        JobProfile {
            class,
            sm_demand: sm,
            bw_demand: bw_mean
                .filter(|b| b.is_finite())
                .unwrap_or(prior.bw_demand * sm / prior.sm_demand)
                .clamp(0.01, 1.0),
            solo_latency_ms: None,
        }
    }

    /// A job that asked for its partition to itself (`exclusive`): it keeps every SM busy
    /// and half the memory bandwidth, the pessimistic reading.
    pub fn exclusive(class: JobClass) -> JobProfile {
        JobProfile {
            class,
            sm_demand: 1.0,
            bw_demand: 0.5,
            solo_latency_ms: None,
        }
    }
}

/// The prior of an online job nobody profiled: (SM demand, bandwidth demand), the medians
/// over the 14 online workloads (model and batch) of data/gpu/h200-2026-11-21 measured
/// alone on the whole GPU. The predictor's tests compute them again from the dataset.
pub const PRIOR_ONLINE: (f64, f64) = (0.877, 0.352);

/// The prior of an offline job nobody profiled: the same over the 14 offline workloads.
pub const PRIOR_OFFLINE: (f64, f64) = (0.773, 0.190);

/// The shape of a partition as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PartitionShape {
    /// SMs of the partition (the instance's, or the GPU's with MIG off).
    pub sm_count: u32,
    /// SMs of the whole GPU.
    pub gpu_sm_count: u32,
    /// Memory slices of the partition and of the GPU: MIG gives an instance the memory
    /// bandwidth of its slices.
    pub memory_slices: u8,
    pub gpu_memory_slices: u8,
}

/// A job that shares the partition.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CoRunner {
    pub profile: JobProfile,
    pub mps_share: u8,
}

/// Estimates a job's normalized performance (see the module docs).
pub trait PerfModel: Send + Sync + std::fmt::Debug {
    /// Normalized performance of `job` at `mps_share` percent of `partition`'s SMs, next
    /// to `co_runners` in the same partition; in (0, 1].
    fn estimate(
        &self,
        job: &JobProfile,
        partition: &PartitionShape,
        mps_share: u8,
        co_runners: &[CoRunner],
    ) -> f64;

    /// Whether no co-runner ever makes a job faster than it runs alone at the same share in
    /// the same partition. Search bounds rely on it (the simulator's reference schedule);
    /// `false` unless the model guarantees it.
    fn company_never_helps(&self) -> bool {
        false
    }

    /// An upper bound on `job`'s normalized performance at `mps_share` of `partition`,
    /// whatever its co-runners (none included). Search bounds rely on it (the simulator's
    /// reference schedule): the tighter, the less they search. By default its performance
    /// alone there where company never helps, else 1.
    fn speed_bound(&self, job: &JobProfile, partition: &PartitionShape, mps_share: u8) -> f64 {
        if self.company_never_helps() {
            self.estimate(job, partition, mps_share, &[])
        } else {
            1.0
        }
    }
}

/// The stand-in model, a roofline over SMs and memory bandwidth plus an interference term:
///
/// - SMs: the job may use `s = share × partition SMs` and wants `d = sm_demand × GPU SMs`.
///   When the jobs of the partition together want more SMs than it has (`Σ min(s, d)`
///   over the jobs), each gets its part scaled down to fit. Compute speed
///   `c = got / d` (at most 1).
/// - Bandwidth: the partition has `b = memory slices / GPU memory slices` of the GPU's
///   bandwidth. Running at speed `c`, a job wants `bw_demand × c` of it. When the jobs of
///   the partition want `W > b` together, each gets `b / W` of what it wants and slows
///   down by as much.
/// - Time relative to alone on the whole GPU: `(1 / c) × max(1, W / b)` (alone on the
///   whole GPU that is 1), times `1 + κ × (SM fraction the co-runners keep busy)`:
///   co-located kernels compete for L2, schedulers and memory controllers even when SMs
///   and bandwidth suffice (MMK paper, Fig. 3). κ = 0.15.
/// - Performance = 1 / time, at most 1.
///
/// Documented as our reading, not measured; the predictor replaces it.
#[derive(Debug, Clone, Copy)]
pub struct AnalyticModel {
    /// The interference coefficient κ.
    pub interference: f64,
}

impl Default for AnalyticModel {
    fn default() -> Self {
        AnalyticModel { interference: 0.15 }
    }
}

impl AnalyticModel {
    /// SMs one job can use: its share of the partition, up to what it wants.
    fn sm_want(p: &JobProfile, part: &PartitionShape, share: u8) -> f64 {
        let allowed = f64::from(part.sm_count) * f64::from(share.clamp(1, 100)) / 100.0;
        let wanted = p.sm_demand.clamp(0.01, 1.0) * f64::from(part.gpu_sm_count.max(1));
        allowed.min(wanted)
    }
}

impl PerfModel for AnalyticModel {
    fn estimate(
        &self,
        job: &JobProfile,
        part: &PartitionShape,
        mps_share: u8,
        co_runners: &[CoRunner],
    ) -> f64 {
        let gpu_sms = f64::from(part.gpu_sm_count.max(1));
        let part_sms = f64::from(part.sm_count.max(1));
        let wanted = job.sm_demand.clamp(0.01, 1.0) * gpu_sms;
        let mine = Self::sm_want(job, part, mps_share);
        let others: Vec<f64> = co_runners
            .iter()
            .map(|c| Self::sm_want(&c.profile, part, c.mps_share))
            .collect();
        let total: f64 = mine + others.iter().sum::<f64>();
        let scale = if total > part_sms {
            part_sms / total
        } else {
            1.0
        };
        let c = (mine * scale / wanted).clamp(1e-3, 1.0);

        // Bandwidth: each job wants its demand at the speed its SMs allow.
        let b = f64::from(part.memory_slices.max(1)) / f64::from(part.gpu_memory_slices.max(1));
        let co_bw: f64 = co_runners
            .iter()
            .zip(&others)
            .map(|(co, got)| {
                let d = co.profile.sm_demand.clamp(0.01, 1.0) * gpu_sms;
                co.profile.bw_demand.clamp(0.0, 1.0) * (got * scale / d).min(1.0)
            })
            .sum();
        let wanted_bw = job.bw_demand.clamp(0.0, 1.0) * c + co_bw;
        let time = (1.0 / c) * (wanted_bw / b).max(1.0);
        let busy_by_others: f64 = others.iter().map(|o| o * scale).sum::<f64>() / part_sms;
        let time = time * (1.0 + self.interference * busy_by_others.min(1.0));
        (1.0 / time).clamp(1e-6, 1.0)
    }

    /// Co-runners only take SMs (`scale` at most 1), add bandwidth demand and add
    /// interference: never a gain, while the interference is not negative.
    fn company_never_helps(&self) -> bool {
        self.interference >= 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole() -> PartitionShape {
        PartitionShape {
            sm_count: 132,
            gpu_sm_count: 132,
            memory_slices: 8,
            gpu_memory_slices: 8,
        }
    }

    fn part(sms: u32, slices: u8) -> PartitionShape {
        PartitionShape {
            sm_count: sms,
            gpu_sm_count: 132,
            memory_slices: slices,
            gpu_memory_slices: 8,
        }
    }

    fn job(sm: f64, bw: f64) -> JobProfile {
        JobProfile {
            class: JobClass::Offline,
            sm_demand: sm,
            bw_demand: bw,
            solo_latency_ms: None,
        }
    }

    #[test]
    fn alone_on_the_whole_gpu_is_one() {
        let m = AnalyticModel::default();
        for (sm, bw) in [(1.0, 0.5), (0.3, 0.9), (0.8, 0.0)] {
            let p = m.estimate(&job(sm, bw), &whole(), 100, &[]);
            assert!((p - 1.0).abs() < 1e-9, "{sm} {bw}: {p}");
        }
    }

    #[test]
    fn smaller_partitions_and_shares_slow_a_big_job() {
        let m = AnalyticModel::default();
        let big = job(1.0, 0.4);
        let seven = m.estimate(&big, &whole(), 100, &[]);
        let three = m.estimate(&big, &part(60, 4), 100, &[]);
        let one = m.estimate(&big, &part(16, 1), 100, &[]);
        let half = m.estimate(&big, &part(60, 4), 50, &[]);
        assert!(seven > three && three > one, "{seven} {three} {one}");
        assert!(half < three);
        assert!(
            (three - 60.0 / 132.0).abs() < 0.01,
            "compute-bound: {three}"
        );
    }

    #[test]
    fn a_small_job_loses_little_in_a_small_partition() {
        let m = AnalyticModel::default();
        let small = job(0.2, 0.1);
        let p = m.estimate(&small, &part(32, 2), 100, &[]);
        assert!(p > 0.99, "{p}");
    }

    #[test]
    fn co_runners_cost_something() {
        let m = AnalyticModel::default();
        let a = job(0.3, 0.3);
        let alone = m.estimate(&a, &whole(), 50, &[]);
        let shared = m.estimate(
            &a,
            &whole(),
            50,
            &[CoRunner {
                profile: job(0.3, 0.3),
                mps_share: 50,
            }],
        );
        assert!(shared < alone, "{shared} {alone}");
        assert!(
            shared > 0.8 * alone,
            "interference is bounded: {shared} {alone}"
        );
        // Over-subscribed SMs (shares above 100 in total) are split.
        let crowded = m.estimate(
            &job(1.0, 0.1),
            &whole(),
            100,
            &[CoRunner {
                profile: job(1.0, 0.1),
                mps_share: 100,
            }],
        );
        assert!(crowded < 0.55, "{crowded}");
    }

    #[test]
    fn bandwidth_bound_jobs_feel_memory_slices() {
        let m = AnalyticModel::default();
        let bw = job(0.2, 0.9);
        // Enough SMs in a 2g (32 SMs for 26 wanted), but a quarter of the bandwidth.
        let p = m.estimate(&bw, &part(32, 2), 100, &[]);
        assert!((p - 0.25 / 0.9).abs() < 0.01, "{p}");
    }
}
