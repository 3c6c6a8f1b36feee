//! GPU backends: what the node has and the MIG instance operations, behind one trait.
//!
//! - [`sim::SimBackend`]: a simulated node built from the MIG catalog, with the driver's
//!   rules (placements, `IN_USE` on a busy instance) and reconfiguration latency;
//! - [`nvml::NvmlBackend`]: the real GPUs through NVML: it creates and destroys instances
//!   on the GPUs handed to mmkd (`--mig-gpus`) whose MIG mode the operator turned on, and
//!   never destroys an instance it did not create unless told to (`--mig-take-over`).
//!
//! Calls block (as driver calls do); async code calls them through `spawn_blocking`.

pub mod nvml;
pub mod sim;

use mmk_partitioner::{GpuState, Instance};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("gpu {gpu} does not exist")]
    NoSuchGpu { gpu: u32 },
    #[error("gpu {gpu} has MIG mode off; its layout cannot change")]
    MigDisabled { gpu: u32 },
    #[error("gpu {gpu}: cannot create profile {profile} at slice {start}: {why}")]
    InvalidPlacement {
        gpu: u32,
        profile: u32,
        start: u8,
        why: String,
    },
    #[error("gpu {gpu}: instance {instance} does not exist")]
    NoSuchInstance { gpu: u32, instance: u32 },
    #[error("gpu {gpu}: instance {instance} is in use")]
    InUse { gpu: u32, instance: u32 },
    #[error("the {backend} backend does not change MIG layouts")]
    ReadOnly { backend: &'static str },
    #[error("gpu {gpu} is not one whose layout mmkd may change (--mig-gpus)")]
    NotHanded { gpu: u32 },
    #[error(
        "gpu {gpu}: instance {instance} was not created by mmkd; it is used, not destroyed (--mig-take-over)"
    )]
    Foreign { gpu: u32, instance: u32 },
    #[error("gpu {gpu}: {what}: the driver refused it: {why}")]
    Refused {
        gpu: u32,
        what: String,
        why: &'static str,
    },
    #[error("nvml: {context}")]
    Nvml {
        context: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
}

pub type Result<T> = std::result::Result<T, BackendError>;

/// The GPUs of one node.
pub trait GpuBackend: Send + Sync + std::fmt::Debug {
    /// `sim` or `nvml`.
    fn kind(&self) -> &'static str;

    /// Every GPU with its model, MIG mode and current instances.
    fn gpus(&self) -> Result<Vec<GpuState>>;

    /// Creates a GPU instance (and its compute instance) of `profile_id` at memory slice
    /// `start`; returns it with the IDs the driver assigned.
    fn create_instance(&self, gpu: u32, profile_id: u32, start: u8) -> Result<Instance>;

    /// Destroys an instance. Fails with [`BackendError::InUse`] while a process uses it.
    fn destroy_instance(&self, gpu: u32, instance: u32) -> Result<()>;

    /// Tells the backend that a job process uses (or stopped using) an instance. Real
    /// drivers see processes themselves; the simulated node needs to be told.
    fn set_in_use(&self, _gpu: u32, _instance: u32, _in_use: bool) {}

    /// Tells the backend that mmkd created this instance (in an earlier run, by its
    /// journal), so that it may destroy it.
    fn adopt_as_own(&self, _gpu_uuid: &str, _instance: u32) {}

    /// GPU memory held by each process with a compute context, as (pid, bytes) summed
    /// over the node's GPUs; empty where the backend cannot tell (the simulated node).
    fn process_memory(&self) -> Vec<(u32, u64)> {
        Vec::new()
    }

    /// The share of each partition's DRAM bandwidth used since the last call (NVML GPM,
    /// Hopper and newer), as (GPU, GPU instance with MIG on, fraction 0..1); a partition
    /// appears from the second call on. Empty where the backend cannot tell (the simulated
    /// node, GPUs without GPM).
    fn dram_bandwidth(&self) -> Vec<(u32, Option<u32>, f64)> {
        Vec::new()
    }

    /// What mmkd does with this GPU's layout, for the log at start; `None` when there is
    /// nothing to say (the simulated node changes every layout).
    fn layout_note(&self, _gpu: &GpuState) -> Option<&'static str> {
        None
    }
}

/// The GPUs whose MIG layout mmkd may change (`--mig-gpus`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MigGpus {
    #[default]
    All,
    Listed(std::collections::BTreeSet<u32>),
}

/// A `--mig-gpus` entry that is not a GPU index.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a GPU index (all, none or I,J,...)")]
pub struct NotAGpuIndex(pub String);

impl MigGpus {
    /// `all`, `none` or GPU indices separated by commas.
    pub fn parse(text: &str) -> std::result::Result<MigGpus, NotAGpuIndex> {
        match text.trim() {
            "all" => Ok(MigGpus::All),
            "none" | "" => Ok(MigGpus::Listed(Default::default())),
            list => list
                .split(',')
                .map(|i| {
                    i.trim()
                        .parse::<u32>()
                        .map_err(|_| NotAGpuIndex(i.to_owned()))
                })
                .collect::<std::result::Result<_, _>>()
                .map(MigGpus::Listed),
        }
    }

    pub fn contains(&self, gpu: u32) -> bool {
        match self {
            MigGpus::All => true,
            MigGpus::Listed(set) => set.contains(&gpu),
        }
    }
}
