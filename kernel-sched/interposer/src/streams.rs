//! Stream priorities: an online job's streams get the device's greatest priority
//! ([`mmk_kernel_sched::StreamPriority`]), so that the GPU's block scheduler dispatches its
//! kernels' blocks ahead of waiting offline blocks (Orion 5.2). Priorities never preempt a
//! running block, and the default streams keep the least priority.
//!
//! A stream that is destroyed or starts a capture first gets an event behind the launches
//! the completion tracker has not covered yet ([`crate::track`]).

use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering;

use mmk_kernel_sched::StreamPriority;

use crate::cuda::*;
use crate::process;

/// Create a stream for a caller of `cuStreamCreate` or `cuStreamCreateWithPriority`.
/// `as_asked` makes it the caller's way; `with_priority` is the real
/// `cuStreamCreateWithPriority` to use instead when the priority is raised (for a
/// `cuStreamCreate` caller, the driver's own is looked up).
///
/// # Safety
/// `stream` is the caller's out pointer, passed on unchanged.
pub(crate) unsafe fn create(
    stream: *mut CUstream,
    flags: c_uint,
    with_priority: Option<CuStreamCreateWithPriority>,
    as_asked: impl FnOnce() -> CUresult,
) -> CUresult {
    // The driver's helper may be our own export again (a library's address of its own
    // exported function resolves to the preloaded one), or the runtime may call the driver
    // underneath: the outermost call does the work.
    if INSIDE.get() {
        return as_asked();
    }
    let Some(p) = process::get() else {
        return as_asked();
    };
    INSIDE.set(true);
    // SAFETY: the caller's arguments, passed on.
    let rc = unsafe { create_in(p, stream, flags, with_priority, as_asked) };
    INSIDE.set(false);
    rc
}

thread_local! {
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// # Safety
/// As for [`create`].
unsafe fn create_in(
    p: &process::Process,
    stream: *mut CUstream,
    flags: c_uint,
    with_priority: Option<CuStreamCreateWithPriority>,
    as_asked: impl FnOnce() -> CUresult,
) -> CUresult {
    let greatest = match p.stream_priority {
        StreamPriority::Keep => None,
        StreamPriority::Greatest => greatest_priority(),
    };
    let (Some(greatest), Some(create)) = (
        greatest,
        with_priority.or_else(|| crate::real::driver()?.stream_create_with_priority),
    ) else {
        let rc = as_asked();
        if rc == CUDA_SUCCESS {
            p.stats.streams_created.fetch_add(1, Ordering::Relaxed);
        }
        return rc;
    };
    // SAFETY: the caller's out pointer and flags, with the device's greatest priority.
    let rc = unsafe { create(stream, flags, greatest) };
    if rc == CUDA_SUCCESS {
        p.stats.streams_created.fetch_add(1, Ordering::Relaxed);
        p.stats.streams_raised.fetch_add(1, Ordering::Relaxed);
        p.stats
            .stream_priority
            .store(i64::from(greatest), Ordering::Relaxed);
    }
    rc
}

/// The current context's greatest stream priority (the most negative number), if the driver
/// says.
fn greatest_priority() -> Option<c_int> {
    let range = crate::real::driver()?.stream_priority_range?;
    let (mut least, mut greatest): (c_int, c_int) = (0, 0);
    // SAFETY: a driver query with valid out pointers.
    let rc = unsafe { range(&mut least, &mut greatest) };
    (rc == CUDA_SUCCESS).then_some(greatest)
}

/// Destroy `stream` or begin a capture on it (`change`), after the tracker has covered its
/// launches (see [`crate::track::Tracker::before_stream_change`]).
pub(crate) fn change(stream: CUstream, change: impl FnOnce() -> CUresult) -> CUresult {
    // A driver whose entry point calls another that we hook (an export of ours) comes
    // back here: the outermost call does the work.
    if CHANGING.get() {
        return change();
    }
    let Some(p) = process::get() else {
        return change();
    };
    CHANGING.set(true);
    let rc = p.tracker.before_stream_change(p, stream, change);
    CHANGING.set(false);
    rc
}

thread_local! {
    static CHANGING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
