//! A job for the fake driver: launches kernels the way CUDA programs do, through
//! `dlopen("libcuda.so.1")`, `dlsym("cuGetProcAddress_v2")` and `cuGetProcAddress` (or
//! through the runtime's launch functions), so that an interposer in `LD_PRELOAD` sees what
//! it would see in a real job.
//!
//! ```text
//! mmk-fake-cuda-app [--api driver|driver-ptsz|driver-ex|cooperative|graph|runtime|
//!                          runtime-internal|runtime-ex|runtime-coop|runtime-graph|all]
//!                   [--kernels N] [--duration-us D] [--gap-us G] [--blocks B] [--threads T]
//!                   [--sync-every K] [--die-after K] [--stream-priority P] [--capture K]
//!                   [--destroy-stream] [--then-duration-us D2 --after-ms T]
//! ```
//!
//! `--then-duration-us D2 --after-ms T`: kernels launched T ms after the start run D2 us
//! instead of D (a service whose requests get lighter).
//!
//! Each thread launches on a stream of its own, made with `cuStreamCreate`, or with
//! `cuStreamCreateWithPriority` when `--stream-priority` is given.
//!
//! `--capture K` (with `--api graph` or `runtime-graph`): the graph each thread launches is
//! recorded first by stream capture in global mode, as `torch.cuda.graph` does: K kernels
//! of `--duration-us`, captured while a 20 ms kernel launched just before is still running.
//!
//! `--destroy-stream`: each thread destroys its stream right after its last launch, with
//! the work still queued, and then waits for the context (`cuCtxSynchronize`).
//!
//! `mmk-fake-cuda-app gemm ...` runs one cuBLAS or cuBLASLt GEMM instead (`gemm.rs`).
//!
//! Prints one JSON line:
//! `{"pid","launched","failed","elapsed_ns","launch_ns":{"p50","p99"},"stream_priorities"}`,
//! where `launch_ns` is the wall time of the launch calls themselves and
//! `stream_priorities` what `cuStreamGetPriority` says of each thread's stream.

#[path = "mmk-fake-cuda-app/gemm.rs"]
mod gemm;

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::process::ExitCode;
use std::time::{Duration, Instant};

type CUresult = c_int;
type Handle = *mut c_void;
type Gpa =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
type Init = unsafe extern "C" fn(c_uint) -> CUresult;
type CtxRetain = unsafe extern "C" fn(*mut Handle, c_int) -> CUresult;
type CtxSet = unsafe extern "C" fn(Handle) -> CUresult;
type ModuleLoad = unsafe extern "C" fn(*mut Handle, *const c_void) -> CUresult;
type ModuleGet = unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> CUresult;
type StreamCreate = unsafe extern "C" fn(*mut Handle, c_uint) -> CUresult;
type StreamCreateWithPriority = unsafe extern "C" fn(*mut Handle, c_uint, c_int) -> CUresult;
type StreamGetPriority = unsafe extern "C" fn(Handle, *mut c_int) -> CUresult;
type StreamSync = unsafe extern "C" fn(Handle) -> CUresult;
type CtxSync = unsafe extern "C" fn() -> CUresult;
type GraphCreate = unsafe extern "C" fn(*mut Handle, c_uint) -> CUresult;
type GraphInstantiate = unsafe extern "C" fn(*mut Handle, Handle, u64) -> CUresult;
type BeginCapture = unsafe extern "C" fn(Handle, c_int) -> CUresult;
type EndCapture = unsafe extern "C" fn(Handle, *mut Handle) -> CUresult;
type Launch = unsafe extern "C" fn(
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
type LaunchEx = unsafe extern "C" fn(
    *const LaunchConfig,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
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
type GraphLaunch = unsafe extern "C" fn(Handle, Handle) -> CUresult;
type RtLaunch =
    unsafe extern "C" fn(*const c_void, Dim3, Dim3, *mut *mut c_void, usize, Handle) -> c_int;
type RtLaunchEx = unsafe extern "C" fn(*const RtConfig, *const c_void, *mut *mut c_void) -> c_int;

#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    stream: Handle,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Dim3 {
    x: c_uint,
    y: c_uint,
    z: c_uint,
}

#[repr(C)]
struct RtConfig {
    grid: Dim3,
    block: Dim3,
    smem: usize,
    stream: Handle,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

const PER_THREAD_DEFAULT_STREAM: u64 = 2;
const APIS: [&str; 10] = [
    "driver",
    "driver-ptsz",
    "driver-ex",
    "cooperative",
    "graph",
    "runtime",
    "runtime-internal",
    "runtime-ex",
    "runtime-coop",
    "runtime-graph",
];

#[derive(Clone)]
struct Args {
    api: String,
    kernels: u64,
    duration_us: u64,
    gap_us: u64,
    blocks: u32,
    threads: u32,
    sync_every: u64,
    die_after: Option<u64>,
    stream_priority: Option<c_int>,
    capture: u64,
    destroy_stream: bool,
    /// Kernels launched `after_ms` after the start run this long instead.
    then_duration_us: Option<u64>,
    after_ms: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        api: "driver".into(),
        kernels: 100,
        duration_us: 50,
        gap_us: 0,
        blocks: 132,
        threads: 1,
        sync_every: 0,
        die_after: None,
        stream_priority: None,
        capture: 0,
        then_duration_us: None,
        after_ms: 0,
        destroy_stream: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--api" => a.api = value()?,
            "--kernels" => a.kernels = num(value()?)?,
            "--duration-us" => a.duration_us = num(value()?)?,
            "--gap-us" => a.gap_us = num(value()?)?,
            "--blocks" => a.blocks = num(value()?)? as u32,
            "--threads" => a.threads = num(value()?)?.max(1) as u32,
            "--sync-every" => a.sync_every = num(value()?)?,
            "--die-after" => a.die_after = Some(num(value()?)?),
            "--capture" => a.capture = num(value()?)?,
            "--destroy-stream" => a.destroy_stream = true,
            "--then-duration-us" => a.then_duration_us = Some(num(value()?)?),
            "--after-ms" => a.after_ms = num(value()?)?,
            "--stream-priority" => {
                let v = value()?;
                a.stream_priority = Some(
                    v.parse()
                        .map_err(|_| format!("{flag}: not an integer: {v}"))?,
                );
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.api != "all" && !APIS.contains(&a.api.as_str()) {
        return Err(format!("--api: unknown {:?}", a.api));
    }
    if a.capture > 0 && a.api != "graph" && a.api != "runtime-graph" {
        return Err("--capture needs --api graph or runtime-graph".into());
    }
    Ok(a)
}

fn check(what: &str, rc: CUresult) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed with {rc}"))
    }
}

struct Cuda {
    gpa: Gpa,
    cudart: Handle,
    ctx: Handle,
    kernel: Handle,
}

// SAFETY: plain handles the fake driver accepts from any thread.
unsafe impl Send for Cuda {}
unsafe impl Sync for Cuda {}

impl Cuda {
    unsafe fn get<T>(&self, name: &CStr, flags: u64) -> Result<T, String> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: cuGetProcAddress_v2 with valid pointers.
        let rc = unsafe { (self.gpa)(name.as_ptr(), &mut p, 13000, flags, std::ptr::null_mut()) };
        if rc != 0 || p.is_null() {
            return Err(format!("cuGetProcAddress({name:?}) failed with {rc}"));
        }
        // SAFETY: the caller names the right type for `name`.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }

    unsafe fn runtime<T>(&self, name: &CStr) -> Result<T, String> {
        // SAFETY: dlsym on the runtime's handle (through any interposer's dlsym).
        let p = unsafe { libc::dlsym(self.cudart, name.as_ptr()) };
        if p.is_null() {
            return Err(format!("dlsym({name:?}) found nothing"));
        }
        // SAFETY: the caller names the right type for `name`.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }
}

unsafe fn open() -> Result<Cuda, String> {
    // SAFETY: dlopen/dlsym with constant names, results checked; the driver calls follow
    // the CUDA API's contracts.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        if h.is_null() {
            return Err("dlopen(libcuda.so.1) failed".into());
        }
        let gpa = libc::dlsym(h, c"cuGetProcAddress_v2".as_ptr());
        if gpa.is_null() {
            return Err("dlsym(cuGetProcAddress_v2) found nothing".into());
        }
        let mut cuda = Cuda {
            gpa: std::mem::transmute::<*mut c_void, Gpa>(gpa),
            cudart: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
            kernel: std::ptr::null_mut(),
        };
        check("cuInit", cuda.get::<Init>(c"cuInit", 0)?(0))?;
        check(
            "cuDevicePrimaryCtxRetain",
            cuda.get::<CtxRetain>(c"cuDevicePrimaryCtxRetain", 0)?(&mut cuda.ctx, 0),
        )?;
        check(
            "cuCtxSetCurrent",
            cuda.get::<CtxSet>(c"cuCtxSetCurrent", 0)?(cuda.ctx),
        )?;
        let mut module: Handle = std::ptr::null_mut();
        check(
            "cuModuleLoadData",
            cuda.get::<ModuleLoad>(c"cuModuleLoadData", 0)?(
                &mut module,
                c"spin 1\n".as_ptr().cast(),
            ),
        )?;
        check(
            "cuModuleGetFunction",
            cuda.get::<ModuleGet>(c"cuModuleGetFunction", 0)?(
                &mut cuda.kernel,
                module,
                c"spin".as_ptr(),
            ),
        )?;
        cuda.cudart = libc::dlopen(
            c"libcudart.so.13".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        Ok(cuda)
    }
}

/// One thread's launches, failures, launch-call wall times, and its stream's priority.
type Counts = (u64, u64, Vec<u64>, c_int);

/// One launch of the test kernel through `api`; the driver's (or runtime's) code.
unsafe fn launch_one(
    cuda: &Cuda,
    api: &str,
    b: u32,
    stream: Handle,
    exec: Handle,
    params: *mut *mut c_void,
) -> Result<c_int, String> {
    let one = Dim3 { x: 1, y: 1, z: 1 };
    let grid = Dim3 { x: b, y: 1, z: 1 };
    // SAFETY: the CUDA API's contracts; the caller's kernel parameters outlive the call.
    Ok(unsafe {
        match api {
            "driver" => cuda.get::<Launch>(c"cuLaunchKernel", 0)?(
                cuda.kernel,
                b,
                1,
                1,
                128,
                1,
                1,
                0,
                stream,
                params,
                std::ptr::null_mut(),
            ),
            "driver-ptsz" => cuda.get::<Launch>(c"cuLaunchKernel", PER_THREAD_DEFAULT_STREAM)?(
                cuda.kernel,
                b,
                1,
                1,
                128,
                1,
                1,
                0,
                stream,
                params,
                std::ptr::null_mut(),
            ),
            "driver-ex" => {
                let config = LaunchConfig {
                    grid: [b, 1, 1],
                    block: [128, 1, 1],
                    shared_mem: 0,
                    stream,
                    attrs: std::ptr::null_mut(),
                    num_attrs: 0,
                };
                cuda.get::<LaunchEx>(c"cuLaunchKernelEx", 0)?(
                    &config,
                    cuda.kernel,
                    params,
                    std::ptr::null_mut(),
                )
            }
            "cooperative" => cuda.get::<Coop>(c"cuLaunchCooperativeKernel", 0)?(
                cuda.kernel,
                b,
                1,
                1,
                128,
                1,
                1,
                0,
                stream,
                params,
            ),
            "graph" => cuda.get::<GraphLaunch>(c"cuGraphLaunch", 0)?(exec, stream),
            "runtime" => cuda.runtime::<RtLaunch>(c"cudaLaunchKernel")?(
                cuda.kernel,
                grid,
                one,
                params,
                0,
                stream,
            ),
            "runtime-internal" => cuda.runtime::<RtLaunch>(c"__cudaLaunchKernel")?(
                cuda.kernel,
                grid,
                one,
                params,
                0,
                stream,
            ),
            "runtime-ex" => {
                let config = RtConfig {
                    grid,
                    block: one,
                    smem: 0,
                    stream,
                    attrs: std::ptr::null_mut(),
                    num_attrs: 0,
                };
                cuda.runtime::<RtLaunchEx>(c"cudaLaunchKernelExC")?(&config, cuda.kernel, params)
            }
            "runtime-coop" => cuda.runtime::<RtLaunch>(c"cudaLaunchCooperativeKernel")?(
                cuda.kernel,
                grid,
                one,
                params,
                0,
                stream,
            ),
            "runtime-graph" => cuda.runtime::<GraphLaunch>(c"cudaGraphLaunch")?(exec, stream),
            other => return Err(format!("unknown api {other}")),
        }
    })
}

unsafe fn launches(cuda: &Cuda, a: &Args, thread: u32) -> Result<Counts, String> {
    // SAFETY: the CUDA API's contracts; kernel parameters outlive each launch call.
    unsafe {
        check(
            "cuCtxSetCurrent",
            cuda.get::<CtxSet>(c"cuCtxSetCurrent", 0)?(cuda.ctx),
        )?;
        let mut stream: Handle = std::ptr::null_mut();
        match a.stream_priority {
            None => check(
                "cuStreamCreate",
                cuda.get::<StreamCreate>(c"cuStreamCreate", 0)?(&mut stream, 0),
            )?,
            Some(p) => check(
                "cuStreamCreateWithPriority",
                cuda.get::<StreamCreateWithPriority>(c"cuStreamCreateWithPriority", 0)?(
                    &mut stream,
                    0,
                    p,
                ),
            )?,
        }
        let mut priority: c_int = 0;
        check(
            "cuStreamGetPriority",
            cuda.get::<StreamGetPriority>(c"cuStreamGetPriority", 0)?(stream, &mut priority),
        )?;
        let sync = cuda.get::<StreamSync>(c"cuStreamSynchronize", 0)?;
        let mut graph: Handle = std::ptr::null_mut();
        let mut exec: Handle = std::ptr::null_mut();
        if a.capture > 0 {
            graph = capture(cuda, a, stream)?;
        } else {
            check(
                "cuGraphCreate",
                cuda.get::<GraphCreate>(c"cuGraphCreate", 0)?(&mut graph, 0),
            )?;
        }
        check(
            "cuGraphInstantiate",
            cuda.get::<GraphInstantiate>(c"cuGraphInstantiate", 0)?(&mut exec, graph, 0),
        )?;
        let mut duration = a.duration_us;
        let mut params: [*mut c_void; 1] = [(&mut duration as *mut u64).cast()];
        let started = Instant::now();
        let (mut launched, mut failed) = (0, 0);
        let mut times = Vec::with_capacity(a.kernels as usize);
        let b = a.blocks;
        for i in 0..a.kernels {
            let api = if a.api == "all" {
                APIS[(i as usize + thread as usize) % APIS.len()]
            } else {
                a.api.as_str()
            };
            if let Some(d) = a.then_duration_us
                && started.elapsed() >= Duration::from_millis(a.after_ms)
            {
                // Through the pointer the launch reads the parameter from.
                *params[0].cast::<u64>() = d;
            }
            let t = Instant::now();
            let rc = launch_one(cuda, api, b, stream, exec, params.as_mut_ptr())?;
            times.push(t.elapsed().as_nanos() as u64);
            if rc == 0 {
                launched += 1
            } else {
                failed += 1
            }
            if a.die_after == Some(launched) {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            if a.sync_every > 0 && (i + 1) % a.sync_every == 0 {
                sync(stream);
            }
            if a.gap_us > 0 {
                sync(stream);
                std::thread::sleep(Duration::from_micros(a.gap_us));
            }
        }
        if a.destroy_stream {
            check(
                "cuStreamDestroy",
                cuda.get::<StreamSync>(c"cuStreamDestroy", 0)?(stream),
            )?;
            check(
                "cuCtxSynchronize",
                cuda.get::<CtxSync>(c"cuCtxSynchronize", 0)?(),
            )?;
        } else {
            sync(stream);
        }
        Ok((launched, failed, times, priority))
    }
}

/// Record `a.capture` kernels into a graph by capturing `stream` in global mode, while a
/// kernel launched before the capture still runs.
unsafe fn capture(cuda: &Cuda, a: &Args, stream: Handle) -> Result<Handle, String> {
    const GLOBAL: c_int = 0;
    // SAFETY: the CUDA API's contracts; kernel parameters outlive each launch call.
    unsafe {
        let launch = cuda.get::<Launch>(c"cuLaunchKernel", 0)?;
        let run = |mut duration_us: u64| {
            let mut params: [*mut c_void; 1] = [(&mut duration_us as *mut u64).cast()];
            launch(
                cuda.kernel,
                a.blocks,
                1,
                1,
                128,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check("cuLaunchKernel (before the capture)", run(20_000))?;
        check(
            "cuStreamBeginCapture",
            cuda.get::<BeginCapture>(c"cuStreamBeginCapture", 0)?(stream, GLOBAL),
        )?;
        for _ in 0..a.capture {
            check("cuLaunchKernel (captured)", run(a.duration_us))?;
        }
        // Long enough for anything watching the earlier kernel to look at it meanwhile.
        std::thread::sleep(Duration::from_millis(5));
        let mut graph: Handle = std::ptr::null_mut();
        check(
            "cuStreamEndCapture",
            cuda.get::<EndCapture>(c"cuStreamEndCapture", 0)?(stream, &mut graph),
        )?;
        Ok(graph)
    }
}

/// `mmk-fake-cuda-app gemm ...` (see `gemm.rs`).
fn gemm_mode() -> ExitCode {
    // SAFETY: see open(); the stream belongs to the context open() made current.
    unsafe {
        let prepared = open().and_then(|cuda| {
            let mut stream: Handle = std::ptr::null_mut();
            check(
                "cuStreamCreate",
                cuda.get::<StreamCreate>(c"cuStreamCreate", 0)?(&mut stream, 0),
            )?;
            Ok((stream, cuda.get::<StreamSync>(c"cuStreamSynchronize", 0)?))
        });
        match prepared {
            Ok((stream, sync)) => gemm::run(std::env::args().skip(2), stream, |s| sync(s)),
            Err(e) => {
                eprintln!("mmk-fake-cuda-app: {e}");
                ExitCode::from(1)
            }
        }
    }
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("gemm") {
        return gemm_mode();
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mmk-fake-cuda-app: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    // SAFETY: see open().
    let cuda = match unsafe { open() } {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mmk-fake-cuda-app: {e}");
            return ExitCode::from(1);
        }
    };
    let results: Vec<Result<Counts, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.threads)
            .map(|t| {
                let (cuda, args) = (&cuda, &args);
                // SAFETY: see launches().
                s.spawn(move || unsafe { launches(cuda, args, t) })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a launch thread panicked".into()))
            })
            .collect()
    });
    let (mut launched, mut failed, mut times, mut priorities) = (0, 0, Vec::new(), Vec::new());
    for r in results {
        match r {
            Ok((l, f, t, p)) => {
                launched += l;
                failed += f;
                times.extend(t);
                priorities.push(p.to_string());
            }
            Err(e) => {
                eprintln!("mmk-fake-cuda-app: {e}");
                return ExitCode::from(1);
            }
        }
    }
    times.sort_unstable();
    let q = |p: f64| {
        times
            .get(((times.len() as f64 * p) as usize).min(times.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{{\"pid\":{},\"launched\":{launched},\"failed\":{failed},\"elapsed_ns\":{},\"launch_ns\":{{\"p50\":{},\"p99\":{}}},\"stream_priorities\":[{}]}}",
        std::process::id(),
        started.elapsed().as_nanos(),
        q(0.5),
        q(0.99),
        priorities.join(",")
    );
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
