//! The Kubernetes device plugin against a fake kubelet that speaks the kubelet's side of
//! the same protocols: Registration on kubelet.sock, the plugin's DevicePlugin service as
//! a client, and pod-resources List.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use mmk_proto::k8s::deviceplugin::v1beta1 as dp;
use mmk_proto::k8s::podresources::v1 as pr;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::harness::{Daemon, PATIENCE};

/// The kubelet's side: registrations come out of `registered`; `pods` is what List says.
struct FakeKubelet {
    registered: mpsc::UnboundedReceiver<dp::RegisterRequest>,
    /// Resource name -> device IDs that containers hold.
    pods: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    dir: PathBuf,
}

#[derive(Clone)]
struct Registrar(mpsc::UnboundedSender<dp::RegisterRequest>);

#[tonic::async_trait]
impl dp::registration_server::Registration for Registrar {
    async fn register(
        &self,
        req: Request<dp::RegisterRequest>,
    ) -> Result<Response<dp::Empty>, Status> {
        let r = req.into_inner();
        if r.version != "v1beta1" {
            return Err(Status::invalid_argument("unsupported version"));
        }
        let _ = self.0.send(r);
        Ok(Response::new(dp::Empty {}))
    }
}

#[derive(Clone)]
struct Lister(Arc<Mutex<BTreeMap<String, Vec<String>>>>);

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for Lister {
    async fn list(
        &self,
        _req: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let held = self.0.lock().expect("lock").clone();
        let pod_resources = held
            .into_iter()
            .map(|(resource_name, device_ids)| pr::PodResources {
                name: format!("pod-{}", resource_name.replace('/', "-")),
                namespace: "default".into(),
                containers: vec![pr::ContainerResources {
                    name: "main".into(),
                    devices: vec![pr::ContainerDevices {
                        resource_name,
                        device_ids,
                    }],
                }],
            })
            .collect();
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources,
        }))
    }
}

impl FakeKubelet {
    fn start(dir: &Path) -> FakeKubelet {
        std::fs::create_dir_all(dir).expect("device-plugins dir");
        let (tx, registered) = mpsc::unbounded_channel();
        let reg =
            tokio::net::UnixListener::bind(dir.join("kubelet.sock")).expect("bind kubelet.sock");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(dp::registration_server::RegistrationServer::new(Registrar(
                    tx,
                )))
                .serve_with_incoming(UnixListenerStream::new(reg)),
        );
        let pods = Arc::new(Mutex::new(BTreeMap::new()));
        let list = tokio::net::UnixListener::bind(dir.join("pod-resources.sock"))
            .expect("bind pod-resources.sock");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(
                    pr::pod_resources_lister_server::PodResourcesListerServer::new(Lister(
                        Arc::clone(&pods),
                    )),
                )
                .serve_with_incoming(UnixListenerStream::new(list)),
        );
        FakeKubelet {
            registered,
            pods,
            dir: dir.to_path_buf(),
        }
    }

    async fn plugin(
        &self,
        endpoint: &str,
    ) -> dp::device_plugin_client::DevicePluginClient<Channel> {
        let ch = mmk_proto::unix_channel(&self.dir.join(endpoint), None)
            .await
            .expect("connect to the plugin");
        dp::device_plugin_client::DevicePluginClient::new(ch)
    }
}

fn healthy(list: &dp::ListAndWatchResponse) -> Vec<String> {
    list.devices
        .iter()
        .filter(|d| d.health == "Healthy")
        .map(|d| d.id.clone())
        .collect()
}

async fn next_list(s: &mut tonic::Streaming<dp::ListAndWatchResponse>) -> dp::ListAndWatchResponse {
    tokio::time::timeout(PATIENCE, s.next())
        .await
        .expect("a device list in time")
        .expect("the stream goes on")
        .expect("a list")
}

/// Reads lists until `ok` holds; returns that list.
async fn list_until(
    s: &mut tonic::Streaming<dp::ListAndWatchResponse>,
    what: &str,
    ok: impl Fn(&dp::ListAndWatchResponse) -> bool,
) -> dp::ListAndWatchResponse {
    let fut = async {
        loop {
            let l = next_list(s).await;
            if ok(&l) {
                return l;
            }
        }
    };
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("no device list with {what}"))
}

fn allocate_req(ids: &[&str]) -> dp::AllocateRequest {
    dp::AllocateRequest {
        container_requests: vec![dp::ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        }],
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end story, read top to bottom; the 150-line limit is for product code"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_plugin_registers_follows_capacity_and_allocates_containers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let kdir = tmp.path().join("device-plugins");
    let mut kubelet = FakeKubelet::start(&kdir);
    let d = Daemon::start_with(
        "a100-80gb:1",
        &[
            "--kubelet-dir",
            kdir.to_str().expect("utf-8"),
            "--kubelet-pod-resources",
            kdir.join("pod-resources.sock").to_str().expect("utf-8"),
            "--kubelet-check-interval",
            "200ms",
            "--capacity-unit",
            "9GiB",
        ],
    );

    // Registration: one resource per class, each on its own socket.
    let mut regs = Vec::new();
    for _ in 0..2 {
        let r = tokio::time::timeout(PATIENCE, kubelet.registered.recv())
            .await
            .expect("registered in time")
            .expect("a registration");
        regs.push(r);
    }
    regs.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
    assert_eq!(regs[0].resource_name, "mmk.io/offline");
    assert_eq!(regs[0].endpoint, "mmk-offline.sock");
    assert_eq!(regs[1].resource_name, "mmk.io/online");
    assert_eq!(regs[1].endpoint, "mmk-online.sock");
    assert!(regs.iter().all(|r| {
        r.options
            .as_ref()
            .is_some_and(|o| o.get_preferred_allocation_available && !o.pre_start_required)
    }));

    let mut offline = kubelet.plugin("mmk-offline.sock").await;
    let mut online = kubelet.plugin("mmk-online.sock").await;
    let opts = offline
        .get_device_plugin_options(dp::Empty {})
        .await
        .expect("options")
        .into_inner();
    assert!(opts.get_preferred_allocation_available);
    let mut off_list = offline
        .list_and_watch(dp::Empty {})
        .await
        .expect("list and watch")
        .into_inner();
    let mut on_list = online
        .list_and_watch(dp::Empty {})
        .await
        .expect("list and watch")
        .into_inner();
    let first = next_list(&mut off_list).await;
    assert_eq!(first.devices.len(), 64);
    // Seven 9 GiB units fit an empty A100 (seven 1g.10gb under first fit).
    assert_eq!(healthy(&first).len(), 7, "{:?}", healthy(&first));
    assert_eq!(healthy(&next_list(&mut on_list).await).len(), 7);

    // The kubelet's preferred allocation: the lowest free IDs.
    let pref = offline
        .get_preferred_allocation(dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: vec![
                    "offline-5".into(),
                    "offline-2".into(),
                    "offline-3".into(),
                ],
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .expect("preferred")
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        ["offline-2", "offline-3"]
    );

    // An offline container with two devices: one allocation of 18 GiB.
    let resp = offline
        .allocate(allocate_req(&["offline-0", "offline-1"]))
        .await
        .expect("allocate")
        .into_inner();
    let c = &resp.container_responses[0];
    assert_eq!(c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=18432M");
    assert!(
        c.envs["CUDA_VISIBLE_DEVICES"].starts_with("MIG-"),
        "{:?}",
        c.envs
    );
    let pipe = &c.envs["CUDA_MPS_PIPE_DIRECTORY"];
    assert!(
        c.mounts
            .iter()
            .any(|m| &m.host_path == pipe && &m.container_path == pipe)
    );
    let alloc_id = c.annotations["mmk.io/allocation"].clone();
    let job = d.ctl_json(&["jobs", "get", &alloc_id]);
    assert_eq!(job["state"], "RUNNING");
    assert_eq!(job["class"], "offline");
    assert_eq!(job["gpu_memory_mib"], 18432);
    assert_eq!(job["task"]["kind"], "attached");
    kubelet.pods.lock().expect("lock").insert(
        "mmk.io/offline".into(),
        vec!["offline-0".into(), "offline-1".into()],
    );

    // The held devices stay Healthy, and as many free ones as mmk has units left.
    let units = |class: &str| {
        let v = d.ctl_json(&["capacity"]);
        v[format!("{class}_units")].as_u64().expect("units") as usize
    };
    let want = 2 + units("offline");
    let l = list_until(&mut off_list, "the held devices and the units left", |l| {
        let h = healthy(l);
        h.len() == want
            && h.contains(&"offline-0".to_owned())
            && h.contains(&"offline-1".to_owned())
    })
    .await;
    assert!(healthy(&l).len() <= 7);
    let want_online = units("online");
    list_until(&mut on_list, "the online units left", |l| {
        healthy(l).len() == want_online
    })
    .await;

    // Capacity used outside Kubernetes (a job submitted to mmk) shrinks the lists too.
    let batch = d.submit(
        "--offline",
        "name: batch\ngpu_memory: 30GiB\nworkload:\n  name: bert-train\n  duration: 10h\n",
    );
    let mut c = d.clients().await;
    crate::harness::wait_state(&mut c, batch, mmk_proto::v1::JobState::Running).await;
    let after = 2 + units("offline");
    assert!(after < want, "{after} {want}");
    list_until(&mut off_list, "the batch job's share taken", |l| {
        healthy(l).len() == after
    })
    .await;

    // An online container.
    let resp = online
        .allocate(allocate_req(&["online-0"]))
        .await
        .expect("online allocate")
        .into_inner();
    let on_id = resp.container_responses[0].annotations["mmk.io/allocation"].clone();
    assert_eq!(d.ctl_json(&["jobs", "get", &on_id])["class"], "online");

    // More than the node can ever hold: refused, nothing stored.
    let jobs_before = d.ctl_json(&["jobs"]).as_array().map(Vec::len);
    let ids: Vec<String> = (10..30).map(|i| format!("offline-{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let e = offline
        .allocate(allocate_req(&refs))
        .await
        .expect_err("too big");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{}", e.message());
    assert!(e.message().starts_with("gpu_memory:"), "{}", e.message());
    let e = offline
        .allocate(allocate_req(&["gpu-0"]))
        .await
        .expect_err("not ours");
    assert!(
        e.message().contains("not a device of mmk.io/offline"),
        "{}",
        e.message()
    );
    assert_eq!(d.ctl_json(&["jobs"]).as_array().map(Vec::len), jobs_before);

    // The online pod is never listed by the kubelet: after two checks its allocation is
    // released. The offline one is listed, and kept, until its pod goes.
    let on_job = crate::harness::wait_state(
        &mut c,
        on_id.parse().expect("id"),
        mmk_proto::v1::JobState::Succeeded,
    )
    .await;
    assert_eq!(
        on_job.reason,
        "released: its container is gone (kubelet pod-resources)"
    );
    let off = d.ctl_json(&["jobs", "get", &alloc_id]);
    assert_eq!(off["state"], "RUNNING", "{off}");
    kubelet.pods.lock().expect("lock").clear();
    crate::harness::wait_state(
        &mut c,
        alloc_id.parse().expect("id"),
        mmk_proto::v1::JobState::Succeeded,
    )
    .await;

    // Stopping mmkd removes the plugin sockets.
    let (status, dir) = d.terminate();
    assert!(status.success());
    assert!(!kdir.join("mmk-offline.sock").exists());
    drop(dir);
}
