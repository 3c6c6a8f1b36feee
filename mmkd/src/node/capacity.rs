//! What the node's GPUs hold now, as the API and the metrics show it: each partition with
//! its active jobs, its MPS daemon and its gate, and the memory jobs could still use.

use std::collections::HashMap;

use mmk_core::{JobState, ServiceError};
use mmk_mps_control::DaemonInfo;
use mmk_partitioner::GpuState;

use super::Node;
use crate::job::JobRecord;
use crate::ksched::GateView;
use crate::mps::instance_key;

/// One GPU and its partitions.
#[derive(Debug, Clone)]
pub struct GpuView {
    pub gpu: GpuState,
    pub partitions: Vec<PartitionView>,
}

/// One partition: a MIG instance, or the whole GPU with MIG off.
#[derive(Debug, Clone)]
pub struct PartitionView {
    /// The MIG instance's ID; `None` for a whole GPU.
    pub instance: Option<u32>,
    /// The partition's key (`mps::instance_key`): its MPS daemon's and its gate's name.
    pub key: String,
    pub device_uuid: String,
    /// The MIG profile's name, or `whole`.
    pub profile: String,
    pub profile_id: u32,
    pub start_slice: u8,
    pub size_slices: u8,
    pub memory_mib: u64,
    pub sm_count: u32,
    /// The active jobs in it, as indices into the jobs it was built from.
    pub jobs: Vec<usize>,
    /// What its jobs asked for.
    pub used_memory_mib: u64,
    pub mps: Option<DaemonInfo>,
    pub gate: Option<GateView>,
}

impl Node {
    /// The jobs that hold a place on a GPU: starting or running.
    pub async fn active_jobs(&self) -> Result<Vec<JobRecord>, ServiceError> {
        self.list(&[JobState::Starting, JobState::Running], None)
            .await
    }

    /// The GPUs' partitions now, with `active` (from [`Node::active_jobs`]) placed in
    /// them, their MPS daemons and their gates.
    pub async fn partitions(&self, active: &[JobRecord]) -> Result<Vec<GpuView>, ServiceError> {
        let gpus = self.gpus().await?;
        let daemons = self.mps().daemons().await;
        let gates = self
            .gates(gpus.iter().flat_map(partition_keys).collect())
            .await;
        Ok(gpus
            .into_iter()
            .map(|gpu| GpuView {
                partitions: partitions_of(&gpu, active, &daemons, &gates),
                gpu,
            })
            .collect())
    }
}

/// The keys of a GPU's partitions (`mps::instance_key`), for their gates.
fn partition_keys(g: &GpuState) -> Vec<String> {
    if !g.mig_enabled {
        return vec![instance_key(g.index, None)];
    }
    g.instances
        .iter()
        .map(|i| instance_key(g.index, Some(i.id)))
        .collect()
}

/// `g`'s partitions with the jobs of `jobs` that are placed in them.
pub fn partitions_of(
    g: &GpuState,
    jobs: &[JobRecord],
    daemons: &[DaemonInfo],
    gates: &HashMap<String, GateView>,
) -> Vec<PartitionView> {
    let jobs_in = |profile_id: Option<u32>, start: u8| -> Vec<usize> {
        jobs.iter()
            .enumerate()
            .filter(|(_, j)| {
                j.assignment.as_ref().is_some_and(|a| {
                    a.slot.gpu == g.index
                        && a.slot.profile_id == profile_id
                        && a.slot.start == start
                })
            })
            .map(|(i, _)| i)
            .collect()
    };
    let used = |js: &[usize]| js.iter().map(|&i| jobs[i].spec.gpu_memory_mib).sum();
    let mps = |device: &str| {
        daemons
            .iter()
            .find(|d| d.partition.device == device)
            .cloned()
    };
    let view = |instance: Option<u32>, js: Vec<usize>| {
        let key = instance_key(g.index, instance);
        PartitionView {
            instance,
            gate: gates.get(&key).cloned(),
            key,
            used_memory_mib: used(&js),
            jobs: js,
            device_uuid: String::new(),
            profile: String::new(),
            profile_id: 0,
            start_slice: 0,
            size_slices: 0,
            memory_mib: 0,
            sm_count: 0,
            mps: None,
        }
    };
    if !g.mig_enabled {
        return vec![PartitionView {
            device_uuid: g.uuid.clone(),
            profile: "whole".into(),
            size_slices: g.model.memory_slices,
            memory_mib: g.model.memory_mib,
            sm_count: g.model.sm_count,
            mps: mps(&g.uuid),
            ..view(None, jobs_in(None, 0))
        }];
    }
    g.instances
        .iter()
        .map(|i| {
            let p = g.model.profile(i.profile_id);
            PartitionView {
                device_uuid: i.uuid.clone(),
                profile: p.map_or_else(|| i.profile_id.to_string(), |p| p.name.clone()),
                profile_id: i.profile_id,
                start_slice: i.placement.start,
                size_slices: i.placement.size,
                memory_mib: p.map_or(0, |p| p.memory_mib),
                sm_count: p.map_or(0, |p| p.sm_count),
                mps: mps(&i.uuid),
                ..view(Some(i.id), jobs_in(Some(i.profile_id), i.placement.start))
            }
        })
        .collect()
}

/// Memory slices no instance holds.
pub fn free_slices(g: &GpuState) -> u32 {
    if !g.mig_enabled {
        return 0;
    }
    let used: u32 = g
        .instances
        .iter()
        .map(|i| u32::from(i.placement.size))
        .sum();
    u32::from(g.model.memory_slices).saturating_sub(used)
}

/// GPU memory that jobs could still use on `g`: what the partitions' jobs leave, plus the
/// free memory slices. GetNode and WatchCapacity both report this.
pub fn free_memory_mib(g: &GpuState, jobs: &[JobRecord]) -> u64 {
    let free_in_partitions: u64 = partitions_of(g, jobs, &[], &HashMap::new())
        .iter()
        .map(|p| p.memory_mib.saturating_sub(p.used_memory_mib))
        .sum();
    let slice_mib = g
        .model
        .profiles
        .iter()
        .filter(|p| p.memory_slices == 1)
        .map(|p| p.memory_mib)
        .max()
        .unwrap_or(0);
    free_in_partitions + u64::from(free_slices(g)) * slice_mib
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mps::partition_key;
    use mmk_partitioner::Slot;
    use mmk_partitioner::layout::{Instance, Placement};

    #[test]
    fn partitions_are_looked_up_by_the_keys_their_gates_are_made_with() {
        let node = mmk_partitioner::mix::empty_node("a100-80gb", 2).expect("a100-80gb");
        let mut whole = node.gpus[1].clone();
        whole.mig_enabled = false;
        let slot = Slot {
            gpu: 1,
            start: 0,
            profile_id: None,
        };
        assert_eq!(partition_keys(&whole), [partition_key(&slot, 0)]);
        let views = partitions_of(&whole, &[], &[], &HashMap::new());
        assert_eq!(views[0].key, partition_key(&slot, 0));

        let mut mig = node.gpus[0].clone();
        mig.instances = vec![Instance {
            id: 5,
            profile_id: 9,
            placement: Placement { start: 4, size: 4 },
            uuid: "MIG-5".into(),
        }];
        let slot = Slot {
            gpu: 0,
            start: 4,
            profile_id: Some(9),
        };
        assert_eq!(partition_keys(&mig), [partition_key(&slot, 5)]);
        let views = partitions_of(&mig, &[], &[], &HashMap::new());
        assert_eq!(views[0].key, partition_key(&slot, 5));
    }
}
