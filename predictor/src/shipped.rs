//! The forest mmkd plans with unless told otherwise: trained on the repo's real-GPU
//! dataset (`data/gpu/h200-2026-11-21/dataset.csv`, 472 rows measured on an H200) with
//! `mmk-lab predictor train --seed 1`, and built into the binary. A test trains it again
//! from the dataset and requires the same bytes, so the file and its provenance cannot
//! drift apart (`data/predictor/README.md` says how to make it again).

use crate::forest::{ModelError, Predictor};

/// The dataset the shipped forest was trained on, from the repository's root.
pub const DATASET: &str = "data/gpu/h200-2026-11-21/dataset.csv";

/// The seed it was trained with (`mmk-lab predictor train --seed 1`).
pub const SEED: u64 = 1;

/// What the shipped forest is called in logs and errors.
pub const NAME: &str = "h200-2026-11-21 (built in)";

/// The model file's bytes.
pub const BYTES: &[u8] = include_bytes!("../../data/predictor/h200-2026-11-21.mmk");

/// The shipped forest.
pub fn load() -> Result<Predictor, ModelError> {
    Predictor::from_bytes(BYTES, NAME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dataset, TrainOptions};

    #[test]
    fn the_shipped_forest_is_the_one_its_dataset_and_seed_make() {
        let shipped = load().expect("the shipped forest loads");
        assert_eq!(shipped.rows, 472);
        let data = Dataset::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(DATASET),
        )
        .expect("the dataset");
        let trained = Predictor::train(&data, &TrainOptions::standard(SEED)).expect("trains");
        assert!(
            trained.to_bytes().expect("bytes") == BYTES,
            "data/predictor/h200-2026-11-21.mmk is not what {DATASET} with seed {SEED} makes; \
             make it again (data/predictor/README.md)"
        );
        let cv = shipped.cv_error_pct().expect("its cross-validated error");
        assert!((5.0..8.0).contains(&cv), "{cv}");
    }

    /// The planner's prior for a job nobody profiled is the median of the dataset's
    /// workloads of its class, measured alone.
    #[test]
    fn the_planners_prior_is_the_datasets_median() {
        use mmk_core::JobClass;
        use mmk_partitioner::model::{PRIOR_OFFLINE, PRIOR_ONLINE};
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(DATASET),
        )
        .expect("the dataset");
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().expect("header").split(',').collect();
        let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
        let (w, c, co, sm, bw) = (
            col("workload"),
            col("class"),
            col("co_runners"),
            col("job_sm_frac"),
            col("job_bw_frac"),
        );
        let mut jobs = std::collections::BTreeMap::new();
        for line in lines {
            let f: Vec<&str> = line.split(',').collect();
            if f[co] == "0" {
                let v = |i: usize| f[i].parse::<f64>().expect("a number");
                jobs.insert((f[c].to_owned(), f[w].to_owned()), (v(sm), v(bw)));
            }
        }
        let median = |class: JobClass, pick: fn(&(f64, f64)) -> f64| {
            let mut v: Vec<f64> = jobs
                .iter()
                .filter(|((c, _), _)| c == class.as_str())
                .map(|(_, x)| pick(x))
                .collect();
            assert_eq!(v.len(), 14, "{class} workloads");
            v.sort_by(f64::total_cmp);
            (v[6] + v[7]) / 2.0
        };
        for (class, prior) in [
            (JobClass::Online, PRIOR_ONLINE),
            (JobClass::Offline, PRIOR_OFFLINE),
        ] {
            let got = (median(class, |x| x.0), median(class, |x| x.1));
            assert!(
                (got.0 - prior.0).abs() < 1e-3 && (got.1 - prior.1).abs() < 1e-3,
                "{class}: the dataset's medians are {got:?}, the prior says {prior:?}"
            );
        }
    }
}
