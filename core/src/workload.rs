//! Named workload profiles for simulated jobs (`workload:` in `job.yaml`).
//!
//! The names are the MMK paper's Table III workloads. On the simulated node a workload job
//! runs for its nominal solo duration (scaled by the batch size and by `mmkd --sim-speed`).
//! These durations and memory footprints are nominal inputs that make the simulated node
//! behave plausibly; they are not measurements. Measured profiles replace them when the GPU
//! profiling dataset exists (see docs/job-spec.md).

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Inference,
    Train,
}

/// One named workload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Workload {
    pub name: &'static str,
    pub model: &'static str,
    pub phase: Phase,
    /// Batch sizes the paper uses (Table III); any positive batch is accepted.
    pub batch_sizes: [u32; 4],
    /// Nominal solo run time at the first batch size, in seconds of simulated time.
    pub nominal_secs: u32,
    /// Nominal GPU memory at the first batch size, in MiB.
    pub nominal_memory_mib: u64,
    /// Fraction of a whole GPU's SMs the workload keeps busy alone at the first batch size.
    pub sm_demand: f64,
    /// Fraction of the time it would keep the whole GPU's memory bandwidth busy alone.
    pub bw_demand: f64,
    /// Inference: latency of one batch alone on a whole GPU, in ms; `None` for training.
    pub solo_latency_ms: Option<f64>,
}

impl Workload {
    /// The class a job of this workload has unless it says otherwise: inference serves
    /// (online), training runs in the background (offline).
    pub fn class(&self) -> crate::JobClass {
        match self.phase {
            Phase::Inference => crate::JobClass::Online,
            Phase::Train => crate::JobClass::Offline,
        }
    }

    pub fn default_batch(&self) -> u32 {
        self.batch_sizes[0]
    }

    /// The name `mmk-lab measure` records this workload under (`resnet50-inf` for
    /// `resnet50-inference`; a training workload keeps its name).
    pub fn measured_name(&self) -> String {
        self.name.replace("-inference", "-inf")
    }

    /// Nominal solo duration for a batch size: linear in the batch relative to the default.
    pub fn nominal_duration_ms(&self, batch: u32) -> u64 {
        let base = u64::from(self.nominal_secs) * 1000;
        base * u64::from(batch.max(1)) / u64::from(self.default_batch())
    }
}

#[allow(clippy::too_many_arguments)]
const fn w(
    name: &'static str,
    model: &'static str,
    phase: Phase,
    batch_sizes: [u32; 4],
    nominal_secs: u32,
    nominal_memory_mib: u64,
    (sm_demand, bw_demand): (f64, f64),
    solo_latency_ms: Option<f64>,
) -> Workload {
    Workload {
        name,
        model,
        phase,
        batch_sizes,
        nominal_secs,
        nominal_memory_mib,
        sm_demand,
        bw_demand,
        solo_latency_ms,
    }
}

use Phase::{Inference, Train};

const I32: [u32; 4] = [32, 64, 128, 256];
const T16: [u32; 4] = [16, 32, 64, 128];
const GIB: u64 = 1024;

/// Every workload the simulated node knows, sorted by name. The last two columns (SM and
/// bandwidth demand, solo batch latency) feed the planner's analytic performance model
/// until measured profiles exist; they are nominal, chosen so that small inference models
/// leave SMs idle and large training jobs fill a GPU (MMK paper, Fig. 2 and 4).
#[rustfmt::skip]
pub const WORKLOADS: &[Workload] = &[
    w("bert-train", "BERT", Train, [2, 4, 8, 16], 1800, 12 * GIB, (0.80, 0.55), None),
    w("densenet121-inference", "DenseNet121", Inference, I32, 300, 3 * GIB, (0.35, 0.40), Some(8.0)),
    w("densenet121-train", "DenseNet121", Train, I32, 1500, 9 * GIB, (0.70, 0.50), None),
    w("densenet201-train", "DenseNet201", Train, T16, 2100, 10 * GIB, (0.70, 0.50), None),
    w("mobilenet-inference", "MobileNet", Inference, I32, 120, 2 * GIB, (0.20, 0.45), Some(3.0)),
    w("resnet152-train", "ResNet152", Train, T16, 2400, 14 * GIB, (0.85, 0.45), None),
    w("resnet18-inference", "ResNet18", Inference, I32, 150, 2 * GIB, (0.25, 0.35), Some(3.0)),
    w("resnet50-inference", "ResNet50", Inference, I32, 240, 4 * GIB, (0.40, 0.35), Some(6.0)),
    w("resnet50-train", "ResNet50", Train, I32, 1200, 10 * GIB, (0.75, 0.45), None),
    w("transformer-inference", "Transformer", Inference, T16, 300, 5 * GIB, (0.45, 0.50), Some(10.0)),
    w("transformer-train", "Transformer", Train, T16, 1800, 16 * GIB, (0.85, 0.60), None),
    w("vgg16-inference", "VGG16", Inference, I32, 200, 5 * GIB, (0.45, 0.55), Some(10.0)),
    w("vgg19-inference", "VGG19", Inference, I32, 220, 6 * GIB, (0.50, 0.55), Some(12.0)),
    w("vgg19-train", "VGG19", Train, I32, 1500, 14 * GIB, (0.85, 0.60), None),
];

/// Looks a workload up by name.
pub fn find(name: &str) -> Option<&'static Workload> {
    WORKLOADS.iter().find(|w| w.name == name)
}

/// The workload a measurement records as `measured` ([`Workload::measured_name`]).
pub fn find_measured(measured: &str) -> Option<&'static Workload> {
    WORKLOADS.iter().find(|w| w.measured_name() == measured)
}

/// The known names, for error messages.
pub fn names() -> Vec<&'static str> {
    WORKLOADS.iter().map(|w| w.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_sorted() {
        let names = names();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
    }

    #[test]
    fn duration_scales_with_batch() {
        let r = find("resnet50-train").expect("known workload");
        assert_eq!(r.nominal_duration_ms(32), 1_200_000);
        assert_eq!(r.nominal_duration_ms(64), 2_400_000);
        assert!(find("alexnet").is_none());
    }
}
