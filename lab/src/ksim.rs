//! `mmk-lab ksim`: replay recorded kernel traces of several jobs on a simulated GPU under
//! each kernel policy (crate `mmk-kernel-sched`, module `sim`; docs/kernel-sched.md).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use mmk_kernel_sched::profile::Profile;
use mmk_kernel_sched::sim::{self, JobResult, SimConfig, SimJob};
use mmk_kernel_sched::{Class, PolicyKind, PolicyParams, trace};
use serde::Serialize;

use mmk_cli::{Failure, Format};

#[derive(Debug, Args)]
pub struct KsimArgs {
    /// A record-mode trace (MMK_KSCHED_RECORD) of an online job run alone (repeatable).
    #[arg(long, value_name = "TRACE", required = true)]
    pub online: Vec<PathBuf>,
    /// A record-mode trace of an offline job run alone (repeatable).
    #[arg(long, value_name = "TRACE")]
    pub offline: Vec<PathBuf>,
    /// Mean time between an online job's requests (Poisson arrivals).
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// MPS thread percentage of the online jobs.
    #[arg(long, default_value_t = 100)]
    pub online_share: u32,
    /// MPS thread percentage of the offline jobs.
    #[arg(long, default_value_t = 100)]
    pub offline_share: u32,
    /// SMs of the partition.
    #[arg(long, default_value_t = 132)]
    pub sms: u32,
    /// Simulated time per run.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Anti-starvation base and DUR_THRESHOLD [default: 2.5 % of the first online job's
    /// request latency].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub base: Option<Duration>,
    /// `mmk`: while the online job is present, at most this many offline kernels in flight
    /// (0: no cap; docs/kernel-sched.md).
    #[arg(long, default_value_t = 0)]
    pub offline_depth: u32,
    /// Each offline job is held at most PCT % of its time, as mmkd's
    /// `--kernel-hold-budget` (100: no budget).
    #[arg(long, value_name = "PCT", default_value_t = mmk_kernel_sched::DEFAULT_HOLD_BUDGET_PCT,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub hold_budget: u32,
    /// How late the gate sees a completion.
    #[arg(long, default_value = "20us", value_parser = humantime::parse_duration)]
    pub detect: Duration,
    /// Policies to compare, comma-separated.
    #[arg(
        long,
        default_value = "passthrough,mmk,orion,fikit",
        value_delimiter = ','
    )]
    pub policies: Vec<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Serialize)]
struct Row {
    policy: String,
    /// Per online job: mean, p50 and p99 latency (ms) and their ratio to the job alone.
    online: Vec<OnlineRow>,
    /// Per offline job: iterations a second, relative to alone and to `passthrough`.
    offline: Vec<OfflineRow>,
    /// Sum of normalized throughputs (online: alone mean latency / mean latency; offline:
    /// throughput / throughput alone).
    stp: f64,
}

#[derive(Debug, Serialize)]
struct OnlineRow {
    job: String,
    requests: u64,
    mean_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// What `mmk-lab simulate --kernel-sched FILE` takes.
    mean_vs_alone: f64,
    p50_vs_alone: f64,
    p99_vs_alone: f64,
}

#[derive(Debug, Serialize)]
struct OfflineRow {
    job: String,
    per_second: f64,
    vs_alone: f64,
    vs_passthrough: Option<f64>,
    held: u64,
    forced: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    sms: u32,
    simulated_s: f64,
    base_us: f64,
    /// `--offline-depth` (0: no cap).
    offline_depth: u32,
    /// `--hold-budget` (100: none).
    hold_budget_pct: u32,
    detect_us: f64,
    interval_ms: f64,
    alone: Vec<AloneRow>,
    policies: Vec<Row>,
}

#[derive(Debug, Serialize)]
struct AloneRow {
    job: String,
    class: &'static str,
    requests_in_trace: usize,
    kernels_in_trace: usize,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    per_second: f64,
}

/// A job from its trace, and its profile's DUR_THRESHOLD.
fn load(
    path: &PathBuf,
    class: Class,
    share: u32,
    interval: Duration,
) -> Result<(SimJob, Option<u64>), Failure> {
    let bad = |e: &dyn std::fmt::Display| Failure::usage(format!("{}: {e}", path.display()));
    let text = mmk_cli::input::read_capped_text(path.as_ref(), mmk_cli::input::MAX_DATA_BYTES)
        .map_err(|e| bad(&e))?;
    let records = trace::parse(&text).map_err(|e| bad(&e))?;
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("job")
        .to_owned();
    let profile = Profile::from_trace(&name, class, &records).map_err(|e| bad(&e))?;
    let job = SimJob::with_profile(
        &name,
        class,
        &records,
        &profile,
        f64::from(share) / 100.0,
        u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
    );
    Ok((job, profile.dur_threshold_ns()))
}

fn ms(ns: Option<u64>) -> Option<f64> {
    ns.map(|n| n as f64 / 1e6)
}

/// The policies to replay, once the flags `run` needs are checked.
fn checked_policies(args: &KsimArgs) -> Result<Vec<PolicyKind>, Failure> {
    for (flag, share) in [
        ("--online-share", args.online_share),
        ("--offline-share", args.offline_share),
    ] {
        if !(1..=100).contains(&share) {
            return Err(Failure::usage(format!("{flag}: {share} is not in 1..=100")));
        }
    }
    if args.sms == 0 {
        return Err(Failure::usage("--sms: must be at least 1"));
    }
    if args.interval.is_zero() {
        return Err(Failure::usage("--interval: must be above zero"));
    }
    args.policies
        .iter()
        .map(|p| {
            p.parse()
                .map_err(|e| Failure::usage(format!("--policies: {e}")))
        })
        .collect::<Result<_, _>>()
}

pub fn run(fmt: Format, args: KsimArgs) -> Result<(), Failure> {
    let policies = checked_policies(&args)?;
    let mut jobs = Vec::new();
    let mut dur_threshold = None;
    for (i, p) in args.online.iter().enumerate() {
        let (job, dur) = load(p, Class::Online, args.online_share, args.interval)?;
        if i == 0 {
            dur_threshold = dur;
        }
        jobs.push(job);
    }
    for p in &args.offline {
        jobs.push(load(p, Class::Offline, args.offline_share, args.interval)?.0);
    }
    let base = args
        .base
        .unwrap_or_else(|| dur_threshold.map_or(Duration::from_micros(250), Duration::from_nanos));
    let params = PolicyParams {
        offline_depth: args.offline_depth,
        ..PolicyParams::new(base, args.sms)
    };
    let config = SimConfig {
        duration: args.duration,
        detect: args.detect,
        seed: args.seed,
        hold_budget_pct: args.hold_budget,
        ..SimConfig::new(args.sms)
    };
    let alone: Vec<JobResult> = jobs
        .iter()
        .map(|j| {
            sim::run(
                &config,
                std::slice::from_ref(j),
                PolicyKind::Passthrough.build(&params),
            )
            .remove(0)
        })
        .collect();
    let runs: Vec<(PolicyKind, Vec<JobResult>)> = policies
        .iter()
        .map(|&k| {
            eprintln!("mmk-lab ksim: {k} ...");
            (k, sim::run(&config, &jobs, k.build(&params)))
        })
        .collect();
    let passthrough = runs
        .iter()
        .find(|(k, _)| *k == PolicyKind::Passthrough)
        .map(|(_, r)| r.clone());
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => a / b,
        _ => f64::NAN,
    };
    let rows = runs
        .iter()
        .map(|(kind, results)| {
            let mut stp = 0.0;
            let mut online = Vec::new();
            let mut offline = Vec::new();
            for (i, r) in results.iter().enumerate() {
                let a = &alone[i];
                match r.class {
                    Class::Online => {
                        let (mean, mean_alone) = (r.mean_latency_ns(), a.mean_latency_ns());
                        if let (Some(m), Some(ma)) = (mean, mean_alone) {
                            stp += ma / m;
                        }
                        online.push(OnlineRow {
                            job: r.name.clone(),
                            requests: r.requests,
                            mean_ms: mean.map_or(f64::NAN, |m| m / 1e6),
                            mean_vs_alone: ratio(mean, mean_alone),
                            p50_ms: ms(r.latency_percentile(50.0)).unwrap_or(f64::NAN),
                            p99_ms: ms(r.latency_percentile(99.0)).unwrap_or(f64::NAN),
                            p50_vs_alone: ratio(
                                ms(r.latency_percentile(50.0)),
                                ms(a.latency_percentile(50.0)),
                            ),
                            p99_vs_alone: ratio(
                                ms(r.latency_percentile(99.0)),
                                ms(a.latency_percentile(99.0)),
                            ),
                        });
                    }
                    Class::Offline => {
                        let vs_alone = r.per_second / a.per_second.max(f64::MIN_POSITIVE);
                        stp += vs_alone;
                        offline.push(OfflineRow {
                            job: r.name.clone(),
                            per_second: r.per_second,
                            vs_alone,
                            // none when passthrough ran no iteration
                            vs_passthrough: passthrough
                                .as_ref()
                                .filter(|p| p[i].per_second > 0.0)
                                .map(|p| r.per_second / p[i].per_second),
                            held: r.held,
                            forced: r.forced,
                        });
                    }
                }
            }
            Row {
                policy: kind.to_string(),
                online,
                offline,
                stp,
            }
        })
        .collect();
    let report = Report {
        sms: args.sms,
        simulated_s: args.duration.as_secs_f64(),
        base_us: base.as_secs_f64() * 1e6,
        offline_depth: args.offline_depth,
        hold_budget_pct: args.hold_budget,
        detect_us: args.detect.as_secs_f64() * 1e6,
        interval_ms: args.interval.as_secs_f64() * 1e3,
        alone: jobs
            .iter()
            .zip(&alone)
            .map(|(j, a)| AloneRow {
                job: j.name.clone(),
                class: j.class.as_str(),
                requests_in_trace: j.requests.len(),
                kernels_in_trace: j.requests.iter().map(Vec::len).sum(),
                p50_ms: ms(a.latency_percentile(50.0)),
                p99_ms: ms(a.latency_percentile(99.0)),
                per_second: a.per_second,
            })
            .collect(),
        policies: rows,
    };
    print(fmt, &report);
    Ok(())
}

fn print(fmt: Format, r: &Report) {
    let mut o = std::io::stdout().lock();
    if fmt == Format::Json {
        let _ = writeln!(o, "{}", serde_json::to_string_pretty(r).unwrap_or_default());
        return;
    }
    let _ = writeln!(
        o,
        "simulated {:.0} s on {} SMs; base/DUR_THRESHOLD {:.0} us; offline depth cap {}; hold budget {}; completions seen {:.0} us late; online requests every {:.1} ms",
        r.simulated_s,
        r.sms,
        r.base_us,
        if r.offline_depth == 0 {
            "none".to_owned()
        } else {
            r.offline_depth.to_string()
        },
        if r.hold_budget_pct >= 100 {
            "none".to_owned()
        } else {
            format!("{} %", r.hold_budget_pct)
        },
        r.detect_us,
        r.interval_ms
    );
    for a in &r.alone {
        let _ = writeln!(
            o,
            "alone: {} ({}): {} requests of {} kernels in the trace; p50 {} ms, p99 {} ms, {:.1}/s",
            a.job,
            a.class,
            a.requests_in_trace,
            a.kernels_in_trace,
            a.p50_ms.map_or("-".into(), |v| format!("{v:.2}")),
            a.p99_ms.map_or("-".into(), |v| format!("{v:.2}")),
            a.per_second
        );
    }
    let _ = writeln!(
        o,
        "{:<12} {:<16} {:>8} {:>8} {:>10} {:>9} {:>9} {:>10} {:>10} {:>6}",
        "policy",
        "job",
        "p50_ms",
        "p99_ms",
        "mean/alone",
        "p50/alone",
        "p99/alone",
        "off/alone",
        "off/mps",
        "STP"
    );
    for row in &r.policies {
        for on in &row.online {
            let _ = writeln!(
                o,
                "{:<12} {:<16} {:>8.2} {:>8.2} {:>10.2} {:>9.2} {:>9.2} {:>10} {:>10} {:>6.2}",
                row.policy,
                on.job,
                on.p50_ms,
                on.p99_ms,
                on.mean_vs_alone,
                on.p50_vs_alone,
                on.p99_vs_alone,
                "",
                "",
                row.stp
            );
        }
        for off in &row.offline {
            let _ = writeln!(
                o,
                "{:<12} {:<16} {:>8} {:>8} {:>10} {:>9} {:>9} {:>10.2} {:>10} {:>6.2}",
                row.policy,
                off.job,
                "",
                "",
                "",
                "",
                "",
                off.vs_alone,
                off.vs_passthrough.map_or("-".into(), |v| format!("{v:.2}")),
                row.stp
            );
        }
    }
}
