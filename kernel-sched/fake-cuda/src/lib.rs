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

fn sleep_until(t: u64) {
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

// ---- streams and events ----

/// The device's stream priorities, as an H100/H200 reports them: 0 is the least (and the
/// default), -5 the greatest.
const LEAST_PRIORITY: c_int = 0;
const CU_STREAM_NON_BLOCKING: c_uint = 1;
const GREATEST_PRIORITY: c_int = -5;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, flags: c_uint) -> CUresult {
    // SAFETY: the caller's arguments, passed on.
    unsafe { cuStreamCreateWithPriority(stream, flags, LEAST_PRIORITY) }
}

/// A stream is a unique address holding its priority. A priority outside the range is
/// clamped to it, as the real driver does.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut Handle,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if stream.is_null() {
        return INVALID_VALUE;
    }
    let priority = priority.clamp(GREATEST_PRIORITY, LEAST_PRIORITY);
    let s: Handle = Box::into_raw(Box::new(i64::from(priority))).cast();
    if flags & CU_STREAM_NON_BLOCKING != 0 {
        gpu().non_blocking.insert(s as usize);
    }
    // SAFETY: checked non-null.
    unsafe { *stream = s };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    // SAFETY: each pointer is written only when non-null, as the driver allows.
    unsafe {
        if !least.is_null() {
            *least = LEAST_PRIORITY;
        }
        if !greatest.is_null() {
            *greatest = GREATEST_PRIORITY;
        }
    }
    SUCCESS
}

/// The priority of a stream this library made; the default streams (null, legacy,
/// per-thread) have the least.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority(stream: Handle, priority: *mut c_int) -> CUresult {
    if priority.is_null() {
        return INVALID_VALUE;
    }
    let p = if (stream as usize) <= 2 {
        LEAST_PRIORITY
    } else {
        // SAFETY: a stream this library made points to its priority.
        unsafe { *stream.cast::<i64>() as c_int }
    };
    // SAFETY: checked non-null.
    unsafe { *priority = p };
    SUCCESS
}

/// Destroys a stream this library made: the call returns at once, and the work queued on
/// it still runs, as with the real driver. The default streams cannot be destroyed.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if is_legacy(stream) || stream as usize == 2 {
        return INVALID_HANDLE;
    }
    let mut g = gpu();
    if g.captures.contains_key(&(stream as usize)) {
        return ILLEGAL_STATE;
    }
    g.non_blocking.remove(&(stream as usize));
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(stream: Handle) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    let until = {
        let mut g = gpu();
        if let Err(rc) = g
            .unsafe_call()
            .and_then(|()| g.touch_capturing(stream as usize))
        {
            return rc;
        }
        if is_legacy(stream) && g.legacy_blocked() {
            g.invalidate_blocking();
            return STREAM_CAPTURE_IMPLICIT;
        }
        g.tails.get(&(stream as usize)).copied().unwrap_or(0)
    };
    sleep_until(until);
    wait_deferred(Some(stream as usize));
    let until = gpu().tails.get(&(stream as usize)).copied().unwrap_or(0);
    sleep_until(until);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, _flags: c_uint) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if event.is_null() {
        return INVALID_VALUE;
    }
    let e = Box::into_raw(Box::new(0u8)).cast::<c_void>();
    gpu().events.insert(
        e as usize,
        Event {
            at: 0,
            captured: None,
        },
    );
    // SAFETY: checked non-null.
    unsafe { *event = e };
    SUCCESS
}

/// `MMK_FAKE_CUDA_RECORD_DELAY_US`: how long each `cuEventRecord` takes before it does
/// anything (0 by default), outside the fake's own lock: a driver that is slow to record an
/// event, as under load, without holding up the fake's other entry points.
fn record_delay() -> std::time::Duration {
    static DELAY: OnceLock<std::time::Duration> = OnceLock::new();
    *DELAY.get_or_init(|| {
        std::env::var("MMK_FAKE_CUDA_RECORD_DELAY_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(std::time::Duration::ZERO, std::time::Duration::from_micros)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(event: Handle, stream: Handle) -> CUresult {
    let delay = record_delay();
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let mut g = gpu();
    let captured = g.captures.contains_key(&(stream as usize));
    if !captured && is_legacy(stream) && g.legacy_blocked() {
        g.invalidate_blocking();
        return STREAM_CAPTURE_IMPLICIT;
    }
    let at = g
        .tails
        .get(&(stream as usize))
        .copied()
        .unwrap_or(0)
        .max(now_ns());
    if !g.events.contains_key(&(event as usize)) {
        return INVALID_HANDLE;
    }
    let deferred = !captured
        && match g.deferred.get_mut(&(stream as usize)) {
            Some(queue) => {
                queue.push_back(Deferred::Record {
                    event: event as usize,
                });
                true
            }
            None => false,
        };
    if let Some(e) = g.events.get_mut(&(event as usize)) {
        // Behind a wait: not ready until the releaser schedules what is ahead of it.
        e.at = if deferred { u64::MAX } else { at };
        e.captured = captured.then_some(stream as usize);
    }
    SUCCESS
}

fn event_at(event: Handle) -> Result<u64, CUresult> {
    gpu()
        .events
        .get(&(event as usize))
        .map(|e| e.at)
        .ok_or(INVALID_HANDLE)
}

/// When `event` completes, for a query or a synchronization (potentially unsafe calls).
fn event_wait_at(event: Handle) -> Result<u64, CUresult> {
    let mut g = gpu();
    g.unsafe_call()?;
    let e = g.events.get(&(event as usize)).ok_or(INVALID_HANDLE)?;
    let (at, captured) = (e.at, e.captured);
    match captured {
        Some(stream) => g.touch_capturing(stream).map(|()| at),
        None => Ok(at),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(event: Handle) -> CUresult {
    match event_wait_at(event) {
        Ok(at) if at <= now_ns() => SUCCESS,
        Ok(_) => NOT_READY,
        Err(rc) => rc,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    loop {
        match event_wait_at(event) {
            // Behind a stream wait that has not passed.
            Ok(u64::MAX) => std::thread::sleep(std::time::Duration::from_micros(10)),
            Ok(at) => {
                sleep_until(at);
                return SUCCESS;
            }
            Err(rc) => return rc,
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    if ms.is_null() {
        return INVALID_VALUE;
    }
    let (a, b) = match (event_at(start), event_at(end)) {
        (Ok(a), Ok(b)) => (a, b),
        _ => return INVALID_HANDLE,
    };
    if a > now_ns() || b > now_ns() {
        return NOT_READY;
    }
    // SAFETY: checked non-null.
    unsafe { *ms = (b as f64 - a as f64) as f32 / 1e6 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy(event: Handle) -> CUresult {
    match gpu().events.remove(&(event as usize)) {
        Some(_) => SUCCESS,
        None => INVALID_HANDLE,
    }
}

// ---- host memory and stream waits ----

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if p.is_null() || bytes == 0 || std::env::var_os("MMK_FAKE_CUDA_NO_HOST_REGISTER").is_some() {
        return INVALID_VALUE;
    }
    let mut g = gpu();
    let start = p as usize;
    if g.registered
        .iter()
        .any(|&(s, n)| start < s + n && s < start + bytes)
    {
        // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        return 712;
    }
    g.registered.push((start, bytes));
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister(p: *mut c_void, bytes: usize, flags: c_uint) -> CUresult {
    cuMemHostRegister_v2(p, bytes, flags)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    let mut g = gpu();
    match g.registered.iter().position(|&(s, _)| s == p as usize) {
        Some(i) => {
            g.registered.swap_remove(i);
            SUCCESS
        }
        // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        None => 713,
    }
}

/// The device address of registered host memory: the host address itself.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    dptr: *mut u64,
    p: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    let at = p as usize;
    if !gpu().registered.iter().any(|&(s, n)| at >= s && at < s + n) {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *dptr = at as u64 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer(
    dptr: *mut u64,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments.
    unsafe { cuMemHostGetDevicePointer_v2(dptr, p, flags) }
}

/// Work queued on `stream` after this waits until the work before it has ended and the
/// 32-bit word at `addr` (registered host memory) meets the condition.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitValue32_v2(
    stream: Handle,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    let at = addr as usize;
    let mut g = gpu();
    if !at.is_multiple_of(4)
        || !g
            .registered
            .iter()
            .any(|&(s, n)| at >= s && at + 4 <= s + n)
    {
        return INVALID_VALUE;
    }
    if g.captures.contains_key(&(stream as usize)) {
        // A wait node in a graph is not modelled.
        return STREAM_CAPTURE_UNSUPPORTED;
    }
    g.deferred
        .entry(stream as usize)
        .or_default()
        .push_back(Deferred::Wait {
            addr: at,
            value,
            flags,
        });
    g.release_deferred();
    drop(g);
    start_releaser();
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitValue32(
    stream: Handle,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> CUresult {
    cuStreamWaitValue32_v2(stream, addr, value, flags)
}

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
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    stream: Handle,
    attrs: *mut c_void,
    num_attrs: c_uint,
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
fn graph_function() -> Handle {
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

// ---- cuGetProcAddress ----

const PER_THREAD_DEFAULT_STREAM: u64 = 2;

fn proc_address(name: &[u8], flags: u64) -> Option<usize> {
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
struct RuntimeDriver {
    launch: usize,
    cooperative: usize,
    launch_ex: usize,
    graph: usize,
    /// For the fake cuBLAS's own kernel (`blas`).
    module_load: usize,
    module_get_function: usize,
}

fn runtime_driver() -> Option<&'static RuntimeDriver> {
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

type DriverLaunch = unsafe extern "C" fn(
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

unsafe fn runtime_launch(
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
