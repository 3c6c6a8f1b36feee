//! The kernel scheduler's effect on jobs that share a partition, for the policies that run
//! it (MMK). The job-level simulation does not replay kernels; it takes two numbers from
//! a kernel-level source and applies them to the ground truth:
//!
//! - of an online job's slowdown from offline co-runners (its latency next to them over
//!   its latency without them, minus one), the part the kernel scheduler leaves
//!   ([`KernelEffect::online_excess_kept`]);
//! - an offline job's speed next to online co-runners, relative to its speed there
//!   without the kernel scheduler ([`KernelEffect::offline_kept`]).
//!
//! The numbers come from co-location rounds measured on a GPU
//! ([`KernelEffect::from_rounds`], the `rounds.json` files of
//! `lab/scripts/gpu/ksched-rounds.sh` and `lab/scripts/gpu/pairing-rounds.sh`), per pairing
//! of a family of online job with a family of offline job where the rounds measured it
//! ([`KernelEffect::by_pairing`]), or from the kernel-level simulator's report
//! ([`KernelEffect::from_ksim`], `mmk-lab ksim --output json`).

use std::collections::BTreeMap;
use std::sync::Arc;

use mmk_core::JobClass;
use mmk_core::workload::{self, Workload};
use mmk_partitioner::{CoRunner, JobProfile, PartitionShape, PerfModel};
use serde::{Deserialize, Serialize};

/// What the kernel scheduler does to online and offline jobs in one partition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelEffect {
    /// Of an online job's slowdown from offline co-runners, the part that stays, in [0, 1].
    pub online_excess_kept: f64,
    /// An offline job's speed next to online co-runners, relative to without the kernel
    /// scheduler, in (0, 1].
    pub offline_kept: f64,
    /// Where the numbers come from.
    pub source: String,
    /// The effect per pairing where it was measured; the two numbers above (their mean)
    /// for a pairing not here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<PairEffect>,
}

/// Families of workload the co-location rounds tell apart: what the measured services and
/// trainings stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Convolutional networks (measured: a ResNet-50 service, ResNet-152 training).
    Convolutional,
    /// Transformers (measured: a BERT-base service, BERT-base training).
    Transformer,
}

impl Family {
    pub fn of(w: &Workload) -> Family {
        match w.model {
            "BERT" | "Transformer" => Family::Transformer,
            _ => Family::Convolutional,
        }
    }
}

/// A pairing's rounds: the online job's family, the offline job's, and the `(name,
/// rounds.json text)` files that measured it.
pub type Pairing<'a> = (Family, Family, &'a [(&'a str, &'a str)]);

/// The kernel scheduler's effect on one pairing: an online job of one family beside an
/// offline job of another.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairEffect {
    pub online: Family,
    pub offline: Family,
    pub online_excess_kept: f64,
    pub offline_kept: f64,
}

/// One round of `lab/scripts/gpu/ksched-rounds.sh` (`rounds.json`, "configs").
#[derive(Debug, Deserialize)]
struct Round {
    /// The online job's mean latency (absent in a round of training alone).
    #[serde(default)]
    mean_ms: Option<f64>,
    #[serde(default)]
    train_steps_per_s: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct Rounds {
    configs: BTreeMap<String, Round>,
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Why a measured or simulated effect of the kernel scheduler cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KernelEffectError {
    #[error("{name}: not {what}")]
    Parse {
        name: String,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The file is well formed but does not give an effect; the message says why.
    #[error("{0}")]
    Invalid(String),
}

impl KernelEffect {
    /// The effect of `config` (a configuration name of the rounds, such as
    /// `ksfull-mmk-cprio-base1500-depth8`) in each `(name, rounds.json text)` that ran it.
    /// Per file: the online job's mean latency under `config` and under plain MPS (`mps`),
    /// each over the rounds' means and relative to the job alone (`ideal`), and the
    /// training's steps a second under `config` over plain MPS's; then the mean over the
    /// files. A round named `NAME@2` is a second round of `NAME`.
    pub fn from_rounds(
        files: &[(&str, &str)],
        config: &str,
    ) -> Result<KernelEffect, KernelEffectError> {
        let mut kept = Vec::new();
        let mut offline = Vec::new();
        let mut used = Vec::new();
        for (name, text) in files {
            let rounds: Rounds =
                serde_json::from_str(text).map_err(|source| KernelEffectError::Parse {
                    name: (*name).to_owned(),
                    what: "a rounds.json",
                    source,
                })?;
            let of = |which: &str| -> Vec<&Round> {
                rounds
                    .configs
                    .iter()
                    .filter(|(k, _)| k.split('@').next() == Some(which))
                    .map(|(_, r)| r)
                    .collect()
            };
            let under = of(config);
            if under.is_empty() {
                continue;
            }
            // The mean of a figure over rounds that all have it above zero.
            let figure = |rs: &[&Round],
                          which: &str,
                          field: &str,
                          get: fn(&Round) -> Option<f64>|
             -> Result<f64, KernelEffectError> {
                let v: Vec<f64> = rs.iter().filter_map(|r| get(r)).collect();
                if v.len() != rs.len() || v.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
                    return Err(KernelEffectError::Invalid(format!(
                        "{name}: a round of {which} has no {field} above zero"
                    )));
                }
                mean(&v).ok_or_else(|| {
                    KernelEffectError::Invalid(format!(
                        "{name}: {config} needs rounds of ideal and mps beside it"
                    ))
                })
            };
            let latency = |rs: &[&Round], which: &str| figure(rs, which, "mean_ms", |r| r.mean_ms);
            let steps = |rs: &[&Round], which: &str| {
                figure(rs, which, "train_steps_per_s", |r| r.train_steps_per_s)
            };
            let (ideal, mps) = (of("ideal"), of("mps"));
            let alone = latency(&ideal, "ideal")?;
            let shared = latency(&mps, "mps")?;
            let scheduled = latency(&under, config)?;
            let excess = shared / alone - 1.0;
            if excess <= 0.01 {
                return Err(KernelEffectError::Invalid(format!(
                    "{name}: plain MPS did not slow the online job down (x{:.3}): nothing to take a part of",
                    shared / alone
                )));
            }
            let (trained, trained_shared) = (steps(&under, config)?, steps(&mps, "mps")?);
            kept.push(((scheduled / alone - 1.0) / excess).clamp(0.0, 1.0));
            offline.push(trained / trained_shared);
            used.push(*name);
        }
        let (Some(online_excess_kept), Some(offline_kept)) = (mean(&kept), mean(&offline)) else {
            return Err(KernelEffectError::Invalid(format!(
                "no rounds of {config} in {} file(s)",
                files.len()
            )));
        };
        KernelEffect {
            online_excess_kept,
            offline_kept: offline_kept.min(1.0),
            source: format!("{config}, measured: {}", used.join(", ")),
            pairs: Vec::new(),
        }
        .checked()
    }

    /// The effect of `config` per pairing: for each `(online family, offline family,
    /// files)`, [`KernelEffect::from_rounds`] over those files; the effect for a pairing
    /// not measured is the mean over the pairings (each counted once, however many files
    /// it has).
    pub fn by_pairing(
        pairings: &[Pairing<'_>],
        config: &str,
    ) -> Result<KernelEffect, KernelEffectError> {
        let mut pairs = Vec::new();
        let mut sources = Vec::new();
        for &(online, offline, files) in pairings {
            let e = KernelEffect::from_rounds(files, config)?;
            if pairs
                .iter()
                .any(|p: &PairEffect| (p.online, p.offline) == (online, offline))
            {
                return Err(KernelEffectError::Invalid(format!(
                    "the pairing {online:?} beside {offline:?} is given twice"
                )));
            }
            sources.push(
                e.source
                    .strip_prefix(&format!("{config}, measured: "))
                    .unwrap_or(&e.source)
                    .to_owned(),
            );
            pairs.push(PairEffect {
                online,
                offline,
                online_excess_kept: e.online_excess_kept,
                offline_kept: e.offline_kept,
            });
        }
        let of = |f: fn(&PairEffect) -> f64| mean(&pairs.iter().map(f).collect::<Vec<_>>());
        let (Some(online_excess_kept), Some(offline_kept)) =
            (of(|p| p.online_excess_kept), of(|p| p.offline_kept))
        else {
            return Err(KernelEffectError::Invalid("no pairing given".to_owned()));
        };
        KernelEffect {
            online_excess_kept,
            offline_kept,
            source: format!("{config}, measured per pairing: {}", sources.join("; ")),
            pairs,
        }
        .checked()
    }

    /// The part of the online slowdown kept and the offline speed kept where an online
    /// job of family `online` runs beside an offline job of family `offline` (`None`: not
    /// a workload of the table): the pairing's where it was measured, else the mean.
    pub fn for_pair(&self, online: Option<Family>, offline: Option<Family>) -> (f64, f64) {
        self.pairs
            .iter()
            .find(|p| Some(p.online) == online && Some(p.offline) == offline)
            .map_or((self.online_excess_kept, self.offline_kept), |p| {
                (p.online_excess_kept, p.offline_kept)
            })
    }

    /// The effect of the kernel-level simulator's `mmk` policy against `passthrough` (plain
    /// sharing) in an `mmk-lab ksim --output json` report: each online job's mean latency
    /// relative to alone (`mean_vs_alone`), each offline job's throughput relative to
    /// passthrough (`vs_passthrough`), averaged over the jobs. Where passthrough slows the
    /// online jobs by under 1 %, the model sees nothing to remove and the part kept is 1.
    pub fn from_ksim(name: &str, text: &str) -> Result<KernelEffect, KernelEffectError> {
        #[derive(Deserialize)]
        struct Online {
            /// null where the job finished no request.
            mean_vs_alone: Option<f64>,
        }
        #[derive(Deserialize)]
        struct Offline {
            vs_passthrough: Option<f64>,
        }
        #[derive(Deserialize)]
        struct Row {
            policy: String,
            online: Vec<Online>,
            offline: Vec<Offline>,
        }
        #[derive(Deserialize)]
        struct Report {
            policies: Vec<Row>,
        }
        let r: Report = serde_json::from_str(text).map_err(|source| KernelEffectError::Parse {
            name: name.to_owned(),
            what: "an `mmk-lab ksim --output json` report",
            source,
        })?;
        let row = |p: &str| {
            r.policies
                .iter()
                .find(|row| row.policy == p)
                .ok_or_else(|| KernelEffectError::Invalid(format!("{name}: no {p} policy in the report (run ksim with --policies passthrough,mmk)")))
        };
        let (plain, mmk) = (row("passthrough")?, row("mmk")?);
        let online = |row: &Row| {
            mean(
                &row.online
                    .iter()
                    .filter_map(|o| o.mean_vs_alone)
                    .collect::<Vec<_>>(),
            )
        };
        let (Some(plain_online), Some(mmk_online)) = (online(plain), online(mmk)) else {
            return Err(KernelEffectError::Invalid(format!(
                "{name}: the report has no online job with a mean latency (mean_vs_alone)"
            )));
        };
        let Some(offline_kept) = mean(
            &mmk.offline
                .iter()
                .filter_map(|o| o.vs_passthrough)
                .filter(|v| v.is_finite())
                .collect::<Vec<_>>(),
        ) else {
            return Err(KernelEffectError::Invalid(format!(
                "{name}: the report has no offline job relative to passthrough"
            )));
        };
        let excess = plain_online - 1.0;
        let online_excess_kept = if excess > 0.01 {
            ((mmk_online - 1.0) / excess).clamp(0.0, 1.0)
        } else {
            1.0
        };
        KernelEffect {
            online_excess_kept,
            offline_kept: offline_kept.min(1.0),
            source: format!("the kernel-level simulator's mmk policy, {name}"),
            pairs: Vec::new(),
        }
        .checked()
    }

    fn checked(self) -> Result<KernelEffect, KernelEffectError> {
        if !(0.0..=1.0).contains(&self.online_excess_kept) {
            return Err(KernelEffectError::Invalid(format!(
                "{}: the online part kept is {}, not in [0, 1]",
                self.source, self.online_excess_kept
            )));
        }
        if !(self.offline_kept > 0.0 && self.offline_kept <= 1.0) {
            // (NaN fails this too)
            return Err(KernelEffectError::Invalid(format!(
                "{}: the offline speed kept is {}, not in (0, 1]",
                self.source, self.offline_kept
            )));
        }
        Ok(self)
    }
}

/// A ground truth with the kernel scheduler in every partition: `truth` for how fast jobs
/// run, changed by `effect` where online and offline jobs share a partition: for each job,
/// the mean of its pairings with the co-runners of the other class
/// ([`KernelEffect::for_pair`]).
#[derive(Debug)]
pub struct WithKernelSched {
    pub truth: Arc<dyn PerfModel>,
    pub effect: KernelEffect,
    /// Each workload's profile as the jobs carry it, with its family (`None` where
    /// workloads of both families carry that profile).
    families: Vec<(JobProfile, Option<Family>)>,
}

/// Whether `a` and `b` are the same profile, whatever the class.
fn same_profile(a: &JobProfile, b: &JobProfile) -> bool {
    a.sm_demand == b.sm_demand
        && a.bw_demand == b.bw_demand
        && a.solo_latency_ms == b.solo_latency_ms
}

impl WithKernelSched {
    /// `truth` under `effect`, for the workloads `jobs` as the jobs carry them (name and
    /// profile, `experiment::planners_jobs`). A profile that workloads of both families
    /// carry (the table gives Transformer and VGG-19 training the same nominal demands)
    /// tells no family: its jobs take the mean effect.
    pub fn new(
        truth: Arc<dyn PerfModel>,
        effect: KernelEffect,
        jobs: &[(String, JobProfile)],
    ) -> WithKernelSched {
        let carried: Vec<(JobProfile, Option<Family>)> = jobs
            .iter()
            .map(|(name, p)| (*p, workload::find(name).map(Family::of)))
            .collect();
        let families = carried
            .iter()
            .map(|(p, f)| {
                let both = carried.iter().any(|(q, g)| same_profile(p, q) && g != f);
                (*p, f.filter(|_| !both))
            })
            .collect();
        WithKernelSched {
            truth,
            effect,
            families,
        }
    }

    /// The family of the workload whose profile `p` is (whatever its class), if one.
    fn family(&self, p: &JobProfile) -> Option<Family> {
        self.families
            .iter()
            .find(|(w, _)| same_profile(w, p))
            .and_then(|&(_, f)| f)
    }

    /// The mean of `f` over the families of `co_runners` of `class` (at least one).
    fn mean_over(
        &self,
        co_runners: &[CoRunner],
        class: JobClass,
        f: impl Fn(Option<Family>) -> f64,
    ) -> f64 {
        let v: Vec<f64> = co_runners
            .iter()
            .filter(|c| c.profile.class == class)
            .map(|c| f(self.family(&c.profile)))
            .collect();
        mean(&v).unwrap_or(1.0)
    }
}

impl PerfModel for WithKernelSched {
    fn estimate(
        &self,
        job: &JobProfile,
        partition: &PartitionShape,
        mps_share: u8,
        co_runners: &[CoRunner],
    ) -> f64 {
        let shared = self.truth.estimate(job, partition, mps_share, co_runners);
        let has = |class: JobClass| co_runners.iter().any(|c| c.profile.class == class);
        match job.class {
            JobClass::Online if has(JobClass::Offline) => {
                // Latency goes as 1 / speed: keep that part of the latency the offline
                // co-runners add.
                let online_only: Vec<CoRunner> = co_runners
                    .iter()
                    .filter(|c| c.profile.class == JobClass::Online)
                    .copied()
                    .collect();
                let clear = self.truth.estimate(job, partition, mps_share, &online_only);
                if clear <= shared {
                    return shared;
                }
                let excess = clear / shared.max(f64::MIN_POSITIVE) - 1.0;
                let mine = self.family(job);
                let kept = self.mean_over(co_runners, JobClass::Offline, |c| {
                    self.effect.for_pair(mine, c).0
                });
                clear / (1.0 + excess * kept)
            }
            JobClass::Offline if has(JobClass::Online) => {
                let mine = self.family(job);
                shared
                    * self.mean_over(co_runners, JobClass::Online, |c| {
                        self.effect.for_pair(c, mine).1
                    })
            }
            _ => shared,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::experiment::planners_jobs;

    fn rounds(ideal: f64, mps: (f64, f64), ks: (f64, f64)) -> String {
        format!(
            r#"{{"setup": {{}}, "configs": {{
                "ideal": {{"mean_ms": {ideal}, "p50_ms": 1}},
                "mps": {{"mean_ms": {}, "train_steps_per_s": {}}},
                "ks": {{"mean_ms": {}, "train_steps_per_s": {}}},
                "ideal@2": {{"mean_ms": {ideal}}},
                "mps@2": {{"mean_ms": {}, "train_steps_per_s": {}}},
                "ks@2": {{"mean_ms": {}, "train_steps_per_s": {}}}
            }}}}"#,
            mps.0, mps.1, ks.0, ks.1, mps.0, mps.1, ks.0, ks.1
        )
    }

    #[test]
    fn rounds_give_the_part_of_the_online_slowdown_kept_and_the_training_kept() {
        // Alone 1 ms; plain MPS 3 ms (excess 2); the scheduler 1.2 ms (excess 0.2): a
        // tenth of the excess stays. Training 40 steps/s shared, 30 scheduled.
        let a = rounds(1.0, (3.0, 40.0), (1.2, 30.0));
        let e = KernelEffect::from_rounds(&[("a", &a)], "ks").unwrap();
        assert!((e.online_excess_kept - 0.1).abs() < 1e-9, "{e:?}");
        assert!((e.offline_kept - 0.75).abs() < 1e-9, "{e:?}");
        assert_eq!(e.source, "ks, measured: a");
        // Two files: the mean of each file's ratios; a file without the config is skipped.
        let b = rounds(2.0, (6.0, 20.0), (2.8, 10.0));
        let other = r#"{"configs": {"ideal": {"mean_ms": 1}}}"#;
        let e = KernelEffect::from_rounds(&[("a", &a), ("b", &b), ("c", other)], "ks").unwrap();
        assert!((e.online_excess_kept - 0.15).abs() < 1e-9, "{e:?}");
        assert!((e.offline_kept - 0.625).abs() < 1e-9, "{e:?}");
        assert_eq!(e.source, "ks, measured: a, b");
    }

    #[test]
    fn bad_rounds_are_named() {
        let e = KernelEffect::from_rounds(&[("x", "{")], "ks")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x: not a rounds.json"), "{e}");
        let e = KernelEffect::from_rounds(&[("x", r#"{"configs": {}}"#)], "ks")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "no rounds of ks in 1 file(s)");
        let no_mps = r#"{"configs": {"ideal": {"mean_ms": 1}, "ks": {"mean_ms": 1.1, "train_steps_per_s": 3}}}"#;
        let e = KernelEffect::from_rounds(&[("x", no_mps)], "ks")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "x: ks needs rounds of ideal and mps beside it");
        let flat = rounds(1.0, (1.0, 40.0), (1.0, 30.0));
        let e = KernelEffect::from_rounds(&[("x", &flat)], "ks")
            .unwrap_err()
            .to_string();
        assert!(e.contains("did not slow the online job down"), "{e}");
        let no_steps = r#"{"configs": {"ideal": {"mean_ms": 1}, "mps": {"mean_ms": 2, "train_steps_per_s": 3}, "ks": {"mean_ms": 1.1}}}"#;
        let e = KernelEffect::from_rounds(&[("x", no_steps)], "ks")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "x: a round of ks has no train_steps_per_s above zero");
        let zero_mps = rounds(1.0, (2.0, 0.0), (1.1, 30.0));
        let e = KernelEffect::from_rounds(&[("x", &zero_mps)], "ks")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "x: a round of mps has no train_steps_per_s above zero");
        let zero_alone = rounds(0.0, (2.0, 40.0), (1.1, 30.0));
        let e = KernelEffect::from_rounds(&[("x", &zero_alone)], "ks")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "x: a round of ideal has no mean_ms above zero");
        // A round of training alone has no latency; it does not matter unless it is used.
        let with_train_alone = r#"{"configs": {"train-alone": {"train_steps_per_s": 40},
            "ideal": {"mean_ms": 1}, "mps": {"mean_ms": 2, "train_steps_per_s": 40},
            "ks": {"mean_ms": 1.1, "train_steps_per_s": 30}}}"#;
        let e = KernelEffect::from_rounds(&[("x", with_train_alone)], "ks").unwrap();
        assert!((e.online_excess_kept - 0.1).abs() < 1e-9, "{e:?}");
    }

    fn ksim(plain: f64, mmk: f64, offline: f64) -> String {
        format!(
            r#"{{"sms": 132, "policies": [
                {{"policy": "passthrough", "online": [{{"job": "s", "mean_vs_alone": {plain}}}],
                  "offline": [{{"job": "t", "vs_passthrough": 1.0}}], "stp": 1.5}},
                {{"policy": "mmk", "online": [{{"job": "s", "mean_vs_alone": {mmk}}}],
                  "offline": [{{"job": "t", "vs_passthrough": {offline}}}], "stp": 1.4}}
            ]}}"#
        )
    }

    #[test]
    fn a_ksim_report_gives_mmk_against_passthrough() {
        let e = KernelEffect::from_ksim("k.json", &ksim(1.5, 1.1, 0.8)).unwrap();
        assert!((e.online_excess_kept - 0.2).abs() < 1e-9, "{e:?}");
        assert!((e.offline_kept - 0.8).abs() < 1e-9, "{e:?}");
        // A model that sees no online slowdown has nothing to remove.
        let e = KernelEffect::from_ksim("k.json", &ksim(1.0, 1.0, 0.9)).unwrap();
        assert_eq!(e.online_excess_kept, 1.0);
        let only_mmk = r#"{"policies": [{"policy": "mmk", "online": [], "offline": []}]}"#;
        let e = KernelEffect::from_ksim("k.json", only_mmk)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("k.json: no passthrough policy"), "{e}");
        let e = KernelEffect::from_ksim("k.json", "[]")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("k.json: not an `mmk-lab ksim --output json` report"),
            "{e}"
        );
    }

    /// Online: 1.0 alone, 0.8 next to another online job only, half that next to anything
    /// offline too (or 1.0 with `gain`: a co-runner that helps); offline 0.6.
    #[derive(Debug)]
    struct Halves {
        gain: bool,
    }
    impl PerfModel for Halves {
        fn estimate(&self, job: &JobProfile, _: &PartitionShape, _: u8, co: &[CoRunner]) -> f64 {
            let has = |c: JobClass| co.iter().any(|r| r.profile.class == c);
            let online = if has(JobClass::Online) { 0.8 } else { 1.0 };
            match job.class {
                JobClass::Online if has(JobClass::Offline) && self.gain => 1.0,
                JobClass::Online if has(JobClass::Offline) => online / 2.0,
                JobClass::Online => online,
                JobClass::Offline => 0.6,
            }
        }
    }

    #[test]
    fn the_scheduler_takes_back_part_of_the_online_slowdown_and_charges_the_offline_job() {
        let effect = KernelEffect {
            online_excess_kept: 0.25,
            offline_kept: 0.75,
            source: String::new(),
            pairs: Vec::new(),
        };
        let m = WithKernelSched::new(
            Arc::new(Halves { gain: false }),
            effect.clone(),
            &planners_jobs(&HashMap::new()),
        );
        let shape = PartitionShape {
            sm_count: 98,
            gpu_sm_count: 98,
            memory_slices: 8,
            gpu_memory_slices: 8,
        };
        let online = JobProfile::exclusive(JobClass::Online);
        let offline = JobProfile::exclusive(JobClass::Offline);
        let co = |p: JobProfile| CoRunner {
            profile: p,
            mps_share: 50,
        };
        // Next to the other online job alone it runs at 0.8; the offline job doubles its
        // latency on top (0.4): a quarter of that excess stays, 0.8 / 1.25.
        let v = m.estimate(&online, &shape, 50, &[co(offline), co(online)]);
        assert!((v - 0.64).abs() < 1e-9, "{v}");
        let v = m.estimate(&online, &shape, 50, &[co(offline)]);
        assert!((v - 0.8).abs() < 1e-9, "{v}");
        assert!((m.estimate(&offline, &shape, 50, &[co(online)]) - 0.45).abs() < 1e-9);
        // Nothing changes without the other class beside it.
        assert_eq!(m.estimate(&online, &shape, 50, &[co(online)]), 0.8);
        assert_eq!(m.estimate(&offline, &shape, 50, &[co(offline)]), 0.6);
        assert_eq!(m.estimate(&offline, &shape, 100, &[]), 0.6);
        // An offline co-runner that does not slow the online job: nothing to take back.
        let m = WithKernelSched::new(
            Arc::new(Halves { gain: true }),
            effect,
            &planners_jobs(&HashMap::new()),
        );
        assert_eq!(m.estimate(&online, &shape, 50, &[co(offline)]), 1.0);
    }

    #[test]
    fn each_pairing_gets_its_own_effect_and_others_the_mean() {
        // (a) 0.1 kept, training at 0.75; (b) 0.4 kept, training at 0.5.
        let a = rounds(1.0, (3.0, 40.0), (1.2, 30.0));
        let b = rounds(2.0, (6.0, 20.0), (3.6, 10.0));
        let (conv, tf) = (Family::Convolutional, Family::Transformer);
        let e = KernelEffect::by_pairing(&[(conv, tf, &[("a", &a)]), (tf, tf, &[("b", &b)])], "ks")
            .unwrap();
        assert_eq!(e.source, "ks, measured per pairing: a; b");
        assert!((e.online_excess_kept - 0.25).abs() < 1e-9, "{e:?}");
        assert!((e.offline_kept - 0.625).abs() < 1e-9, "{e:?}");
        let (kept, offline) = e.for_pair(Some(tf), Some(tf));
        assert!((kept - 0.4).abs() < 1e-9 && (offline - 0.5).abs() < 1e-9);
        assert_eq!(
            e.for_pair(Some(conv), Some(conv)),
            (e.online_excess_kept, e.offline_kept)
        );
        assert_eq!(
            e.for_pair(None, Some(tf)),
            (e.online_excess_kept, e.offline_kept)
        );
        let twice =
            KernelEffect::by_pairing(&[(tf, tf, &[("a", &a)]), (tf, tf, &[("b", &b)])], "ks");
        assert!(twice.unwrap_err().to_string().contains("given twice"));

        // In the ground truth: each job by the families of the table's workloads.
        let of = |name: &str, class: JobClass| {
            JobProfile::of_workload(mmk_core::workload::find(name).unwrap(), class)
        };
        // The transformer service as a measured truth carries it: not the table's demands.
        let transformer = JobProfile {
            sm_demand: 0.123,
            ..of("transformer-inference", JobClass::Online)
        };
        let m = WithKernelSched::new(
            Arc::new(Halves { gain: false }),
            e,
            &planners_jobs(&HashMap::from([("transformer-inference", transformer)])),
        );
        let shape = PartitionShape {
            sm_count: 98,
            gpu_sm_count: 98,
            memory_slices: 8,
            gpu_memory_slices: 8,
        };
        let resnet = of("resnet50-inference", JobClass::Online);
        let bert = of("bert-train", JobClass::Offline);
        let co = |p: JobProfile| CoRunner {
            profile: p,
            mps_share: 50,
        };
        // A convolutional service beside a transformer training: 0.1 of the halving kept.
        let v = m.estimate(&resnet, &shape, 50, &[co(bert)]);
        assert!((v - 1.0 / 1.1).abs() < 1e-9, "{v}");
        // A transformer service beside one: 0.4 kept.
        let v = m.estimate(&transformer, &shape, 50, &[co(bert)]);
        assert!((v - 1.0 / 1.4).abs() < 1e-9, "{v}");
        // A job of no family of the table: the mean, 0.25.
        let v = m.estimate(
            &JobProfile::exclusive(JobClass::Online),
            &shape,
            50,
            &[co(bert)],
        );
        assert!((v - 1.0 / 1.25).abs() < 1e-9, "{v}");
        // VGG-19 and Transformer training carry the same nominal demands: no family, the
        // mean (0.25 kept).
        let vgg = of("vgg19-train", JobClass::Offline);
        let v = m.estimate(&resnet, &shape, 50, &[co(vgg)]);
        assert!((v - 1.0 / 1.25).abs() < 1e-9, "{v}");
        // The training beside both services: the mean of its two pairings' 0.75 and 0.5.
        let v = m.estimate(&bert, &shape, 50, &[co(resnet), co(transformer)]);
        assert!((v - 0.6 * 0.625).abs() < 1e-9, "{v}");
    }
}
