//! `mmk-lab measure --kernels` and `--deep`: what each job's kernels look like, measured
//! alone at 100 % in a worker of its own, after the speed runs.
//!
//! - `--kernels`: the worker runs with the interposer in record mode
//!   (`MMK_KSCHED_RECORD`); the launches inside the window give a [`Kernels`] record
//!   (launch count, busy fraction, SM demand, duration mix).
//! - `--deep`: the worker runs under Nsight Compute with `--profile-from-start off`; the
//!   measure request carries `"profile": true`, and the worker starts the CUDA profiler
//!   at the window's first iteration (docs/measure.md). ncu profiles the first
//!   `--ncu-launches` kernels from there, and they give a [`Deep`] record (achieved
//!   occupancy, IPC, L2 hit rate, DRAM throughput; per kernel and weighted by run time).
//!   ncu runs with `--clock-control none`: it leaves the GPU's clocks alone.
//!
//! Each job gets a fresh worker so that its trace or its ncu report holds nothing else. A
//! job that fails is recorded as a `Failed` record of mode `kernels` or `deep` and the
//! pass goes on; `--resume` measures only the jobs without a record.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use mmk_core::stats::quantile;
use mmk_kernel_sched::profile::parse_ncu_rows;
use mmk_kernel_sched::trace::{self, TraceRecord};
use mmk_predictor::measured::{Deep, DeepKernel, Failed, JobRef, Kernels, Mode, Record};
use serde_json::{Value, json};

use crate::profile::{files_with_prefix, record_env};

use super::{
    Launch, MEASURE_GRACE, MeasureError, Monitor, PREPARE_TIMEOUT, Plan, Worker, appender,
    class_of, header, info,
};

/// What one pass measures, and how its worker is started.
#[derive(Debug, Clone)]
pub enum Pass {
    /// The interposer's record mode.
    Kernels { interposer: PathBuf },
    /// Nsight Compute.
    Deep { ncu: PathBuf, launches: u32 },
}

impl Pass {
    pub fn mode(&self) -> Mode {
        match self {
            Pass::Kernels { .. } => Mode::Kernels,
            Pass::Deep { .. } => Mode::Deep,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Pass::Kernels { .. } => "kernels",
            Pass::Deep { .. } => "deep",
        }
    }

    /// How to start the worker, writing its trace or report into `scratch`.
    fn launch(&self, scratch: &Path) -> Launch {
        match self {
            Pass::Kernels { interposer } => {
                let own = std::env::var("LD_PRELOAD").ok();
                Launch {
                    prefix: Vec::new(),
                    env: record_env(interposer, own.as_deref(), &scratch.join("trace-%p.csv"))
                        .map(|(k, v)| (k.to_owned(), v))
                        .to_vec(),
                    env_remove: vec![mmk_kernel_sched::env::GATE.into()],
                }
            }
            Pass::Deep { ncu, launches } => {
                let mut prefix: Vec<OsString> = vec![ncu.into()];
                prefix.extend(
                    [
                        "--csv",
                        "--page",
                        "raw",
                        "--print-kernel-base",
                        "mangled",
                        "--clock-control",
                        "none",
                        "--profile-from-start",
                        "off",
                        "--target-processes",
                        "all",
                        "--metrics",
                        &NCU_METRICS.join(","),
                        "--launch-count",
                        &launches.to_string(),
                        "--log-file",
                    ]
                    .map(OsString::from),
                );
                prefix.push(scratch.join("ncu.csv").into());
                Launch {
                    prefix,
                    env: Vec::new(),
                    env_remove: Vec::new(),
                }
            }
        }
    }
}

const NCU_TIME: &str = "gpu__time_duration.sum";
const NCU_OCCUPANCY: &str = "sm__warps_active.avg.pct_of_peak_sustained_active";
const NCU_IPC: &str = "sm__inst_executed.avg.per_cycle_active";
const NCU_L2_HIT: &str = "lts__t_sector_hit_rate.pct";
const NCU_DRAM: &str = "dram__throughput.avg.pct_of_peak_sustained_elapsed";
const NCU_METRICS: [&str; 5] = [NCU_TIME, NCU_OCCUPANCY, NCU_IPC, NCU_L2_HIT, NCU_DRAM];
/// How many kernels a deep record lists.
const TOP: usize = 10;

/// Runs `pass` for every job in `jobs` (alone at 100 %) that `done` does not hold,
/// appending a record (or a failure) per job to `out`, after a header when `write_header`
/// (a new file). Returns (measured, failed).
pub fn run_pass(
    plan: &Plan,
    pass: &Pass,
    jobs: &[(String, u32)],
    done: &HashSet<JobRef>,
    out: &Path,
    write_header: &mut bool,
    monitor: &dyn Monitor,
) -> Result<(usize, usize), MeasureError> {
    let log = out.with_extension("workers.log");
    let mut append = appender(out)?;
    let (mut measured, mut failed) = (0, 0);
    let total = jobs.len();
    for (n, (name, batch)) in jobs.iter().enumerate() {
        let job = JobRef {
            workload: name.clone(),
            batch: *batch,
            share_pct: 100,
        };
        if done.contains(&job) {
            continue;
        }
        let label = format!("{} ({})", job.label(), pass.name());
        let result = measure_job(plan, pass, &job, &log);
        if *write_header {
            *write_header = false;
            let info = result.as_ref().map(|(_, i)| i.clone()).unwrap_or_default();
            append(&Record::Header(header(plan, monitor, info)))?;
        }
        match result {
            Ok((r, _)) => {
                eprintln!("[{:>4}/{total}] {label}: {}", n + 1, describe(&r));
                append(&r)?;
                measured += 1;
            }
            Err(error) => {
                eprintln!("[{:>4}/{total}] {label}: failed: {error}", n + 1);
                append(&Record::Failed(Failed {
                    mode: pass.mode(),
                    jobs: vec![job],
                    error: error.to_string(),
                }))?;
                failed += 1;
            }
        }
    }
    Ok((measured, failed))
}

fn describe(r: &Record) -> String {
    let pct = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.0} %", v * 100.0));
    match r {
        Record::Kernels(k) => format!(
            "{} launches ({} kernels), busy {:.0} %, SM demand {:.0}, median {:.1} us",
            k.launches,
            k.distinct,
            k.busy_frac * 100.0,
            k.sm_demand,
            k.p50_us
        ),
        Record::Deep(d) => format!(
            "{} kernels profiled: occupancy {}, IPC {}, L2 hit {}, DRAM {}",
            d.profiled,
            pct(d.occupancy_frac),
            d.ipc.map_or("-".into(), |v| format!("{v:.2}")),
            pct(d.l2_hit_frac),
            pct(d.dram_tput_frac)
        ),
        _ => String::new(),
    }
}

/// One job's record, and what its worker said of itself.
fn measure_job(
    plan: &Plan,
    pass: &Pass,
    job: &JobRef,
    log: &Path,
) -> Result<(Record, BTreeMap<String, String>), MeasureError> {
    let scratch = tempfile::tempdir().map_err(|source| MeasureError::Io {
        op: "make",
        path: std::env::temp_dir(),
        source,
    })?;
    let mut w = Worker::spawn_with(plan, 100, log, &pass.launch(scratch.path()))?;
    let about = info(&mut w)?;
    let sms = about.get("sms").and_then(|s| s.parse::<u32>().ok());
    w.send(&json!({"op": "prepare", "workload": job.workload, "batch": job.batch}))?;
    let reply = w.reply(PREPARE_TIMEOUT).map_err(|e| e.in_job("prepare"))?;
    class_of(&reply)?;
    let start = mmk_kernel_sched::gate::monotonic_ns() + plan.settle.as_nanos() as u64;
    let end = start + plan.window.as_nanos() as u64;
    let mut req = json!({
        "op": "measure", "workload": job.workload, "batch": job.batch,
        "start": start as f64 / 1e9, "end": end as f64 / 1e9,
    });
    if matches!(pass, Pass::Deep { .. }) {
        req["profile"] = Value::Bool(true);
    }
    w.send(&req)?;
    let reply = w
        .reply(plan.settle + plan.window + MEASURE_GRACE)
        .map_err(|e| e.in_job("measure"))?;
    let iters = reply
        .get("iters")
        .and_then(Value::as_array)
        .map_or(0, |a| a.len() as u32);
    // The trace and the ncu report are complete once the worker has exited.
    drop(w);
    match pass {
        Pass::Kernels { .. } => {
            let mut records = Vec::new();
            for path in
                files_with_prefix(scratch.path(), "trace-").map_err(MeasureError::Kernels)?
            {
                let text =
                    mmk_cli::input::read_capped_text(path.as_ref(), mmk_cli::input::MAX_DATA_BYTES)
                        .map_err(|source| MeasureError::Input {
                            path: path.clone(),
                            source,
                        })?;
                records.extend(
                    trace::parse(&text)
                        .map_err(|e| MeasureError::Kernels(format!("{}: {e}", path.display())))?,
                );
            }
            let k = kernel_stats(job.clone(), &records, start, end, iters, sms)?;
            Ok((Record::Kernels(k), about))
        }
        Pass::Deep { ncu, .. } => {
            let path = scratch.path().join("ncu.csv");
            let text = mmk_cli::input::read_capped_text(path.as_ref(), mmk_cli::input::MAX_DATA_BYTES).map_err(|e| {
                MeasureError::Kernels(format!(
                    "{} wrote no report ({e}): is it installed, and may it read the GPU's counters?",
                    ncu.display()
                ))
            })?;
            let rows = parse_ncu_rows(&text, &NCU_METRICS)
                .map_err(|e| MeasureError::Kernels(format!("ncu's report: {e}")))?;
            Ok((Record::Deep(deep_stats(job.clone(), &rows)?), about))
        }
    }
}

/// The launches made inside [start, end] as a [`Kernels`] record.
pub fn kernel_stats(
    job: JobRef,
    records: &[TraceRecord],
    start: u64,
    end: u64,
    iters: u32,
    gpu_sms: Option<u32>,
) -> Result<Kernels, MeasureError> {
    let inside: Vec<&TraceRecord> = records
        .iter()
        .filter(|r| (start..=end).contains(&r.launch_ns))
        .collect();
    if inside.is_empty() {
        return Err(MeasureError::Kernels(format!(
            "the trace has no launch inside the window ({} launches in all): does the worker run under the interposer?",
            records.len()
        )));
    }
    let distinct = inside
        .iter()
        .map(|r| r.kernel.as_str())
        .collect::<HashSet<_>>()
        .len() as u32;
    let mut timed: Vec<(u64, u64, &TraceRecord)> = inside
        .iter()
        .filter_map(|r| Some((r.start_ns?, r.end_ns?, *r)))
        .filter(|(s, e, _)| e >= s)
        .collect();
    // Busy time: the union of the kernels' run times, cut to the window.
    timed.sort_by_key(|(s, _, _)| *s);
    let mut busy = 0u64;
    let mut cur: Option<(u64, u64)> = None;
    for &(s, e, _) in &timed {
        let (s, e) = (s.clamp(start, end), e.clamp(start, end));
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                busy += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = cur {
        busy += ce - cs;
    }
    let mut durs: Vec<f64> = timed.iter().map(|(s, e, _)| (e - s) as f64).collect();
    durs.sort_by(f64::total_cmp);
    let total: f64 = durs.iter().sum();
    let mut buckets = [0.0; 4];
    let mut sm = 0.0;
    for &(s, e, r) in &timed {
        let d = (e - s) as f64;
        let b = match e - s {
            0..10_000 => 0,
            10_000..100_000 => 1,
            100_000..1_000_000 => 2,
            _ => 3,
        };
        buckets[b] += d;
        sm += d * f64::from(r.sm_demand);
    }
    let (sm_demand, time_by_duration) = if total > 0.0 {
        (sm / total, buckets.map(|b| b / total))
    } else {
        (0.0, [0.0; 4])
    };
    Ok(Kernels {
        job,
        window_s: (end - start) as f64 / 1e9,
        iters,
        launches: inside.len() as u64,
        distinct,
        timed: timed.len() as u64,
        busy_frac: (busy as f64 / (end - start).max(1) as f64).clamp(0.0, 1.0),
        sm_demand,
        gpu_sms,
        p50_us: quantile(&durs, 0.5) / 1e3,
        p90_us: quantile(&durs, 0.9) / 1e3,
        time_by_duration,
    })
}

/// Time-weighted means of one kernel's (or a job's) metrics.
#[derive(Default)]
struct Weighted {
    time: f64,
    launches: u32,
    sums: HashMap<&'static str, (f64, f64)>,
}

impl Weighted {
    fn add(&mut self, metrics: &HashMap<String, f64>, t: f64) {
        self.time += t;
        self.launches += 1;
        for m in [NCU_OCCUPANCY, NCU_IPC, NCU_L2_HIT, NCU_DRAM] {
            if let Some(v) = metrics.get(m).filter(|v| v.is_finite()) {
                let e = self.sums.entry(m).or_default();
                e.0 += v * t;
                e.1 += t;
            }
        }
    }

    fn mean(&self, m: &str) -> Option<f64> {
        self.sums
            .get(m)
            .filter(|(_, w)| *w > 0.0)
            .map(|(s, w)| s / w)
    }

    /// (occupancy, ipc, l2 hit, dram) as fractions (IPC as is).
    fn fracs(&self) -> (Option<f64>, Option<f64>, Option<f64>, Option<f64>) {
        let pct = |m| self.mean(m).map(|v| (v / 100.0).clamp(0.0, 1.0));
        (
            pct(NCU_OCCUPANCY),
            self.mean(NCU_IPC).map(|v| v.max(0.0)),
            pct(NCU_L2_HIT),
            pct(NCU_DRAM),
        )
    }
}

/// ncu's launches as a [`Deep`] record.
pub fn deep_stats(
    job: JobRef,
    rows: &[mmk_kernel_sched::profile::NcuRow],
) -> Result<Deep, MeasureError> {
    let mut all = Weighted::default();
    let mut by_name: HashMap<&str, Weighted> = HashMap::new();
    for r in rows {
        let Some(&t) = r
            .metrics
            .get(NCU_TIME)
            .filter(|t| t.is_finite() && **t > 0.0)
        else {
            continue;
        };
        all.add(&r.metrics, t);
        by_name.entry(&r.name).or_default().add(&r.metrics, t);
    }
    if all.launches == 0 {
        return Err(MeasureError::Kernels(
            "ncu profiled no kernel with a run time: does the worker start the profiler when asked (\"profile\": true, docs/measure.md)?"
                .into(),
        ));
    }
    let mut top: Vec<(&str, Weighted)> = by_name.into_iter().collect();
    top.sort_by(|a, b| b.1.time.total_cmp(&a.1.time).then(a.0.cmp(b.0)));
    let (occupancy_frac, ipc, l2_hit_frac, dram_tput_frac) = all.fracs();
    Ok(Deep {
        job,
        profiled: all.launches,
        occupancy_frac,
        ipc,
        l2_hit_frac,
        dram_tput_frac,
        top: top
            .iter()
            .take(TOP)
            .map(|(name, w)| {
                let (occupancy_frac, ipc, l2_hit_frac, dram_tput_frac) = w.fracs();
                DeepKernel {
                    name: (*name).to_owned(),
                    launches: w.launches,
                    time_frac: w.time / all.time,
                    occupancy_frac,
                    ipc,
                    l2_hit_frac,
                    dram_tput_frac,
                }
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use mmk_kernel_sched::policy::Class;
    use mmk_kernel_sched::profile::NcuRow;

    use super::*;

    fn job() -> JobRef {
        JobRef {
            workload: "resnet50-inf".into(),
            batch: 32,
            share_pct: 100,
        }
    }

    fn launch(
        seq: u64,
        kernel: &str,
        launch_ns: u64,
        run: Option<(u64, u64)>,
        sm: u32,
    ) -> TraceRecord {
        TraceRecord {
            seq,
            pid: 1,
            class: Class::Online,
            api: "cuLaunchKernel".into(),
            kernel: kernel.into(),
            grid: [sm, 1, 1],
            block: [128, 1, 1],
            shared_mem: 0,
            blocks_per_sm: 1,
            sm_demand: sm,
            stream: 0,
            launch_ns,
            held_ns: 0,
            start_ns: run.map(|r| r.0),
            end_ns: run.map(|r| r.1),
        }
    }

    #[test]
    fn launches_in_the_window_give_busy_time_sm_demand_and_the_duration_mix() {
        let us = 1_000;
        let recs = [
            // Before the window: not counted.
            launch(0, "warm", 0, Some((0, 500 * us)), 132),
            // 5 us and 50 us kernels overlapping, then a 2 ms one; one untimed launch.
            launch(1, "a", 1_000 * us, Some((1_000 * us, 1_005 * us)), 10),
            launch(2, "b", 1_001 * us, Some((1_002 * us, 1_052 * us)), 100),
            launch(3, "c", 2_000 * us, Some((2_000 * us, 4_000 * us)), 132),
            launch(4, "a", 5_000 * us, None, 10),
            // After the window.
            launch(5, "late", 20_000 * us, Some((20_000 * us, 20_001 * us)), 1),
        ];
        let k = kernel_stats(job(), &recs, 1_000 * us, 11_000 * us, 3, Some(132)).unwrap();
        assert_eq!((k.launches, k.distinct, k.timed, k.iters), (4, 3, 3, 3));
        // Busy 52 us + 2000 us of the 10 ms window.
        assert!((k.busy_frac - 2.052 / 10.0).abs() < 1e-9, "{}", k.busy_frac);
        let total = 5.0 + 50.0 + 2000.0;
        assert!((k.sm_demand - (5.0 * 10.0 + 50.0 * 100.0 + 2000.0 * 132.0) / total).abs() < 1e-9);
        assert_eq!(k.p50_us, 50.0);
        assert!((k.time_by_duration[0] - 5.0 / total).abs() < 1e-12);
        assert!((k.time_by_duration[1] - 50.0 / total).abs() < 1e-12);
        assert_eq!(k.time_by_duration[2], 0.0);
        assert!((k.time_by_duration[3] - 2000.0 / total).abs() < 1e-12);
        let e = kernel_stats(job(), &recs[..1], 1_000 * us, 2_000 * us, 0, None).unwrap_err();
        assert!(
            matches!(&e, MeasureError::Kernels(why) if why.contains("no launch inside the window (1 launches")),
            "{e}"
        );
    }

    fn row(name: &str, t: f64, occ: f64, ipc: f64, l2: f64, dram: Option<f64>) -> NcuRow {
        let mut metrics: HashMap<String, f64> = [
            (NCU_TIME, t),
            (NCU_OCCUPANCY, occ),
            (NCU_IPC, ipc),
            (NCU_L2_HIT, l2),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        if let Some(d) = dram {
            metrics.insert(NCU_DRAM.into(), d);
        }
        NcuRow {
            name: name.into(),
            metrics,
        }
    }

    #[test]
    fn ncu_launches_are_weighted_by_run_time_and_the_top_kernels_listed() {
        let rows = [
            row("gemm", 300.0, 50.0, 2.0, 80.0, Some(20.0)),
            row("relu", 100.0, 90.0, 0.5, 40.0, Some(80.0)),
            row("gemm", 300.0, 50.0, 2.0, 80.0, None),
        ];
        let d = deep_stats(job(), &rows).unwrap();
        assert_eq!(d.profiled, 3);
        assert!((d.occupancy_frac.unwrap() - (0.5 * 600.0 + 0.9 * 100.0) / 700.0).abs() < 1e-9);
        assert!((d.ipc.unwrap() - (2.0 * 600.0 + 0.5 * 100.0) / 700.0).abs() < 1e-9);
        // DRAM is weighted over the launches that have it.
        assert!((d.dram_tput_frac.unwrap() - (0.2 * 300.0 + 0.8 * 100.0) / 400.0).abs() < 1e-9);
        assert_eq!(d.top[0].name, "gemm");
        assert_eq!(d.top[0].launches, 2);
        assert!((d.top[0].time_frac - 600.0 / 700.0).abs() < 1e-12);
        assert_eq!(d.top[1].l2_hit_frac, Some(0.4));
        let e = deep_stats(job(), &[]).unwrap_err();
        assert!(
            matches!(&e, MeasureError::Kernels(why) if why.contains("\"profile\": true")),
            "{e}"
        );
    }
}
