//! The paper's Table IV on our data: the random forest against other model families on a
//! held-out split, overall and per workload, and beside them the planner's analytic model
//! (untrained) on the same rows.
//!
//! Errors, over the held-out rows (`p` predicted, `a` measured normalized performance):
//! - absolute error: mean of `|p - a|`, in units of normalized performance (1 = the job
//!   alone on the whole GPU);
//! - relative error: mean of `|p - a| / a`, in percent.

use std::collections::BTreeMap;

use serde::Serialize;
use smartcore::linalg::basic::matrix::DenseMatrix;
use smartcore::linear::linear_regression::{LinearRegression, LinearRegressionParameters};
use smartcore::neighbors::knn_regressor::{KNNRegressor, KNNRegressorParameters};
use smartcore::svm::Kernels;
use smartcore::svm::svr::{SVR, SVRParameters};

use mmk_partitioner::{AnalyticModel, CoRunner, JobProfile, PartitionShape, PerfModel};

use crate::dataset::Dataset;
use crate::features::Features;
use crate::forest::{ForestParams, ModelError, fit, matrix, mre_pct};
use mmk_core::rng::Rng;

/// The share of rows held out.
pub const HOLDOUT: f64 = 0.2;

#[derive(Debug, Clone, Serialize)]
pub struct Errors {
    pub rows: usize,
    pub abs_error: f64,
    pub rel_error_pct: f64,
}

impl Errors {
    pub fn of(pred: &[f64], actual: &[f64]) -> Errors {
        let n = actual.len().max(1) as f64;
        Errors {
            rows: actual.len(),
            abs_error: pred
                .iter()
                .zip(actual)
                .map(|(p, a)| (p - a).abs())
                .sum::<f64>()
                / n,
            rel_error_pct: mre_pct(pred, actual),
        }
    }
}

/// One model family's errors on the held-out rows.
#[derive(Debug, Clone, Serialize)]
pub struct ModelScore {
    pub model: String,
    pub overall: Errors,
    pub per_workload: BTreeMap<String, Errors>,
}

/// What the planner's analytic model says of a row. The row has the co-runners' use
/// already limited by their shares, so they count as one co-runner at 100 %.
fn analytic_estimate(model: &AnalyticModel, f: &Features) -> f64 {
    const GPU_SMS: u32 = 1000;
    const GPU_SLICES: u8 = 8;
    let part = PartitionShape {
        sm_count: ((f.partition_sm_frac * f64::from(GPU_SMS)).round() as u32).max(1),
        gpu_sm_count: GPU_SMS,
        memory_slices: ((f.partition_mem_frac * f64::from(GPU_SLICES)).round() as u8).max(1),
        gpu_memory_slices: GPU_SLICES,
    };
    let job = JobProfile {
        class: f.class,
        sm_demand: f.job_sm_frac,
        bw_demand: f.job_bw_frac,
        solo_latency_ms: None,
    };
    let co: Vec<CoRunner> = if f.co_runners > 0 {
        vec![CoRunner {
            profile: JobProfile {
                class: f.class,
                sm_demand: f.co_sm_frac,
                bw_demand: f.co_bw_frac.min(1.0),
                solo_latency_ms: None,
            },
            mps_share: 100,
        }]
    } else {
        Vec::new()
    };
    model.estimate(
        &job,
        &part,
        f.mps_share_pct.round().clamp(1.0, 100.0) as u8,
        &co,
    )
}

/// Splits `data` (seeded), fits each model family on the 80 % and scores it on the 20 %.
/// The forest uses `forest` (the hyper-parameters a model file chose); the others are
/// standardized and use the settings named in their labels.
pub fn compare(
    data: &Dataset,
    forest: ForestParams,
    seed: u64,
) -> Result<Vec<ModelScore>, ModelError> {
    let n = data.rows.len();
    let test_n = ((n as f64) * HOLDOUT).round() as usize;
    if test_n < 1 || n - test_n < 2 {
        return Err(ModelError::TooFewRows { need: 5, have: n });
    }
    let mut order: Vec<usize> = (0..n).collect();
    Rng::new(seed).shuffle(&mut order);
    let (test, train) = order.split_at(test_n);
    let (x, y) = data.xy();
    let pick = |idx: &[usize]| -> (Vec<Vec<f64>>, Vec<f64>) {
        (
            idx.iter().map(|&i| x[i].clone()).collect(),
            idx.iter().map(|&i| y[i]).collect(),
        )
    };
    let (tx, ty) = pick(train);
    let (vx, vy) = pick(test);
    let names: Vec<&str> = test
        .iter()
        .map(|&i| data.rows[i].workload.as_str())
        .collect();
    let err = |e: smartcore::error::Failed| ModelError::Train(e.to_string());

    let (sx, svx) = standardize(&tx, &vx);
    let mvx = matrix(&vx)?;
    let (msx, msvx) = (matrix(&sx)?, matrix(&svx)?);

    let mut out = Vec::new();
    let f = fit(&tx, &ty, forest, seed)?;
    out.push(("random forest".to_owned(), f.predict(&mvx).map_err(err)?));

    let lr =
        LinearRegression::fit(&msx, &ty, LinearRegressionParameters::default()).map_err(err)?;
    out.push((
        "linear regression".to_owned(),
        lr.predict(&msvx).map_err(err)?,
    ));

    let gamma = 1.0 / sx.first().map_or(1, Vec::len) as f64;
    let svr_params = SVRParameters::default()
        .with_eps(0.01)
        .with_c(10.0)
        .with_kernel(Kernels::rbf().with_gamma(gamma));
    let svr: SVR<f64, DenseMatrix<f64>, Vec<f64>> =
        SVR::fit(&msx, &ty, &svr_params).map_err(err)?;
    out.push((
        "SVR (RBF, C=10, eps=0.01)".to_owned(),
        svr.predict(&msvx).map_err(err)?,
    ));

    let knn =
        KNNRegressor::fit(&msx, &ty, KNNRegressorParameters::default().with_k(5)).map_err(err)?;
    out.push((
        "k-nearest neighbours (k=5)".to_owned(),
        knn.predict(&msvx).map_err(err)?,
    ));

    // The model mmkd plans with when it has no model file: no training, the features only.
    let analytic = AnalyticModel::default();
    out.push((
        "analytic model (no training)".to_owned(),
        test.iter()
            .map(|&i| analytic_estimate(&analytic, &data.rows[i].features))
            .collect(),
    ));

    Ok(out
        .into_iter()
        .map(|(model, pred)| {
            let mut groups: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
            for ((p, a), w) in pred.iter().zip(&vy).zip(&names) {
                let g = groups.entry((*w).to_owned()).or_default();
                g.0.push(*p);
                g.1.push(*a);
            }
            ModelScore {
                model,
                overall: Errors::of(&pred, &vy),
                per_workload: groups
                    .into_iter()
                    .map(|(w, (p, a))| (w, Errors::of(&p, &a)))
                    .collect(),
            }
        })
        .collect())
}

/// Standardizes columns with the training rows' mean and deviation (constant columns are
/// left centred).
fn standardize(train: &[Vec<f64>], test: &[Vec<f64>]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let cols = train.first().map_or(0, Vec::len);
    let n = train.len().max(1) as f64;
    let mean: Vec<f64> = (0..cols)
        .map(|c| train.iter().map(|r| r[c]).sum::<f64>() / n)
        .collect();
    let sd: Vec<f64> = (0..cols)
        .map(|c| {
            let v = train.iter().map(|r| (r[c] - mean[c]).powi(2)).sum::<f64>() / n;
            if v > 1e-12 { v.sqrt() } else { 1.0 }
        })
        .collect();
    let apply = |rows: &[Vec<f64>]| -> Vec<Vec<f64>> {
        rows.iter()
            .map(|r| {
                r.iter()
                    .enumerate()
                    .map(|(c, v)| (v - mean[c]) / sd[c])
                    .collect()
            })
            .collect()
    };
    (apply(train), apply(test))
}
