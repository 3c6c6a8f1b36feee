//! The kernel scheduler's side in mmkd: one gate per partition (crate
//! `mmk-kernel-sched`), and the interposer in every managed job's `LD_PRELOAD`.
//!
//! The gates live in one folder (`--kernel-gate-dir`, by default `DATA_DIR/ksched`) that
//! mmkd opens and checks at its start ([`GateDir`]: its own, written by nobody else). A
//! partition's gate, `<partition>.gate`, is made before the partition's first job starts,
//! with the partition's SM count and the configured policy, and belongs to the user whose
//! jobs run there (a partition serves one user at a time), mode 0600; it is removed when
//! the partition's MIG instance is destroyed. The owner's gate left by an earlier mmkd is
//! taken over, so jobs that outlived mmkd keep their slots; another user's is replaced.
//! mmkd itself never maps a gate ([`mmk_kernel_sched::GateFile`]).
//!
//! The gate's policy is `--kernel-policy`, unless an online job of the partition names one
//! in its spec (`command.kernel_policy`); the anti-starvation base (which is also Orion's
//! DUR_THRESHOLD) is 2.5 % of the online job's profiled request latency when its spec has a
//! kernel profile (read with the job's user's rights, [`crate::asuser`]), else 250 us;
//! `--kernel-base` replaces both. The latest online job to
//! start sets them; they hold until the partition's instance goes away. Every gate gets
//! `--kernel-offline-depth` (`mmk`'s cap on queued offline kernels; 0: none) and
//! `--kernel-gemm-slice` (offline GEMMs over that many MFLOP cut into pieces; 0: not cut).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use mmk_kernel_sched::gate::{GateDir, GateOwner};
use mmk_kernel_sched::{GateConfig, GateError, PolicyKind, Profile, SlotStats, Totals};
use tracing::{info, warn};

use crate::job::{Assignment, Owner};
use crate::slo::Isolation;
use mmk_partitioner::GpuState;

/// What a job needs to run under the kernel scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobKsched {
    pub interposer: PathBuf,
    pub gate: PathBuf,
    /// The job's kernel profile, for `MMK_KSCHED_PROFILE`.
    pub profile: Option<PathBuf>,
}

/// What an online job's spec asks of its partition's gate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OnlineTuning {
    pub policy: Option<PolicyKind>,
    /// From the job's kernel profile: 2.5 % of its request latency.
    pub base: Option<Duration>,
}

impl OnlineTuning {
    /// Read what an online job's spec asks for: its policy, and its kernel profile's
    /// DUR_THRESHOLD. The profile is read as `owner` would read it. An unreadable or bad
    /// profile is an error that names the file.
    pub fn from_spec(
        policy: Option<&str>,
        profile: Option<&Path>,
        owner: Option<Owner>,
    ) -> Result<OnlineTuning, KschedError> {
        let policy = policy
            .map(|p| p.parse::<PolicyKind>())
            .transpose()
            .map_err(KschedError::Policy)?;
        let base = match profile {
            Some(path) => {
                let bytes = crate::asuser::read_file(owner, path, MAX_PROFILE_BYTES)
                    .map_err(KschedError::ReadProfile)?;
                let text = String::from_utf8(bytes).map_err(|_| KschedError::BadProfile {
                    path: path.to_owned(),
                    why: "not UTF-8 text".into(),
                })?;
                let p = Profile::parse(&text).map_err(|e| KschedError::BadProfile {
                    path: path.to_owned(),
                    why: without_quotes(&e.to_string()),
                })?;
                p.dur_threshold_ns().map(Duration::from_nanos)
            }
            None => None,
        };
        Ok(OnlineTuning { policy, base })
    }
}

/// A parse error's message without what it quotes of the file (`invalid type: string
/// "..."`): a reason shows where the file is wrong, not its content.
fn without_quotes(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut quoted = false;
    for c in message.chars() {
        if c == '"' {
            if !quoted {
                out.push_str("\"...\"");
            }
            quoted = !quoted;
        } else if !quoted {
            out.push(c);
        }
    }
    out
}

/// Why a job's gate could not be made; the job's reason says so with every cause (a full
/// disk says "No space left on device").
#[derive(Debug, thiserror::Error)]
pub enum KschedError {
    #[error("command.kernel_policy: {0}")]
    Policy(mmk_kernel_sched::UnknownName),
    #[error("kernel profile")]
    ReadProfile(#[source] crate::asuser::ReadError),
    #[error("kernel profile {path}: {why}")]
    BadProfile { path: PathBuf, why: String },
    #[error("kernel scheduler")]
    Gate(#[source] mmk_kernel_sched::gate::GateError),
    #[error("interposer {path}")]
    Interposer {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct KernelSched {
    /// `None`: the kernel scheduler is off.
    interposer: Option<PathBuf>,
    policy: PolicyKind,
    /// The operator's base, over the online jobs' profiles.
    base: Option<Duration>,
    /// `mmk`'s offline depth cap in every gate; 0: none.
    offline_depth: u32,
    /// Offline jobs' GEMMs over this many MFLOP are cut into pieces; 0: not cut.
    gemm_slice_mflop: u32,
    /// Offline launches also wait on the GPU, with this grain; `None`: off.
    device_wait: Option<Duration>,
    /// The share of its time (%) an offline process may be held; 100: no budget.
    hold_budget_pct: u32,
    /// The gates' folder, open and checked; `None` when the kernel scheduler is off.
    dir: Option<Arc<GateDir>>,
    /// The folder is on a memory file system, where the device wait can act.
    in_memory: bool,
    /// Each partition's gate settings, as the latest online job left them.
    tuned: Arc<Mutex<HashMap<String, OnlineTuning>>>,
    /// Each partition's SMs and isolation level (the SLO control's, [`crate::slo`]).
    levels: Arc<Mutex<HashMap<String, (u32, Isolation)>>>,
}

impl KernelSched {
    pub fn off() -> KernelSched {
        KernelSched {
            interposer: None,
            policy: PolicyKind::Passthrough,
            base: None,
            offline_depth: 0,
            gemm_slice_mflop: 0,
            device_wait: None,
            hold_budget_pct: DEFAULT_KERNEL_HOLD_BUDGET,
            dir: None,
            in_memory: false,
            tuned: Arc::default(),
            levels: Arc::default(),
        }
    }

    /// The kernel scheduler with its gates in `dir`, which is made when missing and
    /// refused when another user owns it or may write it (or a folder above it).
    pub fn new(
        interposer: PathBuf,
        policy: PolicyKind,
        dir: &Path,
    ) -> Result<KernelSched, KschedError> {
        let dir = GateDir::open(dir).map_err(KschedError::Gate)?;
        let in_memory = crate::os::on_memory_fs(dir.path()).is_ok();
        info!(interposer = %interposer.display(), %policy, gates = %dir.path().display(), in_memory, "kernel scheduler");
        Ok(KernelSched {
            interposer: Some(interposer),
            policy,
            base: None,
            offline_depth: 0,
            gemm_slice_mflop: 0,
            device_wait: None,
            hold_budget_pct: DEFAULT_KERNEL_HOLD_BUDGET,
            dir: Some(Arc::new(dir)),
            in_memory,
            tuned: Arc::default(),
            levels: Arc::default(),
        })
    }

    /// Every gate with this offline depth cap (0: none) and, when given, this base instead
    /// of the online jobs' profiles'.
    pub fn with_tuning(mut self, offline_depth: u32, base: Option<Duration>) -> KernelSched {
        if self.interposer.is_some() {
            info!(
                offline_depth,
                base_us = base.map(|b| b.as_micros()),
                "kernel scheduler tuning"
            );
        }
        self.offline_depth = offline_depth;
        self.base = base;
        self
    }

    /// Every gate cuts offline jobs' cuBLAS GEMMs over `mflop` MFLOP into pieces (0: not
    /// cut; `mmk_kernel_sched::slice`).
    pub fn with_gemm_slice(mut self, mflop: u32) -> KernelSched {
        if self.interposer.is_some() && mflop > 0 {
            info!(
                gemm_slice_mflop = mflop,
                "kernel scheduler cuts offline GEMMs"
            );
        }
        self.gemm_slice_mflop = mflop;
        self
    }

    /// Every gate has offline launches wait on the GPU too, with this grain (`None`: off;
    /// `mmk_kernel_sched::GateConfig::device_wait`).
    pub fn with_device_wait(mut self, grain: Option<Duration>) -> KernelSched {
        if self.interposer.is_some()
            && let Some(grain) = grain
        {
            info!(
                grain_us = grain.as_micros(),
                "offline launches also wait on the GPU"
            );
        }
        self.device_wait = grain;
        self
    }

    /// Every gate holds each offline process at most `pct` % of its time (100: no budget;
    /// `mmk_kernel_sched::HoldBudget`).
    pub fn with_hold_budget(mut self, pct: u32) -> KernelSched {
        if self.interposer.is_some() {
            info!(
                hold_budget_pct = pct,
                "kernel scheduler holds offline work at most this share of its time"
            );
        }
        self.hold_budget_pct = pct.min(100);
        self
    }

    /// Make (or take over) the gate of the partition `key` with `sm_count` SMs for a job
    /// with this kernel profile whose processes run as `owner`; an online job passes what
    /// its spec asks of the gate. `None` when the kernel scheduler is off; an error says
    /// why the gate could not be made.
    pub fn prepare(
        &self,
        key: &str,
        sm_count: u32,
        profile: Option<&Path>,
        online: Option<OnlineTuning>,
        owner: GateOwner,
    ) -> Result<Option<JobKsched>, KschedError> {
        let (Some(interposer), Some(dir)) = (&self.interposer, &self.dir) else {
            return Ok(None);
        };
        {
            let mut tuned = self.tuned.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(t) = online {
                tuned.insert(key.to_owned(), t);
            }
        }
        // The level is read and the gate written under one lock, so that a level the SLO
        // control sets meanwhile is not overwritten with the one before.
        let mut levels = self.levels.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = levels
            .entry(key.to_owned())
            .or_insert((sm_count, Isolation::None));
        entry.0 = sm_count;
        let config = self.config_for(key, sm_count, entry.1);
        let gate = dir
            .prepare(key, &config, owner)
            .map_err(KschedError::Gate)?;
        drop(levels);
        Ok(Some(JobKsched {
            interposer: interposer.clone(),
            gate: gate.path().to_owned(),
            profile: profile.map(Path::to_path_buf),
        }))
    }

    /// The settings of partition `key`'s gate: the operator's, what its latest online job
    /// asked for, and its isolation level.
    fn config_for(&self, key: &str, sm_count: u32, level: Isolation) -> GateConfig {
        let tuning = self
            .tuned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .copied()
            .unwrap_or_default();
        let mut config = GateConfig::new(sm_count.max(1), tuning.policy.unwrap_or(self.policy));
        if let Some(base) = self.base.or(tuning.base) {
            config.base = base;
        }
        config.offline_depth = self.offline_depth;
        config.gemm_slice_mflop = self.gemm_slice_mflop;
        config.hold_budget_pct = self.hold_budget_pct;
        if let Some(grain) = self.device_wait {
            config.device_wait = true;
            config.device_wait_grain_us = u32::try_from(grain.as_micros()).unwrap_or(u32::MAX);
        }
        level.apply(&config, self.in_memory)
    }

    /// Whether jobs' requests are measured in their gates: the kernel scheduler is on with
    /// a policy that tracks launches (what the SLO control needs). A job whose spec names
    /// `passthrough` for its partition is not measured there.
    pub fn measures_requests(&self) -> bool {
        self.interposer.is_some() && self.policy != PolicyKind::Passthrough
    }

    /// Whether the device wait can act in these gates (their folder is on a memory file
    /// system): the SLO control's ladder skips it where it cannot.
    pub fn device_wait_possible(&self) -> bool {
        self.in_memory
    }

    /// Set partition `key`'s isolation level (the SLO control's) and write its gate's
    /// settings: its job processes follow them from their next launch. Nothing to do when
    /// the kernel scheduler is off or the partition has no gate.
    pub fn set_isolation(&self, key: &str, level: Isolation) -> Result<(), KschedError> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        // Under the lock `prepare` writes gates under: the last level set is the one the
        // gate holds.
        let mut levels = self.levels.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = levels.get_mut(key) else {
            return Ok(());
        };
        entry.1 = level;
        let config = self.config_for(key, entry.0, level);
        match dir.open_gate(key).map_err(KschedError::Gate)? {
            Some(gate) => gate.configure(&config).map_err(KschedError::Gate),
            None => Ok(()),
        }
    }

    /// The isolation level partition `key`'s gate was last given; `None` when it has no
    /// gate.
    pub fn isolation(&self, key: &str) -> Option<Isolation> {
        self.levels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .map(|(_, level)| *level)
    }

    /// The partitions whose gates are at a level above none.
    pub fn isolated(&self) -> Vec<(String, Isolation)> {
        self.levels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, (_, level))| *level != Isolation::None)
            .map(|(k, (_, level))| (k.clone(), *level))
            .collect()
    }

    /// The gate of the partition `key` as it is now; `None` when the kernel scheduler is
    /// off or the partition has no gate (no job has started there since its instance was
    /// made). A file that is not a gate, or one of another version, is reported, not
    /// taken over: reading never changes it, and mmkd reads a copy (never a mapping).
    pub fn read_gate(&self, key: &str) -> Option<GateView> {
        let dir = self.dir.as_ref()?;
        let path = dir.gate_path(key);
        let state = match dir.open_gate(key) {
            Ok(None) => return None,
            Ok(Some(gate)) => gate.snapshot().map(|snap| GateState {
                config: snap.config(),
                totals: snap.totals(),
                processes: snap.live_slots(),
            }),
            Err(e) => Err(e),
        };
        Some(GateView {
            path,
            state: state.map_err(Arc::new),
        })
    }

    /// Remove a partition's gate (its instance is going away).
    pub fn remove(&self, key: &str) {
        let Some(dir) = &self.dir else {
            return;
        };
        self.tuned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        self.levels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        if let Err(e) = dir.remove(key) {
            warn!(error = %e, "cannot remove a gate");
        }
    }
}

/// The kernel gate's hold budget unless configured: 0, so that the gate tracks every launch
/// (the learned profiles, `mmkctl top`) and holds none. Holding offline launches while
/// online work is in flight cost the training 17-59 % against plain MPS on the co-location
/// matrix, on an H100 and an H200, and raised the services' p99 over plain MPS's in 8 of
/// 12 runs (docs/colocation.md); `--kernel-hold-budget N` asks for it.
pub const DEFAULT_KERNEL_HOLD_BUDGET: u32 = 0;

/// What a partition's gate file holds now (`mmkctl partitions show`).
#[derive(Debug, Clone)]
pub struct GateView {
    pub path: PathBuf,
    /// The gate, or why it could not be read.
    pub state: Result<GateState, Arc<GateError>>,
}

impl GateView {
    /// Why the gate could not be read, with its sources (an I/O error's reason is its
    /// source); `None` when it was.
    pub fn error_text(&self) -> Option<String> {
        self.state
            .as_ref()
            .err()
            .map(|e| format!("{:#}", anyhow::Error::new(Arc::clone(e))))
    }
}

#[derive(Debug, Clone)]
pub struct GateState {
    pub config: GateConfig,
    /// Over every process that has used the gate.
    pub totals: Totals,
    /// The processes attached now that still run.
    pub processes: Vec<SlotStats>,
}

/// The largest kernel profile mmkd reads (a profile of thousands of kernels is a few MiB).
const MAX_PROFILE_BYTES: u64 = 64 << 20;

/// SMs of the partition an assignment runs in: its MIG profile's, or the whole GPU's.
pub fn partition_sms(gpus: &[GpuState], a: &Assignment) -> u32 {
    gpus.iter()
        .find(|g| g.index == a.slot.gpu)
        .map_or(0, |g| match a.slot.profile_id {
            Some(pid) => g.model.profile(pid).map_or(0, |p| p.sm_count),
            None => g.model.sm_count,
        })
}

/// An installed interposer, when none is configured: `libmmk_interposer.so` next to the
/// mmkd executable (where `cargo build --workspace` puts it) or in `../lib/mmk/` from it
/// (an install: `/usr/bin/mmkd` and `/usr/lib/mmk/libmmk_interposer.so`, as the Debian
/// package lays them out).
pub fn default_interposer() -> Option<PathBuf> {
    use mmk_kernel_sched::artifacts::{INTERPOSER, find_next_to_exe};
    find_next_to_exe(INTERPOSER).or_else(|| {
        let exe = std::env::current_exe().ok()?;
        let lib = exe.parent()?.parent()?.join("lib/mmk").join(INTERPOSER);
        lib.is_file().then_some(lib)
    })
}

/// Writes the interposer the mmkd binary carries to `<data dir>/lib/libmmk_interposer.so`
/// (mode 0644 in a 0755 folder, both mmkd's: jobs of every user load it) unless the same
/// bytes are there already; returns its path. Written under a temporary name and renamed
/// into place, so that a job starting meanwhile loads a whole library.
pub fn carried_interposer(bytes: &[u8], data_dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let dir = data_dir.join("lib");
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let path = dir.join(mmk_kernel_sched::artifacts::INTERPOSER);
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() == bytes.len() as u64)
        && std::fs::read(&path).is_ok_and(|there| there == bytes)
    {
        return Ok(path);
    }
    let tmp = dir.join(format!(
        ".{}.{}",
        mmk_kernel_sched::artifacts::INTERPOSER,
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| {
            use std::io::Write as _;
            f.write_all(bytes)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

/// Whether `path` looks like a loadable interposer (a readable regular file).
pub fn check_interposer(path: &Path) -> Result<(), KschedError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(KschedError::Interposer {
            path: path.to_owned(),
            source: std::io::Error::other("not a regular file"),
        }),
        Err(source) => Err(KschedError::Interposer {
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmk_kernel_sched::Gate;

    fn me() -> GateOwner {
        GateOwner::current()
    }

    #[test]
    fn a_gate_is_made_per_partition_and_removed_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let k = KernelSched::new(
            PathBuf::from("/lib/libmmk_interposer.so"),
            PolicyKind::Mmk,
            &dir.path().join("ksched"),
        )
        .unwrap();
        let job = k.prepare("g0i5", 66, None, None, me()).unwrap().unwrap();
        assert_eq!(job.gate, dir.path().join("ksched/g0i5.gate"));
        let gate = Gate::open(&job.gate).unwrap();
        assert_eq!(gate.config().sm_count, 66);
        assert_eq!(gate.config().policy, PolicyKind::Mmk);
        k.remove("g0i5");
        assert!(!job.gate.exists());
        k.remove("g0i5");
    }

    #[test]
    fn an_online_job_sets_its_partitions_policy_and_dur_threshold() {
        let dir = tempfile::tempdir().unwrap();
        let k = KernelSched::new(
            PathBuf::from("/lib/libmmk_interposer.so"),
            PolicyKind::Mmk,
            &dir.path().join("ksched"),
        )
        .unwrap();
        let profile = dir.path().join("serve.kprofile.json");
        let trace = format!(
            "{}\n0,9,online,cuLaunchKernel,conv,1,1,1,1,1,1,0,1,1,0x0,0,0,1000000,9000000\n",
            mmk_kernel_sched::trace::HEADER
        );
        let p = Profile::from_trace(
            "serve",
            mmk_kernel_sched::Class::Online,
            &mmk_kernel_sched::trace::parse(&trace).unwrap(),
        )
        .unwrap();
        std::fs::write(&profile, p.to_json()).unwrap();
        let tuning = OnlineTuning::from_spec(Some("orion"), Some(&profile), None).unwrap();
        assert_eq!(
            tuning.base,
            Some(Duration::from_micros(200)),
            "2.5 % of 8 ms"
        );
        let job = k
            .prepare("g0", 132, Some(&profile), Some(tuning), me())
            .unwrap()
            .unwrap();
        assert_eq!(job.profile.as_deref(), Some(profile.as_path()));
        let gate = Gate::open(&job.gate).unwrap();
        assert_eq!(gate.config().policy, PolicyKind::Orion);
        assert_eq!(gate.config().base, Duration::from_micros(200));
        // An offline job joining later keeps what the online job set.
        k.prepare("g0", 132, None, None, me()).unwrap().unwrap();
        assert_eq!(gate.config().policy, PolicyKind::Orion);
        // Once the instance is gone, the partition starts from mmkd's policy again.
        k.remove("g0");
        k.prepare("g0", 132, None, None, me()).unwrap().unwrap();
        let gate = Gate::open(&job.gate).unwrap();
        assert_eq!(gate.config().policy, PolicyKind::Mmk);

        let err = crate::error::chain(
            &OnlineTuning::from_spec(None, Some(&dir.path().join("none.json")), None).unwrap_err(),
        );
        assert!(err.contains("none.json"), "{err}");
        let err = crate::error::chain(
            &OnlineTuning::from_spec(None, Some(Path::new("/dev/zero")), None).unwrap_err(),
        );
        assert!(err.contains("not a regular file"), "{err}");
        std::fs::write(&profile, "{}").unwrap();
        let err =
            crate::error::chain(&OnlineTuning::from_spec(None, Some(&profile), None).unwrap_err());
        assert!(
            err.contains("serve.kprofile.json") && err.contains("kernel profile"),
            "{err}"
        );
    }

    #[test]
    fn the_operators_depth_cap_and_base_reach_every_gate() {
        let dir = tempfile::tempdir().unwrap();
        let k = KernelSched::new(
            PathBuf::from("/lib/libmmk_interposer.so"),
            PolicyKind::Mmk,
            &dir.path().join("ksched"),
        )
        .unwrap()
        .with_tuning(8, Some(Duration::from_micros(1500)))
        .with_gemm_slice(8000)
        .with_device_wait(Some(Duration::from_micros(200)))
        .with_hold_budget(30);
        let profiled = OnlineTuning {
            policy: None,
            base: Some(Duration::from_micros(29)),
        };
        let job = k
            .prepare("g0", 132, None, Some(profiled), me())
            .unwrap()
            .unwrap();
        let config = Gate::open(&job.gate).unwrap().config();
        assert_eq!(config.offline_depth, 8);
        assert_eq!(config.gemm_slice_mflop, 8000);
        assert!(config.device_wait);
        assert_eq!(config.device_wait_grain_us, 200);
        assert_eq!(config.hold_budget_pct, 30);
        assert_eq!(
            config.base,
            Duration::from_micros(1500),
            "the operator's base is over the profile's"
        );
        let plain = KernelSched::new(
            PathBuf::from("/lib/libmmk_interposer.so"),
            PolicyKind::Mmk,
            &dir.path().join("plain"),
        )
        .unwrap();
        let job = plain
            .prepare("g0", 132, None, Some(profiled), me())
            .unwrap()
            .unwrap();
        let config = Gate::open(&job.gate).unwrap().config();
        assert!(!config.device_wait);
        assert_eq!(
            (
                config.offline_depth,
                config.base,
                config.gemm_slice_mflop,
                config.hold_budget_pct
            ),
            (0, Duration::from_micros(29), 0, 0),
            "no holds unless the operator asks"
        );
    }

    #[test]
    fn the_job_spec_knows_every_policy() {
        let kernel_sched: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(kernel_sched, mmk_core::spec::KERNEL_POLICIES);
    }

    #[test]
    fn a_partitions_gate_is_read_as_it_is_and_a_bad_one_is_reported_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let k = KernelSched::new(
            PathBuf::from("/lib/libmmk_interposer.so"),
            PolicyKind::Fikit,
            &dir.path().join("ksched"),
        )
        .unwrap()
        .with_device_wait(Some(Duration::ZERO));
        assert!(k.read_gate("g0").is_none(), "no job has started there");
        let job = k.prepare("g0", 132, None, None, me()).unwrap().unwrap();
        // A job process: joined as online, two launches counted, one still in flight.
        let gate = Gate::open(&job.gate).unwrap();
        let slot = gate
            .join(std::process::id(), mmk_kernel_sched::Class::Online, 1.0)
            .unwrap();
        gate.count(slot);
        gate.begin(slot, &mmk_kernel_sched::Charge::default());
        // A process that died without leaving: its slot stays in the file, but it is not
        // shown as attached (its counters stay in the totals).
        let dead = gate
            .join(i32::MAX as u32, mmk_kernel_sched::Class::Offline, 0.5)
            .unwrap();
        gate.count(dead);
        let before = std::fs::read(&job.gate).unwrap();
        let view = k.read_gate("g0").expect("the gate");
        assert_eq!(
            std::fs::read(&job.gate).unwrap(),
            before,
            "reading changes nothing"
        );
        assert_eq!(view.path, job.gate);
        let state = view.state.expect("readable");
        assert_eq!(state.config.policy, PolicyKind::Fikit);
        assert!(state.config.device_wait);
        assert_eq!(state.totals.launches, 3);
        assert_eq!(state.processes.len(), 1);
        let p = state.processes[0];
        assert_eq!(
            (p.pid, p.class, p.launches, p.inflight),
            (
                std::process::id(),
                Some(mmk_kernel_sched::Class::Online),
                2,
                1
            )
        );

        // Not a gate: said why, and the file is left as it was.
        let bad = dir.path().join("ksched/g1i3.gate");
        std::fs::write(&bad, b"not a gate").unwrap();
        let view = k.read_gate("g1i3").expect("a file is there");
        let why = view.error_text().expect("not a gate");
        assert!(why.contains("g1i3.gate"), "{why}");
        assert_eq!(std::fs::read(&bad).unwrap(), b"not a gate");

        // An I/O error says its reason, not only which call failed.
        std::fs::create_dir(dir.path().join("ksched/g2.gate")).unwrap();
        let why = k
            .read_gate("g2")
            .expect("a path is there")
            .error_text()
            .expect("a dir");
        assert!(
            why.contains("g2.gate") && why.contains("directory"),
            "{why}"
        );

        // A link is not followed: reading it is an error, and its target is not read.
        std::os::unix::fs::symlink(&job.gate, dir.path().join("ksched/g3.gate")).unwrap();
        let why = k
            .read_gate("g3")
            .expect("a path is there")
            .error_text()
            .expect("a link");
        assert!(
            why.contains("g3.gate") && why.contains("symbolic links"),
            "{why}"
        );

        assert!(KernelSched::off().read_gate("g0").is_none());
    }

    #[test]
    fn off_makes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let k = KernelSched::off();
        assert_eq!(k.prepare("g0", 132, None, None, me()).unwrap(), None);
        assert!(!dir.path().join("ksched").exists());
    }
}
