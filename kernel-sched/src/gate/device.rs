//! The device word, by which an offline stream waits on the GPU while online work runs, and the gate's helpers for processes and futexes.

use super::*;

/// The device word: what an offline stream waits on before each of its kernels when the
/// gate's [`GateConfig::device_wait`] is on. The GPU waits until `word & (OPEN | FORCED)`
/// is not zero (`cuStreamWaitValue32` with `CU_STREAM_WAIT_VALUE_AND`).
///
/// - Bits 2 and up count the online launches in flight in the partition. Online
///   launches close the word when the count leaves zero (before the launch is made) and
///   open it when the poller sees the last one complete.
/// - `FORCED` opens it while online work is in flight: set by an offline process whose
///   kernels have waited on the GPU longer than the anti-starvation bound (decision 3;
///   [`Gate::device_force_if_starved`]), cleared when one of them completes. So a GPU
///   wait, like a hold on the CPU, never lasts much longer than the bound.
///
/// A kernel that had already started when the word closed runs on (a wait cannot
/// preempt); what is held is what is queued behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceWord(pub u32);

impl DeviceWord {
    pub const OPEN: u32 = 1;
    pub const FORCED: u32 = 2;
    /// The mask an offline stream waits on.
    pub const WAIT_MASK: u32 = DeviceWord::OPEN | DeviceWord::FORCED;
    const ONE: u32 = 4;

    /// Online launches in flight.
    pub fn online(self) -> u32 {
        self.0 >> 2
    }

    /// Whether a kernel queued behind a wait would start now.
    pub fn passes(self) -> bool {
        self.0 & DeviceWord::WAIT_MASK != 0
    }
}

/// Where the device word lies in a mapped gate, for registering it with the driver.
#[derive(Debug, Clone, Copy)]
pub struct DeviceWordLocation {
    /// The start of the mapping (page-aligned).
    pub base: *mut std::ffi::c_void,
    /// Bytes of the mapping.
    pub len: usize,
    /// Offset of the word from `base`.
    pub offset: usize,
}

impl Gate {
    /// The device word now.
    pub fn device_word(&self) -> DeviceWord {
        DeviceWord(self.seg().header.device_word.load(Ordering::Acquire))
    }

    /// Where the device word is in this process's mapping.
    pub fn device_word_location(&self) -> DeviceWordLocation {
        DeviceWordLocation {
            base: self.seg.as_ptr().cast(),
            len: SEGMENT_BYTES,
            offset: std::mem::offset_of!(Segment, header.device_word),
        }
    }

    pub(super) fn device_online_begin(&self) {
        let h = &self.seg().header;
        // The time goes in before the word closes: a poller that sees the word closed never
        // sees the time of an earlier closing (and forces it open at once).
        let stamped = self.device_word().online() == 0;
        if stamped {
            h.device_closed_ns.store(monotonic_ns(), Ordering::Release);
        }
        let before = h
            .device_word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(w.saturating_add(DeviceWord::ONE) & !DeviceWord::OPEN)
            })
            .unwrap_or(0);
        if !stamped && DeviceWord(before).online() == 0 {
            // The word opened between the look above and the update: this launch closed it.
            h.device_closed_ns.store(monotonic_ns(), Ordering::Release);
        }
    }

    pub(super) fn device_online_end(&self, kernels: u32) {
        let _ =
            self.seg()
                .header
                .device_word
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                    let left = DeviceWord(w).online().saturating_sub(kernels);
                    Some(if left == 0 {
                        DeviceWord::OPEN
                    } else {
                        (left << 2) | (w & DeviceWord::FORCED)
                    })
                });
    }

    /// An offline process with kernels queued behind device waits calls this while they
    /// have not completed: when the word has been closed for `bound_ns` or longer, open it
    /// by force. Returns whether this call forced it.
    ///
    /// Before forcing, the word is checked against the slots: dead processes are dropped,
    /// and a count that no live online slot accounts for (a race with a process leaving)
    /// is set right, which opens the word without force.
    pub fn device_force_if_starved(&self, now_ns: u64, bound_ns: u64) -> bool {
        let h = &self.seg().header;
        if self.device_word().passes() {
            return false;
        }
        let since = h.device_closed_ns.load(Ordering::Acquire);
        if now_ns.saturating_sub(since) < bound_ns {
            return false;
        }
        self.reap_dead();
        self.device_recount();
        h.device_word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w & DeviceWord::WAIT_MASK == 0).then_some(w | DeviceWord::FORCED)
            })
            .is_ok()
    }

    /// Set the word's count to what the live online slots have in flight, when it says
    /// more (it can only have leaked upwards: a completion counted by neither `end` nor
    /// `clear_in_flight`).
    pub(super) fn device_recount(&self) {
        let live: u32 = self
            .seg()
            .slots
            .iter()
            .filter(|s| {
                s.pid.load(Ordering::Acquire) != 0
                    && s.class.load(Ordering::Acquire) == Class::Online.code()
            })
            .map(|s| s.inflight.load(Ordering::Acquire))
            .fold(0u32, u32::saturating_add);
        let counted = self.device_word().online();
        if counted > live {
            self.device_online_end(counted - live);
        }
    }

    /// One of the offline kernels behind a forced opening completed: close the word again
    /// (if online work is still in flight) and start the bound over.
    pub fn device_unforce(&self) {
        let h = &self.seg().header;
        if h.device_word.load(Ordering::Acquire) & DeviceWord::FORCED != 0 {
            h.device_closed_ns.store(monotonic_ns(), Ordering::Release);
            h.device_word
                .fetch_and(!DeviceWord::FORCED, Ordering::AcqRel);
        }
    }

    /// Whether the gate asks offline launches to wait on the GPU too.
    pub fn device_wait(&self) -> bool {
        self.seg().header.device_wait.load(Ordering::Relaxed) != 0
    }

    /// [`GateConfig::device_wait_grain_us`] in ns.
    pub fn device_wait_grain_ns(&self) -> u64 {
        u64::from(
            self.seg()
                .header
                .device_wait_grain_us
                .load(Ordering::Relaxed),
        ) * 1000
    }

    /// Forget what slot `s` had in flight (its process left or died); an online slot's
    /// kernels no longer keep the device word closed.
    pub(super) fn clear_in_flight(&self, s: &Slot) {
        let kernels = s.inflight.swap(0, Ordering::AcqRel);
        if kernels > 0 && s.class.load(Ordering::Relaxed) == Class::Online.code() {
            self.device_online_end(kernels);
        }
        clear_counters(s);
    }
}

pub(super) fn clear_counters(s: &Slot) {
    for counter in [
        &s.inflight_sm,
        &s.inflight_ask,
        &s.inflight_compute,
        &s.inflight_memory,
    ] {
        counter.store(0, Ordering::Relaxed);
    }
    s.inflight_expected_ns.store(0, Ordering::Relaxed);
    s.gap_until_ns.store(0, Ordering::Relaxed);
    s.busy_since_ns.store(0, Ordering::Relaxed);
}

/// The slots of `slots` whose process still runs.
pub(super) fn live(slots: Vec<SlotStats>) -> Vec<SlotStats> {
    slots.into_iter().filter(|s| process_alive(s.pid)).collect()
}

pub(super) fn stats_of(s: &Slot) -> Option<SlotStats> {
    let pid = s.pid.load(Ordering::Acquire);
    (pid != 0).then(|| SlotStats {
        pid,
        class: Class::from_code(s.class.load(Ordering::Relaxed)),
        share_milli: s.share_milli.load(Ordering::Relaxed),
        untracked: s.untracked.load(Ordering::Relaxed) != 0,
        inflight: s.inflight.load(Ordering::Relaxed),
        inflight_sm: s.inflight_sm.load(Ordering::Relaxed),
        inflight_ask: s.inflight_ask.load(Ordering::Relaxed),
        launches: s.launches.load(Ordering::Relaxed),
        held: s.held.load(Ordering::Relaxed),
        held_ns: s.held_ns.load(Ordering::Relaxed),
        forced: s.forced.load(Ordering::Relaxed),
        completed: s.completed.load(Ordering::Relaxed),
        max_held_ns: s.max_held_ns.load(Ordering::Relaxed),
        busy_ns: s.busy_ns.load(Ordering::Relaxed),
        busy_hist: std::array::from_fn(|i| s.busy_hist[i].load(Ordering::Relaxed)),
    })
}

pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whether `pid` runs: it exists and is not a zombie (a killed job whose parent has not
/// reaped it yet holds nothing any more).
pub fn process_alive(pid: u32) -> bool {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(raw, 0) };
    if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
        return false;
    }
    // /proc/PID/stat: "pid (comm) S ..."; comm may hold spaces and parentheses.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state != "Z" && state != "X"),
        Err(_) => true,
    }
}

/// Sleep while `word` holds `expected`, for at most `timeout`. True when woken (or the word
/// had already changed), false on timeout.
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: FUTEX_WAIT on a 4-byte aligned word of a live shared mapping, with a valid
    // relative timeout. Not FUTEX_PRIVATE: other processes wake it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ETIMEDOUT)
}

pub(super) fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live shared mapping's word; wakes every waiter.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}
