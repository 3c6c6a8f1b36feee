//! The sweep: a plan run through a worker job by job, written as it goes, and the raw records turned into the dataset.

use super::*;

// ---------------------------------------------------------------------------------------
// The sweep.

/// What a sweep did.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub out: String,
    pub planned: usize,
    pub measured: usize,
    pub failed: usize,
    pub kept: usize,
    pub seconds: f64,
    pub dataset: Option<String>,
    pub rows: Option<usize>,
}

/// Measures every run of `plan` not already in `done`, appending records to `out`.
pub fn sweep(
    plan: &Plan,
    monitor: &dyn Monitor,
    out: &Path,
    done: &HashSet<(Mode, Vec<JobRef>)>,
    write_header: &mut bool,
) -> Result<Summary, MeasureError> {
    let started = Instant::now();
    let log = out.with_extension("workers.log");
    let mut append = appender(out)?;
    let mut s = Summary {
        out: out.display().to_string(),
        planned: plan.runs(),
        ..Summary::default()
    };
    let total = s.planned;
    let mut n = 0;
    for g in &plan.groups {
        let todo: Vec<&Vec<(String, u32)>> = g
            .runs
            .iter()
            .filter(|r| !done.contains(&(g.mode, g.refs(r))))
            .collect();
        n += g.runs.len() - todo.len();
        s.kept += g.runs.len() - todo.len();
        if todo.is_empty() {
            continue;
        }
        let mut workers: Vec<Worker> = Vec::new();
        for run in todo {
            n += 1;
            let refs = g.refs(run);
            // A worker that died (out of memory, a crash) is started again.
            if workers.len() != g.shares.len() || !workers.iter_mut().all(Worker::alive) {
                workers.clear();
                for sh in &g.shares {
                    workers.push(Worker::spawn(plan, *sh, &log)?);
                }
                if *write_header {
                    *write_header = false;
                    let info = match info(&mut workers[0]) {
                        Ok(info) => info,
                        Err(e) => {
                            // No answer to keep in step with: start it again.
                            eprintln!("mmk-lab: warning: the worker did not say what it is: {e}");
                            workers[0] = Worker::spawn(plan, g.shares[0], &log)?;
                            BTreeMap::new()
                        }
                    };
                    append(&Record::Header(header(plan, monitor, info)))?;
                }
            }
            let label = refs
                .iter()
                .map(|r| format!("{} @ {} %", r.label(), r.share_pct))
                .collect::<Vec<_>>()
                .join(" + ");
            match measure_run(plan, g, run, &refs, &mut workers, monitor) {
                Ok(r) => {
                    eprintln!("[{n:>4}/{total}] {}", progress(&r, &label));
                    append(&Record::Run(r))?;
                    s.measured += 1;
                }
                Err(error) => {
                    // A worker may still owe a reply (its partner failed first, or it
                    // answered too late): start the group's workers afresh.
                    workers.clear();
                    eprintln!("[{n:>4}/{total}] {label}: failed: {error}");
                    append(&Record::Failed(Failed {
                        mode: g.mode,
                        jobs: refs,
                        error: error.to_string(),
                    }))?;
                    s.failed += 1;
                }
            }
            if g.mode == Mode::Alone {
                // Each workload is measured once per share: free it. A worker that does
                // not answer is started again before the next run.
                let dropped = workers.iter_mut().all(|w| {
                    w.send(&json!({"op": "drop"})).is_ok() && w.reply(PREPARE_TIMEOUT).is_ok()
                });
                if !dropped {
                    workers.clear();
                }
            }
        }
    }
    s.seconds = started.elapsed().as_secs_f64();
    Ok(s)
}

/// Appends records to `out`, each synced to disk before the next run.
pub(crate) fn appender(
    out: &Path,
) -> Result<impl FnMut(&Record) -> Result<(), MeasureError>, MeasureError> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .map_err(|source| MeasureError::Io {
            op: "open",
            path: out.to_path_buf(),
            source,
        })?;
    let out = out.to_path_buf();
    Ok(move |r: &Record| -> Result<(), MeasureError> {
        let line = serde_json::to_string(r).map_err(MeasureError::Json)?;
        writeln!(file, "{line}")
            .and_then(|()| file.sync_data())
            .map_err(|source| MeasureError::Io {
                op: "write",
                path: out.clone(),
                source,
            })
    })
}

/// What the worker says of itself (`{"op": "info"}`).
pub(crate) fn info(w: &mut Worker) -> Result<BTreeMap<String, String>, MeasureError> {
    w.send(&json!({"op": "info"}))?;
    Ok(w.reply(INFO_TIMEOUT)?
        .into_iter()
        .filter(|(k, _)| k != "ok")
        .map(|(k, v)| {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            (k, v)
        })
        .collect())
}

pub(crate) fn header(
    plan: &Plan,
    monitor: &dyn Monitor,
    worker: BTreeMap<String, String>,
) -> Header {
    Header {
        version: FORMAT_VERSION,
        mmk_version: env!("CARGO_PKG_VERSION").to_owned(),
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        plan: plan.file.clone(),
        gpu: monitor.gpu(),
        mps_pipe_directory: std::env::var("CUDA_MPS_PIPE_DIRECTORY").ok(),
        worker,
    }
}

pub(crate) fn measure_run(
    plan: &Plan,
    g: &Group,
    run: &[(String, u32)],
    refs: &[JobRef],
    workers: &mut [Worker],
    monitor: &dyn Monitor,
) -> Result<Run, MeasureError> {
    // Build and warm every job first; then all measure over the same window.
    for (w, (name, batch)) in workers.iter_mut().zip(run) {
        w.send(&json!({"op": "prepare", "workload": name, "batch": batch}))?;
    }
    let mut prepared = Vec::new();
    for (w, r) in workers.iter_mut().zip(refs) {
        let m = w
            .reply(PREPARE_TIMEOUT)
            .map_err(|e| e.in_job(format!("{}: prepare", r.label())))?;
        let class = class_of(&m).map_err(|e| e.in_job(r.label()))?;
        prepared.push((class, m.get("mem_bytes").and_then(Value::as_u64)));
    }
    let start = monotonic_ns() + plan.settle.as_nanos() as u64;
    let end = start + plan.window.as_nanos() as u64;
    for (w, (name, batch)) in workers.iter_mut().zip(run) {
        w.send(&json!({
            "op": "measure", "workload": name, "batch": batch,
            "start": start as f64 / 1e9, "end": end as f64 / 1e9,
        }))?;
    }
    let gpm = monitor.window(start, end);
    let mut jobs = Vec::new();
    for ((w, r), (class, mem)) in workers.iter_mut().zip(refs).zip(prepared) {
        let m = w
            .reply(MEASURE_GRACE)
            .map_err(|e| e.in_job(format!("{}: measure", r.label())))?;
        let mut j = job_result(r.clone(), class, &m).map_err(|e| e.in_job(r.label()))?;
        j.mem_bytes = mem;
        j.process_mem_bytes = monitor.process_memory(w.child.id());
        jobs.push(j);
    }
    let (gpm, gpm_error) = match gpm {
        Ok(g) => (Some(g), None),
        Err(e) => (None, Some(e.to_string())),
    };
    Ok(Run {
        mode: g.mode,
        window_s: plan.window.as_secs_f64(),
        jobs,
        gpm,
        gpm_error,
    })
}

pub(crate) fn progress(r: &Run, label: &str) -> String {
    let speeds = r
        .jobs
        .iter()
        .map(|j| format!("{:.2} ms/it ({} it)", j.mean_s * 1e3, j.iters))
        .collect::<Vec<_>>()
        .join(", ");
    let gpm = match (&r.gpm, &r.gpm_error) {
        (Some(g), _) => format!(
            "  sm {:.0} %  dram {:.0} %",
            g.sm_util_pct.unwrap_or(f64::NAN),
            g.dram_bw_util_pct.unwrap_or(f64::NAN)
        ),
        (None, Some(e)) => format!("  (no GPM metrics: {e})"),
        (None, None) => String::new(),
    };
    format!("{label}: {speeds}{gpm}")
}

/// What a measurement file already holds: its runs, and the jobs with kernels and deep
/// records.
#[derive(Debug, Default)]
pub(crate) struct Done {
    pub(crate) runs: HashSet<(Mode, Vec<JobRef>)>,
    pub(crate) kernels: HashSet<JobRef>,
    pub(crate) deep: HashSet<JobRef>,
}

pub(crate) fn done_runs(path: &Path) -> Result<Done, MeasureError> {
    let text = mmk_cli::input::read_capped_text(path, mmk_cli::input::MAX_DATA_BYTES).map_err(
        |source| MeasureError::Input {
            path: path.to_path_buf(),
            source,
        },
    )?;
    let recs = measured::parse(&text).map_err(|source| MeasureError::Records {
        path: path.to_path_buf(),
        source,
    })?;
    let mut done = Done::default();
    for r in recs {
        match r {
            Record::Run(run) => {
                done.runs.insert(run.key());
            }
            Record::Kernels(k) => {
                done.kernels.insert(k.job);
            }
            Record::Deep(d) => {
                done.deep.insert(d.job);
            }
            Record::Header(_) | Record::Failed(_) => {}
        }
    }
    Ok(done)
}

/// Why measurement files did not become a dataset.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: mmk_cli::input::InputError,
    },
    #[error("{path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: measured::MeasuredError,
    },
    #[error("the measurements")]
    Rows(#[source] measured::MeasuredError),
    #[error("no run gave a row ({skipped} skipped; the first: {first})")]
    NoRows { skipped: usize, first: String },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Converts measurement files into the predictor's CSV; returns the rows written and the
/// runs that gave none.
pub fn convert(inputs: &[PathBuf], out: &Path) -> Result<(usize, Vec<String>), ConvertError> {
    let mut recs = Vec::new();
    for p in inputs {
        let text = mmk_cli::input::read_capped_text(p.as_ref(), mmk_cli::input::MAX_DATA_BYTES)
            .map_err(|source| ConvertError::Read {
                path: p.clone(),
                source,
            })?;
        recs.extend(
            measured::parse(&text).map_err(|source| ConvertError::Parse {
                path: p.clone(),
                source,
            })?,
        );
    }
    let c = measured::to_dataset(&recs).map_err(ConvertError::Rows)?;
    if c.dataset.rows.is_empty() {
        return Err(ConvertError::NoRows {
            skipped: c.skipped.len(),
            first: c.skipped.first().cloned().unwrap_or_default(),
        });
    }
    let tmp = out.with_extension("csv.tmp");
    std::fs::write(&tmp, c.dataset.to_csv())
        .and_then(|()| std::fs::rename(&tmp, out))
        .map_err(|source| ConvertError::Write {
            path: out.to_owned(),
            source,
        })?;
    Ok((c.dataset.rows.len(), c.skipped))
}
