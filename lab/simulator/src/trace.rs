//! Job traces: a generator (the paper's Table III mix with Poisson arrivals) and a CSV
//! format for replaying one's own trace.
//!
//! Format (README.md): a header `arrival_s,workload,class,duration_s,gpu_memory_mib,checkpoint`,
//! then one job per line in any order. `arrival_s`: seconds from the start; `workload`: a
//! name from the workload table (its SM and bandwidth demand and solo latency come from
//! there); `class`: `online` or `offline`; `duration_s`: how long the job runs alone on a
//! whole GPU; `gpu_memory_mib`; `checkpoint`: `true` when the job may be stopped and
//! restarted with another share (offline jobs only).

use std::fmt::Write as _;

use mmk_core::JobClass;
use mmk_core::rng::Rng;
use mmk_core::workload::{self, Phase};
use thiserror::Error;

/// One job of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    pub arrival_s: f64,
    pub workload: &'static workload::Workload,
    pub class: JobClass,
    pub duration_s: f64,
    pub memory_mib: u64,
    pub checkpoint: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// Sorted by arrival.
    pub jobs: Vec<TraceJob>,
}

pub const HEADER: &str = "arrival_s,workload,class,duration_s,gpu_memory_mib,checkpoint";

/// The largest `arrival_s` and `duration_s` (about 31 years): beyond it the simulator's
/// clock (seconds in an `f64`) no longer resolves a job's progress, and a run would never
/// end.
pub const MAX_SECONDS: f64 = 1e9;

#[derive(Debug, Error)]
pub enum TraceError {
    #[error("line {line}, column {column}: {message}")]
    Bad {
        line: usize,
        column: &'static str,
        message: String,
    },
    #[error("the trace has no jobs")]
    Empty,
}

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceSpec {
    pub online: usize,
    pub offline: usize,
    /// Mean time between arrivals (Poisson arrivals), seconds.
    pub mean_interval_s: f64,
    pub seed: u64,
    /// The share of offline jobs that can checkpoint (0 to 1); online jobs never do.
    pub checkpointable: f64,
    /// How job durations spread around the workload's nominal one.
    pub durations: Durations,
    /// Mean number of jobs that arrive together (1: plain Poisson arrivals).
    pub burst: f64,
}

/// A job's duration: its workload's nominal duration times a factor of mean 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Durations {
    /// Uniform in [0.5, 1.5): every job within half its nominal duration.
    Uniform,
    /// Lognormal with this sigma (of the log), scaled to mean 1: a few jobs run many
    /// times longer than most (sigma 2: the median job runs 0.14x, one in a hundred over
    /// 14x the nominal duration).
    Lognormal(f64),
}

/// Jobs of a burst arrive this many seconds apart.
pub const BURST_GAP_S: f64 = 1.0;

/// A trace of `online` inference jobs and `offline` training jobs of the workload table,
/// in random order, arriving as a Poisson process (with `burst` > 1, in bursts: a burst's
/// size is geometric with mean `burst`, its jobs [`BURST_GAP_S`] apart, and bursts a
/// Poisson process whose mean gap keeps the jobs' mean interval). A job runs its
/// workload's nominal duration times a factor of mean 1 ([`Durations`]); a
/// `checkpointable` share of the offline jobs may checkpoint. Checkpoints, lognormal
/// durations and bursts draw from streams of their own, so that one seed gives the same
/// jobs in the same order whatever they are set to.
pub fn generate(spec: TraceSpec) -> Trace {
    let mut rng = Rng::new(spec.seed);
    let mut checkpoints = Rng::new(spec.seed ^ 0xC4EC_4901_4E7A_B1E5);
    let mut spread = Rng::new(spec.seed ^ 0x5B2E_AD1D_0A7E_11C3);
    let mut bursts = Rng::new(spec.seed ^ 0xB025_7A11_8E5E_ED01);
    // Jobs left in the current burst after this one.
    let mut left_in_burst = 0u64;
    let pick = |phase: Phase| -> Vec<&'static workload::Workload> {
        workload::WORKLOADS
            .iter()
            .filter(|w| w.phase == phase)
            .collect()
    };
    let (inf, train) = (pick(Phase::Inference), pick(Phase::Train));
    let mut classes: Vec<JobClass> = std::iter::repeat_n(JobClass::Online, spec.online)
        .chain(std::iter::repeat_n(JobClass::Offline, spec.offline))
        .collect();
    rng.shuffle(&mut classes);
    let mut t = 0.0;
    let jobs = classes
        .into_iter()
        .map(|class| {
            let gap = -spec.mean_interval_s * (1.0 - rng.unit()).ln();
            if spec.burst <= 1.0 {
                t += gap;
            } else if left_in_burst > 0 {
                left_in_burst -= 1;
                t += BURST_GAP_S;
            } else {
                // Geometric size >= 1 with mean `burst`; the burst's own gaps are taken
                // out of the gap before it, so the mean interval stays.
                let p = 1.0 / spec.burst;
                let size = 1 + ((1.0 - bursts.unit()).ln() / (1.0 - p).ln()).floor() as u64;
                left_in_burst = size - 1;
                let mean_gap =
                    (spec.mean_interval_s - BURST_GAP_S * (1.0 - p)).max(0.0) * spec.burst;
                t += -mean_gap * (1.0 - bursts.unit()).ln();
            }
            let pool = if class == JobClass::Online {
                &inf
            } else {
                &train
            };
            let w = pool[rng.below(pool.len())];
            let nominal = w.nominal_duration_ms(w.default_batch()) as f64 / 1000.0;
            TraceJob {
                arrival_s: t,
                workload: w,
                class,
                duration_s: nominal * spec.durations.factor(rng.unit(), &mut spread),
                memory_mib: w.nominal_memory_mib,
                checkpoint: class == JobClass::Offline
                    && (spec.checkpointable >= 1.0 || checkpoints.unit() < spec.checkpointable),
            }
        })
        .collect();
    Trace { jobs }
}

impl Durations {
    /// The factor for one job; `uniform` is its draw from the trace's main stream, which
    /// every setting takes so that the rest of the trace stays the same.
    fn factor(self, uniform: f64, spread: &mut Rng) -> f64 {
        match self {
            Durations::Uniform => 0.5 + uniform,
            Durations::Lognormal(sigma) => (sigma * spread.normal() - sigma * sigma / 2.0).exp(),
        }
    }
}

impl Trace {
    pub fn to_csv(&self) -> String {
        let mut s = format!("{HEADER}\n");
        for j in &self.jobs {
            let _ = writeln!(
                s,
                "{:.3},{},{},{:.3},{},{}",
                j.arrival_s,
                j.workload.name,
                j.class.as_str(),
                j.duration_s,
                j.memory_mib,
                j.checkpoint
            );
        }
        s
    }

    /// Parses the CSV format; a bad value names its line and column.
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let Some((hl, header)) = lines.next() else {
            return Err(TraceError::Empty);
        };
        if header.replace(' ', "") != HEADER {
            return Err(TraceError::Bad {
                line: hl,
                column: "header",
                message: format!("the header must be {HEADER}"),
            });
        }
        const COLS: [&str; 6] = [
            "arrival_s",
            "workload",
            "class",
            "duration_s",
            "gpu_memory_mib",
            "checkpoint",
        ];
        let mut jobs = Vec::new();
        for (line, l) in lines {
            let cells: Vec<&str> = l.split(',').map(str::trim).collect();
            let bad = |c: usize, message: String| TraceError::Bad {
                line,
                column: COLS[c],
                message,
            };
            if cells.len() != COLS.len() {
                return Err(bad(
                    cells.len().min(5),
                    format!("{} cells; the header has 6", cells.len()),
                ));
            }
            let num = |c: usize| -> Result<f64, TraceError> {
                cells[c]
                    .parse::<f64>()
                    .ok()
                    .filter(|v| (0.0..=MAX_SECONDS).contains(v))
                    .ok_or_else(|| {
                        bad(
                            c,
                            format!(
                                "{:?} is not a number from 0 to {MAX_SECONDS:e} (about 31 years)",
                                cells[c]
                            ),
                        )
                    })
            };
            let arrival_s = num(0)?;
            let workload = workload::find(cells[1]).ok_or_else(|| {
                bad(
                    1,
                    format!(
                        "unknown workload {:?}; known: {}",
                        cells[1],
                        workload::names().join(", ")
                    ),
                )
            })?;
            let class = match cells[2] {
                "online" => JobClass::Online,
                "offline" => JobClass::Offline,
                o => return Err(bad(2, format!("{o:?} must be online or offline"))),
            };
            let duration_s = num(3)?;
            if duration_s <= 0.0 {
                return Err(bad(3, "must be greater than zero".into()));
            }
            let memory_mib = cells[4]
                .parse::<u64>()
                .ok()
                .filter(|m| *m > 0)
                .ok_or_else(|| bad(4, format!("{:?} is not a whole number > 0", cells[4])))?;
            let checkpoint = match cells[5] {
                "true" => true,
                "false" => false,
                o => return Err(bad(5, format!("{o:?} must be true or false"))),
            };
            if checkpoint && class == JobClass::Online {
                return Err(bad(5, "only offline jobs checkpoint".into()));
            }
            jobs.push(TraceJob {
                arrival_s,
                workload,
                class,
                duration_s,
                memory_mib,
                checkpoint,
            });
        }
        if jobs.is_empty() {
            return Err(TraceError::Empty);
        }
        jobs.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
        Ok(Trace { jobs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_traces_are_seeded_and_round_trip() {
        let spec = TraceSpec {
            online: 20,
            offline: 10,
            mean_interval_s: 40.0,
            seed: 5,
            checkpointable: 1.0,
            durations: Durations::Uniform,
            burst: 1.0,
        };
        let t = generate(spec);
        assert_eq!(t.jobs.len(), 30);
        assert_eq!(t, generate(spec));
        assert_ne!(t, generate(TraceSpec { seed: 6, ..spec }));
        assert_eq!(
            t.jobs
                .iter()
                .filter(|j| j.class == JobClass::Online)
                .count(),
            20
        );
        assert!(t.jobs.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
        let mean = t.jobs.last().map_or(0.0, |j| j.arrival_s) / 30.0;
        assert!((10.0..120.0).contains(&mean), "{mean}");
        let back = Trace::parse(&t.to_csv()).unwrap();
        assert_eq!(back.jobs.len(), 30);
        assert_eq!(back.jobs[3].workload.name, t.jobs[3].workload.name);
    }

    fn spec(durations: Durations, burst: f64) -> TraceSpec {
        TraceSpec {
            online: 2000,
            offline: 1000,
            mean_interval_s: 40.0,
            seed: 7,
            checkpointable: 0.5,
            durations,
            burst,
        }
    }

    /// Durations: `nominal * factor`, the factor as the job's workload gives it.
    fn factors(t: &Trace) -> Vec<f64> {
        t.jobs
            .iter()
            .map(|j| {
                let w = j.workload;
                j.duration_s / (w.nominal_duration_ms(w.default_batch()) as f64 / 1000.0)
            })
            .collect()
    }

    #[test]
    fn lognormal_durations_spread_the_same_jobs_at_the_same_mean() {
        let plain = generate(spec(Durations::Uniform, 1.0));
        let spread = generate(spec(Durations::Lognormal(1.0), 1.0));
        // The same jobs at the same times; only their durations differ.
        assert!(plain.jobs.iter().zip(&spread.jobs).all(|(a, b)| {
            a.workload.name == b.workload.name
                && a.class == b.class
                && a.arrival_s == b.arrival_s
                && a.checkpoint == b.checkpoint
        }));
        let f = factors(&plain);
        assert!(f.iter().all(|x| (0.5..1.5).contains(x)));
        let mut f = factors(&spread);
        let mean = f.iter().sum::<f64>() / f.len() as f64;
        assert!((0.85..1.15).contains(&mean), "mean factor {mean}");
        f.sort_by(f64::total_cmp);
        // Lognormal, sigma 1, mean 1: median e^-0.5 = 0.61, one job in a hundred over
        // e^(2.33 - 0.5) = 6.2.
        let (median, p99) = (f[f.len() / 2], f[f.len() * 99 / 100]);
        assert!((0.5..0.75).contains(&median), "median {median}");
        assert!((4.5..8.5).contains(&p99), "p99 {p99}");
    }

    #[test]
    fn bursty_arrivals_come_together_at_the_same_mean_interval() {
        let plain = generate(spec(Durations::Uniform, 1.0));
        let bursty = generate(spec(Durations::Uniform, 5.0));
        assert!(
            plain.jobs.iter().zip(&bursty.jobs).all(|(a, b)| {
                a.workload.name == b.workload.name && a.duration_s == b.duration_s
            })
        );
        let gaps = |t: &Trace| -> Vec<f64> {
            t.jobs
                .windows(2)
                .map(|w| w[1].arrival_s - w[0].arrival_s)
                .collect()
        };
        let in_burst = |t: &Trace| gaps(t).iter().filter(|&&g| g == BURST_GAP_S).count();
        // Bursts of 5 on average: about 4 of 5 jobs follow the one before by the burst's
        // gap; Poisson arrivals every 40 s almost never do.
        let n = bursty.jobs.len() as f64;
        let share = in_burst(&bursty) as f64 / n;
        assert!((0.72..0.88).contains(&share), "in-burst share {share}");
        assert!(in_burst(&plain) < 3);
        let mean = bursty.jobs.last().map_or(0.0, |j| j.arrival_s) / n;
        assert!((34.0..46.0).contains(&mean), "mean interval {mean}");
    }

    #[test]
    fn a_bad_line_names_its_column() {
        let e = Trace::parse(&format!("{HEADER}\n1.0,resnet50-inference,online,60,4096,false\n2.0,resnet51,online,60,4096,false\n"))
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("line 3, column workload: unknown workload \"resnet51\""),
            "{e}"
        );
        let e = Trace::parse(&format!(
            "{HEADER}\n1.0,resnet50-inference,online,60,4096,true\n"
        ))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 2, column checkpoint: only offline jobs checkpoint"
        );
        let e = Trace::parse(&format!(
            "{HEADER}\n1.0,resnet50-inference,online,-5,4096,false\n"
        ))
        .unwrap_err();
        assert!(
            e.to_string().starts_with("line 2, column duration_s"),
            "{e}"
        );
    }
}
