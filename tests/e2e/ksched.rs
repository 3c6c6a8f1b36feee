//! The kernel scheduler under mmkd: a managed job runs with the interposer preloaded and
//! launches through its partition's gate, which mmkd made with the partition's SMs.

use std::path::{Path, PathBuf};

use mmk_kernel_sched::artifacts::{self, FAKE_APP, FAKE_CUDA, INTERPOSER};
use mmk_kernel_sched::{Gate, PolicyKind, Profile};
use mmk_proto::v1;

use crate::harness::{Daemon, mmkctl_in, text, wait_state};

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

/// The fake driver as `libcuda.so.1` and `libcudart.so.13` in `dir/lib`.
fn fake_driver_in(bin: &Path, dir: &Path) -> PathBuf {
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    std::fs::copy(bin.join(FAKE_CUDA), lib.join("libcuda.so.1")).expect("copy");
    std::fs::copy(bin.join(FAKE_CUDA), lib.join("libcudart.so.13")).expect("copy");
    lib
}

#[tokio::test]
async fn profile_ksim_and_an_online_jobs_policy_work_end_to_end() {
    let bin = built();
    let interposer = bin.join(INTERPOSER).display().to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = fake_driver_in(&bin, dir.path());
    let app = bin.join(FAKE_APP).display().to_string();
    // An online service: one 200 us kernel a request, 1.5 ms apart; training: 1 ms
    // kernels back to back.
    let serve = format!(
        "name: serve\nclass: online\ngpu_memory: 2GiB\ncommand:\n  args: [{app}, --api, driver, --kernels, '30', --duration-us, '200', --gap-us, '1500']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n",
        lib = lib.display()
    );
    let train = format!(
        "name: train\nclass: offline\ngpu_memory: 2GiB\ncommand:\n  args: [{app}, --api, runtime, --kernels, '40', --duration-us, '1000']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n",
        lib = lib.display()
    );
    std::fs::write(dir.path().join("serve.yaml"), serve).expect("write");
    std::fs::write(dir.path().join("train.yaml"), train).expect("write");

    let out = mmkctl_in(
        dir.path(),
        &[
            "--output",
            "json",
            "profile",
            "serve.yaml",
            "--runs",
            "2",
            "--interposer",
            &interposer,
            "--save-trace",
            "serve.csv",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("run 2/2"), "progress is shown");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(summary["launches"], 60, "{summary}");
    assert_eq!(summary["requests"], 60, "every kernel is its own request");
    let written = dir.path().join("serve.kprofile.json");
    assert_eq!(summary["file"], written.display().to_string());
    let profile = Profile::parse(&std::fs::read_to_string(&written).expect("profile"))
        .expect("a valid profile");
    let mean = profile.kernels[0].mean_ns;
    assert!(
        (150_000..2_000_000).contains(&mean),
        "the fake's 200 us kernel measured {mean} ns"
    );
    let out = mmkctl_in(
        dir.path(),
        &[
            "profile",
            "train.yaml",
            "--interposer",
            &interposer,
            "--save-trace",
            "train.csv",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("40 launches"),
        "{}",
        text(&out.stdout)
    );

    // The kernel-level simulator on the two traces, every policy.
    let out = mmkctl_in(
        dir.path(),
        &[
            "--output",
            "json",
            "ksim",
            "--online",
            "serve.csv",
            "--offline",
            "train.csv",
            "--interval",
            "5ms",
            "--duration",
            "2s",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = report["policies"].as_array().expect("policies");
    let names: Vec<_> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["passthrough", "mmk", "orion", "fikit"]);
    assert_eq!(rows[0]["offline"][0]["vs_passthrough"], 1.0);
    for r in rows {
        let online = &r["online"][0];
        assert!(online["requests"].as_u64().unwrap() > 100, "{r}");
        assert!(online["p50_vs_alone"].as_f64().unwrap() >= 0.99, "{r}");
    }
    let out = mmkctl_in(dir.path(), &["ksim", "--online", "nope.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("nope.csv"),
        "{}",
        text(&out.stderr)
    );

    // An online job that names a policy and its profile sets its partition's gate.
    let d = Daemon::start_with("a100-80gb:1", &["--interposer", &interposer]);
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
