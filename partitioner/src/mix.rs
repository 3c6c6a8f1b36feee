//! Fixed scenarios for benchmarks and tests: an empty node, and a deterministic job mix
//! from the workload table.

use mmk_core::{JobClass, workload};

use crate::catalog;
use crate::layout::GpuState;
use crate::model::JobProfile;
use crate::plan::{JobDemand, NodeState};

/// `gpus` GPUs of the catalog model `key` with MIG on and no instances, as the simulated
/// node starts; `None` for a model the catalog does not have.
pub fn empty_node(key: &str, gpus: u32) -> Option<NodeState> {
    let model = catalog::model(key)?;
    Some(NodeState {
        gpus: (0..gpus)
            .map(|i| GpuState {
                index: i,
                uuid: format!("GPU-{i}"),
                model: model.clone(),
                mig_enabled: true,
                layout_fixed: false,
                instances: vec![],
            })
            .collect(),
        calm_arrivals: 0,
    })
}

/// `n` waiting jobs cycling through the workload table: inference workloads are online
/// (with an SLO of three times their solo latency) two times in three, the rest offline.
pub fn table_iii_mix(n: usize) -> Vec<JobDemand> {
    let ws = workload::WORKLOADS;
    (0..n)
        .map(|i| {
            let w = &ws[(i * 5 + 3) % ws.len()];
            let class = if w.solo_latency_ms.is_some() && i % 3 != 2 {
                JobClass::Online
            } else {
                JobClass::Offline
            };
            let mut j = JobDemand::waiting(i as u64 + 1, class, w.nominal_memory_mib);
            j.profile = JobProfile {
                class,
                sm_demand: w.sm_demand,
                bw_demand: w.bw_demand,
                solo_latency_ms: w.solo_latency_ms,
            };
            if class == JobClass::Online {
                j.slo_ms = w.solo_latency_ms.map(|l| (l * 3.0).ceil() as u64);
            }
            j
        })
        .collect()
}
