//! Attached mode and what cluster schedulers ask (docs/cluster.md): `run`, `allocate`,
//! `release`, `fit` and `capacity`.
//!
//! `mmkctl run` allocates a partition and a share with a lease, starts the command with
//! the allocation's environment, renews the lease while the command runs, and releases
//! the allocation with the command's exit code. If mmkctl itself is killed the lease runs
//! out and mmkd frees the allocation; if the allocation is cancelled the command gets
//! SIGTERM.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use mmk_core::spec::{AttachedSpec, Task};
use mmk_core::units::format_mib;
use mmk_core::{JobClass, JobSpec, JobState, RestartPolicy};
use mmk_proto::v1;
use mmk_proto::v1::allocation_service_client::AllocationServiceClient;
use mmk_proto::{spec_to_proto, state_from_proto};
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::Channel;

use crate::cli::{Failure, Format, flag_class, read_spec};
use crate::client::{Target, connect};
use crate::output;

/// How long a command gets between SIGTERM and SIGKILL once its allocation is gone.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What the allocation is: class, size, and what the planner should assume.
#[derive(Debug, Args)]
pub struct AllocSpecArgs {
    /// The command is online (latency-sensitive).
    #[arg(long, conflicts_with = "offline", required_unless_present = "offline")]
    pub online: bool,
    /// The command is offline (batch).
    #[arg(long)]
    pub offline: bool,
    /// GPU memory it needs (10GiB, 512MiB).
    #[arg(long, default_value = "10GiB", value_name = "SIZE")]
    pub memory: String,
    /// The job's name [default: the program's file name].
    #[arg(long)]
    pub name: Option<String>,
    /// The Table III workload it resembles (docs/job-spec.md), for the planner.
    #[arg(long, value_name = "WORKLOAD")]
    pub profile: Option<String>,
    /// The partition to itself: no other job is placed beside it.
    #[arg(long)]
    pub exclusive: bool,
    /// What mmkd keeps the job's learned profile under (yours): runs that give the same
    /// key share one [default for `run`: the name and a digest of the command].
    #[arg(long, value_name = "KEY")]
    pub profile_key: Option<String>,
    /// Online: the latency objective per request: its p99 (50ms), or the slowdown it
    /// tolerates against running alone (3x) [default: mmkd's, docs/slo.md].
    #[arg(long, value_name = "OBJECTIVE", value_parser = parse_objective)]
    pub slo: Option<mmk_core::units::Objective>,
    /// Higher is placed first among waiting jobs.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Online: the kernel policy of its partition (passthrough, mmk, orion, fikit).
    #[arg(long, value_name = "NAME")]
    pub kernel_policy: Option<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub spec: AllocSpecArgs,
    /// The lease; if mmkctl dies, mmkd frees the allocation this long after.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease: Duration,
    /// Give up if the allocation is not placed within this long [default: wait as long
    /// as it takes].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Print nothing of mmkctl's own but errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct AllocateArgs {
    #[command(flatten)]
    pub spec: AllocSpecArgs,
    /// The allocation ends when this process ends (it must run on this node).
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// The allocation ends unless renewed this often (`mmkctl renew`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub lease: Option<Duration>,
    /// Wait this long for the placement; a waiting allocation is printed as it is
    /// [default: answer at once].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Print the environment as `export NAME=value` lines (a Slurm TaskProlog's output)
    /// instead of the allocation.
    #[arg(long)]
    pub export: bool,
}

fn parse_duration(s: &str) -> Result<Duration, mmk_core::units::UnitError> {
    mmk_core::units::parse_duration(s)
}

fn parse_objective(s: &str) -> Result<mmk_core::units::Objective, mmk_core::units::UnitError> {
    mmk_core::units::parse_objective(s)
}

impl AllocSpecArgs {
    fn spec(
        &self,
        default_name: &str,
        default_key: Option<String>,
        attached: AttachedSpec,
    ) -> Result<JobSpec, Failure> {
        let class = if self.online {
            JobClass::Online
        } else {
            JobClass::Offline
        };
        let gpu_memory_mib = mmk_core::units::parse_memory_mib(&self.memory)
            .map_err(|e| Failure::usage(format!("--memory: {e}")))?;
        let spec = JobSpec {
            name: self.name.clone().unwrap_or_else(|| job_name(default_name)),
            class,
            gpu_memory_mib,
            slo_ms: match self.slo {
                Some(mmk_core::units::Objective::LatencyMs(ms)) => Some(ms),
                _ => None,
            },
            slo_slowdown_pct: match self.slo {
                Some(mmk_core::units::Objective::SlowdownPct(pct)) => Some(pct),
                _ => None,
            },
            priority: self.priority,
            task: Task::Attached(AttachedSpec {
                profile: self.profile.clone(),
                kernel_policy: self.kernel_policy.clone(),
                ..attached
            }),
            checkpoint: false,
            restart_policy: RestartPolicy::Never,
            max_restarts: 0,
            exclusive: self.exclusive,
            profile_key: self.profile_key.clone().or(default_key),
        };
        spec.validate()
            .map_err(|e| Failure::usage(format!("--{}: {}", flag_of(&e.field), e.message)))?;
        Ok(spec)
    }
}

/// The flag a spec field comes from.
fn flag_of(field: &str) -> String {
    let f = field.rsplit('.').next().unwrap_or(field);
    match f {
        "gpu_memory" => "memory".into(),
        other => other.replace('_', "-"),
    }
}

/// A job name from a program path: its file name, with what a name may not hold
/// replaced by '-'.
fn job_name(program: &str) -> String {
    let base = std::path::Path::new(program)
        .file_name()
        .map_or_else(|| program.to_owned(), |f| f.to_string_lossy().into_owned());
    let mut name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(mmk_core::spec::MAX_NAME_LEN)
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        name.insert(0, 'j');
        name.truncate(mmk_core::spec::MAX_NAME_LEN);
    }
    name
}

async fn client(target: &Target) -> Result<AllocationServiceClient<Channel>, Failure> {
    Ok(AllocationServiceClient::new(connect(target).await?.channel))
}

fn state(a: &v1::Allocation) -> Option<JobState> {
    a.job.as_ref().and_then(|j| state_from_proto(j.state))
}

fn reason(a: &v1::Allocation) -> &str {
    a.job.as_ref().map_or("", |j| j.reason.as_str())
}

fn job_id(a: &v1::Allocation) -> u64 {
    a.job.as_ref().map_or(0, |j| j.id)
}

/// The allocation `mmkctl run` asks for: the command's job, leased. The same command run
/// again is the same job to the planner: its learned profile is kept under its name and a
/// digest of the command, unless --profile-key says otherwise.
fn run_spec(args: &RunArgs, program: &str) -> Result<mmk_core::JobSpec, Failure> {
    let lease_ms = u64::try_from(args.lease.as_millis()).unwrap_or(u64::MAX);
    let name = args.spec.name.clone().unwrap_or_else(|| job_name(program));
    let key = format!("{name}:{}", mmk_core::spec::command_digest(&args.command));
    args.spec.spec(
        program,
        Some(key),
        AttachedSpec {
            lease_ms: Some(lease_ms),
            ..AttachedSpec::default()
        },
    )
}

/// `mmkctl run`: returns the command's exit status as mmkctl's own.
pub async fn run(target: &Target, args: RunArgs) -> Result<u8, Failure> {
    let program = args.command[0].clone();
    let spec = run_spec(&args, &program)?;
    let say = |msg: String| {
        if !args.quiet {
            eprintln!("mmkctl run: {msg}");
        }
    };
    let mut c = client(target).await?;
    let mut term = signal(SignalKind::terminate()).map_err(signal_error)?;
    let mut int = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let mut hup = signal(SignalKind::hangup()).map_err(signal_error)?;

    let renew_every = (args.lease / 3).max(Duration::from_millis(200));
    let mut alloc = c
        .allocate(v1::AllocateRequest {
            spec: Some(spec_to_proto(&spec)),
            // Back well inside the lease, which runs while it waits.
            wait_ms: u64::try_from(renew_every.as_millis()).unwrap_or(1000),
            ..Default::default()
        })
        .await?
        .into_inner();
    let id = job_id(&alloc);
    let deadline = args.wait.map(|w| tokio::time::Instant::now() + w);
    let mut said = String::new();
    // Wait for the placement, renewing the lease.
    loop {
        match state(&alloc) {
            Some(JobState::Running) => break,
            Some(s) if s.is_terminal() => {
                return Err(Failure::server(format!(
                    "allocation {id} ended before it started: {s} ({})",
                    reason(&alloc)
                )));
            }
            _ => {}
        }
        if reason(&alloc) != said {
            said = reason(&alloc).to_owned();
            say(format!("allocation {id} waits: {said}"));
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            let _ = release(&mut c, id, None, "gave up waiting (--wait)").await;
            return Err(Failure::server(format!(
                "allocation {id} was not placed within {}; released",
                humantime::format_duration(args.wait.unwrap_or_default())
            )));
        }
        let wait_ms = u64::try_from(renew_every.as_millis()).unwrap_or(1000);
        tokio::select! {
            r = c.get_allocation(v1::GetAllocationRequest { id, wait_ms }) => {
                let renewed = match r {
                    Ok(a) => {
                        alloc = a.into_inner();
                        c.renew_lease(v1::RenewLeaseRequest { id }).await.map(|_| ())
                    }
                    Err(s) => Err(s),
                };
                match renewed {
                    Ok(()) => {}
                    // mmkd restarting or busy: try again, inside the lease.
                    Err(s) if transient(&s) => {
                        eprintln!("mmkctl run: cannot reach mmkd: {}; trying again", s.message());
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(s) => return Err(s.into()),
                }
            }
            _ = term.recv() => return give_up(&mut c, id, libc::SIGTERM).await,
            _ = int.recv() => return give_up(&mut c, id, libc::SIGINT).await,
            _ = hup.recv() => return give_up(&mut c, id, libc::SIGHUP).await,
        }
    }
    if let Some(a) = alloc.job.as_ref().and_then(|j| j.assignment.as_ref()) {
        say(format!(
            "allocation {id}: gpu {} {}@{}, MPS {}%",
            a.gpu_index, a.profile, a.start_slice, a.mps_share
        ));
    }

    let env = export_env(&alloc.env);
    let mut child = match tokio::process::Command::new(&program)
        .args(&args.command[1..])
        .envs(&env)
        .kill_on_drop(false)
        .spawn()
    {
        Ok(ch) => ch,
        Err(e) => {
            let why = format!("cannot start {program:?}: {e}");
            let _ = release(&mut c, id, Some(127), &why).await;
            return Err(Failure::usage(why));
        }
    };
    let pid = child.id().map_or(0, |p| p as i32);
    let mut tick = tokio::time::interval(renew_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut revoked = false;
    let status = loop {
        tokio::select! {
            st = child.wait() => break st,
            _ = tick.tick(), if !revoked => {
                match c.renew_lease(v1::RenewLeaseRequest { id }).await {
                    Ok(_) => {}
                    Err(s) if s.code() == Code::FailedPrecondition || s.code() == Code::NotFound => {
                        // Cancelled (or expired): the partition is no longer the command's.
                        eprintln!("mmkctl run: {}; stopping the command", s.message());
                        revoked = true;
                        forward(pid, libc::SIGTERM);
                        let kill_after = STOP_GRACE;
                        tokio::spawn(async move {
                            tokio::time::sleep(kill_after).await;
                            forward(pid, libc::SIGKILL);
                        });
                    }
                    // mmkd restarting or busy: try again at the next tick, inside the lease.
                    Err(s) => eprintln!("mmkctl run: cannot renew the lease: {}", s.message()),
                }
            }
            // The terminal sends SIGINT to the whole foreground group, the command too;
            // SIGTERM and SIGHUP sent to mmkctl alone are passed on.
            _ = int.recv() => {}
            _ = term.recv() => forward(pid, libc::SIGTERM),
            _ = hup.recv() => forward(pid, libc::SIGHUP),
        }
    };
    let status = status.map_err(|e| Failure::server(format!("cannot wait for {program}: {e}")))?;
    let (code, what) = exit_of(&status);
    if !revoked {
        match release(&mut c, id, Some(code), &what).await {
            Ok(job) => say(format!(
                "allocation {id} released: {}",
                output::state_name(job.state)
            )),
            Err(f) => eprintln!("mmkctl run: cannot release allocation {id}: {}", f.message),
        }
    }
    Ok(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

/// An error worth retrying: mmkd restarting, overloaded or cut off for a moment.
fn transient(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Internal
    )
}

fn signal_error(e: std::io::Error) -> Failure {
    Failure::server(format!("cannot install signal handlers: {e}"))
}

fn forward(pid: i32, sig: i32) {
    if pid > 0 {
        // SAFETY: kill(2) on our own child; no memory involved.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// The exit code a shell would report (128 + signal for a killed command), and what the
/// code alone does not say.
fn exit_of(status: &std::process::ExitStatus) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => (c, String::new()),
        (None, Some(s)) => (128 + s, format!("killed by signal {s}")),
        (None, None) => (1, "ended without an exit status".into()),
    }
}

/// Interrupted while waiting: the allocation is released and mmkctl exits as the signal
/// would have ended it.
async fn give_up(
    c: &mut AllocationServiceClient<Channel>,
    id: u64,
    sig: i32,
) -> Result<u8, Failure> {
    let _ = release(
        c,
        id,
        None,
        &format!("mmkctl run got signal {sig} while waiting"),
    )
    .await;
    Ok(u8::try_from(128 + sig).unwrap_or(1))
}

async fn release(
    c: &mut AllocationServiceClient<Channel>,
    id: u64,
    exit_code: Option<i32>,
    reason: &str,
) -> Result<v1::Job, Failure> {
    Ok(c.release(v1::ReleaseRequest {
        id,
        exit_code,
        reason: reason.into(),
    })
    .await?
    .into_inner())
}

#[derive(Debug, Serialize)]
struct AllocationOut {
    job: output::JobOut,
    env: BTreeMap<String, String>,
    mounts: Vec<MountOut>,
    lease_expires_at: Option<String>,
}

#[derive(Debug, Serialize)]
struct MountOut {
    host_path: String,
    container_path: String,
    read_only: bool,
}

fn allocation_out(a: &v1::Allocation) -> AllocationOut {
    AllocationOut {
        job: output::job_out(&a.job.clone().unwrap_or_default()),
        env: a.env.clone().into_iter().collect(),
        mounts: a
            .mounts
            .iter()
            .map(|m| MountOut {
                host_path: m.host_path.clone(),
                container_path: m.container_path.clone(),
                read_only: m.read_only,
            })
            .collect(),
        lease_expires_at: output::time(a.lease_expires_at.as_ref()),
    }
}

/// `mmkctl allocate`.
pub async fn allocate(target: &Target, fmt: Format, args: AllocateArgs) -> Result<(), Failure> {
    if args.pid.is_none() && args.lease.is_none() {
        return Err(Failure::usage(
            "give --pid, --lease or both: the allocation must end when its user does",
        ));
    }
    let lease_ms = args
        .lease
        .map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX));
    let default_name = args
        .pid
        .map_or_else(|| "alloc".to_owned(), |p| format!("pid{p}"));
    let spec = args.spec.spec(
        &default_name,
        None,
        AttachedSpec {
            pid: args.pid,
            lease_ms,
            ..AttachedSpec::default()
        },
    )?;
    let mut c = client(target).await?;
    // mmkd waits at most 5 minutes per call, and a lease runs while the allocation waits:
    // wait in steps, renewing the lease between them.
    let wait = args.wait.unwrap_or_default();
    let deadline = tokio::time::Instant::now() + wait;
    let step = args.lease.map_or(Duration::from_secs(60), |l| {
        (l / 3).max(Duration::from_millis(200))
    });
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut a = c
        .allocate(v1::AllocateRequest {
            spec: Some(spec_to_proto(&spec)),
            wait_ms: ms(wait.min(step)),
            ..Default::default()
        })
        .await?
        .into_inner();
    let id = job_id(&a);
    while matches!(state(&a), Some(JobState::Queued | JobState::Starting)) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        if args.lease.is_some() {
            c.renew_lease(v1::RenewLeaseRequest { id }).await?;
        }
        a = c
            .get_allocation(v1::GetAllocationRequest {
                id,
                wait_ms: ms(left.min(step)),
            })
            .await?
            .into_inner();
    }
    if args.export {
        if state(&a) != Some(JobState::Running) {
            // Nobody would use it: give it back rather than leave it waiting.
            let _ = release(&mut c, id, None, "not placed in time for --export").await;
            return Err(Failure::server(format!(
                "allocation {id} was not placed in time ({}); released",
                reason(&a)
            )));
        }
        for (k, v) in export_env(&a.env) {
            outln!("export {k}={v}");
        }
        return Ok(());
    }
    show_allocation(fmt, &a);
    Ok(())
}

/// The environment for the caller's process, sorted: mmk's interposer goes ahead of the
/// `LD_PRELOAD` the caller has (the same rule `run` and managed jobs follow).
fn export_env(env: &std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = env.clone().into_iter().collect();
    if let Some(mmk) = out.remove("LD_PRELOAD") {
        let own = std::env::var("LD_PRELOAD").ok();
        out.insert(
            "LD_PRELOAD".into(),
            mmk_core::paths::preload_first(&mmk, own.as_deref()),
        );
    }
    out
}

fn show_allocation(fmt: Format, a: &v1::Allocation) {
    let out = allocation_out(a);
    if fmt == Format::Json {
        output::print_json(&out);
        return;
    }
    let j = &out.job;
    outln!("allocation {} ({}): {} {}", j.id, j.name, j.state, j.reason);
    if let Some(p) = &j.assignment {
        outln!(
            "  gpu {} {}@{}, MPS {}%, {}",
            p.gpu,
            p.profile,
            p.start_slice,
            p.mps_share,
            format_mib(j.gpu_memory_mib)
        );
    }
    if let Some(t) = &out.lease_expires_at {
        outln!("  lease until {t}");
    }
    for (k, v) in &out.env {
        outln!("  {k}={v}");
    }
    for m in &out.mounts {
        outln!(
            "  mount {}{}",
            m.host_path,
            if m.read_only { " (read-only)" } else { "" }
        );
    }
}

/// `mmkctl renew ID`.
pub async fn renew(target: &Target, fmt: Format, id: u64) -> Result<(), Failure> {
    let mut c = client(target).await?;
    let a = c
        .renew_lease(v1::RenewLeaseRequest { id })
        .await?
        .into_inner();
    show_allocation(fmt, &a);
    Ok(())
}

/// `mmkctl release ID`.
pub async fn release_cmd(
    target: &Target,
    fmt: Format,
    id: u64,
    exit_code: Option<i32>,
    why: Option<String>,
) -> Result<(), Failure> {
    let mut c = client(target).await?;
    let job = release(&mut c, id, exit_code, why.as_deref().unwrap_or("")).await?;
    output::job_line(fmt, "released", &job);
    Ok(())
}

#[derive(Debug, Args)]
pub struct FitArgs {
    /// The job is online.
    #[arg(long, conflicts_with = "offline")]
    pub online: bool,
    /// The job is offline.
    #[arg(long)]
    pub offline: bool,
    /// The job file (docs/job-spec.md).
    pub file: PathBuf,
}

#[derive(Debug, Serialize)]
struct FitOut {
    verdict: &'static str,
    gpu: Option<u32>,
    profile: Option<String>,
    start_slice: Option<u32>,
    mps_share: Option<u32>,
    reason: String,
    steps: usize,
    moves: Vec<u64>,
    predicted_perf: Option<f64>,
    stp_before: Option<f64>,
    stp_after: Option<f64>,
    cost: Option<f64>,
    costs: Vec<CostOut>,
    planner: String,
}

#[derive(Debug, Serialize)]
struct CostOut {
    job: u64,
    perf_before: f64,
    perf_after: f64,
}

/// `mmkctl fit`: exit 0 when the job fits now or after a reconfiguration, 3 when it would
/// wait, 4 when it never fits on this node.
pub async fn fit(target: &Target, fmt: Format, args: FitArgs) -> Result<u8, Failure> {
    let spec = read_spec(&args.file, flag_class(args.online, args.offline))?;
    let mut c = client(target).await?;
    let r = c
        .fit(v1::FitRequest {
            spec: Some(spec_to_proto(&spec)),
        })
        .await?
        .into_inner();
    use v1::fit_response::Verdict;
    let verdict = Verdict::try_from(r.verdict).unwrap_or(Verdict::Unspecified);
    let (word, code) = match verdict {
        Verdict::Now => ("now", 0),
        Verdict::AfterReconfiguration => ("after-reconfiguration", 0),
        Verdict::Wait => ("wait", 3),
        Verdict::Never => ("never", 4),
        Verdict::Unspecified => ("unknown", 2),
    };
    let a = r.assignment.as_ref();
    let out = FitOut {
        verdict: word,
        gpu: a.map(|a| a.gpu_index),
        profile: a.map(|a| a.profile.clone()),
        start_slice: a.map(|a| a.start_slice),
        mps_share: a.map(|a| a.mps_share),
        reason: r.reason.clone(),
        steps: r.steps.len(),
        moves: r.moves.clone(),
        predicted_perf: r.predicted_perf,
        stp_before: r.stp_before,
        stp_after: r.stp_after,
        cost: r.cost,
        costs: r
            .costs
            .iter()
            .map(|c| CostOut {
                job: c.job_id,
                perf_before: c.perf_before,
                perf_after: c.perf_after,
            })
            .collect(),
        planner: r.planner.clone(),
    };
    if fmt == Format::Json {
        output::print_json(&out);
        return Ok(code);
    }
    let name = &spec.name;
    match (&out.gpu, &out.profile) {
        (Some(gpu), Some(profile)) => outln!(
            "{name}: fits {}: gpu {gpu} {profile}@{}, MPS {}%{}",
            word.replace('-', " "),
            out.start_slice.unwrap_or(0),
            out.mps_share.unwrap_or(0),
            if out.steps > 0 {
                format!(" ({} layout steps)", out.steps)
            } else {
                String::new()
            }
        ),
        _ => outln!("{name}: {word}: {}", out.reason),
    }
    if let Some(p) = out.predicted_perf {
        outln!("  predicted performance {p:.2} (1 = alone on a whole GPU)");
    }
    if let (Some(b), Some(a)) = (out.stp_before, out.stp_after) {
        outln!("  system throughput {b:.2} -> {a:.2}");
    }
    if let Some(cost) = out.cost {
        outln!("  cost to the jobs already here: {cost:.3}");
    }
    for c in &out.costs {
        outln!(
            "    job {}: {:.2} -> {:.2}",
            c.job,
            c.perf_before,
            c.perf_after
        );
    }
    if !out.moves.is_empty() {
        let ids: Vec<String> = out.moves.iter().map(u64::to_string).collect();
        outln!("  moves jobs {}", ids.join(", "));
    }
    outln!("(a dry run: nothing changed)");
    Ok(code)
}

#[derive(Debug, Serialize)]
struct CapacityOut {
    at: Option<String>,
    online_units: u32,
    offline_units: u32,
    unit_mib: u64,
    queued_jobs: u32,
    gpus: Vec<GpuCapacityOut>,
}

#[derive(Debug, Serialize)]
struct GpuCapacityOut {
    gpu: u32,
    uuid: String,
    memory_mib: u64,
    free_memory_mib: u64,
    free_memory_slices: u32,
    online_jobs: u32,
    offline_jobs: u32,
}

fn show_capacity(fmt: Format, c: &v1::Capacity) {
    let out = CapacityOut {
        at: output::time(c.at.as_ref()),
        online_units: c.online_units,
        offline_units: c.offline_units,
        unit_mib: c.unit_mib,
        queued_jobs: c.queued_jobs,
        gpus: c
            .gpus
            .iter()
            .map(|g| GpuCapacityOut {
                gpu: g.index,
                uuid: g.uuid.clone(),
                memory_mib: g.memory_mib,
                free_memory_mib: g.free_memory_mib,
                free_memory_slices: g.free_memory_slices,
                online_jobs: g.online_jobs,
                offline_jobs: g.offline_jobs,
            })
            .collect(),
    };
    if fmt == Format::Json {
        // One line per reading, so that a script can read the stream line by line.
        match serde_json::to_string(&out) {
            Ok(s) => outln!("{s}"),
            Err(e) => eprintln!("mmkctl: cannot encode JSON: {e}"),
        }
        return;
    }
    outln!(
        "{}: room for {} online and {} offline allocations of {}; {} jobs waiting",
        out.at.as_deref().unwrap_or("-"),
        out.online_units,
        out.offline_units,
        format_mib(out.unit_mib),
        out.queued_jobs
    );
    for g in &out.gpus {
        outln!(
            "  gpu {}: {} of {} free, {} free slices, {} online and {} offline jobs",
            g.gpu,
            format_mib(g.free_memory_mib),
            format_mib(g.memory_mib),
            g.free_memory_slices,
            g.online_jobs,
            g.offline_jobs
        );
    }
}

/// `mmkctl capacity [--watch]`.
pub async fn capacity(target: &Target, fmt: Format, watch: bool) -> Result<(), Failure> {
    let mut c = client(target).await?;
    let mut stream = c
        .watch_capacity(v1::WatchCapacityRequest {})
        .await?
        .into_inner();
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            item = stream.next() => match item {
                Some(Ok(cap)) => {
                    show_capacity(fmt, &cap);
                    if !watch {
                        return Ok(());
                    }
                }
                Some(Err(s)) => return Err(s.into()),
                None => return Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests;
