//! `mmk-lab profile`: run a command job alone under the interposer in record mode and turn
//! its kernel trace into a kernel profile (docs/kernel-sched.md), which the `orion` and
//! `fikit` policies load through the job spec's `command.kernel_profile`.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use mmk_core::JobClass;
use mmk_core::spec::Task;
use mmk_kernel_sched::profile::{Intensity, Profile, parse_ncu_csv};
use mmk_kernel_sched::{Class, artifacts, env, trace};
use serde::Serialize;

use mmk_cli::{Failure, Format};

#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// The job file (a command job, docs/job-spec.md).
    pub file: PathBuf,
    /// Run the job this many times, one after another; the profile covers all runs.
    #[arg(long, default_value_t = 1)]
    pub runs: u32,
    /// Stop each run after this long (SIGINT, then SIGKILL 10 s later), for jobs that do
    /// not end on their own.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Where to write the profile [default: NAME.kprofile.json next to the job file].
    #[arg(long, short = 'o', value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Also classify kernels as compute- or memory-bound with one more run under `ncu`.
    #[arg(long)]
    pub deep: bool,
    /// The ncu program for --deep.
    #[arg(long, default_value = "ncu", value_name = "PATH")]
    pub ncu: PathBuf,
    /// --deep: how many launches ncu measures.
    #[arg(long, default_value_t = 2000)]
    pub ncu_launches: u32,
    /// Classify kernels from this ncu CSV (`ncu --csv --page raw`) instead of running ncu.
    #[arg(long, value_name = "FILE", conflicts_with = "deep")]
    pub ncu_csv: Option<PathBuf>,
    /// The interposer [default: libmmk_interposer.so next to this program].
    #[arg(long, value_name = "PATH")]
    pub interposer: Option<PathBuf>,
    /// Build the profile from record-mode traces already written (MMK_KSCHED_RECORD)
    /// instead of running the job; the job file still names the job and its class.
    #[arg(long, value_name = "TRACE")]
    pub from_trace: Vec<PathBuf>,
    /// Also write every launch recorded, as one trace (for `mmk-lab ksim`).
    #[arg(long, value_name = "FILE")]
    pub save_trace: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Summary<'a> {
    file: String,
    job: &'a str,
    class: &'a str,
    runs: u32,
    launches: u64,
    kernels: usize,
    requests: u64,
    request_us: f64,
    dur_threshold_us: Option<f64>,
    compute_kernels: usize,
    memory_kernels: usize,
    top: Vec<Top<'a>>,
}

#[derive(Debug, Serialize)]
struct Top<'a> {
    name: &'a str,
    launches: u64,
    mean_us: f64,
    p95_us: f64,
    gap_after_us: f64,
    sm_demand: u32,
    intensity: &'a str,
}

pub fn run(fmt: Format, args: ProfileArgs) -> Result<(), Failure> {
    let spec = mmk_cli::read_spec(&args.file, None)?;
    let Task::Command(command) = &spec.task else {
        return Err(Failure::usage(format!(
            "{}: only command jobs can be profiled (this one runs workload {:?} on the simulated node)",
            args.file.display(),
            match &spec.task {
                Task::Workload(w) => w.name.as_str(),
                Task::Command(_) | Task::Attached(_) => "",
            }
        )));
    };
    if args.runs == 0 {
        return Err(Failure::usage("--runs: must be at least 1"));
    }
    let class = match spec.class {
        JobClass::Online => Class::Online,
        JobClass::Offline => Class::Offline,
    };
    let work = tempfile::tempdir()
        .map_err(|e| Failure::usage(format!("cannot make a scratch directory: {e}")))?;
    let traces = if args.from_trace.is_empty() {
        let interposer =
            interposer(args.interposer.as_deref()).map_err(|e| Failure::usage(e.to_string()))?;
        let mut traces = Vec::new();
        for run in 1..=args.runs {
            eprintln!(
                "mmk-lab profile: run {run}/{} of {} ...",
                args.runs, spec.name
            );
            let pattern = work.path().join(format!("run{run}-%p.csv"));
            let mut cmd = job_command(command, class);
            cmd.envs(record_env(
                &interposer,
                command.env.get("LD_PRELOAD").map(String::as_str),
                &pattern,
            ))
            .env_remove(env::GATE);
            let started = Instant::now();
            let status = run_child(cmd, args.duration)?;
            eprintln!(
                "mmk-lab profile: run {run} ended ({status}) after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            traces.extend(
                files_with_prefix(work.path(), &format!("run{run}-")).map_err(Failure::usage)?,
            );
        }
        traces
    } else {
        args.from_trace.clone()
    };
    let mut records = Vec::new();
    for path in &traces {
        let text = mmk_cli::input::read_capped_text(path.as_ref(), mmk_cli::input::MAX_DATA_BYTES)
            .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
        records.extend(
            trace::parse(&text).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?,
        );
    }
    if let Some(path) = &args.save_trace {
        let mut text = String::with_capacity(records.len() * 160 + 256);
        text.push_str(trace::HEADER);
        text.push('\n');
        for r in &records {
            text.push_str(&r.to_line());
            text.push('\n');
        }
        std::fs::write(path, text)
            .map_err(|e| Failure::usage(format!("cannot write {}: {e}", path.display())))?;
    }
    let mut profile = Profile::from_trace(&spec.name, class, &records).map_err(|e| {
        Failure::usage(format!(
            "{}: {e}; did the job launch any kernel?",
            spec.name
        ))
    })?;
    let ncu_text = match (&args.ncu_csv, args.deep) {
        (Some(path), _) => Some(
            mmk_cli::input::read_capped_text(path.as_ref(), mmk_cli::input::MAX_DATA_BYTES)
                .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?,
        ),
        (None, true) => Some(run_ncu(&args, command, class, work.path())?),
        (None, false) => None,
    };
    if let Some(text) = ncu_text {
        let by_name: HashMap<String, Intensity> =
            parse_ncu_csv(&text).map_err(|e| Failure::usage(format!("ncu: {e}")))?;
        profile.apply_intensity(&by_name);
    }
    let out = args.out.clone().unwrap_or_else(|| {
        args.file
            .parent()
            .unwrap_or(Path::new("."))
            .join(format!("{}.kprofile.json", spec.name))
    });
    let out = std::path::absolute(&out).unwrap_or(out);
    let tmp = out.with_extension("json.tmp");
    std::fs::write(&tmp, profile.to_json() + "\n")
        .and_then(|()| std::fs::rename(&tmp, &out))
        .map_err(|e| Failure::usage(format!("cannot write {}: {e}", out.display())))?;
    print_summary(fmt, &out, args.runs, &profile);
    Ok(())
}

fn job_command(c: &mmk_core::spec::CommandSpec, class: Class) -> Command {
    let mut cmd = Command::new(&c.args[0]);
    cmd.args(&c.args[1..])
        .envs(&c.env)
        .env(env::CLASS, class.as_str())
        .stdin(Stdio::null())
        // The job's output goes to stderr, so that --output json stays clean.
        .stdout(std::io::stderr())
        .stderr(std::io::stderr());
    if let Some(dir) = &c.workdir {
        cmd.current_dir(dir);
    }
    cmd
}

fn run_child(mut cmd: Command, limit: Option<Duration>) -> Result<ExitStatus, Failure> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .spawn()
        .map_err(|e| Failure::usage(format!("cannot run {program}: {e}")))?;
    let started = Instant::now();
    let mut interrupted: Option<Instant> = None;
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Failure::usage(format!("waiting for {program}: {e}")))?
        {
            return Ok(status);
        }
        let pid = child.id() as libc::pid_t;
        match (limit, interrupted) {
            (Some(limit), None) if started.elapsed() >= limit => {
                // SIGINT lets the job exit normally, so the interposer writes its trace.
                // SAFETY: signalling our own child.
                unsafe { libc::kill(pid, libc::SIGINT) };
                interrupted = Some(Instant::now());
            }
            (_, Some(at)) if at.elapsed() >= Duration::from_secs(10) => {
                let _ = child.kill();
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// No interposer was given and none was built next to the running program.
#[derive(Debug, thiserror::Error)]
#[error(
    "no {} next to this program: build it (cargo build --workspace) or pass --interposer",
    artifacts::INTERPOSER
)]
pub struct NoInterposer;

/// The interposer: `given`, or the one built next to the running program.
pub(crate) fn interposer(given: Option<&Path>) -> Result<PathBuf, NoInterposer> {
    match given {
        Some(p) => Ok(p.to_path_buf()),
        None => artifacts::find_next_to_exe(artifacts::INTERPOSER).ok_or(NoInterposer),
    }
}

/// Record mode's environment: the interposer preloaded ahead of what the program preloads
/// itself (`own`), and its traces written to `pattern` (`%p` is the pid). The caller also
/// removes the gate variable (`env::GATE`): record mode measures the job alone.
pub(crate) fn record_env(
    interposer: &Path,
    own: Option<&str>,
    pattern: &Path,
) -> [(&'static str, String); 2] {
    [
        (
            "LD_PRELOAD",
            mmk_core::paths::preload_first(&interposer.display().to_string(), own),
        ),
        (env::RECORD, pattern.display().to_string()),
    ]
}

/// The files in `dir` whose names begin with `prefix` (the traces record mode wrote, one
/// per process), sorted.
pub(crate) fn files_with_prefix(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// One more run under ncu, measuring compute and memory throughput per kernel.
fn run_ncu(
    args: &ProfileArgs,
    c: &mmk_core::spec::CommandSpec,
    class: Class,
    work: &Path,
) -> Result<String, Failure> {
    eprintln!(
        "mmk-lab profile: --deep: one run under {} ({} launches) ...",
        args.ncu.display(),
        args.ncu_launches
    );
    let log = work.join("ncu.csv");
    let inner = job_command(c, class);
    let mut cmd = Command::new(&args.ncu);
    // `--clock-control none`: ncu must leave the GPU's clocks as they are.
    cmd.args(["--csv", "--page", "raw", "--print-kernel-base", "mangled"])
        .args(["--clock-control", "none"])
        .args([
            "--metrics",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        ])
        .arg("--launch-count")
        .arg(args.ncu_launches.to_string())
        .arg("--log-file")
        .arg(&log)
        .arg(inner.get_program())
        .args(inner.get_args())
        .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .stderr(std::io::stderr());
    if let Some(dir) = &c.workdir {
        cmd.current_dir(dir);
    }
    let status = run_child(cmd, args.duration)?;
    mmk_cli::input::read_capped_text(log.as_ref(), mmk_cli::input::MAX_DATA_BYTES).map_err(|e| {
        Failure::usage(format!(
            "ncu ({status}) wrote no results to {}: {e}",
            log.display()
        ))
    })
}

fn print_summary(fmt: Format, out: &Path, runs: u32, p: &Profile) {
    let count = |i: Intensity| p.kernels.iter().filter(|k| k.intensity == i).count();
    let summary = Summary {
        file: out.display().to_string(),
        job: &p.job,
        class: &p.class,
        runs,
        launches: p.launches,
        kernels: p.kernels.len(),
        requests: p.requests,
        request_us: p.request_ns as f64 / 1e3,
        dur_threshold_us: p.dur_threshold_ns().map(|n| n as f64 / 1e3),
        compute_kernels: count(Intensity::Compute),
        memory_kernels: count(Intensity::Memory),
        top: p
            .kernels
            .iter()
            .take(10)
            .map(|k| Top {
                name: &k.key.name,
                launches: k.launches,
                mean_us: k.mean_ns as f64 / 1e3,
                p95_us: k.p95_ns as f64 / 1e3,
                gap_after_us: k.gap_after_ns as f64 / 1e3,
                sm_demand: k.sm_demand,
                intensity: k.intensity.as_str(),
            })
            .collect(),
    };
    let mut o = std::io::stdout().lock();
    if fmt == Format::Json {
        let _ = writeln!(
            o,
            "{}",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        );
        return;
    }
    let _ = writeln!(
        o,
        "profile of {} ({}) written to {}",
        p.job, p.class, summary.file
    );
    let _ = writeln!(
        o,
        "{} launches of {} kernels; {} requests, median {:.1} us (DUR_THRESHOLD {}); {} compute-bound, {} memory-bound",
        p.launches,
        summary.kernels,
        p.requests,
        summary.request_us,
        summary
            .dur_threshold_us
            .map_or("-".to_owned(), |d| format!("{d:.1} us")),
        summary.compute_kernels,
        summary.memory_kernels
    );
    let _ = writeln!(
        o,
        "{:>8} {:>10} {:>10} {:>10} {:>5} {:>8}  kernel",
        "launches", "mean_us", "p95_us", "gap_us", "SMs", "kind"
    );
    for t in &summary.top {
        let name: String = t.name.chars().take(60).collect();
        let _ = writeln!(
            o,
            "{:>8} {:>10.1} {:>10.1} {:>10.1} {:>5} {:>8}  {name}",
            t.launches, t.mean_us, t.p95_us, t.gap_after_us, t.sm_demand, t.intensity
        );
    }
}
