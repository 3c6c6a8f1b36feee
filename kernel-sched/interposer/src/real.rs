//! The real functions behind the hooks: the real `dlsym`, the loaded driver and runtime
//! libraries, and the driver helpers the interposer calls itself (names, occupancy, events,
//! stream priorities, the device wait).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::cuda::*;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// glibc's `dlsym`, found with `dlvsym` so that our own `dlsym` is never asked for it.
pub fn dlsym_fn() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: dlvsym with constant, NUL-terminated names.
            let f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !f.is_null() {
                p = f as usize;
                break;
            }
        }
        if p == 0 {
            return None;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: p is glibc's dlsym, which has this signature.
    Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// The real `dlsym(handle, name)`.
pub fn dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match dlsym_fn() {
        // SAFETY: glibc dlsym with a NUL-terminated name.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

/// Which loaded library a symbol belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    /// `libcuda.so.1`, the driver.
    Driver,
    /// `libcudart.so.*`, the runtime.
    Runtime,
    /// `libcublas.so.*`.
    Blas,
    /// `libcublasLt.so.*`.
    BlasLt,
}

/// A handle to the loaded library (never loads one): by name for the driver, by scanning the
/// loaded objects for the runtime (its file name carries a version).
pub fn handle(lib: Lib) -> Option<usize> {
    static DRIVER: OnceLock<Option<usize>> = OnceLock::new();
    static RUNTIME: OnceLock<Option<usize>> = OnceLock::new();
    static BLAS: OnceLock<Option<usize>> = OnceLock::new();
    static BLAS_LT: OnceLock<Option<usize>> = OnceLock::new();
    let (cell, needle) = match lib {
        Lib::Driver => (&DRIVER, "libcuda.so"),
        Lib::Runtime => (&RUNTIME, "libcudart.so"),
        Lib::Blas => (&BLAS, "libcublas.so"),
        Lib::BlasLt => (&BLAS_LT, "libcublasLt.so"),
    };
    if let Some(h) = cell.get() {
        return *h;
    }
    let found = loaded_object(needle).and_then(|path| {
        // SAFETY: RTLD_NOLOAD only returns a handle to an object already loaded.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        (!h.is_null()).then_some(h as usize)
    });
    // Remember only a success: the library may be loaded later.
    if found.is_some() {
        let _ = cell.set(found);
    }
    found
}

/// The path of a loaded object whose file name contains `needle`.
fn loaded_object(needle: &str) -> Option<std::ffi::CString> {
    struct Search<'a> {
        needle: &'a str,
        found: Option<std::ffi::CString>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our Search pointer.
        let (info, search) = unsafe { (&*info, &mut *data.cast::<Search>()) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: dlpi_name is a NUL-terminated path owned by the loader.
        let name = unsafe { CStr::from_ptr(info.dlpi_name) };
        let file = name
            .to_bytes()
            .rsplit(|&b| b == b'/')
            .next()
            .unwrap_or_default();
        if file
            .windows(search.needle.len())
            .any(|w| w == search.needle.as_bytes())
        {
            search.found = Some(name.to_owned());
            return 1;
        }
        0
    }
    let mut search = Search {
        needle,
        found: None,
    };
    // SAFETY: the callback only reads the loader's data and writes our Search.
    unsafe {
        libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast());
    }
    search.found
}

/// The definition of `name` that our own export shadows: the next one in the search order,
/// else the one in the loaded library.
pub fn next_definition(name: &CStr, lib: Lib) -> usize {
    let p = dlsym(libc::RTLD_NEXT, name);
    if !p.is_null() {
        return p as usize;
    }
    handle(lib).map_or(0, |h| dlsym(h as *mut c_void, name) as usize)
}

/// The driver functions the interposer calls itself. Any may be missing (an old driver, a
/// fake); the interposer then does without what it gives.
#[derive(Debug, Default)]
pub struct Driver {
    pub func_get_name: Option<CuFuncGetName>,
    pub kernel_get_name: Option<CuKernelGetName>,
    pub kernel_get_function: Option<CuKernelGetFunction>,
    pub occupancy: Option<CuOccupancy>,
    pub ctx_get_current: Option<CuCtxGetCurrent>,
    pub ctx_set_current: Option<CuCtxSetCurrent>,
    pub ctx_get_device: Option<CuCtxGetDevice>,
    pub stream_priority_range: Option<CuCtxGetStreamPriorityRange>,
    pub stream_create_with_priority: Option<CuStreamCreateWithPriority>,
    pub device_get_attribute: Option<CuDeviceGetAttribute>,
    pub event_create: Option<CuEventCreate>,
    pub event_record: Option<CuEventRecord>,
    pub event_query: Option<CuEventQuery>,
    pub event_synchronize: Option<CuEventQuery>,
    pub event_elapsed: Option<CuEventElapsedTime>,
    pub stream_is_capturing: Option<CuStreamIsCapturing>,
    pub exchange_capture_mode: Option<CuThreadExchangeStreamCaptureMode>,
    pub mem_host_register: Option<CuMemHostRegister>,
    pub mem_host_get_device_pointer: Option<CuMemHostGetDevicePointer>,
    pub stream_wait_value32: Option<CuStreamWaitValue32>,
}

impl Driver {
    /// Whether a launch into `stream` now would be recorded into a graph under capture
    /// instead of running. Also true when `stream` is the legacy stream while another
    /// (blocking) stream captures: the driver refuses such a launch (and invalidates that
    /// capture), so it must not be gated or have an event recorded behind it either.
    ///
    /// A null stream is asked about as the legacy stream, also for a `_ptsz` launch, where
    /// it means the per-thread stream: such a launch made while another thread captures
    /// on a blocking stream runs ungated and is counted as captured.
    pub fn capturing(&self, stream: CUstream) -> bool {
        let Some(is_capturing) = self.stream_is_capturing else {
            return false;
        };
        let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the driver's cuStreamIsCapturing with the caller's stream and a valid
        // out pointer.
        match unsafe { is_capturing(stream, &mut status) } {
            CUDA_SUCCESS => status != CU_STREAM_CAPTURE_STATUS_NONE,
            CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => true,
            _ => false,
        }
    }

    /// Run `f` with the calling thread in relaxed capture mode, then restore its mode: for
    /// the interposer's own queries and synchronizations on a job's thread.
    pub fn relaxed<R>(&self, f: impl FnOnce() -> R) -> R {
        let Some(exchange) = self.exchange_capture_mode else {
            return f();
        };
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: the driver's cuThreadExchangeStreamCaptureMode with a valid pointer.
        let swapped = unsafe { exchange(&mut mode) } == CUDA_SUCCESS;
        let r = f();
        if swapped {
            // SAFETY: as above; `mode` holds the thread's mode from before.
            unsafe { exchange(&mut mode) };
        }
        r
    }

    /// Put the calling thread in relaxed capture mode for good: its queries then never
    /// disturb a capture the job's threads make in global mode (which would fail the query
    /// and invalidate the capture). For the interposer's own threads only.
    pub fn relax_capture_mode(&self) {
        if let Some(exchange) = self.exchange_capture_mode {
            let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
            // SAFETY: the driver's cuThreadExchangeStreamCaptureMode with a valid pointer.
            unsafe { exchange(&mut mode) };
        }
    }
}

/// The driver helpers, resolved the first time a launch needs them (the driver is loaded
/// by then). `None` while no driver is loaded.
pub fn driver() -> Option<&'static Driver> {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    if let Some(d) = DRIVER.get() {
        return Some(d);
    }
    let h = handle(Lib::Driver)? as *mut c_void;
    let gpa = dlsym(h, c"cuGetProcAddress_v2");
    let lookup = |name: &CStr| -> usize {
        if !gpa.is_null() {
            let mut p: *mut c_void = std::ptr::null_mut();
            let mut status: c_int = 0;
            // SAFETY: the driver's cuGetProcAddress_v2 with a valid name and out pointers.
            let rc = unsafe {
                std::mem::transmute::<*mut c_void, CuGetProcAddressV2>(gpa)(
                    name.as_ptr(),
                    &mut p,
                    HELPER_VERSION,
                    0,
                    &mut status,
                )
            };
            if rc == CUDA_SUCCESS && !p.is_null() {
                return p as usize;
            }
        }
        dlsym(h, name) as usize
    };
    macro_rules! get {
        ($name:literal, $ty:ty) => {{
            let p = lookup($name);
            // SAFETY: the driver's function of that name has this signature.
            (p != 0).then(|| unsafe { std::mem::transmute::<usize, $ty>(p) })
        }};
    }
    let d = Driver {
        func_get_name: get!(c"cuFuncGetName", CuFuncGetName),
        kernel_get_name: get!(c"cuKernelGetName", CuKernelGetName),
        kernel_get_function: get!(c"cuKernelGetFunction", CuKernelGetFunction),
        occupancy: get!(c"cuOccupancyMaxActiveBlocksPerMultiprocessor", CuOccupancy),
        ctx_get_current: get!(c"cuCtxGetCurrent", CuCtxGetCurrent),
        ctx_set_current: get!(c"cuCtxSetCurrent", CuCtxSetCurrent),
        ctx_get_device: get!(c"cuCtxGetDevice", CuCtxGetDevice),
        stream_priority_range: get!(c"cuCtxGetStreamPriorityRange", CuCtxGetStreamPriorityRange),
        stream_create_with_priority: get!(
            c"cuStreamCreateWithPriority",
            CuStreamCreateWithPriority
        ),
        device_get_attribute: get!(c"cuDeviceGetAttribute", CuDeviceGetAttribute),
        event_create: get!(c"cuEventCreate", CuEventCreate),
        event_record: get!(c"cuEventRecord", CuEventRecord),
        event_query: get!(c"cuEventQuery", CuEventQuery),
        event_synchronize: get!(c"cuEventSynchronize", CuEventQuery),
        event_elapsed: get!(c"cuEventElapsedTime", CuEventElapsedTime),
        stream_is_capturing: get!(c"cuStreamIsCapturing", CuStreamIsCapturing),
        exchange_capture_mode: get!(
            c"cuThreadExchangeStreamCaptureMode",
            CuThreadExchangeStreamCaptureMode
        ),
        mem_host_register: get!(c"cuMemHostRegister", CuMemHostRegister),
        mem_host_get_device_pointer: get!(c"cuMemHostGetDevicePointer", CuMemHostGetDevicePointer),
        stream_wait_value32: get!(c"cuStreamWaitValue32", CuStreamWaitValue32),
    };
    Some(DRIVER.get_or_init(|| d))
}

/// `cudaGetFuncBySymbol` from the loaded runtime (looked up again until one is loaded).
pub fn func_by_symbol() -> Option<CudaGetFuncBySymbol> {
    static FOUND: AtomicUsize = AtomicUsize::new(0);
    let mut p = FOUND.load(Ordering::Acquire);
    if p == 0 {
        p = handle(Lib::Runtime).map_or(0, |h| {
            dlsym(h as *mut c_void, c"cudaGetFuncBySymbol") as usize
        });
        FOUND.store(p, Ordering::Release);
    }
    // SAFETY: cudart's cudaGetFuncBySymbol has this signature.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, CudaGetFuncBySymbol>(p) })
}
