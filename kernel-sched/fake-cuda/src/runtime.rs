//! `cuGetProcAddress`, and the runtime API, which reaches the driver the way cudart does.

use super::*;

// ---- cuGetProcAddress ----

pub(crate) const PER_THREAD_DEFAULT_STREAM: u64 = 2;

pub(crate) fn proc_address(name: &[u8], flags: u64) -> Option<usize> {
    let ptsz = flags & PER_THREAD_DEFAULT_STREAM != 0;
    let f: usize = match (name, ptsz) {
        (b"cuInit", _) => cuInit as *const () as usize,
        (b"cuDriverGetVersion", _) => cuDriverGetVersion as *const () as usize,
        (b"cuDeviceGet", _) => cuDeviceGet as *const () as usize,
        (b"cuDeviceGetCount", _) => cuDeviceGetCount as *const () as usize,
        (b"cuDeviceGetAttribute", _) => cuDeviceGetAttribute as *const () as usize,
        (b"cuDevicePrimaryCtxRetain", _) => cuDevicePrimaryCtxRetain as *const () as usize,
        (b"cuCtxSetCurrent", _) => cuCtxSetCurrent as *const () as usize,
        (b"cuCtxGetCurrent", _) => cuCtxGetCurrent as *const () as usize,
        (b"cuCtxGetDevice", _) => cuCtxGetDevice as *const () as usize,
        (b"cuCtxSynchronize", _) => cuCtxSynchronize as *const () as usize,
        (b"cuModuleLoadData", _) => cuModuleLoadData as *const () as usize,
        (b"cuModuleGetFunction", _) => cuModuleGetFunction as *const () as usize,
        (b"cuFuncGetName", _) => cuFuncGetName as *const () as usize,
        (b"cuKernelGetName", _) => cuKernelGetName as *const () as usize,
        (b"cuKernelGetFunction", _) => cuKernelGetFunction as *const () as usize,
        (b"cuOccupancyMaxActiveBlocksPerMultiprocessor", _) => {
            cuOccupancyMaxActiveBlocksPerMultiprocessor as *const () as usize
        }
        (b"cuStreamCreate", _) => cuStreamCreate as *const () as usize,
        (b"cuStreamCreateWithPriority", _) => cuStreamCreateWithPriority as *const () as usize,
        (b"cuStreamGetPriority", _) => cuStreamGetPriority as *const () as usize,
        (b"cuCtxGetStreamPriorityRange", _) => cuCtxGetStreamPriorityRange as *const () as usize,
        (b"cuStreamSynchronize", _) => cuStreamSynchronize as *const () as usize,
        (b"cuStreamDestroy", _) => cuStreamDestroy_v2 as *const () as usize,
        (b"cuEventCreate", _) => cuEventCreate as *const () as usize,
        (b"cuEventRecord", _) => cuEventRecord as *const () as usize,
        (b"cuEventQuery", _) => cuEventQuery as *const () as usize,
        (b"cuEventSynchronize", _) => cuEventSynchronize as *const () as usize,
        (b"cuEventElapsedTime", _) => cuEventElapsedTime as *const () as usize,
        (b"cuEventDestroy", _) => cuEventDestroy as *const () as usize,
        (b"cuGraphCreate", _) => cuGraphCreate as *const () as usize,
        (b"cuGraphInstantiate", _) => cuGraphInstantiateWithFlags as *const () as usize,
        (b"cuLaunchKernel", false) => cuLaunchKernel as *const () as usize,
        (b"cuLaunchKernel", true) => cuLaunchKernel_ptsz as *const () as usize,
        (b"cuLaunchKernelEx", false) => cuLaunchKernelEx as *const () as usize,
        (b"cuLaunchKernelEx", true) => cuLaunchKernelEx_ptsz as *const () as usize,
        (b"cuLaunchCooperativeKernel", false) => cuLaunchCooperativeKernel as *const () as usize,
        (b"cuLaunchCooperativeKernel", true) => {
            cuLaunchCooperativeKernel_ptsz as *const () as usize
        }
        (b"cuStreamBeginCapture", _) => cuStreamBeginCapture_v2 as *const () as usize,
        (b"cuStreamEndCapture", _) => cuStreamEndCapture as *const () as usize,
        (b"cuStreamIsCapturing", _) => cuStreamIsCapturing as *const () as usize,
        (b"cuThreadExchangeStreamCaptureMode", _) => {
            cuThreadExchangeStreamCaptureMode as *const () as usize
        }
        (b"cuGraphLaunch", false) => cuGraphLaunch as *const () as usize,
        (b"cuGraphLaunch", true) => cuGraphLaunch_ptsz as *const () as usize,
        (b"cuGetProcAddress", _) => cuGetProcAddress_v2 as *const () as usize,
        (b"cuMemHostRegister", _) => cuMemHostRegister_v2 as *const () as usize,
        (b"cuMemHostUnregister", _) => cuMemHostUnregister as *const () as usize,
        (b"cuMemHostGetDevicePointer", _) => cuMemHostGetDevicePointer_v2 as *const () as usize,
        (b"cuStreamWaitValue32", _) => cuStreamWaitValue32_v2 as *const () as usize,
        _ => return None,
    };
    Some(f)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's NUL-terminated name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let found = proc_address(name, flags);
    // SAFETY: checked non-null; status may be null.
    unsafe {
        *pfn = found.map_or(std::ptr::null_mut(), |f| f as *mut c_void);
        if !status.is_null() {
            *status = if found.is_some() { 0 } else { 1 };
        }
    }
    if found.is_some() { SUCCESS } else { NOT_FOUND }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller's arguments.
    unsafe { cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

// ---- the runtime: reaches the driver the way cudart does ----

/// The driver entry points the runtime uses, found through `dlopen` + `dlsym` +
/// `cuGetProcAddress` (so an interposer sees the lookups, as with the real cudart).
pub(crate) struct RuntimeDriver {
    pub(crate) launch: usize,
    pub(crate) cooperative: usize,
    pub(crate) launch_ex: usize,
    pub(crate) graph: usize,
    /// For the fake cuBLAS's own kernel (`blas`).
    pub(crate) module_load: usize,
    pub(crate) module_get_function: usize,
}

pub(crate) fn runtime_driver() -> Option<&'static RuntimeDriver> {
    static DRIVER: OnceLock<Option<RuntimeDriver>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            // SAFETY: dlopen/dlsym with constant names; the results are checked.
            unsafe {
                let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
                if h.is_null() {
                    return None;
                }
                let gpa = libc::dlsym(h, c"cuGetProcAddress_v2".as_ptr());
                if gpa.is_null() {
                    return None;
                }
                type Gpa = unsafe extern "C" fn(
                    *const c_char,
                    *mut *mut c_void,
                    c_int,
                    u64,
                    *mut c_int,
                ) -> CUresult;
                let gpa: Gpa = std::mem::transmute::<*mut c_void, Gpa>(gpa);
                let get = |name: &CStr| {
                    let mut p: *mut c_void = std::ptr::null_mut();
                    gpa(name.as_ptr(), &mut p, 13000, 0, std::ptr::null_mut());
                    p as usize
                };
                Some(RuntimeDriver {
                    launch: get(c"cuLaunchKernel"),
                    cooperative: get(c"cuLaunchCooperativeKernel"),
                    launch_ex: get(c"cuLaunchKernelEx"),
                    graph: get(c"cuGraphLaunch"),
                    module_load: get(c"cuModuleLoadData"),
                    module_get_function: get(c"cuModuleGetFunction"),
                })
            }
        })
        .as_ref()
}

/// `dim3`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Dim3 {
    x: c_uint,
    y: c_uint,
    z: c_uint,
}

pub(crate) type DriverLaunch = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;

pub(crate) unsafe fn runtime_launch(
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    smem: usize,
    stream: Handle,
) -> c_int {
    let Some(d) = runtime_driver().filter(|d| d.launch != 0) else {
        return NOT_INITIALIZED;
    };
    // SAFETY: the driver's cuLaunchKernel (possibly an interposer's hook for it).
    unsafe {
        let launch = std::mem::transmute::<usize, DriverLaunch>(d.launch);
        launch(
            func.cast_mut(),
            grid.x,
            grid.y,
            grid.z,
            block.x,
            block.y,
            block.z,
            smem as c_uint,
            stream,
            args,
            std::ptr::null_mut(),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaLaunchKernel(
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    smem: usize,
    stream: Handle,
) -> c_int {
    // SAFETY: the caller's launch.
    unsafe { runtime_launch(func, grid, block, args, smem, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __cudaLaunchKernel(
    kernel: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    smem: usize,
    stream: Handle,
) -> c_int {
    // SAFETY: the caller's launch.
    unsafe { runtime_launch(kernel, grid, block, args, smem, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaLaunchCooperativeKernel(
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    smem: usize,
    stream: Handle,
) -> c_int {
    let Some(d) = runtime_driver().filter(|d| d.cooperative != 0) else {
        return NOT_INITIALIZED;
    };
    type Coop = unsafe extern "C" fn(
        Handle,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Handle,
        *mut *mut c_void,
    ) -> CUresult;
    // SAFETY: the driver's cuLaunchCooperativeKernel (possibly hooked).
    unsafe {
        std::mem::transmute::<usize, Coop>(d.cooperative)(
            func.cast_mut(),
            grid.x,
            grid.y,
            grid.z,
            block.x,
            block.y,
            block.z,
            smem as c_uint,
            stream,
            args,
        )
    }
}

/// `cudaLaunchConfig_t`.
#[repr(C)]
#[derive(Debug)]
pub struct CudaLaunchConfig {
    grid: Dim3,
    block: Dim3,
    smem: usize,
    stream: Handle,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaLaunchKernelExC(
    config: *const CudaLaunchConfig,
    func: *const c_void,
    args: *mut *mut c_void,
) -> c_int {
    // SAFETY: the caller's config.
    let Some(c) = (unsafe { config.as_ref() }) else {
        return INVALID_VALUE;
    };
    let Some(d) = runtime_driver().filter(|d| d.launch_ex != 0) else {
        return NOT_INITIALIZED;
    };
    let driver_config = LaunchConfig {
        grid: [c.grid.x, c.grid.y, c.grid.z],
        block: [c.block.x, c.block.y, c.block.z],
        shared_mem: c.smem as c_uint,
        stream: c.stream,
        attrs: std::ptr::null_mut(),
        num_attrs: 0,
    };
    type Ex = unsafe extern "C" fn(
        *const LaunchConfig,
        Handle,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CUresult;
    // SAFETY: the driver's cuLaunchKernelEx (possibly hooked).
    unsafe {
        std::mem::transmute::<usize, Ex>(d.launch_ex)(
            &driver_config,
            func.cast_mut(),
            args,
            std::ptr::null_mut(),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaGraphLaunch(exec: Handle, stream: Handle) -> c_int {
    let Some(d) = runtime_driver().filter(|d| d.graph != 0) else {
        return NOT_INITIALIZED;
    };
    type G = unsafe extern "C" fn(Handle, Handle) -> CUresult;
    // SAFETY: the driver's cuGraphLaunch (possibly hooked).
    unsafe { std::mem::transmute::<usize, G>(d.graph)(exec, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaGetFuncBySymbol(f: *mut Handle, symbol: *const c_void) -> c_int {
    if f.is_null() || symbol.is_null() {
        return INVALID_VALUE;
    }
    // Host stubs are the driver's function handles in this fake.
    // SAFETY: checked non-null.
    unsafe { *f = symbol.cast_mut() };
    SUCCESS
}
