//! The per-partition gate: a shared-memory segment that every job process of a partition
//! maps, and through which offline launches wait for online work.
//!
//! Layout (version 7, all fields atomics, native endian):
//!
//! ```text
//! header (128 bytes)  magic "MMKGATE1", version, slot count, partition SMs, policy,
//!                     anti-starvation base, hard bound, epoch (the futex word), waiters,
//!                     offline depth cap, GEMM cut size, totals of the processes that left
//!                     (launches, held, held ns, forced), device wait on or off, the device
//!                     word and when it last closed, the offline hold budget, whether
//!                     offline work pauses while online work runs, the settings' generation
//! slots  (64 x 512)   one per job process: pid (0 = free), class, MPS share,
//!                     kernels, SMs (filled and asked for), compute- and memory-bound
//!                     kernels and expected
//!                     run time in flight, the end of the gap an idle online process
//!                     expects, launch / held / forced counters, the time it had
//!                     kernels in flight, whether mmkd asks it to count its launches
//!                     without tracking them, and (online processes) the lengths of
//!                     its busy periods in 80 buckets ([`crate::latency`])
//! ```
//!
//! - The online path is lock-free and touches its own slot (and, with the device wait on,
//!   the device word): a few `fetch_add`s (and a compare-and-swap of the word) before a
//!   launch, the same backwards when the poller sees it complete. A completion bumps the epoch and wakes waiters only
//!   when some process is waiting.
//! - An offline launch that its policy holds sleeps on the epoch (`FUTEX_WAIT` on the shared
//!   mapping) until in-flight work completes, the policy's recheck time passes, its
//!   process's hold budget ([`HoldBudget`]) is spent, or the hard bound runs out.
//! - A process that dies with work in flight cannot leave others waiting: a waiter whose
//!   sleep times out drops the slots whose process is gone.
//! - The device word (see [`DeviceWord`]) says, for the GPU itself, whether online work is
//!   in flight: with [`GateConfig::device_wait`] on, each offline launch is preceded by a
//!   `cuStreamWaitValue32` on it, so that offline kernels already queued in their stream do
//!   not start while an online launch runs.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::latency::BUCKETS;
use crate::policy::{Class, Policy, PolicyKind, PolicyParams};
use crate::profile::Intensity;

mod file;
mod launches;
pub use file::{GateDir, GateFile, GateOwner, GateSnapshot};

const MAGIC: u64 = u64::from_le_bytes(*b"MMKGATE1");
const VERSION: u32 = 7;
/// Job processes one partition's gate can hold.
pub const SLOTS: usize = 64;
/// A held launch looks for dead processes at least this often.
const LIVENESS_CHECK: Duration = Duration::from_millis(20);

#[repr(C, align(64))]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    slots: AtomicU32,
    sm_count: AtomicU32,
    policy: AtomicU32,
    base_ns: AtomicU64,
    max_hold_ns: AtomicU64,
    /// Bumped on every completion a waiter may care about; the futex word.
    epoch: AtomicU32,
    /// Held launches waiting on `epoch` (registered before their last look at what is in
    /// flight; see `Gate::admit`).
    waiters: AtomicU32,
    /// [`GateConfig::offline_depth`].
    offline_depth: AtomicU32,
    /// [`GateConfig::gemm_slice_mflop`].
    gemm_slice_mflop: AtomicU32,
    /// Counters of the slots that were left or reaped, so they outlive their processes.
    total_launches: AtomicU64,
    total_held: AtomicU64,
    total_held_ns: AtomicU64,
    total_forced: AtomicU64,
    /// [`GateConfig::device_wait`] (0 or 1).
    device_wait: AtomicU32,
    /// What offline streams wait on (see [`DeviceWord`]); a page of this segment is
    /// registered with the driver in each offline process, so the GPU reads it.
    device_word: AtomicU32,
    /// When the device word last closed, or a forced opening of it last ended
    /// (`CLOCK_MONOTONIC` ns).
    device_closed_ns: AtomicU64,
    /// [`GateConfig::device_wait_grain_us`].
    device_wait_grain_us: AtomicU32,
    /// [`GateConfig::hold_budget_pct`].
    hold_budget_pct: AtomicU32,
    /// [`GateConfig::offline_paused`] (0 or 1).
    offline_paused: AtomicU32,
    /// Bumped by every change of the settings: a process rebuilds its policy when it sees
    /// a new one.
    generation: AtomicU32,
}

#[repr(C, align(128))]
struct Slot {
    pid: AtomicU32,
    class: AtomicU32,
    /// MPS share in thousandths.
    share_milli: AtomicU32,
    inflight: AtomicU32,
    inflight_sm: AtomicU32,
    inflight_compute: AtomicU32,
    inflight_memory: AtomicU32,
    /// SMs the kernels in flight ask for, not capped at the partition (see
    /// [`Charge::ask`]); what mmkd learns a job's demand from.
    inflight_ask: AtomicU32,
    launches: AtomicU64,
    held: AtomicU64,
    held_ns: AtomicU64,
    forced: AtomicU64,
    completed: AtomicU64,
    max_held_ns: AtomicU64,
    /// Expected run time of the kernels in flight (from the job's profile).
    inflight_expected_ns: AtomicU64,
    /// Set by an online process whose last kernel completed: when its profile expects the
    /// next one (`CLOCK_MONOTONIC` ns); 0 when it expects nothing.
    gap_until_ns: AtomicU64,
    /// When the process last went from no kernel in flight to one (`CLOCK_MONOTONIC` ns).
    busy_since_ns: AtomicU64,
    /// Time it had kernels in flight, summed over its busy periods that ended: the GPU
    /// time attributed to it (ns).
    busy_ns: AtomicU64,
    /// 1: mmkd asks the process to count its launches and track none to completion
    /// ([`Gate::set_untracked`]); 0 at join.
    untracked: AtomicU32,
    /// Online processes: how many of its busy periods (see [`crate::latency`]) fell in
    /// each bucket; counts wrap, readers take differences.
    busy_hist: [AtomicU32; BUCKETS],
}

#[repr(C)]
struct Segment {
    header: Header,
    slots: [Slot; SLOTS],
}

impl Segment {
    /// The settings mmkd wrote in the header. Whatever a job process wrote there instead is
    /// read as it is, with an unknown policy read as `passthrough`.
    fn config(&self) -> GateConfig {
        let h = &self.header;
        GateConfig {
            sm_count: h.sm_count.load(Ordering::Relaxed),
            policy: PolicyKind::from_code(h.policy.load(Ordering::Relaxed))
                .unwrap_or(PolicyKind::Passthrough),
            base: Duration::from_nanos(h.base_ns.load(Ordering::Relaxed)),
            max_hold: Duration::from_nanos(h.max_hold_ns.load(Ordering::Relaxed)),
            offline_depth: h.offline_depth.load(Ordering::Relaxed),
            gemm_slice_mflop: h.gemm_slice_mflop.load(Ordering::Relaxed),
            device_wait: h.device_wait.load(Ordering::Relaxed) != 0,
            device_wait_grain_us: h.device_wait_grain_us.load(Ordering::Relaxed),
            hold_budget_pct: h.hold_budget_pct.load(Ordering::Relaxed),
            offline_paused: h.offline_paused.load(Ordering::Relaxed) != 0,
        }
    }

    fn totals(&self) -> Totals {
        let h = &self.header;
        let mut t = Totals {
            launches: h.total_launches.load(Ordering::Relaxed),
            held: h.total_held.load(Ordering::Relaxed),
            held_ns: h.total_held_ns.load(Ordering::Relaxed),
            forced: h.total_forced.load(Ordering::Relaxed),
        };
        // Saturating: the segment is shared with every job process, which may write
        // anything into it.
        for s in self.slot_stats() {
            t.launches = t.launches.saturating_add(s.launches);
            t.held = t.held.saturating_add(s.held);
            t.held_ns = t.held_ns.saturating_add(s.held_ns);
            t.forced = t.forced.saturating_add(s.forced);
        }
        t
    }

    fn slot_stats(&self) -> Vec<SlotStats> {
        self.slots.iter().filter_map(stats_of).collect()
    }

    /// Whether this is a gate of this build: its magic, layout version, slot count and
    /// policy code. `size` is the file's, for the error.
    fn check(&self, path: &Path, size: u64) -> Result<()> {
        let h = &self.header;
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err(GateError::NotAGate {
                path: path.to_owned(),
                size,
            });
        }
        let found = h.version.load(Ordering::Relaxed);
        if found != VERSION || h.slots.load(Ordering::Relaxed) as usize != SLOTS {
            return Err(GateError::Version {
                path: path.to_owned(),
                found,
            });
        }
        let code = h.policy.load(Ordering::Relaxed);
        if PolicyKind::from_code(code).is_none() {
            return Err(GateError::Policy {
                path: path.to_owned(),
                code,
            });
        }
        Ok(())
    }
}

/// Bytes of a gate file.
pub const SEGMENT_BYTES: usize = std::mem::size_of::<Segment>();

/// The gate's hard bound on any hold, unless configured otherwise.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_millis(100);

/// No launch is held longer than this, whatever a gate's `max_hold` says.
pub const MAX_HOLD_CEILING: Duration = Duration::from_secs(10);

/// The share of its time an offline process may spend held, unless configured otherwise
/// (see [`HoldBudget`]).
pub const DEFAULT_HOLD_BUDGET_PCT: u32 = 10;

/// How mmkd configures a partition's gate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateConfig {
    /// SMs of the partition (a MIG instance's, or the whole GPU's).
    pub sm_count: u32,
    pub policy: PolicyKind,
    /// The anti-starvation base (see [`crate::policy::Mmk`]).
    pub base: Duration,
    /// No launch waits longer than this, whatever the policy says.
    pub max_hold: Duration,
    /// `mmk` only: while an online job is present, at most this many offline kernels in
    /// flight in the partition (0: no cap; see [`crate::policy::Mmk`]).
    pub offline_depth: u32,
    /// Offline jobs' cuBLAS GEMMs of more than this many million floating-point
    /// operations are cut into pieces of at most this size (0: not cut; see
    /// [`crate::slice`]).
    pub gemm_slice_mflop: u32,
    /// Offline launches also wait on the GPU, behind a stream wait on the device word, so
    /// that what is queued in an offline stream does not start while online work is in
    /// flight (see [`DeviceWord`]). Needs the gate file on a memory file system
    /// (`/dev/shm`): the driver cannot register a page of a disk file, and the
    /// interposer then goes without.
    pub device_wait: bool,
    /// With `device_wait`: a wait goes before a launch only once the expected run time (from
    /// the job's kernel profile) of the launches since the last wait on that stream would
    /// pass this many us, so that at most about this much offline work starts after the
    /// device word closes; 0 puts a wait before every launch. A kernel the profile does not
    /// know always gets a wait before it and after it.
    pub device_wait_grain_us: u32,
    /// Each offline process is held at most this share of its time, in percent (see
    /// [`HoldBudget`]); 100: no budget, only the policy's bounds.
    pub hold_budget_pct: u32,
    /// `mmk` only: offline launches wait while any online kernel is in flight, up to the
    /// hard bound, whatever the hold budget (see [`crate::policy::Mmk`]): offline work
    /// pauses while online work runs. mmkd's SLO control turns it on at its highest level.
    pub offline_paused: bool,
}

impl GateConfig {
    /// 250 us base (2.5 % of a 10 ms request, Orion's DUR_THRESHOLD), a 100 ms hard bound,
    /// no offline depth cap, no GEMM slicing, the default hold budget.
    pub fn new(sm_count: u32, policy: PolicyKind) -> GateConfig {
        GateConfig {
            sm_count,
            policy,
            base: Duration::from_micros(250),
            max_hold: DEFAULT_MAX_HOLD,
            offline_depth: 0,
            gemm_slice_mflop: 0,
            device_wait: false,
            device_wait_grain_us: 0,
            hold_budget_pct: DEFAULT_HOLD_BUDGET_PCT,
            offline_paused: false,
        }
    }

    /// Whether an offline launch may wait on the online kernels in flight: a policy other
    /// than `passthrough` with a hold budget above 0, the device wait, a depth cap, or
    /// offline work paused.
    /// Where none is on, no process's completions serve the policy, only mmkd's learning
    /// and metrics, and mmkd may ask a process to stop tracking them
    /// ([`Gate::set_untracked`]).
    pub fn waits_on_online(&self) -> bool {
        waits_on_online(
            self.policy,
            self.hold_budget_pct,
            self.device_wait,
            self.offline_depth.max(u32::from(self.offline_paused)),
        )
    }

    /// Refuses settings no gate can work with.
    pub fn check(&self) -> Result<()> {
        if self.sm_count == 0 {
            return Err(GateError::Config("sm_count must be at least 1".into()));
        }
        if self.max_hold.is_zero() || self.max_hold > MAX_HOLD_CEILING {
            return Err(GateError::Config(format!(
                "max_hold must be above zero and at most {MAX_HOLD_CEILING:?}"
            )));
        }
        Ok(())
    }

    /// What this gate's policy is built from.
    pub fn policy_params(&self) -> PolicyParams {
        PolicyParams {
            base: self.base,
            sm_count: self.sm_count,
            offline_depth: self.offline_depth,
            offline_paused: self.offline_paused,
        }
    }
}

/// See [`GateConfig::waits_on_online`].
fn waits_on_online(
    policy: PolicyKind,
    hold_budget_pct: u32,
    device_wait: bool,
    offline_depth: u32,
) -> bool {
    policy != PolicyKind::Passthrough && (hold_budget_pct > 0 || device_wait || offline_depth > 0)
}

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("gate {path}: {op}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("gate {path} is not an mmk gate (bad magic or size {size} bytes)")]
    NotAGate { path: PathBuf, size: u64 },
    #[error("gate {path} has layout version {found}, this build knows {VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("gate {path} has an unknown policy code {code}")]
    Policy { path: PathBuf, code: u32 },
    #[error("gate config: {0}")]
    Config(String),
    #[error("gate folder {path}: {why}")]
    UnsafeDir { path: PathBuf, why: String },
}

pub type Result<T> = std::result::Result<T, GateError>;

/// A slot in the gate: one job process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotId(usize);

/// What a slot's process has done, for status and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotStats {
    pub pid: u32,
    pub class: Option<Class>,
    pub share_milli: u32,
    /// mmkd asked the process to count its launches without tracking them.
    pub untracked: bool,
    pub inflight: u32,
    pub inflight_sm: u32,
    pub inflight_ask: u32,
    pub launches: u64,
    pub held: u64,
    pub held_ns: u64,
    pub forced: u64,
    pub completed: u64,
    pub max_held_ns: u64,
    /// GPU time attributed to the process: time it had kernels in flight, over its busy
    /// periods that ended (ns).
    pub busy_ns: u64,
    /// Online processes: its busy periods by length ([`crate::latency`]); the counts wrap.
    pub busy_hist: [u32; BUCKETS],
}

/// A gate's counters over all the processes that used it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub launches: u64,
    pub held: u64,
    pub held_ns: u64,
    pub forced: u64,
}

/// How a launch went through the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitOutcome {
    /// Time the launch was held (zero when it went at once).
    pub waited: Duration,
    /// It went because it had waited as long as it may, not because it fit.
    pub forced: bool,
}

/// How much of its time one offline process may spend held: a bucket that fills at
/// [`GateConfig::hold_budget_pct`] of the time that passes, up to [`HoldBudget::BURST`],
/// and that every hold empties by as long as it lasted. A launch that its policy would hold
/// after the bucket is empty goes at once (counted as forced); 0 % holds nothing. Waits at
/// `mmk`'s depth cap are for offline work already in flight and neither spend the bucket
/// nor end when it is empty. So an offline job is never
/// held more than about that share of its time, however busy the online jobs beside it
/// are: against a light online job the gate holds what the policy says; against a busy one
/// it holds for the online job's isolated requests first and lets the training run in the
/// rest. The bucket is the process's own (the interposer keeps it beside its policy).
#[derive(Debug, Clone)]
pub struct HoldBudget {
    left_ns: u64,
    /// When it was last looked at (`CLOCK_MONOTONIC` ns, or a simulator's clock).
    at_ns: Option<u64>,
}

impl Default for HoldBudget {
    fn default() -> HoldBudget {
        HoldBudget::new()
    }
}

impl HoldBudget {
    /// The most a process may be held in one stretch of holds, after a quiet spell.
    pub const BURST: Duration = Duration::from_millis(50);

    /// A full bucket.
    pub fn new() -> HoldBudget {
        HoldBudget {
            left_ns: nanos(HoldBudget::BURST),
            at_ns: None,
        }
    }

    /// What may still be held at `now_ns` with a budget of `pct` percent; `None` for no
    /// budget (100 % or more).
    pub fn available(&mut self, pct: u32, now_ns: u64) -> Option<Duration> {
        let since = self.at_ns.map(|at| now_ns.saturating_sub(at));
        self.at_ns = Some(now_ns);
        if pct >= 100 {
            return None;
        }
        if pct == 0 {
            return Some(Duration::ZERO);
        }
        if let Some(since) = since {
            let refill = since.saturating_mul(u64::from(pct)) / 100;
            self.left_ns = self
                .left_ns
                .saturating_add(refill)
                .min(nanos(HoldBudget::BURST));
        }
        Some(Duration::from_nanos(self.left_ns))
    }

    /// Take a hold of `held` out of the bucket.
    pub fn spend(&mut self, held: Duration) {
        self.left_ns = self.left_ns.saturating_sub(nanos(held));
    }
}

/// What one launch puts in flight, to take back when it completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Charge {
    /// SMs of the partition the kernel fills (its ask, at most the partition's).
    pub sm: u32,
    /// SMs the kernel asks for: its blocks over the blocks an SM holds, whatever the
    /// partition has (at most 65,535). 0: not known.
    pub ask: u32,
    /// Expected run time from the job's profile (0 when unknown).
    pub expected_ns: u64,
    pub intensity: Intensity,
    /// The GPU gap the profile expects after it, for an online job (see
    /// [`InFlight::online_gap_until_ns`]).
    pub gap_after_ns: Option<u64>,
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of traces, gaps and policies, the same in
/// every process of the node.
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime with a valid out pointer (vDSO, no syscall).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// A mapped gate segment.
#[derive(Debug)]
pub struct Gate {
    seg: NonNull<Segment>,
    path: PathBuf,
}

// SAFETY: the segment holds only atomics, and the mapping lives as long as the Gate.
unsafe impl Send for Gate {}
// SAFETY: as above; every access goes through atomic operations.
unsafe impl Sync for Gate {}

impl Drop for Gate {
    fn drop(&mut self) {
        // SAFETY: seg was returned by mmap with SEGMENT_BYTES and is unmapped once.
        unsafe {
            libc::munmap(self.seg.as_ptr().cast(), SEGMENT_BYTES);
        }
    }
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> GateError + 'a {
    move |source| GateError::Io {
        path: path.to_owned(),
        op,
        source,
    }
}

/// Allocates the blocks of a gate file (and sets its size), so that writing into its
/// mapping cannot fault for want of space.
fn reserve(file: &File, path: &Path) -> Result<()> {
    loop {
        // SAFETY: an open file descriptor and a length; no memory is passed.
        let rc =
            unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, SEGMENT_BYTES as libc::off_t) };
        // posix_fallocate returns the error number; it does not set errno.
        match rc {
            0 => return Ok(()),
            libc::EINTR => continue,
            errno => {
                return Err(io_err(path, "reserve space")(io::Error::from_raw_os_error(
                    errno,
                )));
            }
        }
    }
}

fn map(file: &File, path: &Path) -> Result<NonNull<Segment>> {
    // SAFETY: a fresh shared mapping of an open file of at least SEGMENT_BYTES; the result
    // is checked before use.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SEGMENT_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io_err(path, "mmap")(io::Error::last_os_error()));
    }
    NonNull::new(ptr.cast::<Segment>()).ok_or_else(|| GateError::NotAGate {
        path: path.to_owned(),
        size: 0,
    })
}

impl Gate {
    /// Create the gate at `path`, or take over the one a previous mmkd left there (its slots
    /// and counters stay, so running jobs keep their places); either way it gets `config`.
    pub fn create(path: &Path, config: &GateConfig) -> Result<Gate> {
        config.check()?;
        // A gate made by an older mmk may have no blocks reserved: reserve them before
        // `configure` writes through the mapping (a no-op for a gate that has them).
        if let Ok(f) = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            && f.metadata()
                .is_ok_and(|m| m.is_file() && m.len() >= SEGMENT_BYTES as u64)
        {
            reserve(&f, path)?;
        }
        let gate = match Gate::open(path) {
            Ok(gate) => gate,
            Err(GateError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Gate::create_new(path)?
            }
            // Not a gate, or one of another mmk version: processes that still map the old
            // file keep it; new ones get a fresh gate.
            Err(
                GateError::NotAGate { .. } | GateError::Version { .. } | GateError::Policy { .. },
            ) => {
                std::fs::remove_file(path).map_err(io_err(path, "remove"))?;
                Gate::create_new(path)?
            }
            Err(e) => return Err(e),
        };
        gate.configure(config);
        Ok(gate)
    }

    /// Write a zeroed segment to a temporary file, stamp it, then rename it into place, so
    /// that no process ever maps a half-made gate. The temporary name is unpredictable and
    /// made with `O_EXCL | O_NOFOLLOW`, so nobody can have placed a link there. The file's
    /// blocks are reserved before it is mapped: on a full file system that is an error,
    /// where a write into the mapping would be a SIGBUS. A half-made file is removed.
    fn create_new(path: &Path) -> Result<Gate> {
        let name = path
            .file_name()
            .map_or_else(|| "gate".into(), |n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(".{name}.{:016x}.new", file::random_u64()));
        let made = Gate::make(&tmp, path).and_then(|gate| {
            std::fs::rename(&tmp, path).map_err(io_err(path, "rename"))?;
            Ok(gate)
        });
        if made.is_err() {
            // Best effort: the error to report is the one that stopped the gate.
            let _ = std::fs::remove_file(&tmp);
        }
        made
    }

    /// A new stamped gate at `tmp`, which will be renamed to `path`.
    fn make(tmp: &Path, path: &Path) -> Result<Gate> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)
            .map_err(io_err(tmp, "create"))?;
        // The space a gate needs is what the user must free: name the gate.
        reserve(&file, path)?;
        let seg = map(&file, tmp)?;
        let gate = Gate {
            seg,
            path: path.to_owned(),
        };
        let h = &gate.seg().header;
        h.version.store(VERSION, Ordering::Relaxed);
        h.slots.store(SLOTS as u32, Ordering::Relaxed);
        h.device_word.store(DeviceWord::OPEN, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(gate)
    }

    /// Map an existing gate (what the interposer does in each job process).
    pub fn open(path: &Path) -> Result<Gate> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err(path, "open"))?;
        let size = file.metadata().map_err(io_err(path, "stat"))?.len();
        if size < SEGMENT_BYTES as u64 {
            return Err(GateError::NotAGate {
                path: path.to_owned(),
                size,
            });
        }
        let gate = Gate {
            seg: map(&file, path)?,
            path: path.to_owned(),
        };
        gate.seg().check(path, size)?;
        Ok(gate)
    }

    fn seg(&self) -> &Segment {
        // SAFETY: the mapping is valid for the Gate's lifetime and holds only atomics.
        unsafe { self.seg.as_ref() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Change the partition's SMs or policy; job processes see it at their next launch.
    pub fn configure(&self, config: &GateConfig) {
        let h = &self.seg().header;
        h.sm_count.store(config.sm_count, Ordering::Relaxed);
        h.policy.store(config.policy.code(), Ordering::Relaxed);
        h.base_ns.store(nanos(config.base), Ordering::Relaxed);
        h.max_hold_ns
            .store(nanos(config.max_hold), Ordering::Relaxed);
        h.offline_depth
            .store(config.offline_depth, Ordering::Relaxed);
        h.gemm_slice_mflop
            .store(config.gemm_slice_mflop, Ordering::Relaxed);
        h.device_wait
            .store(u32::from(config.device_wait), Ordering::Relaxed);
        if !config.device_wait {
            // Online launches stop counting on the word: leave it open, not closed by
            // launches whose completions will not be taken off it.
            h.device_word.store(DeviceWord::OPEN, Ordering::Release);
        }
        h.device_wait_grain_us
            .store(config.device_wait_grain_us, Ordering::Relaxed);
        h.hold_budget_pct
            .store(config.hold_budget_pct.min(100), Ordering::Relaxed);
        h.offline_paused
            .store(u32::from(config.offline_paused), Ordering::Relaxed);
        h.generation.fetch_add(1, Ordering::Release);
        self.wake_all();
    }

    /// The settings' generation: it changes whenever they do (a process rebuilds its
    /// policy from [`Gate::config`] when it sees a new one).
    pub fn generation(&self) -> u32 {
        self.seg().header.generation.load(Ordering::Acquire)
    }

    pub fn config(&self) -> GateConfig {
        self.seg().config()
    }

    /// [`GateConfig::waits_on_online`] from the four settings it needs alone (for the
    /// interposer's launch path).
    pub fn waits_on_online(&self) -> bool {
        let h = &self.seg().header;
        waits_on_online(
            PolicyKind::from_code(h.policy.load(Ordering::Relaxed))
                .unwrap_or(PolicyKind::Passthrough),
            h.hold_budget_pct.load(Ordering::Relaxed),
            h.device_wait.load(Ordering::Relaxed) != 0,
            h.offline_depth
                .load(Ordering::Relaxed)
                .max(h.offline_paused.load(Ordering::Relaxed).min(1)),
        )
    }

    /// [`GateConfig::gemm_slice_mflop`] alone (one load, for the interposer's GEMM hooks).
    pub fn gemm_slice_mflop(&self) -> u32 {
        self.seg().header.gemm_slice_mflop.load(Ordering::Relaxed)
    }

    /// Take a slot for process `pid`. A slot the same pid held before is taken over (a
    /// process that maps the gate twice gets one slot). `None` when all slots are taken by
    /// live processes.
    pub fn join(&self, pid: u32, class: Class, mps_fraction: f64) -> Option<SlotId> {
        let slots = &self.seg().slots;
        let index = slots
            .iter()
            .position(|s| s.pid.load(Ordering::Acquire) == pid)
            .or_else(|| self.claim_free(pid))
            .or_else(|| {
                self.reap_dead();
                self.claim_free(pid)
            })?;
        let slot = &slots[index];
        self.clear_in_flight(slot);
        self.fold_into_totals(slot);
        slot.completed.store(0, Ordering::Relaxed);
        slot.max_held_ns.store(0, Ordering::Relaxed);
        slot.busy_ns.store(0, Ordering::Relaxed);
        slot.untracked.store(0, Ordering::Relaxed);
        for b in &slot.busy_hist {
            b.store(0, Ordering::Relaxed);
        }
        let share = (mps_fraction.clamp(0.0, 1.0) * 1000.0).round() as u32;
        slot.share_milli.store(share, Ordering::Relaxed);
        slot.class.store(class.code(), Ordering::Release);
        Some(SlotId(index))
    }

    fn claim_free(&self, pid: u32) -> Option<usize> {
        self.seg().slots.iter().position(|s| {
            s.pid
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Give the slot back; whatever it had in flight no longer counts.
    pub fn leave(&self, slot: SlotId) {
        let s = &self.seg().slots[slot.0];
        self.fold_into_totals(s);
        self.clear_in_flight(s);
        s.class.store(0, Ordering::Relaxed);
        s.pid.store(0, Ordering::Release);
        self.wake_all();
    }

    fn fold_into_totals(&self, s: &Slot) {
        let h = &self.seg().header;
        for (total, counter) in [
            (&h.total_launches, &s.launches),
            (&h.total_held, &s.held),
            (&h.total_held_ns, &s.held_ns),
            (&h.total_forced, &s.forced),
        ] {
            total.fetch_add(counter.swap(0, Ordering::AcqRel), Ordering::Relaxed);
        }
    }

    /// Launches, held launches, ns held and forced launches of every process that has
    /// used the gate, those still running included.
    pub fn totals(&self) -> Totals {
        self.seg().totals()
    }

    /// Drop the slots whose process is gone. Returns how many were dropped.
    pub fn reap_dead(&self) -> usize {
        let mut reaped = 0;
        for s in &self.seg().slots {
            let pid = s.pid.load(Ordering::Acquire);
            if pid != 0 && !process_alive(pid) {
                self.fold_into_totals(s);
                self.clear_in_flight(s);
                s.class.store(0, Ordering::Relaxed);
                if s.pid
                    .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    reaped += 1;
                }
            }
        }
        if reaped > 0 {
            self.wake_all();
        }
        reaped
    }
}

mod device;
#[cfg(test)]
mod tests;
pub use device::*;
