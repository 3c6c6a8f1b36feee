//! The contention-aware predictor (MMK section III-A): how fast a job runs in a partition,
//! at an MPS share, next to co-runners, normalized to the job alone on the whole GPU.
//!
//! - [`features`]: Table I of the paper (class, MPS share, the job's SM / bandwidth / L2
//!   use, what co-runners already occupy) plus the partition's size and the optional
//!   kernel-level features; a missing feature is explicit (a value and a "present" flag).
//! - [`dataset`]: the CSV format (docs/predictor.md) and its loader, which names the row
//!   and the column of a bad value.
//! - [`groundtruth`]: rows generated from the simulator's documented model, to train and
//!   test on until measured data exists.
//! - [`measured`]: measurements from a GPU (`mmk-lab measure`) and how they become rows.
//! - [`truth`]: a ground-truth model read from those measurements, for the simulator.
//! - [`forest`]: the random forest (smartcore), trained with cross-validated
//!   hyper-parameters, saved to and loaded from a versioned model file; it implements the
//!   partitioner's [`mmk_partitioner::PerfModel`].
//! - [`eval`]: the forest against linear regression, SVR and k-nearest neighbours on a
//!   held-out split (the paper's Table IV), overall and per workload.
//! - [`sources`]: the model's errors with each source of a job's profile (the workload
//!   table, learned from the job's launches, the prior) on a measurement file.

pub mod dataset;
pub mod eval;
pub mod features;
pub mod forest;
pub mod groundtruth;
pub mod measured;
pub mod shipped;
pub mod sources;
pub mod truth;

pub use dataset::{Dataset, DatasetError, Row};
pub use features::{FEATURE_NAMES, Features};
pub use forest::{ForestParams, ModelError, Predictor, TrainOptions};
