//! The slice of the CUDA driver and runtime ABI the interposer touches (CUDA 12/13,
//! x86-64 and aarch64 Linux). Only what is declared here is ever called or wrapped.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUfunction = *mut c_void;
pub type CUkernel = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUcontext = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUdevice = c_int;
/// `cudaError_t`.
pub type cudaError = c_int;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
/// The legacy stream used while another stream captures: it would join the capture.
pub const CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: CUresult = 906;
/// `CUstreamCaptureStatus`: not capturing.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CUstreamCaptureMode`: this thread may make potentially unsafe calls (queries,
/// synchronizations) while other threads capture.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub const CU_EVENT_DEFAULT: c_uint = 0;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
/// `cuMemHostRegister` flags: valid in every context, and mapped for the device.
pub const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 1;
pub const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 2;
/// `cuStreamWaitValue32`: wait until `(*addr & value) != 0`.
pub const CU_STREAM_WAIT_VALUE_AND: c_uint = 2;
/// The driver version the interposer asks `cuGetProcAddress` for its own helpers.
pub const HELPER_VERSION: c_int = 12000;

/// `dim3`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Dim3 {
    pub x: c_uint,
    pub y: c_uint,
    pub z: c_uint,
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Debug)]
pub struct CuLaunchConfig {
    pub grid_x: c_uint,
    pub grid_y: c_uint,
    pub grid_z: c_uint,
    pub block_x: c_uint,
    pub block_y: c_uint,
    pub block_z: c_uint,
    pub shared_mem: c_uint,
    pub stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `cudaLaunchConfig_t`.
#[repr(C)]
#[derive(Debug)]
pub struct CudaLaunchConfig {
    pub grid: Dim3,
    pub block: Dim3,
    pub dynamic_smem: usize,
    pub stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

pub type Params = *mut *mut c_void;

// Launch entry points (the `_ptsz` forms have the same signatures).
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
pub const CU_STREAM_PER_THREAD: usize = 0x2;

pub type CuLaunchKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    Params,
    Params,
) -> CUresult;
pub type CuLaunchKernelEx =
    unsafe extern "C" fn(*const CuLaunchConfig, CUfunction, Params, Params) -> CUresult;
pub type CuLaunchCooperativeKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    Params,
) -> CUresult;
pub type CuGraphLaunch = unsafe extern "C" fn(CUgraphExec, CUstream) -> CUresult;

// Stream creation (the interposer may raise the priority asked for).
pub type CuStreamCreate = unsafe extern "C" fn(*mut CUstream, c_uint) -> CUresult;
/// `cuStreamDestroy` and `cuStreamDestroy_v2` (one signature).
pub type CuStreamDestroy = unsafe extern "C" fn(CUstream) -> CUresult;
/// `cuStreamBeginCapture_v2`; also handed `cuStreamBeginCapture`, whose first version took
/// the stream alone (the extra argument is ignored by such a callee).
pub type CuStreamBeginCapture = unsafe extern "C" fn(CUstream, c_int) -> CUresult;
/// `cuStreamBeginCaptureToGraph`.
pub type CuStreamBeginCaptureToGraph = unsafe extern "C" fn(
    CUstream,
    *mut c_void,
    *const c_void,
    *const c_void,
    usize,
    c_int,
) -> CUresult;
pub type CuStreamCreateWithPriority =
    unsafe extern "C" fn(*mut CUstream, c_uint, c_int) -> CUresult;
/// `cudaLaunchKernel`, `cudaLaunchCooperativeKernel` (host stub first) and
/// `__cudaLaunchKernel` (a `cudaKernel_t` first): the same shape.
pub type CudaLaunchKernel =
    unsafe extern "C" fn(*const c_void, Dim3, Dim3, Params, usize, CUstream) -> cudaError;
pub type CudaLaunchKernelExC =
    unsafe extern "C" fn(*const CudaLaunchConfig, *const c_void, Params) -> cudaError;
pub type CudaGraphLaunch = unsafe extern "C" fn(CUgraphExec, CUstream) -> cudaError;

// Where launch entry points come from.
pub type CuGetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
pub type CuGetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
pub type CudaGetDriverEntryPoint =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> cudaError;
pub type CudaGetDriverEntryPointByVersion =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_uint, u64, *mut c_int) -> cudaError;

// The interposer's own helpers.
pub type CuFuncGetName = unsafe extern "C" fn(*mut *const c_char, CUfunction) -> CUresult;
pub type CuKernelGetName = unsafe extern "C" fn(*mut *const c_char, CUkernel) -> CUresult;
pub type CuKernelGetFunction = unsafe extern "C" fn(*mut CUfunction, CUkernel) -> CUresult;
pub type CuOccupancy = unsafe extern "C" fn(*mut c_int, CUfunction, c_int, usize) -> CUresult;
pub type CuCtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
pub type CuCtxSetCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
pub type CuCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
pub type CuCtxGetStreamPriorityRange = unsafe extern "C" fn(*mut c_int, *mut c_int) -> CUresult;
pub type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult;
pub type CuEventCreate = unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult;
pub type CuEventRecord = unsafe extern "C" fn(CUevent, CUstream) -> CUresult;
pub type CuEventQuery = unsafe extern "C" fn(CUevent) -> CUresult;
pub type CuEventElapsedTime = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
pub type CuStreamIsCapturing = unsafe extern "C" fn(CUstream, *mut c_int) -> CUresult;
pub type CuThreadExchangeStreamCaptureMode = unsafe extern "C" fn(*mut c_int) -> CUresult;
pub type CudaGetFuncBySymbol = unsafe extern "C" fn(*mut CUfunction, *const c_void) -> cudaError;
pub type CuMemHostRegister = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CUresult;
pub type CuMemHostGetDevicePointer =
    unsafe extern "C" fn(*mut u64, *mut c_void, c_uint) -> CUresult;
pub type CuStreamWaitValue32 = unsafe extern "C" fn(CUstream, u64, u32, c_uint) -> CUresult;
