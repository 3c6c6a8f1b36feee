//! mmk's domain types, shared by the daemon, the CLI and the gRPC layer.
//!
//! - [`spec`]: what a user asks for (`job.yaml`), validated at the edge;
//! - [`yaml`]: parsing `job.yaml` with errors that name the field and the line;
//! - [`job`]: job classes and the job state machine;
//! - [`units`]: memory sizes and durations as users write them;
//! - [`workload`]: the named workload profiles that simulated jobs run.

pub mod job;
pub mod spec;
pub mod units;
pub mod workload;
pub mod yaml;

pub use job::{JobClass, JobState};
pub use spec::{CommandSpec, FieldError, JobSpec, RestartPolicy, Task, WorkloadSpec};
