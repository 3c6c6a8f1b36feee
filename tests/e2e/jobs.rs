//! Submitting, listing, getting, watching and cancelling jobs; partitions and GPUs.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use mmk_proto::v1;
use serde_json::Value;

use crate::harness::{Daemon, text, wait_for, wait_state};

const ONLINE: &str = "\
name: resnet50-serving
gpu_memory: 8GiB
slo: 50ms
workload:
  name: resnet50-inference
  duration: 10h
";

#[tokio::test]
async fn submit_list_get_partitions_and_cancel() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;

    let file = d.job_file("online.yaml", ONLINE);
    let out = d.ctl(&["submit", "--online", &file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "submitted job 1 (resnet50-serving): QUEUED submitted\n"
    );

    let job = wait_state(&mut c, 1, v1::JobState::Running).await;
    let a = job.assignment.expect("a running job has a partition");
    assert_eq!(
        (a.gpu_index, a.profile.as_str(), a.mps_share),
        (0, "1g.10gb", 100)
    );
    assert!(a.device_uuid.starts_with("MIG-"), "{}", a.device_uuid);

    // The list, as a table and as JSON.
    let out = d.ctl(&["jobs"]);
    let table = text(&out.stdout);
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|h| h.starts_with("ID   NAME")),
        "{table}"
    );
    assert!(
        table.contains("resnet50-serving") && table.contains("RUNNING"),
        "{table}"
    );
    assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
    let list = d.ctl_json(&["jobs"]);
    assert_eq!(list[0]["id"], 1);
    assert_eq!(list[0]["state"], "RUNNING");
    assert_eq!(list[0]["class"], "online");
    assert_eq!(list[0]["slo_ms"], 50);
    assert_eq!(list[0]["assignment"]["profile"], "1g.10gb");
    assert_eq!(
        d.ctl_json(&["jobs", "--state", "queued"]),
        Value::Array(vec![])
    );
    assert_eq!(
        d.ctl_json(&["jobs", "--class", "online"])
            .as_array()
            .map(Vec::len),
        Some(1)
    );

    // One job.
    let out = d.ctl(&["jobs", "get", "1"]);
    let detail = text(&out.stdout);
    assert!(detail.contains("state:        RUNNING"), "{detail}");
    assert!(
        detail.contains("partition:    gpu 0 1g.10gb at slice 0"),
        "{detail}"
    );
    let out = d.ctl(&["jobs", "get", "42"]);
    assert_eq!(out.status.code(), Some(1), "not found is exit 1");
    assert!(text(&out.stderr).contains("job 42 not found"));

    // The partitions, as a picture and as JSON.
    let out = d.ctl(&["partitions", "show"]);
    let pic = text(&out.stdout);
    assert!(out.status.success());
    assert!(
        pic.contains("GPU 0  NVIDIA A100-SXM4-80GB  MIG on"),
        "{pic}"
    );
    assert!(pic.contains("      |1g.10gb|free   |"), "{pic}");
    assert!(pic.contains("job 1     resnet50-serving"), "{pic}");
    let parts = d.ctl_json(&["partitions", "show"]);
    assert_eq!(parts[0]["mig_enabled"], true);
    assert_eq!(parts[0]["memory_slices"], 8);
    assert_eq!(parts[0]["partitions"][0]["profile"], "1g.10gb");
    assert_eq!(parts[0]["partitions"][0]["jobs"][0]["id"], 1);
    assert_eq!(parts[0]["partitions"][0]["jobs"][0]["mps_share"], 100);

    // GPUs.
    let node = d.ctl_json(&["gpus"]);
    assert_eq!(node["backend"], "sim");
    assert_eq!(node["gpus"][0]["model"], "NVIDIA A100-SXM4-80GB");
    assert_eq!(node["gpus"][0]["free_memory_slices"], 7);
    let seven = node["gpus"][0]["profiles"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "7g.80gb"))
        .expect("7g profile");
    assert_eq!(
        seven["free_starts"],
        Value::Array(vec![]),
        "the 1g blocks the 7g"
    );

    // Cancel: the job ends CANCELLED; cancelling again is refused.
    let out = d.ctl(&["jobs", "cancel", "1", "--reason", "maintenance"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "cancelled job 1 (resnet50-serving): CANCELLED cancelled: maintenance\n"
    );
    let out = d.ctl(&["jobs", "cancel", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("already ended (CANCELLED)"),
        "{}",
        text(&out.stderr)
    );
    let parts = d.ctl_json(&["partitions", "show"]);
    assert_eq!(parts[0]["partitions"][0]["jobs"], Value::Array(vec![]));
}

#[tokio::test]
async fn watch_prints_events_as_they_happen() {
    let d = Daemon::start("h100-80gb:1");
    let mut c = d.clients().await;
    let first = d.submit("--online", ONLINE);
    wait_state(&mut c, first, v1::JobState::Running).await;

    // With --current the watch prints the jobs that exist, and mmkd subscribes before it
    // reads them: once job 1's line is out, no later event can be missed.
    let mut watch = Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--socket")
        .arg(d.socket())
        .args(["--output", "json", "jobs", "watch", "--current"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("watch runs");
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let current: Value =
        serde_json::from_str(&lines.next().expect("a line").expect("utf-8")).expect("JSON");
    assert_eq!(
        (current["seq"].as_u64(), current["job"]["state"].as_str()),
        (Some(0), Some("RUNNING"))
    );

    let short = d.submit(
        "--offline",
        "name: short\ngpu_memory: 4GiB\nworkload:\n  name: resnet18-inference\n  duration: 1s\n",
    );
    let mut states = Vec::new();
    let mut last_seq = 0;
    for line in lines.map_while(Result::ok) {
        let v: Value = serde_json::from_str(&line).expect("one JSON object per line");
        assert_eq!(v["job"]["id"].as_u64(), Some(short), "{line}");
        let seq = v["seq"].as_u64().expect("seq");
        assert!(seq > last_seq, "event numbers increase: {line}");
        last_seq = seq;
        let st = v["job"]["state"].as_str().unwrap_or_default().to_owned();
        let done = st == "SUCCEEDED";
        states.push(st);
        if done {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(states, ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]);
}

#[tokio::test]
async fn a_job_that_does_not_fit_waits_and_starts_when_another_ends() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    let big = d.submit(
        "--offline",
        "name: big\ngpu_memory: 70GiB\nworkload:\n  name: bert-train\n  duration: 10h\n",
    );
    wait_state(&mut c, big, v1::JobState::Running).await;
    let next = d.submit(
        "--offline",
        "name: next\ngpu_memory: 50GiB\nworkload:\n  name: resnet152-train\n  duration: 10h\n",
    );
    // It stays queued, and says why.
    let small = d.submit(
        "--offline",
        "name: small\ngpu_memory: 5GiB\nworkload:\n  name: resnet18-inference\n  duration: 10h\n",
    );
    wait_state(&mut c, small, v1::JobState::Running).await;
    let job = c
        .jobs
        .get_job(v1::GetJobRequest { id: next })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(job.state, v1::JobState::Queued as i32);
    assert!(job.reason.contains("waiting for 50GiB"), "{}", job.reason);
    let out = d.ctl(&["jobs", "get", &next.to_string()]);
    assert!(
        text(&out.stdout).contains("reason:       waiting for 50GiB"),
        "{}",
        text(&out.stdout)
    );

    // When the big job ends, the waiting one starts in the freed memory.
    let out = d.ctl(&["jobs", "cancel", &big.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let job = wait_state(&mut c, next, v1::JobState::Running).await;
    assert_eq!(job.assignment.map(|a| a.gpu_index), Some(0));
}

#[tokio::test]
async fn command_jobs_run_as_processes_with_logs_and_exit_codes() {
    let d = Daemon::start("a30-24gb:1");
    let mut c = d.clients().await;
    let ok = d.submit(
        "--offline",
        "name: hello\ngpu_memory: 1GiB\ncommand:\n  args: [sh, -c, 'echo hello from $MMK_JOB_NAME on $CUDA_VISIBLE_DEVICES']\n",
    );
    let job = wait_state(&mut c, ok, v1::JobState::Succeeded).await;
    assert_eq!(job.exit_code, Some(0));
    let a = job.assignment.expect("assignment");
    let log = std::fs::read_to_string(std::path::Path::new(&job.log_dir).join("stdout.log"))
        .expect("stdout.log");
    assert_eq!(log, format!("hello from hello on {}\n", a.device_uuid));

    let bad = d.submit(
        "--offline",
        "name: fails\ngpu_memory: 1GiB\ncommand:\n  args: [sh, -c, 'exit 7']\n",
    );
    let job = wait_state(&mut c, bad, v1::JobState::Failed).await;
    assert_eq!(
        (job.exit_code, job.reason.as_str()),
        (Some(7), "exited with code 7")
    );

    let missing = d.submit(
        "--offline",
        "name: missing\ngpu_memory: 1GiB\ncommand:\n  args: [/no/such/program]\n",
    );
    let job = wait_state(&mut c, missing, v1::JobState::Failed).await;
    assert!(
        job.reason.contains("cannot start \"/no/such/program\""),
        "{}",
        job.reason
    );

    let retried = d.submit(
        "--offline",
        "name: retried\ngpu_memory: 1GiB\nrestart_policy: on-failure\nmax_restarts: 2\ncommand:\n  args: [sh, -c, 'echo run; exit 1']\n",
    );
    let job = wait_state(&mut c, retried, v1::JobState::Failed).await;
    assert_eq!(job.restarts, 2);
    let log = std::fs::read_to_string(std::path::Path::new(&job.log_dir).join("stdout.log"))
        .expect("stdout.log");
    assert_eq!(log, "run\nrun\nrun\n", "the first run and two restarts");
}

#[tokio::test]
async fn health_and_reflection_answer_standard_tools() {
    use tokio_stream::StreamExt;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let d = Daemon::start("h200-141gb:2");
    let c = d.clients().await;
    let channel = c.channel.clone();
    let mut health = HealthClient::new(channel.clone());
    let resp = health
        .check(HealthCheckRequest {
            service: "mmk.v1.JobService".into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(resp.status, ServingStatus::Serving as i32);

    let mut refl = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = refl
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .expect("reflection")
        .into_inner();
    let resp = stream.next().await.expect("a response").expect("ok");
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("expected a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for s in [
        "mmk.v1.JobService",
        "mmk.v1.PartitionService",
        "mmk.v1.NodeService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.iter().any(|n| n == s), "{s} missing from {names:?}");
    }

    // The older version too, which grpcurl releases and grpcio-reflection ask.
    {
        use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
        let mut refl = ServerReflectionClient::new(c.channel.clone());
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = refl
            .server_reflection_info(tokio_stream::iter(vec![req]))
            .await
            .expect("v1alpha reflection")
            .into_inner();
        let resp = stream.next().await.expect("a response").expect("ok");
        let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
            panic!("expected a service list");
        };
        assert!(
            list.service.iter().any(|s| s.name == "mmk.v1.JobService"),
            "{:?}",
            list.service
        );
    }

    let node = d.ctl_json(&["gpus"]);
    assert_eq!(node["gpus"].as_array().map(Vec::len), Some(2));
    let sms: Vec<u64> = node["gpus"][1]["profiles"]
        .as_array()
        .expect("profiles")
        .iter()
        .map(|p| p["sm_count"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(sms, [16, 16, 26, 32, 60, 64, 132]);
}

#[tokio::test]
async fn sigterm_stops_jobs_and_watches_and_exits_cleanly() {
    use tokio_stream::StreamExt;
    let d = Daemon::start("a100-40gb:1");
    let mut c = d.clients().await;
    let id = d.submit(
        "--offline",
        "name: sleeper\ngpu_memory: 1GiB\ncommand:\n  args: [sh, -c, 'echo $$; exec sleep 300']\n",
    );
    let job = wait_state(&mut c, id, v1::JobState::Running).await;
    let log = std::path::Path::new(&job.log_dir).join("stdout.log");
    let pid = loop {
        if let Some(p) = std::fs::read_to_string(&log)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        {
            break p;
        }
        tokio::task::yield_now().await;
    };
    let mut watch = c
        .jobs
        .watch_jobs(v1::WatchJobsRequest {
            job_id: 0,
            include_current: true,
        })
        .await
        .expect("watch")
        .into_inner();
    assert!(watch.next().await.is_some(), "the current job");

    let socket = d.socket();
    // Wait off the runtime, so that this client keeps answering while mmkd drains.
    let (status, _dir) = tokio::task::spawn_blocking(move || d.terminate())
        .await
        .expect("terminate");
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists(), "the socket is removed on shutdown");
    let alive =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
    assert!(!alive, "the job process was stopped");
    let end = tokio::time::timeout(crate::harness::PATIENCE, async {
        while let Some(Ok(_)) = watch.next().await {}
    })
    .await;
    assert!(end.is_ok(), "the watch stream ended");
}

#[tokio::test]
async fn the_examples_in_the_repo_are_accepted() {
    let d = Daemon::start("a100-80gb:1,h100-80gb:1");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut submitted = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if name == "mmkd.yaml" || !name.ends_with(".yaml") {
            continue;
        }
        let out = d.ctl(&["submit", path.to_str().expect("utf-8")]);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        submitted += 1;
    }
    // bert-train, hello, resnet50-serving and train-script.
    assert_eq!(submitted, 4);
    // The daemon's own example config is valid too.
    let cfg = dir.join("mmkd.yaml");
    let dir2 = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_mmkd"))
        .arg("--config")
        .arg(&cfg)
        .arg("--socket")
        .arg(d.path().join("mmkd.sock"))
        .arg("--data-dir")
        .arg(dir2.path())
        .output()
        .expect("mmkd runs");
    // It parses the file, then refuses the socket that the running daemon holds.
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("another mmkd is listening"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn the_mmk_planner_sets_mps_shares_that_reach_the_job() {
    let d = Daemon::start_with("a100-80gb:1", &["--planner", "mmk"]);
    let mut c = d.clients().await;
    let node = d.ctl_json(&["gpus"]);
    assert_eq!(node["planner"], "mmk");

    let serving = d.submit("--online", ONLINE);
    let s = wait_state(&mut c, serving, v1::JobState::Running).await;
    let a = s.assignment.expect("placed");
    assert!(
        a.mps_share < 100,
        "MMK gives the job the share it needs, not the whole partition: {}",
        a.mps_share
    );

    // A second job, offline: wherever MMK puts it, it runs with the share planned for it;
    // beside the online job it has the offline jobs' 100 % (online work first).
    let probe = d.submit(
        "--offline",
        "name: probe\ngpu_memory: 4GiB\ncommand:\n  args: [sh, -c, 'echo $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE']\n",
    );
    let p = wait_state(&mut c, probe, v1::JobState::Succeeded).await;
    let pa = p.assignment.expect("placed");
    let same = (pa.gpu_index, pa.start_slice, pa.profile.as_str())
        == (a.gpu_index, a.start_slice, a.profile.as_str());
    assert!(
        (10..=100).contains(&pa.mps_share),
        "{} beside {} (same partition: {same})",
        pa.mps_share,
        a.mps_share
    );
    let log = std::fs::read_to_string(std::path::Path::new(&p.log_dir).join("stdout.log"))
        .expect("stdout.log");
    assert_eq!(
        log.trim(),
        pa.mps_share.to_string(),
        "the job runs with the planned share"
    );

    // An unknown planner is refused at start, naming the setting.
    let out = Command::new(env!("CARGO_BIN_EXE_mmkd"))
        .args(["--backend", "sim", "--planner", "best"])
        .output()
        .expect("mmkd runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("planner: unknown planner \"best\""),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn partitions_plan_is_a_dry_run() {
    let d = Daemon::start_with("a100-80gb:1", &["--planner", "mmk"]);
    let mut c = d.clients().await;
    let first = d.submit(
        "--offline",
        "name: first\ngpu_memory: 30GiB\nworkload:\n  name: mobilenet-inference\n  duration: 10h\n",
    );
    wait_state(&mut c, first, v1::JobState::Running).await;
    let before = d.ctl_json(&["partitions", "show"]);

    let small = d.job_file(
        "small.yaml",
        "name: small\nclass: online\ngpu_memory: 4GiB\nslo: 50ms\nworkload:\n  name: resnet18-inference\n",
    );
    let huge = d.job_file(
        "huge.yaml",
        "name: huge\nclass: offline\ngpu_memory: 200GiB\nworkload:\n  name: bert-train\n",
    );
    let out = d.ctl(&["partitions", "plan", &small, &huge]);
    let table = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        table.starts_with("planner mmk, predicted system throughput "),
        "{table}"
    );
    assert!(
        table.contains(&format!("  {small} (small): gpu 0 ")),
        "{table}"
    );
    assert!(
        table.contains(&format!("  {huge} (huge): would wait: needs 200GiB")),
        "{table}"
    );
    assert!(table.ends_with("(a dry run: nothing changed)\n"), "{table}");

    let plan = d.ctl_json(&["partitions", "plan", &small, &huge]);
    assert_eq!(plan["planner"], "mmk");
    assert_eq!(plan["jobs"][0]["name"], "small");
    assert!(
        plan["jobs"][0]["placement"]["mps_share"]
            .as_u64()
            .is_some_and(|s| (10..=100).contains(&s))
    );
    assert_eq!(plan["jobs"][1]["placement"], Value::Null);

    // Nothing changed on the node.
    assert_eq!(d.ctl_json(&["partitions", "show"]), before);
    assert_eq!(d.ctl_json(&["jobs"]).as_array().map(Vec::len), Some(1));

    // The layout as a config for NVIDIA's mig-parted: now, and after the dry run.
    let mut counts = serde_json::Map::new();
    for p in before[0]["partitions"].as_array().expect("partitions") {
        let n = counts
            .get(p["profile"].as_str().expect("profile"))
            .and_then(Value::as_u64);
        counts.insert(
            p["profile"].as_str().expect("profile").into(),
            (n.unwrap_or(0) + 1).into(),
        );
    }
    let out = d.ctl(&["partitions", "export", "--format", "mig-parted"]);
    let yaml = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        yaml.starts_with("version: v1\nmig-configs:\n  mmk:\n  - devices:\n    - 0\n    mig-enabled: true\n    mig-devices:\n"),
        "{yaml}"
    );
    let now = d.ctl_json(&["partitions", "export", "--format", "mig-parted"]);
    assert_eq!(
        now["mig-configs"]["mmk"][0]["mig-devices"],
        Value::Object(counts.clone())
    );
    let plan = d.ctl_json(&["partitions", "plan", &small]);
    let by_id: Vec<(u64, String)> = before[0]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| {
            (
                p["instance_id"].as_u64().expect("a number"),
                p["profile"].as_str().expect("a string").to_owned(),
            )
        })
        .collect();
    for step in plan["steps"].as_array().expect("steps") {
        let profile = match step["kind"].as_str() {
            Some("create") => step["profile"].as_str().expect("a string").to_owned(),
            _ => by_id
                .iter()
                .find(|(id, _)| Some(*id) == step["instance_id"].as_u64())
                .expect("a destroyed instance the node listed")
                .1
                .clone(),
        };
        let n = counts.get(&profile).and_then(Value::as_u64).unwrap_or(0);
        let n = if step["kind"] == "create" {
            n + 1
        } else {
            n - 1
        };
        if n == 0 {
            counts.remove(&profile);
        } else {
            counts.insert(profile, n.into());
        }
    }
    let planned = d.ctl_json(&[
        "partitions",
        "export",
        "--format",
        "mig-parted",
        "--name",
        "next",
        "--online",
        &small,
    ]);
    assert_eq!(
        planned["mig-configs"]["next"][0]["mig-devices"],
        Value::Object(counts)
    );
    let out = d.ctl(&[
        "partitions",
        "export",
        "--format",
        "mig-parted",
        "--name",
        "a b",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--name \"a b\""),
        "{}",
        text(&out.stderr)
    );

    // A bad file is refused like `submit` refuses it.
    let bad = d.job_file(
        "bad.yaml",
        "name: bad\nclass: offline\ngpu_memory: 0\nworkload:\n  name: bert-train\n",
    );
    let out = d.ctl(&["partitions", "plan", &bad]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("line 3: gpu_memory"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn mmk_moves_a_checkpointable_job_to_a_larger_share() {
    // The move mechanism (stop, requeue, restart with MMK_RESUME=1 and the new share), on
    // the analytic model, whose shares the test can follow. Offline shares capped at 60 %
    // leave the trainer room within the shares (past them it would join at the cap).
    let d = Daemon::start_with(
        "a100-80gb:1",
        &[
            "--planner",
            "mmk",
            "--model",
            "analytic",
            "--offline-share-max",
            "60",
        ],
    );
    let mut c = d.clients().await;
    let first = d.submit(
        "--offline",
        "name: first\ngpu_memory: 30GiB\ncommand:\n  profile: transformer-train\n  args: [sleep, '300']\n",
    );
    let f = wait_state(&mut c, first, v1::JobState::Running).await;
    let f = f.assignment.expect("first placed");
    let trainer = d.submit(
        "--offline",
        "name: trainer\ngpu_memory: 30GiB\ncheckpoint: true\ncommand:\n  args: [sh, -c, 'echo start ${MMK_RESUME:-0} $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; exec sleep 300']\n",
    );
    let t = wait_state(&mut c, trainer, v1::JobState::Running).await;
    let placed = t.assignment.clone().expect("placed");
    let before = placed.mps_share;
    // The trainer shares the first job's partition, within its shares.
    assert_eq!(
        (placed.gpu_index, placed.instance_id),
        (f.gpu_index, f.instance_id),
        "{placed:?} beside {f:?}"
    );
    assert!(before + f.mps_share <= 100, "{placed:?} beside {f:?}");

    // When the first job leaves, the trainer restarts with a larger share.
    let out = d.ctl(&["jobs", "cancel", &first.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log_file = std::path::Path::new(&t.log_dir).join("stdout.log");
    let log = wait_for("the trainer's second start", || {
        let l = std::fs::read_to_string(&log_file).unwrap_or_default();
        (l.lines().count() >= 2).then_some(l)
    });
    let t = wait_state(&mut c, trainer, v1::JobState::Running).await;
    let after = t.assignment.expect("placed").mps_share;
    assert!(after > before, "{before} -> {after}");
    assert_eq!(t.restarts, 1, "{}", t.reason);
    // The move is in the job's history, and the second run resumed with its new share.
    assert_eq!(log, format!("start 0 {before}\nstart 1 {after}\n"));
}

/// A managed job runs as the user who submitted it (SO_PEERCRED), never as root unless
/// the caller is root. CI runs as root, which this test needs to submit as another user.
#[tokio::test]
async fn a_job_runs_as_the_user_who_submitted_it() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: submitting as another user needs root");
        return;
    }
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    // Let an unprivileged user reach the socket and the job file.
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    std::fs::set_permissions(d.socket(), std::fs::Permissions::from_mode(0o666))
        .expect("chmod socket");
    let file = d.job_file(
        "whoami.yaml",
        "name: whoami\nclass: offline\ngpu_memory: 1GiB\ncommand:\n  args: [sh, -c, 'id -u; id -g']\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .args(["--output", "json", "submit"])
        .arg(&file)
        .arg("--socket")
        .arg(d.socket())
        .current_dir(d.path())
        .env_remove("MMK_SOCKET")
        .uid(65534)
        .gid(65534)
        .output()
        .expect("mmkctl runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let job: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        (job["owner_uid"].as_u64(), job["owner_gid"].as_u64()),
        (Some(65534), Some(65534))
    );
    let id = job["id"].as_u64().expect("id");
    let j = wait_state(&mut c, id, v1::JobState::Succeeded).await;
    let log =
        std::fs::read_to_string(std::path::Path::new(&j.log_dir).join("stdout.log")).expect("log");
    assert_eq!(log, "65534\n65534\n", "the job ran as nobody, not as root");

    // Root's own job runs as root.
    let mine = d.submit(
        "--offline",
        "name: mine\ngpu_memory: 1GiB\ncommand:\n  args: [id, -u]\n",
    );
    let j = wait_state(&mut c, mine, v1::JobState::Succeeded).await;
    let log =
        std::fs::read_to_string(std::path::Path::new(&j.log_dir).join("stdout.log")).expect("log");
    assert_eq!(log, "0\n");
}

#[tokio::test]
async fn logs_print_and_follow_a_jobs_output() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    let id = d.submit(
        "--offline",
        "name: talker\ngpu_memory: 1GiB\ncommand:\n  args: [sh, -c, 'for i in 1 2 3; do echo line $i; sleep 0.2; done; echo oops >&2']\n",
    );
    // Follow from the start: every line, then the command returns once the job ended.
    let out = Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--socket")
        .arg(d.socket())
        .args(["jobs", "logs", "--follow", &id.to_string()])
        .env_remove("MMK_SOCKET")
        .output()
        .expect("mmkctl runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "line 1\nline 2\nline 3\n");
    wait_state(&mut c, id, v1::JobState::Succeeded).await;
    let out = d.ctl(&["jobs", "logs", "--stderr", &id.to_string()]);
    assert_eq!(text(&out.stdout), "oops\n");

    let sim = d.submit(
        "--offline",
        "name: sim\ngpu_memory: 1GiB\nworkload:\n  name: resnet18-inference\n",
    );
    let out = d.ctl(&["jobs", "logs", &sim.to_string()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("simulated workload; it has no logs"),
        "{}",
        text(&out.stderr)
    );
    let out = d.ctl(&["jobs", "logs", "999"]);
    assert_eq!(out.status.code(), Some(1));
}

#[tokio::test]
async fn output_into_a_pipe_closed_early_ends_mmkctl_quietly() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    for i in 0..300 {
        c.jobs
            .submit_job(v1::SubmitJobRequest {
                spec: Some(v1::JobSpec {
                    name: format!("many-{i}"),
                    class: v1::JobClass::Offline as i32,
                    gpu_memory_mib: 70_000,
                    task: Some(v1::job_spec::Task::Workload(v1::WorkloadTask {
                        name: "bert-train".into(),
                        ..Default::default()
                    })),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("submit");
    }
    // `mmkctl jobs --output json | head -1`: the reader goes away after the first line,
    // with more left than a pipe holds (300 jobs in JSON are over 64 KiB).
    let mut child = Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--socket")
        .arg(d.socket())
        .args(["jobs", "--output", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mmkctl");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("a line");
    assert!(first.starts_with('['), "{first}");
    let out = child.wait_with_output().expect("mmkctl ends");
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(141), "{:?}", out.status);
}
