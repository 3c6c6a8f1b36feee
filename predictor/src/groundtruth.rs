//! Rows from the simulator's documented ground-truth model, to train and test on until the
//! GPU profiling dataset exists. Everything these rows teach is that model: numbers
//! measured on them say how well the predictor learns it, not how well it predicts a GPU.
//!
//! The model is the partitioner's [`AnalyticModel`] (docs/planner.md: a roofline over SMs
//! and memory bandwidth plus an interference term), fed with the nominal demands of the
//! workload table (`mmk_core::workload`), times measurement noise: a normal factor with
//! σ = 1 % (our assumption for run-to-run variation). Partitions are the whole GPU and
//! every MIG profile without media extensions of an A100-80GB and an H100-80GB; the job and
//! each of up to four co-runners at 10..100 % in steps of 10, drawn apart: MPS shares are
//! caps, not reservations, and the planners put jobs past them (a partition whose shares
//! add up to 100 % still takes a job that would otherwise wait), so rows of crowds whose
//! shares add up to more than 100 % teach what the planners ask.
//! The L2 and kernel-level columns are missing: the model has no such quantities.

use mmk_core::workload;
use mmk_partitioner::{AnalyticModel, CoRunner, JobProfile, PartitionShape, PerfModel, catalog};

use crate::dataset::{Dataset, Row};
use crate::features::Features;
use mmk_core::rng::Rng;

/// Run-to-run variation assumed for generated rows (relative, one standard deviation).
pub const NOISE_SIGMA: f64 = 0.01;
/// The GPU models the rows come from.
pub const MODELS: [&str; 2] = ["a100-80gb", "h100-80gb"];
/// The most co-runners a row has: crowds of up to five jobs. MMK's planner forms crowds of
/// six at most (an offline job joins no partition that runs six jobs already).
pub const CO_RUNNERS_MAX: usize = 4;

/// `n` rows, the same for the same seed.
pub fn generate(n: usize, seed: u64) -> Dataset {
    let jobs: Vec<(String, JobProfile)> = workload::WORKLOADS
        .iter()
        .map(|w| (w.name.to_owned(), JobProfile::of_workload(w, w.class())))
        .collect();
    generate_with(&AnalyticModel::default(), &jobs, n, seed)
}

/// `n` rows of `jobs` (name, profile) as `model` has them, in the same configurations as
/// [`generate`] and with the same noise: how the simulator trains the planners' forest on
/// a ground truth other than the analytic model.
pub fn generate_with(
    model: &dyn PerfModel,
    jobs: &[(String, JobProfile)],
    n: usize,
    seed: u64,
) -> Dataset {
    if jobs.is_empty() {
        return Dataset::default();
    }
    let gpus: Vec<_> = MODELS.iter().filter_map(|k| catalog::model(k)).collect();
    let mut shapes = Vec::new();
    for g in &gpus {
        shapes.push(PartitionShape {
            sm_count: g.sm_count,
            gpu_sm_count: g.sm_count,
            memory_slices: g.memory_slices,
            gpu_memory_slices: g.memory_slices,
        });
        for p in g.profiles.iter().filter(|p| !p.media_extensions) {
            shapes.push(PartitionShape {
                sm_count: p.sm_count,
                gpu_sm_count: g.sm_count,
                memory_slices: p.memory_slices,
                gpu_memory_slices: g.memory_slices,
            });
        }
    }
    let all = jobs;
    let mut rng = Rng::new(seed);
    let mut rows = Vec::with_capacity(n);
    while rows.len() < n {
        let shape = shapes[rng.below(shapes.len())];
        let (name, job) = &all[rng.below(all.len())];
        let share = 10 * (1 + rng.below(10)) as u8;
        let co: Vec<CoRunner> = (0..rng.below(CO_RUNNERS_MAX + 1))
            .map(|_| CoRunner {
                profile: all[rng.below(all.len())].1,
                mps_share: 10 * (1 + rng.below(10)) as u8,
            })
            .collect();
        let truth = model.estimate(job, &shape, share, &co);
        let measured = (truth * (1.0 + NOISE_SIGMA * rng.normal())).clamp(1e-3, 1.5);
        rows.push(Row {
            workload: name.clone(),
            features: Features::of(job, &shape, share, &co),
            normalized_perf: measured,
        });
    }
    Dataset { rows }
}

#[cfg(test)]
mod tests {
    use mmk_core::JobClass;

    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_rows_and_the_rows_load() {
        let a = generate(200, 7);
        assert_eq!(a, generate(200, 7));
        assert_ne!(a, generate(200, 8));
        assert_eq!(Dataset::parse(&a.to_csv()).unwrap().rows.len(), 200);
        assert!(
            a.rows
                .iter()
                .any(|r| r.features.co_runners == CO_RUNNERS_MAX as u32)
        );
        // Crowds past their shares: the co-runners' SMs add up to more than the GPU's.
        assert!(a.rows.iter().any(|r| r.features.co_sm_frac > 1.0));
        assert!(a.rows.iter().any(|r| r.features.class == JobClass::Online));
        assert!(
            a.rows
                .iter()
                .all(|r| r.normalized_perf > 0.0 && r.normalized_perf <= 1.5)
        );
    }
}
