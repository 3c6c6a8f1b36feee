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
}

/// A trace of `online` inference jobs and `offline` training jobs of the workload table,
/// in random order, arriving as a Poisson process. A job runs its workload's nominal
/// duration times a factor uniform in [0.5, 1.5); a `checkpointable` share of the offline
/// jobs may checkpoint, drawn from a stream of its own (so that the rest of a seed's trace
/// does not depend on it).
pub fn generate(spec: TraceSpec) -> Trace {
    let mut rng = Rng::new(spec.seed);
    let mut checkpoints = Rng::new(spec.seed ^ 0xC4EC_4901_4E7A_B1E5);
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
            t += -spec.mean_interval_s * (1.0 - rng.unit()).ln();
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
                duration_s: nominal * (0.5 + rng.unit()),
                memory_mib: w.nominal_memory_mib,
                checkpoint: class == JobClass::Offline
                    && (spec.checkpointable >= 1.0 || checkpoints.unit() < spec.checkpointable),
            }
        })
        .collect();
    Trace { jobs }
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
