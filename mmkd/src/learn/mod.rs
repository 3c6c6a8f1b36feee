//! Learned profiles: what a job's kernels ask of the GPU, measured while it runs and kept
//! under the job's signature, so that the next run of the same job is planned on what it
//! did rather than on the prior.
//!
//! - [`sampler`] reads each running job's slots in its partition's gate (the interposer
//!   keeps them: kernels and SMs in flight, launches, completions) every 1 to 3 ms, at
//!   jittered times so that the samples weigh time evenly, and sends what it saw to the
//!   store every [`sampler::FLUSH`] and when the job's run ends. Sampling reads shared
//!   memory only: the launch path does not change.
//! - This module holds what is kept ([`Observed`]), the signature a job is kept under
//!   ([`signature`]), the node's cache of stored profiles ([`Profiles`]) and what the
//!   planner makes of a profile ([`Learned::job_profile`]).
//!
//! A job's signature is its owner's uid with its `profile_key` when it gives one, else with
//! its name and a digest of its command (docs/planner.md, "Learned profiles"). Jobs of
//! one owner that give the same key share a profile; no job adds to another owner's.

pub mod sampler;

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use mmk_core::JobClass;
use mmk_core::spec::{JobSpec, Task, command_digest};
use mmk_partitioner::JobProfile;
use serde::{Deserialize, Serialize};

use crate::job::Owner;

/// SM demand is kept as a histogram of whole percent of the GPU's SMs, 0 to 100.
pub const HIST_BINS: usize = 101;
/// A profile with fewer samples than this, or less time, is shown but not planned on.
pub const MIN_SAMPLES: u64 = 1500;
pub const MIN_SECONDS: f64 = 3.0;
/// Windows of a job alone in its partition before its measured bandwidth is used.
pub const MIN_BW_WINDOWS: u64 = 3;
/// Past this many samples (about an hour of running), older samples weigh less: a
/// profile follows a job that changes.
pub const MAX_SAMPLES: u64 = 1_500_000;
/// The layout version of [`Observed`] as stored.
pub const VERSION: u32 = 1;

/// What was seen of a job over its runs. Counts add up over runs; derived figures come
/// from them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    pub version: u32,
    /// Times the job's slots were read while it had at least one process in the gate.
    pub samples: u64,
    /// Samples at which the job had kernels in flight.
    pub busy_samples: u64,
    /// Samples by SM demand: bin `i` counts samples at which the job's kernels in flight
    /// asked for `i` % of the GPU's SMs (each kernel its blocks over its blocks per SM,
    /// whatever its partition has; all of them at most the whole GPU).
    pub hist: Vec<u64>,
    /// Wall time over which the samples were taken, in seconds.
    pub seconds: f64,
    pub launches: u64,
    pub completed: u64,
    /// Runs that added to it.
    pub runs: u64,
    /// The most GPU memory its processes held at once, as the driver reported it (NVML's
    /// per-process memory, read once a second); 0: not known (the simulated node, or a
    /// driver that does not tell).
    #[serde(default)]
    pub mem_peak_bytes: u64,
    /// Windows of about a second in which the job ran alone in its partition and the
    /// driver said how much DRAM bandwidth the partition used (NVML GPM, Hopper and newer),
    /// and the sum of those, as fractions of the GPU's bandwidth; 0: none yet.
    #[serde(default)]
    pub bw_windows: u64,
    #[serde(default)]
    pub bw_sum: f64,
}

impl Default for Observed {
    fn default() -> Observed {
        Observed {
            version: VERSION,
            samples: 0,
            busy_samples: 0,
            hist: vec![0; HIST_BINS],
            seconds: 0.0,
            launches: 0,
            completed: 0,
            runs: 0,
            mem_peak_bytes: 0,
            bw_windows: 0,
            bw_sum: 0.0,
        }
    }
}

/// Why a stored profile cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ObservedError {
    #[error("layout version {0}, this build knows {VERSION}")]
    Version(u32),
    #[error("{0} histogram bins, expected {HIST_BINS}")]
    Bins(usize),
    #[error("the histogram holds {hist} samples, the count says {samples}")]
    Count { hist: u64, samples: u64 },
    #[error("{busy} busy samples of {samples}")]
    Busy { busy: u64, samples: u64 },
    #[error("seconds is {0}")]
    Seconds(f64),
    #[error("a bandwidth sum of {sum} over {windows} windows")]
    Bandwidth { sum: f64, windows: u64 },
}

impl Observed {
    /// Checks what came from the store (or anywhere else) before it is used.
    pub fn check(&self) -> Result<(), ObservedError> {
        if self.version != VERSION {
            return Err(ObservedError::Version(self.version));
        }
        if self.hist.len() != HIST_BINS {
            return Err(ObservedError::Bins(self.hist.len()));
        }
        let hist = self.hist.iter().fold(0u64, |a, b| a.saturating_add(*b));
        if hist != self.samples {
            return Err(ObservedError::Count {
                hist,
                samples: self.samples,
            });
        }
        if self.busy_samples > self.samples {
            return Err(ObservedError::Busy {
                busy: self.busy_samples,
                samples: self.samples,
            });
        }
        if !self.seconds.is_finite() || self.seconds < 0.0 {
            return Err(ObservedError::Seconds(self.seconds));
        }
        if !self.bw_sum.is_finite() || self.bw_sum < 0.0 || self.bw_sum > self.bw_windows as f64 {
            return Err(ObservedError::Bandwidth {
                sum: self.bw_sum,
                windows: self.bw_windows,
            });
        }
        Ok(())
    }

    /// One sample: `demand_pct` of the GPU's SMs asked for, kernels in flight or not.
    pub fn sample(&mut self, demand_pct: usize, busy: bool) {
        self.samples += 1;
        self.busy_samples += u64::from(busy);
        self.hist[demand_pct.min(HIST_BINS - 1)] += 1;
    }

    /// Adds `other` (a later part of the same job's life) to this.
    pub fn merge(&mut self, other: &Observed) {
        self.samples = self.samples.saturating_add(other.samples);
        self.busy_samples = self.busy_samples.saturating_add(other.busy_samples);
        for (a, b) in self.hist.iter_mut().zip(&other.hist) {
            *a = a.saturating_add(*b);
        }
        self.seconds += other.seconds;
        self.launches = self.launches.saturating_add(other.launches);
        self.completed = self.completed.saturating_add(other.completed);
        self.runs = self.runs.saturating_add(other.runs);
        self.mem_peak_bytes = self.mem_peak_bytes.max(other.mem_peak_bytes);
        self.bw_windows = self.bw_windows.saturating_add(other.bw_windows);
        self.bw_sum += other.bw_sum;
        if self.samples > MAX_SAMPLES {
            self.scale(MAX_SAMPLES as f64 / self.samples as f64);
        }
    }

    /// Every count times `f` (< 1), the histogram kept consistent with the sample count.
    fn scale(&mut self, f: f64) {
        let s = |v: u64| (v as f64 * f).round() as u64;
        for h in &mut self.hist {
            *h = s(*h);
        }
        self.samples = self.hist.iter().sum();
        self.busy_samples = s(self.busy_samples).min(self.samples);
        self.seconds *= f;
        self.launches = s(self.launches);
        self.completed = s(self.completed);
        if self.bw_windows > 0 {
            let windows = s(self.bw_windows).max(1);
            self.bw_sum =
                (self.bw_sum * windows as f64 / self.bw_windows as f64).min(windows as f64);
            self.bw_windows = windows;
        }
    }

    /// One window of about a second with the job alone in its partition, in which it used
    /// `frac` of the GPU's DRAM bandwidth.
    pub fn bandwidth(&mut self, frac: f64) {
        if frac.is_finite() {
            self.bw_windows += 1;
            self.bw_sum += frac.clamp(0.0, 1.0);
        }
    }

    /// The mean share of the GPU's DRAM bandwidth the job used alone in its partition, once
    /// measured over [`MIN_BW_WINDOWS`] windows.
    pub fn bw_mean(&self) -> Option<f64> {
        (self.bw_windows >= MIN_BW_WINDOWS).then(|| self.bw_sum / self.bw_windows as f64)
    }

    /// Time-weighted mean SM demand, as a fraction of the GPU.
    pub fn sm_mean(&self) -> f64 {
        if self.samples == 0 {
            return 0.0;
        }
        let sum: f64 = self
            .hist
            .iter()
            .enumerate()
            .map(|(i, n)| i as f64 * *n as f64)
            .sum();
        sum / self.samples as f64 / 100.0
    }

    /// The SM demand that 95 % of the time is at or below, as a fraction of the GPU.
    pub fn sm_p95(&self) -> f64 {
        let want = (self.samples as f64 * 0.95).ceil() as u64;
        let mut seen = 0;
        for (i, n) in self.hist.iter().enumerate() {
            seen += n;
            if seen >= want && seen > 0 {
                return i as f64 / 100.0;
            }
        }
        0.0
    }

    /// The fraction of time the job had kernels in flight.
    pub fn busy_frac(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.busy_samples as f64 / self.samples as f64
        }
    }

    /// Mean time a kernel was in flight alone on its stream: busy time over completions
    /// (a job whose streams run side by side has shorter kernels than this says).
    pub fn kernel_us(&self) -> Option<f64> {
        (self.completed > 0).then(|| self.busy_frac() * self.seconds * 1e6 / self.completed as f64)
    }

    /// Mean time between two launches.
    pub fn launch_interval_us(&self) -> Option<f64> {
        (self.launches > 0).then(|| self.seconds * 1e6 / self.launches as f64)
    }

    /// Enough has been seen to plan on it. A job whose launches were counted but none
    /// tracked to its end (a gate under `passthrough` tracks nothing) showed no demand
    /// because none was measured, not because it had none: never confident.
    pub fn confident(&self) -> bool {
        self.samples >= MIN_SAMPLES
            && self.seconds >= MIN_SECONDS
            && (self.launches == 0 || self.completed > 0)
    }
}

/// A run whose kernels take this many times as long as its profile says is reported.
pub const SLOW_FACTOR: f64 = 2.0;
/// ... once at least this many of its kernels have completed since the last report.
pub const SLOW_MIN_KERNELS: u64 = 100;

/// How much slower a run's kernels are than the job's confident profile says, when more
/// than [`SLOW_FACTOR`]: (ratio, the run's kernel time, the profile's, in us).
pub fn slower_than_learned(profile: &Learned, seen: &Observed) -> Option<(f64, f64, f64)> {
    if !profile.observed.confident() || seen.completed < SLOW_MIN_KERNELS {
        return None;
    }
    let expected = profile.observed.kernel_us()?;
    let now = seen.kernel_us()?;
    let ratio = now / expected.max(1e-9);
    (ratio > SLOW_FACTOR).then_some((ratio, now, expected))
}

/// The signature a job's profile is kept under; `None` for a job that runs no process
/// (a simulated workload). See the module docs.
pub fn signature(owner: Option<Owner>, spec: &JobSpec) -> Option<String> {
    let uid = owner.map_or_else(|| "-".to_owned(), |o| o.uid.to_string());
    if let Some(key) = &spec.profile_key {
        return Some(format!("{uid}/key/{key}"));
    }
    match &spec.task {
        Task::Command(c) => Some(format!(
            "{uid}/name/{}/cmd/{}",
            spec.name,
            command_digest(&c.args)
        )),
        Task::Attached(_) => Some(format!("{uid}/name/{}", spec.name)),
        Task::Workload(_) => None,
    }
}

/// A stored profile with what it was made of.
#[derive(Debug, Clone, PartialEq)]
pub struct Learned {
    pub signature: String,
    pub owner_uid: Option<u32>,
    /// The name of the job that last added to it.
    pub name: String,
    pub class: JobClass,
    pub observed: Observed,
    /// Unix ms.
    pub created_at: i64,
    pub updated_at: i64,
}

impl Learned {
    /// What the planner assumes of a job with this profile ([`JobProfile::learned`]).
    pub fn job_profile(&self, class: JobClass) -> JobProfile {
        JobProfile::learned(class, self.observed.sm_mean(), self.observed.bw_mean())
    }

    /// "learned (age 3m 20s, 4,210 samples)", for `mmkctl jobs get`.
    pub fn describe(&self, now_ms: i64) -> String {
        let age = std::time::Duration::from_secs(
            u64::try_from((now_ms - self.updated_at) / 1000).unwrap_or(0),
        );
        format!(
            "learned (age {}, {} samples)",
            humantime::format_duration(age),
            self.observed.samples
        )
    }
}

/// The node's learned profiles, by signature: loaded from the store at start, updated as
/// the sampler reports.
#[derive(Debug, Clone, Default)]
pub struct Profiles {
    by_signature: Arc<RwLock<HashMap<String, Learned>>>,
}

impl Profiles {
    pub fn new(profiles: impl IntoIterator<Item = Learned>) -> Profiles {
        Profiles {
            by_signature: Arc::new(RwLock::new(
                profiles
                    .into_iter()
                    .map(|p| (p.signature.clone(), p))
                    .collect(),
            )),
        }
    }

    pub fn get(&self, signature: &str) -> Option<Learned> {
        self.by_signature
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(signature)
            .cloned()
    }

    /// The profile a job is planned on: its learned one, once confident.
    pub fn for_job(&self, owner: Option<Owner>, spec: &JobSpec) -> Option<Learned> {
        if spec.exclusive {
            return None;
        }
        let learned = self.get(&signature(owner, spec)?)?;
        learned.observed.confident().then_some(learned)
    }

    /// Adds what the sampler saw of a job; returns the profile as it is now.
    pub fn add(&self, seen: &Seen, now_ms: i64) -> Learned {
        let mut map = self
            .by_signature
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = map
            .entry(seen.signature.clone())
            .or_insert_with(|| Learned {
                signature: seen.signature.clone(),
                owner_uid: seen.owner_uid,
                name: seen.name.clone(),
                class: seen.class,
                observed: Observed::default(),
                created_at: now_ms,
                updated_at: now_ms,
            });
        entry.observed.merge(&seen.observed);
        entry.name.clone_from(&seen.name);
        entry.class = seen.class;
        entry.updated_at = now_ms;
        entry.clone()
    }

    /// Every profile, by signature.
    pub fn all(&self) -> Vec<Learned> {
        let mut all: Vec<Learned> = self
            .by_signature
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.signature.cmp(&b.signature));
        all
    }
}

/// What the sampler saw of one job since its last report.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub job: u64,
    pub signature: String,
    pub owner_uid: Option<u32>,
    pub name: String,
    pub class: JobClass,
    pub observed: Observed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmk_core::spec::{AttachedSpec, CommandSpec, RestartPolicy};

    fn spec(task: Task) -> JobSpec {
        JobSpec {
            name: "train".into(),
            class: JobClass::Offline,
            gpu_memory_mib: 1024,
            slo_ms: None,
            slo_slowdown_pct: None,
            priority: 0,
            task,
            checkpoint: false,
            restart_policy: RestartPolicy::Never,
            max_restarts: 0,
            exclusive: false,
            profile_key: None,
        }
    }

    fn command(args: &[&str]) -> Task {
        Task::Command(CommandSpec {
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..CommandSpec::default()
        })
    }

    #[test]
    fn a_job_is_kept_under_its_owner_name_and_command_or_its_key() {
        let me = Some(Owner {
            uid: 1000,
            gid: 1000,
        });
        let other = Some(Owner {
            uid: 1001,
            gid: 1000,
        });
        let a = spec(command(&["python3", "train.py", "--epochs", "3"]));
        let b = spec(command(&["python3", "train.py", "--epochs", "5"]));
        assert_ne!(signature(me, &a), signature(me, &b), "another command");
        assert_ne!(signature(me, &a), signature(other, &a), "another owner");
        assert_eq!(signature(me, &a), signature(me, &a.clone()));
        let sig = signature(me, &a).expect("a command job has one");
        assert!(sig.starts_with("1000/name/train/cmd/"), "{sig}");
        let mut keyed = b.clone();
        keyed.profile_key = Some("team/gpt:v2".into());
        let mut keyed_too = a.clone();
        keyed_too.profile_key = Some("team/gpt:v2".into());
        assert_eq!(
            signature(me, &keyed).as_deref(),
            Some("1000/key/team/gpt:v2")
        );
        assert_eq!(signature(me, &keyed), signature(me, &keyed_too));
        assert_ne!(signature(me, &keyed), signature(other, &keyed));
        let attached = spec(Task::Attached(AttachedSpec::default()));
        assert_eq!(signature(me, &attached).as_deref(), Some("1000/name/train"));
    }

    /// A job busy half the time, asking for 50 % of the GPU when busy.
    fn half_busy(samples: u64) -> Observed {
        let mut o = Observed::default();
        for i in 0..samples {
            let busy = i % 2 == 0;
            o.sample(if busy { 50 } else { 0 }, busy);
        }
        o.seconds = samples as f64 * 0.002;
        o.launches = samples / 2;
        o.completed = samples / 2;
        o.runs = 1;
        o
    }

    #[test]
    fn the_derived_figures_follow_the_samples() {
        let o = half_busy(2000);
        assert_eq!(o.check(), Ok(()));
        assert!((o.sm_mean() - 0.25).abs() < 1e-9);
        assert_eq!(o.sm_p95(), 0.5);
        assert!((o.busy_frac() - 0.5).abs() < 1e-9);
        // 4 s, half of it busy, 1000 kernels: 2 ms each, one launch every 4 ms.
        assert!((o.kernel_us().expect("kernels") - 2000.0).abs() < 1e-6);
        assert!((o.launch_interval_us().expect("launches") - 4000.0).abs() < 1e-6);
        assert!(o.confident());
        assert!(!half_busy(100).confident());
        // Launches counted, none tracked (passthrough): no demand was measured.
        let mut untracked = half_busy(2000);
        (untracked.completed, untracked.busy_samples) = (0, 0);
        untracked.hist.iter_mut().for_each(|n| *n = 0);
        untracked.hist[0] = untracked.samples;
        assert!(!untracked.confident());
    }

    #[test]
    fn merging_keeps_the_ratios_and_forgets_slowly() {
        let mut o = half_busy(2000);
        o.merge(&half_busy(2000));
        assert_eq!(o.samples, 4000);
        assert_eq!(o.runs, 2);
        assert!((o.sm_mean() - 0.25).abs() < 1e-9);
        let mut big = half_busy(2000);
        big.scale(1000.0);
        big.merge(&half_busy(2000));
        assert!(big.samples <= MAX_SAMPLES, "{}", big.samples);
        assert_eq!(big.check(), Ok(()));
        assert!((big.sm_mean() - 0.25).abs() < 1e-3);
    }

    /// The bandwidth measured alone is used once three windows have it, and replaces the
    /// prior's scaled guess in the planner's profile; runs add up, scaling keeps the mean.
    #[test]
    fn a_measured_bandwidth_is_used_after_three_windows() {
        let mut o = half_busy(2000);
        let learned = |o: &Observed| Learned {
            signature: "s".into(),
            owner_uid: None,
            name: "train".into(),
            class: JobClass::Offline,
            observed: o.clone(),
            created_at: 0,
            updated_at: 0,
        };
        let guessed = learned(&o).job_profile(JobClass::Offline).bw_demand;
        o.bandwidth(0.6);
        o.bandwidth(0.8);
        assert_eq!(o.bw_mean(), None);
        assert_eq!(
            learned(&o).job_profile(JobClass::Offline).bw_demand,
            guessed
        );
        o.bandwidth(f64::NAN);
        o.bandwidth(1.3);
        assert_eq!(o.bw_windows, 3);
        assert!((o.bw_mean().expect("measured") - 0.8).abs() < 1e-9);
        assert!((learned(&o).job_profile(JobClass::Offline).bw_demand - 0.8).abs() < 1e-9);
        let mut big = o.clone();
        big.scale(1000.0);
        big.merge(&o);
        assert_eq!(big.check(), Ok(()));
        assert!((big.bw_mean().expect("measured") - 0.8).abs() < 1e-6);
    }

    #[test]
    fn a_bad_stored_profile_says_what_is_wrong() {
        let mut o = half_busy(10);
        o.hist.pop();
        assert_eq!(o.check(), Err(ObservedError::Bins(100)));
        let mut o = half_busy(10);
        o.samples = 11;
        assert!(matches!(o.check(), Err(ObservedError::Count { .. })));
        let mut o = half_busy(10);
        o.seconds = f64::NAN;
        assert!(matches!(o.check(), Err(ObservedError::Seconds(_))));
        let mut o = half_busy(10);
        o.version = 9;
        assert_eq!(o.check(), Err(ObservedError::Version(9)));
        let mut o = half_busy(10);
        o.bw_windows = 2;
        o.bw_sum = 2.5;
        assert!(matches!(o.check(), Err(ObservedError::Bandwidth { .. })));
    }

    #[test]
    fn the_planner_uses_a_confident_profile_only() {
        let me = Some(Owner {
            uid: 1000,
            gid: 1000,
        });
        let s = spec(command(&["python3", "train.py"]));
        let profiles = Profiles::default();
        let seen = |samples| Seen {
            job: 1,
            signature: signature(me, &s).expect("signature"),
            owner_uid: Some(1000),
            name: "train".into(),
            class: JobClass::Offline,
            observed: half_busy(samples),
        };
        profiles.add(&seen(100), 0);
        assert_eq!(profiles.for_job(me, &s), None, "100 samples are too few");
        let learned = profiles.add(&seen(2000), 1000);
        assert_eq!(learned.observed.samples, 2100);
        let used = profiles.for_job(me, &s).expect("confident now");
        let p = used.job_profile(JobClass::Offline);
        assert!((p.sm_demand - used.observed.sm_mean()).abs() < 1e-12);
        assert!(p.bw_demand < JobProfile::prior(JobClass::Offline).bw_demand);
        let mut exclusive = s.clone();
        exclusive.exclusive = true;
        assert_eq!(profiles.for_job(me, &exclusive), None, "exclusive stays so");
        assert_eq!(used.describe(61_000), "learned (age 1m, 2100 samples)");
    }

    #[test]
    fn a_run_much_slower_than_its_profile_is_told_apart() {
        let profile = Learned {
            signature: "s".into(),
            owner_uid: None,
            name: "x".into(),
            class: JobClass::Offline,
            observed: half_busy(2000),
            created_at: 0,
            updated_at: 0,
        };
        // The profile: 2 ms kernels. A report of the same is not slow.
        assert_eq!(slower_than_learned(&profile, &half_busy(2000)), None);
        // Kernels of 5 ms: 2.5 times as long.
        let mut slow = half_busy(2000);
        slow.completed = 400;
        let (ratio, now, expected) = slower_than_learned(&profile, &slow).expect("slow");
        assert!(
            (ratio - 2.5).abs() < 1e-9 && (now - 5000.0).abs() < 1e-6,
            "{ratio} {now}"
        );
        assert!((expected - 2000.0).abs() < 1e-6);
        // Too few kernels to tell.
        slow.completed = 50;
        assert_eq!(slower_than_learned(&profile, &slow), None);
        // A profile not yet confident says nothing.
        let mut young = profile.clone();
        young.observed = half_busy(100);
        slow.completed = 400;
        assert_eq!(slower_than_learned(&young, &slow), None);
    }
}
