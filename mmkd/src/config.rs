//! mmkd's configuration: command-line flags over a YAML config file over defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, ValueEnum};

pub use crate::backend::{MigGpus, NotAGpuIndex};
pub use crate::ksched::DEFAULT_KERNEL_HOLD_BUDGET;
pub use crate::tcp::TlsFiles;

mod settings;
use mmk_core::paths;
use mmk_partitioner::GpuModel;
use serde::Deserialize;
use settings::*;

use crate::backend::sim::parse_sim_gpus;
use crate::os::on_memory_fs;

/// The simulated node when neither the flag nor the file names one.
pub const DEFAULT_SIM_GPUS: &str = "a100-80gb:1";
/// The planner when neither the flag nor the file names one: MMK's hybrid scheduler.
pub const DEFAULT_PLANNER: &str = "mmk";
/// How long a job gets between SIGTERM and SIGKILL when it is cancelled or mmkd stops.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// NVML when libnvidia-ml.so.1 loads and finds a GPU, else the simulated node.
    Auto,
    /// Real GPUs through NVML; fail if there are none.
    Nvml,
    /// The simulated node (--sim-gpus).
    Sim,
}

/// The planner's performance model (`--model`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChoice {
    /// The forest built into mmkd (`mmk_predictor::shipped`): the default.
    Builtin,
    /// The analytic model (docs/planner.md).
    Analytic,
    /// A model file (`mmk-lab predictor train`); `./analytic` names a file of that name.
    File(PathBuf),
}

impl From<Option<PathBuf>> for ModelChoice {
    fn from(p: Option<PathBuf>) -> ModelChoice {
        match p {
            None => ModelChoice::Builtin,
            Some(p) if p.as_os_str() == "builtin" => ModelChoice::Builtin,
            Some(p) if p.as_os_str() == "analytic" => ModelChoice::Analytic,
            Some(p) => ModelChoice::File(p),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MpsChoice {
    /// The real control program with the NVML backend (off, with a warning, when it is
    /// not installed); the fake with the simulated node.
    Auto,
    /// nvidia-cuda-mps-control (--mps-control); fail if it cannot be found.
    Nvidia,
    /// The fake control program built into mmkd (no GPU involved).
    Fake,
    /// No MPS daemons: jobs share a partition without MPS.
    Off,
}

/// The unit of capacity (AllocationService.WatchCapacity, the Kubernetes device plugin's
/// devices) when neither the flag nor the file says.
pub const DEFAULT_CAPACITY_UNIT_MIB: u64 = 10 * 1024;

/// How often MPS daemons are checked when neither the flag nor the file says.
pub const DEFAULT_MPS_CHECK: Duration = Duration::from_secs(1);
/// The real MPS control program, looked up in PATH.
pub const DEFAULT_MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// mmkd: the mmk node daemon.
#[derive(Debug, Parser)]
#[command(name = "mmkd", version, about, long_about = None)]
pub struct Args {
    /// YAML config file; flags override its values (docs/mmkd.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Unix socket to listen on [default: /run/mmk/mmkd.sock for root,
    /// $XDG_RUNTIME_DIR/mmk/mmkd.sock or /tmp/mmk-$UID/mmkd.sock otherwise].
    #[arg(long, value_name = "PATH", env = paths::SOCKET_ENV)]
    pub socket: Option<PathBuf>,
    /// Also listen on this TCP address, with TLS: needs --tls-cert, --tls-key and
    /// --tls-client-ca (docs/security.md).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Where the node store and job logs live [default: /var/lib/mmk for root,
    /// ~/.local/share/mmk otherwise].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Which GPUs to manage [default: auto].
    #[arg(long, value_enum)]
    pub backend: Option<BackendChoice>,
    /// The simulated node's GPUs, MODEL:N[,MODEL:N] [default: a100-80gb:1]. Models:
    /// a100-40gb, a100-80gb, h100-80gb, h100-94gb, h200-141gb, a30-24gb.
    #[arg(long, value_name = "MODEL:N,...")]
    pub sim_gpus: Option<String>,
    /// How much faster than real time simulated jobs and MIG changes run [default: 1].
    #[arg(long, value_name = "X")]
    pub sim_speed: Option<f64>,
    /// The NVML library the nvml backend loads [default: libnvidia-ml.so.1 from the
    /// loader's path].
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// The GPUs whose MIG layout mmkd may change (indices, `all` or `none`); on the others
    /// it uses the instances it finds [default: all] (docs/mmkd.md, "MIG on real GPUs").
    #[arg(long, value_name = "all|none|I,J,...")]
    pub mig_gpus: Option<String>,
    /// Instances mmkd did not create may be destroyed like its own; without it a GPU with
    /// such an instance keeps its layout [default: off].
    #[arg(long)]
    pub mig_take_over: bool,
    /// Time between SIGTERM and SIGKILL when a job is stopped [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = parse_grace)]
    pub stop_grace: Option<Duration>,
    /// How jobs are placed: mmk, first-fit, miger, miso, mps or default
    /// [default: mmk] (docs/planner.md).
    #[arg(long, value_name = "NAME")]
    pub planner: Option<String>,
    /// An offline job's MPS share is at most PCT % (10 to 100, a multiple of 10): its
    /// kernels never take more of the SMs, so online jobs that join its partition later
    /// find the rest free of them (a running job's share cannot change); `mmk` and `miger`
    /// planners [default: 100] (docs/planner.md).
    #[arg(long, value_name = "PCT")]
    pub offline_share_max: Option<u8>,
    /// MPS control daemons, one per partition: auto, nvidia, fake or off [default: auto].
    #[arg(long, value_enum)]
    pub mps: Option<MpsChoice>,
    /// The MPS control program for --mps nvidia [default: nvidia-cuda-mps-control, from
    /// PATH].
    #[arg(long, value_name = "PATH")]
    pub mps_control: Option<PathBuf>,
    /// How often MPS daemons and servers are checked [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = parse_grace)]
    pub mps_check_interval: Option<Duration>,
    /// The planner's performance model: `builtin` (the forest trained on the repo's H200
    /// dataset, built into mmkd), `analytic`, or a model file (`mmk-lab predictor train`)
    /// [default: builtin] (docs/predictor.md).
    #[arg(long, value_name = "builtin|analytic|FILE")]
    pub model: Option<PathBuf>,
    /// The kernel scheduler's policy in every partition: mmk, orion, fikit, passthrough or
    /// off [default: mmk] (docs/kernel-sched.md).
    #[arg(long, value_name = "NAME")]
    pub kernel_policy: Option<String>,
    /// The `mmk` policy's offline depth cap: while an online job is in a partition, at
    /// most N offline kernels in flight there; 0 sets no cap [default: 0]
    /// (docs/kernel-sched.md).
    #[arg(long, value_name = "N")]
    pub kernel_offline_depth: Option<u32>,
    /// Offline jobs' cuBLAS GEMMs of more than MFLOP million floating-point operations are
    /// cut into pieces of about that size, which the gate holds one by one; 0: not cut
    /// [default: 0] (docs/kernel-sched.md).
    #[arg(long, value_name = "MFLOP")]
    pub kernel_gemm_slice: Option<u32>,
    /// Each offline job process is held by the kernel gate at most PCT % of its time; once
    /// that is spent its launches go at once until time refills it (a bucket of 50 ms).
    /// 0: the gate tracks every launch (learned profiles, metrics) but holds none; 100 sets
    /// no budget (Listing 1 as the paper has it) [default: 0] (docs/kernel-sched.md, "The
    /// hold budget").
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(0..=100))]
    pub kernel_hold_budget: Option<u32>,
    /// The kernel scheduler's anti-starvation base (also Orion's DUR_THRESHOLD) in every
    /// partition, over what online jobs' profiles say [default: 2.5 % of the online job's
    /// profiled request latency, else 250us].
    #[arg(long, value_name = "DURATION", value_parser = parse_grace)]
    pub kernel_base: Option<Duration>,
    /// Offline jobs' launches also wait on the GPU while online work is in flight, so that
    /// what they queued does not run beside it; needs --kernel-gate-dir on a memory file
    /// system such as /dev/shm (docs/kernel-sched.md, "The device wait").
    #[arg(long)]
    pub kernel_device_wait: bool,
    /// With --kernel-device-wait: a wait only once this much expected offline work (from
    /// the job's kernel profile) has been launched since the last one [default: 0, a wait
    /// before every launch].
    #[arg(long, value_name = "DURATION", value_parser = parse_grace)]
    pub kernel_device_wait_grain: Option<Duration>,
    /// Where the partitions' gates are made [default: DATA_DIR/ksched]; the SLO control's
    /// device wait acts only where this is a memory file system (/run/mmk/ksched, as the
    /// package sets it).
    #[arg(long, value_name = "DIR")]
    pub kernel_gate_dir: Option<PathBuf>,
    /// The latency objective of an online job that gives none: the slowdown its p99 on the
    /// GPU may have against running alone [default: 4x] (docs/slo.md).
    #[arg(long, value_name = "SLOWDOWN")]
    pub slo_default: Option<String>,
    /// No SLO control: partitions keep the kernel settings above whatever their online
    /// jobs' latency (docs/slo.md).
    #[arg(long)]
    pub no_slo_control: bool,
    /// The SLO control's waits this many times shorter (tests).
    #[arg(long, hide = true, value_name = "N")]
    pub slo_speed: Option<u32>,
    /// The interposer put in managed jobs' LD_PRELOAD [default: libmmk_interposer.so next
    /// to mmkd; the kernel scheduler is off when there is none].
    #[arg(long, value_name = "PATH")]
    pub interposer: Option<PathBuf>,
    /// GPU memory of one unit of capacity: WatchCapacity counts how many allocations of
    /// this size of each class the node would start now, and the Kubernetes device plugin
    /// advertises them as devices [default: 10G]
    #[arg(long, value_name = "SIZE")]
    pub capacity_unit: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (docs/metrics.md), or `off`
    /// [default: 127.0.0.1:9410; when that port is taken mmkd warns and goes on without]
    #[arg(long, value_name = "ADDR|off")]
    pub metrics: Option<String>,
    /// Serve the Kubernetes device plugin (mmk.io/online, mmk.io/offline) and register it
    /// with the kubelet whose device-plugin directory this is
    /// (/var/lib/kubelet/device-plugins); off when unset
    #[arg(long, value_name = "DIR")]
    pub kubelet_dir: Option<PathBuf>,
    /// The kubelet's pod-resources socket, asked which containers still hold their
    /// devices [default: DIR/../pod-resources/kubelet.sock]
    #[arg(long, value_name = "PATH")]
    pub kubelet_pod_resources: Option<PathBuf>,
    /// The server's certificate chain (PEM) for --listen.
    #[arg(long, value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// The server's private key (PEM) for --listen; readable by root only.
    #[arg(long, value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) whose client certificates mmkd accepts over TCP; a certificate's
    /// common name is the caller's user name on this node.
    #[arg(long, value_name = "PATH")]
    pub tls_client_ca: Option<PathBuf>,
    /// The most a command job's logs take on disk; the oldest part is dropped past it
    /// [default: 256M] (docs/security.md).
    #[arg(long, value_name = "SIZE")]
    pub job_log_max: Option<String>,
    /// The most disk a running command job's folder (its work/ and logs in the data dir)
    /// may take; past it the job fails [default: 16G, at most a quarter of the data dir's
    /// file system] (docs/security.md).
    #[arg(long, value_name = "SIZE")]
    pub job_disk_max: Option<String>,
    /// How long an ended job's folder (work/ and logs) is kept [default: 24h]
    /// (docs/security.md).
    #[arg(long, value_name = "DURATION", value_parser = parse_grace)]
    pub job_retention: Option<Duration>,
    /// How long an ended job's record (jobs get, list, events) is kept [default: 30d]
    /// (docs/mmkd.md).
    #[arg(long, value_name = "DURATION", value_parser = parse_grace)]
    pub job_history: Option<Duration>,
    /// Ended jobs of each user whose records are kept whatever their age [default: 100].
    #[arg(long, value_name = "N")]
    pub job_history_keep: Option<u32>,
    /// Members of this group act on every job, like root [default: none; root only]
    /// (docs/security.md).
    #[arg(long, value_name = "GROUP")]
    pub admin_group: Option<String>,
    /// The cluster scheduler's user (a Slurm prolog's, a device plugin's): acts on every
    /// job, like root; repeat for several (docs/security.md).
    #[arg(long = "scheduler-user", value_name = "USER")]
    pub scheduler_users: Vec<String>,
    /// The group of the Unix socket (mode 0660): its members may call mmkd [default: the
    /// group mmkd runs as] (docs/security.md).
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// How often the device plugin asks the kubelet which containers still run
    /// [default: 2s]
    #[arg(long, value_name = "DURATION", value_parser = parse_grace)]
    pub kubelet_check_interval: Option<Duration>,
}

/// A base over the gates' hard bound on any hold is refused: under `mmk` it would never act.
const MAX_KERNEL_BASE: Duration = mmk_kernel_sched::DEFAULT_MAX_HOLD;

fn parse_grace(s: &str) -> Result<Duration, mmk_core::units::UnitError> {
    mmk_core::units::parse_duration(s)
}

/// A duration setting: the flag's (clap parsed it), else the config file's, parsed here with
/// the setting named in the error.
fn duration_setting(
    flag: Option<Duration>,
    file: Option<String>,
    field: &'static str,
) -> Result<Option<Duration>, ConfigError> {
    match (flag, file) {
        (Some(d), _) => Ok(Some(d)),
        (None, Some(text)) => parse_grace(&text)
            .map(Some)
            .map_err(|e| ConfigError::Invalid {
                field,
                message: e.to_string(),
            }),
        (None, None) => Ok(None),
    }
}

/// The config file: the same settings as the flags, in snake_case.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    socket: Option<PathBuf>,
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    backend: Option<BackendChoice>,
    sim_gpus: Option<String>,
    sim_speed: Option<f64>,
    nvml_lib: Option<PathBuf>,
    mig_gpus: Option<String>,
    mig_take_over: Option<bool>,
    stop_grace: Option<String>,
    planner: Option<String>,
    offline_share_max: Option<u8>,
    mps: Option<MpsChoice>,
    mps_control: Option<PathBuf>,
    mps_check_interval: Option<String>,
    model: Option<PathBuf>,
    kernel_policy: Option<String>,
    kernel_offline_depth: Option<u32>,
    kernel_gemm_slice: Option<u32>,
    kernel_hold_budget: Option<u32>,
    kernel_base: Option<String>,
    kernel_device_wait: Option<bool>,
    kernel_device_wait_grain: Option<String>,
    kernel_gate_dir: Option<PathBuf>,
    slo_default: Option<String>,
    slo_control: Option<bool>,
    interposer: Option<PathBuf>,
    capacity_unit: Option<String>,
    metrics: Option<String>,
    kubelet_dir: Option<PathBuf>,
    kubelet_pod_resources: Option<PathBuf>,
    kubelet_check_interval: Option<String>,
    job_log_max: Option<String>,
    job_disk_max: Option<String>,
    job_retention: Option<String>,
    job_history: Option<String>,
    job_history_keep: Option<u32>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    admin_group: Option<String>,
    scheduler_users: Option<Vec<String>>,
    socket_group: Option<String>,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket: PathBuf,
    pub listen: Option<SocketAddr>,
    pub data_dir: PathBuf,
    pub backend: BackendChoice,
    pub sim_gpus: Vec<GpuModel>,
    pub sim_speed: f64,
    /// The NVML library to load; `None`: the system's.
    pub nvml_lib: Option<PathBuf>,
    /// The GPUs whose MIG layout mmkd may change.
    pub mig_gpus: MigGpus,
    /// Instances mmkd did not create may be destroyed.
    pub mig_take_over: bool,
    pub stop_grace: Duration,
    pub planner: String,
    /// An offline job's greatest MPS share (%).
    pub offline_share_max: u8,
    pub mps: MpsChoice,
    pub mps_control: PathBuf,
    pub mps_check_interval: Duration,
    pub model: ModelChoice,
    /// The kernel scheduler's policy; `None` when it is off.
    pub kernel_policy: Option<mmk_kernel_sched::PolicyKind>,
    /// `mmk`'s offline depth cap per partition; 0: none.
    pub kernel_offline_depth: u32,
    /// Offline GEMMs over this many MFLOP are cut into pieces; 0: not cut.
    pub kernel_gemm_slice: u32,
    /// The share of its time (%) an offline process may be held; 100: no budget.
    pub kernel_hold_budget: u32,
    /// The operator's anti-starvation base, over the online jobs' profiles.
    pub kernel_base: Option<Duration>,
    /// Offline launches also wait on the GPU, with this grain (`None`: off).
    pub kernel_device_wait: Option<Duration>,
    /// Where gates are made.
    pub kernel_gate_dir: PathBuf,
    /// The SLO control; `None` when off.
    pub slo: Option<crate::slo::SloConfig>,
    /// An interposer named by the operator (must exist), else the default one if present.
    pub interposer: Option<PathBuf>,
    pub capacity_unit_mib: u64,
    /// Where metrics are served; `None` when off.
    pub metrics: Option<MetricsAddr>,
    /// The Kubernetes device plugin; `None` when it is off.
    pub kubelet: Option<crate::k8s::PluginConfig>,
    /// The most a command job's logs take on disk, in bytes.
    pub job_log_max: u64,
    /// The most a running command job's folder may take, in bytes; `None`: the default
    /// for the data dir's file system (`crate::disk::default_job_disk_max`).
    pub job_disk_max: Option<u64>,
    /// How long an ended job's folder is kept.
    pub job_retention: Duration,
    /// What the store keeps of ended jobs.
    pub history: crate::node::HistoryPolicy,
    /// Who may act on which job.
    pub access: crate::auth::Access,
    /// The socket's group (`None`: mmkd's own).
    pub socket_group: Option<u32>,
    /// The TCP listener's TLS files; set whenever `listen` is.
    pub tls: Option<TlsFiles>,
    /// What the mmkd binary carries (the interposer).
    pub carried: crate::Carried,
}

/// Where `/metrics` is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsAddr {
    pub addr: SocketAddr,
    /// The default address, not one the operator gave: a port in use is a warning.
    pub default: bool,
}

/// Metrics are served here unless `--metrics` says otherwise.
pub const DEFAULT_METRICS: &str = "127.0.0.1:9410";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

impl Config {
    pub fn resolve(mut args: Args) -> Result<Config, ConfigError> {
        let mut file = match &args.config {
            Some(p) => read_file(p)?,
            None => FileConfig::default(),
        };
        // Settings read whole by their own functions first; the rest below.
        let data_dir = absolute(
            args.data_dir
                .take()
                .or(file.data_dir.take())
                .unwrap_or_else(paths::default_data_dir),
            "data_dir",
        )?;
        let kernel = kernel_settings(&mut args, &mut file, &data_dir)?;
        let slo = slo_settings(&mut args, &mut file)?;
        let (listen, tls, metrics) = network(&mut args, &mut file)?;
        let capacity_unit_mib = match args.capacity_unit.take().or(file.capacity_unit.take()) {
            None => DEFAULT_CAPACITY_UNIT_MIB,
            Some(text) => {
                mmk_core::units::parse_memory_mib(&text).map_err(|e| ConfigError::Invalid {
                    field: "capacity_unit",
                    message: e.to_string(),
                })?
            }
        };
        let kubelet = kubelet(&mut args, &mut file, capacity_unit_mib)?;
        let (job_log_max, job_disk_max, job_retention, history) = job_limits(&mut args, &mut file)?;
        let (access, socket_group) = access(&mut args, &mut file)?;
        let sim_text = args
            .sim_gpus
            .or(file.sim_gpus)
            .unwrap_or_else(|| DEFAULT_SIM_GPUS.to_owned());
        let sim_gpus = parse_sim_gpus(&sim_text).map_err(|e| ConfigError::Invalid {
            field: "sim_gpus",
            message: e.to_string(),
        })?;
        let sim_speed = args.sim_speed.or(file.sim_speed).unwrap_or(1.0);
        if !(sim_speed.is_finite() && (0.001..=1e9).contains(&sim_speed)) {
            return Err(ConfigError::Invalid {
                field: "sim_speed",
                message: format!("{sim_speed} must be between 0.001 and 1e9"),
            });
        }
        let offline_share_max = args
            .offline_share_max
            .or(file.offline_share_max)
            .unwrap_or(100);
        if !(10..=100).contains(&offline_share_max) || !offline_share_max.is_multiple_of(10) {
            return Err(ConfigError::Invalid {
                field: "offline_share_max",
                message: format!(
                    "{offline_share_max} is not an MPS share mmk gives (10 to 100, a multiple of 10)"
                ),
            });
        }
        let mig_gpus = match args.mig_gpus.as_deref().or(file.mig_gpus.as_deref()) {
            None => MigGpus::All,
            Some(text) => MigGpus::parse(text).map_err(|e| ConfigError::Invalid {
                field: "mig_gpus",
                message: e.to_string(),
            })?,
        };
        let stop_grace = duration_setting(args.stop_grace, file.stop_grace, "stop_grace")?
            .unwrap_or(DEFAULT_STOP_GRACE);
        let mps_check_interval = duration_setting(
            args.mps_check_interval,
            file.mps_check_interval,
            "mps_check_interval",
        )?
        .unwrap_or(DEFAULT_MPS_CHECK);
        if mps_check_interval < Duration::from_millis(10) {
            return Err(ConfigError::Invalid {
                field: "mps_check_interval",
                message: format!("{mps_check_interval:?} is shorter than 10ms"),
            });
        }
        let planner = args
            .planner
            .or(file.planner)
            .unwrap_or_else(|| DEFAULT_PLANNER.to_owned());
        if !mmk_partitioner::PLANNERS.contains(&planner.as_str()) {
            return Err(ConfigError::Invalid {
                field: "planner",
                message: format!(
                    "unknown planner {planner:?}; known: {}",
                    mmk_partitioner::PLANNERS.join(", ")
                ),
            });
        }
        // Absolute, whatever the operator wrote: the MPS daemons and the jobs, which run
        // elsewhere, find their folders by these paths.
        Ok(Config {
            tls,
            job_log_max,
            job_disk_max,
            job_retention,
            history,
            carried: crate::Carried::default(),
            access,
            socket_group,
            kubelet,
            capacity_unit_mib,
            metrics,
            planner,
            offline_share_max,
            socket: args
                .socket
                .or(file.socket)
                .unwrap_or_else(paths::default_socket),
            listen,
            data_dir,
            backend: args.backend.or(file.backend).unwrap_or(BackendChoice::Auto),
            sim_gpus,
            sim_speed,
            nvml_lib: args.nvml_lib.or(file.nvml_lib),
            mig_gpus,
            mig_take_over: args.mig_take_over || file.mig_take_over.unwrap_or(false),
            stop_grace,
            mps: args.mps.or(file.mps).unwrap_or(MpsChoice::Auto),
            mps_control: args
                .mps_control
                .or(file.mps_control)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_MPS_CONTROL)),
            mps_check_interval,
            model: ModelChoice::from(args.model.or(file.model)),
            kernel_policy: kernel.policy,
            kernel_offline_depth: args
                .kernel_offline_depth
                .or(file.kernel_offline_depth)
                .unwrap_or(0),
            kernel_gemm_slice: args
                .kernel_gemm_slice
                .or(file.kernel_gemm_slice)
                .unwrap_or(0),
            kernel_hold_budget: kernel.hold_budget,
            kernel_base: kernel.base,
            kernel_device_wait: kernel.device_wait,
            kernel_gate_dir: kernel.gate_dir,
            slo,
            interposer: args.interposer.or(file.interposer),
        })
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    serde_saphyr::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.display().to_string(),
        message: e
            .without_snippet()
            .to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned(),
    })
}

#[cfg(test)]
mod tests;
