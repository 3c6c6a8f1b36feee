//! The node's partitioning brain, as a pure library (no I/O, no async, deterministic).
//!
//! - [`catalog`]: the MIG profiles and placements of each GPU model, as data;
//! - [`layout`]: GPU instances on memory slices, and what makes a layout valid;
//! - [`model`]: the performance-model interface the planners ask, and an analytic model;
//! - [`plan`]: the planner interface (`Planner::plan`) and the first-fit planner;
//! - [`hybrid`]: MMK's hybrid partition scheduler (Algorithm 1 with the fixes in
//!   docs/architecture.md), and the MIGER and MISO baselines as readings of the same search;
//! - [`baselines`]: the Default (one job per GPU) and MPS (everything shared) baselines.

pub mod baselines;
pub mod catalog;
pub mod hybrid;
pub mod layout;
pub mod mix;
pub mod model;
pub mod plan;

pub use catalog::{GpuModel, Profile};
pub use hybrid::{Hybrid, HybridOptions};
pub use layout::{GpuState, Instance, LayoutError, Placement};
pub use model::{AnalyticModel, CoRunner, JobProfile, PartitionShape, PerfModel};
pub use plan::{
    FirstFit, JobDemand, JobPlacement, NodeState, Plan, Planner, Preemption, QueuedJob, Slot, Step,
};

/// The planners by name, as `mmkd --planner` and `mmk-lab simulate` take them.
pub const PLANNERS: [&str; 6] = ["mmk", "miger", "miso", "mps", "default", "first-fit"];

/// A planner by name, with `model` for those that predict.
pub fn planner(name: &str, model: std::sync::Arc<dyn PerfModel>) -> Option<Box<dyn Planner>> {
    planner_with(name, model, 100)
}

/// [`planner`], with an offline job's MPS share at most `offline_share_max` % in the
/// planners that choose shares (`mmk`, `miger`; [`HybridOptions::offline_share_max`]).
pub fn planner_with(
    name: &str,
    model: std::sync::Arc<dyn PerfModel>,
    offline_share_max: u8,
) -> Option<Box<dyn Planner>> {
    planner_for_node(name, model, offline_share_max, None)
}

/// [`planner_with`] for a node that keeps online jobs' latency objectives at run time,
/// holding a job that gives none to `slo_guard` (mmkd's SLO control and its default
/// slowdown; see [`hybrid::HybridOptions::slo_guarded`]).
pub fn planner_for_node(
    name: &str,
    model: std::sync::Arc<dyn PerfModel>,
    offline_share_max: u8,
    slo_guarded: Option<f64>,
) -> Option<Box<dyn Planner>> {
    Some(match name {
        "mmk" => Box::new(
            Hybrid::mmk(model)
                .with_offline_share_max(offline_share_max)
                .with_slo_guard(slo_guarded),
        ),
        "miger" => Box::new(Hybrid::miger(model).with_offline_share_max(offline_share_max)),
        "miso" => Box::new(Hybrid::miso(model)),
        "mps" => Box::new(baselines::MpsOnly),
        "default" => Box::new(baselines::OneJobPerGpu),
        "first-fit" => Box::new(FirstFit),
        _ => return None,
    })
}
