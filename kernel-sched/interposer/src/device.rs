//! The device wait: in an offline job whose gate asks for it
//! ([`mmk_kernel_sched::GateConfig::device_wait`]), every launch is preceded by a
//! `cuStreamWaitValue32` on the gate's device word, so the GPU itself holds the kernels
//! queued in an offline stream while online work is in flight. The gate on the CPU only
//! sees launches; the kernels an offline job queued before a request arrived would
//! otherwise all run beside it.
//!
//! The GPU reads the word from the gate's shared mapping, which each offline process
//! registers with the driver (`cuMemHostRegister`, mapped for the device) at its first
//! launch. The driver refuses a page of a disk file (measured on an H200, driver
//! 580.159.04: `CUDA_ERROR_INVALID_VALUE`); the gate must be on a memory file system such
//! as `/dev/shm`. When registering fails the job runs with the CPU gate alone, says why on
//! stderr once, and its stats carry the reason.
//!
//! With a grain ([`mmk_kernel_sched::GateConfig::device_wait_grain_us`]) a wait goes only
//! before the launch that would take the expected run time since the last wait on its
//! stream over the grain: each wait then guards the launches after it, up to about the
//! grain of work, and the GPU pays for fewer waits.
//!
//! A wait never outlives the anti-starvation bound by much: the poller of an offline
//! process with kernels pending opens the word by force once it has been closed for the
//! bound ([`mmk_kernel_sched::Gate::device_force_if_starved`]), and closes it again when
//! one of its kernels completes.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use mmk_kernel_sched::{DeviceWord, Gate};

use crate::cuda::*;
use crate::process::Process;
use crate::real::Driver;

thread_local! {
    /// This thread's last stream with a wait, and the expected ns launched on it since
    /// (`u64::MAX`: the next launch needs a wait).
    static SINCE_WAIT: Cell<(usize, u64)> = const { Cell::new((0, u64::MAX)) };
}

/// Whether the launch about to go on `stream`, of `expected_ns` (`None`: not in the
/// profile), needs a wait before it, for a grain of `grain_ns` (0: every launch does).
pub fn due(stream: CUstream, expected_ns: Option<u64>, grain_ns: u64) -> bool {
    if grain_ns == 0 {
        return true;
    }
    let (last, since) = SINCE_WAIT.get();
    match expected_ns {
        // Unknown: it may be long, so it gets a wait and so does the next launch.
        None => {
            SINCE_WAIT.set((stream as usize, u64::MAX));
            true
        }
        Some(ns) if last != stream as usize || since.saturating_add(ns) > grain_ns => {
            SINCE_WAIT.set((stream as usize, ns));
            true
        }
        Some(ns) => {
            SINCE_WAIT.set((last, since + ns));
            false
        }
    }
}

/// One process's device wait: the word's device address once registered, or why not.
#[derive(Debug, Default)]
pub struct DeviceWait {
    word: OnceLock<Result<u64, String>>,
    /// This process opened the word by force and has not seen progress since.
    forced: AtomicBool,
}

impl DeviceWait {
    /// Why the device wait is off in this process, if it was tried and failed.
    pub fn error(&self) -> Option<&str> {
        self.word
            .get()
            .and_then(|r| r.as_ref().err())
            .map(String::as_str)
    }

    /// The word's device address, registering the gate's mapping the first time (a
    /// context is current: this runs in a launch).
    fn address(&self, gate: &Gate, d: &Driver) -> Option<u64> {
        self.word
            .get_or_init(|| {
                let r = register(gate, d);
                if let Err(e) = &r {
                    crate::process::warn(format_args!(
                        "device wait off, offline kernels wait on the CPU only: {e}"
                    ));
                }
                r
            })
            .as_ref()
            .ok()
            .copied()
    }

    /// Put a wait on the device word into `stream` ahead of the launch about to be made.
    pub fn before_launch(&self, p: &Process, gate: &Gate, d: &Driver, stream: CUstream) {
        let (Some(addr), Some(wait)) = (self.address(gate, d), d.stream_wait_value32) else {
            return;
        };
        // SAFETY: the driver's cuStreamWaitValue32 on the caller's stream, with the device
        // address of a registered word that stays mapped for the process's life.
        let rc = unsafe {
            wait(
                stream,
                addr,
                DeviceWord::WAIT_MASK,
                CU_STREAM_WAIT_VALUE_AND,
            )
        };
        if rc == CUDA_SUCCESS {
            p.stats.device_waits.fetch_add(1, Ordering::Relaxed);
        } else {
            p.stats.device_wait_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The poller, with this process's launches pending: open the word by force when it has
    /// been closed for the anti-starvation bound.
    pub fn check_starved(&self, p: &Process, gate: &Gate) {
        if self.word.get().is_none_or(|r| r.is_err()) || gate.device_word().passes() {
            return;
        }
        let bound = mmk_kernel_sched::policy::starvation_bound(gate.config().base, p.mps_fraction);
        let bound = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
        if gate.device_force_if_starved(mmk_kernel_sched::monotonic_ns(), bound) {
            self.forced.store(true, Ordering::Release);
            p.stats.device_forced.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One of this process's launches completed: a forced opening has done its work.
    /// (Called on every offline completion: a plain load when nothing was forced.)
    pub fn progress(&self, gate: &Gate) {
        if self.forced.load(Ordering::Relaxed) && self.forced.swap(false, Ordering::AcqRel) {
            gate.device_unforce();
        }
    }
}

fn register(gate: &Gate, d: &Driver) -> Result<u64, String> {
    let (Some(register), Some(get_pointer), Some(_)) = (
        d.mem_host_register,
        d.mem_host_get_device_pointer,
        d.stream_wait_value32,
    ) else {
        return Err(
            "the driver lacks cuMemHostRegister, cuMemHostGetDevicePointer or \
                    cuStreamWaitValue32"
                .into(),
        );
    };
    let at = gate.device_word_location();
    // SAFETY: the gate's whole mapping, page-aligned, alive for the process's life (the
    // Process and its Gate are leaked).
    let rc = unsafe {
        register(
            at.base,
            at.len,
            CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP,
        )
    };
    if rc != CUDA_SUCCESS {
        return Err(format!(
            "cuMemHostRegister of gate {} failed with CUDA error {rc} (the gate must be on a \
             memory file system such as /dev/shm)",
            gate.path().display()
        ));
    }
    let mut base: u64 = 0;
    // SAFETY: the registered mapping and a valid out pointer.
    let rc = unsafe { get_pointer(&mut base, at.base.cast::<c_void>(), 0) };
    if rc != CUDA_SUCCESS || base == 0 {
        return Err(format!(
            "cuMemHostGetDevicePointer of gate {} failed with CUDA error {rc}",
            gate.path().display()
        ));
    }
    Ok(base + at.offset as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(n: usize) -> CUstream {
        n as CUstream
    }

    #[test]
    fn a_wait_goes_before_the_launch_that_passes_the_grain() {
        // A fresh thread: the thread-local starts over.
        std::thread::spawn(|| {
            let us = |n: u64| Some(n * 1000);
            assert!(due(stream(8), us(10), 0), "grain 0: every launch");
            assert!(due(stream(8), us(10), 0));
            assert!(due(stream(8), us(10), 50_000), "the first launch waits");
            assert!(!due(stream(8), us(30), 50_000), "40 us since the wait");
            assert!(
                !due(stream(8), us(10), 50_000),
                "50 us: at the grain, not over"
            );
            assert!(due(stream(8), us(1), 50_000), "51 us: a new wait");
            assert!(
                due(stream(9), us(1), 50_000),
                "another stream needs its own wait"
            );
            assert!(
                due(stream(8), us(1), 50_000),
                "and so does the first one again"
            );
            assert!(
                due(stream(8), us(200), 50_000),
                "a long kernel always waits"
            );
            assert!(due(stream(8), us(1), 50_000), "and guards only itself");
            assert!(due(stream(8), None, 50_000), "an unknown kernel waits");
            assert!(
                due(stream(8), us(1), 50_000),
                "and so does the launch after it"
            );
            assert!(!due(stream(8), us(1), 50_000));
        })
        .join()
        .unwrap();
    }
}
