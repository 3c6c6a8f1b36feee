//! A fake CUDA driver and runtime for CI, loaded as `libcuda.so.1` (and, as a copy, as
//! `libcudart.so.13`) from a test's library path.
//!
//! - Driver: the entry points the interposer and cudart-style programs use: `cuInit`,
//!   contexts, `cuModuleLoadData` / `cuModuleGetFunction`, names, occupancy, streams (with
//!   priorities 0 to -5, which are recorded but do not change when kernels run), events,
//!   `cuLaunchKernel(Ex)`, cooperative and graph launches (and their `_ptsz` forms), and
//!   `cuGetProcAddress(_v2)`, which maps names and versions to them as the real driver
//!   does.
//! - Stream capture (`cuStreamBeginCapture(_v2)`, `cuStreamEndCapture`,
//!   `cuStreamIsCapturing`, `cuThreadExchangeStreamCaptureMode`) with the driver's rules:
//!   work launched into a capturing stream is recorded into the graph, not run; querying or
//!   synchronizing a captured event or a capturing stream, and (unless the calling thread is
//!   in relaxed mode) querying or synchronizing anything while a capture in global mode is
//!   under way, fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the
//!   capture, whose `cuStreamEndCapture` then fails. A captured graph runs as one kernel over
//!   the whole device for the sum of its kernels' durations.
//! - Kernels "run" on a simulated SM pool: a kernel starts when its stream is free, takes
//!   the duration in microseconds that its first kernel parameter points to (a `u64`;
//!   10 us without parameters), and stretches when the SMs in use exceed the pool. Events
//!   complete when the work before them on their stream has.
//! - Stream memory waits (`cuStreamWaitValue32(_v2)`, the GEQ, EQ, AND and NOR conditions)
//!   on host memory registered with `cuMemHostRegister(_v2)` (whose device pointer,
//!   `cuMemHostGetDevicePointer(_v2)`, is the host address, as under unified addressing):
//!   work queued on a stream behind a wait that has not passed is scheduled only once the
//!   work before it has ended and the condition holds, checked every 10 us by a thread of
//!   the library; events recorded behind it are not ready until then.
//!   `MMK_FAKE_CUDA_NO_HOST_REGISTER=1` makes registering fail, as the real driver does
//!   for a page of a disk file.
//! - Runtime: `cudaLaunchKernel`, `__cudaLaunchKernel`, `cudaLaunchKernelExC`,
//!   `cudaGraphLaunch`, `cudaGetFuncBySymbol`. Like cudart, they reach the driver through
//!   `dlopen("libcuda.so.1")`, `dlsym("cuGetProcAddress_v2")` and `cuGetProcAddress`.
//!
//! A module image is text, one kernel a line: `name blocks_per_sm`.
//!
//! Environment: `MMK_FAKE_CUDA_RECORD_DELAY_US` (each event record takes that long first),
//! `MMK_FAKE_CUDA_SMS` (SMs of the device, default 132) and
//! `MMK_FAKE_CUDA_LOG` (append
//! `pid,kernel,stream,launch_ns,start_ns,end_ns,sm,passed_ns,passed_by_ns` for every kernel
//! that runs; the last stream wait ahead of it on its stream was seen to pass by a read of
//! its word between `passed_ns` and `passed_by_ns`, both 0 without one; `%p` in the path
//! becomes the pid; times are `CLOCK_MONOTONIC` ns).

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

mod blas;
mod device;
mod launch;
mod runtime;
mod stream;
use device::*;
use launch::*;
use runtime::*;
use stream::*;

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

type CUresult = c_int;
type Handle = *mut c_void;

const SUCCESS: CUresult = 0;
const INVALID_VALUE: CUresult = 1;
const NOT_INITIALIZED: CUresult = 3;
const INVALID_CONTEXT: CUresult = 201;
const INVALID_HANDLE: CUresult = 400;
const NOT_FOUND: CUresult = 500;
const NOT_READY: CUresult = 600;
const ILLEGAL_STATE: CUresult = 401;
const STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
const STREAM_CAPTURE_INVALIDATED: CUresult = 901;
const STREAM_CAPTURE_IMPLICIT: CUresult = 906;
const STREAM_CAPTURE_WRONG_THREAD: CUresult = 908;
/// `CUstreamCaptureMode`.
const CAPTURE_MODE_GLOBAL: c_int = 0;
const CAPTURE_MODE_RELAXED: c_int = 2;
/// `CUstreamCaptureStatus`.
const CAPTURE_STATUS_NONE: c_int = 0;
const CAPTURE_STATUS_ACTIVE: c_int = 1;
const CAPTURE_STATUS_INVALIDATED: c_int = 2;
const DEFAULT_DURATION_US: u64 = 10;
const GRAPH_DURATION_US: u64 = 100;
/// The one fake context.
const CONTEXT: usize = 0xC0DE_0000;

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime with a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A kernel handle (`CUfunction`, and `CUkernel` alike).
#[derive(Debug)]
struct Function {
    name: std::ffi::CString,
    blocks_per_sm: u32,
}

#[derive(Debug)]
struct Event {
    /// When the work recorded before it completes; 0 until recorded (complete).
    at: u64,
    /// Recorded into this capturing stream: part of a graph, not of any execution.
    captured: Option<usize>,
}

/// A stream capture under way.
#[derive(Debug)]
struct Capture {
    mode: c_int,
    /// The thread that began it (`thread_id`).
    thread: u64,
    /// What the graph will run for: the captured kernels' durations, summed.
    duration_us: u64,
    invalid: bool,
}

#[derive(Debug)]
struct Gpu {
    sm_count: u32,
    initialized: bool,
    /// When each stream's last kernel ends.
    tails: HashMap<usize, u64>,
    /// Kernels that may still run: (start, end, sm).
    running: Vec<(u64, u64, u32)>,
    events: HashMap<usize, Event>,
    /// Captures under way, by stream.
    captures: HashMap<usize, Capture>,
    /// Streams made with `CU_STREAM_NON_BLOCKING`: they do not synchronize with the
    /// legacy stream, so their captures leave it usable.
    non_blocking: std::collections::HashSet<usize>,
    /// Work queued behind a stream wait that has not passed, by stream, in order.
    deferred: HashMap<usize, std::collections::VecDeque<Deferred>>,
    /// When the last stream wait on each stream was seen to pass: the pass that read its
    /// word began at the first time and read it before the second (a thread that runs late
    /// on a loaded machine reads it well after the pass began). A kernel launched after
    /// its wait passed starts when it is launched, as on the GPU, however long after that
    /// the launching thread got there; the log keeps both times apart.
    passed: HashMap<usize, (u64, u64)>,
    /// Host ranges registered with `cuMemHostRegister`: (start, bytes).
    registered: Vec<(usize, usize)>,
    log: Option<File>,
}

/// Stream work that waits for a `cuStreamWaitValue32` ahead of it.
#[derive(Debug)]
enum Deferred {
    Wait {
        addr: usize,
        value: u32,
        flags: c_uint,
    },
    Kernel {
        name: usize,
        sm: u32,
        duration_us: u64,
        launch_ns: u64,
    },
    Record {
        event: usize,
    },
}

/// Whether a stream wait's condition holds for `v` (`CUstreamWaitValue_flags`).
fn wait_passes(v: u32, value: u32, flags: c_uint) -> bool {
    match flags & 0x3 {
        0 => (v.wrapping_sub(value) as i32) >= 0,
        1 => v == value,
        2 => v & value != 0,
        _ => !(v | value) != 0,
    }
}

fn gpu() -> MutexGuard<'static, Gpu> {
    static GPU: OnceLock<Mutex<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let sm_count = std::env::var("MMK_FAKE_CUDA_SMS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &u32| n > 0)
            .unwrap_or(132);
        let log = std::env::var("MMK_FAKE_CUDA_LOG").ok().and_then(|p| {
            let p = p.replace("%p", &std::process::id().to_string());
            OpenOptions::new().create(true).append(true).open(p).ok()
        });
        Mutex::new(Gpu {
            sm_count,
            initialized: false,
            tails: HashMap::new(),
            running: Vec::new(),
            events: HashMap::new(),
            captures: HashMap::new(),
            non_blocking: std::collections::HashSet::new(),
            deferred: HashMap::new(),
            passed: HashMap::new(),
            registered: Vec::new(),
            log,
        })
    })
    .lock()
    .unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    static CURRENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// This thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
    static CAPTURE_MODE: std::cell::Cell<c_int> = const { std::cell::Cell::new(CAPTURE_MODE_GLOBAL) };
    static THREAD_ID: u64 = {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    };
}

fn thread_id() -> u64 {
    THREAD_ID.with(|id| *id)
}

/// The legacy default stream (null or `CU_STREAM_LEGACY`).
fn is_legacy(stream: Handle) -> bool {
    (stream as usize) <= 1
}

impl Gpu {
    /// A potentially unsafe call (a query or a synchronization) by this thread. The driver
    /// prohibits it while this thread captures in a mode other than relaxed, or another
    /// thread captures in global mode, unless this thread is in relaxed mode; the call
    /// fails and the captures it would disturb are invalidated.
    fn unsafe_call(&mut self) -> Result<(), CUresult> {
        if CAPTURE_MODE.get() == CAPTURE_MODE_RELAXED {
            return Ok(());
        }
        let me = thread_id();
        // A thread in thread-local mode ignores other threads' captures.
        let global = CAPTURE_MODE.get() == CAPTURE_MODE_GLOBAL;
        let mut prohibited = false;
        for c in self.captures.values_mut() {
            let own = c.thread == me && c.mode != CAPTURE_MODE_RELAXED;
            if own || (global && c.thread != me && c.mode == CAPTURE_MODE_GLOBAL) {
                c.invalid = true;
                prohibited = true;
            }
        }
        if prohibited {
            Err(STREAM_CAPTURE_UNSUPPORTED)
        } else {
            Ok(())
        }
    }

    /// Whether a capture under way makes the legacy stream unusable (a blocking stream's).
    fn legacy_blocked(&self) -> bool {
        self.captures.keys().any(|s| !self.non_blocking.contains(s))
    }

    /// The legacy stream was used: it would join every blocking stream's capture.
    fn invalidate_blocking(&mut self) {
        for (s, c) in self.captures.iter_mut() {
            if !self.non_blocking.contains(s) {
                c.invalid = true;
            }
        }
    }

    /// Querying or synchronizing `stream` or an event captured into it: invalid while it
    /// captures (it stands for no execution), and it invalidates the capture.
    fn touch_capturing(&mut self, stream: usize) -> Result<(), CUresult> {
        match self.captures.get_mut(&stream) {
            Some(c) => {
                c.invalid = true;
                Err(STREAM_CAPTURE_UNSUPPORTED)
            }
            None => Ok(()),
        }
    }
}

fn check_ctx() -> Result<(), CUresult> {
    if !gpu().initialized {
        return Err(NOT_INITIALIZED);
    }
    if CURRENT.get() == 0 {
        return Err(INVALID_CONTEXT);
    }
    Ok(())
}

/// Run one kernel: returns when it will end.
unsafe fn run_kernel(
    f: Handle,
    grid: [c_uint; 3],
    stream: Handle,
    params: *mut *mut c_void,
    duration_us: Option<u64>,
) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if f.is_null() {
        return INVALID_HANDLE;
    }
    // SAFETY: a handle this library made.
    let func = unsafe { &*f.cast::<Function>() };
    let duration_us = duration_us.unwrap_or_else(|| {
        if params.is_null() {
            return DEFAULT_DURATION_US;
        }
        // SAFETY: the caller's kernel parameters: the first points to a u64.
        unsafe {
            let first = *params;
            if first.is_null() {
                DEFAULT_DURATION_US
            } else {
                *first.cast::<u64>()
            }
        }
    });
    let blocks: u64 = grid.iter().map(|&g| u64::from(g)).product();
    let mut g = gpu();
    if let Some(c) = g.captures.get_mut(&(stream as usize)) {
        if c.invalid {
            return STREAM_CAPTURE_INVALIDATED;
        }
        c.duration_us += duration_us;
        return SUCCESS;
    }
    if is_legacy(stream) && g.legacy_blocked() {
        // Work on the legacy stream would depend on the capturing streams.
        g.invalidate_blocking();
        return STREAM_CAPTURE_IMPLICIT;
    }
    let sm = blocks
        .div_ceil(u64::from(func.blocks_per_sm.max(1)))
        .min(u64::from(g.sm_count)) as u32;
    let key = stream as usize;
    let now = now_ns();
    match g.deferred.get_mut(&key) {
        Some(queue) => queue.push_back(Deferred::Kernel {
            name: f as usize,
            sm,
            duration_us,
            launch_ns: now,
        }),
        None => g.schedule(key, func, sm, duration_us, now, now),
    }
    SUCCESS
}

impl Gpu {
    /// Put a kernel on `stream`'s timeline: it starts when the stream's last kernel ends
    /// (or at `now`, when it may run) and stretches while the SMs in use exceed the pool.
    fn schedule(
        &mut self,
        key: usize,
        func: &Function,
        sm: u32,
        duration_us: u64,
        launch_ns: u64,
        now: u64,
    ) {
        let start = self.tails.get(&key).copied().unwrap_or(0).max(now);
        self.running.retain(|&(_, end, _)| end > now);
        let busy: u32 = self
            .running
            .iter()
            .filter(|&&(s, e, _)| s <= start && e > start)
            .map(|&(_, _, sm)| sm)
            .sum();
        let factor = (f64::from(busy + sm) / f64::from(self.sm_count)).max(1.0);
        let end = start + (duration_us as f64 * 1000.0 * factor) as u64;
        self.running.push((start, end, sm));
        self.tails.insert(key, end);
        let passed = self.passed.get(&key).copied().unwrap_or((0, 0));
        if let Some(log) = self.log.as_mut() {
            let _ = writeln!(
                log,
                "{},{},{:#x},{launch_ns},{start},{end},{sm},{},{}",
                std::process::id(),
                func.name.to_string_lossy(),
                key,
                passed.0,
                passed.1
            );
        }
    }

    /// Run what deferred work can run now: per stream, a wait passes once the work before
    /// it has ended and its condition holds; what follows it is scheduled up to the next
    /// wait. Returns whether any deferred work is left.
    fn release_deferred(&mut self) -> bool {
        let now = now_ns();
        let keys: Vec<usize> = self.deferred.keys().copied().collect();
        for key in keys {
            let Some(mut queue) = self.deferred.remove(&key) else {
                continue;
            };
            while let Some(front) = queue.front() {
                match *front {
                    Deferred::Wait { addr, value, flags } => {
                        let idle = self.tails.get(&key).copied().unwrap_or(0) <= now;
                        // SAFETY: a registered host address the caller keeps mapped.
                        let v = unsafe {
                            (*(addr as *const std::sync::atomic::AtomicU32))
                                .load(std::sync::atomic::Ordering::Acquire)
                        };
                        if !(idle && wait_passes(v, value, flags)) {
                            break;
                        }
                        self.passed.insert(key, (now, now_ns()));
                    }
                    Deferred::Kernel {
                        name,
                        sm,
                        duration_us,
                        launch_ns,
                    } => {
                        // SAFETY: a function handle this library made (never freed).
                        let func = unsafe { &*(name as *const Function) };
                        // At the time the wait ahead of it was seen to pass, not later: a
                        // word read open before another process closed it lets the kernel
                        // start before that, however late this thread gets here.
                        self.schedule(key, func, sm, duration_us, launch_ns, now);
                    }
                    Deferred::Record { event } => {
                        let at = self.tails.get(&key).copied().unwrap_or(0).max(now);
                        if let Some(e) = self.events.get_mut(&event) {
                            e.at = at;
                        }
                    }
                }
                queue.pop_front();
            }
            if !queue.is_empty() {
                self.deferred.insert(key, queue);
            }
        }
        !self.deferred.is_empty()
    }
}

/// The thread that lets deferred work go (started by the first stream wait).
fn start_releaser() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("fake-cuda-waits".into())
            .spawn(|| {
                loop {
                    let left = gpu().release_deferred();
                    std::thread::sleep(std::time::Duration::from_micros(if left {
                        10
                    } else {
                        200
                    }));
                }
            });
    });
}

/// Wait while `stream` (or, with `None`, any stream) has deferred work.
fn wait_deferred(stream: Option<usize>) {
    loop {
        let pending = {
            let g = gpu();
            match stream {
                Some(s) => g.deferred.contains_key(&s),
                None => !g.deferred.is_empty(),
            }
        };
        if !pending {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(10));
    }
}
