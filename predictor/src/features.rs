//! The predictor's inputs: Table I of the MMK paper, the partition's size, and the
//! kernel-level features that SM and bandwidth use alone miss
//! ("Measuring GPU utilization one level deeper"; docs/architecture.md lists the papers).
//!
//! Fractions are of the whole GPU: `job_sm_frac` is the share of the GPU's SMs the job
//! keeps busy alone on the whole GPU, `partition_mem_frac` the share of its memory slices
//! (and so of its memory bandwidth) that the partition has. An optional feature that is
//! missing is encoded as two columns, value 0 and present 0, never as a silent zero.

use mmk_core::JobClass;
use mmk_partitioner::{CoRunner, JobProfile, PartitionShape};

/// Kernel-level features from a profiler (ncu), when the job was profiled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KernelFeatures {
    /// Achieved occupancy, 0..1.
    pub occupancy_frac: Option<f64>,
    /// Instructions per cycle per SM.
    pub ipc: Option<f64>,
    /// L2 hit rate, 0..1.
    pub l2_hit_frac: Option<f64>,
    /// DRAM throughput as a fraction of the peak, 0..1.
    pub dram_tput_frac: Option<f64>,
}

/// One job in one configuration, as the predictor sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features {
    pub class: JobClass,
    /// The job's MPS active thread percentage, 1..100.
    pub mps_share_pct: f64,
    pub partition_sm_frac: f64,
    pub partition_mem_frac: f64,
    pub job_sm_frac: f64,
    pub job_bw_frac: f64,
    /// L2 capacity the job uses, as a fraction of the GPU's L2.
    pub job_l2_frac: Option<f64>,
    /// How many jobs share the partition with it.
    pub co_runners: u32,
    /// SMs the co-runners keep busy, each limited by its share, as a fraction of the GPU,
    /// summed (above 1 where the shares add up to more than 100 %).
    pub co_sm_frac: f64,
    /// Bandwidth the co-runners use at that pace, as a fraction of the GPU's.
    pub co_bw_frac: f64,
    pub co_l2_frac: Option<f64>,
    pub kernel: KernelFeatures,
}

/// The columns the model sees, in order. `*_present` is 1 when the feature before it was
/// measured, 0 when it is missing. The last three are derived from the others.
pub const FEATURE_NAMES: [&str; 24] = [
    "class_online",
    "mps_share_frac",
    "partition_sm_frac",
    "partition_mem_frac",
    "job_sm_frac",
    "job_bw_frac",
    "job_l2_frac",
    "job_l2_present",
    "co_runners",
    "co_sm_frac",
    "co_bw_frac",
    "co_l2_frac",
    "co_l2_present",
    "occupancy_frac",
    "occupancy_present",
    "ipc",
    "ipc_present",
    "l2_hit_frac",
    "l2_hit_present",
    "dram_tput_frac",
    "dram_tput_present",
    "avail_sm_frac",
    "sm_ratio",
    "bw_pressure",
];

impl Features {
    /// The features of a planner's question: `job` at `mps_share` percent of `partition`,
    /// next to `co_runners`. Profiles from the workload table have no L2 or kernel-level
    /// numbers: those are missing.
    pub fn of(
        job: &JobProfile,
        partition: &PartitionShape,
        mps_share: u8,
        co_runners: &[CoRunner],
    ) -> Features {
        let part_sm = f64::from(partition.sm_count) / f64::from(partition.gpu_sm_count.max(1));
        let part_mem =
            f64::from(partition.memory_slices) / f64::from(partition.gpu_memory_slices.max(1));
        let (co_sm, co_bw) = co_runners.iter().fold((0.0, 0.0), |(sm, bw), c| {
            let (s, b) = occupied(&c.profile, part_sm, c.mps_share);
            (sm + s, bw + b)
        });
        Features {
            class: job.class,
            mps_share_pct: f64::from(mps_share),
            partition_sm_frac: part_sm,
            partition_mem_frac: part_mem,
            job_sm_frac: job.sm_demand,
            job_bw_frac: job.bw_demand,
            job_l2_frac: None,
            co_runners: co_runners.len() as u32,
            co_sm_frac: co_sm,
            co_bw_frac: co_bw,
            co_l2_frac: None,
            kernel: KernelFeatures::default(),
        }
    }

    /// Appends the model's columns (see [`FEATURE_NAMES`]).
    pub fn encode(&self, out: &mut Vec<f64>) {
        let opt = |out: &mut Vec<f64>, v: Option<f64>| {
            out.push(v.unwrap_or(0.0));
            out.push(if v.is_some() { 1.0 } else { 0.0 });
        };
        let share = self.mps_share_pct / 100.0;
        let avail = share * self.partition_sm_frac;
        let ratio = if self.job_sm_frac > 0.0 {
            (avail / self.job_sm_frac).min(1.0)
        } else {
            1.0
        };
        let pressure =
            (self.job_bw_frac * ratio + self.co_bw_frac) / self.partition_mem_frac.max(1e-6);
        out.push(if self.class == JobClass::Online {
            1.0
        } else {
            0.0
        });
        out.push(share);
        out.push(self.partition_sm_frac);
        out.push(self.partition_mem_frac);
        out.push(self.job_sm_frac);
        out.push(self.job_bw_frac);
        opt(out, self.job_l2_frac);
        out.push(f64::from(self.co_runners));
        out.push(self.co_sm_frac);
        out.push(self.co_bw_frac);
        opt(out, self.co_l2_frac);
        opt(out, self.kernel.occupancy_frac);
        opt(out, self.kernel.ipc);
        opt(out, self.kernel.l2_hit_frac);
        opt(out, self.kernel.dram_tput_frac);
        out.push(avail);
        out.push(ratio);
        out.push(pressure);
    }

    pub fn to_vec(&self) -> Vec<f64> {
        let mut v = Vec::with_capacity(FEATURE_NAMES.len());
        self.encode(&mut v);
        v
    }
}

/// What one co-runner occupies of the GPU in a partition of `part_sm` of its SMs: its SMs
/// (limited by its share) and the bandwidth it uses at that pace.
fn occupied(p: &JobProfile, part_sm: f64, share: u8) -> (f64, f64) {
    let sm = (f64::from(share) / 100.0 * part_sm).min(p.sm_demand);
    let pace = if p.sm_demand > 0.0 {
        sm / p.sm_demand
    } else {
        1.0
    };
    (sm, p.bw_demand * pace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(class: JobClass, sm: f64, bw: f64) -> JobProfile {
        JobProfile {
            class,
            sm_demand: sm,
            bw_demand: bw,
            solo_latency_ms: None,
        }
    }

    #[test]
    fn a_planner_question_becomes_the_documented_columns() {
        let shape = PartitionShape {
            sm_count: 42,
            gpu_sm_count: 98,
            memory_slices: 4,
            gpu_memory_slices: 8,
        };
        let co = [CoRunner {
            profile: profile(JobClass::Offline, 0.8, 0.5),
            mps_share: 50,
        }];
        let f = Features::of(&profile(JobClass::Online, 0.4, 0.35), &shape, 50, &co);
        let v = f.to_vec();
        assert_eq!(v.len(), FEATURE_NAMES.len());
        let col = |n: &str| v[FEATURE_NAMES.iter().position(|x| *x == n).unwrap()];
        assert_eq!(col("class_online"), 1.0);
        assert_eq!(col("mps_share_frac"), 0.5);
        assert!((col("partition_sm_frac") - 42.0 / 98.0).abs() < 1e-12);
        assert_eq!(col("partition_mem_frac"), 0.5);
        // The co-runner keeps half the partition busy: 21 of 98 SMs.
        assert!((col("co_sm_frac") - 21.0 / 98.0).abs() < 1e-12);
        // Missing features are flagged, not silently zero.
        assert_eq!((col("job_l2_frac"), col("job_l2_present")), (0.0, 0.0));
        assert_eq!(col("ipc_present"), 0.0);
        let mut measured = f;
        measured.kernel.ipc = Some(0.0);
        let v = measured.to_vec();
        assert_eq!(
            v[FEATURE_NAMES
                .iter()
                .position(|x| *x == "ipc_present")
                .unwrap()],
            1.0
        );
    }
}
