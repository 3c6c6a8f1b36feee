//! Launches, graphs, stream capture and error names.

use super::*;

// ---- launches ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _smem: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's launch.
    unsafe { run_kernel(f, [gx, gy, gz], stream, params, None) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    smem: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's launch.
    unsafe { cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra) }
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Debug)]
pub struct LaunchConfig {
    pub(crate) grid: [c_uint; 3],
    pub(crate) block: [c_uint; 3],
    pub(crate) shared_mem: c_uint,
    pub(crate) stream: Handle,
    pub(crate) attrs: *mut c_void,
    pub(crate) num_attrs: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    f: Handle,
    params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's config.
    let Some(c) = (unsafe { config.as_ref() }) else {
        return INVALID_VALUE;
    };
    // SAFETY: the caller's launch.
    unsafe { run_kernel(f, c.grid, c.stream, params, None) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfig,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's launch.
    unsafe { cuLaunchKernelEx(config, f, params, extra) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _smem: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's launch.
    unsafe { run_kernel(f, [gx, gy, gz], stream, params, None) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    smem: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's launch.
    unsafe { cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params) }
}

/// A graph (and an executable graph) is a unique address holding how long it runs, in us:
/// one kernel named `graph` over the whole device.
pub(crate) fn graph_function() -> Handle {
    static GRAPH: OnceLock<usize> = OnceLock::new();
    *GRAPH.get_or_init(|| {
        Box::into_raw(Box::new(Function {
            name: c"graph".to_owned(),
            blocks_per_sm: 1,
        })) as usize
    }) as Handle
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut Handle, _flags: c_uint) -> CUresult {
    if graph.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *graph = Box::into_raw(Box::new(GRAPH_DURATION_US)).cast() };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut Handle,
    graph: Handle,
    _flags: u64,
) -> CUresult {
    if exec.is_null() || graph.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null; a graph this library made holds its duration.
    unsafe {
        let duration_us = *graph.cast::<u64>();
        *exec = Box::into_raw(Box::new(duration_us)).cast();
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: Handle, stream: Handle) -> CUresult {
    if exec.is_null() {
        return INVALID_HANDLE;
    }
    let sms = gpu().sm_count;
    // SAFETY: an executable graph this library made holds its duration; the fake graph
    // function.
    unsafe {
        let duration_us = *exec.cast::<u64>();
        run_kernel(
            graph_function(),
            [sms, 1, 1],
            stream,
            std::ptr::null_mut(),
            Some(duration_us),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: Handle, stream: Handle) -> CUresult {
    // SAFETY: the caller's launch.
    unsafe { cuGraphLaunch(exec, stream) }
}

// ---- stream capture ----

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2(stream: Handle, mode: c_int) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if !(CAPTURE_MODE_GLOBAL..=CAPTURE_MODE_RELAXED).contains(&mode) {
        return INVALID_VALUE;
    }
    if is_legacy(stream) {
        return STREAM_CAPTURE_UNSUPPORTED;
    }
    let mut g = gpu();
    if g.captures.contains_key(&(stream as usize)) {
        return ILLEGAL_STATE;
    }
    g.captures.insert(
        stream as usize,
        Capture {
            mode,
            thread: thread_id(),
            duration_us: 0,
            invalid: false,
        },
    );
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(stream: Handle, graph: *mut Handle) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if graph.is_null() {
        return INVALID_VALUE;
    }
    let mut g = gpu();
    let Some(c) = g.captures.remove(&(stream as usize)) else {
        return ILLEGAL_STATE;
    };
    if c.mode != CAPTURE_MODE_RELAXED && c.thread != thread_id() {
        // Only the thread that began it may end it; it stays under way.
        g.captures.insert(stream as usize, c);
        return STREAM_CAPTURE_WRONG_THREAD;
    }
    // SAFETY: checked non-null.
    unsafe {
        if c.invalid {
            *graph = std::ptr::null_mut();
            return STREAM_CAPTURE_INVALIDATED;
        }
        *graph = Box::into_raw(Box::new(c.duration_us)).cast();
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: Handle, status: *mut c_int) -> CUresult {
    if status.is_null() {
        return INVALID_VALUE;
    }
    let g = gpu();
    if is_legacy(stream) && g.legacy_blocked() {
        return STREAM_CAPTURE_IMPLICIT;
    }
    let s = match g.captures.get(&(stream as usize)) {
        None => CAPTURE_STATUS_NONE,
        Some(c) if c.invalid => CAPTURE_STATUS_INVALIDATED,
        Some(_) => CAPTURE_STATUS_ACTIVE,
    };
    // SAFETY: checked non-null.
    unsafe { *status = s };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    // SAFETY: a non-null mode is the caller's.
    let Some(m) = (unsafe { mode.as_mut() }) else {
        return INVALID_VALUE;
    };
    if !(CAPTURE_MODE_GLOBAL..=CAPTURE_MODE_RELAXED).contains(m) {
        return INVALID_VALUE;
    }
    *m = CAPTURE_MODE.replace(*m);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(_rc: CUresult, name: *mut *const c_char) -> CUresult {
    if !name.is_null() {
        // SAFETY: checked non-null.
        unsafe { *name = c"CUDA_ERROR_FAKE".as_ptr() };
    }
    SUCCESS
}
