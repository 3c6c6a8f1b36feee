//! Real GPUs through NVML (nvml-wrapper): inventory, MIG mode, profiles and their
//! placements, the instances that exist, and creating and destroying instances. mmk never
//! toggles MIG mode: that is the operator's (docs/mmkd.md, "MIG on real GPUs").
//!
//! A GPU's layout changes only when its MIG mode is on, it is one of `--mig-gpus`, and every
//! instance on it was created by mmkd (this run, or an earlier one by its journal:
//! [`GpuBackend::adopt_as_own`]) or `--mig-take-over` is set; otherwise mmkd places jobs in
//! the instances it finds and changes nothing there.
//!
//! nvml-wrapper's `possible_placements` returns an empty list (it never sets the vector's
//! length, see docs/reference.md), and its safe API cannot list, create or destroy
//! instances; those calls are the raw functions in this module's `raw` section, which with
//! the GPM samples kept between two readings (`gpm_sample`) is the only unsafe code here.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

use mmk_partitioner::{GpuModel, GpuState, Instance, Profile, catalog};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    NVML_GPU_INSTANCE_PROFILE_COUNT,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES as INSUFFICIENT_RESOURCES,
};

use super::MigGpus;
use super::{BackendError, GpuBackend, Result};

/// NVML profile enums of the `+me` profiles (1_SLICE_REV1, 2_SLICE_REV1).
const MEDIA_EXTENSION_ENUMS: [u32; 2] = [7, 8];

#[derive(Debug)]
pub struct NvmlBackend {
    nvml: Nvml,
    /// What does not change while mmkd runs: each GPU's UUID and model with its profiles.
    static_gpus: Vec<(String, GpuModel)>,
    /// The GPUs whose layout mmkd may change.
    mig_gpus: MigGpus,
    /// Instances mmkd did not create may be destroyed too.
    take_over: bool,
    /// Instances mmkd created: (GPU UUID, GPU instance ID).
    own: Mutex<HashSet<(String, u32)>>,
    /// GPU and start slice of each instance mmkd is creating now: until it is recorded as
    /// mmkd's, a read of the layout that finds it must not take it for another's.
    creating: Mutex<HashSet<(String, u8)>>,
    /// The GPM samples [`GpuBackend::dram_bandwidth`] compares against.
    gpm: Mutex<GpmSamples>,
}

/// Each partition's last GPM sample, as the driver's handle, by (GPU, GPU instance with
/// MIG on); and whether each GPU has GPM (asked once).
#[derive(Debug, Default)]
struct GpmSamples {
    last: HashMap<(u32, Option<u32>), usize>,
    supported: HashMap<u32, bool>,
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        let samples = self
            .gpm
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, handle) in samples.last.drain() {
            // SAFETY: a sample of this `nvml`, kept by `into_handle` and freed only here.
            drop(unsafe { gpm_sample(&self.nvml, handle) });
        }
    }
}

/// The sample behind a handle that `GpmSample::into_handle` gave; dropping it frees it.
///
/// # Safety
/// `handle` came from `into_handle` on a sample of `nvml` and has not been freed.
unsafe fn gpm_sample(nvml: &Nvml, handle: usize) -> nvml_wrapper::gpm::GpmSample<'_> {
    // SAFETY: as the caller promises.
    unsafe {
        nvml_wrapper::gpm::GpmSample::from_handle(
            nvml,
            handle as nvml_wrapper_sys::bindings::nvmlGpmSample_t,
        )
    }
}

fn nvml_err(context: impl Into<String>) -> impl FnOnce(NvmlError) -> BackendError {
    let context = context.into();
    move |source| BackendError::Nvml { context, source }
}

/// What an NVML refusal of an instance operation means: a busy instance, one that is gone,
/// a placement the driver will not take, or a refusal of the node's (permissions, support)
/// each become the backend's error kind; anything else stays an NVML error (the driver
/// failing).
fn refusal(
    gpu: u32,
    instance: Option<u32>,
    what: String,
) -> impl FnOnce(NvmlError) -> BackendError {
    move |source| match (&source, instance) {
        (NvmlError::InUse, Some(instance)) => BackendError::InUse { gpu, instance },
        (NvmlError::NotFound, Some(instance)) => BackendError::NoSuchInstance { gpu, instance },
        // nvml-wrapper has no variant of its own for NVML_ERROR_INSUFFICIENT_RESOURCES.
        (NvmlError::UnexpectedVariant(INSUFFICIENT_RESOURCES), _) => BackendError::Refused {
            gpu,
            what,
            why: "insufficient resources (the slices are taken)",
        },
        (NvmlError::InvalidArg, _) => BackendError::Refused {
            gpu,
            what,
            why: "invalid argument (not a placement of the profile)",
        },
        (NvmlError::NoPermission, _) => BackendError::Refused {
            gpu,
            what,
            why: "no permission (mmkd must run as root to change MIG layouts)",
        },
        (NvmlError::NotSupported, _) => BackendError::Refused {
            gpu,
            what,
            why: "not supported (MIG mode off, or a GPU without MIG)",
        },
        _ => BackendError::Nvml {
            context: format!("gpu {gpu}: {what}"),
            source,
        },
    }
}

impl NvmlBackend {
    /// Loads NVML (`lib`, else `libnvidia-ml.so.1`) and reads the GPUs. Fails when the
    /// library is missing or no GPU is found: the cue for `--backend auto` to use the
    /// simulated node.
    pub fn new(lib: Option<&Path>, mig_gpus: MigGpus, take_over: bool) -> Result<NvmlBackend> {
        let nvml = match lib {
            Some(path) => Nvml::builder()
                .lib_path(path.as_os_str())
                .init()
                .map_err(nvml_err(format!("cannot load {}", path.display())))?,
            None => Nvml::init().map_err(nvml_err("cannot load libnvidia-ml.so.1"))?,
        };
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
        Ok(NvmlBackend {
            nvml,
            static_gpus,
            mig_gpus,
            take_over,
            own: Mutex::new(HashSet::new()),
            creating: Mutex::new(HashSet::new()),
            gpm: Mutex::default(),
        })
    }

    fn uuid(&self, gpu: u32) -> Result<&str> {
        self.static_gpus
            .get(gpu as usize)
            .map(|(u, _)| u.as_str())
            .ok_or(BackendError::NoSuchGpu { gpu })
    }

    fn is_own(&self, gpu_uuid: &str, instance: u32) -> bool {
        self.own
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&(gpu_uuid.to_owned(), instance))
    }

    /// Whether `instance` is one mmkd is creating now (not yet recorded as its own).
    fn being_created(&self, gpu_uuid: &str, instance: &Instance) -> bool {
        self.creating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&(gpu_uuid.to_owned(), instance.placement.start))
    }

    /// [`GpuBackend::create_instance`] once the GPU is known to be handed to mmkd.
    fn create_at(
        &self,
        gpu: u32,
        d: &Device<'_>,
        profile_id: u32,
        start: u8,
        size: u8,
        what: String,
    ) -> Result<Instance> {
        let gi = raw::create_gpu_instance(&self.nvml, d, profile_id, start, size)
            .map_err(refusal(gpu, None, what.clone()))?;
        let info = match raw::gpu_instance_info(&self.nvml, gi) {
            Ok(info) => info,
            Err(e) => {
                let _ = raw::destroy_gpu_instance(&self.nvml, gi);
                return Err(refusal(gpu, None, what)(e));
            }
        };
        if let Err(e) = raw::create_compute_instance(&self.nvml, gi) {
            let _ = raw::destroy_gpu_instance(&self.nvml, gi);
            return Err(refusal(gpu, None, format!("{what}: its compute instance"))(
                e,
            ));
        }
        self.own
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((self.uuid(gpu)?.to_owned(), info.id));
        Ok(Instance {
            id: info.id,
            profile_id: info.profile_id,
            placement: info.placement,
            uuid: self.mig_uuid(d, info.id),
        })
    }

    /// Whether mmkd may change this GPU's layout, given what is on it.
    fn changeable(&self, gpu: u32, mig_enabled: bool, instances: &[Instance]) -> bool {
        let Ok(uuid) = self.uuid(gpu) else {
            return false;
        };
        mig_enabled
            && self.mig_gpus.contains(gpu)
            && (self.take_over
                || instances
                    .iter()
                    .all(|i| self.is_own(uuid, i.id) || self.being_created(uuid, i)))
    }

    fn device(&self, gpu: u32) -> Result<Device<'_>> {
        self.uuid(gpu)?;
        self.nvml
            .device_by_index(gpu)
            .map_err(nvml_err(format!("gpu {gpu}")))
    }

    /// A GPU whose layout may change: MIG on and handed to mmkd.
    fn check_handed(&self, gpu: u32, d: &Device<'_>) -> Result<()> {
        if !self.mig_gpus.contains(gpu) {
            return Err(BackendError::NotHanded { gpu });
        }
        let on = d.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        if !on {
            return Err(BackendError::MigDisabled { gpu });
        }
        Ok(())
    }

    /// The UUID of the MIG device of GPU instance `id`, if NVML lists one.
    fn mig_uuid(&self, d: &Device<'_>, id: u32) -> String {
        raw::mig_uuids(&self.nvml, d)
            .into_iter()
            .find(|(gi, _)| *gi == id)
            .map(|(_, u)| u)
            .unwrap_or_default()
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
                layout_fixed: !self.changeable(index, mig_enabled, &instances),
                instances,
            });
        }
        Ok(out)
    }

    /// A GPU instance at the placement, then its compute instance spanning it; if the
    /// compute instance cannot be made, the GPU instance goes again.
    fn create_instance(&self, gpu: u32, profile_id: u32, start: u8) -> Result<Instance> {
        let d = self.device(gpu)?;
        self.check_handed(gpu, &d)?;
        let what = format!("create profile {profile_id} at slice {start}");
        let size = self
            .static_gpus
            .get(gpu as usize)
            .and_then(|(_, m)| m.profile(profile_id))
            .map(|p| p.memory_slices)
            .ok_or_else(|| BackendError::InvalidPlacement {
                gpu,
                profile: profile_id,
                start,
                why: "the GPU has no such profile".into(),
            })?;
        let creating = (self.uuid(gpu)?.to_owned(), start);
        self.creating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(creating.clone());
        let made = self.create_at(gpu, &d, profile_id, start, size, what);
        self.creating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&creating);
        made
    }

    /// Its compute instances, then the GPU instance. A busy one (a process on it) is
    /// `InUse` and stays; one mmkd did not create stays unless `--mig-take-over`.
    fn destroy_instance(&self, gpu: u32, instance: u32) -> Result<()> {
        let d = self.device(gpu)?;
        self.check_handed(gpu, &d)?;
        let uuid = self.uuid(gpu)?.to_owned();
        if !self.take_over && !self.is_own(&uuid, instance) {
            return Err(BackendError::Foreign { gpu, instance });
        }
        let what = format!("destroy instance {instance}");
        let gi = raw::gpu_instance_by_id(&self.nvml, &d, instance).map_err(refusal(
            gpu,
            Some(instance),
            what.clone(),
        ))?;
        for ci in raw::compute_instances(&self.nvml, gi).map_err(refusal(
            gpu,
            Some(instance),
            what.clone(),
        ))? {
            raw::destroy_compute_instance(&self.nvml, ci).map_err(refusal(
                gpu,
                Some(instance),
                what.clone(),
            ))?;
        }
        raw::destroy_gpu_instance(&self.nvml, gi).map_err(refusal(gpu, Some(instance), what))?;
        self.own
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&(uuid, instance));
        Ok(())
    }

    /// Claims an instance mmkd made in an earlier run; one whose compute instance a crash
    /// kept from being made gets it now.
    fn adopt_as_own(&self, gpu_uuid: &str, instance: u32) {
        self.own
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((gpu_uuid.to_owned(), instance));
        let Some(gpu) = self.static_gpus.iter().position(|(u, _)| u == gpu_uuid) else {
            return;
        };
        let gpu = gpu as u32;
        let finish = || -> std::result::Result<bool, NvmlError> {
            let d = self.nvml.device_by_index(gpu)?;
            let gi = raw::gpu_instance_by_id(&self.nvml, &d, instance)?;
            if !raw::compute_instances(&self.nvml, gi)?.is_empty() {
                return Ok(false);
            }
            raw::create_compute_instance(&self.nvml, gi)?;
            Ok(true)
        };
        match finish() {
            Ok(true) => tracing::info!(
                gpu,
                instance,
                "made the compute instance of a GPU instance mmkd created before it stopped"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                gpu,
                instance,
                error = %e,
                "cannot make the compute instance of a GPU instance mmkd created; jobs do not go there"
            ),
        }
    }

    /// Per process, the memory NVML reports: on a GPU with MIG on, from each MIG device
    /// (the parent does not count memory per instance), else from the GPU; from the lists
    /// of compute processes and of MPS clients (jobs run as MPS clients, which the first
    /// list may show only as their MPS server), a process in both counted once.
    fn process_memory(&self) -> Vec<(u32, u64)> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let mut by_pid: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        let mut add = |d: &Device<'_>| {
            let mut here: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
            let lists = [
                d.running_compute_processes().unwrap_or_default(),
                d.mps_running_compute_processes().unwrap_or_default(),
            ];
            for p in lists.into_iter().flatten() {
                if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                    let e = here.entry(p.pid).or_default();
                    *e = (*e).max(bytes);
                }
            }
            for (pid, bytes) in here {
                let e = by_pid.entry(pid).or_default();
                *e = e.saturating_add(bytes);
            }
        };
        for index in 0..self.static_gpus.len() as u32 {
            let Ok(d) = self.nvml.device_by_index(index) else {
                continue;
            };
            if d.mig_mode().map(|m| m.current == 1).unwrap_or(false) {
                for i in 0..d.mig_device_count().unwrap_or(0) {
                    if let Ok(m) = d.mig_device_by_index(i) {
                        add(&m);
                    }
                }
            } else {
                add(&d);
            }
        }
        by_pid.into_iter().collect()
    }

    /// GPM's DRAM bandwidth use of each GPU (MIG off) or GPU instance (MIG on) between
    /// this call's sample and the last one's.
    fn dram_bandwidth(&self) -> Vec<(u32, Option<u32>, f64)> {
        use nvml_wrapper::enums::gpm::GpmMetricId;
        let mut samples = self
            .gpm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for index in 0..self.static_gpus.len() as u32 {
            let Ok(d) = self.nvml.device_by_index(index) else {
                continue;
            };
            let supported = *samples
                .supported
                .entry(index)
                .or_insert_with(|| d.gpm_support().unwrap_or(false));
            if !supported {
                continue;
            }
            let parts: Vec<Option<u32>> = if d.mig_mode().map(|m| m.current == 1).unwrap_or(false) {
                raw::mig_uuids(&self.nvml, &d)
                    .into_iter()
                    .map(|(gi, _)| gi)
                    .collect::<BTreeSet<u32>>()
                    .into_iter()
                    .map(Some)
                    .collect()
            } else {
                vec![None]
            };
            for part in parts {
                let sample = match part {
                    None => d.gpm_sample(),
                    Some(gi) => d.gpm_mig_sample(gi),
                };
                let Ok(sample) = sample else {
                    continue;
                };
                let key = (index, part);
                seen.insert(key);
                if let Some(handle) = samples.last.remove(&key) {
                    // SAFETY: stored below by `into_handle`, not freed since.
                    let before = unsafe { gpm_sample(&self.nvml, handle) };
                    let got = nvml_wrapper::gpm::gpm_metrics_get(
                        &self.nvml,
                        &before,
                        &sample,
                        &[GpmMetricId::DramBwUtil],
                    );
                    if let Ok(got) = got
                        && let Some(Ok(m)) = got.first()
                        && m.value.is_finite()
                    {
                        out.push((index, part, (m.value / 100.0).clamp(0.0, 1.0)));
                    }
                }
                samples.last.insert(key, sample.into_handle() as usize);
            }
        }
        // A partition gone (its instance destroyed): its sample goes too.
        let gone: Vec<(u32, Option<u32>)> = samples
            .last
            .keys()
            .filter(|k| !seen.contains(k))
            .copied()
            .collect();
        for key in gone {
            if let Some(handle) = samples.last.remove(&key) {
                // SAFETY: stored by `into_handle`, not freed since.
                drop(unsafe { gpm_sample(&self.nvml, handle) });
            }
        }
        out
    }

    fn layout_note(&self, gpu: &GpuState) -> Option<&'static str> {
        Some(if !gpu.mig_enabled {
            "MIG off: jobs get the whole GPU (MIG mode is the operator's to change)"
        } else if !self.mig_gpus.contains(gpu.index) {
            "MIG on, not in --mig-gpus: mmkd uses its instances and changes nothing"
        } else if gpu.layout_fixed {
            "MIG on, with instances mmkd did not create: used, the layout kept (--mig-take-over)"
        } else {
            "MIG on: mmkd creates and destroys its instances"
        })
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
        NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
        nvmlComputeInstance_t, nvmlComputeInstanceProfileInfo_t, nvmlGpuInstance_t,
        nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    };

    use super::{Result, nvml_err};

    /// Room for the instances of one profile on a GPU (seven 1g on 7-slice GPUs) or the
    /// compute instances of a GPU instance, with a margin: NVML writes as many as there
    /// are without being told the room.
    const MAX_INSTANCES: usize = 16;

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

    /// What NVML says of one GPU instance.
    #[derive(Debug, Clone, Copy)]
    pub struct GiInfo {
        pub id: u32,
        pub profile_id: u32,
        pub placement: Placement,
    }

    /// A raw function of NVML, or the error of a library that lacks it.
    macro_rules! sym {
        ($nvml:expr, $name:ident) => {
            $nvml
                .lib()
                .$name
                .as_ref()
                .map_err(|_| missing(stringify!($name)))?
        };
    }

    /// A GPU instance of `profile_id` at the placement (`start`, `size` memory slices, as
    /// the possible placements give them).
    pub fn create_gpu_instance(
        nvml: &Nvml,
        d: &Device<'_>,
        profile_id: u32,
        start: u8,
        size: u8,
    ) -> std::result::Result<nvmlGpuInstance_t, NvmlError> {
        let f = sym!(nvml, nvmlDeviceCreateGpuInstanceWithPlacement);
        let placement = nvmlGpuInstancePlacement_t {
            start: c_uint::from(start),
            size: c_uint::from(size),
        };
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: a live device of this `nvml`, a placement that outlives the call and an
        // out pointer.
        nvml_try(unsafe { f(d.handle(), profile_id, &placement, &mut gi) })?;
        Ok(gi)
    }

    pub fn gpu_instance_info(
        nvml: &Nvml,
        gi: nvmlGpuInstance_t,
    ) -> std::result::Result<GiInfo, NvmlError> {
        let f = sym!(nvml, nvmlGpuInstanceGetInfo);
        // SAFETY: an all-zero nvmlGpuInstanceInfo_t is a valid value to overwrite.
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a GPU instance handle NVML gave us, and an out pointer.
        nvml_try(unsafe { f(gi, &mut info) })?;
        Ok(GiInfo {
            id: info.id,
            profile_id: info.profileId,
            placement: Placement {
                start: u8::try_from(info.placement.start).unwrap_or(u8::MAX),
                size: u8::try_from(info.placement.size).unwrap_or(u8::MAX),
            },
        })
    }

    /// The compute instance profile that spans a GPU instance: the largest it offers.
    fn spanning_profile(
        nvml: &Nvml,
        gi: nvmlGpuInstance_t,
    ) -> std::result::Result<nvmlComputeInstanceProfileInfo_t, NvmlError> {
        let f = sym!(nvml, nvmlGpuInstanceGetComputeInstanceProfileInfo);
        let mut best: Option<nvmlComputeInstanceProfileInfo_t> = None;
        for profile in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            // SAFETY: all-zero is a valid value of this plain struct.
            let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: a GPU instance handle NVML gave us, and an out pointer.
            let rc = unsafe {
                f(
                    gi,
                    profile,
                    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut info,
                )
            };
            if nvml_try(rc).is_ok() && best.is_none_or(|b| info.sliceCount > b.sliceCount) {
                best = Some(info);
            }
        }
        best.ok_or(NvmlError::NotSupported)
    }

    /// The compute instance spanning the GPU instance.
    pub fn create_compute_instance(
        nvml: &Nvml,
        gi: nvmlGpuInstance_t,
    ) -> std::result::Result<(), NvmlError> {
        let profile = spanning_profile(nvml, gi)?;
        let f = sym!(nvml, nvmlGpuInstanceCreateComputeInstance);
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        // SAFETY: a GPU instance handle NVML gave us, and an out pointer.
        nvml_try(unsafe { f(gi, profile.id, &mut ci) })
    }

    pub fn gpu_instance_by_id(
        nvml: &Nvml,
        d: &Device<'_>,
        id: u32,
    ) -> std::result::Result<nvmlGpuInstance_t, NvmlError> {
        let f = sym!(nvml, nvmlDeviceGetGpuInstanceById);
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: a live device of this `nvml`, and an out pointer.
        nvml_try(unsafe { f(d.handle(), id, &mut gi) })?;
        Ok(gi)
    }

    /// Every compute instance of a GPU instance, of any profile.
    pub fn compute_instances(
        nvml: &Nvml,
        gi: nvmlGpuInstance_t,
    ) -> std::result::Result<Vec<nvmlComputeInstance_t>, NvmlError> {
        let info = sym!(nvml, nvmlGpuInstanceGetComputeInstanceProfileInfo);
        let list = sym!(nvml, nvmlGpuInstanceGetComputeInstances);
        let mut out = Vec::new();
        for profile in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            // SAFETY: all-zero is a valid value of this plain struct.
            let mut p: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: a GPU instance handle NVML gave us, and an out pointer.
            let rc = unsafe {
                info(
                    gi,
                    profile,
                    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut p,
                )
            };
            if nvml_try(rc).is_err() {
                continue;
            }
            let mut cis: [nvmlComputeInstance_t; MAX_INSTANCES] = [ptr::null_mut(); MAX_INSTANCES];
            let mut count: c_uint = 0;
            // SAFETY: `cis` has room for MAX_INSTANCES, more than a GPU instance's compute
            // slices; NVML writes `count` of them.
            nvml_try(unsafe { list(gi, p.id, cis.as_mut_ptr(), &mut count) })?;
            out.extend(cis.iter().take((count as usize).min(MAX_INSTANCES)));
        }
        Ok(out)
    }

    pub fn destroy_compute_instance(
        nvml: &Nvml,
        ci: nvmlComputeInstance_t,
    ) -> std::result::Result<(), NvmlError> {
        let f = sym!(nvml, nvmlComputeInstanceDestroy);
        // SAFETY: a compute instance handle NVML gave us.
        nvml_try(unsafe { f(ci) })
    }

    pub fn destroy_gpu_instance(
        nvml: &Nvml,
        gi: nvmlGpuInstance_t,
    ) -> std::result::Result<(), NvmlError> {
        let f = sym!(nvml, nvmlGpuInstanceDestroy);
        // SAFETY: a GPU instance handle NVML gave us.
        nvml_try(unsafe { f(gi) })
    }

    /// (GPU instance ID, MIG device UUID) of each MIG device of the GPU.
    pub fn mig_uuids(nvml: &Nvml, d: &Device<'_>) -> Vec<(u32, String)> {
        let mut out = Vec::new();
        if let Ok(gi_of) = nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref() {
            for i in 0..d.mig_device_count().unwrap_or(0) {
                let Ok(m) = d.mig_device_by_index(i) else {
                    continue;
                };
                let mut gi: c_uint = 0;
                // SAFETY: `m` is a live MIG device handle of this `nvml`.
                let rc = unsafe { gi_of(m.handle(), &mut gi) };
                if let (Ok(()), Ok(uuid)) = (nvml_try(rc), m.uuid()) {
                    out.push((gi, uuid));
                }
            }
        }
        out
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
        let uuids: std::collections::BTreeMap<u32, String> =
            mig_uuids(nvml, d).into_iter().collect();
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

#[cfg(test)]
mod tests;
