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
}

impl Workload {
    pub fn default_batch(&self) -> u32 {
        self.batch_sizes[0]
    }

    /// Nominal solo duration for a batch size: linear in the batch relative to the default.
    pub fn nominal_duration_ms(&self, batch: u32) -> u64 {
        let base = u64::from(self.nominal_secs) * 1000;
        base * u64::from(batch.max(1)) / u64::from(self.default_batch())
    }
}

const fn w(
    name: &'static str,
    model: &'static str,
    phase: Phase,
    batch_sizes: [u32; 4],
    nominal_secs: u32,
    nominal_memory_mib: u64,
) -> Workload {
    Workload {
        name,
        model,
        phase,
        batch_sizes,
        nominal_secs,
        nominal_memory_mib,
    }
}

use Phase::{Inference, Train};

/// Every workload the simulated node knows, sorted by name.
pub const WORKLOADS: &[Workload] = &[
    w("bert-train", "BERT", Train, [2, 4, 8, 16], 1800, 12 * 1024),
    w(
        "densenet121-inference",
        "DenseNet121",
        Inference,
        [32, 64, 128, 256],
        300,
        3 * 1024,
    ),
    w(
        "densenet121-train",
        "DenseNet121",
        Train,
        [32, 64, 128, 256],
        1500,
        9 * 1024,
    ),
    w(
        "densenet201-train",
        "DenseNet201",
        Train,
        [16, 32, 64, 128],
        2100,
        10 * 1024,
    ),
    w(
        "mobilenet-inference",
        "MobileNet",
        Inference,
        [32, 64, 128, 256],
        120,
        2 * 1024,
    ),
    w(
        "resnet152-train",
        "ResNet152",
        Train,
        [16, 32, 64, 128],
        2400,
        14 * 1024,
    ),
    w(
        "resnet18-inference",
        "ResNet18",
        Inference,
        [32, 64, 128, 256],
        150,
        2 * 1024,
    ),
    w(
        "resnet50-inference",
        "ResNet50",
        Inference,
        [32, 64, 128, 256],
        240,
        4 * 1024,
    ),
    w(
        "resnet50-train",
        "ResNet50",
        Train,
        [32, 64, 128, 256],
        1200,
        10 * 1024,
    ),
    w(
        "transformer-inference",
        "Transformer",
        Inference,
        [16, 32, 64, 128],
        300,
        5 * 1024,
    ),
    w(
        "transformer-train",
        "Transformer",
        Train,
        [16, 32, 64, 128],
        1800,
        16 * 1024,
    ),
    w(
        "vgg16-inference",
        "VGG16",
        Inference,
        [32, 64, 128, 256],
        200,
        5 * 1024,
    ),
    w(
        "vgg19-inference",
        "VGG19",
        Inference,
        [32, 64, 128, 256],
        220,
        6 * 1024,
    ),
    w(
        "vgg19-train",
        "VGG19",
        Train,
        [32, 64, 128, 256],
        1500,
        14 * 1024,
    ),
];

/// Looks a workload up by name.
pub fn find(name: &str) -> Option<&'static Workload> {
    WORKLOADS.iter().find(|w| w.name == name)
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
