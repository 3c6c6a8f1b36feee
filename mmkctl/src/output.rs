//! What mmkctl prints: tables for people, JSON for scripts.
//!
//! The JSON shapes are a documented contract (docs/mmkctl.md): fields are only added,
//! never renamed or removed, within `mmk.v1`.

use std::time::{Duration, UNIX_EPOCH};

use mmk_core::units::format_mib;
use mmk_proto::v1;
use mmk_proto::{Timestamp, class_from_proto, state_from_proto};
use serde::Serialize;

use crate::cli::Format;
use crate::picture;
mod node;
pub use node::*;

#[derive(Debug, Serialize)]
pub struct JobOut {
    pub id: u64,
    pub name: String,
    pub class: String,
    pub state: String,
    pub reason: String,
    pub gpu_memory_mib: u64,
    pub priority: i32,
    /// The job has its partition to itself.
    pub exclusive: bool,
    /// What its learned profile is kept under, when the spec names it.
    pub profile_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo_ms: Option<u64>,
    /// The objective as a slowdown against running alone, in percent (300: 3x).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo_slowdown_pct: Option<u32>,
    /// A running online job: how mmkd keeps its objective (docs/slo.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo_status: Option<SloOut>,
    pub task: TaskOut,
    pub submitted_at: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub assignment: Option<AssignmentOut>,
    pub exit_code: Option<i32>,
    pub restarts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_dir: Option<String>,
    /// Who submitted the job (and whom a command job runs as), when known.
    pub owner_uid: Option<u32>,
    pub owner_gid: Option<u32>,
    /// Who cancelled the job or released its allocation, when someone did.
    pub ended_by_uid: Option<u32>,
    /// What the planner assumes of the job: `learned (...)`, `named WORKLOAD`, `prior` or
    /// `exclusive`.
    pub planner_profile: String,
    /// True for another user's job: only its id, name, class, memory, state, times,
    /// partition and owner are shown.
    pub redacted: bool,
    /// A running command job's CPU time and memory, as its cgroup counts them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
}

/// What mmkd's SLO control sees of a running online job, and what it chose.
#[derive(Debug, Serialize)]
pub struct SloOut {
    pub objective: String,
    pub target_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub alone_p99_ms: Option<f64>,
    pub samples: u64,
    pub isolation: String,
    pub why: String,
}

#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum TaskOut {
    Command {
        args: Vec<String>,
        workdir: String,
        /// The workload the planner assumes the process resembles; null when none.
        profile: Option<String>,
    },
    Workload {
        name: String,
        batch_size: Option<u32>,
        duration_ms: Option<u64>,
    },
    /// An attached allocation: its caller runs the process.
    Attached {
        profile: Option<String>,
        pid: Option<u32>,
        lease_ms: Option<u64>,
    },
    Unknown,
}

#[derive(Debug, Serialize)]
pub struct AssignmentOut {
    pub gpu: u32,
    pub gpu_uuid: String,
    pub instance_id: u32,
    pub device_uuid: String,
    pub profile: String,
    pub start_slice: u32,
    pub mps_share: u32,
}

pub fn state_name(s: i32) -> String {
    state_from_proto(s).map_or_else(|| format!("UNKNOWN({s})"), |s| s.as_str().to_owned())
}

pub fn class_name(c: i32) -> String {
    class_from_proto(c).map_or_else(|| format!("unknown({c})"), |c| c.as_str().to_owned())
}

pub(crate) fn time(ts: Option<&Timestamp>) -> Option<String> {
    let ts = ts?;
    // RFC 3339 has four-digit years: beyond 9999-12-31 show nothing rather than fail.
    let secs = u64::try_from(ts.seconds)
        .ok()
        .filter(|s| *s <= 253_402_300_799)?;
    let t = UNIX_EPOCH + Duration::from_secs(secs);
    Some(humantime::format_rfc3339_seconds(t).to_string())
}

pub fn job_out(j: &v1::Job) -> JobOut {
    let spec = j.spec.clone().unwrap_or_default();
    JobOut {
        id: j.id,
        name: spec.name,
        class: class_name(spec.class),
        state: state_name(j.state),
        reason: j.reason.clone(),
        gpu_memory_mib: spec.gpu_memory_mib,
        priority: spec.priority,
        exclusive: spec.exclusive,
        profile_key: (!spec.profile_key.is_empty()).then(|| spec.profile_key.clone()),
        slo_ms: (spec.slo_ms != 0).then_some(spec.slo_ms),
        slo_slowdown_pct: (spec.slo_slowdown_pct != 0).then_some(spec.slo_slowdown_pct),
        slo_status: j.slo.as_ref().map(|s| SloOut {
            objective: s.objective.clone(),
            target_ms: s.target_ms,
            p99_ms: s.p99_ms,
            alone_p99_ms: s.alone_p99_ms,
            samples: s.samples,
            isolation: s.isolation.clone(),
            why: s.why.clone(),
        }),
        task: match spec.task {
            Some(v1::job_spec::Task::Command(c)) => TaskOut::Command {
                args: c.args,
                workdir: c.workdir,
                profile: (!c.profile.is_empty()).then_some(c.profile),
            },
            Some(v1::job_spec::Task::Workload(w)) => TaskOut::Workload {
                name: w.name,
                batch_size: (w.batch_size != 0).then_some(w.batch_size),
                duration_ms: (w.duration_ms != 0).then_some(w.duration_ms),
            },
            Some(v1::job_spec::Task::Attached(a)) => TaskOut::Attached {
                profile: (!a.profile.is_empty()).then_some(a.profile),
                pid: (a.pid != 0).then_some(a.pid),
                lease_ms: (a.lease_ms != 0).then_some(a.lease_ms),
            },
            None => TaskOut::Unknown,
        },
        submitted_at: time(j.submitted_at.as_ref()),
        started_at: time(j.started_at.as_ref()),
        finished_at: time(j.finished_at.as_ref()),
        assignment: j.assignment.as_ref().map(|a| AssignmentOut {
            gpu: a.gpu_index,
            gpu_uuid: a.gpu_uuid.clone(),
            instance_id: a.instance_id,
            device_uuid: a.device_uuid.clone(),
            profile: a.profile.clone(),
            start_slice: a.start_slice,
            mps_share: a.mps_share,
        }),
        exit_code: j.exit_code,
        restarts: j.restarts,
        log_dir: (!j.log_dir.is_empty()).then(|| j.log_dir.clone()),
        owner_uid: j.owner_uid,
        owner_gid: j.owner_gid,
        ended_by_uid: j.ended_by_uid,
        planner_profile: j.planner_profile.clone(),
        redacted: j.redacted,
        cpu_seconds: j.cpu_seconds,
        memory_bytes: j.memory_bytes,
        memory_peak_bytes: j.memory_peak_bytes,
    }
}

pub(crate) fn print_json<T: Serialize>(v: &T) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => outln!("{s}"),
        Err(e) => eprintln!("mmkctl: cannot encode JSON: {e}"),
    }
}

/// `0:3g.40gb@4` (GPU 0, a 3g.40gb at slice 4), or `-` when the job has no partition.
fn partition_label(j: &v1::Job) -> String {
    j.assignment.as_ref().map_or_else(
        || "-".into(),
        |a| format!("{}:{}@{}", a.gpu_index, a.profile, a.start_slice),
    )
}

/// `s` on one line (see [`mmk_cli::stdout::one_line`]), cut to `width` characters.
fn clip(s: &str, width: usize) -> String {
    let s = mmk_cli::stdout::one_line(s);
    if s.chars().count() <= width {
        s.into_owned()
    } else {
        let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
        out.push('~');
        out
    }
}

/// The one line after `submit` and `cancel`.
pub fn job_line(fmt: Format, verb: &str, j: &v1::Job) {
    match fmt {
        Format::Json => print_json(&job_out(j)),
        Format::Table => {
            let name = j.spec.as_ref().map_or("", |s| s.name.as_str());
            outln!(
                "{verb} job {} ({name}): {} {}",
                j.id,
                state_name(j.state),
                j.reason
            );
        }
    }
}

pub fn job_table(fmt: Format, jobs: &[v1::Job]) {
    if fmt == Format::Json {
        print_json(&jobs.iter().map(job_out).collect::<Vec<_>>());
        return;
    }
    // 80 columns: 4+16+7+9+6+15 and six spaces leave 17 for the reason; `jobs get` shows
    // all of it.
    outln!(
        "{:<4} {:<16} {:<7} {:<9} {:>6} {:<15} REASON",
        "ID",
        "NAME",
        "CLASS",
        "STATE",
        "MEMORY",
        "PARTITION"
    );
    for j in jobs {
        let o = job_out(j);
        outln!(
            "{:<4} {:<16} {:<7} {:<9} {:>6} {:<15} {}",
            o.id,
            clip(&o.name, 16),
            o.class,
            o.state,
            format_mib(o.gpu_memory_mib),
            clip(&partition_label(j), 15),
            clip(&o.reason, 17)
        );
    }
}

fn format_ms(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

pub fn job_detail(fmt: Format, j: &v1::Job) {
    let o = job_out(j);
    if fmt == Format::Json {
        print_json(&o);
        return;
    }
    // A value stays on its row: a newline a user put in an argument cannot fake a line.
    let row = |k: &str, v: &str| outln!("{k:<13} {}", mmk_cli::stdout::one_line(v));
    row("id:", &o.id.to_string());
    row("name:", &o.name);
    row("class:", &o.class);
    row("state:", &o.state);
    row("reason:", &o.reason);
    row("gpu memory:", &format_mib(o.gpu_memory_mib));
    row("priority:", &o.priority.to_string());
    if let Some(slo) = o.slo_ms {
        row("slo:", &format!("{slo}ms"));
    }
    if let Some(pct) = o.slo_slowdown_pct {
        row("slo:", &format!("{}x alone", f64::from(pct) / 100.0));
    }
    if let Some(s) = &o.slo_status {
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}ms"));
        row(
            "latency:",
            &format!(
                "{}: p99 {} over {} requests (allowed {}, alone {})",
                s.objective,
                ms(s.p99_ms),
                s.samples,
                ms(s.target_ms),
                ms(s.alone_p99_ms)
            ),
        );
        row("isolation:", &format!("{} ({})", s.isolation, s.why));
    }
    if !o.planner_profile.is_empty() {
        row("planned as:", &o.planner_profile);
    }
    match &o.task {
        TaskOut::Command {
            args,
            workdir,
            profile,
        } => {
            row("command:", &args.join(" "));
            row("workdir:", workdir);
            if let Some(p) = profile {
                row("profile:", p);
            }
        }
        TaskOut::Workload {
            name, batch_size, ..
        } => {
            let batch = batch_size.map_or_else(String::new, |b| format!(" (batch {b})"));
            row("workload:", &format!("{name}{batch}"));
        }
        TaskOut::Attached {
            profile,
            pid,
            lease_ms,
        } => {
            let mut watch = Vec::new();
            if let Some(p) = pid {
                watch.push(format!("process {p}"));
            }
            if let Some(ms) = lease_ms {
                watch.push(format!("a lease of {}", format_ms(*ms)));
            }
            row("attached:", &format!("ends with {}", watch.join(" or ")));
            if let Some(p) = profile {
                row("profile:", p);
            }
        }
        TaskOut::Unknown => {}
    }
    if let Some(a) = &o.assignment {
        row(
            "partition:",
            &format!(
                "gpu {} {} at slice {} (instance {})",
                a.gpu, a.profile, a.start_slice, a.instance_id
            ),
        );
        row("device:", &a.device_uuid);
        row("mps share:", &format!("{}%", a.mps_share));
    }
    for (k, v) in [
        ("submitted:", &o.submitted_at),
        ("started:", &o.started_at),
        ("finished:", &o.finished_at),
    ] {
        if let Some(v) = v {
            row(k, v);
        }
    }
    if let Some(code) = o.exit_code {
        row("exit code:", &code.to_string());
    }
    if o.restarts > 0 {
        row("restarts:", &o.restarts.to_string());
    }
    if let Some(d) = &o.log_dir {
        row("logs:", d);
    }
    if let (Some(uid), Some(gid)) = (o.owner_uid, o.owner_gid) {
        row("owner:", &format!("uid {uid}, gid {gid}"));
    }
    if let Some(cpu) = o.cpu_seconds {
        let memory = match (o.memory_bytes, o.memory_peak_bytes) {
            (Some(now), Some(peak)) => format!(
                ", memory {} (at most {})",
                format_mib(now >> 20),
                format_mib(peak >> 20)
            ),
            (Some(now), None) => format!(", memory {}", format_mib(now >> 20)),
            _ => String::new(),
        };
        row("processes:", &format!("CPU {cpu:.1} s{memory}"));
    }
}

#[derive(Debug, Serialize)]
struct EventOut {
    seq: u64,
    at: Option<String>,
    job: JobOut,
}

pub fn event(fmt: Format, ev: &v1::JobEvent) {
    let Some(j) = &ev.job else {
        return;
    };
    let o = job_out(j);
    match fmt {
        Format::Json => {
            // One object per line, so that scripts can read the stream as it comes.
            let e = EventOut {
                seq: ev.seq,
                at: time(ev.at.as_ref()),
                job: o,
            };
            if let Ok(s) = serde_json::to_string(&e) {
                outln!("{s}");
            }
        }
        Format::Table => outln!(
            "{}  job {} {:<18} {:<9} {}",
            time(ev.at.as_ref()).unwrap_or_default(),
            o.id,
            clip(&o.name, 18),
            o.state,
            o.reason
        ),
    }
}
