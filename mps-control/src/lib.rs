//! MPS for mmk: one `nvidia-cuda-mps-control` daemon per partition, supervised.
//!
//! - [`MpsControl`] is the seam to the control program: start a daemon in a pipe directory,
//!   send it control commands. [`Program`] drives any program that speaks the protocol of
//!   `nvidia-cuda-mps-control`: the real one, or [`fake`], which the tests and
//!   `mmkd --backend sim` use.
//! - [`Supervisor`] keeps one daemon per partition: starts it with the partition's limits,
//!   checks its health, restarts it with backoff, quits it, and stops the daemons a crashed
//!   mmkd left behind.
//!
//! Every call blocks (it runs a program and waits for it); async callers use
//! `spawn_blocking`.

mod control;
pub mod fake;
pub mod procs;
mod supervisor;

pub use control::{
    Dirs, MpsControl, MpsError, Program, Result, ServerStatus, format_mem, parse_mem, parse_pids,
};
pub use supervisor::{DaemonInfo, Health, HealthEvent, Partition, Supervisor};

/// The file in a pipe directory that holds the control daemon's pid (the real daemon
/// writes it; so does the fake).
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
