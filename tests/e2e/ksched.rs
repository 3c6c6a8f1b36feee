//! The kernel scheduler under mmkd: a managed job runs with the interposer preloaded and
//! launches through its partition's gate, which mmkd made with the partition's SMs.

use std::path::{Path, PathBuf};

use mmk_kernel_sched::artifacts::{self, Built, FAKE_APP, FAKE_CUDA, INTERPOSER};
use mmk_kernel_sched::profile::{KernelStats, PROFILE_VERSION};
use mmk_kernel_sched::{Gate, KernelKey, PolicyKind, Profile};
use mmk_proto::v1;

use crate::harness::{Daemon, wait_state};

/// The interposer, the fake driver and its test program, built once for the test binary.
pub(crate) fn built() -> Built {
    artifacts::built_for_tests(&artifacts::ALL).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn a_managed_job_launches_through_its_partitions_gate() {
    let bin = built();
    let interposer = bin.join(INTERPOSER).display().to_string();
    let d = Daemon::start_with("a100-80gb:1", &["--interposer", &interposer]);
    assert!(
        d.startup.iter().any(|l| l.contains("kernel scheduler")),
        "{:?}",
        d.startup
    );
    // The fake driver stands in for libcuda.so.1 on the job's library path.
    let lib = d.path().join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    std::fs::copy(bin.join(FAKE_CUDA), lib.join("libcuda.so.1")).expect("copy");
    std::fs::copy(bin.join(FAKE_CUDA), lib.join("libcudart.so.13")).expect("copy");
    let yaml = format!(
        "name: kernels\ngpu_memory: 3GiB\ncommand:\n  args: [{app}, --api, all, --kernels, '25', --duration-us, '100']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n",
        app = bin.join(FAKE_APP).display(),
        lib = lib.display(),
    );
    let mut c = d.clients().await;
    let id = d.submit("--online", &yaml);
    let job = wait_state(&mut c, id, v1::JobState::Succeeded).await;
    let a = job.assignment.clone().expect("placed");
    let out = std::fs::read_to_string(Path::new(&job.log_dir).join("stdout.log"))
        .expect("the job's output");
    assert!(out.contains("\"launched\":25"), "{out}");

    // The partition's gate: made by mmkd with the instance's SMs and the default policy,
    // and every launch of the job went through it.
    let gate_path = d
        .data_dir()
        .join("ksched")
        .join(format!("g{}i{}.gate", a.gpu_index, a.instance_id));
    let gate = Gate::open(&gate_path).expect("the partition's gate");
    assert_eq!(gate.config().policy, PolicyKind::Mmk);
    let parts = d.ctl_json(&["partitions", "show"]);
    let part = parts[0]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .find(|p| p["instance_id"] == a.instance_id)
        .expect("the job's partition")
        .clone();
    let sms = part["sm_count"].as_u64().expect("the partition's SMs");
    assert_eq!(u64::from(gate.config().sm_count), sms);
    assert_eq!(gate.totals().launches, 25);
    assert!(
        gate.slots().is_empty(),
        "the job left its slot when it exited"
    );
    // `partitions show` reads the same gate.
    let g = &part["gate"];
    assert_eq!(g["path"], gate_path.display().to_string());
    assert_eq!(g["error"], serde_json::Value::Null);
    assert_eq!(g["policy"], "mmk");
    assert_eq!(
        g["hold_budget_pct"], 0,
        "the default hold budget: track, hold nothing"
    );
    assert_eq!(g["launches"], 25);
    assert_eq!(g["held"], 0, "one online job: nothing to hold");
    assert_eq!(g["processes"], serde_json::json!([]));
    let table = d.ctl(&["partitions", "show"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(
            "\n      kernel gate mmk, hold budget 0 % (tracks, holds nothing): 25 launches, 0 held (0 us), 0 forced\n"
        ),
        "{table}"
    );

    // What the interposer counted in the job's process, in the job's own directory.
    let files: Vec<_> = std::fs::read_dir(Path::new(&job.log_dir).join("work"))
        .expect("the job's work dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("ksched-"))
        })
        .collect();
    assert_eq!(
        files.len(),
        1,
        "one CUDA process, one stats file: {files:?}"
    );
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).expect("stats")).expect("JSON");
    assert_eq!(stats["class"], "online");
    assert_eq!(stats["launches"], 25);
    assert_eq!(
        files[0]
            .file_name()
            .map(|n| n.to_string_lossy().into_owned()),
        Some(format!("ksched-{}.json", stats["pid"])),
        "the file is named by the process's pid"
    );
}

/// The fake driver as `libcuda.so.1` and `libcudart.so.13` in `dir/lib`.
pub(crate) fn fake_driver_in(bin: &Built, dir: &Path) -> PathBuf {
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    std::fs::copy(bin.join(FAKE_CUDA), lib.join("libcuda.so.1")).expect("copy");
    std::fs::copy(bin.join(FAKE_CUDA), lib.join("libcudart.so.13")).expect("copy");
    lib
}

/// A kernel profile of one 200 us kernel a request, as `mmk-lab profile` writes one.
fn one_kernel_profile(job: &str) -> Profile {
    Profile {
        version: PROFILE_VERSION,
        job: job.into(),
        class: "online".into(),
        launches: 60,
        requests: 60,
        request_ns: 200_000,
        kernels: vec![KernelStats {
            key: KernelKey {
                name: "fake_kernel".into(),
                grid: [1, 1, 1],
                block: [1, 1, 1],
                shared_mem: 0,
            },
            launches: 60,
            mean_ns: 200_000,
            p95_ns: 210_000,
            gap_after_ns: 0,
            ends_request: 1.0,
            sm_demand: 1,
            intensity: Default::default(),
        }],
    }
}

#[tokio::test]
async fn an_online_jobs_kernel_policy_and_profile_set_its_partitions_gate() {
    let bin = built();
    let interposer = bin.join(INTERPOSER).display().to_string();
    let d = Daemon::start_with("a100-80gb:1", &["--interposer", &interposer]);
    let lib = fake_driver_in(&bin, d.path());
    let app = bin.join(FAKE_APP).display().to_string();
    let profile = one_kernel_profile("kernels");
    let written = d.path().join("serve.kprofile.json");
    std::fs::write(&written, profile.to_json()).expect("write the profile");
    // An online job that names a policy and its profile sets its partition's gate.
    let yaml = format!(
        "name: kernels\ngpu_memory: 3GiB\ncommand:\n  args: [{app}, --api, driver, --kernels, '5']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n  kernel_policy: orion\n  kernel_profile: {profile}\n",
        lib = lib.display(),
        profile = written.display()
    );
    let mut c = d.clients().await;
    let id = d.submit("--online", &yaml);
    let job = wait_state(&mut c, id, v1::JobState::Succeeded).await;
    let a = job.assignment.clone().expect("placed");
    let gate = Gate::open(
        &d.data_dir()
            .join("ksched")
            .join(format!("g{}i{}.gate", a.gpu_index, a.instance_id)),
    )
    .expect("the partition's gate");
    assert_eq!(gate.config().policy, PolicyKind::Orion);
    assert_eq!(
        gate.config().base.as_nanos(),
        u128::from(profile.dur_threshold_ns().expect("requests")),
        "DUR_THRESHOLD is 2.5 % of the profiled request"
    );
    // A profile that is not there fails the job with the file's name.
    let yaml = yaml.replace("serve.kprofile.json", "missing.json");
    let id = d.submit("--online", &yaml);
    let job = wait_state(&mut c, id, v1::JobState::Failed).await;
    assert!(job.reason.contains("missing.json"), "{}", job.reason);
}
