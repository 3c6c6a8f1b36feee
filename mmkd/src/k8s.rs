//! The Kubernetes device plugin (kubelet device-plugin API v1beta1), served by mmkd when
//! `--kubelet-dir` is set. docs/cluster.md says how to deploy it.
//!
//! Two extended resources, `mmk.io/online` and `mmk.io/offline`, one plugin socket each
//! in the kubelet's device-plugin directory. A device is one unit of capacity: GPU memory
//! of `--capacity-unit`, with the SM share the planner gives it. There are always
//! [`DEVICES`] device IDs per resource; those held by containers, plus as many free ones
//! as the planner would start now (AllocationService.WatchCapacity's units), are Healthy,
//! the rest Unhealthy, so the kubelet's allocatable count follows mmk's capacity,
//! whoever uses it (Slurm, `mmkctl run`, other pods).
//!
//! Allocate turns a container's N devices into one attached allocation of N units and
//! answers with its environment and mounts. The device-plugin API has no "container
//! ended" call, so the plugin asks the kubelet's pod-resources API (List) every
//! `--kubelet-check-interval`: an allocation whose devices no pod holds any more, in two
//! lists in a row, is released; the others have their lease renewed. While the kubelet
//! cannot be asked, leases are renewed (nothing is freed on a guess).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use mmk_core::spec::AttachedSpec;
use mmk_core::{
    FieldError, JobClass, JobSpec, JobState, RestartPolicy, ServiceError, ServiceResult, Task,
};
use mmk_proto::k8s::deviceplugin::v1beta1 as dp;
use mmk_proto::k8s::podresources::v1 as pr;
use mmk_proto::unix_channel;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::node::Node;

/// Device IDs per resource: the most units the plugin can advertise.
pub const DEVICES: u32 = 64;
/// The resource names' domain.
pub const DOMAIN: &str = "mmk.io";
/// How long a call to the kubelet may take: one that hangs must not stop the check, and
/// so the leases' renewal.
const KUBELET_TIMEOUT: Duration = Duration::from_secs(5);
/// The lease of a container's allocation; the check renews it.
const LEASE: Duration = Duration::from_secs(60);
/// How long Allocate waits for a placement before it refuses the container.
const PLACE_WAIT: Duration = Duration::from_secs(20);
/// The longest `--kubelet-check-interval`: leases are renewed several times each.
pub const MAX_CHECK: Duration = Duration::from_secs(20);
/// Lists in a row without a container's devices before its allocation is released.
const MISSES: u32 = 2;

#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The kubelet's device-plugin directory (kubelet.sock is there).
    pub kubelet_dir: PathBuf,
    /// The kubelet's pod-resources socket.
    pub pod_resources: PathBuf,
    pub unit_mib: u64,
    pub check_every: Duration,
}

/// An allocation a container holds.
#[derive(Debug, Clone)]
struct Held {
    class: JobClass,
    devices: Vec<String>,
    /// Lists in a row that did not show its devices.
    misses: u32,
}

#[derive(Debug, Default)]
struct State {
    /// Allocation (job) ID -> what holds it.
    held: HashMap<u64, Held>,
}

#[derive(Debug, Clone)]
struct Plugin {
    node: Node,
    cfg: Arc<PluginConfig>,
    class: JobClass,
    state: Arc<Mutex<State>>,
    /// Told when the plugin's own allocations change, so the device lists follow.
    changed: broadcast::Sender<()>,
}

fn resource(class: JobClass) -> String {
    format!("{DOMAIN}/{}", class.as_str())
}

fn endpoint(class: JobClass) -> String {
    format!("mmk-{}.sock", class.as_str())
}

fn device_id(class: JobClass, i: u32) -> String {
    format!("{}-{i}", class.as_str())
}

impl Plugin {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every device ID with its health: held ones and `free_units` free ones are Healthy.
    async fn devices(&self) -> Result<Vec<dp::Device>, Status> {
        let cap = self
            .node
            .capacity(self.cfg.unit_mib)
            .await
            .map_err(mmk_proto::service_error_to_status)?;
        let free_units = match self.class {
            JobClass::Online => cap.online_units,
            JobClass::Offline => cap.offline_units,
        };
        let held: Vec<String> = self
            .state()
            .held
            .values()
            .filter(|h| h.class == self.class)
            .flat_map(|h| h.devices.clone())
            .collect();
        let mut free_left = free_units;
        Ok((0..DEVICES)
            .map(|i| {
                let id = device_id(self.class, i);
                let healthy = if held.contains(&id) {
                    true
                } else if free_left > 0 {
                    free_left -= 1;
                    true
                } else {
                    false
                };
                dp::Device {
                    id,
                    health: if healthy { "Healthy" } else { "Unhealthy" }.into(),
                    topology: None,
                }
            })
            .collect())
    }

    /// One container's devices: one allocation of as many units.
    async fn allocate_container(
        &self,
        ids: &[String],
    ) -> ServiceResult<dp::ContainerAllocateResponse> {
        if ids.is_empty() {
            return Err(FieldError::new("devices_ids", "empty").into());
        }
        let prefix = format!("{}-", self.class.as_str());
        if let Some(bad) = ids.iter().find(|id| {
            id.strip_prefix(&prefix)
                .and_then(|n| n.parse::<u32>().ok())
                .is_none_or(|n| n >= DEVICES)
        }) {
            return Err(FieldError::new(
                "devices_ids",
                format!("{bad:?} is not a device of {}", resource(self.class)),
            )
            .into());
        }
        // The kubelet hands out devices it considers free: an allocation still holding
        // one belongs to a container that ended before the check saw it.
        let stale: Vec<u64> = self
            .state()
            .held
            .iter()
            .filter(|(_, h)| h.devices.iter().any(|d| ids.contains(d)))
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            self.release(id, "the kubelet gave its devices to another container")
                .await;
        }
        let units = u64::try_from(ids.len()).unwrap_or(u64::MAX);
        let spec = JobSpec {
            name: format!("k8s-{}", ids[0]),
            class: self.class,
            gpu_memory_mib: self.cfg.unit_mib.saturating_mul(units),
            slo_ms: None,
            slo_slowdown_pct: None,
            priority: 0,
            task: Task::Attached(AttachedSpec {
                lease_ms: Some(u64::try_from(LEASE.as_millis()).unwrap_or(60_000)),
                ..AttachedSpec::default()
            }),
            checkpoint: false,
            restart_policy: RestartPolicy::Never,
            max_restarts: 0,
            exclusive: false,
            profile_key: None,
        };
        let a = self.node.allocate(spec, None, None, PLACE_WAIT).await?;
        let id = a.job.id;
        if a.job.state != JobState::Running {
            let why = a.job.reason.clone();
            let _ = self
                .node
                .release_allocation(
                    id,
                    None,
                    "the kubelet's Allocate could not wait longer",
                    None,
                )
                .await;
            return Err(ServiceError::ResourceExhausted(format!(
                "mmk cannot place {units} {} unit(s) of {} now: {why}",
                self.class,
                mmk_core::units::format_mib(self.cfg.unit_mib)
            )));
        }
        self.state().held.insert(
            id,
            Held {
                class: self.class,
                devices: ids.to_vec(),
                misses: 0,
            },
        );
        let _ = self.changed.send(());
        info!(allocation = id, devices = ?ids, class = %self.class, "allocated for a container");
        let mut envs: std::collections::HashMap<String, String> = a.env.into_iter().collect();
        // The NVIDIA container runtime gives the container the device nodes of what this
        // names: the partition's MIG instance, or its GPU.
        if let Some(dev) = envs.get("CUDA_VISIBLE_DEVICES").cloned() {
            envs.insert("NVIDIA_VISIBLE_DEVICES".into(), dev);
        }
        Ok(dp::ContainerAllocateResponse {
            envs,
            mounts: a
                .mounts
                .iter()
                .map(|m| dp::Mount {
                    container_path: m.path.display().to_string(),
                    host_path: m.path.display().to_string(),
                    read_only: m.read_only,
                })
                .collect(),
            devices: Vec::new(),
            annotations: [(format!("{DOMAIN}/allocation"), id.to_string())]
                .into_iter()
                .collect(),
            cdi_devices: Vec::new(),
        })
    }

    async fn release(&self, id: u64, why: &str) {
        self.state().held.remove(&id);
        if let Err(e) = self.node.release_allocation(id, None, why, None).await {
            warn!(allocation = id, error = %e, "cannot release a container's allocation");
        }
        let _ = self.changed.send(());
    }
}

type DeviceStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>,
>;

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _req: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _req: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        // Subscribed before the first list: no change falls in between.
        let mut jobs = self.node.subscribe();
        let mut mine = self.changed.subscribe();
        let first = self.devices().await?;
        let (tx, rx) = mpsc::channel(8);
        let plugin = self.clone();
        tokio::spawn(async move {
            let mut last = first;
            if tx
                .send(Ok(dp::ListAndWatchResponse {
                    devices: last.clone(),
                }))
                .await
                .is_err()
            {
                return;
            }
            loop {
                tokio::select! {
                    () = tx.closed() => return,
                    ev = jobs.recv() => if matches!(ev, Err(broadcast::error::RecvError::Closed)) { return },
                    _ = mine.recv() => {}
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                let now = match plugin.devices().await {
                    Ok(d) => d,
                    Err(e) => {
                        warn!(error = %e, "cannot list devices for the kubelet");
                        continue;
                    }
                };
                if now != last {
                    last = now;
                    let msg = dp::ListAndWatchResponse {
                        devices: last.clone(),
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        // Any devices of a resource are alike: the ones that must be included, then the
        // lowest available IDs.
        let container_responses = req
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                let size = usize::try_from(c.allocation_size).unwrap_or(0);
                let mut ids = c.must_include_device_i_ds;
                let mut rest: Vec<String> = c
                    .available_device_i_ds
                    .into_iter()
                    .filter(|d| !ids.contains(d))
                    .collect();
                rest.sort_by_key(|d| d.rsplit('-').next().and_then(|n| n.parse::<u32>().ok()));
                ids.extend(rest);
                ids.truncate(size);
                dp::ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(dp::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for c in req.into_inner().container_requests {
            container_responses.push(
                self.allocate_container(&c.devices_ids)
                    .await
                    .map_err(mmk_proto::service_error_to_status)?,
            );
        }
        Ok(Response::new(dp::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _req: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

fn options() -> dp::DevicePluginOptions {
    dp::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Starts both plugins; they run until `stopping` is set.
pub fn start(node: Node, cfg: PluginConfig, stopping: watch::Receiver<bool>) {
    let cfg = Arc::new(cfg);
    let state = Arc::new(Mutex::new(State::default()));
    let (changed, _) = broadcast::channel(16);
    let plugins: Vec<Plugin> = [JobClass::Online, JobClass::Offline]
        .into_iter()
        .map(|class| Plugin {
            node: node.clone(),
            cfg: Arc::clone(&cfg),
            class,
            state: Arc::clone(&state),
            changed: changed.clone(),
        })
        .collect();
    for p in &plugins {
        tokio::spawn(serve_and_register(p.clone(), stopping.clone()));
    }
    tokio::spawn(check_pods(plugins, stopping));
}

/// Serves one plugin on its socket and registers it with the kubelet; serves and
/// registers again when the kubelet restarts (it removes the plugins' sockets and makes a
/// new kubelet.sock).
async fn serve_and_register(p: Plugin, mut stopping: watch::Receiver<bool>) {
    let dir = p.cfg.kubelet_dir.clone();
    let sock = dir.join(endpoint(p.class));
    let kubelet = dir.join("kubelet.sock");
    let mut server: Option<tokio::task::JoinHandle<()>> = None;
    let mut registered_with: Option<u64> = None;
    let mut warned = false;
    loop {
        if *stopping.borrow() {
            break;
        }
        if server.is_none() || inode(&sock).is_none() {
            if let Some(s) = server.take() {
                s.abort();
            }
            let _ = std::fs::remove_file(&sock);
            match tokio::net::UnixListener::bind(&sock) {
                Ok(l) => {
                    let svc = dp::device_plugin_server::DevicePluginServer::new(p.clone());
                    server = Some(tokio::spawn(async move {
                        if let Err(e) = tonic::transport::Server::builder()
                            .add_service(svc)
                            .serve_with_incoming(UnixListenerStream::new(l))
                            .await
                        {
                            warn!(error = %e, "device plugin server ended");
                        }
                    }));
                    registered_with = None;
                }
                Err(e) => {
                    warn!(socket = %sock.display(), error = %e, "cannot serve the device plugin")
                }
            }
        }
        let now = inode(&kubelet);
        if server.is_some() && now.is_some() && now != registered_with {
            match register(&kubelet, p.class).await {
                Ok(()) => {
                    info!(resource = %resource(p.class), kubelet = %kubelet.display(), "registered with the kubelet");
                    registered_with = now;
                    warned = false;
                }
                Err(e) if !warned => {
                    warn!(error = %e, "cannot register with the kubelet; trying again");
                    warned = true;
                }
                Err(_) => {}
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stopping.changed() => {}
        }
    }
    if let Some(s) = server {
        s.abort();
    }
    let _ = std::fs::remove_file(&sock);
}

async fn register(kubelet: &Path, class: JobClass) -> Result<(), String> {
    let ch = unix_channel(kubelet, Some(KUBELET_TIMEOUT))
        .await
        .map_err(|e| e.to_string())?;
    dp::registration_client::RegistrationClient::new(ch)
        .register(dp::RegisterRequest {
            version: "v1beta1".into(),
            endpoint: endpoint(class),
            resource_name: resource(class),
            options: Some(options()),
        })
        .await
        .map_err(|s| s.message().to_owned())?;
    Ok(())
}

/// The device IDs of our resources that pods hold, per resource name.
async fn pod_devices(path: &Path) -> Result<BTreeMap<String, Vec<String>>, String> {
    let ch = unix_channel(path, Some(KUBELET_TIMEOUT))
        .await
        .map_err(|e| e.to_string())?;
    let list = pr::pod_resources_lister_client::PodResourcesListerClient::new(ch)
        .list(pr::ListPodResourcesRequest {})
        .await
        .map_err(|s| s.message().to_owned())?
        .into_inner();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in list.pod_resources {
        for c in pod.containers {
            for d in c.devices {
                if d.resource_name.starts_with(DOMAIN) {
                    out.entry(d.resource_name).or_default().extend(d.device_ids);
                }
            }
        }
    }
    Ok(out)
}

/// Renews the leases of allocations whose containers the kubelet still lists and
/// releases the others.
async fn check_pods(plugins: Vec<Plugin>, mut stopping: watch::Receiver<bool>) {
    let Some(first) = plugins.first().cloned() else {
        return;
    };
    let mut warned = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(first.cfg.check_every) => {}
            _ = stopping.changed() => return,
        }
        let listed = pod_devices(&first.cfg.pod_resources).await;
        let held: Vec<(u64, Held)> = first
            .state()
            .held
            .iter()
            .map(|(id, h)| (*id, h.clone()))
            .collect();
        let mut gone = Vec::new();
        match &listed {
            Ok(by_resource) => {
                warned = false;
                let mut state = first.state();
                for (id, h) in &held {
                    let present = by_resource
                        .get(&resource(h.class))
                        .is_some_and(|ids| h.devices.iter().any(|d| ids.contains(d)));
                    if let Some(entry) = state.held.get_mut(id) {
                        entry.misses = if present { 0 } else { entry.misses + 1 };
                        if entry.misses >= MISSES {
                            gone.push((*id, h.class));
                        }
                    }
                }
            }
            Err(e) if !warned => {
                warn!(error = %e, socket = %first.cfg.pod_resources.display(),
                    "cannot list the kubelet's pod resources; container allocations are kept");
                warned = true;
            }
            Err(_) => {}
        }
        for (id, class) in &gone {
            if let Some(p) = plugins.iter().find(|p| p.class == *class) {
                p.release(*id, "its container is gone (kubelet pod-resources)")
                    .await;
            }
        }
        for (id, _) in held
            .iter()
            .filter(|(id, _)| !gone.iter().any(|(g, _)| g == id))
        {
            match first.node.renew(*id).await {
                Ok(_) => {}
                Err(
                    e @ (mmk_core::ServiceError::FailedPrecondition(_)
                    | mmk_core::ServiceError::NotFound { .. }),
                ) => {
                    // Cancelled or ended by other means: its devices are free again.
                    info!(allocation = id, reason = %e, "a container's allocation ended");
                    first.state().held.remove(id);
                    let _ = first.changed.send(());
                }
                // The store is busy or failing: try again at the next check.
                Err(e) => {
                    warn!(allocation = id, error = %e, "cannot renew a container's allocation")
                }
            }
        }
    }
}
