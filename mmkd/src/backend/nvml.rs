//! Real GPUs through NVML (nvml-wrapper), read-only: inventory, MIG mode, profiles and
//! their placements, and the instances that exist. mmk never toggles MIG mode.
//!
//! nvml-wrapper's `possible_placements` returns an empty list (it never sets the vector's
//! length, see shared/REFERENCE.md), and its safe API cannot list instances; those two
//! reads call the raw functions in this module's `raw` section, the only unsafe code here.

use std::collections::BTreeSet;

use mmk_partitioner::{GpuModel, GpuState, Instance, Profile, catalog};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::NVML_GPU_INSTANCE_PROFILE_COUNT;

use super::{BackendError, GpuBackend, Result};

/// NVML profile enums of the `+me` profiles (1_SLICE_REV1, 2_SLICE_REV1).
const MEDIA_EXTENSION_ENUMS: [u32; 2] = [7, 8];

#[derive(Debug)]
pub struct NvmlBackend {
    nvml: Nvml,
    /// What does not change while mmkd runs: each GPU's UUID and model with its profiles.
    static_gpus: Vec<(String, GpuModel)>,
}

fn nvml_err(context: impl Into<String>) -> impl FnOnce(NvmlError) -> BackendError {
    let context = context.into();
    move |source| BackendError::Nvml { context, source }
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1` and reads the GPUs. Fails when the library is missing or
    /// no GPU is found: the cue for `--backend auto` to use the simulated node.
    pub fn new() -> Result<NvmlBackend> {
        let nvml = Nvml::init().map_err(nvml_err("cannot load libnvidia-ml.so.1"))?;
        let count = nvml.device_count().map_err(nvml_err("device count"))?;
        if count == 0 {
            return Err(BackendError::NoSuchGpu { gpu: 0 });
        }
        let mut static_gpus = Vec::new();
        for i in 0..count {
            let d = nvml
                .device_by_index(i)
                .map_err(nvml_err(format!("gpu {i}")))?;
            let uuid = d.uuid().map_err(nvml_err(format!("gpu {i} uuid")))?;
            static_gpus.push((uuid, read_model(&nvml, &d, i)?));
        }
        Ok(NvmlBackend { nvml, static_gpus })
    }
}

/// Reads a GPU's model: memory, SMs, and the MIG profiles with their placements.
fn read_model(nvml: &Nvml, d: &Device<'_>, index: u32) -> Result<GpuModel> {
    let product_name = d.name().map_err(nvml_err(format!("gpu {index} name")))?;
    let memory_mib = d
        .memory_info()
        .map_err(nvml_err(format!("gpu {index} memory")))?
        .total
        / (1024 * 1024);
    let known = catalog::models()
        .into_iter()
        .find(|m| m.product_name == product_name);
    let sm_count = d
        .attributes()
        .map(|a| a.multiprocessor_count)
        .ok()
        .or_else(|| known.as_ref().map(|m| m.sm_count))
        .unwrap_or(0);

    let mut profiles = Vec::new();
    for profile_enum in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        let Ok(info) = d.profile_info(profile_enum) else {
            continue;
        };
        let placements = raw::possible_placements(nvml, d, info.id).unwrap_or_default();
        let memory_slices = placements.first().map_or(0, |p| p.size);
        let media_extensions = MEDIA_EXTENSION_ENUMS.contains(&profile_enum);
        let name = known
            .as_ref()
            .and_then(|m| m.profile(info.id))
            .map(|p| p.name.clone())
            .unwrap_or_else(|| {
                format!(
                    "{}g.{}gb{}",
                    info.slice_count,
                    info.memory_size_mb.div_ceil(1024),
                    if media_extensions { "+me" } else { "" }
                )
            });
        profiles.push(Profile {
            id: info.id,
            name,
            compute_slices: u8::try_from(info.slice_count).unwrap_or(u8::MAX),
            memory_slices,
            memory_mib: info.memory_size_mb,
            sm_count: info.multiprocessor_count,
            max_count: u8::try_from(info.instance_count).unwrap_or(u8::MAX),
            starts: placements.iter().map(|p| p.start).collect(),
            media_extensions,
        });
    }
    // NVML lists profiles by its enum; show them in the catalog's order when the model is
    // known, else by size.
    let rank = |p: &Profile| {
        known
            .as_ref()
            .and_then(|m| m.profiles.iter().position(|q| q.id == p.id))
            .unwrap_or(usize::MAX)
    };
    profiles.sort_by_key(|p| (rank(p), p.memory_mib, p.compute_slices, p.media_extensions));
    let compute_slices = profiles.iter().map(|p| p.compute_slices).max().unwrap_or(0);
    let memory_slices = profiles
        .iter()
        .flat_map(|p| {
            p.starts
                .iter()
                .map(move |s| s.saturating_add(p.memory_slices))
        })
        .max()
        .unwrap_or(0);
    Ok(GpuModel {
        key: known.map_or_else(|| "nvml".to_owned(), |m| m.key),
        product_name,
        memory_mib,
        sm_count,
        compute_slices,
        memory_slices,
        profiles,
        memory_source: "read through NVML".into(),
    })
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn gpus(&self) -> Result<Vec<GpuState>> {
        let mut out = Vec::with_capacity(self.static_gpus.len());
        for (i, (uuid, model)) in self.static_gpus.iter().enumerate() {
            let index = i as u32;
            let d = self
                .nvml
                .device_by_index(index)
                .map_err(nvml_err(format!("gpu {index}")))?;
            // A GPU without MIG support reports NotSupported: MIG is off.
            let mig_enabled = d.mig_mode().map(|m| m.current == 1).unwrap_or(false);
            let instances = if mig_enabled {
                let ids: BTreeSet<u32> = model.profiles.iter().map(|p| p.id).collect();
                raw::instances(&self.nvml, &d, &ids)?
            } else {
                Vec::new()
            };
            out.push(GpuState {
                index,
                uuid: uuid.clone(),
                model: model.clone(),
                mig_enabled,
                // This version does not create or destroy instances on real GPUs.
                layout_fixed: true,
                instances,
            });
        }
        Ok(out)
    }

    fn create_instance(&self, _gpu: u32, _profile_id: u32, _start: u8) -> Result<Instance> {
        Err(BackendError::ReadOnly { backend: "nvml" })
    }

    fn destroy_instance(&self, _gpu: u32, _instance: u32) -> Result<()> {
        Err(BackendError::ReadOnly { backend: "nvml" })
    }
}

/// The raw NVML calls that nvml-wrapper's safe API lacks or gets wrong.
mod raw {
    use std::collections::BTreeSet;
    use std::os::raw::c_uint;
    use std::ptr;

    use mmk_partitioner::{Instance, Placement};
    use nvml_wrapper::error::{NvmlError, nvml_try};
    use nvml_wrapper::{Device, Nvml};
    use nvml_wrapper_sys::bindings::{
        nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    };

    use super::{Result, nvml_err};

    /// The most instances of one profile a GPU can hold (seven 1g on 7-slice GPUs).
    const MAX_INSTANCES: usize = 8;

    fn missing(name: &str) -> NvmlError {
        NvmlError::FailedToLoadSymbol(name.to_owned())
    }

    pub fn possible_placements(
        nvml: &Nvml,
        d: &Device<'_>,
        profile_id: u32,
    ) -> Result<Vec<Placement>> {
        let f = nvml
            .lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref()
            .map_err(|_| missing("nvmlDeviceGetGpuInstancePossiblePlacements_v2"))
            .map_err(nvml_err("possible placements"))?;
        let mut buf = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; MAX_INSTANCES];
        let mut count: c_uint = MAX_INSTANCES as c_uint;
        // SAFETY: `handle` is a live device of this `nvml`; `buf` has room for `count`
        // entries and NVML writes at most `count`, updating it to the number written.
        let rc = unsafe { f(d.handle(), profile_id, buf.as_mut_ptr(), &mut count) };
        nvml_try(rc).map_err(nvml_err(format!("placements of profile {profile_id}")))?;
        Ok(buf[..(count as usize).min(MAX_INSTANCES)]
            .iter()
            .map(|p| Placement {
                start: u8::try_from(p.start).unwrap_or(u8::MAX),
                size: u8::try_from(p.size).unwrap_or(u8::MAX),
            })
            .collect())
    }

    /// The GPU instances of a GPU with MIG on, with the UUID of each one's MIG device.
    pub fn instances(
        nvml: &Nvml,
        d: &Device<'_>,
        profile_ids: &BTreeSet<u32>,
    ) -> Result<Vec<Instance>> {
        let lib = nvml.lib();
        let get = lib
            .nvmlDeviceGetGpuInstances
            .as_ref()
            .map_err(|_| missing("nvmlDeviceGetGpuInstances"))
            .map_err(nvml_err("list instances"))?;
        let info_of = lib
            .nvmlGpuInstanceGetInfo
            .as_ref()
            .map_err(|_| missing("nvmlGpuInstanceGetInfo"))
            .map_err(nvml_err("instance info"))?;
        // MIG device UUIDs by GPU instance ID.
        let mut uuids = std::collections::BTreeMap::new();
        if let Ok(gi_of) = lib.nvmlDeviceGetGpuInstanceId.as_ref() {
            for i in 0..d.mig_device_count().unwrap_or(0) {
                let Ok(m) = d.mig_device_by_index(i) else {
                    continue;
                };
                let mut gi: c_uint = 0;
                // SAFETY: `m` is a live MIG device handle of this `nvml`.
                let rc = unsafe { gi_of(m.handle(), &mut gi) };
                if let (Ok(()), Ok(uuid)) = (nvml_try(rc), m.uuid()) {
                    uuids.insert(gi, uuid);
                }
            }
        }
        let mut out = Vec::new();
        for &pid in profile_ids {
            let mut handles: [nvmlGpuInstance_t; MAX_INSTANCES] = [ptr::null_mut(); MAX_INSTANCES];
            let mut count: c_uint = 0;
            // SAFETY: `handles` has room for MAX_INSTANCES entries, the most one profile
            // can have on a GPU; NVML writes `count` of them.
            let rc = unsafe { get(d.handle(), pid, handles.as_mut_ptr(), &mut count) };
            if nvml_try(rc).is_err() {
                continue;
            }
            for h in handles.iter().take((count as usize).min(MAX_INSTANCES)) {
                // SAFETY: an all-zero nvmlGpuInstanceInfo_t is a valid value to overwrite.
                let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: `h` came from nvmlDeviceGetGpuInstances above.
                let rc = unsafe { info_of(*h, &mut info) };
                nvml_try(rc).map_err(nvml_err("instance info"))?;
                out.push(Instance {
                    id: info.id,
                    profile_id: info.profileId,
                    placement: Placement {
                        start: u8::try_from(info.placement.start).unwrap_or(u8::MAX),
                        size: u8::try_from(info.placement.size).unwrap_or(u8::MAX),
                    },
                    uuid: uuids.get(&info.id).cloned().unwrap_or_default(),
                });
            }
        }
        out.sort_by_key(|i| i.placement.start);
        Ok(out)
    }
}
