//! MIG profiles, GPU instances and compute instances (one per GPU instance, spanning it).

use super::*;

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

pub(crate) fn gi_info(g: usize, i: &GpuInstance) -> nvmlGpuInstanceInfo_t {
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
