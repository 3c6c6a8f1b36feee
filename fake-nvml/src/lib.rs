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

mod mig;
pub mod state;
mod usage;

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

#[cfg(test)]
mod tests;
