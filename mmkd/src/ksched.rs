//! The kernel scheduler's side in mmkd: one gate per partition (crate
//! `mmk-kernel-sched`), and the interposer in every managed job's `LD_PRELOAD`.
//!
//! The gate lives at `DATA_DIR/ksched/<partition>.gate`; mmkd makes it before the
//! partition's first job starts, with the partition's SM count and the configured policy,
//! and removes it when the partition's MIG instance is destroyed. A gate left by an earlier
//! mmkd is taken over, so jobs that outlived mmkd keep their slots.

use std::path::{Path, PathBuf};

use mmk_kernel_sched::{Gate, GateConfig, PolicyKind};
use tracing::{info, warn};

use crate::store::Assignment;
use mmk_partitioner::GpuState;

/// What a job needs to run under the kernel scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobKsched {
    pub interposer: PathBuf,
    pub gate: PathBuf,
}

#[derive(Debug, Clone)]
pub struct KernelSched {
    /// `None`: the kernel scheduler is off.
    interposer: Option<PathBuf>,
    policy: PolicyKind,
    dir: PathBuf,
}

impl KernelSched {
    pub fn off() -> KernelSched {
        KernelSched {
            interposer: None,
            policy: PolicyKind::Passthrough,
            dir: PathBuf::new(),
        }
    }

    pub fn new(interposer: PathBuf, policy: PolicyKind, dir: PathBuf) -> KernelSched {
        info!(interposer = %interposer.display(), %policy, "kernel scheduler");
        KernelSched {
            interposer: Some(interposer),
            policy,
            dir,
        }
    }

    pub fn gate_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.gate"))
    }

    /// Make (or take over) the gate of the partition `key` with `sm_count` SMs. `None` when
    /// the kernel scheduler is off; an error says why the gate could not be made.
    pub fn prepare(&self, key: &str, sm_count: u32) -> Result<Option<JobKsched>, String> {
        let Some(interposer) = &self.interposer else {
            return Ok(None);
        };
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let path = self.gate_path(key);
        Gate::create(&path, &GateConfig::new(sm_count.max(1), self.policy))
            .map_err(|e| format!("kernel scheduler: {e}"))?;
        Ok(Some(JobKsched {
            interposer: interposer.clone(),
            gate: path,
        }))
    }

    /// Remove a partition's gate (its instance is going away).
    pub fn remove(&self, key: &str) {
        if self.interposer.is_none() {
            return;
        }
        let path = self.gate_path(key);
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(gate = %path.display(), error = %e, "cannot remove a gate");
        }
    }
}

/// SMs of the partition an assignment runs in: its MIG profile's, or the whole GPU's.
pub fn partition_sms(gpus: &[GpuState], a: &Assignment) -> u32 {
    gpus.iter()
        .find(|g| g.index == a.slot.gpu)
        .map_or(0, |g| match a.slot.profile_id {
            Some(pid) => g.model.profile(pid).map_or(0, |p| p.sm_count),
            None => g.model.sm_count,
        })
}

/// The interposer mmkd uses when none is configured: `libmmk_interposer.so` next to the
/// mmkd executable (where `cargo build` and `cargo install` put it), if it is there.
pub fn default_interposer() -> Option<PathBuf> {
    mmk_kernel_sched::artifacts::find_next_to_exe(mmk_kernel_sched::artifacts::INTERPOSER)
}

/// Whether `path` looks like a loadable interposer (a readable regular file).
pub fn check_interposer(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(format!("{} is not a file", path.display())),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_is_made_per_partition_and_removed_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let k = KernelSched::new(
            PathBuf::from("/lib/libmmk_interposer.so"),
            PolicyKind::Mmk,
            dir.path().join("ksched"),
        );
        let job = k.prepare("g0i5", 66).unwrap().unwrap();
        assert_eq!(job.gate, dir.path().join("ksched/g0i5.gate"));
        let gate = Gate::open(&job.gate).unwrap();
        assert_eq!(gate.config().sm_count, 66);
        assert_eq!(gate.config().policy, PolicyKind::Mmk);
        k.remove("g0i5");
        assert!(!job.gate.exists());
        k.remove("g0i5");
    }

    #[test]
    fn off_makes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let k = KernelSched::off();
        assert_eq!(k.prepare("g0", 132).unwrap(), None);
        assert!(!dir.path().join("ksched").exists());
    }
}
