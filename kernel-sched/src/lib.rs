//! The kernel scheduler's shared parts.
//!
//! A job process runs with the interposer (`libmmk_interposer.so`, crate
//! `kernel-sched/interposer`) in `LD_PRELOAD`. The interposer sees every kernel launch and
//! asks the partition's [`Gate`] whether it may go now. The gate is one small shared-memory
//! segment per partition: mmkd creates it, every job process of the partition maps it.
//!
//! - [`gate`]: the segment's layout, joining and leaving it, publishing in-flight work,
//!   and the bounded wait of a held launch (a futex on the segment).
//! - [`latency`]: the histogram of an online process's busy periods, which mmkd's SLO
//!   control reads.
//! - [`policy`]: the decision for one launch, as a pure function of the launch, what is in
//!   flight and how long it has waited. `passthrough` measures only; `mmk` lets online
//!   kernels go first and offline ones in when they fit.
//! - [`profile`]: per-kernel statistics of a job run alone (`mmk-lab profile`), which the
//!   `orion` and `fikit` policies look launches up in.
//! - [`sim`]: the kernel-level simulator, which replays recorded traces of several jobs on
//!   a simulated SM pool under each policy (`mmk-lab ksim`).
//! - [`slice`]: how an offline job's long GEMMs are cut into pieces the gate can hold.
//! - [`trace`]: the kernel trace that record mode writes (one CSV line a launch).
//! - [`sm_demand`]: how many SMs a launch needs, from its grid and the occupancy API.
//!
//! The environment the interposer reads is listed in [`env`].

pub mod artifacts;
pub mod gate;
pub mod latency;
pub mod policy;
pub mod profile;
pub mod sim;
pub mod slice;
pub mod trace;

pub use gate::{
    Charge, DEFAULT_HOLD_BUDGET_PCT, DEFAULT_MAX_HOLD, DeviceWord, DeviceWordLocation, Gate,
    GateConfig, GateError, HoldBudget, SlotId, SlotStats, Totals, WaitOutcome, monotonic_ns,
};
pub use policy::{Class, Clock, Decision, InFlight, Launch, Policy, PolicyKind, PolicyParams};
pub use profile::{Expect, Intensity, KernelKey, Profile};

/// The environment variables the interposer reads. mmkd sets the first three for the jobs it
/// starts; the others are for people profiling a job by hand.
pub mod env {
    /// Path of the partition's gate segment. Without it the interposer only counts.
    pub const GATE: &str = "MMK_GATE";
    /// `online` or `offline`: the job's class. Launches of a job without one are offline.
    pub const CLASS: &str = "MMK_JOB_CLASS";
    /// The job's MPS thread percentage (1..=100), which scales the anti-starvation bound.
    pub const MPS_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
    /// Record mode: write one trace line per launch to this file (`%p` becomes the pid).
    pub const RECORD: &str = "MMK_KSCHED_RECORD";
    /// Write the process's launch counts and the interposer's own cost as JSON to this file
    /// when the process exits (`%p` becomes the pid).
    pub const STATS: &str = "MMK_KSCHED_STATS";
    /// The job's kernel profile (`mmk-lab profile`), for the `orion` and `fikit` policies.
    pub const PROFILE: &str = "MMK_KSCHED_PROFILE";
    /// `1`: intercept nothing (the library stays loaded but every call goes straight through).
    pub const OFF: &str = "MMK_KSCHED_OFF";
    /// `greatest` or `keep`: the priority of the streams the job creates (see
    /// [`crate::StreamPriority`]). Without it, online jobs get `greatest`, offline `keep`.
    pub const STREAM_PRIORITY: &str = "MMK_KSCHED_STREAM_PRIORITY";
    /// The completion poller's shortest sleep in us (1 to 10000; default 10): how soon the
    /// gate sees a completion, against how often the poller queries the driver.
    pub const POLL_US: &str = "MMK_KSCHED_POLL_US";
    /// Who records the completion-tracking events: `poller` (the default: the poller
    /// thread records one behind each stream's newest launches, and the launch path records
    /// none) or `launch` (the launching thread records one behind
    /// every launch; for measuring what that costs).
    pub const EVENTS: &str = "MMK_KSCHED_EVENTS";
}

/// What the interposer does to the priority of the streams a job creates
/// (`cuStreamCreate`, `cuStreamCreateWithPriority` and the runtime calls built on them).
///
/// Orion (5.2) runs the online job's kernels on high-priority streams so that the GPU's
/// block scheduler dispatches them ahead of waiting offline blocks. CUDA stream priorities
/// only order blocks waiting for an SM; they never preempt running blocks. Work on the
/// legacy default stream (stream 0) keeps the lowest priority: a program must use streams of
/// its own for this to reach its kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamPriority {
    /// Every stream gets the device's greatest priority, whatever the program asked.
    Greatest,
    /// Streams keep the priority the program asked for.
    Keep,
}

impl StreamPriority {
    /// Online jobs' streams go first; offline jobs keep theirs (0, the lowest, by default).
    pub fn default_for(class: Class) -> StreamPriority {
        match class {
            Class::Online => StreamPriority::Greatest,
            Class::Offline => StreamPriority::Keep,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StreamPriority::Greatest => "greatest",
            StreamPriority::Keep => "keep",
        }
    }
}

impl std::str::FromStr for StreamPriority {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<StreamPriority, UnknownName> {
        match s.trim() {
            "greatest" => Ok(StreamPriority::Greatest),
            "keep" => Ok(StreamPriority::Keep),
            other => Err(UnknownName::new(
                "stream priority",
                other,
                "greatest or keep",
            )),
        }
    }
}

/// A name (of a policy, a class, a priority) that is not one of those known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?} ({expected})")]
pub struct UnknownName {
    pub what: &'static str,
    pub name: String,
    /// The names that are known, as a phrase ("online or offline").
    pub expected: String,
}

impl UnknownName {
    pub fn new(what: &'static str, name: &str, expected: impl Into<String>) -> UnknownName {
        UnknownName {
            what,
            name: name.to_owned(),
            expected: expected.into(),
        }
    }
}

/// SMs a launch occupies: `ceil(blocks / blocks_per_sm)`, at most `sm_count`.
///
/// `blocks_per_sm` comes from the occupancy API; 0 means it is unknown, and then every block
/// is counted as needing an SM of its own (the pessimistic choice for a launch that waits).
pub fn sm_demand(blocks: u64, blocks_per_sm: u32, sm_count: u32) -> u32 {
    let per_sm = u64::from(blocks_per_sm.max(1));
    let need = blocks.div_ceil(per_sm);
    u32::try_from(need.min(u64::from(sm_count))).unwrap_or(sm_count)
}

#[cfg(test)]
mod tests {
    use super::{Class, StreamPriority, sm_demand};

    #[test]
    fn sm_demand_rounds_up_and_caps_at_the_partition() {
        assert_eq!(sm_demand(1, 8, 132), 1);
        assert_eq!(sm_demand(9, 8, 132), 2);
        assert_eq!(sm_demand(16, 8, 132), 2);
        assert_eq!(sm_demand(10_000, 4, 132), 132);
        assert_eq!(
            sm_demand(10, 0, 132),
            10,
            "unknown occupancy counts one block an SM"
        );
        assert_eq!(sm_demand(0, 4, 132), 0);
    }

    #[test]
    fn stream_priority_defaults_by_class_and_parses() {
        assert_eq!(
            StreamPriority::default_for(Class::Online),
            StreamPriority::Greatest
        );
        assert_eq!(
            StreamPriority::default_for(Class::Offline),
            StreamPriority::Keep
        );
        for p in [StreamPriority::Greatest, StreamPriority::Keep] {
            assert_eq!(p.as_str().parse::<StreamPriority>(), Ok(p));
        }
        let err = "high".parse::<StreamPriority>().unwrap_err().to_string();
        assert!(
            err.contains("\"high\"") && err.contains("greatest or keep"),
            "{err}"
        );
    }
}
