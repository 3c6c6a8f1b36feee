//! Wiring: open the store, pick the backend, start the node, serve gRPC until shutdown.

use std::fs::File;
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use mmk_mps_control::{MpsControl, Program, Supervisor};
use mmk_partitioner::{AnalyticModel, PerfModel};
use mmk_predictor::Predictor;
use mmk_proto::v1::allocation_service_server::AllocationServiceServer;
use mmk_proto::v1::job_service_server::JobServiceServer;
use mmk_proto::v1::node_service_server::NodeServiceServer;
use mmk_proto::v1::partition_service_server::PartitionServiceServer;
use tokio::net::UnixListener;
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tracing::{info, warn};

use crate::backend::GpuBackend;
use crate::backend::nvml::NvmlBackend;
use crate::backend::sim::SimBackend;
use crate::config::{BackendChoice, Config, ModelChoice, MpsChoice};
use crate::grpc::{AllocationApi, JobApi, NodeApi, PartitionApi};
use crate::ksched::{self, KernelSched};
use crate::mps::{FAKE_MPS_ARG, Mps};
use crate::node::Node;
use crate::runner::Runner;
use crate::store::Store;

/// Runs mmkd until `shutdown` resolves: opens it on its data dir, binds its sockets, and
/// serves them ([`Daemon::serve`]).
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let daemon = Daemon::open(config).await?;
    let listeners = Listeners::bind(&daemon.config).await?;
    daemon.serve(listeners, shutdown).await
}

/// The sockets mmkd serves: its Unix socket, and with `--listen` and `--metrics` its TCP
/// listeners. [`Daemon::serve`] serves what it is given, so that a test can run the
/// daemon in-process on sockets of its own.
#[derive(Debug)]
pub struct Listeners {
    pub socket: UnixListener,
    pub tcp: Option<tokio::net::TcpListener>,
    pub metrics: Option<tokio::net::TcpListener>,
}

impl Listeners {
    /// Binds what `config` asks for: the socket (refusing a directory others could swap
    /// it in, or another mmkd's socket), `--listen` and `--metrics`. The default metrics
    /// address taken by something else is left out with a warning.
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let socket = bind_socket(&config.socket, config.socket_group)?;
        let tcp = match config.listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr}"))?,
            ),
            None => None,
        };
        let metrics = match &config.metrics {
            None => None,
            Some(m) => match tokio::net::TcpListener::bind(m.addr).await {
                Ok(l) => Some(l),
                Err(e) if m.default => {
                    warn!(addr = %m.addr, error = %e, "cannot serve metrics at the default address; going on without (--metrics ADDR or off)");
                    None
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("cannot serve metrics on {}", m.addr)));
                }
            },
        };
        Ok(Listeners {
            socket,
            tcp,
            metrics,
        })
    }
}

/// mmkd opened on its data dir: the dir locked, the store open, what a previous mmkd left
/// reconciled and the node's loop started; not serving yet.
#[derive(Debug)]
pub struct Daemon {
    config: Config,
    /// Descriptors mmkd may have: TCP clients get a share of them.
    fds: u64,
    /// One mmkd per data dir: held while it runs.
    _lock: File,
    store: Store,
    node: Node,
    loop_handle: tokio::task::JoinHandle<()>,
    stop_loop: Arc<Notify>,
}

impl Daemon {
    pub async fn open(config: Config) -> anyhow::Result<Daemon> {
        // As many descriptors as the system lets mmkd have; TCP clients get a share of them.
        let fds = crate::tcp::raise_fd_limit();
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("cannot create the data dir {}", config.data_dir.display()))?;
        let meta = std::fs::metadata(&config.data_dir)
            .with_context(|| format!("cannot read the data dir {}", config.data_dir.display()))?;
        check_owner(&config.data_dir, &meta)?;
        let lock = lock_data_dir(&config.data_dir)?;
        // On a full disk the store needs the reserve's room to open (its WAL and shared memory
        // file); mmkd then serves reads and ends, and refuses new jobs until there is room.
        crate::disk::release_reserve_if_full(&config.data_dir);
        let store = match Store::open(&config.data_dir.join("mmk.db")).await {
            Ok(s) => s,
            Err(e) => {
                // Most often a full disk with no reserve left to let go: say so.
                let full = crate::disk::space(&config.data_dir)
                    .ok()
                    .filter(|(free, _)| *free < crate::disk::LOW_WATER);
                return Err(match full {
                    Some((free, _)) => anyhow::Error::new(e).context(format!(
                        "the disk of the data dir {} is full ({} free): free some space there",
                        config.data_dir.display(),
                        crate::disk::bytes_text(free)
                    )),
                    None => e.into(),
                });
            }
        };

        let backend = choose_backend(&config).await?;
        let mps = choose_mps(&config, backend.kind())?;
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        let runner = Runner::new(
            config.data_dir.join("jobs"),
            config.sim_speed,
            config.stop_grace,
            exits_tx,
        )
        .with_log_max(config.job_log_max)
        .with_kernel_sched(choose_ksched(&config)?)
        .with_cgroups(choose_cgroups(&config).await);
        let stop_loop = Arc::new(Notify::new());
        let model = load_model(&config).await?;
        // The SLO control measures online jobs' requests through their gates: without a
        // kernel scheduler that tracks launches it has nothing to act on.
        let slo = config.slo.filter(|_| {
            let measures = runner.kernel_sched().measures_requests();
            if !measures {
                warn!(
                    "SLO control off: it needs the kernel scheduler with a policy that tracks \
                     launches (not --kernel-policy off or passthrough)"
                );
            }
            measures
        });
        // Where the SLO control keeps online jobs' objectives, an offline job that would wait
        // may join beside them past its class's shares.
        let planner = mmk_partitioner::planner_for_node(
            &config.planner,
            model,
            config.offline_share_max,
            slo.map(|s| f64::from(s.default_slowdown_pct) / 100.0),
        )
        .with_context(|| format!("unknown planner {}", config.planner))?;
        info!(
            planner = planner.name(),
            offline_share_max = config.offline_share_max,
            "planner"
        );
        // What a job's folder may take: as set, or a quarter of the data dir's disk.
        let disk = crate::node::DiskConfig {
            data_dir: config.data_dir.clone(),
            policy: crate::disk::Policy {
                job_disk_max: config.job_disk_max.unwrap_or_else(|| {
                    crate::disk::space(&config.data_dir)
                        .map_or(crate::disk::DEFAULT_JOB_DISK_MAX, |(_, size)| {
                            crate::disk::default_job_disk_max(size)
                        })
                }),
                retention: config.job_retention,
            },
        };
        info!(
            job_disk_max = %crate::disk::bytes_text(disk.policy.job_disk_max),
            retention = ?disk.policy.retention,
            "jobs' folders"
        );
        let (node, loop_handle) = Node::start(
            crate::node::Parts {
                store: store.clone(),
                backend,
                planner: planner.into(),
                runner,
                mps,
                disk: Some(disk),
                history: config.history,
                slo,
            },
            exits_rx,
            Arc::clone(&stop_loop),
        )
        .await?;
        Ok(Daemon {
            config,
            fds,
            _lock: lock,
            store,
            node,
            loop_handle,
            stop_loop,
        })
    }

    /// The node, for calls made in-process.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Serves `listeners` until `shutdown` resolves, then stops cleanly: stop accepting,
    /// end watch streams, stop running jobs (their records are reconciled at the next
    /// start), close the store, remove the socket.
    pub async fn serve(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let Daemon {
            config,
            fds,
            _lock,
            store,
            node,
            loop_handle,
            stop_loop,
        } = self;
        let Listeners {
            socket: uds,
            tcp,
            metrics,
        } = listeners;
        let access = Arc::new(config.access.clone());
        info!(socket = %config.socket.display(), data_dir = %config.data_dir.display(), "listening");
        if let Some(l) = &tcp {
            info!(addr = %l.local_addr()?, "listening on tcp (TLS, client certificates)");
        }

        let (stopping_tx, stopping_rx) = watch::channel(false);
        let (health_reporter, health) = serving_health().await;
        // Reflection in both versions: grpcurl and grpcio-reflection still ask v1alpha.
        let reflection_alpha = reflection().build_v1alpha()?;
        let reflection = reflection().build_v1()?;
        // The same services on the Unix socket and, with TLS, on TCP; watch streams are
        // capped across both.
        let watches = Arc::new(crate::grpc::watches::Watches::default());
        let router = |builder: tonic::transport::Server| {
            let mut builder = builder;
            builder
                .add_service(health.clone())
                .add_service(reflection.clone())
                .add_service(reflection_alpha.clone())
                .add_service(JobServiceServer::new(JobApi {
                    node: node.clone(),
                    access: Arc::clone(&access),
                    watches: Arc::clone(&watches),
                    stopping: stopping_rx.clone(),
                }))
                .add_service(AllocationServiceServer::new(AllocationApi {
                    node: node.clone(),
                    access: Arc::clone(&access),
                    watches: Arc::clone(&watches),
                    unit_mib: config.capacity_unit_mib,
                    stopping: stopping_rx.clone(),
                }))
                .add_service(PartitionServiceServer::new(PartitionApi {
                    node: node.clone(),
                    access: Arc::clone(&access),
                }))
                .add_service(NodeServiceServer::new(NodeApi {
                    node: node.clone(),
                    access: Arc::clone(&access),
                }))
        };
        // TLS is done by `tcp`, which also caps connections and drops silent ones.
        let tcp_router = match (&tcp, &config.tls) {
            (Some(_), Some(files)) => Some((
                router(
                    tonic::transport::Server::builder()
                        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
                        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
                        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION),
                ),
                Arc::new(tls_config(files)?),
            )),
            _ => None,
        };
        let uds_router = router(tonic::transport::Server::builder());

        if let Some(k) = config.kubelet.clone() {
            info!(dir = %k.kubelet_dir.display(), "kubernetes device plugin");
            crate::k8s::start(node.clone(), k, stopping_rx);
        }
        let (closed_tx, _) = tokio::sync::broadcast::channel::<()>(1);
        let closed = |tx: &tokio::sync::broadcast::Sender<()>| {
            let mut rx = tx.subscribe();
            async move {
                let _ = rx.recv().await;
            }
        };
        let uds_server = uds_router
            .serve_with_incoming_shutdown(UnixListenerStream::new(uds), closed(&closed_tx));
        let tcp_server = async {
            match (tcp, tcp_router) {
                (Some(l), Some((router, tls))) => {
                    let conns = crate::tcp::incoming(
                        l,
                        Some(tls),
                        crate::tcp::api_limits(fds),
                        crate::tcp::Opening::Http2,
                        "api",
                    );
                    router
                        .serve_with_incoming_shutdown(
                            ReceiverStream::new(conns),
                            closed(&closed_tx),
                        )
                        .await
                }
                _ => Ok(()),
            }
        };
        if let Some(l) = metrics {
            serve_metrics(l, &config, node.clone(), closed(&closed_tx));
        }
        let servers = async { tokio::try_join!(uds_server, tcp_server) };
        tokio::pin!(servers);
        let mut loop_handle = loop_handle;
        let mut loop_died = None;
        tokio::select! {
            res = &mut servers => { res?; }
            res = &mut loop_handle => {
                // The scheduling loop never ends by itself: without it no job would start
                // or end, so mmkd stops rather than accept work it cannot do.
                loop_died = Some(match res {
                    Err(e) if e.is_panic() => "the scheduling loop panicked".to_owned(),
                    _ => "the scheduling loop ended".to_owned(),
                });
                let _ = stopping_tx.send(true);
                let _ = closed_tx.send(());
                let _ = tokio::time::timeout(DRAIN, &mut servers).await;
            }
            () = shutdown => {
                info!("shutting down");
                health_reporter.set_not_serving::<JobServiceServer<JobApi>>().await;
                let _ = stopping_tx.send(true);
                let _ = closed_tx.send(());
                if tokio::time::timeout(DRAIN, &mut servers).await.is_err() {
                    warn!(after = ?DRAIN, "requests still open at shutdown; closing them");
                }
            }
        }
        if loop_died.is_none() {
            stop_loop.notify_one();
            let _ = loop_handle.await;
        }
        stop_node(&node, &store, &config.socket).await;
        if let Some(why) = loop_died {
            bail!("{why}; job records are reconciled at the next start");
        }
        info!("stopped");
        Ok(())
    }
}

/// How long open requests get to finish at shutdown.
const DRAIN: Duration = Duration::from_secs(10);

/// The metrics server on `l`, as a task of its own until `closed`; beyond loopback only
/// with TLS and client certificates (checked at start).
fn serve_metrics(
    l: tokio::net::TcpListener,
    config: &Config,
    node: Node,
    closed: impl Future<Output = ()> + Send + 'static,
) {
    let beyond_loopback = config
        .metrics
        .as_ref()
        .is_some_and(|m| !m.addr.ip().is_loopback());
    let tls = config.tls.clone().filter(|_| beyond_loopback);
    let serving = crate::metrics::serve(l, node, tls, closed);
    tokio::spawn(async move {
        if let Err(e) = serving.await {
            warn!(error = %format!("{e:#}"), "metrics server stopped");
        }
    });
}

/// Reflection of mmkd's services and of health.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(mmk_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// The health service, with mmkd's four services serving.
async fn serving_health() -> (
    tonic_health::server::HealthReporter,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<JobServiceServer<JobApi>>().await;
    reporter
        .set_serving::<PartitionServiceServer<PartitionApi>>()
        .await;
    reporter.set_serving::<NodeServiceServer<NodeApi>>().await;
    reporter
        .set_serving::<AllocationServiceServer<AllocationApi>>()
        .await;
    (reporter, health)
}

/// After serving: running jobs stopped (their records are reconciled at the next start),
/// cgroups and MPS daemons gone, the store closed, the socket removed.
async fn stop_node(node: &Node, store: &Store, socket: &Path) {
    node.runner().stop_all().await;
    if let Some(c) = node.runner().cgroups() {
        c.teardown();
    }
    node.mps().stop_all().await;
    store.close().await;
    let _ = std::fs::remove_file(socket);
}

async fn choose_backend(config: &Config) -> anyhow::Result<Arc<dyn GpuBackend>> {
    let nvml = match config.backend {
        BackendChoice::Sim => None,
        BackendChoice::Nvml | BackendChoice::Auto => {
            let (lib, mig_gpus, take_over) = (
                config.nvml_lib.clone(),
                config.mig_gpus.clone(),
                config.mig_take_over,
            );
            let made = tokio::task::spawn_blocking(move || {
                NvmlBackend::new(lib.as_deref(), mig_gpus, take_over)
            });
            match made.await? {
                Ok(b) => Some(b),
                Err(e) if config.backend == BackendChoice::Nvml => {
                    return Err(e).context("--backend nvml: no usable GPU");
                }
                Err(e) => {
                    info!(reason = %e, "no NVML GPU; using the simulated node");
                    None
                }
            }
        }
    };
    if let Some(b) = nvml {
        let gpus = b.gpus()?;
        info!(backend = "nvml", gpus = gpus.len(), models = %gpus.iter().map(|g| g.model.product_name.as_str()).collect::<Vec<_>>().join(","), "backend: nvml (real GPUs)");
        return Ok(Arc::new(b));
    }
    let b = SimBackend::new(
        config.sim_gpus.clone(),
        Some(config.data_dir.join("sim-node.json")),
        config.sim_speed,
    );
    let models: Vec<&str> = config.sim_gpus.iter().map(|m| m.key.as_str()).collect();
    info!(backend = "sim", gpus = %models.join(","), speed = config.sim_speed, "backend: sim (simulated node)");
    Ok(Arc::new(b))
}

/// The planner's performance model: the predictor's model file when one is given (a bad
/// file stops mmkd with the reason), else the analytic model.
async fn load_model(config: &Config) -> anyhow::Result<Arc<dyn PerfModel>> {
    let started = std::time::Instant::now();
    let (p, shown) = match &config.model {
        ModelChoice::Analytic => {
            info!("performance model: analytic (--model analytic)");
            return Ok(Arc::new(AnalyticModel::default()));
        }
        ModelChoice::Builtin => {
            let p = tokio::task::spawn_blocking(mmk_predictor::shipped::load)
                .await?
                .context("the built-in model")?;
            (p, mmk_predictor::shipped::NAME.to_owned())
        }
        ModelChoice::File(path) => {
            let shown = path.display().to_string();
            let path = path.clone();
            let p = tokio::task::spawn_blocking(move || Predictor::load(&path))
                .await?
                .with_context(|| format!("--model {shown}"))?;
            (p, shown)
        }
    };
    info!(
        model = %shown,
        forest = %p.params,
        trained_rows = p.rows,
        cv_error_pct = p.cv_error_pct().map(|e| (e * 100.0).round() / 100.0),
        load_ms = started.elapsed().as_millis() as u64,
        "performance model: random forest"
    );
    Ok(Arc::new(p))
}

/// The MPS control program: the real one with real GPUs, mmkd itself as the fake with
/// the simulated node (docs/mmkd.md, "MPS").
/// The kernel scheduler: the configured interposer (which must exist), else the one next to
/// mmkd; off when the policy is `off` or no interposer was built.
fn choose_ksched(config: &Config) -> anyhow::Result<KernelSched> {
    let Some(policy) = config.kernel_policy else {
        info!("kernel scheduler off (--kernel-policy off)");
        return Ok(KernelSched::off());
    };
    if config.kernel_offline_depth > 0 && policy != mmk_kernel_sched::PolicyKind::Mmk {
        warn!(
            %policy,
            "--kernel-offline-depth acts only under the mmk policy; partitions under {policy} ignore it"
        );
    }
    if config.kernel_device_wait.is_some() && policy == mmk_kernel_sched::PolicyKind::Passthrough {
        warn!(
            "--kernel-device-wait acts only under a policy that tracks completions (mmk, orion, fikit); \
             partitions under passthrough ignore it"
        );
    }
    let tuned = |k: KernelSched| {
        k.with_tuning(config.kernel_offline_depth, config.kernel_base)
            .with_gemm_slice(config.kernel_gemm_slice)
            .with_device_wait(config.kernel_device_wait)
            .with_hold_budget(config.kernel_hold_budget)
    };
    let dir = &config.kernel_gate_dir;
    let open = |path: std::path::PathBuf| {
        KernelSched::new(path, policy, dir)
            .map(tuned)
            .map_err(|e| anyhow::Error::new(e).context("kernel scheduler"))
    };
    if let Some(path) = &config.interposer {
        ksched::check_interposer(path)?;
        return open(path.clone());
    }
    if let Some(path) = ksched::default_interposer() {
        return open(path);
    }
    // The one this mmkd was built with, written where every job can load it.
    match config.carried.interposer {
        Some(bytes) => match ksched::carried_interposer(bytes, &config.data_dir) {
            Ok(path) => {
                info!(path = %path.display(), "the interposer mmkd carries is in place");
                open(path)
            }
            Err(e) => {
                warn!(
                    error = %e,
                    dir = %config.data_dir.display(),
                    "kernel scheduler off: cannot write the interposer mmkd carries into its data dir"
                );
                Ok(KernelSched::off())
            }
        },
        None => {
            warn!(
                "kernel scheduler off: this mmkd carries no interposer (a cross build) and \
                 none is installed next to it or in ../lib/mmk; build one for the node \
                 (cargo build --release -p mmk-interposer) and pass --interposer PATH"
            );
            Ok(KernelSched::off())
        }
    }
}

/// Each job in a cgroup of its own where mmkd may make them; else (said once) a job is its
/// process group. What the jobs of an earlier mmkd left in their cgroups is killed.
async fn choose_cgroups(config: &Config) -> Option<crate::cgroup::Cgroups> {
    let data_dir = config.data_dir.clone();
    let made = tokio::task::spawn_blocking(move || {
        let c = crate::cgroup::Cgroups::setup(&data_dir)?;
        let killed = c.clear_leftovers();
        if killed > 0 {
            warn!(killed, "killed processes that jobs of an earlier mmkd left");
        }
        Ok::<_, String>(c)
    })
    .await;
    match made {
        Ok(Ok(c)) => Some(c),
        Ok(Err(why)) => {
            warn!(
                why,
                "jobs are not contained in cgroups: a job is its process group, and a process it starts in a new session can outlive it"
            );
            None
        }
        Err(e) => {
            warn!(error = %e, "jobs are not contained in cgroups");
            None
        }
    }
}

fn choose_mps(config: &Config, backend: &str) -> anyhow::Result<Mps> {
    let fake = || -> anyhow::Result<Program> {
        let exe = std::env::current_exe().context("cannot find the mmkd executable")?;
        Ok(Program::with_prefix(exe, vec![FAKE_MPS_ARG.into()]))
    };
    let program = match (config.mps, backend) {
        (MpsChoice::Off, _) => None,
        (MpsChoice::Fake, _) | (MpsChoice::Auto, "sim") => Some(fake()?),
        (MpsChoice::Nvidia, _) => {
            let path = find_program(&config.mps_control).with_context(|| {
                format!(
                    "--mps nvidia: cannot find {}; install the NVIDIA driver's MPS tools or use --mps-control PATH",
                    config.mps_control.display()
                )
            })?;
            Some(Program::new(path))
        }
        (MpsChoice::Auto, _) => match find_program(&config.mps_control) {
            Some(path) => Some(Program::new(path)),
            None => {
                warn!(
                    program = %config.mps_control.display(),
                    "no MPS control program; MPS is off (jobs that share a partition share it without MPS)"
                );
                None
            }
        },
    };
    let Some(program) = program else {
        info!("mps: off");
        return Ok(Mps::off());
    };
    info!(control = %program.name(), check_every = ?config.mps_check_interval, "mps: one control daemon per partition");
    Ok(Mps::new(
        Supervisor::new(Arc::new(program), config.data_dir.join("mps")),
        config.mps_check_interval,
    ))
}

/// `path` when it names an executable file, else the first executable of that name in
/// PATH.
fn find_program(path: &Path) -> Option<std::path::PathBuf> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if path.components().count() > 1 {
        return executable(path).then(|| path.to_path_buf());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(path))
        .find(|p| executable(p))
}

/// One mmkd per data dir: an exclusive lock on `mmkd.lock`, held while mmkd runs.
fn lock_data_dir(dir: &Path) -> anyhow::Result<File> {
    let path = dir.join("mmkd.lock");
    let f = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    if crate::os::lock_exclusive(&f).is_err() {
        bail!(
            "another mmkd is using the data dir {} (it holds {})",
            dir.display(),
            path.display()
        );
    }
    Ok(f)
}

/// The TCP listener's TLS: mmkd's certificate and key, and the client CA whose
/// certificates it requires; a key other users may read is refused.
fn tls_config(files: &crate::tcp::TlsFiles) -> anyhow::Result<rustls::ServerConfig> {
    let key_meta = std::fs::metadata(&files.key)
        .with_context(|| format!("cannot read the TLS key {}", files.key.display()))?;
    if key_meta.permissions().mode() & 0o077 != 0 {
        bail!(
            "the TLS key {} is readable by other users (mode {:o}); chmod 600 it",
            files.key.display(),
            key_meta.permissions().mode() & 0o777
        );
    }
    crate::tcp::server_config(files, &[b"h2"])
}

/// A TCP client that answers no HTTP/2 ping for this long after one is sent (every
/// `KEEPALIVE_INTERVAL`) is dropped, and so are its calls.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Calls one TCP connection may have open at once.
const MAX_STREAMS_PER_CONNECTION: u32 = 256;

/// Refuses a directory owned by someone else than mmkd's user or root.
fn check_owner(dir: &Path, meta: &std::fs::Metadata) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = crate::os::euid();
    if meta.uid() != me && meta.uid() != 0 {
        bail!(
            "{} belongs to uid {}, not to mmkd's user (uid {me}); another user may have made it \
             to take mmkd's place: remove it or choose another path",
            dir.display(),
            meta.uid()
        );
    }
    Ok(())
}

/// Binds the Unix socket (mode 0660, of `group` when given), replacing a stale socket file
/// but never a live one.
fn bind_socket(path: &Path, group: Option<u32>) -> anyhow::Result<UnixListener> {
    if let Some(parent) = path.parent() {
        if !parent.exists() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
            let _ = std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755));
        }
        // Whoever can write the directory can swap the socket for their own: refuse a
        // directory that another user owns (a /tmp/mmk-UID made by someone else), or that
        // others may write, unless it is sticky (like /tmp).
        let meta = std::fs::metadata(parent)
            .with_context(|| format!("cannot read {}", parent.display()))?;
        check_owner(parent, &meta)?;
        let mode = meta.permissions().mode();
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            bail!(
                "{} is writable by other users (mode {:o}); choose another --socket or fix its mode",
                parent.display(),
                mode & 0o7777
            );
        }
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another mmkd is listening on {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let l =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    if let Some(gid) = group {
        std::os::unix::fs::lchown(path, None, Some(gid))
            .with_context(|| format!("cannot give {} to group {gid}", path.display()))?;
    }
    Ok(l)
}
