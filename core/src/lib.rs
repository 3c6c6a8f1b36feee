//! mmk's domain types, shared by the daemon, the CLI and the gRPC layer.
//!
//! - [`spec`]: what a user asks for (`job.yaml`), validated at the edge;
//! - [`fasthash`]: a fast hash for maps keyed by values this process made;
//! - [`yaml`]: parsing `job.yaml` with errors that name the field and the line;
//! - [`job`]: job classes and the job state machine;
//! - [`stats`]: quantiles for reports;
//! - [`units`]: memory sizes and durations as users write them;
//! - [`workload`]: the named workload profiles that simulated jobs run.

pub mod error;
pub mod fasthash;
pub mod job;
pub mod paths;
pub mod rng;
pub mod spec;
pub mod stats;
pub mod units;
pub mod workload;
pub mod yaml;

pub use error::{ServiceError, ServiceResult};
pub use job::{JobClass, JobState};
pub use spec::{AttachedSpec, CommandSpec, FieldError, JobSpec, RestartPolicy, Task, WorkloadSpec};

/// Unix time in milliseconds, the unit of every timestamp mmk stores.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
