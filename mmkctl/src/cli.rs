//! The commands: flags (clap derive) and what each one does.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use mmk_core::{JobClass, JobState, paths};
use mmk_proto::v1;
use mmk_proto::{class_to_proto, spec_to_proto, state_to_proto};
use tokio_stream::StreamExt;

use crate::client::{Target, connect};
use crate::output;

/// mmkctl: submit and watch GPU jobs, and see how mmk partitions the node's GPUs.
#[derive(Debug, Parser)]
#[command(name = "mmkctl", version, about, long_about = None)]
pub struct Cli {
    /// mmkd's Unix socket [default: the node's, /run/mmk/mmkd.sock, when /run/mmk exists;
    /// else the user's own mmkd's, $XDG_RUNTIME_DIR/mmk/mmkd.sock or /tmp/mmk-$UID/mmkd.sock].
    #[arg(long, global = true, value_name = "PATH", env = paths::SOCKET_ENV, conflicts_with = "endpoint")]
    pub socket: Option<PathBuf>,
    /// mmkd's TCP endpoint, such as https://node1:7400; needs --tls-ca, --tls-cert and
    /// --tls-key (mmkd serves TCP only with TLS).
    #[arg(long, global = true, value_name = "URL")]
    pub endpoint: Option<String>,
    /// With --endpoint: the CA that signed mmkd's certificate (PEM).
    #[arg(long, global = true, value_name = "PATH", env = "MMK_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// With --endpoint: mmkctl's client certificate (PEM); its common name is your user
    /// name on mmkd's node.
    #[arg(long, global = true, value_name = "PATH", env = "MMK_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// With --endpoint: the client certificate's private key (PEM).
    #[arg(long, global = true, value_name = "PATH", env = "MMK_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Output format: a table for people, or JSON for scripts (docs/mmkctl.md).
    #[arg(long, global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    #[command(subcommand)]
    pub command: Command,
}

pub use mmk_cli::{Failure, Format, read_spec};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit a job described by a job.yaml (docs/job-spec.md).
    Submit(SubmitArgs),
    /// List jobs, or get, cancel and watch them.
    Jobs(JobsArgs),
    /// Show how the GPUs are partitioned.
    Partitions {
        #[command(subcommand)]
        command: PartitionsCommand,
    },
    /// List the node's GPUs, their MIG profiles and free capacity.
    Gpus,
    /// A live view of each GPU's partitions and jobs: share, memory, GPU time and time
    /// held, redrawn every second; `q` quits, `--once` prints one frame.
    Top(crate::top::TopArgs),
    /// What mmkd learned of your jobs' GPU use, by job signature (an operator sees every
    /// user's); the planner uses a profile once it says USED yes.
    Profiles,
    /// `simulate`, `profile` and `predictor` moved to `mmk-lab`, the lab's program; these
    /// hidden commands say so.
    #[command(hide = true, disable_help_flag = true)]
    Simulate(MovedToLab),
    #[command(hide = true, disable_help_flag = true)]
    Profile(MovedToLab),
    #[command(hide = true, disable_help_flag = true)]
    Predictor(MovedToLab),
    /// Run a command in an mmk partition (attached mode): allocate, start it with the
    /// allocation's environment, release when it exits; exits with its code.
    Run(crate::attach::RunArgs),
    /// Reserve a partition and a share for a process you start yourself (attached mode).
    Allocate(crate::attach::AllocateArgs),
    /// Renew an allocation's lease.
    Renew { id: u64 },
    /// End an allocation.
    Release {
        id: u64,
        /// The exit code of the process that used it (not 0: the allocation is FAILED).
        #[arg(long, allow_negative_numbers = true)]
        exit_code: Option<i32>,
        /// Recorded with it.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Would this node take the job now, where, and at what cost to the jobs already
    /// here? A dry run; exit 0 fits, 3 would wait, 4 never fits.
    Fit(crate::attach::FitArgs),
    /// The node's free capacity; with --watch, each change until interrupted.
    Capacity {
        #[arg(long)]
        watch: bool,
    },
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The job is online (latency-sensitive).
    #[arg(long, conflicts_with = "offline")]
    pub online: bool,
    /// The job is offline (batch).
    #[arg(long)]
    pub offline: bool,
    /// The job file.
    pub file: PathBuf,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct JobsArgs {
    #[command(subcommand)]
    pub command: Option<JobsCommand>,
    /// Only jobs in this state (repeatable).
    #[arg(long, value_parser = parse_state)]
    pub state: Vec<JobState>,
    /// Only jobs of this class.
    #[arg(long, value_parser = parse_class)]
    pub class: Option<JobClass>,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Show one job, with where it runs or why it waits.
    Get { id: u64 },
    /// Cancel a job; a running job is stopped first (SIGTERM, then SIGKILL).
    Cancel {
        id: u64,
        /// Recorded with the job.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Print a command job's output (stdout.log, or stderr.log with --stderr).
    Logs {
        id: u64,
        /// The job's stderr instead of its stdout.
        #[arg(long)]
        stderr: bool,
        /// Keep printing what the job writes until it ends.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Print job events as they happen, until interrupted.
    Watch {
        /// Only this job.
        id: Option<u64>,
        /// First print every job's current state.
        #[arg(long)]
        current: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PartitionsCommand {
    /// Draw each GPU's memory slices with the instances placed on them and their jobs.
    Show,
    /// A dry run: how the planner would change the layout and place these jobs if they
    /// were submitted now. Nothing changes on the node.
    Plan {
        /// The jobs are online.
        #[arg(long, conflicts_with = "offline")]
        online: bool,
        /// The jobs are offline.
        #[arg(long)]
        offline: bool,
        /// Job files (docs/job-spec.md).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// The MIG layout as a config for NVIDIA's tools: the current one, or, given job
    /// files, the one a dry run of them would make (docs/mmkctl.md).
    Export {
        /// The config format.
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// The config's name in the file (`nvidia-mig-parted apply -c NAME`).
        #[arg(long, default_value = "mmk")]
        name: String,
        /// The jobs are online.
        #[arg(long, conflicts_with = "offline")]
        online: bool,
        /// The jobs are offline.
        #[arg(long)]
        offline: bool,
        /// Job files to plan (docs/job-spec.md); none: the current layout.
        files: Vec<PathBuf>,
    },
}

/// The arguments of a command that moved to `mmk-lab`, whatever they are.
#[derive(Debug, Args)]
pub struct MovedToLab {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    _args: Vec<String>,
}

/// The answer to a lab command asked of mmkctl.
fn moved_to_lab(command: &str) -> Failure {
    Failure::usage(format!(
        "`mmkctl {command}` is now `mmk-lab {command}`: the lab's tools are apart from the \
         node's client (lab/README.md; build it with `cargo build --release -p mmk-lab`)"
    ))
}

/// What `partitions export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// NVIDIA MIG Partition Editor (`nvidia-mig-parted`), `version: v1`.
    MigParted,
}

/// The job files of `partitions plan` and `export`, read and checked.
fn read_specs(
    files: &[PathBuf],
    class: Option<JobClass>,
) -> Result<Vec<mmk_core::JobSpec>, Failure> {
    files.iter().map(|f| read_spec(f, class)).collect()
}

/// A dry run of `specs` on the node.
async fn plan_jobs(
    c: &mut crate::client::Clients,
    specs: &[mmk_core::JobSpec],
) -> Result<v1::PlanJobsResponse, Failure> {
    Ok(c.partitions
        .plan_jobs(v1::PlanJobsRequest {
            specs: specs.iter().map(spec_to_proto).collect(),
        })
        .await?
        .into_inner())
}

fn parse_state(s: &str) -> Result<JobState, String> {
    s.parse()
}

fn parse_class(s: &str) -> Result<JobClass, String> {
    s.parse()
}

/// Runs a command; returns mmkctl's exit code (`run` and `fit` have their own).
pub async fn run(cli: Cli) -> Result<u8, Failure> {
    let target = match (&cli.endpoint, cli.socket) {
        (Some(e), _) => match (cli.tls_ca, cli.tls_cert, cli.tls_key) {
            (Some(ca), Some(cert), Some(key)) => {
                Target::Endpoint(e.clone(), crate::client::TlsFiles { ca, cert, key })
            }
            _ => {
                return Err(Failure::usage(
                    "--endpoint needs --tls-ca, --tls-cert and --tls-key: mmkd serves TCP only \
                     with TLS and client certificates (docs/security.md)",
                ));
            }
        },
        (None, Some(p)) => Target::Socket(p),
        (None, None) => Target::Socket(paths::client_socket()),
    };
    let fmt = cli.output;
    match cli.command {
        Command::Run(args) => crate::attach::run(&target, args).await,
        Command::Fit(args) => crate::attach::fit(&target, fmt, args).await,
        command => run_command(&target, fmt, command).await.map(|()| 0),
    }
}

async fn run_command(target: &Target, fmt: Format, command: Command) -> Result<(), Failure> {
    let target = target.clone();
    match command {
        Command::Run(_) | Command::Fit(_) => unreachable!("handled by run"),
        Command::Allocate(args) => crate::attach::allocate(&target, fmt, args).await,
        Command::Renew { id } => crate::attach::renew(&target, fmt, id).await,
        Command::Release {
            id,
            exit_code,
            reason,
        } => crate::attach::release_cmd(&target, fmt, id, exit_code, reason).await,
        Command::Capacity { watch } => crate::attach::capacity(&target, fmt, watch).await,
        Command::Simulate(_) => Err(moved_to_lab("simulate")),
        Command::Profile(_) => Err(moved_to_lab("profile")),
        Command::Predictor(_) => Err(moved_to_lab("predictor")),
        Command::Submit(args) => submit(&target, fmt, args).await,
        Command::Jobs(args) => match args.command {
            None => list(&target, fmt, &args.state, args.class).await,
            Some(JobsCommand::Get { id }) => {
                let mut c = connect(&target).await?;
                let job = c.jobs.get_job(v1::GetJobRequest { id }).await?.into_inner();
                output::job_detail(fmt, &job);
                Ok(())
            }
            Some(JobsCommand::Cancel { id, reason }) => {
                let mut c = connect(&target).await?;
                let job = c
                    .jobs
                    .cancel_job(v1::CancelJobRequest {
                        id,
                        reason: reason.unwrap_or_default(),
                    })
                    .await?
                    .into_inner();
                output::job_line(fmt, "cancelled", &job);
                Ok(())
            }
            Some(JobsCommand::Watch { id, current }) => watch(&target, fmt, id, current).await,
            Some(JobsCommand::Logs { id, stderr, follow }) => {
                logs(&target, id, stderr, follow).await
            }
        },
        Command::Partitions {
            command:
                PartitionsCommand::Plan {
                    online,
                    offline,
                    files,
                },
        } => {
            let specs = read_specs(&files, flag_class(online, offline))?;
            let mut c = connect(&target).await?;
            let resp = plan_jobs(&mut c, &specs).await?;
            output::plan(fmt, &files, &resp);
            Ok(())
        }
        Command::Partitions {
            command:
                PartitionsCommand::Export {
                    format: ExportFormat::MigParted,
                    name,
                    online,
                    offline,
                    files,
                },
        } => {
            crate::export::check_name(&name).map_err(|e| Failure::usage(e.to_string()))?;
            let specs = read_specs(&files, flag_class(online, offline))?;
            let mut c = connect(&target).await?;
            let now = c
                .partitions
                .list_partitions(v1::ListPartitionsRequest {})
                .await?
                .into_inner();
            let mut layout = crate::export::current(&now);
            if !specs.is_empty() {
                let plan = plan_jobs(&mut c, &specs).await?;
                layout = crate::export::after(layout, &plan.steps)
                    .map_err(|e| Failure::server(e.to_string()))?;
            }
            output::mig_parted(fmt, &crate::export::mig_parted(&layout, &name));
            Ok(())
        }
        Command::Partitions {
            command: PartitionsCommand::Show,
        } => {
            let mut c = connect(&target).await?;
            let resp = c
                .partitions
                .list_partitions(v1::ListPartitionsRequest {})
                .await?
                .into_inner();
            output::partitions(fmt, &resp);
            Ok(())
        }
        Command::Top(args) => crate::top::run(&target, fmt, args).await,
        Command::Profiles => {
            let mut c = connect(&target).await?;
            let resp = c
                .node
                .list_profiles(v1::ListProfilesRequest {})
                .await?
                .into_inner();
            output::profiles(fmt, &resp);
            Ok(())
        }
        Command::Gpus => {
            let mut c = connect(&target).await?;
            let node = c.node.get_node(v1::GetNodeRequest {}).await?.into_inner();
            output::gpus(fmt, &node);
            Ok(())
        }
    }
}

pub(crate) fn flag_class(online: bool, offline: bool) -> Option<JobClass> {
    match (online, offline) {
        (true, _) => Some(JobClass::Online),
        (_, true) => Some(JobClass::Offline),
        _ => None,
    }
}

async fn submit(target: &Target, fmt: Format, args: SubmitArgs) -> Result<(), Failure> {
    let path = args.file.display().to_string();
    let spec = read_spec(&args.file, flag_class(args.online, args.offline))?;
    let mut c = connect(target).await?;
    let resp = c
        .jobs
        .submit_job(v1::SubmitJobRequest {
            spec: Some(spec_to_proto(&spec)),
            ..Default::default()
        })
        .await
        .map_err(|s| {
            let mut f = Failure::from(s);
            f.message = format!("{path}: {}", f.message);
            f
        })?
        .into_inner();
    let job = resp
        .job
        .ok_or_else(|| Failure::server("mmkd answered without the job"))?;
    output::job_line(fmt, "submitted", &job);
    Ok(())
}

async fn list(
    target: &Target,
    fmt: Format,
    states: &[JobState],
    class: Option<JobClass>,
) -> Result<(), Failure> {
    let mut c = connect(target).await?;
    // mmkd answers in pages; follow them to the end.
    let mut jobs = Vec::new();
    let mut token = String::new();
    loop {
        let resp = c
            .jobs
            .list_jobs(v1::ListJobsRequest {
                states: states.iter().map(|s| state_to_proto(*s) as i32).collect(),
                class: class.map_or(0, |c| class_to_proto(c) as i32),
                page_size: 0,
                page_token: token,
            })
            .await?
            .into_inner();
        jobs.extend(resp.jobs);
        if resp.next_page_token.is_empty() {
            break;
        }
        token = resp.next_page_token;
    }
    output::job_table(fmt, &jobs);
    Ok(())
}

async fn watch(
    target: &Target,
    fmt: Format,
    id: Option<u64>,
    current: bool,
) -> Result<(), Failure> {
    let mut c = connect(target).await?;
    let mut stream = c
        .jobs
        .watch_jobs(v1::WatchJobsRequest {
            job_id: id.unwrap_or(0),
            include_current: current,
        })
        .await?
        .into_inner();
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            ev = stream.next() => match ev {
                Some(Ok(ev)) => output::event(fmt, &ev),
                Some(Err(s)) => return Err(s.into()),
                None => return Ok(()),
            },
        }
    }
}

/// Prints a job's log file; with `follow`, keeps printing what is appended until the job
/// has ended and everything it wrote is out. mmkctl runs on the node, so it reads the file
/// where mmkd keeps it.
async fn logs(target: &Target, id: u64, stderr: bool, follow: bool) -> Result<(), Failure> {
    use std::io::{Read, Seek, SeekFrom};

    let mut c = connect(target).await?;
    let job = c.jobs.get_job(v1::GetJobRequest { id }).await?.into_inner();
    if job.log_dir.is_empty() {
        return Err(Failure::usage(format!(
            "job {id} runs a simulated workload; it has no logs"
        )));
    }
    let path =
        std::path::Path::new(&job.log_dir).join(if stderr { "stderr.log" } else { "stdout.log" });
    let mut pos = 0u64;
    loop {
        // Read what is new; the file appears when the job starts.
        if let Ok(mut f) = std::fs::File::open(&path) {
            // A log past its cap starts again (its earlier part is now NAME.1).
            if f.metadata().is_ok_and(|m| m.len() < pos) {
                pos = 0;
            }
            f.seek(SeekFrom::Start(pos))
                .map_err(|e| Failure::server(format!("cannot read {}: {e}", path.display())))?;
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)
                .map_err(|e| Failure::server(format!("cannot read {}: {e}", path.display())))?;
            pos += buf.len() as u64;
            mmk_cli::stdout::bytes(&buf);
        } else if !follow {
            return Err(Failure::server(format!(
                "job {id} has no log yet ({} does not exist)",
                path.display()
            )));
        }
        if !follow {
            return Ok(());
        }
        let job = c.jobs.get_job(v1::GetJobRequest { id }).await?.into_inner();
        let ended = mmk_proto::state_from_proto(job.state).is_some_and(|s| s.is_terminal());
        let size = std::fs::metadata(&path).map_or(0, |m| m.len());
        if ended && size <= pos {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            () = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
        }
    }
}
