//! A trace-driven simulation of GPU nodes under mmk's planners and the baselines the MMK
//! paper compares with (Default, MPS, MISO, MIGER), with no GPU and no daemon.
//!
//! - [`trace`]: job traces, generated (Table III mix, Poisson arrivals) or read from CSV;
//! - [`engine`]: the discrete-event simulation; it calls the planners through
//!   `mmk_partitioner::planner`, the same code mmkd runs, and takes how fast jobs really
//!   run from a ground-truth model (README.md says which, and where its numbers come
//!   from);
//! - [`kernel`]: the kernel scheduler's effect on jobs that share a partition (MMK), from
//!   the co-location rounds measured on the H200 or from `mmk-lab ksim`;
//! - [`report`]: JCT, makespan, system throughput, the relative-JCT CDF (SVG);
//! - [`reference`]: the best schedule a clairvoyant search finds for a small trace, and a
//!   lower bound, to measure the policies against.

pub mod engine;
pub mod experiment;
pub mod kernel;
pub mod reference;
pub mod report;
pub mod trace;

pub use engine::{JobOutcome, RunResult, SimConfig, SimError, simulate};
pub use kernel::{KernelEffect, WithKernelSched};
pub use report::Summary;
pub use trace::{Trace, TraceSpec};
