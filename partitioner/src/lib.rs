//! The node's partitioning brain, as a pure library (no I/O, no async, deterministic).
//!
//! - [`catalog`]: the MIG profiles and placements of each GPU model, as data;
//! - [`layout`]: GPU instances on memory slices, and what makes a layout valid;
//! - [`plan`]: the planner interface (`Planner::plan`) and the first-fit planner that the
//!   daemon uses until MMK's hybrid scheduler replaces it.

pub mod catalog;
pub mod layout;
pub mod plan;

pub use catalog::{GpuModel, Profile};
pub use layout::{GpuState, Instance, LayoutError, Placement};
pub use plan::{
    FirstFit, JobDemand, JobPlacement, NodeState, Plan, Planner, QueuedJob, Slot, Step,
};
