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
//! A wait never outlives the anti-starvation bound by much: the poller of an offline
//! process with kernels pending opens the word by force once it has been closed for the
//! bound ([`mmk_kernel_sched::Gate::device_force_if_starved`]), and closes it again when
//! one of its kernels completes.

use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use mmk_kernel_sched::{DeviceWord, Gate};

use crate::cuda::*;
use crate::process::Process;
use crate::real::Driver;

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
    /// Returns whether one was put.
    pub fn before_launch(&self, p: &Process, gate: &Gate, d: &Driver, stream: CUstream) -> bool {
        let Some(addr) = self.address(gate, d) else {
            return false;
        };
        let Some(wait) = d.stream_wait_value32 else {
            return false;
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
            true
        } else {
            p.stats.device_wait_failed.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// The poller, with this process's launches pending: open the word by force when it has
    /// been closed for the anti-starvation bound.
    pub fn check_starved(&self, p: &Process, gate: &Gate) {
        if self.word.get().is_none_or(|r| r.is_err()) {
            return;
        }
        let base = gate.config().base.as_nanos() as f64;
        let bound = (base / p.mps_fraction.max(0.01)) as u64;
        if gate.device_force_if_starved(mmk_kernel_sched::monotonic_ns(), bound) {
            self.forced.store(true, Ordering::Release);
            p.stats.device_forced.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One of this process's launches completed: a forced opening has done its work.
    pub fn progress(&self, gate: &Gate) {
        if self.forced.swap(false, Ordering::AcqRel) {
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
