//! The kernel scheduler under mmkd: a managed job runs with the interposer preloaded and
//! launches through its partition's gate, which mmkd made with the partition's SMs.

use std::path::{Path, PathBuf};

use mmk_kernel_sched::artifacts::{self, FAKE_APP, FAKE_CUDA, INTERPOSER};
use mmk_kernel_sched::{Gate, PolicyKind};
use mmk_proto::v1;

use crate::harness::{Daemon, wait_state};

/// The interposer, the fake driver and its test program, built once for the test binary.
fn built() -> PathBuf {
    artifacts::build_for_tests(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("ksched"))
        .expect("the interposer builds")
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
    let sms = parts[0]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .find(|p| p["instance_id"] == a.instance_id)
        .and_then(|p| p["sm_count"].as_u64())
        .expect("the partition's SMs");
    assert_eq!(u64::from(gate.config().sm_count), sms);
    assert_eq!(gate.totals().launches, 25);
    assert!(
        gate.slots().is_empty(),
        "the job left its slot when it exited"
    );
}
