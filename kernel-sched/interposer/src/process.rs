//! The interposer's state in one job process, made at the first launch or stream creation:
//! the job's class, share and stream priority, its gate slot and policy, record mode,
//! counters, and the completion tracker.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once, PoisonError};
use std::time::Duration;

use mmk_kernel_sched::profile::{Expect, KernelKey, Profile};
use mmk_kernel_sched::trace::{HEADER, TraceRecord};
use mmk_kernel_sched::{
    Charge, Class, Gate, HoldBudget, Policy, PolicyKind, PolicyParams, SlotId, StreamPriority, env,
    monotonic_ns,
};

use crate::cuda::*;
use crate::stats::Stats;
use crate::track::Tracker;

#[derive(Debug)]
pub struct Process {
    pub pid: u32,
    pub class: Class,
    pub mps_fraction: f64,
    /// The partition's gate and this process's slot in it.
    pub gate: Option<(Gate, SlotId)>,
    pub policy_kind: PolicyKind,
    /// The policy, this process's hold budget, and the gate settings' generation the policy
    /// was built from (rebuilt when mmkd changes them), asked one launch at a time.
    pub policy: Mutex<(Box<dyn Policy>, HoldBudget, u32)>,
    /// What happens to the priority of the streams the process creates.
    pub stream_priority: StreamPriority,
    /// Whether launches are tracked to completion for the gate.
    pub track: bool,
    pub record: Option<Recorder>,
    /// The job's kernel profile (`MMK_KSCHED_PROFILE`), by kernel identity.
    pub profile: Option<HashMap<KernelKey, Expect>>,
    pub stats: Stats,
    /// Whether the hooks time themselves (stats requested).
    pub timing: bool,
    stats_path: Option<PathBuf>,
    sm_count: AtomicU32,
    pub seq: AtomicU64,
    pub tracker: Tracker,
    /// Set once the process has left its gate slot at exit: the slot may belong to another
    /// process by then, so late completions must not touch it.
    pub left_gate: std::sync::atomic::AtomicBool,
    /// The device wait (offline processes whose gate asks for it).
    pub device: crate::device::DeviceWait,
}

/// Record mode's trace file.
#[derive(Debug)]
pub struct Recorder {
    file: Mutex<BufWriter<File>>,
}

impl Recorder {
    fn open(path: &PathBuf) -> std::io::Result<Recorder> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let empty = file.metadata()?.len() == 0;
        let mut w = BufWriter::with_capacity(1 << 16, file);
        if empty {
            writeln!(w, "{HEADER}")?;
        }
        Ok(Recorder {
            file: Mutex::new(w),
        })
    }

    pub fn write(&self, line: &TraceRecord) {
        let _ = writeln!(lock(&self.file), "{}", line.to_line());
    }

    fn flush(&self) {
        let _ = lock(&self.file).flush();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

static CURRENT: AtomicPtr<Process> = AtomicPtr::new(std::ptr::null_mut());
static INIT: Mutex<()> = Mutex::new(());

/// `MMK_KSCHED_OFF=1`: read once, without allocating (the `dlsym` hook asks early).
pub fn off() -> bool {
    static OFF: AtomicU32 = AtomicU32::new(2);
    match OFF.load(Ordering::Relaxed) {
        0 => false,
        1 => true,
        _ => {
            // SAFETY: getenv with a constant name; the value is only read here.
            let v = unsafe { libc::getenv(c"MMK_KSCHED_OFF".as_ptr()) };
            // SAFETY: getenv returns a NUL-terminated string or null.
            let on = !v.is_null() && unsafe { CStr::from_ptr(v) }.to_bytes() == b"1";
            OFF.store(u32::from(on), Ordering::Relaxed);
            on
        }
    }
}

/// Set by `mmk_interposer_set_enabled(false)`: every hook goes straight through.
pub static PAUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// This process's state, made on first use; `None` when the interposer is off or paused.
pub fn get() -> Option<&'static Process> {
    if off() || PAUSED.load(Ordering::Relaxed) {
        return None;
    }
    let p = CURRENT.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a leaked Box, never freed.
        return Some(unsafe { &*p });
    }
    let _guard = lock(&INIT);
    let p = CURRENT.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: as above.
        return Some(unsafe { &*p });
    }
    let process: &'static Process = Box::leak(Box::new(Process::from_env()));
    CURRENT.store((process as *const Process).cast_mut(), Ordering::Release);
    static HOOKS: Once = Once::new();
    HOOKS.call_once(|| {
        // SAFETY: registering plain extern "C" functions.
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
        }
    });
    Some(process)
}

/// A forked child starts over: its own slot, its own poller (the parent's thread is not
/// in the child). The parent's state stays leaked in the child's copy of memory.
extern "C" fn after_fork_in_child() {
    CURRENT.store(std::ptr::null_mut(), Ordering::Release);
}

extern "C" fn at_exit() {
    let p = CURRENT.load(Ordering::Acquire);
    if p.is_null() {
        return;
    }
    // SAFETY: a leaked Box, never freed.
    let process = unsafe { &*p };
    let _ = std::panic::catch_unwind(|| process.finish());
}

fn expand(path: &str, pid: u32) -> PathBuf {
    PathBuf::from(path.replace("%p", &pid.to_string()))
}

pub fn warn(message: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "mmk-interposer: {message}");
}

impl Process {
    fn from_env() -> Process {
        let pid = std::process::id();
        let class = match std::env::var(env::CLASS) {
            Ok(v) => v.parse().unwrap_or_else(|e| {
                warn(format_args!(
                    "{}: {e}; treating the job as offline",
                    env::CLASS
                ));
                Class::Offline
            }),
            Err(_) => Class::Offline,
        };
        let stream_priority = match std::env::var(env::STREAM_PRIORITY) {
            Ok(v) => v.parse().unwrap_or_else(|e| {
                let fallback = StreamPriority::default_for(class);
                warn(format_args!(
                    "{}: {e}; using {}",
                    env::STREAM_PRIORITY,
                    fallback.as_str()
                ));
                fallback
            }),
            Err(_) => StreamPriority::default_for(class),
        };
        let mps_fraction = std::env::var(env::MPS_PERCENTAGE)
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v > 0.0)
            .map_or(1.0, |v| (v / 100.0).min(1.0));
        let gate = std::env::var_os(env::GATE).and_then(|path| {
            let path = PathBuf::from(path);
            match Gate::open(&path) {
                Ok(gate) => match gate.join(pid, class, mps_fraction) {
                    Some(slot) => Some((gate, slot)),
                    None => {
                        warn(format_args!(
                            "gate {} has no free slot; this process runs unscheduled",
                            path.display()
                        ));
                        None
                    }
                },
                Err(e) => {
                    warn(format_args!("{e}; this process runs unscheduled"));
                    None
                }
            }
        });
        let generation = gate.as_ref().map_or(0, |(g, _)| g.generation());
        let config = gate.as_ref().map(|(g, _)| g.config());
        let policy_kind = config.map_or(PolicyKind::Passthrough, |c| c.policy);
        let policy = policy_kind
            .build(&config.map_or(PolicyParams::new(Duration::ZERO, 0), |c| c.policy_params()));
        let profile = std::env::var_os(env::PROFILE).and_then(|path| {
            let path = PathBuf::from(path);
            let loaded = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| Profile::parse(&text).map_err(|e| e.to_string()));
            match loaded {
                Ok(p) => Some(p.index()),
                Err(e) => {
                    warn(format_args!(
                        "kernel profile {}: {e}; running without it",
                        path.display()
                    ));
                    None
                }
            }
        });
        let track = gate.is_some() && policy.needs_completions();
        let record = std::env::var(env::RECORD).ok().and_then(|path| {
            let path = expand(&path, pid);
            Recorder::open(&path)
                .map_err(|e| warn(format_args!("record file {}: {e}", path.display())))
                .ok()
        });
        let stats_path = std::env::var(env::STATS).ok().map(|p| expand(&p, pid));
        Process {
            pid,
            class,
            mps_fraction,
            sm_count: AtomicU32::new(config.map_or(0, |c| c.sm_count)),
            gate,
            policy_kind,
            policy: Mutex::new((policy, HoldBudget::new(), generation)),
            stream_priority,
            track,
            record,
            profile,
            timing: stats_path.is_some(),
            stats_path,
            stats: Stats::new(),
            seq: AtomicU64::new(0),
            tracker: Tracker::from_env(),
            left_gate: std::sync::atomic::AtomicBool::new(false),
            device: crate::device::DeviceWait::default(),
        }
    }

    /// A launch `begin` counted in the gate is over (completed, failed, or untrackable).
    /// Nothing happens once the process has left its slot, which may be another's by then.
    pub fn end_in_gate(&self, counted: Option<(SlotId, Charge)>) {
        if let (Some((slot, charge)), Some((gate, _))) = (counted, self.gate.as_ref())
            && !self.left_gate.load(Ordering::Acquire)
        {
            gate.end(slot, &charge, monotonic_ns());
            if self.class == Class::Offline {
                self.device.progress(gate);
            }
        }
    }

    /// SMs of the partition: the gate's, else the device's (asked once), else 1.
    pub fn sm_count(&self) -> u32 {
        let n = self.sm_count.load(Ordering::Relaxed);
        if n != 0 {
            return n;
        }
        let asked = crate::real::driver()
            .and_then(|d| {
                let (get_device, attribute) = (d.ctx_get_device?, d.device_get_attribute?);
                let (mut dev, mut n): (CUdevice, std::ffi::c_int) = (0, 0);
                // SAFETY: driver queries with valid out pointers.
                let ok = unsafe {
                    get_device(&mut dev) == CUDA_SUCCESS
                        && attribute(&mut n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
                            == CUDA_SUCCESS
                };
                ok.then(|| u32::try_from(n).ok()).flatten()
            })
            .filter(|&n| n > 0);
        match asked {
            Some(n) => {
                self.sm_count.store(n, Ordering::Relaxed);
                n
            }
            None => 1,
        }
    }

    /// At exit: wait briefly for what is in flight, flush the trace, write the stats,
    /// leave the gate.
    fn finish(&self) {
        self.tracker.drain(self, Duration::from_secs(2));
        if let Some(r) = &self.record {
            r.flush();
        }
        if let Some(path) = &self.stats_path {
            let json = self.stats.to_json(
                self.pid,
                self.class.as_str(),
                self.policy_kind.as_str(),
                self.gate.is_some(),
                crate::kernel::KERNELS_SEEN.load(Ordering::Relaxed),
                self.stream_priority.as_str(),
                self.device.error(),
            );
            if let Err(e) = std::fs::write(path, json + "\n") {
                warn(format_args!("stats file {}: {e}", path.display()));
            }
        }
        if let Some((gate, slot)) = &self.gate {
            self.left_gate.store(true, Ordering::Release);
            gate.leave(*slot);
        }
    }
}
