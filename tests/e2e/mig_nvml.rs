//! MIG on "real" GPUs: `mmkd --backend nvml` over the fake libnvidia-ml (crate
//! `fake-nvml`), whose state file the `mmk-fake-nvml` inspector reads and changes as an
//! operator with `nvidia-smi` would.

use std::path::{Path, PathBuf};
use std::process::Command;

use mmk_kernel_sched::artifacts::{FAKE_NVML, FAKE_NVML_TOOL};
use mmk_proto::v1;
use serde_json::Value;

use mmkctl::client::Clients;

use crate::harness::{Daemon, text, wait_state};
use crate::ksched::built;

/// A fake node: its state file and the library mmkd loads.
struct FakeNvml {
    _dir: tempfile::TempDir,
    state: PathBuf,
    lib: String,
}

impl FakeNvml {
    /// GPUs `spec` (`a100-80gb:2`), MIG mode on.
    fn new(spec: &str) -> FakeNvml {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("nvml.json");
        let f = FakeNvml {
            lib: built().join(FAKE_NVML).display().to_string(),
            state,
            _dir: dir,
        };
        f.tool(&["init", spec]);
        f
    }

    /// The inspector; panics with its message when it refuses.
    fn tool(&self, args: &[&str]) -> String {
        let (verb, rest) = args.split_first().expect("a verb");
        let out = Command::new(built().join(FAKE_NVML_TOOL))
            .arg(verb)
            .arg(&self.state)
            .args(rest)
            .output()
            .expect("mmk-fake-nvml runs");
        assert!(
            out.status.success(),
            "mmk-fake-nvml {args:?}: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Each GPU's instances as (profile ID, start, has a compute instance).
    fn instances(&self) -> Vec<Vec<(u64, u64, bool)>> {
        let node: Value = serde_json::from_str(&self.tool(&["json"])).expect("json");
        node["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .map(|g| {
                g["instances"]
                    .as_array()
                    .expect("instances")
                    .iter()
                    .map(|i| {
                        (
                            i["profile_id"].as_u64().expect("a number"),
                            i["start"].as_u64().expect("a number"),
                            !i["compute"].is_null(),
                        )
                    })
                    .collect()
            })
            .collect()
    }

    fn env(&self) -> [(&'static str, &str); 1] {
        [("MMK_FAKE_NVML_STATE", self.state.to_str().expect("utf-8"))]
    }

    fn flags<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut f = vec![
            "--backend",
            "nvml",
            "--nvml-lib",
            &self.lib,
            "--mps",
            "fake",
        ];
        f.extend_from_slice(extra);
        f
    }

    fn start(&self, extra: &[&str]) -> Daemon {
        Daemon::start_with_env("", &self.flags(extra), &self.env())
    }
}

fn job(name: &str, gib: u32) -> String {
    format!(
        "name: {name}\ngpu_memory: {gib}GiB\nworkload:\n  name: resnet50-train\n  duration: 10h\n"
    )
}

/// Polls job `id` until its reason contains `needle`.
async fn wait_reason(c: &mut Clients, id: u64, needle: &str) -> v1::Job {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let j = c
            .jobs
            .get_job(v1::GetJobRequest { id })
            .await
            .expect("get job")
            .into_inner();
        if j.reason.contains(needle) {
            return j;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "job {id}: no reason with {needle:?}; last: {:?} {}",
            j.state,
            j.reason
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// (profile, start slice) of every partition on GPU `gpu`, by `partitions show`.
fn layout(d: &Daemon, gpu: usize) -> Vec<(String, u64)> {
    let parts = d.ctl_json(&["partitions", "show"]);
    parts[gpu]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| {
            (
                p["profile"].as_str().expect("a string").to_owned(),
                p["start_slice"].as_u64().expect("a number"),
            )
        })
        .collect()
}

#[tokio::test]
async fn layouts_change_through_nvml_as_on_the_simulated_node_and_a_busy_instance_waits() {
    let fake = FakeNvml::new("a100-80gb:1");
    let d = fake.start(&[]);
    assert!(
        d.startup
            .iter()
            .any(|l| l.contains("MIG on: mmkd creates and destroys its instances")),
        "{:?}",
        d.startup
    );
    let mut c = d.clients().await;
    let a = d.submit("--offline", &job("a", 8));
    let b = d.submit("--offline", &job("b", 30));
    let ja = wait_state(&mut c, a, v1::JobState::Running).await;
    wait_state(&mut c, b, v1::JobState::Running).await;
    let assigned = ja.assignment.expect("a partition");
    assert!(
        assigned.device_uuid.starts_with("MIG-"),
        "{}",
        assigned.device_uuid
    );
    // The driver holds what mmkd made: a GPU instance with its compute instance each.
    let made = fake.instances();
    assert_eq!(made[0].len(), 2, "{made:?}");
    assert!(made[0].iter().all(|i| i.2), "{made:?}");

    // The simulated node, given the same jobs, makes the same layout.
    let sim = Daemon::start("a100-80gb:1");
    let mut cs = sim.clients().await;
    for (name, gib) in [("a", 8), ("b", 30)] {
        let id = sim.submit("--offline", &job(name, gib));
        wait_state(&mut cs, id, v1::JobState::Running).await;
    }
    assert_eq!(layout(&d, 0), layout(&sim, 0));

    // A process on job a's instance: the layout change that needs its slices waits, with
    // the reason, until the instance is free.
    let a_instance = d.ctl_json(&["partitions", "show"])[0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["jobs"][0]["id"] == a)
        .and_then(|p| p["instance_id"].as_u64())
        .expect("a's instance");
    fake.tool(&["busy", "0", &a_instance.to_string(), "on"]);
    for id in [a, b] {
        assert!(d.ctl(&["jobs", "cancel", &id.to_string()]).status.success());
        wait_state(&mut c, id, v1::JobState::Cancelled).await;
    }
    let whole = d.submit("--offline", &job("whole", 70));
    wait_reason(&mut c, whole, "is in use").await;
    fake.tool(&["busy", "0", &a_instance.to_string(), "off"]);
    let j = wait_state(&mut c, whole, v1::JobState::Running).await;
    assert_eq!(j.assignment.expect("placed").profile, "7g.80gb");
    assert_eq!(fake.instances()[0], vec![(0, 0, true)]);
}

#[tokio::test]
async fn instances_mmkd_did_not_make_are_used_and_kept_and_mig_off_gives_the_whole_gpu() {
    let fake = FakeNvml::new("a100-80gb:2");
    fake.tool(&["mig", "1", "off"]);
    let foreign = fake.tool(&["create", "0", "3g.40gb", "0"]);
    let d = fake.start(&[]);
    let startup = d.startup.join("\n");
    assert!(
        startup.contains("instances mmkd did not create: used, the layout kept"),
        "{startup}"
    );
    assert!(
        startup.contains("MIG off: jobs get the whole GPU"),
        "{startup}"
    );
    let mut c = d.clients().await;
    // A job that fits the operator's instance runs there.
    let small = d.submit("--offline", &job("small", 30));
    let j = wait_state(&mut c, small, v1::JobState::Running).await;
    let a = j.assignment.expect("placed");
    assert_eq!((a.gpu_index, a.profile.as_str()), (0, "3g.40gb"));
    // One that needs a whole GPU gets GPU 1 (MIG off); GPU 0's layout is not touched.
    let big = d.submit("--offline", &job("big", 70));
    let j = wait_state(&mut c, big, v1::JobState::Running).await;
    let a = j.assignment.expect("placed");
    assert_eq!((a.gpu_index, a.profile.as_str()), (1, "whole"));
    // With the small job gone, one more that needs the whole of GPU 0 waits: the
    // operator's instance stays.
    assert!(
        d.ctl(&["jobs", "cancel", &small.to_string()])
            .status
            .success()
    );
    wait_state(&mut c, small, v1::JobState::Cancelled).await;
    let other = d.submit("--offline", &job("other", 70));
    wait_reason(&mut c, other, "waiting").await;
    let state = fake.tool(&["show"]);
    assert!(state.contains("3g.40gb"), "{state}");
    assert_eq!(
        fake.instances()[0],
        vec![(9, 0, true)],
        "instance {foreign} is kept"
    );
    drop(d);

    // --mig-take-over: mmkd may destroy it, once GPU 1 is taken.
    let d = fake.start(&["--mig-take-over"]);
    let mut c = d.clients().await;
    let first = d.submit("--offline", &job("first", 70));
    let second = d.submit("--offline", &job("second", 70));
    let mut placed = Vec::new();
    for id in [first, second] {
        let a = wait_state(&mut c, id, v1::JobState::Running)
            .await
            .assignment
            .expect("placed");
        placed.push((a.gpu_index, a.profile));
    }
    placed.sort();
    assert_eq!(placed, [(0, "7g.80gb".to_owned()), (1, "whole".to_owned())]);
    assert_eq!(fake.instances()[0], vec![(0, 0, true)]);
}

#[tokio::test]
async fn an_instance_made_just_before_a_crash_is_mmkds_after_the_restart() {
    let fake = FakeNvml::new("a100-80gb:1");
    let mut env = fake.env().to_vec();
    env.push(("MMK_FAKE_NVML_ABORT_AFTER_CREATES", "1"));
    let d = Daemon::start_with_env("", &fake.flags(&[]), &env);
    d.submit(
        "--offline",
        "name: a\ngpu_memory: 30GiB\nrestart_policy: on-failure\nworkload:\n  name: resnet50-train\n  duration: 10h\n",
    );
    let (status, dir) = d.wait_exit();
    assert!(!status.success(), "the injected crash: {status:?}");
    assert_eq!(fake.instances()[0].len(), 1, "the driver made it");

    let d = Daemon::restart_with_env(dir, &fake.flags(&[]), &fake.env());
    let startup = d.startup.join("\n");
    assert!(
        startup.contains("own=1"),
        "the journal's interrupted step claims it: {startup}"
    );
    let mut c = d.clients().await;
    let j = wait_state(&mut c, 1, v1::JobState::Running).await;
    let a = j.assignment.expect("placed");
    assert_eq!(a.profile, "3g.40gb");
    assert!(a.device_uuid.starts_with("MIG-"), "{}", a.device_uuid);
    assert_eq!(
        fake.instances()[0],
        vec![(9, 0, true)],
        "no second instance, and the one the crash left half made has its compute instance"
    );
    // mmkd's own: a job that needs the whole GPU gets it once the first is gone.
    assert!(d.ctl(&["jobs", "cancel", "1"]).status.success());
    wait_state(&mut c, 1, v1::JobState::Cancelled).await;
    let whole = d.submit("--offline", &job("whole", 70));
    let j = wait_state(&mut c, whole, v1::JobState::Running).await;
    assert_eq!(j.assignment.expect("placed").profile, "7g.80gb");

    // With mmkd down, the operator destroys that instance and makes the same one again
    // (same profile, place and ID, a new MIG device): it is not mmkd's.
    let dir = d.kill_9();
    fake.tool(&["destroy", "0", "1"]);
    assert_eq!(fake.tool(&["create", "0", "7g.80gb", "0"]).trim(), "1");
    let d = Daemon::restart_with_env(dir, &fake.flags(&[]), &fake.env());
    let startup = d.startup.join("\n");
    assert!(
        startup.contains("instances mmkd did not create: used, the layout kept"),
        "{startup}"
    );
}

#[test]
fn the_fakes_profiles_match_the_catalog_and_refuse_bad_placements() {
    let fake = FakeNvml::new("h100-80gb:1");
    // A 4g.40gb goes only at slice 0.
    let out = Command::new(built().join(FAKE_NVML_TOOL))
        .args(["create"])
        .arg(&fake.state)
        .args(["0", "4g.40gb", "4"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("InvalidArgument"),
        "{}",
        text(&out.stderr)
    );
    fake.tool(&["create", "0", "4g.40gb", "0"]);
    let out = Command::new(built().join(FAKE_NVML_TOOL))
        .args(["create"])
        .arg(&fake.state)
        .args(["0", "3g.40gb", "0"])
        .output()
        .expect("runs");
    assert!(
        text(&out.stderr).contains("InsufficientResources"),
        "{}",
        text(&out.stderr)
    );
    let _ = Path::new(&fake.lib);
}

/// The GPU memory NVML reports for a job's process is its learned profile's peak, and the
/// DRAM bandwidth GPM reports for its MIG instance, where it runs alone, its bandwidth (as
/// a share of the GPU's).
#[tokio::test]
async fn the_memory_and_bandwidth_nvml_reports_for_a_job_are_learned() {
    use mmk_kernel_sched::artifacts::{FAKE_APP, INTERPOSER};

    let fake = FakeNvml::new("h100-80gb:1");
    fake.tool(&["gpm", "0", "37"]);
    let bin = built();
    let interposer = bin.join(INTERPOSER).display().to_string();
    let d = fake.start(&["--interposer", &interposer]);
    let lib = crate::ksched::fake_driver_in(&bin, d.path());
    let yaml = format!(
        "name: holder\ngpu_memory: 4GiB\ncommand:\n  args: [{app}, --kernels, '600', --duration-us, '5000', --gap-us, '5000', --blocks, '54', --sync-every, '1']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n",
        app = bin.join(FAKE_APP).display(),
        lib = lib.display(),
    );
    let mut c = d.clients().await;
    let id = d.submit("--offline", &yaml);
    wait_state(&mut c, id, v1::JobState::Running).await;
    // The job's process, as its partition's gate lists it, holds 2 GiB in its instance.
    let (pid, instance, mem_frac) =
        crate::harness::wait_for("the job's process in its gate", || {
            let parts = d.ctl_json(&["partitions", "show"]);
            let part = parts[0]["partitions"].as_array()?.first()?.clone();
            let pid = part["gate"]["processes"].as_array()?.first()?["pid"].as_u64()?;
            // The instance's share of the GPU's memory slices, and so of its bandwidth.
            let frac = part["size_slices"].as_f64()? / parts[0]["memory_slices"].as_f64()?;
            Some((pid, part["instance_id"].as_u64()?, frac))
        });
    fake.tool(&["proc", "0", &pid.to_string(), "2048", &instance.to_string()]);
    wait_state(&mut c, id, v1::JobState::Succeeded).await;
    let profile = crate::harness::wait_for("the learned profile", || {
        let v = d.ctl_json(&["profiles"]);
        let p = v.as_array()?.first()?.clone();
        (p["runs"] == 1).then_some(p)
    });
    assert_eq!(profile["memory_peak_mib"], 2048, "{profile}");
    // 37 % of its instance's bandwidth, as a share of the GPU's.
    let bw = profile["dram_bw"].as_f64().expect("bandwidth measured");
    assert!(mem_frac < 1.0, "a MIG instance: {mem_frac}");
    assert!((bw - 0.37 * mem_frac).abs() < 1e-9, "{profile}");
    let table = text(&d.ctl(&["profiles"]).stdout);
    assert!(table.contains(" 2GiB "), "{table}");
    assert!(table.contains(&format!(" {:.0}% ", bw * 100.0)), "{table}");
}
