//! The symbols the interposer exports (launches, stream constructors, destructors and
//! captures, lookups). A caller
//! linked against the driver or the runtime
//! (Triton's launchers link `-lcuda`; `libtorch_cuda.so` imports `__cudaLaunchKernel` and
//! `cudaLaunchKernelExC` from `libcudart.so.13`) reaches these first, because the
//! interposer is preloaded; each finds the real definition once and goes through the same
//! launch path as the hooks.

#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::cuda::*;
use crate::hooks;
use crate::real::{self, Lib};
use crate::stats::Api;

/// The real definition that `name` (one of ours) shadows, cached in `cell`.
///
/// # Safety
/// `T` is the function pointer type of `name`.
pub(crate) unsafe fn resolve<T: Copy>(cell: &AtomicUsize, name: &CStr, lib: Lib) -> Option<T> {
    let mut p = cell.load(Ordering::Acquire);
    if p == 0 {
        p = real::next_definition(name, lib);
        if p == 0 || own(name.to_bytes()).contains(&p) {
            return None;
        }
        cell.store(p, Ordering::Release);
    }
    // SAFETY: p is the real `name`, of type T.
    Some(unsafe { std::mem::transmute_copy::<usize, T>(&p) })
}

macro_rules! export {
    ($name:ident, $lib:expr, $ty:ty,
     fn($($arg:ident: $argty:ty),*) -> $ret:ty => |$real:ident| $body:expr) => {
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($arg: $argty),*) -> $ret {
            static REAL: AtomicUsize = AtomicUsize::new(0);
            let name = match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                Ok(name) => name,
                Err(_) => return CUDA_ERROR_UNKNOWN,
            };
            // SAFETY: $ty is the signature of the real $name.
            let Some($real) = (unsafe { resolve::<$ty>(&REAL, name, $lib) }) else {
                return CUDA_ERROR_UNKNOWN;
            };
            #[allow(unused_unsafe)]
            // SAFETY: the caller's arguments, passed on to the real function's wrapper.
            unsafe { $body }
        }
    };
}

macro_rules! export_launch_kernel {
    ($name:ident) => {
        export!($name, Lib::Driver, CuLaunchKernel,
            fn(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint,
               bz: c_uint, smem: c_uint, stream: CUstream, params: Params, extra: Params) -> CUresult
            => |real| hooks::launch_kernel(Api::CuLaunchKernel, real, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra));
    };
}
export_launch_kernel!(cuLaunchKernel);
export_launch_kernel!(cuLaunchKernel_ptsz);

macro_rules! export_launch_kernel_ex {
    ($name:ident) => {
        export!($name, Lib::Driver, CuLaunchKernelEx,
            fn(config: *const CuLaunchConfig, f: CUfunction, params: Params, extra: Params) -> CUresult
            => |real| hooks::launch_kernel_ex(real, config, f, params, extra));
    };
}
export_launch_kernel_ex!(cuLaunchKernelEx);
export_launch_kernel_ex!(cuLaunchKernelEx_ptsz);

macro_rules! export_cooperative {
    ($name:ident) => {
        export!($name, Lib::Driver, CuLaunchCooperativeKernel,
            fn(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint,
               bz: c_uint, smem: c_uint, stream: CUstream, params: Params) -> CUresult
            => |real| hooks::launch_cooperative(real, f, gx, gy, gz, bx, by, bz, smem, stream, params));
    };
}
export_cooperative!(cuLaunchCooperativeKernel);
export_cooperative!(cuLaunchCooperativeKernel_ptsz);

macro_rules! export_graph {
    ($name:ident, $lib:expr, $api:expr, $ty:ty) => {
        export!($name, $lib, $ty,
            fn(exec: CUgraphExec, stream: CUstream) -> CUresult
            => |real| hooks::graph_launch($api, real, exec, stream));
    };
}
export_graph!(
    cuGraphLaunch,
    Lib::Driver,
    Api::CuGraphLaunch,
    CuGraphLaunch
);
export_graph!(
    cuGraphLaunch_ptsz,
    Lib::Driver,
    Api::CuGraphLaunch,
    CuGraphLaunch
);
export_graph!(
    cudaGraphLaunch,
    Lib::Runtime,
    Api::CudaGraphLaunch,
    CudaGraphLaunch
);
export_graph!(
    cudaGraphLaunch_ptsz,
    Lib::Runtime,
    Api::CudaGraphLaunch,
    CudaGraphLaunch
);

macro_rules! export_cuda_launch {
    ($name:ident, $api:expr) => {
        export!($name, Lib::Runtime, CudaLaunchKernel,
            fn(func: *const c_void, grid: Dim3, block: Dim3, args: Params, smem: usize, stream: CUstream) -> cudaError
            => |real| hooks::cuda_launch($api, real, func, grid, block, args, smem, stream));
    };
}
export_cuda_launch!(cudaLaunchKernel, Api::CudaLaunchKernel);
export_cuda_launch!(cudaLaunchKernel_ptsz, Api::CudaLaunchKernel);
export_cuda_launch!(__cudaLaunchKernel, Api::CudaLaunchKernelInternal);
export_cuda_launch!(__cudaLaunchKernel_ptsz, Api::CudaLaunchKernelInternal);
export_cuda_launch!(
    cudaLaunchCooperativeKernel,
    Api::CudaLaunchCooperativeKernel
);
export_cuda_launch!(
    cudaLaunchCooperativeKernel_ptsz,
    Api::CudaLaunchCooperativeKernel
);

macro_rules! export_cuda_launch_ex {
    ($name:ident) => {
        export!($name, Lib::Runtime, CudaLaunchKernelExC,
            fn(config: *const CudaLaunchConfig, func: *const c_void, args: Params) -> cudaError
            => |real| hooks::cuda_launch_ex(real, config, func, args));
    };
}
export_cuda_launch_ex!(cudaLaunchKernelExC);
export_cuda_launch_ex!(cudaLaunchKernelExC_ptsz);

export!(cuStreamCreate, Lib::Driver, CuStreamCreate,
fn(stream: *mut CUstream, flags: c_uint) -> CUresult
=> |real| crate::streams::create(stream, flags, None, || real(stream, flags)));
export!(cuStreamCreateWithPriority, Lib::Driver, CuStreamCreateWithPriority,
fn(stream: *mut CUstream, flags: c_uint, priority: c_int) -> CUresult
=> |real| crate::streams::create(stream, flags, Some(real), || real(stream, flags, priority)));

export!(cuStreamDestroy, Lib::Driver, CuStreamDestroy,
fn(stream: CUstream) -> CUresult
=> |real| crate::streams::change(stream, || real(stream)));
export!(cuStreamDestroy_v2, Lib::Driver, CuStreamDestroy,
fn(stream: CUstream) -> CUresult
=> |real| crate::streams::change(stream, || real(stream)));
export!(cuStreamBeginCapture, Lib::Driver, CuStreamBeginCapture,
fn(stream: CUstream, mode: c_int) -> CUresult
=> |real| crate::streams::change(stream, || real(stream, mode)));
export!(cuStreamBeginCapture_v2, Lib::Driver, CuStreamBeginCapture,
fn(stream: CUstream, mode: c_int) -> CUresult
=> |real| crate::streams::change(stream, || real(stream, mode)));
export!(cuStreamBeginCaptureToGraph, Lib::Driver, CuStreamBeginCaptureToGraph,
fn(stream: CUstream, graph: *mut c_void, deps: *const c_void, data: *const c_void, n: usize, mode: c_int) -> CUresult
=> |real| crate::streams::change(stream, || real(stream, graph, deps, data, n, mode)));

export!(cuGetProcAddress, Lib::Driver, CuGetProcAddress,
fn(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> CUresult
=> |real| {
    let rc = real(symbol, pfn, version, flags);
    if rc == CUDA_SUCCESS { hooks::rewrap(symbol, pfn); }
    rc
});
export!(cuGetProcAddress_v2, Lib::Driver, CuGetProcAddressV2,
fn(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> CUresult
=> |real| {
    let rc = real(symbol, pfn, version, flags, status);
    if rc == CUDA_SUCCESS { hooks::rewrap(symbol, pfn); }
    rc
});

macro_rules! export_entry_point {
    ($name:ident) => {
        export!($name, Lib::Runtime, CudaGetDriverEntryPoint,
            fn(symbol: *const c_char, pfn: *mut *mut c_void, flags: u64, status: *mut c_int) -> cudaError
            => |real| {
                let rc = real(symbol, pfn, flags, status);
                if rc == 0 { hooks::rewrap(symbol, pfn); }
                rc
            });
    };
}
export_entry_point!(cudaGetDriverEntryPoint);
export_entry_point!(cudaGetDriverEntryPoint_ptsz);

macro_rules! export_entry_point_by_version {
    ($name:ident) => {
        export!($name, Lib::Runtime, CudaGetDriverEntryPointByVersion,
            fn(symbol: *const c_char, pfn: *mut *mut c_void, version: c_uint, flags: u64, status: *mut c_int) -> cudaError
            => |real| {
                let rc = real(symbol, pfn, version, flags, status);
                if rc == 0 { hooks::rewrap(symbol, pfn); }
                rc
            });
    };
}
export_entry_point_by_version!(cudaGetDriverEntryPointByVersion);
export_entry_point_by_version!(cudaGetDriverEntryPointByVersion_ptsz);

/// Our own exports for an entry point (its plain and `_ptsz` forms): never wrapped again.
pub fn own(name: &[u8]) -> [usize; 2] {
    let base = name.strip_suffix(b"_ptsz").unwrap_or(name);
    match base {
        b"cuLaunchKernel" => [
            cuLaunchKernel as *const () as usize,
            cuLaunchKernel_ptsz as *const () as usize,
        ],
        b"cuLaunchKernelEx" => [
            cuLaunchKernelEx as *const () as usize,
            cuLaunchKernelEx_ptsz as *const () as usize,
        ],
        b"cuLaunchCooperativeKernel" => [
            cuLaunchCooperativeKernel as *const () as usize,
            cuLaunchCooperativeKernel_ptsz as *const () as usize,
        ],
        b"cuGraphLaunch" => [
            cuGraphLaunch as *const () as usize,
            cuGraphLaunch_ptsz as *const () as usize,
        ],
        b"cudaGraphLaunch" => [
            cudaGraphLaunch as *const () as usize,
            cudaGraphLaunch_ptsz as *const () as usize,
        ],
        b"cudaLaunchKernel" => [
            cudaLaunchKernel as *const () as usize,
            cudaLaunchKernel_ptsz as *const () as usize,
        ],
        b"__cudaLaunchKernel" => [
            __cudaLaunchKernel as *const () as usize,
            __cudaLaunchKernel_ptsz as *const () as usize,
        ],
        b"cudaLaunchCooperativeKernel" => [
            cudaLaunchCooperativeKernel as *const () as usize,
            cudaLaunchCooperativeKernel_ptsz as *const () as usize,
        ],
        b"cudaLaunchKernelExC" => [
            cudaLaunchKernelExC as *const () as usize,
            cudaLaunchKernelExC_ptsz as *const () as usize,
        ],
        b"cuStreamCreate" => [cuStreamCreate as *const () as usize, 0],
        b"cuStreamCreateWithPriority" => [cuStreamCreateWithPriority as *const () as usize, 0],
        b"cuStreamDestroy" | b"cuStreamDestroy_v2" => [
            cuStreamDestroy as *const () as usize,
            cuStreamDestroy_v2 as *const () as usize,
        ],
        b"cuStreamBeginCapture" | b"cuStreamBeginCapture_v2" => [
            cuStreamBeginCapture as *const () as usize,
            cuStreamBeginCapture_v2 as *const () as usize,
        ],
        b"cuStreamBeginCaptureToGraph" => [cuStreamBeginCaptureToGraph as *const () as usize, 0],
        b"cuGetProcAddress" | b"cuGetProcAddress_v2" => [
            cuGetProcAddress as *const () as usize,
            cuGetProcAddress_v2 as *const () as usize,
        ],
        b"cudaGetDriverEntryPoint" => [
            cudaGetDriverEntryPoint as *const () as usize,
            cudaGetDriverEntryPoint_ptsz as *const () as usize,
        ],
        b"cudaGetDriverEntryPointByVersion" => [
            cudaGetDriverEntryPointByVersion as *const () as usize,
            cudaGetDriverEntryPointByVersion_ptsz as *const () as usize,
        ],
        b"cublasSgemm_v2" => [crate::blas::cublasSgemm_v2 as *const () as usize, 0],
        b"cublasGemmEx" => [crate::blas::cublasGemmEx as *const () as usize, 0],
        b"cublasLtMatmul" => [crate::blas::cublasLtMatmul as *const () as usize, 0],
        _ => [0, 0],
    }
}

/// `dlsym`: the real lookup, then our hook in place of a launch entry point.
///
/// `RTLD_NEXT` lookups resolve relative to the interposer (the caller's own position is
/// lost); the interposer is first in the search order, so this is the same set of
/// libraries minus the interposer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let Some(real) = real::dlsym_fn() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    let p = unsafe { real(handle, symbol) };
    if p.is_null() || symbol.is_null() || crate::process::off() {
        return p;
    }
    // SAFETY: a non-null symbol name from the caller, NUL-terminated by dlsym's contract.
    hooks::wrap(unsafe { CStr::from_ptr(symbol) }.to_bytes(), p)
}
