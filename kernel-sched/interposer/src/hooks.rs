//! The hooks: what `dlsym`, `cuGetProcAddress` and `cudaGetDriverEntryPoint` hand out in
//! place of the real launch entry points, and the exported symbols that shadow the real ones
//! for callers linked against them.
//!
//! A program may hold several real versions of one entry point (`cuLaunchKernel` and
//! `cuLaunchKernel_ptsz`, or per-version pointers from `cuGetProcAddress`). Each real pointer
//! gets a slot in its table and a hook monomorphized for that slot, so a hook always knows
//! which real function to call.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::cuda::*;
use crate::kernel::Target;
use crate::launch::{self, Shape};
use crate::stats::Api;

/// Distinct real pointers one entry point can have.
const SLOTS: usize = 16;

/// Hooks that could not be installed because their table was full.
pub static OVERFLOW: AtomicU64 = AtomicU64::new(0);

/// Real pointers for one entry point, and the hook that stands for each slot.
struct Table {
    real: [AtomicUsize; SLOTS],
}

impl Table {
    const fn new() -> Table {
        Table {
            real: [const { AtomicUsize::new(0) }; SLOTS],
        }
    }

    fn real(&self, slot: usize) -> usize {
        self.real[slot].load(Ordering::Acquire)
    }

    /// The hook to hand out for `real`; `real` itself when it is one of ours or the table is
    /// full.
    fn install(&self, real: usize, hooks: &[usize; SLOTS], ours: &[usize]) -> usize {
        if real == 0 || hooks.contains(&real) || ours.contains(&real) {
            return real;
        }
        for (slot, cell) in self.real.iter().enumerate() {
            match cell.compare_exchange(0, real, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return hooks[slot],
                Err(existing) if existing == real => return hooks[slot],
                Err(_) => {}
            }
        }
        OVERFLOW.fetch_add(1, Ordering::Relaxed);
        real
    }
}

macro_rules! slot_hooks {
    ($f:ident) => {
        [
            $f::<0> as *const () as usize,
            $f::<1> as *const () as usize,
            $f::<2> as *const () as usize,
            $f::<3> as *const () as usize,
            $f::<4> as *const () as usize,
            $f::<5> as *const () as usize,
            $f::<6> as *const () as usize,
            $f::<7> as *const () as usize,
            $f::<8> as *const () as usize,
            $f::<9> as *const () as usize,
            $f::<10> as *const () as usize,
            $f::<11> as *const () as usize,
            $f::<12> as *const () as usize,
            $f::<13> as *const () as usize,
            $f::<14> as *const () as usize,
            $f::<15> as *const () as usize,
        ]
    };
}

/// # Safety
/// `p` is a non-null function pointer of type `T`.
unsafe fn as_fn<T: Copy>(p: usize) -> T {
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<usize>());
    // SAFETY: the caller promises p is a T.
    unsafe { std::mem::transmute_copy::<usize, T>(&p) }
}

// ---- the shared bodies: one per entry-point shape ----

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn launch_kernel(
    api: Api,
    real: CuLaunchKernel,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    smem: c_uint,
    stream: CUstream,
    params: Params,
    extra: Params,
) -> CUresult {
    let shape = Shape {
        grid: [gx, gy, gz],
        block: [bx, by, bz],
        shared_mem: smem,
        stream,
    };
    launch::run(api, Target::Function(f), shape, || {
        // SAFETY: the caller's arguments, passed on unchanged.
        unsafe { real(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra) }
    })
}

pub(crate) unsafe fn launch_kernel_ex(
    real: CuLaunchKernelEx,
    config: *const CuLaunchConfig,
    f: CUfunction,
    params: Params,
    extra: Params,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { real(config, f, params, extra) };
    // SAFETY: a non-null config points to the caller's CUlaunchConfig.
    let Some(c) = (unsafe { config.as_ref() }) else {
        return call();
    };
    let shape = Shape {
        grid: [c.grid_x, c.grid_y, c.grid_z],
        block: [c.block_x, c.block_y, c.block_z],
        shared_mem: c.shared_mem,
        stream: c.stream,
    };
    launch::run(Api::CuLaunchKernelEx, Target::Function(f), shape, call)
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn launch_cooperative(
    real: CuLaunchCooperativeKernel,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    smem: c_uint,
    stream: CUstream,
    params: Params,
) -> CUresult {
    let shape = Shape {
        grid: [gx, gy, gz],
        block: [bx, by, bz],
        shared_mem: smem,
        stream,
    };
    launch::run(
        Api::CuLaunchCooperativeKernel,
        Target::Function(f),
        shape,
        // SAFETY: the caller's arguments, passed on unchanged.
        || unsafe { real(f, gx, gy, gz, bx, by, bz, smem, stream, params) },
    )
}

pub(crate) unsafe fn graph_launch(
    api: Api,
    real: CuGraphLaunch,
    exec: CUgraphExec,
    stream: CUstream,
) -> CUresult {
    launch::run(api, Target::Graph(exec), Shape::graph(stream), || {
        // SAFETY: the caller's arguments, passed on unchanged.
        unsafe { real(exec, stream) }
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn cuda_launch(
    api: Api,
    real: CudaLaunchKernel,
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: Params,
    smem: usize,
    stream: CUstream,
) -> cudaError {
    // `__cudaLaunchKernel` takes a cudaKernel_t; the others a host stub.
    let target = match api {
        Api::CudaLaunchKernelInternal => Target::Kernel(func.cast_mut()),
        _ => Target::HostStub(func),
    };
    launch::run(api, target, Shape::new(grid, block, smem, stream), || {
        // SAFETY: the caller's arguments, passed on unchanged.
        unsafe { real(func, grid, block, args, smem, stream) }
    })
}

pub(crate) unsafe fn cuda_launch_ex(
    real: CudaLaunchKernelExC,
    config: *const CudaLaunchConfig,
    func: *const c_void,
    args: Params,
) -> cudaError {
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { real(config, func, args) };
    // SAFETY: a non-null config points to the caller's cudaLaunchConfig_t.
    let Some(c) = (unsafe { config.as_ref() }) else {
        return call();
    };
    let shape = Shape::new(c.grid, c.block, c.dynamic_smem, c.stream);
    launch::run(
        Api::CudaLaunchKernelExC,
        Target::HostStub(func),
        shape,
        call,
    )
}

/// After a lookup that returned `*pfn` for `symbol`: hand out our hook instead.
pub(crate) unsafe fn rewrap(symbol: *const c_char, pfn: *mut *mut c_void) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: both checked non-null; the caller's lookup wrote *pfn and symbol is its name.
    unsafe {
        if !(*pfn).is_null() {
            *pfn = wrap(CStr::from_ptr(symbol).to_bytes(), *pfn);
        }
    }
}

// ---- tables and slot hooks ----

macro_rules! hook_family {
    (
        $table:ident, $hooks:ident, $hook:ident, $ty:ty,
        fn($($arg:ident: $argty:ty),*) -> $ret:ty => $body:expr
    ) => {
        static $table: Table = Table::new();
        unsafe extern "C" fn $hook<const I: usize>($($arg: $argty),*) -> $ret {
            // SAFETY: slot I was filled with a $ty before this hook was handed out.
            let real: $ty = unsafe { as_fn($table.real(I)) };
            #[allow(clippy::redundant_closure_call)]
            ($body)(real)
        }
        fn $hooks() -> [usize; SLOTS] {
            slot_hooks!($hook)
        }
    };
}

hook_family!(LK, lk_hooks, lk_hook, CuLaunchKernel,
fn(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
   smem: c_uint, stream: CUstream, params: Params, extra: Params) -> CUresult
=> |real| unsafe {
    launch_kernel(Api::CuLaunchKernel, real, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra)
});
hook_family!(LKX, lkx_hooks, lkx_hook, CuLaunchKernelEx,
    fn(config: *const CuLaunchConfig, f: CUfunction, params: Params, extra: Params) -> CUresult
    => |real| unsafe { launch_kernel_ex(real, config, f, params, extra) });
hook_family!(LCK, lck_hooks, lck_hook, CuLaunchCooperativeKernel,
    fn(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
       smem: c_uint, stream: CUstream, params: Params) -> CUresult
    => |real| unsafe { launch_cooperative(real, f, gx, gy, gz, bx, by, bz, smem, stream, params) });
hook_family!(GL, gl_hooks, gl_hook, CuGraphLaunch,
    fn(exec: CUgraphExec, stream: CUstream) -> CUresult
    => |real| unsafe { graph_launch(Api::CuGraphLaunch, real, exec, stream) });
hook_family!(RLK, rlk_hooks, rlk_hook, CudaLaunchKernel,
    fn(func: *const c_void, grid: Dim3, block: Dim3, args: Params, smem: usize, stream: CUstream) -> cudaError
    => |real| unsafe { cuda_launch(Api::CudaLaunchKernel, real, func, grid, block, args, smem, stream) });
hook_family!(RLKI, rlki_hooks, rlki_hook, CudaLaunchKernel,
    fn(func: *const c_void, grid: Dim3, block: Dim3, args: Params, smem: usize, stream: CUstream) -> cudaError
    => |real| unsafe { cuda_launch(Api::CudaLaunchKernelInternal, real, func, grid, block, args, smem, stream) });
hook_family!(RLCK, rlck_hooks, rlck_hook, CudaLaunchKernel,
    fn(func: *const c_void, grid: Dim3, block: Dim3, args: Params, smem: usize, stream: CUstream) -> cudaError
    => |real| unsafe { cuda_launch(Api::CudaLaunchCooperativeKernel, real, func, grid, block, args, smem, stream) });
hook_family!(RLKX, rlkx_hooks, rlkx_hook, CudaLaunchKernelExC,
    fn(config: *const CudaLaunchConfig, func: *const c_void, args: Params) -> cudaError
    => |real| unsafe { cuda_launch_ex(real, config, func, args) });
hook_family!(RGL, rgl_hooks, rgl_hook, CudaGraphLaunch,
    fn(exec: CUgraphExec, stream: CUstream) -> cudaError
    => |real| unsafe { graph_launch(Api::CudaGraphLaunch, real, exec, stream) });
hook_family!(SC, sc_hooks, sc_hook, CuStreamCreate,
fn(stream: *mut CUstream, flags: c_uint) -> CUresult
=> |real: CuStreamCreate| unsafe {
    crate::streams::create(stream, flags, None, || real(stream, flags))
});
hook_family!(SCP, scp_hooks, scp_hook, CuStreamCreateWithPriority,
fn(stream: *mut CUstream, flags: c_uint, priority: c_int) -> CUresult
=> |real: CuStreamCreateWithPriority| unsafe {
    crate::streams::create(stream, flags, Some(real), || real(stream, flags, priority))
});
hook_family!(SD, sd_hooks, sd_hook, CuStreamDestroy,
fn(stream: CUstream) -> CUresult
=> |real: CuStreamDestroy| unsafe { crate::streams::change(stream, || real(stream)) });
hook_family!(BC, bc_hooks, bc_hook, CuStreamBeginCapture,
fn(stream: CUstream, mode: c_int) -> CUresult
=> |real: CuStreamBeginCapture| unsafe { crate::streams::change(stream, || real(stream, mode)) });
hook_family!(BCG, bcg_hooks, bcg_hook, CuStreamBeginCaptureToGraph,
fn(stream: CUstream, graph: *mut c_void, deps: *const c_void, data: *const c_void, n: usize, mode: c_int) -> CUresult
=> |real: CuStreamBeginCaptureToGraph| unsafe {
    crate::streams::change(stream, || real(stream, graph, deps, data, n, mode))
});
hook_family!(GPA, gpa_hooks, gpa_hook, CuGetProcAddress,
fn(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> CUresult
=> |real: CuGetProcAddress| unsafe {
    let rc = real(symbol, pfn, version, flags);
    if rc == CUDA_SUCCESS { rewrap(symbol, pfn); }
    rc
});
hook_family!(GPA2, gpa2_hooks, gpa2_hook, CuGetProcAddressV2,
fn(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> CUresult
=> |real: CuGetProcAddressV2| unsafe {
    let rc = real(symbol, pfn, version, flags, status);
    if rc == CUDA_SUCCESS { rewrap(symbol, pfn); }
    rc
});
hook_family!(GDEP, gdep_hooks, gdep_hook, CudaGetDriverEntryPoint,
fn(symbol: *const c_char, pfn: *mut *mut c_void, flags: u64, status: *mut c_int) -> cudaError
=> |real: CudaGetDriverEntryPoint| unsafe {
    let rc = real(symbol, pfn, flags, status);
    if rc == 0 { rewrap(symbol, pfn); }
    rc
});
hook_family!(GDEPV, gdepv_hooks, gdepv_hook, CudaGetDriverEntryPointByVersion,
fn(symbol: *const c_char, pfn: *mut *mut c_void, version: c_uint, flags: u64, status: *mut c_int) -> cudaError
=> |real: CudaGetDriverEntryPointByVersion| unsafe {
    let rc = real(symbol, pfn, version, flags, status);
    if rc == 0 { rewrap(symbol, pfn); }
    rc
});

/// What to hand out for `name` found at `real`: a hook when `name` is a launch entry point,
/// a stream constructor, destructor or capture, or a way to find one, else `real` itself.
pub fn wrap(name: &[u8], real: *mut c_void) -> *mut c_void {
    if real.is_null() || !(name.starts_with(b"cu") || name.starts_with(b"__cuda")) {
        return real;
    }
    let base = name.strip_suffix(b"_ptsz").unwrap_or(name);
    let r = real as usize;
    let hooked = match base {
        b"cuLaunchKernel" => LK.install(r, &lk_hooks(), &crate::exports::own(base)),
        b"cuLaunchKernelEx" => LKX.install(r, &lkx_hooks(), &crate::exports::own(base)),
        b"cuLaunchCooperativeKernel" => LCK.install(r, &lck_hooks(), &crate::exports::own(base)),
        b"cuGraphLaunch" => GL.install(r, &gl_hooks(), &crate::exports::own(base)),
        b"cudaLaunchKernel" => RLK.install(r, &rlk_hooks(), &crate::exports::own(base)),
        b"__cudaLaunchKernel" => RLKI.install(r, &rlki_hooks(), &crate::exports::own(base)),
        b"cudaLaunchCooperativeKernel" => {
            RLCK.install(r, &rlck_hooks(), &crate::exports::own(base))
        }
        b"cudaLaunchKernelExC" => RLKX.install(r, &rlkx_hooks(), &crate::exports::own(base)),
        b"cudaGraphLaunch" => RGL.install(r, &rgl_hooks(), &crate::exports::own(base)),
        b"cuStreamCreate" => SC.install(r, &sc_hooks(), &crate::exports::own(base)),
        b"cuStreamCreateWithPriority" => SCP.install(r, &scp_hooks(), &crate::exports::own(base)),
        b"cuStreamDestroy" | b"cuStreamDestroy_v2" => {
            SD.install(r, &sd_hooks(), &crate::exports::own(base))
        }
        b"cuStreamBeginCapture" | b"cuStreamBeginCapture_v2" => {
            BC.install(r, &bc_hooks(), &crate::exports::own(base))
        }
        b"cuStreamBeginCaptureToGraph" => BCG.install(r, &bcg_hooks(), &crate::exports::own(base)),
        b"cuGetProcAddress" => GPA.install(r, &gpa_hooks(), &crate::exports::own(name)),
        b"cuGetProcAddress_v2" => GPA2.install(r, &gpa2_hooks(), &crate::exports::own(name)),
        b"cudaGetDriverEntryPoint" => GDEP.install(r, &gdep_hooks(), &crate::exports::own(base)),
        b"cudaGetDriverEntryPointByVersion" => {
            GDEPV.install(r, &gdepv_hooks(), &crate::exports::own(base))
        }
        _ => r,
    };
    hooked as *mut c_void
}
