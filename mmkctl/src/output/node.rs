//! The node as mmkctl shows it: partitions, GPUs, dry-run plans, learned profiles and the layout as a config for NVIDIA's tools.

use super::*;

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

pub(crate) fn gate_out(g: &v1::KernelGate) -> KernelGateOut {
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
pub(crate) struct NodeOut {
    pub(crate) hostname: String,
    pub(crate) backend: String,
    pub(crate) planner: String,
    pub(crate) version: String,
    pub(crate) gpus: Vec<GpuOut>,
}

#[derive(Debug, Serialize)]
pub(crate) struct GpuOut {
    pub(crate) index: u32,
    pub(crate) uuid: String,
    pub(crate) model: String,
    pub(crate) memory_mib: u64,
    pub(crate) sm_count: u32,
    pub(crate) mig_enabled: bool,
    pub(crate) memory_slices: u32,
    pub(crate) free_memory_mib: u64,
    pub(crate) free_memory_slices: u32,
    pub(crate) profiles: Vec<ProfileOut>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ProfileOut {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) compute_slices: u32,
    pub(crate) memory_slices: u32,
    pub(crate) memory_mib: u64,
    pub(crate) sm_count: u32,
    pub(crate) max_count: u32,
    pub(crate) starts: Vec<u32>,
    pub(crate) free_starts: Vec<u32>,
    pub(crate) media_extensions: bool,
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
pub(crate) struct PlanOut {
    pub(crate) planner: String,
    pub(crate) stp: Option<f64>,
    pub(crate) steps: Vec<StepOut>,
    pub(crate) jobs: Vec<PlannedOut>,
}

#[derive(Debug, Serialize)]
pub(crate) struct StepOut {
    pub(crate) kind: &'static str,
    pub(crate) gpu: u32,
    pub(crate) profile: String,
    pub(crate) start_slice: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) instance_id: Option<u32>,
}

#[derive(Debug, Serialize)]
pub(crate) struct PlannedOut {
    pub(crate) file: String,
    pub(crate) name: String,
    pub(crate) placement: Option<PlacementOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct PlacementOut {
    pub(crate) gpu: u32,
    pub(crate) profile: String,
    pub(crate) start_slice: u32,
    pub(crate) mps_share: u32,
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
