//! `libmmk_interposer.so`: loaded with `LD_PRELOAD` into a job, it sees every kernel launch
//! and passes it through the partition's gate (crate `mmk-kernel-sched`).
//!
//! How launches are caught (docs/reference.md: on CUDA 13 the runtime reaches the driver
//! through `dlsym` and `cuGetProcAddress`, so exported symbols alone catch almost nothing):
//! - `dlsym` is ours: a lookup of a launch entry point, or of a way to find one
//!   (`cuGetProcAddress`, `cudaGetDriverEntryPoint`), returns our hook;
//! - what `cuGetProcAddress(_v2)` and `cudaGetDriverEntryPoint(ByVersion)` return is wrapped
//!   the same way, for every version and `_ptsz` form;
//! - the launch symbols themselves are exported for callers linked against the driver or the
//!   runtime: `cuLaunchKernel(Ex)`, `cuLaunchCooperativeKernel`, `cuGraphLaunch`,
//!   `cudaLaunchKernel`, `__cudaLaunchKernel` (CUDA 13's `<<<>>>`), `cudaLaunchKernelExC`,
//!   `cudaLaunchCooperativeKernel`, `cudaGraphLaunch`, each with its `_ptsz` form.
//!
//! Streams: `cuStreamCreate` and `cuStreamCreateWithPriority` are hooked the same way, so
//! that an online job's streams get the device's greatest priority (`streams`).
//!
//! cuBLAS: `cublasSgemm_v2`, `cublasGemmEx` and `cublasLtMatmul` are exported too; in an
//! offline job whose gate asks for it, a long GEMM is cut into pieces that the gate can
//! hold one by one (`blas`).
//!
//! Device wait: in an offline job whose gate asks for it, each launch is preceded by a
//! stream wait on a word of the gate, so that the GPU holds what is queued in an offline
//! stream while online work is in flight (`device`).
//!
//! A graph launch is one unit. A runtime launch is gated once even when the runtime calls a
//! hooked driver entry point underneath.
//!
//! Robustness: without a gate the job runs unchanged (launches are only counted); a failed
//! lookup, a missing driver helper or a panic inside the interposer falls back to calling the
//! real function; `MMK_KSCHED_OFF=1` turns every hook into a plain pass-through.

mod blas;
mod cuda;
mod device;
mod exports;
mod hooks;
mod kernel;
mod launch;
mod process;
mod real;
mod stats;
mod streams;
mod track;

/// Launches this process has made through the interposer so far (0 when it is off), for
/// programs that compare the count with a profiler's over a region of their own.
#[unsafe(no_mangle)]
pub extern "C" fn mmk_interposer_launches() -> u64 {
    process::get().map_or(0, |p| p.stats.launches())
}

/// Pause (`false`) or resume (`true`) the interposer's work in this process: while paused,
/// every hook calls the real function and nothing else. For A/B measurements of the
/// interposer's cost inside one process.
#[unsafe(no_mangle)]
pub extern "C" fn mmk_interposer_set_enabled(enabled: bool) {
    process::PAUSED.store(!enabled, std::sync::atomic::Ordering::Relaxed);
}
