//! What cluster schedulers use: attached allocations (`mmkctl run`, Allocate with a pid or
//! a lease), Fit, the capacity stream, and a scheduler-side script placing a trace across
//! several mmkd nodes with Fit.

use std::process::{Command, Stdio};
use std::time::Instant;

use mmk_proto::v1;
use mmk_proto::v1::allocation_service_client::AllocationServiceClient;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::harness::{Daemon, PATIENCE, text, wait_for, wait_state};

async fn alloc_client(d: &Daemon) -> AllocationServiceClient<Channel> {
    AllocationServiceClient::new(d.clients().await.channel)
}

fn attached_spec(name: &str, class: v1::JobClass, gib: u64, task: v1::AttachedTask) -> v1::JobSpec {
    v1::JobSpec {
        name: name.into(),
        class: class as i32,
        gpu_memory_mib: gib * 1024,
        task: Some(v1::job_spec::Task::Attached(task)),
        ..v1::JobSpec::default()
    }
}

fn lease(ms: u64) -> v1::AttachedTask {
    v1::AttachedTask {
        lease_ms: ms,
        ..v1::AttachedTask::default()
    }
}

/// The one job mmkctl lists, as JSON.
fn only_job(d: &Daemon) -> serde_json::Value {
    let jobs = d.ctl_json(&["jobs"]);
    let jobs = jobs.as_array().expect("a list");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    jobs[0].clone()
}

#[tokio::test]
async fn run_starts_the_command_in_its_partition_and_releases_it_with_its_exit_code() {
    let d = Daemon::start("a100-80gb:1");
    let out = d.ctl(&[
        "run",
        "--offline",
        "--memory",
        "20GiB",
        "--name",
        "train",
        "--",
        "sh",
        "-c",
        "env | grep -E '^(CUDA|MMK)_' | sort; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let env: std::collections::BTreeMap<&str, &str> =
        stdout.lines().filter_map(|l| l.split_once('=')).collect();
    let job = only_job(&d);
    let a = &job["assignment"];
    // What the command saw is what mmk recorded.
    assert_eq!(env["MMK_JOB_ID"], job["id"].to_string());
    assert_eq!(
        env["CUDA_VISIBLE_DEVICES"],
        a["device_uuid"].as_str().expect("uuid")
    );
    assert_eq!(
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
        a["mps_share"].to_string()
    );
    assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20480M");
    assert_eq!(
        env["CUDA_MPS_CLIENT_PRIORITY"], "1",
        "offline: below normal"
    );
    assert!(
        env["CUDA_MPS_PIPE_DIRECTORY"].starts_with(d.data_dir().to_str().expect("utf-8")),
        "{env:?}"
    );
    assert_eq!(job["state"], "FAILED");
    assert_eq!(job["exit_code"], 3);
    assert_eq!(job["reason"], "released: exited with code 3");
    assert_eq!(job["task"]["kind"], "attached");
    let err = text(&out.stderr);
    assert!(err.contains("allocation 1: gpu 0"), "{err}");

    // A command that succeeds leaves a SUCCEEDED allocation and exit 0.
    let out = d.ctl(&["run", "--online", "--memory", "4GiB", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let j = d.ctl_json(&["jobs", "get", "2"]);
    assert_eq!(j["state"], "SUCCEEDED");
    assert_eq!(j["name"], "true");
    assert_eq!(j["class"], "online");

    // A program that does not exist: exit 2 and the allocation FAILED with the reason.
    let out = d.ctl(&["run", "--offline", "--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot start"),
        "{}",
        text(&out.stderr)
    );
    let j = d.ctl_json(&["jobs", "get", "3"]);
    assert_eq!(j["state"], "FAILED");
    assert_eq!(j["exit_code"], 127);
}

#[tokio::test]
async fn a_killed_run_frees_its_allocation_when_the_lease_runs_out() {
    let d = Daemon::start("a100-80gb:1");
    let mut run = Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--socket")
        .arg(d.socket())
        .args(["run", "--offline", "--lease", "1s", "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mmkctl runs");
    let mut c = d.clients().await;
    wait_state(&mut c, 1, v1::JobState::Running).await;
    // SIGKILL of mmkctl, as a Slurm step's end would do; its command is killed too.
    let sleep_pid = wait_for("the command", || {
        procs_with_parent(run.id()).into_iter().next()
    });
    run.kill().expect("kill");
    run.wait().expect("reap");
    let killed = Instant::now();
    // SAFETY: kill(2) on a process this test started.
    unsafe {
        libc::kill(sleep_pid, libc::SIGKILL);
    }
    let job = wait_state(&mut c, 1, v1::JobState::Failed).await;
    let after = killed.elapsed();
    assert_eq!(job.reason, "lease expired: not renewed for 1s");
    // Once the 1 s lease ran out (mmkd looks every 200 ms): within seconds, and well within
    // half the harness's patience on a loaded machine.
    assert!(after < PATIENCE / 2, "freed after {after:?}");
    // And the partition is free for the next one.
    let out = d.ctl(&["run", "--offline", "--memory", "70GiB", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Children of `ppid`, from /proc.
fn procs_with_parent(ppid: u32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let rest = stat.rsplit_once(')')?.1;
            let parent: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (parent == ppid).then_some(pid)
        })
        .collect()
}

#[tokio::test]
async fn sigterm_to_run_reaches_the_command_and_the_allocation_records_its_exit() {
    let d = Daemon::start("a100-80gb:1");
    let run = Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--socket")
        .arg(d.socket())
        .args([
            "run",
            "--offline",
            "--",
            "sh",
            "-c",
            "trap 'kill $!; exit 7' TERM; sleep 60 & wait",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mmkctl runs");
    let mut c = d.clients().await;
    wait_state(&mut c, 1, v1::JobState::Running).await;
    // The shell has set its trap once it has started `sleep`: wait for that grandchild,
    // or the signal can land before the trap and kill the shell (exit 143).
    wait_for("the command's sleep", || {
        procs_with_parent(run.id())
            .into_iter()
            .find_map(|sh| procs_with_parent(sh as u32).into_iter().next())
    });
    // SAFETY: signalling a process this test started.
    unsafe {
        libc::kill(run.id() as i32, libc::SIGTERM);
    }
    let out = run.wait_with_output().expect("mmkctl exits");
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let job = wait_state(&mut c, 1, v1::JobState::Failed).await;
    assert_eq!(job.exit_code, Some(7));
}

#[tokio::test]
async fn an_allocation_watching_a_pid_ends_with_the_process() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = alloc_client(&d).await;
    let mut proc = Command::new("sleep").arg("60").spawn().expect("sleep");
    let a = c
        .allocate(v1::AllocateRequest {
            spec: Some(attached_spec(
                "svc",
                v1::JobClass::Online,
                10,
                v1::AttachedTask {
                    pid: proc.id(),
                    profile: "resnet50-inference".into(),
                    ..v1::AttachedTask::default()
                },
            )),
            wait_ms: 10_000,
            ..Default::default()
        })
        .await
        .expect("allocate")
        .into_inner();
    let job = a.job.clone().expect("job");
    assert_eq!(job.state, v1::JobState::Running as i32, "{}", job.reason);
    let assignment = job.assignment.expect("placed");
    assert_eq!(a.env["CUDA_VISIBLE_DEVICES"], assignment.device_uuid);
    assert_eq!(
        a.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
        assignment.mps_share.to_string()
    );
    // The MPS pipe directory is one of the mounts a container needs.
    let pipe = &a.env["CUDA_MPS_PIPE_DIRECTORY"];
    assert!(
        a.mounts
            .iter()
            .any(|m| &m.host_path == pipe && !m.read_only)
    );
    assert!(a.lease_expires_at.is_none(), "no lease was asked for");
    // `partitions show` counts it like any job.
    let parts = d.ctl_json(&["partitions", "show"]);
    assert!(parts.to_string().contains("\"svc\""), "{parts}");

    proc.kill().expect("kill");
    proc.wait().expect("reap");
    let mut jobs = d.clients().await;
    let ended = wait_state(&mut jobs, job.id, v1::JobState::Succeeded).await;
    assert_eq!(
        ended.reason,
        format!("released: the watched process {} ended", proc.id())
    );
    // Renewing an ended allocation says why it ended.
    let e = c
        .renew_lease(v1::RenewLeaseRequest { id: job.id })
        .await
        .expect_err("ended");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("the watched process"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn bad_allocations_are_refused_with_the_field_and_nothing_is_stored() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = alloc_client(&d).await;
    let cases = [
        (v1::AttachedTask::default(), "attached:"),
        (
            v1::AttachedTask {
                pid: 999_999_999,
                ..v1::AttachedTask::default()
            },
            "attached.pid:",
        ),
        (lease(10), "attached.lease:"),
        (
            v1::AttachedTask {
                lease_ms: 5000,
                profile: "nope".into(),
                ..v1::AttachedTask::default()
            },
            "attached.profile:",
        ),
    ];
    for (task, field) in cases {
        let e = c
            .allocate(v1::AllocateRequest {
                spec: Some(attached_spec("bad", v1::JobClass::Offline, 1, task)),
                wait_ms: 0,
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(e.message().starts_with(field), "{field}: {}", e.message());
    }
    // A managed job is not an allocation: Allocate, Release and Renew say so.
    let e = c
        .allocate(v1::AllocateRequest {
            spec: Some(v1::JobSpec {
                name: "wl".into(),
                class: v1::JobClass::Offline as i32,
                gpu_memory_mib: 1024,
                task: Some(v1::job_spec::Task::Workload(v1::WorkloadTask {
                    name: "bert-train".into(),
                    ..v1::WorkloadTask::default()
                })),
                ..v1::JobSpec::default()
            }),
            wait_ms: 0,
            ..Default::default()
        })
        .await
        .expect_err("not attached");
    assert!(e.message().starts_with("attached:"), "{}", e.message());
    let jobs = d.ctl_json(&["jobs"]);
    assert_eq!(jobs.as_array().map(Vec::len), Some(0), "{jobs}");
    let id = d.submit(
        "--offline",
        "name: wl\ngpu_memory: 1GiB\nworkload:\n  name: bert-train\n  duration: 10h\n",
    );
    let e = c
        .release(v1::ReleaseRequest {
            id,
            ..v1::ReleaseRequest::default()
        })
        .await
        .expect_err("managed");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("not an attached allocation"),
        "{}",
        e.message()
    );
    // mmkctl names the flag.
    let out = d.ctl(&["run", "--offline", "--memory", "lots", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--memory:"),
        "{}",
        text(&out.stderr)
    );
    let out = d.ctl(&["allocate", "--offline"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--pid, --lease"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn a_waiting_allocation_is_placed_when_room_is_made_and_cancelling_ends_it() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = alloc_client(&d).await;
    let alloc = |name: &str| v1::AllocateRequest {
        spec: Some(attached_spec(name, v1::JobClass::Offline, 70, lease(5000))),
        wait_ms: 5000,
        ..Default::default()
    };
    let first = c
        .allocate(alloc("first"))
        .await
        .expect("first")
        .into_inner();
    let first_id = first.job.as_ref().expect("job").id;
    assert_eq!(
        first.job.as_ref().map(|j| j.state),
        Some(v1::JobState::Running as i32)
    );
    let second = c
        .allocate(v1::AllocateRequest {
            wait_ms: 200,
            ..alloc("second")
        })
        .await
        .expect("second")
        .into_inner();
    let job = second.job.clone().expect("job");
    assert_eq!(job.state, v1::JobState::Queued as i32);
    assert!(job.reason.starts_with("waiting"), "{}", job.reason);
    assert!(second.env.is_empty(), "no environment before it is placed");
    assert!(second.lease_expires_at.is_some());

    // A waiting allocation keeps its place while its lease is renewed.
    c.renew_lease(v1::RenewLeaseRequest { id: job.id })
        .await
        .expect("renew while waiting");
    let released = c
        .release(v1::ReleaseRequest {
            id: first_id,
            exit_code: Some(0),
            reason: String::new(),
        })
        .await
        .expect("release")
        .into_inner();
    assert_eq!(released.state, v1::JobState::Succeeded as i32);
    assert_eq!(released.reason, "released");
    let placed = c
        .get_allocation(v1::GetAllocationRequest {
            id: job.id,
            wait_ms: 10_000,
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(
        placed.job.as_ref().map(|j| j.state),
        Some(v1::JobState::Running as i32)
    );
    assert!(placed.env.contains_key("CUDA_VISIBLE_DEVICES"));

    // Cancelled through the jobs API: the next renewal tells its holder.
    let out = d.ctl(&["jobs", "cancel", &job.id.to_string(), "--reason", "drain"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let e = c
        .renew_lease(v1::RenewLeaseRequest { id: job.id })
        .await
        .expect_err("cancelled");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("CANCELLED (cancelled: drain)"),
        "{}",
        e.message()
    );
    // Releasing twice is refused with the state it ended in.
    let e = c
        .release(v1::ReleaseRequest {
            id: first_id,
            ..v1::ReleaseRequest::default()
        })
        .await
        .expect_err("already released");
    assert!(
        e.message().contains("has ended: SUCCEEDED"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn fit_says_where_a_job_goes_and_what_it_costs_the_jobs_already_there() {
    let d = Daemon::start_with("a100-80gb:1", &["--planner", "mmk"]);
    let serving = d.submit(
        "--online",
        "name: serving\ngpu_memory: 10GiB\nslo: 200ms\nworkload:\n  name: resnet50-inference\n  duration: 10h\n",
    );
    let mut jobs = d.clients().await;
    wait_state(&mut jobs, serving, v1::JobState::Running).await;
    let train = d.job_file(
        "train.yaml",
        "name: train\ngpu_memory: 20GiB\nworkload:\n  name: bert-train\n  duration: 10h\n",
    );
    let fit = d.ctl_json(&["fit", "--offline", &train]);
    let verdict = fit["verdict"].as_str().expect("verdict");
    assert!(
        verdict == "now" || verdict == "after-reconfiguration",
        "{fit}"
    );
    assert_eq!(fit["planner"], "mmk");
    assert_eq!(fit["gpu"], 0);
    let perf = fit["predicted_perf"].as_f64().expect("a prediction");
    assert!(perf > 0.0 && perf <= 1.0, "{fit}");
    let (before, after) = (
        fit["stp_before"].as_f64().expect("stp before"),
        fit["stp_after"].as_f64().expect("stp after"),
    );
    // The cost is what the placed jobs lose; each loss is listed.
    let cost = fit["cost"].as_f64().expect("cost");
    let listed: f64 = fit["costs"]
        .as_array()
        .expect("costs")
        .iter()
        .map(|c| c["perf_before"].as_f64().unwrap_or(0.0) - c["perf_after"].as_f64().unwrap_or(0.0))
        .sum();
    assert!((cost - listed).abs() < 1e-9, "{fit}");
    assert!(cost >= 0.0);
    assert!((after - (before + perf - cost)).abs() < 1e-6, "{fit}");
    // Nothing changed on the node.
    assert_eq!(d.ctl_json(&["jobs"]).as_array().map(Vec::len), Some(1));

    let huge = d.job_file(
        "huge.yaml",
        "name: huge\ngpu_memory: 200GiB\nworkload:\n  name: bert-train\n",
    );
    let out = d.ctl(&["--output", "json", "fit", "--offline", &huge]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["verdict"], "never");
    assert!(
        v["reason"]
            .as_str()
            .unwrap_or("")
            .contains("largest partition"),
        "{v}"
    );
}

#[tokio::test]
async fn the_capacity_stream_follows_allocations() {
    let d = Daemon::start_with("a100-80gb:1", &["--capacity-unit", "9GiB"]);
    let mut c = alloc_client(&d).await;
    let mut stream = c
        .watch_capacity(v1::WatchCapacityRequest {})
        .await
        .expect("watch")
        .into_inner();
    let empty = next_capacity(&mut stream).await.expect("first reading");
    assert_eq!(empty.unit_mib, 9 * 1024);
    // As GetNode reports it: eight free 1g.10gb memory slices.
    assert_eq!(empty.gpus[0].free_memory_mib, 8 * 9728);
    let mut clients = d.clients().await;
    let node_free = |n: v1::Node| n.gpus[0].free_memory_mib;
    // First fit makes a 1g.10gb instance per unit: seven fit in an empty A100.
    assert_eq!(empty.offline_units, 7, "{empty:?}");
    assert_eq!(empty.online_units, 7, "{empty:?}");

    let mut alloc = alloc_client(&d).await;
    alloc
        .allocate(v1::AllocateRequest {
            spec: Some(attached_spec(
                "big",
                v1::JobClass::Offline,
                40,
                lease(10_000),
            )),
            wait_ms: 5000,
            ..Default::default()
        })
        .await
        .expect("allocate");
    let mut seen = next_capacity(&mut stream).await.expect("a change");
    while seen.gpus[0].offline_jobs == 0 {
        seen = next_capacity(&mut stream).await.expect("a change");
    }
    let node = clients
        .node
        .get_node(v1::GetNodeRequest {})
        .await
        .expect("node")
        .into_inner();
    assert_eq!(
        seen.gpus[0].free_memory_mib,
        node_free(node),
        "GetNode and WatchCapacity agree"
    );
    assert!(seen.gpus[0].free_memory_mib < 8 * 9728);
    assert!(seen.offline_units < empty.offline_units, "{seen:?}");
    // mmkctl shows the same in one line of JSON.
    let now = d.ctl_json(&["capacity"]);
    assert_eq!(now["offline_units"], seen.offline_units);
    assert_eq!(now["gpus"][0]["offline_jobs"], 1);
}

async fn next_capacity(
    s: &mut tonic::Streaming<v1::Capacity>,
) -> Result<v1::Capacity, tokio::time::error::Elapsed> {
    let fut = async move { s.next().await.expect("a reading").expect("ok") };
    tokio::time::timeout(PATIENCE, fut).await
}

/// Several mmkd nodes and a scheduler-side script (examples/cluster/place.py) that asks each
/// node Fit for each job of a trace and submits it to the best one.
#[tokio::test]
async fn a_scheduler_script_places_a_trace_across_nodes_with_fit() {
    let nodes: Vec<Daemon> = (0..3)
        .map(|_| Daemon::start_with("a100-80gb:1", &["--planner", "mmk", "--sim-speed", "1"]))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    // Ten long jobs of 30 GiB: two fit on an A100's 80 GiB, so three nodes take six now
    // and the script must spread them; the rest wait where Fit says they would start first.
    let mut trace = String::from("name,class,gpu_memory,workload\n");
    for i in 0..10 {
        let (class, wl) = if i % 2 == 0 {
            ("offline", "bert-train")
        } else {
            ("online", "resnet50-inference")
        };
        trace.push_str(&format!("job{i},{class},30GiB,{wl}\n"));
    }
    let trace_file = dir.path().join("trace.csv");
    std::fs::write(&trace_file, trace).expect("write trace");
    let sockets: Vec<String> = nodes
        .iter()
        .map(|n| n.socket().display().to_string())
        .collect();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/cluster/place.py");
    let out = Command::new("python3")
        .arg(script)
        .arg("--mmkctl")
        .arg(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--trace")
        .arg(&trace_file)
        .arg("--workdir")
        .arg(dir.path())
        .args(sockets.iter().flat_map(|s| ["--node", s.as_str()]))
        .output()
        .expect("python3 runs the script");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let placed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the script's JSON");
    let placed = placed.as_array().expect("one entry per job");
    assert_eq!(placed.len(), 10);
    // Every job went to exactly one node, and that node has it.
    let mut per_node = vec![0; nodes.len()];
    for p in placed {
        let node = p["node"].as_u64().expect("node") as usize;
        per_node[node] += 1;
        let id = p["job"].as_u64().expect("job id").to_string();
        let job = nodes[node].ctl_json(&["jobs", "get", &id]);
        assert_eq!(job["name"], p["name"], "{p}");
    }
    assert_eq!(per_node.iter().sum::<usize>(), 10);
    // Spread: no node was left out, and the ones placed now are two per node.
    assert!(per_node.iter().all(|&n| n >= 2), "{per_node:?}");
    let now = placed.iter().filter(|p| p["verdict"] != "wait").count();
    assert!(now >= 6, "{placed:?}");
    // Each node starts the two it has room for (its passes run as the jobs come in).
    for n in &nodes {
        wait_for("two running jobs on each node", || {
            let running = n.ctl_json(&["jobs", "--state", "running"]);
            (running.as_array().map(Vec::len) == Some(2)).then_some(())
        });
    }
}
