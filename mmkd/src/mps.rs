//! MPS in mmkd: the supervisor from `mmk-mps-control` behind async calls, and how a job's
//! partition maps to its daemon.

use std::path::PathBuf;
use std::sync::Arc;

use mmk_mps_control::{DaemonInfo, HealthEvent, Partition, Supervisor};
use mmk_partitioner::{GpuState, Slot};

/// The argument that makes `mmkd` run as the fake MPS control program
/// (`mmkd fake-mps-control -d`, ...); see `mmk_mps_control::fake`.
pub const FAKE_MPS_ARG: &str = "fake-mps-control";

/// How long after an MPS fault a failing job's exit is said to follow it.
const TROUBLE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a partition's MPS control daemon is not there for a job.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("the MPS control daemon of {partition} cannot start")]
    Start {
        partition: String,
        #[source]
        source: mmk_mps_control::MpsError,
    },
    #[error("the MPS supervisor failed")]
    Task(#[source] tokio::task::JoinError),
}

/// The node's MPS daemons, or none when MPS is off.
#[derive(Debug, Clone, Default)]
pub struct Mps {
    sup: Option<Arc<Supervisor>>,
    /// How often daemons are checked.
    every: std::time::Duration,
}

impl Mps {
    pub fn off() -> Mps {
        Mps::default()
    }

    /// Daemons under `sup`, checked every `every`.
    pub fn new(sup: Supervisor, every: std::time::Duration) -> Mps {
        Mps {
            sup: Some(Arc::new(sup)),
            every,
        }
    }

    pub fn check_interval(&self) -> std::time::Duration {
        self.every
    }

    pub fn enabled(&self) -> bool {
        self.sup.is_some()
    }

    /// Starts the partition's daemon unless it runs; returns its pipe directory, which
    /// the job gets as `CUDA_MPS_PIPE_DIRECTORY` (`None` when MPS is off).
    pub async fn ensure(&self, p: Partition) -> Result<Option<PathBuf>, PartitionError> {
        let Some(sup) = self.sup.clone() else {
            return Ok(None);
        };
        tokio::task::spawn_blocking(move || {
            sup.ensure(&p)
                .map(|_| Some(sup.dirs(&p.key).pipe))
                .map_err(|source| PartitionError::Start {
                    partition: p.label.clone(),
                    source,
                })
        })
        .await
        .map_err(PartitionError::Task)?
    }

    /// Quits a partition's daemon (its MIG instance is about to be destroyed).
    pub async fn stop(&self, key: String) {
        if let Some(sup) = self.sup.clone() {
            let _ = tokio::task::spawn_blocking(move || sup.stop(&key)).await;
        }
    }

    pub async fn stop_all(&self) {
        if let Some(sup) = self.sup.clone() {
            let _ = tokio::task::spawn_blocking(move || sup.stop_all()).await;
        }
    }

    pub async fn check(&self) -> Vec<HealthEvent> {
        match self.sup.clone() {
            Some(sup) => tokio::task::spawn_blocking(move || sup.check())
                .await
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// Stops the daemons a crashed mmkd left; returns their partition keys.
    pub async fn cleanup_orphans(&self) -> Vec<String> {
        match self.sup.clone() {
            Some(sup) => tokio::task::spawn_blocking(move || sup.cleanup_orphans())
                .await
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// What is or recently was wrong with the MPS daemon of a job's partition (see
    /// `Supervisor::trouble`).
    /// (Off the runtime: a health check may hold the supervisor while it runs commands.)
    pub async fn trouble(&self, a: &crate::job::Assignment) -> Option<String> {
        let sup = self.sup.clone()?;
        let key = partition_key(&a.slot, a.instance_id);
        tokio::task::spawn_blocking(move || sup.trouble(&key, TROUBLE_WINDOW))
            .await
            .ok()
            .flatten()
    }

    /// The daemons that run now (off the runtime, as `trouble`).
    pub async fn daemons(&self) -> Vec<DaemonInfo> {
        match self.sup.clone() {
            Some(sup) => tokio::task::spawn_blocking(move || sup.daemons())
                .await
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }
}

/// The short key of a partition: `g0` for a whole GPU, `g0i5` for GPU instance 5 of
/// GPU 0. It names the daemon's directory under `DATA_DIR/mps/`.
pub fn partition_key(slot: &Slot, instance_id: u32) -> String {
    instance_key(slot.gpu, slot.profile_id.map(|_| instance_id))
}

/// [`partition_key`] from a GPU's index and its GPU instance's ID (`None`: the whole GPU,
/// MIG off).
pub fn instance_key(gpu: u32, instance_id: Option<u32>) -> String {
    match instance_id {
        None => format!("g{gpu}"),
        Some(id) => format!("g{gpu}i{id}"),
    }
}

/// The MPS view of a job's partition.
pub fn partition(gpus: &[GpuState], a: &crate::job::Assignment) -> Partition {
    let memory_mib =
        gpus.iter()
            .find(|g| g.index == a.slot.gpu)
            .map_or(0, |g| match a.slot.profile_id {
                Some(pid) => g.model.profile(pid).map_or(0, |p| p.memory_mib),
                None => g.model.memory_mib,
            });
    Partition {
        key: partition_key(&a.slot, a.instance_id),
        label: format!("gpu{}/{}@{}", a.slot.gpu, a.profile, a.slot.start),
        device: a.device_uuid.clone(),
        memory_mib,
    }
}
