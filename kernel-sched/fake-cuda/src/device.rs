//! Initialisation, devices, contexts, modules and functions.

use super::*;

// ---- initialisation, devices, contexts ----

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    gpu().initialized = true;
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    if v.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *v = 13000 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    if n.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *n = 1 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> CUresult {
    if dev.is_null() || ordinal != 0 {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *dev = 0 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: c_int) -> CUresult {
    if v.is_null() || dev != 0 {
        return INVALID_VALUE;
    }
    let value = match attr {
        16 => gpu().sm_count as c_int, // MULTIPROCESSOR_COUNT
        _ => 0,
    };
    // SAFETY: checked non-null.
    unsafe { *v = value };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, dev: c_int) -> CUresult {
    if ctx.is_null() || dev != 0 {
        return INVALID_VALUE;
    }
    if !gpu().initialized {
        return NOT_INITIALIZED;
    }
    // SAFETY: checked non-null.
    unsafe { *ctx = CONTEXT as Handle };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    if !ctx.is_null() && ctx as usize != CONTEXT {
        return INVALID_CONTEXT;
    }
    CURRENT.set(ctx as usize);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut Handle) -> CUresult {
    if ctx.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *ctx = CURRENT.get() as Handle };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut c_int) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if dev.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *dev = 0 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    let until = {
        let mut g = gpu();
        if let Err(rc) = g.unsafe_call() {
            return rc;
        }
        if !g.captures.is_empty() {
            // The context encompasses the capturing streams.
            g.captures.values_mut().for_each(|c| c.invalid = true);
            return STREAM_CAPTURE_UNSUPPORTED;
        }
        g.tails.values().copied().max().unwrap_or(0)
    };
    sleep_until(until);
    wait_deferred(None);
    let until = gpu().tails.values().copied().max().unwrap_or(0);
    sleep_until(until);
    SUCCESS
}

pub(crate) fn sleep_until(t: u64) {
    let now = now_ns();
    if t > now {
        std::thread::sleep(std::time::Duration::from_nanos(t - now));
    }
}

// ---- modules and functions ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Handle, image: *const c_void) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if module.is_null() || image.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the image is NUL-terminated text (this fake's module format).
    let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_string_lossy();
    let mut kernels = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut parts = line.split_whitespace();
        let (Some(name), Some(bps)) = (parts.next(), parts.next()) else {
            return INVALID_VALUE;
        };
        let Ok(blocks_per_sm) = bps.parse::<u32>() else {
            return INVALID_VALUE;
        };
        let Ok(name) = std::ffi::CString::new(name) else {
            return INVALID_VALUE;
        };
        let f = Box::into_raw(Box::new(Function {
            name,
            blocks_per_sm,
        }));
        kernels.insert(
            line.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned(),
            f as usize,
        );
    }
    // SAFETY: checked non-null.
    unsafe { *module = Box::into_raw(Box::new(kernels)).cast() };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut Handle,
    module: Handle,
    name: *const c_char,
) -> CUresult {
    if f.is_null() || module.is_null() || name.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a module this library made, and the caller's NUL-terminated name.
    let (kernels, name) = unsafe {
        (
            &*module.cast::<HashMap<String, usize>>(),
            CStr::from_ptr(name).to_string_lossy(),
        )
    };
    match kernels.get(name.as_ref()) {
        Some(&func) => {
            // SAFETY: checked non-null.
            unsafe { *f = func as Handle };
            SUCCESS
        }
        None => NOT_FOUND,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, f: Handle) -> CUresult {
    if name.is_null() || f.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a function this library made; checked non-null out pointer.
    unsafe { *name = (*f.cast::<Function>()).name.as_ptr() };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, k: Handle) -> CUresult {
    // SAFETY: kernels and functions are the same objects here.
    unsafe { cuFuncGetName(name, k) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(f: *mut Handle, k: Handle) -> CUresult {
    if f.is_null() || k.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *f = k };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    f: Handle,
    _block: c_int,
    _smem: usize,
) -> CUresult {
    if n.is_null() || f.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a function this library made; checked non-null out pointer.
    unsafe { *n = (*f.cast::<Function>()).blocks_per_sm as c_int };
    SUCCESS
}
