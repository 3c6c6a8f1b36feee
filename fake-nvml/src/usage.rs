//! Processes on a GPU, GPM samples and the DRAM bandwidth between two, and MIG devices.

use super::*;

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
pub(crate) struct GpmSample {
    of: Option<(usize, Option<u32>)>,
}

pub(crate) fn gpm_sample<'a>(s: nvmlGpmSample_t) -> Result<&'a mut GpmSample, nvmlReturn_t> {
    // SAFETY: every sample handle the fake gives out is a `Box<GpmSample>` until
    // `nvmlGpmSampleFree`; null is refused.
    unsafe { s.cast::<GpmSample>().as_mut() }.ok_or(INVALID_ARGUMENT)
}

/// The DRAM bandwidth the GPU's GPM reports, or `NOT_SUPPORTED` without GPM.
pub(crate) fn gpm_pct(n: &mut state::Node, g: usize) -> Result<f64, nvmlReturn_t> {
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

pub(crate) static DRAM_BW_SHORT: &std::ffi::CStr = c"dram_bw_util";
pub(crate) static DRAM_BW_LONG: &std::ffi::CStr = c"DRAM bandwidth utilization";
pub(crate) static PERCENT: &std::ffi::CStr = c"%";

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
