//! The records mmkd keeps: jobs as stored, their assignments and owners, the changes a
//! transition makes, events, MIG layout steps and instances. The node store
//! ([`crate::store`]) reads and writes them; the node, the runner and the gRPC layer use
//! them.

use mmk_core::{JobSpec, JobState};
use mmk_partitioner::{Instance, Slot};

/// Where a job runs: the partition and the MPS share the planner gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub slot: Slot,
    pub gpu_uuid: String,
    /// Driver's GPU instance ID; 0 for a whole GPU.
    pub instance_id: u32,
    /// What CUDA_VISIBLE_DEVICES names.
    pub device_uuid: String,
    /// MIG profile name, or "whole".
    pub profile: String,
    pub mps_share: u8,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub id: u64,
    pub spec: JobSpec,
    pub state: JobState,
    pub reason: String,
    pub submitted_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub updated_at: i64,
    pub assignment: Option<Assignment>,
    pub exit_code: Option<i32>,
    /// Runs started after the first: restarts after a failure or a daemon restart, and
    /// moves. It tells the runs of a job apart.
    pub restarts: u32,
    /// How many of the restarts were moves (not counted against the restart policy).
    pub moves: u32,
    pub pid: Option<u32>,
    /// Who submitted the job, when known.
    pub owner: Option<Owner>,
    /// Who cancelled the job or released its allocation.
    pub ended_by: Option<u32>,
}

/// A user and group, from the submitting connection's peer credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl JobRecord {
    /// Restarts that count against the restart policy (moves do not).
    pub fn failure_restarts(&self) -> u32 {
        self.restarts.saturating_sub(self.moves)
    }
}

/// What a transition changes besides the state and the reason.
#[derive(Debug, Default, Clone)]
pub struct Change {
    pub assignment: Option<Assignment>,
    pub exit_code: Option<i32>,
    pub pid: Option<u32>,
    /// Count one more restart (a requeue after failure or daemon restart).
    pub restart: bool,
    /// Count one more restart that is a move.
    pub moved: bool,
    /// Who ended the job (a cancel or a release): their uid.
    pub ended_by: Option<u32>,
}

/// An event row: a state change of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub seq: u64,
    pub job_id: u64,
    pub state: JobState,
    pub reason: String,
    pub at: i64,
}

/// A MIG layout step as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    pub id: i64,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    /// `create` or `destroy`.
    pub kind: String,
    pub profile_id: u32,
    pub start: u8,
    pub instance_id: Option<u32>,
}

/// A recorded GPU instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRecord {
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub instance: Instance,
}
