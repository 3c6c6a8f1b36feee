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

#[derive(Debug, Serialize)]
pub struct GpuPartitionsOut {
    pub gpu: u32,
    pub uuid: String,
    pub model: String,
    pub mig_enabled: bool,
    pub memory_slices: u32,
    pub partitions: Vec<PartitionOut>,
}

#[derive(Debug, Serialize)]
pub struct PartitionOut {
    pub instance_id: u32,
    pub device_uuid: String,
    pub profile: String,
    pub start_slice: u32,
    pub size_slices: u32,
    pub memory_mib: u64,
    pub used_memory_mib: u64,
    pub sm_count: u32,
    pub jobs: Vec<PartitionJobOut>,
    /// The partition's MPS control daemon; null when none runs.
    pub mps: Option<MpsDaemonOut>,
    /// The partition's kernel-scheduler gate; null when the kernel scheduler is off or no
    /// job has started in the partition yet.
    pub gate: Option<KernelGateOut>,
}

#[derive(Debug, Serialize)]
pub struct KernelGateOut {
    pub path: String,
    /// Why the gate could not be read; the policy is then empty and the counters 0.
    pub error: Option<String>,
    pub policy: String,
    pub device_wait: bool,
    /// Each offline process is held at most this share of its time (%); 100: no budget;
    /// null from an mmkd without a hold budget.
    pub hold_budget_pct: Option<u32>,
    /// Over every process that has used the gate since it was made.
    pub launches: u64,
    pub held: u64,
    pub held_us: u64,
    pub forced: u64,
    /// The processes attached now that still run.
    pub processes: Vec<GateProcessOut>,
}

#[derive(Debug, Serialize)]
pub struct GateProcessOut {
    pub pid: u32,
    /// online or offline; null in the moment a process is still joining the gate.
    pub class: Option<String>,
    pub in_flight: u32,
    pub launches: u64,
    pub held: u64,
    pub held_us: u64,
    pub forced: u64,
    pub max_held_us: u64,
}

fn gate_out(g: &v1::KernelGate) -> KernelGateOut {
    KernelGateOut {
        path: g.path.clone(),
        error: (!g.error.is_empty()).then(|| g.error.clone()),
        policy: g.policy.clone(),
        device_wait: g.device_wait,
        hold_budget_pct: g.hold_budget_pct,
        launches: g.launches,
        held: g.held,
        held_us: g.held_us,
        forced: g.forced,
        processes: g
            .processes
            .iter()
            .map(|p| GateProcessOut {
                pid: p.pid,
                class: class_from_proto(p.class).map(|c| c.as_str().to_owned()),
                in_flight: p.in_flight,
                launches: p.launches,
                held: p.held,
                held_us: p.held_us,
                forced: p.forced,
                max_held_us: p.max_held_us,
            })
            .collect(),
    }
}

#[derive(Debug, Serialize)]
pub struct MpsDaemonOut {
    /// 0 while the daemon is down and waits for a restart.
    pub pid: u32,
    pub pipe_dir: String,
    pub restarts: u32,
    pub servers: Vec<u32>,
}

#[derive(Debug, Serialize)]
pub struct PartitionJobOut {
    pub id: u64,
    pub name: String,
    pub class: String,
    pub state: String,
    pub mps_share: u32,
    pub gpu_memory_mib: u64,
}

pub fn partitions_out(r: &v1::ListPartitionsResponse) -> Vec<GpuPartitionsOut> {
    r.gpus
        .iter()
        .map(|g| GpuPartitionsOut {
            gpu: g.gpu_index,
            uuid: g.gpu_uuid.clone(),
            model: g.model.clone(),
            mig_enabled: g.mig_enabled,
            memory_slices: g.memory_slices,
            partitions: g
                .partitions
                .iter()
                .map(|p| PartitionOut {
                    instance_id: p.instance_id,
                    device_uuid: p.device_uuid.clone(),
                    profile: p.profile.clone(),
                    start_slice: p.start_slice,
                    size_slices: p.size_slices,
                    memory_mib: p.memory_mib,
                    used_memory_mib: p.used_memory_mib,
                    sm_count: p.sm_count,
                    mps: p.mps.as_ref().map(|m| MpsDaemonOut {
                        pid: m.pid,
                        pipe_dir: m.pipe_dir.clone(),
                        restarts: m.restarts,
                        servers: m.servers.clone(),
                    }),
                    gate: p.gate.as_ref().map(gate_out),
                    jobs: p
                        .jobs
                        .iter()
                        .map(|j| PartitionJobOut {
                            id: j.job_id,
                            name: j.name.clone(),
                            class: class_name(j.class),
                            state: state_name(j.state),
                            mps_share: j.mps_share,
                            gpu_memory_mib: j.gpu_memory_mib,
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect()
}

pub fn partitions(fmt: Format, r: &v1::ListPartitionsResponse) {
    let out = partitions_out(r);
    match fmt {
        Format::Json => print_json(&out),
        Format::Table => {
            for (i, g) in out.iter().enumerate() {
                if i > 0 {
                    outln!();
                }
                out!("{}", picture::gpu(g));
            }
        }
    }
}

#[derive(Debug, Serialize)]
struct NodeOut {
    hostname: String,
    backend: String,
    planner: String,
    version: String,
    gpus: Vec<GpuOut>,
}

#[derive(Debug, Serialize)]
struct GpuOut {
    index: u32,
    uuid: String,
    model: String,
    memory_mib: u64,
    sm_count: u32,
    mig_enabled: bool,
    memory_slices: u32,
    free_memory_mib: u64,
    free_memory_slices: u32,
    profiles: Vec<ProfileOut>,
}

#[derive(Debug, Serialize)]
struct ProfileOut {
    id: u32,
    name: String,
    compute_slices: u32,
    memory_slices: u32,
    memory_mib: u64,
    sm_count: u32,
    max_count: u32,
    starts: Vec<u32>,
    free_starts: Vec<u32>,
    media_extensions: bool,
}

pub fn gpus(fmt: Format, n: &v1::Node) {
    let out = NodeOut {
        hostname: n.hostname.clone(),
        backend: n.backend.clone(),
        planner: n.planner.clone(),
        version: n.version.clone(),
        gpus: n
            .gpus
            .iter()
            .map(|g| GpuOut {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                memory_mib: g.memory_mib,
                sm_count: g.sm_count,
                mig_enabled: g.mig_enabled,
                memory_slices: g.memory_slices,
                free_memory_mib: g.free_memory_mib,
                free_memory_slices: g.free_memory_slices,
                profiles: g
                    .profiles
                    .iter()
                    .map(|p| ProfileOut {
                        id: p.id,
                        name: p.name.clone(),
                        compute_slices: p.compute_slices,
                        memory_slices: p.memory_slices,
                        memory_mib: p.memory_mib,
                        sm_count: p.sm_count,
                        max_count: p.max_count,
                        starts: p.starts.clone(),
                        free_starts: p.free_starts.clone(),
                        media_extensions: p.media_extensions,
                    })
                    .collect(),
            })
            .collect(),
    };
    if fmt == Format::Json {
        print_json(&out);
        return;
    }
    outln!(
        "node {} (backend {}, planner {}, mmk {})",
        out.hostname,
        out.backend,
        out.planner,
        out.version
    );
    for g in &out.gpus {
        outln!();
        outln!(
            "GPU {}  {}  {}  {} SMs  {}  MIG {}",
            g.index,
            g.model,
            format_mib(g.memory_mib),
            g.sm_count,
            g.uuid,
            if g.mig_enabled { "on" } else { "off" }
        );
        outln!(
            "  free: {} of memory, {} of {} memory slices unpartitioned",
            format_mib(g.free_memory_mib),
            g.free_memory_slices,
            g.memory_slices
        );
        outln!(
            "  {:<4} {:<12} {:>7} {:>5} {:>4}  {:<15} FREE NOW",
            "ID",
            "PROFILE",
            "MEMORY",
            "SMS",
            "MAX",
            "STARTS"
        );
        for p in &g.profiles {
            let list = |v: &[u32]| {
                if v.is_empty() {
                    "-".to_owned()
                } else {
                    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                }
            };
            outln!(
                "  {:<4} {:<12} {:>7} {:>5} {:>4}  {:<15} {}",
                p.id,
                p.name,
                format_mib(p.memory_mib),
                p.sm_count,
                p.max_count,
                list(&p.starts),
                list(&p.free_starts)
            );
        }
    }
}

#[derive(Debug, Serialize)]
struct PlanOut {
    planner: String,
    stp: Option<f64>,
    steps: Vec<StepOut>,
    jobs: Vec<PlannedOut>,
}

#[derive(Debug, Serialize)]
struct StepOut {
    kind: &'static str,
    gpu: u32,
    profile: String,
    start_slice: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    instance_id: Option<u32>,
}

#[derive(Debug, Serialize)]
struct PlannedOut {
    file: String,
    name: String,
    placement: Option<PlacementOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

#[derive(Debug, Serialize)]
struct PlacementOut {
    gpu: u32,
    profile: String,
    start_slice: u32,
    mps_share: u32,
}

/// `partitions plan`: the steps and where each job would go.
pub fn plan(fmt: Format, files: &[std::path::PathBuf], r: &v1::PlanJobsResponse) {
    let out = PlanOut {
        planner: r.planner.clone(),
        stp: r.stp,
        steps: r
            .steps
            .iter()
            .map(|s| {
                let destroy = s.kind == v1::layout_step::Kind::Destroy as i32;
                StepOut {
                    kind: if destroy { "destroy" } else { "create" },
                    gpu: s.gpu_index,
                    profile: s.profile.clone(),
                    start_slice: s.start_slice,
                    instance_id: destroy.then_some(s.instance_id),
                }
            })
            .collect(),
        jobs: r
            .jobs
            .iter()
            .zip(files)
            .map(|(j, f)| PlannedOut {
                file: f.display().to_string(),
                name: j.name.clone(),
                placement: j.assignment.as_ref().map(|a| PlacementOut {
                    gpu: a.gpu_index,
                    profile: a.profile.clone(),
                    start_slice: a.start_slice,
                    mps_share: a.mps_share,
                }),
                reason: (!j.reason.is_empty()).then(|| j.reason.clone()),
            })
            .collect(),
    };
    if fmt == Format::Json {
        print_json(&out);
        return;
    }
    match out.stp {
        Some(stp) => outln!(
            "planner {}, predicted system throughput {stp:.2}",
            out.planner
        ),
        None => outln!("planner {}", out.planner),
    }
    if out.steps.is_empty() {
        outln!("layout: unchanged");
    } else {
        outln!("layout changes:");
        for s in &out.steps {
            match s.instance_id {
                Some(id) => outln!(
                    "  destroy {} (instance {id}) on gpu {} at slice {}",
                    s.profile,
                    s.gpu,
                    s.start_slice
                ),
                None => outln!(
                    "  create {} on gpu {} at slice {}",
                    s.profile,
                    s.gpu,
                    s.start_slice
                ),
            }
        }
    }
    outln!("jobs:");
    for j in &out.jobs {
        match &j.placement {
            Some(p) => outln!(
                "  {} ({}): gpu {} {}@{}, MPS {}%",
                j.file,
                j.name,
                p.gpu,
                p.profile,
                p.start_slice,
                p.mps_share
            ),
            None => outln!(
                "  {} ({}): would wait: {}",
                j.file,
                j.name,
                j.reason.as_deref().unwrap_or("")
            ),
        }
    }
    outln!("(a dry run: nothing changed)");
}

/// A learned profile, as `mmkctl profiles --output json` prints it (docs/mmkctl.md).
#[derive(Debug, Serialize)]
pub struct LearnedOut {
    pub signature: String,
    pub owner_uid: Option<u32>,
    pub name: String,
    pub class: String,
    pub samples: u64,
    pub seconds: f64,
    pub runs: u64,
    pub sm_mean: f64,
    pub sm_p95: f64,
    pub busy: f64,
    pub kernel_us: Option<f64>,
    pub launch_interval_us: Option<f64>,
    pub launches: u64,
    /// The planner uses it.
    pub confident: bool,
    pub updated_at: Option<String>,
    /// The most GPU memory its processes held at once; null when the driver does not tell.
    pub memory_peak_mib: Option<u64>,
    /// The share of the GPU's DRAM bandwidth it used alone in its partition; null until
    /// measured (GPUs with GPM only).
    pub dram_bw: Option<f64>,
}

pub fn profiles(fmt: Format, r: &v1::ListProfilesResponse) {
    let out: Vec<LearnedOut> = r
        .profiles
        .iter()
        .map(|p| LearnedOut {
            signature: p.signature.clone(),
            owner_uid: p.owner_uid,
            name: p.name.clone(),
            class: class_name(p.class),
            samples: p.samples,
            seconds: p.seconds,
            runs: p.runs,
            sm_mean: p.sm_mean,
            sm_p95: p.sm_p95,
            busy: p.busy,
            kernel_us: (p.kernel_us > 0.0).then_some(p.kernel_us),
            launch_interval_us: (p.launch_interval_us > 0.0).then_some(p.launch_interval_us),
            launches: p.launches,
            confident: p.confident,
            updated_at: time(p.updated_at.as_ref()),
            memory_peak_mib: (p.memory_peak_mib > 0).then_some(p.memory_peak_mib),
            dram_bw: p.dram_bw.filter(|b| b.is_finite()),
        })
        .collect();
    if fmt == Format::Json {
        print_json(&out);
        return;
    }
    if out.is_empty() {
        outln!(
            "no learned profiles yet: they appear once a job has run under the kernel scheduler"
        );
        return;
    }
    outln!(
        "{:<16} {:<7} {:>4} {:>8} {:>6} {:>6} {:>5} {:>5} {:>9} {:>9} {:>8} {:<4} SIGNATURE",
        "NAME",
        "CLASS",
        "RUNS",
        "SAMPLES",
        "SM",
        "SM-P95",
        "BUSY",
        "BW",
        "KERNEL",
        "LAUNCH/",
        "MEM",
        "USED"
    );
    let us = |v: Option<f64>| match v {
        Some(v) if v >= 1000.0 => format!("{:.1}ms", v / 1000.0),
        Some(v) => format!("{v:.0}us"),
        None => "-".into(),
    };
    for p in &out {
        outln!(
            "{:<16} {:<7} {:>4} {:>8} {:>5.1}% {:>5.1}% {:>4.0}% {:>5} {:>9} {:>9} {:>8} {:<4} {}",
            clip(&p.name, 16),
            p.class,
            p.runs,
            p.samples,
            p.sm_mean * 100.0,
            p.sm_p95 * 100.0,
            p.busy * 100.0,
            p.dram_bw
                .map_or_else(|| "-".to_owned(), |b| format!("{:.0}%", b * 100.0)),
            us(p.kernel_us),
            us(p.launch_interval_us),
            p.memory_peak_mib.map_or_else(|| "-".to_owned(), format_mib),
            if p.confident { "yes" } else { "no" },
            p.signature
        );
    }
}

/// A mig-parted config: YAML, the format mig-parted reads, or the same as JSON.
pub fn mig_parted(fmt: Format, config: &crate::export::MigParted) {
    if fmt == Format::Json {
        return print_json(config);
    }
    match serde_saphyr::to_string(config) {
        Ok(yaml) => out!("{yaml}"),
        Err(e) => eprintln!("mmkctl: cannot write the config: {e}"),
    }
}
