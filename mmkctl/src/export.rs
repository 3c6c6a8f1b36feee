//! `mmkctl partitions export --format mig-parted`: the node's MIG layout, current or after
//! a dry run, as a config for NVIDIA's MIG Partition Editor (`nvidia-mig-parted apply -f
//! FILE -c NAME`), for operators who apply layouts with NVIDIA's tools.
//!
//! mig-parted asks for a count of each profile per GPU and picks the placements itself;
//! mmkd reads whatever instances it finds (`mmkctl gpus`) and plans on them. GPUs with the
//! same layout share one entry. A GPU with MIG off is written `mig-enabled: false`, so
//! applying the config leaves it as it is.

use std::collections::BTreeMap;

use mmk_proto::v1;
use serde::Serialize;

/// Why a layout could not be exported.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExportError {
    #[error("the plan changes gpu {0}, which the node does not list")]
    NoSuchGpu(u32),
    #[error("the plan destroys instance {instance} of gpu {gpu}, which the node does not list")]
    NoSuchInstance { gpu: u32, instance: u32 },
    #[error("the plan has a step of unknown kind {0}")]
    UnknownStep(i32),
    #[error("--name {0:?}: 1 to 64 letters, digits, '-', '_' or '.'")]
    BadName(String),
}

/// One GPU's layout: its MIG mode and its instances (id, profile name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLayout {
    pub index: u32,
    pub mig_enabled: bool,
    pub instances: Vec<(u32, String)>,
}

/// The layout of every GPU as `ListPartitions` reports it.
pub fn current(resp: &v1::ListPartitionsResponse) -> Vec<GpuLayout> {
    resp.gpus
        .iter()
        .map(|g| GpuLayout {
            index: g.gpu_index,
            mig_enabled: g.mig_enabled,
            instances: if g.mig_enabled {
                g.partitions
                    .iter()
                    .map(|p| (p.instance_id, p.profile.clone()))
                    .collect()
            } else {
                Vec::new()
            },
        })
        .collect()
}

/// The layout after a dry run's steps, in their order. A step naming a GPU the layout
/// does not have is an error (the node changed between the two calls).
pub fn after(
    mut gpus: Vec<GpuLayout>,
    steps: &[v1::LayoutStep],
) -> Result<Vec<GpuLayout>, ExportError> {
    for s in steps {
        let Some(g) = gpus.iter_mut().find(|g| g.index == s.gpu_index) else {
            return Err(ExportError::NoSuchGpu(s.gpu_index));
        };
        match v1::layout_step::Kind::try_from(s.kind) {
            Ok(v1::layout_step::Kind::Create) => g.instances.push((0, s.profile.clone())),
            Ok(v1::layout_step::Kind::Destroy) => {
                let Some(at) = g.instances.iter().position(|(id, _)| *id == s.instance_id) else {
                    return Err(ExportError::NoSuchInstance {
                        gpu: s.gpu_index,
                        instance: s.instance_id,
                    });
                };
                g.instances.remove(at);
            }
            _ => return Err(ExportError::UnknownStep(s.kind)),
        }
    }
    Ok(gpus)
}

/// A mig-parted config file (`version: v1`).
#[derive(Debug, Serialize, PartialEq)]
pub struct MigParted {
    pub version: &'static str,
    #[serde(rename = "mig-configs")]
    pub mig_configs: BTreeMap<String, Vec<DeviceConfig>>,
}

/// One entry of a mig-parted config: these GPUs, their MIG mode and profile counts.
#[derive(Debug, Serialize, PartialEq)]
pub struct DeviceConfig {
    pub devices: Vec<u32>,
    #[serde(rename = "mig-enabled")]
    pub mig_enabled: bool,
    #[serde(rename = "mig-devices", skip_serializing_if = "Option::is_none")]
    pub mig_devices: Option<BTreeMap<String, u32>>,
}

/// The config named `name` that gives every GPU its layout.
pub fn mig_parted(gpus: &[GpuLayout], name: &str) -> MigParted {
    let mut entries: Vec<DeviceConfig> = Vec::new();
    for g in gpus {
        let mig_devices = g.mig_enabled.then(|| {
            let mut counts = BTreeMap::new();
            for (_, profile) in &g.instances {
                *counts.entry(profile.clone()).or_insert(0) += 1;
            }
            counts
        });
        match entries
            .iter_mut()
            .find(|e| e.mig_enabled == g.mig_enabled && e.mig_devices == mig_devices)
        {
            Some(e) => e.devices.push(g.index),
            None => entries.push(DeviceConfig {
                devices: vec![g.index],
                mig_enabled: g.mig_enabled,
                mig_devices,
            }),
        }
    }
    MigParted {
        version: "v1",
        mig_configs: BTreeMap::from([(name.to_owned(), entries)]),
    }
}

/// A config name mig-parted can select with `-c`: letters, digits, `-`, `_` and `.`.
pub fn check_name(name: &str) -> Result<(), ExportError> {
    if !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        Ok(())
    } else {
        Err(ExportError::BadName(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, mig: bool, instances: &[(u32, &str)]) -> GpuLayout {
        GpuLayout {
            index,
            mig_enabled: mig,
            instances: instances.iter().map(|(i, p)| (*i, p.to_string())).collect(),
        }
    }

    #[test]
    fn gpus_with_one_layout_share_an_entry_and_mig_off_is_kept_off() {
        let gpus = [
            gpu(0, true, &[(1, "3g.40gb"), (2, "1g.10gb"), (3, "1g.10gb")]),
            gpu(1, false, &[]),
            gpu(2, true, &[(5, "1g.10gb"), (1, "3g.40gb"), (9, "1g.10gb")]),
            gpu(3, true, &[]),
        ];
        let yaml = serde_saphyr::to_string(&mig_parted(&gpus, "mmk")).unwrap();
        let want = "\
version: v1
mig-configs:
  mmk:
  - devices:
    - 0
    - 2
    mig-enabled: true
    mig-devices:
      1g.10gb: 2
      3g.40gb: 1
  - devices:
    - 1
    mig-enabled: false
  - devices:
    - 3
    mig-enabled: true
    mig-devices: {}
";
        assert_eq!(yaml, want);
    }

    #[test]
    fn a_plan_is_applied_in_order_and_a_stale_one_is_refused() {
        let now = vec![gpu(0, true, &[(1, "7g.80gb")])];
        let step = |kind: v1::layout_step::Kind, profile: &str, instance_id: u32| v1::LayoutStep {
            kind: kind as i32,
            gpu_index: 0,
            profile: profile.into(),
            start_slice: 0,
            instance_id,
        };
        let steps = [
            step(v1::layout_step::Kind::Destroy, "7g.80gb", 1),
            step(v1::layout_step::Kind::Create, "4g.40gb", 0),
            step(v1::layout_step::Kind::Create, "3g.40gb", 0),
        ];
        let planned = after(now.clone(), &steps).unwrap();
        let names: Vec<&str> = planned[0]
            .instances
            .iter()
            .map(|(_, p)| p.as_str())
            .collect();
        assert_eq!(names, ["4g.40gb", "3g.40gb"]);
        let err = after(
            now.clone(),
            &[step(v1::layout_step::Kind::Destroy, "1g.10gb", 7)],
        )
        .unwrap_err();
        assert_eq!(
            err,
            ExportError::NoSuchInstance {
                gpu: 0,
                instance: 7
            }
        );
        let err = after(
            now,
            &[v1::LayoutStep {
                gpu_index: 3,
                ..steps[1].clone()
            }],
        )
        .unwrap_err();
        assert_eq!(err, ExportError::NoSuchGpu(3));
    }

    #[test]
    fn names_mig_parted_cannot_select_are_refused() {
        assert!(check_name("mmk-plan_1.2").is_ok());
        for bad in ["", "two words", "a/b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
