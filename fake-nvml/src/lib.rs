//! A fake `libnvidia-ml.so.1` for CI: every NVML call mmkd makes, over GPUs of the MIG
//! catalog whose state lives in the file `MMK_FAKE_NVML_STATE` names ([`state`]). mmkd
//! loads it with `--nvml-lib PATH`; the `mmk-fake-nvml` inspector reads and changes the same
//! file (`init`, `show` like `nvidia-smi mig -lgi`, `create`, `destroy`, `busy`, `mig`).
//!
//! Handles are tagged numbers, not pointers: a device is its index + 1; a GPU instance,
//! a compute instance and a MIG device carry their GPU and instance IDs. Every call reads
//! the state file under its lock, so a change the inspector makes is seen at once. Structs
//! are nvml-wrapper-sys's, so the layouts are NVML's.
//!
//! GPM reports one figure, the DRAM bandwidth use the inspector's `gpm` sets per GPU (the
//! same for each of its GPU instances); without it the GPU has no GPM.
//!
//! Not faked: anything mmkd does not call (events, clocks, utilization).

#![allow(non_snake_case)]

pub mod state;

use std::ffi::{c_char, c_uint};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceProfileInfo_t, nvmlDevice_t, nvmlDeviceAttributes_t,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL, nvmlGpmMetricsGet_t, nvmlGpmSample_t,
    nvmlGpmSupport_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlReturn_t,
};

use state::{Gpu, GpuInstance, Locked, Refused, profile_enum};

const SUCCESS: nvmlReturn_t = 0;
const UNINITIALIZED: nvmlReturn_t = 1;
const INVALID_ARGUMENT: nvmlReturn_t = 2;
const NOT_SUPPORTED: nvmlReturn_t = 3;
const NOT_FOUND: nvmlReturn_t = 6;
const INSUFFICIENT_SIZE: nvmlReturn_t = 7;
const IN_USE: nvmlReturn_t = 19;
const INSUFFICIENT_RESOURCES: nvmlReturn_t = 23;
const UNKNOWN: nvmlReturn_t = 999;

const GI_TAG: usize = 0x1 << 40;
const CI_TAG: usize = 0x2 << 40;
const MIG_TAG: usize = 0x3 << 40;
const TAG_MASK: usize = 0xff << 40;

/// `nvmlInit` calls not yet matched by `nvmlShutdown`.
static INITS: AtomicU32 = AtomicU32::new(0);
/// Creations left before the process aborts (`ABORT_AFTER_CREATES_ENV`); 0: never.
static ABORT_AFTER: AtomicU32 = AtomicU32::new(0);

fn code(r: Refused) -> nvmlReturn_t {
    match r {
        Refused::InvalidArgument => INVALID_ARGUMENT,
        Refused::NotSupported => NOT_SUPPORTED,
        Refused::NotFound => NOT_FOUND,
        Refused::InUse => IN_USE,
        Refused::InsufficientResources => INSUFFICIENT_RESOURCES,
        Refused::Unknown => UNKNOWN,
    }
}

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handle {
    Device(usize),
    GpuInstance(usize, u32),
    ComputeInstance(usize, u32),
    MigDevice(usize, u32),
}

fn encode(h: Handle) -> usize {
    match h {
        Handle::Device(g) => g + 1,
        Handle::GpuInstance(g, id) => GI_TAG | (g << 16) | id as usize,
        Handle::ComputeInstance(g, id) => CI_TAG | (g << 16) | id as usize,
        Handle::MigDevice(g, id) => MIG_TAG | (g << 16) | id as usize,
    }
}

fn decode(p: usize) -> Option<Handle> {
    let g = (p >> 16) & 0xff_ffff;
    let id = (p & 0xffff) as u32;
    match p & TAG_MASK {
        0 if p > 0 && p <= 0xffff => Some(Handle::Device(p - 1)),
        GI_TAG => Some(Handle::GpuInstance(g, id)),
        CI_TAG => Some(Handle::ComputeInstance(g, id)),
        MIG_TAG => Some(Handle::MigDevice(g, id)),
        _ => None,
    }
}

/// Runs `f` on the locked state, saving it when `f` changed something (`write`).
fn with_state<T>(
    write: bool,
    f: impl FnOnce(&mut state::Node) -> Result<T, nvmlReturn_t>,
) -> Result<T, nvmlReturn_t> {
    if INITS.load(Ordering::Acquire) == 0 {
        return Err(UNINITIALIZED);
    }
    let path = std::env::var_os(state::STATE_ENV)
        .map(PathBuf::from)
        .ok_or(UNKNOWN)?;
    let mut locked = Locked::open(&path).map_err(|e| {
        eprintln!("mmk-fake-nvml: {e}");
        UNKNOWN
    })?;
    let out = f(&mut locked.node)?;
    if write {
        locked.save().map_err(|e| {
            eprintln!("mmk-fake-nvml: {e}");
            UNKNOWN
        })?;
    }
    Ok(out)
}

fn gpu(node: &mut state::Node, g: usize) -> Result<&mut Gpu, nvmlReturn_t> {
    node.gpus.get_mut(g).ok_or(INVALID_ARGUMENT)
}

fn ret(r: Result<(), nvmlReturn_t>) -> nvmlReturn_t {
    r.err().unwrap_or(SUCCESS)
}

/// Writes `s` into a C buffer of `len` bytes with its NUL.
///
/// # Safety
/// `buf` is null or valid for `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), nvmlReturn_t> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller's buffer holds `len` bytes, more than `s` and its NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// Writes `v` through `out` when it is not null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, v: T) -> Result<(), nvmlReturn_t> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: checked non-null; the caller's out pointer.
    unsafe { out.write(v) };
    Ok(())
}

fn device_of(d: nvmlDevice_t) -> Result<usize, nvmlReturn_t> {
    match decode(d as usize) {
        Some(Handle::Device(g)) => Ok(g),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// The GPU a device handle names, which must have MIG on (`NOT_SUPPORTED` otherwise, as
/// the driver answers MIG calls on a GPU without it).
fn mig_gpu(n: &mut state::Node, device: nvmlDevice_t) -> Result<(usize, &mut Gpu), nvmlReturn_t> {
    let g = device_of(device)?;
    let gp = gpu(n, g)?;
    if !gp.mig {
        return Err(NOT_SUPPORTED);
    }
    Ok((g, gp))
}

fn instance_of(gi: nvmlGpuInstance_t) -> Result<(usize, u32), nvmlReturn_t> {
    match decode(gi as usize) {
        Some(Handle::GpuInstance(g, id)) => Ok((g, id)),
        _ => Err(INVALID_ARGUMENT),
    }
}

// ---- library ----

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    if std::env::var_os(state::STATE_ENV).is_none() {
        eprintln!("mmk-fake-nvml: {} is not set", state::STATE_ENV);
        return UNKNOWN;
    }
    if let Some(n) = std::env::var(state::ABORT_AFTER_CREATES_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        ABORT_AFTER.store(n, Ordering::Release);
    }
    INITS.fetch_add(1, Ordering::AcqRel);
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    match INITS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)) {
        Ok(_) => SUCCESS,
        Err(_) => UNINITIALIZED,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static [u8] = match result {
        SUCCESS => b"Success\0",
        UNINITIALIZED => b"Uninitialized\0",
        INVALID_ARGUMENT => b"Invalid Argument\0",
        NOT_SUPPORTED => b"Not Supported\0",
        NOT_FOUND => b"Not Found\0",
        INSUFFICIENT_SIZE => b"Insufficient Size\0",
        IN_USE => b"In use by another client\0",
        INSUFFICIENT_RESOURCES => b"Insufficient Resources\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

// ---- devices ----

/// # Safety
/// `count` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        // SAFETY: the caller's out pointer.
        unsafe { put(count, n.gpus.len() as c_uint) }
    }))
}

/// # Safety
/// `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        if index as usize >= n.gpus.len() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: the caller's out pointer.
        unsafe {
            put(
                device,
                encode(Handle::Device(index as usize)) as nvmlDevice_t,
            )
        }
    }))
}

/// A GPU's UUID, or a MIG device's.
///
/// # Safety
/// `buf` is null or valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let uuid = match decode(device as usize) {
            Some(Handle::Device(g)) => gpu(n, g)?.uuid.clone(),
            Some(Handle::MigDevice(g, id)) => gpu(n, g)?.instance(id).map_err(code)?.uuid.clone(),
            _ => return Err(INVALID_ARGUMENT),
        };
        // SAFETY: the caller's buffer.
        unsafe { put_str(buf, len, &uuid) }
    }))
}

/// # Safety
/// `buf` is null or valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let g = device_of(device)?;
        let name = gpu(n, g)?.model().map_err(code)?.product_name;
        // SAFETY: the caller's buffer.
        unsafe { put_str(buf, len, &name) }
    }))
}

fn memory_mib(n: &mut state::Node, device: nvmlDevice_t) -> Result<u64, nvmlReturn_t> {
    let g = device_of(device)?;
    Ok(gpu(n, g)?.model().map_err(code)?.memory_mib)
}

/// # Safety
/// `memory` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let total = memory_mib(n, device)? * 1024 * 1024;
        // SAFETY: the caller's out pointer.
        unsafe {
            put(
                memory,
                nvmlMemory_t {
                    total,
                    free: total,
                    used: 0,
                },
            )
        }
    }))
}

/// # Safety
/// `memory` is null or valid for a read and a write of its struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        if memory.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let total = memory_mib(n, device)? * 1024 * 1024;
        // SAFETY: checked non-null; the caller's struct, with its version set.
        unsafe {
            (*memory).total = total;
            (*memory).reserved = 0;
            (*memory).free = total;
            (*memory).used = 0;
        }
        Ok(())
    }))
}

/// # Safety
/// `attributes` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let g = device_of(device)?;
        let m = gpu(n, g)?.model().map_err(code)?;
        // SAFETY: the caller's out pointer.
        unsafe {
            put(
                attributes,
                nvmlDeviceAttributes_t {
                    multiprocessorCount: m.sm_count,
                    sharedCopyEngineCount: 0,
                    sharedDecoderCount: 0,
                    sharedEncoderCount: 0,
                    sharedJpegCount: 0,
                    sharedOfaCount: 0,
                    gpuInstanceSliceCount: u32::from(m.compute_slices),
                    computeInstanceSliceCount: u32::from(m.compute_slices),
                    memorySizeMB: m.memory_mib,
                },
            )
        }
    }))
}

/// # Safety
/// `current` and `pending` are null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let g = device_of(device)?;
        let on = c_uint::from(gpu(n, g)?.mig);
        // SAFETY: the caller's out pointers.
        unsafe {
            put(current, on)?;
            put(pending, on)
        }
    }))
}

// ---- MIG profiles and GPU instances ----

/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let g = device_of(device)?;
        let m = gpu(n, g)?.model().map_err(code)?;
        let p = m
            .profiles
            .iter()
            .find(|p| profile_enum(p) == Some(profile))
            .ok_or(NOT_SUPPORTED)?;
        // SAFETY: the caller's out pointer.
        unsafe {
            put(
                info,
                nvmlGpuInstanceProfileInfo_t {
                    id: p.id,
                    isP2pSupported: 0,
                    sliceCount: u32::from(p.compute_slices),
                    instanceCount: u32::from(p.max_count),
                    multiprocessorCount: p.sm_count,
                    copyEngineCount: 0,
                    decoderCount: 0,
                    encoderCount: 0,
                    jpegCount: 0,
                    ofaCount: 0,
                    memorySizeMB: p.memory_mib,
                },
            )
        }
    }))
}

/// Placements of a profile (by its ID), or their count when `placements` is null.
///
/// # Safety
/// `count` is valid for a read and a write; `placements` is null or valid for `*count`
/// entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let g = device_of(device)?;
        let m = gpu(n, g)?.model().map_err(code)?;
        let p = m.profile(profile_id).ok_or(INVALID_ARGUMENT)?;
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; `count` is an output, as in NVML.
        unsafe { *count = p.starts.len() as c_uint };
        if placements.is_null() {
            return Ok(());
        }
        for (i, s) in p.starts.iter().enumerate() {
            // SAFETY: the caller's array holds a profile's maximum count of placements,
            // as NVML asks.
            unsafe {
                placements.add(i).write(nvmlGpuInstancePlacement_t {
                    start: u32::from(*s),
                    size: u32::from(p.memory_slices),
                })
            };
        }
        Ok(())
    }))
}

/// The GPU instances of a profile.
///
/// # Safety
/// `instances` is valid for as many entries as the profile can have on the GPU; `count` is
/// valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let (g, gp) = mig_gpu(n, device)?;
        let ids: Vec<u32> = gp
            .instances
            .iter()
            .filter(|i| i.profile_id == profile_id)
            .map(|i| i.id)
            .collect();
        if instances.is_null() || count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        for (k, id) in ids.iter().enumerate() {
            // SAFETY: the caller's array holds a profile's maximum count.
            unsafe {
                instances
                    .add(k)
                    .write(encode(Handle::GpuInstance(g, *id)) as nvmlGpuInstance_t)
            };
        }
        // SAFETY: checked non-null.
        unsafe { *count = ids.len() as c_uint };
        Ok(())
    }))
}

/// # Safety
/// `gi` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gi: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let (g, gp) = mig_gpu(n, device)?;
        gp.instance(id).map_err(code)?;
        // SAFETY: the caller's out pointer.
        unsafe { put(gi, encode(Handle::GpuInstance(g, id)) as nvmlGpuInstance_t) }
    }))
}

/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gi: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let (g, id) = instance_of(gi)?;
        let i = gpu(n, g)?.instance(id).map_err(code)?.clone();
        // SAFETY: the caller's out pointer.
        unsafe { put(info, gi_info(g, &i)) }
    }))
}

fn gi_info(g: usize, i: &GpuInstance) -> nvmlGpuInstanceInfo_t {
    nvmlGpuInstanceInfo_t {
        device: encode(Handle::Device(g)) as nvmlDevice_t,
        id: i.id,
        profileId: i.profile_id,
        placement: nvmlGpuInstancePlacement_t {
            start: u32::from(i.start),
            size: u32::from(i.size),
        },
    }
}

/// # Safety
/// `placement` is null or valid for a read; `gi` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gi: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    let rc = ret(with_state(true, |n| {
        let g = device_of(device)?;
        if placement.is_null() || gi.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; the caller's placement.
        let (start, size) = unsafe { ((*placement).start, (*placement).size) };
        let gp = gpu(n, g)?;
        let slices = gp
            .model()
            .map_err(code)?
            .profile(profile_id)
            .map(|p| u32::from(p.memory_slices));
        if slices != Some(size) {
            // A placement is {start, size} as the possible placements give it.
            return Err(INVALID_ARGUMENT);
        }
        let id = gp.create(profile_id, start).map_err(code)?.id;
        // SAFETY: checked non-null.
        unsafe { put(gi, encode(Handle::GpuInstance(g, id)) as nvmlGpuInstance_t) }
    }));
    if rc == SUCCESS
        && ABORT_AFTER.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            == Ok(1)
    {
        eprintln!(
            "mmk-fake-nvml: {}: aborting after a creation",
            state::ABORT_AFTER_CREATES_ENV
        );
        std::process::abort();
    }
    rc
}

/// # Safety
/// Takes a handle only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gi: nvmlGpuInstance_t) -> nvmlReturn_t {
    ret(with_state(true, |n| {
        let (g, id) = instance_of(gi)?;
        gpu(n, g)?.destroy(id).map_err(code)
    }))
}

// ---- compute instances: one per GPU instance, spanning it ----

/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let (g, id) = instance_of(gi)?;
        let gp = gpu(n, g)?;
        let p = gp
            .profile_of(gp.instance(id).map_err(code)?)
            .map_err(code)?;
        // Compute instance profile enums by slices: 1, 2, 3, 4, 7, 8, 6.
        let slices = [1u8, 2, 3, 4, 7, 8, 6];
        if eng_profile != 0 || slices.get(profile as usize) != Some(&p.compute_slices) {
            return Err(NOT_SUPPORTED);
        }
        // SAFETY: the caller's out pointer.
        unsafe {
            put(
                info,
                nvmlComputeInstanceProfileInfo_t {
                    id: profile,
                    sliceCount: u32::from(p.compute_slices),
                    instanceCount: 1,
                    multiprocessorCount: p.sm_count,
                    sharedCopyEngineCount: 0,
                    sharedDecoderCount: 0,
                    sharedEncoderCount: 0,
                    sharedJpegCount: 0,
                    sharedOfaCount: 0,
                },
            )
        }
    }))
}

/// # Safety
/// `ci` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gi: nvmlGpuInstance_t,
    _profile_id: c_uint,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    ret(with_state(true, |n| {
        let (g, id) = instance_of(gi)?;
        let i = gpu(n, g)?.instance_mut(id).map_err(code)?;
        if i.compute.is_some() {
            return Err(INSUFFICIENT_RESOURCES);
        }
        i.compute = Some(0);
        // SAFETY: the caller's out pointer.
        unsafe {
            put(
                ci,
                encode(Handle::ComputeInstance(g, id)) as nvmlComputeInstance_t,
            )
        }
    }))
}

/// # Safety
/// `cis` is valid for one entry; `count` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: nvmlGpuInstance_t,
    _profile_id: c_uint,
    cis: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let (g, id) = instance_of(gi)?;
        let has = gpu(n, g)?.instance(id).map_err(code)?.compute.is_some();
        if cis.is_null() || count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        if has {
            // SAFETY: the caller's array has room for one.
            unsafe { cis.write(encode(Handle::ComputeInstance(g, id)) as nvmlComputeInstance_t) };
        }
        // SAFETY: checked non-null.
        unsafe { *count = c_uint::from(has) };
        Ok(())
    }))
}

/// `IN_USE` while a process runs on the instance.
///
/// # Safety
/// Takes a handle only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(ci: nvmlComputeInstance_t) -> nvmlReturn_t {
    ret(with_state(true, |n| {
        let Some(Handle::ComputeInstance(g, id)) = decode(ci as usize) else {
            return Err(INVALID_ARGUMENT);
        };
        let i = gpu(n, g)?.instance_mut(id).map_err(code)?;
        if i.busy {
            return Err(IN_USE);
        }
        if i.compute.take().is_none() {
            return Err(NOT_FOUND);
        }
        Ok(())
    }))
}

// ---- processes ----

/// The compute processes on a GPU (all of them, with their GPU instance) or on a MIG
/// device (those in its GPU instance), with the GPU memory each holds. With `infos` null,
/// or too few entries, only the count (`INSUFFICIENT_SIZE` when there are any).
///
/// # Safety
/// `count` is valid for a read and a write; `infos` is null or valid for `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let (g, only) = match decode(device as usize) {
            Some(Handle::Device(g)) => (g, None),
            Some(Handle::MigDevice(g, id)) => (g, Some(id)),
            _ => return Err(INVALID_ARGUMENT),
        };
        let list: Vec<state::GpuProcess> = gpu(n, g)?
            .processes
            .iter()
            .filter(|p| only.is_none() || p.instance == only)
            .cloned()
            .collect();
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; the caller's count of entries.
        let room = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = list.len() as c_uint };
        if infos.is_null() || room < list.len() {
            return if list.is_empty() {
                Ok(())
            } else {
                Err(INSUFFICIENT_SIZE)
            };
        }
        for (k, p) in list.iter().enumerate() {
            let none = u32::MAX;
            // SAFETY: `infos` holds `room` entries, at least `list.len()`.
            unsafe {
                infos.add(k).write(nvmlProcessInfo_t {
                    pid: p.pid,
                    usedGpuMemory: p.bytes,
                    gpuInstanceId: p.instance.unwrap_or(none),
                    computeInstanceId: p.instance.map_or(none, |_| 0),
                })
            };
        }
        Ok(())
    }))
}

/// MPS clients: the fake does not tell them from other processes, so the same list.
///
/// # Safety
/// As for [`nvmlDeviceGetComputeRunningProcesses_v3`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's arguments, passed on.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos) }
}

// ---- GPM: samples of a GPU or a GPU instance, and the DRAM bandwidth between two ----

/// What a GPM sample handle points at: the partition it was taken of, if it was.
#[derive(Debug, Default)]
struct GpmSample {
    of: Option<(usize, Option<u32>)>,
}

fn gpm_sample<'a>(s: nvmlGpmSample_t) -> Result<&'a mut GpmSample, nvmlReturn_t> {
    // SAFETY: every sample handle the fake gives out is a `Box<GpmSample>` until
    // `nvmlGpmSampleFree`; null is refused.
    unsafe { s.cast::<GpmSample>().as_mut() }.ok_or(INVALID_ARGUMENT)
}

/// The DRAM bandwidth the GPU's GPM reports, or `NOT_SUPPORTED` without GPM.
fn gpm_pct(n: &mut state::Node, g: usize) -> Result<f64, nvmlReturn_t> {
    gpu(n, g)?.gpm_dram_bw_pct.ok_or(NOT_SUPPORTED)
}

/// # Safety
/// `support` is null or valid for a read and a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let has = gpm_pct(n, device_of(device)?).is_ok();
        if support.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; the caller's struct.
        unsafe { (*support).isSupportedDevice = c_uint::from(has) };
        Ok(())
    }))
}

/// # Safety
/// `sample` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    let handle = Box::into_raw(Box::<GpmSample>::default()).cast();
    // SAFETY: the caller's out pointer, or null (refused).
    let r = unsafe { put(sample, handle) };
    if r.is_err() {
        // SAFETY: just made by `Box::into_raw`, given to nobody.
        drop(unsafe { Box::from_raw(handle.cast::<GpmSample>()) });
    }
    ret(r)
}

/// # Safety
/// `sample` came from [`nvmlGpmSampleAlloc`] and is not used after this.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    if sample.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: as the caller promises, a box of ours freed once.
    drop(unsafe { Box::from_raw(sample.cast::<GpmSample>()) });
    SUCCESS
}

/// # Safety
/// `sample` came from [`nvmlGpmSampleAlloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: nvmlDevice_t,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let g = device_of(device)?;
        gpm_pct(n, g)?;
        gpm_sample(sample)?.of = Some((g, None));
        Ok(())
    }))
}

/// # Safety
/// `sample` came from [`nvmlGpmSampleAlloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpu_instance_id: c_uint,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let (g, gp) = mig_gpu(n, device)?;
        gp.instance_mut(gpu_instance_id).map_err(code)?;
        gpm_pct(n, g)?;
        gpm_sample(sample)?.of = Some((g, Some(gpu_instance_id)));
        Ok(())
    }))
}

static DRAM_BW_SHORT: &std::ffi::CStr = c"dram_bw_util";
static DRAM_BW_LONG: &std::ffi::CStr = c"DRAM bandwidth utilization";
static PERCENT: &std::ffi::CStr = c"%";

/// Two samples of one partition: `NVML_GPM_METRIC_DRAM_BW_UTIL` is the GPU's
/// `gpm_dram_bw_pct`; any other metric is `NOT_SUPPORTED`.
///
/// # Safety
/// `request` is null or valid for a read and a write, its samples from
/// [`nvmlGpmSampleAlloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    // SAFETY: the caller's struct, or null (refused).
    let Some(r) = (unsafe { request.as_mut() }) else {
        return INVALID_ARGUMENT;
    };
    ret(with_state(false, |n| {
        let (a, b) = (gpm_sample(r.sample1)?.of, gpm_sample(r.sample2)?.of);
        let (Some(part), true) = (a, a == b) else {
            return Err(INVALID_ARGUMENT);
        };
        let pct = gpm_pct(n, part.0)?;
        let count = (r.numMetrics as usize).min(r.metrics.len());
        for m in &mut r.metrics[..count] {
            if m.metricId == nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL {
                m.nvmlReturn = SUCCESS;
                m.value = pct;
                m.metricInfo.shortName = DRAM_BW_SHORT.as_ptr().cast_mut();
                m.metricInfo.longName = DRAM_BW_LONG.as_ptr().cast_mut();
                m.metricInfo.unit = PERCENT.as_ptr().cast_mut();
            } else {
                m.nvmlReturn = NOT_SUPPORTED;
            }
        }
        Ok(())
    }))
}

// ---- MIG devices: one per GPU instance with a compute instance ----

/// # Safety
/// `count` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let g = device_of(device)?;
        let m = gpu(n, g)?.model().map_err(code)?;
        // SAFETY: the caller's out pointer.
        unsafe { put(count, c_uint::from(m.compute_slices)) }
    }))
}

/// # Safety
/// `mig` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    ret(with_state(false, |n| {
        let (g, gp) = mig_gpu(n, device)?;
        let i = gp
            .instances
            .iter()
            .filter(|i| i.compute.is_some())
            .nth(index as usize)
            .ok_or(NOT_FOUND)?;
        // SAFETY: the caller's out pointer.
        unsafe { put(mig, encode(Handle::MigDevice(g, i.id)) as nvmlDevice_t) }
    }))
}

/// # Safety
/// `id` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    ret(with_state(false, |_| match decode(device as usize) {
        // SAFETY: the caller's out pointer.
        Some(Handle::MigDevice(_, gi)) => unsafe { put(id, gi) },
        _ => Err(INVALID_ARGUMENT),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper_sys::bindings::NVML_GPU_INSTANCE_PROFILE_COUNT;

    /// (ID, instances, SMs, GiB) of every profile, read through the NVML calls as mmkd
    /// reads them, from a fake node of one GPU of catalog model `model`, MIG off.
    fn profiles_through_nvml(model: &str) -> Vec<(u32, u32, u32, f64)> {
        let path =
            std::env::temp_dir().join(format!("mmk-fake-nvml-{}-{model}.json", std::process::id()));
        state::create(
            &path,
            &state::Node::new(&[(model.to_owned(), 1)], false).unwrap(),
        )
        .unwrap();
        // SAFETY: this test is the only one of this binary that reads the variable.
        unsafe { std::env::set_var(state::STATE_ENV, &path) };
        assert_eq!(nvmlInit_v2(), SUCCESS);
        let mut device: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: out pointers to locals.
        assert_eq!(
            unsafe { nvmlDeviceGetHandleByIndex_v2(0, &mut device) },
            SUCCESS
        );
        let mut out = Vec::new();
        for e in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            // SAFETY: all-zero is a valid value of this plain struct.
            let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: a handle of the fake and an out pointer.
            if unsafe { nvmlDeviceGetGpuInstanceProfileInfo(device, e, &mut info) } == SUCCESS {
                out.push((
                    info.id,
                    info.instanceCount,
                    info.multiprocessorCount,
                    info.memorySizeMB as f64 / 1024.0,
                ));
            }
        }
        assert_eq!(nvmlShutdown(), SUCCESS);
        let _ = std::fs::remove_file(&path);
        out.sort_by_key(|p| p.0);
        out
    }

    fn same(got: &[(u32, u32, u32, f64)], read: &[(u32, u32, u32, f64)]) {
        assert_eq!(got.len(), read.len(), "{got:?} against {read:?}");
        for (g, r) in got.iter().zip(read) {
            assert_eq!((g.0, g.1, g.2), (r.0, r.1, r.2), "{got:?} against {read:?}");
            assert!((g.3 - r.3).abs() <= 0.01, "{got:?} against {read:?}");
        }
    }

    /// A reading in data/ (`nvidia-smi mig -lgip` on a GPU): per profile its ID,
    /// instances at most, SMs and memory (GiB), by ID.
    fn read_lgip(record: &str) -> Vec<(u32, u32, u32, f64)> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data")
            .join(record);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut read: Vec<(u32, u32, u32, f64)> = text
            .lines()
            .filter(|l| l.contains(" MIG "))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let total = f[5].split('/').nth(1).unwrap();
                (
                    f[4].parse().unwrap(),
                    total.parse().unwrap(),
                    f[8].parse().unwrap(),
                    f[6].parse().unwrap(),
                )
            })
            .collect();
        read.sort_by_key(|p| p.0);
        assert_eq!(read.len(), 7, "{path:?}");
        read
    }

    /// The fake's profile table equals `nvidia-smi mig -lgip` as read on an H200 and on an
    /// H100 80GB (driver 580.159.04, MIG off).
    #[test]
    fn the_profile_table_is_what_nvidia_smi_read_on_the_h200_and_h100() {
        same(
            &profiles_through_nvml("h200-141gb"),
            &read_lgip("h200-nvidia-smi-mig-lgip.txt"),
        );
        same(
            &profiles_through_nvml("h100-80gb"),
            &read_lgip("h100-nvidia-smi-mig-lgip.txt"),
        );
    }

    /// The H100 80GB's placements in the catalog (which the fake serves) are what
    /// `nvidia-smi mig -lgipp` read there: `GPU  0 Profile ID 9 Placements: {0,4}:4`.
    #[test]
    fn the_h100_placements_are_what_nvidia_smi_read() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data/h100-nvidia-smi-mig-lgipp.txt");
        let text = std::fs::read_to_string(&path).unwrap();
        let model = mmk_partitioner::catalog::model("h100-80gb").unwrap();
        let mut seen = 0;
        for line in text.lines().filter(|l| l.contains("Profile ID")) {
            let (head, placements) = line.split_once(':').unwrap();
            let id: u32 = head.split_whitespace().nth(4).unwrap().parse().unwrap();
            let (starts, size) = placements.trim().rsplit_once(':').unwrap();
            let starts: Vec<u8> = starts
                .trim_matches(|c| c == '{' || c == '}')
                .split(',')
                .map(|s| s.parse().unwrap())
                .collect();
            let p = model.profile(id).unwrap();
            assert_eq!(
                (&p.starts, p.memory_slices),
                (&starts, size.parse().unwrap()),
                "profile {id}: {line}"
            );
            seen += 1;
        }
        assert_eq!(seen, model.profiles.len(), "{path:?}");
    }

    #[test]
    fn handles_say_what_they_name() {
        for h in [
            Handle::Device(0),
            Handle::Device(7),
            Handle::GpuInstance(3, 12),
            Handle::ComputeInstance(1, 4),
            Handle::MigDevice(2, 9),
        ] {
            assert_eq!(decode(encode(h)), Some(h), "{h:?}");
        }
        assert_eq!(decode(0), None);
    }
}
