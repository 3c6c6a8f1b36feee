//! A real single-node Slurm (Debian's slurm-wlm and munge) whose job steps get their GPU
//! partition through mmk's TaskProlog (deploy/slurm/mmk-task-prolog.sh).
//!
//! The daemons run in the foreground from a temporary directory with their own munge key
//! and socket, state, spool and ports. The test needs root (slurmd starts tasks as their
//! user) and the Slurm programs: .ci/run installs them and sets MMK_REQUIRE_SLURM=1, so in
//! CI it cannot pass by skipping. Elsewhere it says why it skips.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::harness::{Daemon, text, wait_for};

const PROGRAMS: [&str; 6] = ["munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo"];

/// Why this machine cannot run the test, if it cannot.
fn missing() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (slurmd must start tasks)".into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let absent: Vec<&str> = PROGRAMS
        .iter()
        .copied()
        .filter(|p| !std::env::split_paths(&path).any(|d| d.join(p).is_file()))
        .collect();
    (!absent.is_empty()).then(|| {
        format!(
            "{} not installed (apt install slurm-wlm munge)",
            absent.join(", ")
        )
    })
}

/// The daemons, killed when the test ends.
struct Cluster {
    dir: tempfile::TempDir,
    children: Vec<Child>,
    env: Vec<(String, String)>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for log in ["slurmctld.log", "slurmd.log", "munged.log"] {
                let t = std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default();
                let tail: Vec<&str> = t.lines().rev().take(15).collect();
                eprintln!(
                    "--- {log} (last lines, newest first) ---\n{}",
                    tail.join("\n")
                );
            }
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn short_hostname() -> String {
    let out = Command::new("hostname")
        .arg("-s")
        .output()
        .expect("hostname");
    text(&out.stdout).trim().to_owned()
}

impl Cluster {
    fn start(mmkd: &Daemon) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        let key = p.join("munge.key");
        let bytes: Vec<u8> = (0..1024u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(&key, bytes).expect("munge key");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o400))
            .expect("chmod key");
        let mut children = Vec::new();
        let munge_sock = p.join("munge.sock");
        children.push(
            Command::new("munged")
                .args(["--foreground", "--force"])
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--socket={}", munge_sock.display()))
                .arg(format!("--pid-file={}", p.join("munged.pid").display()))
                .arg(format!("--log-file={}", p.join("munged.log").display()))
                .arg(format!("--seed-file={}", p.join("munged.seed").display()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("munged starts"),
        );
        wait_for("munged's socket", || munge_sock.exists().then_some(()));
        let host = short_hostname();
        let prolog = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm/mmk-task-prolog.sh");
        for d in ["state", "spool"] {
            std::fs::create_dir_all(p.join(d)).expect("slurm dirs");
        }
        let conf = p.join("slurm.conf");
        let f = |name: &str| p.join(name).display().to_string();
        std::fs::write(
            &conf,
            format!(
                "ClusterName=mmktest\nSlurmctldHost={host}\nSlurmUser=root\nSlurmdUser=root\n\
                 AuthType=auth/munge\nAuthInfo=socket={munge}\nCredType=cred/munge\n\
                 SlurmctldPort={ctld}\nSlurmdPort={d}\n\
                 StateSaveLocation={state}\nSlurmdSpoolDir={spool}\n\
                 SlurmctldPidFile={ctldpid}\nSlurmdPidFile={dpid}\n\
                 SlurmctldLogFile={ctldlog}\nSlurmdLogFile={dlog}\n\
                 ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
                 JobAcctGatherType=jobacct_gather/none\nSchedulerType=sched/builtin\n\
                 SelectType=select/cons_tres\nReturnToService=2\nMpiDefault=none\n\
                 TaskProlog={prolog}\n\
                 NodeName={host} CPUs=2 State=UNKNOWN\n\
                 PartitionName=online Nodes={host} MaxTime=INFINITE State=UP OverSubscribe=FORCE:4\n\
                 PartitionName=offline Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4\n",
                munge = munge_sock.display(),
                ctld = free_port(),
                d = free_port(),
                state = f("state"),
                spool = f("spool"),
                ctldpid = f("slurmctld.pid"),
                dpid = f("slurmd.pid"),
                ctldlog = f("slurmctld.log"),
                dlog = f("slurmd.log"),
                prolog = prolog.display(),
            ),
        )
        .expect("slurm.conf");
        let env = vec![
            ("SLURM_CONF".to_owned(), conf.display().to_string()),
            ("MMKCTL".to_owned(), env!("CARGO_BIN_EXE_mmkctl").to_owned()),
            ("MMK_SOCKET".to_owned(), mmkd.socket().display().to_string()),
        ];
        for (prog, args) in [("slurmctld", &["-D", "-i"][..]), ("slurmd", &["-D"][..])] {
            children.push(
                Command::new(prog)
                    .args(args)
                    .arg("-f")
                    .arg(&conf)
                    .env("SLURM_CONF", &conf)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap_or_else(|e| panic!("{prog} starts: {e}")),
            );
        }
        let c = Cluster { dir, children, env };
        wait_for("the node to be idle", || {
            let out = c.cmd("sinfo", &["-h", "-o", "%T"]).output().ok()?;
            text(&out.stdout)
                .lines()
                .all(|l| l.trim() == "idle")
                .then_some(())
                .filter(|()| !out.stdout.is_empty())
        });
        c
    }

    fn cmd(&self, prog: &str, args: &[&str]) -> Command {
        let mut c = Command::new(prog);
        c.args(args).current_dir(self.dir.path());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The `NAME=value` lines a task printed.
fn printed_env(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

const SHOW_ENV: &str = "env | grep -E '^(CUDA_|MMK_JOB)' | sort; sleep 2";

#[test]
fn slurm_steps_run_in_mmk_partitions_with_the_planned_shares_and_release_them() {
    if let Some(why) = missing() {
        assert!(
            std::env::var_os("MMK_REQUIRE_SLURM").is_none(),
            "MMK_REQUIRE_SLURM is set but this machine cannot run Slurm: {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let d = Daemon::start_with("a100-80gb:1", &["--planner", "mmk"]);
    let slurm = Cluster::start(&d);

    // An offline batch job (sbatch, partition offline) and an online step (srun, partition
    // online) at the same time, each asking for its GPU memory through the environment.
    let batch_out = slurm.path("batch.out");
    let sb = slurm
        .cmd(
            "sbatch",
            &[
                "--parsable",
                "-p",
                "offline",
                "-o",
                batch_out.to_str().expect("utf-8"),
                "--export=ALL,MMK_MEMORY=30GiB,MMK_PROFILE=bert-train",
                "--wrap",
                SHOW_ENV,
            ],
        )
        .output()
        .expect("sbatch runs");
    assert!(sb.status.success(), "sbatch: {}", text(&sb.stderr));
    let online = slurm
        .cmd("srun", &["-p", "online", "sh", "-c", SHOW_ENV])
        .env("MMK_MEMORY", "10GiB")
        .env("MMK_PROFILE", "resnet50-inference")
        .output()
        .expect("srun runs");
    assert!(online.status.success(), "srun: {}", text(&online.stderr));
    let online_env = printed_env(&text(&online.stdout));
    let batch_env = wait_for("the batch job's output", || {
        let t = std::fs::read_to_string(&batch_out).ok()?;
        let env = printed_env(&t);
        env.contains_key("MMK_JOB_ID").then_some(env)
    });

    // Each task ran with the allocation mmk recorded for it, and both were released when
    // their process ended.
    for (env, class, mib) in [
        (&online_env, "online", 10_240),
        (&batch_env, "offline", 30_720),
    ] {
        let id = env
            .get("MMK_JOB_ID")
            .unwrap_or_else(|| panic!("{class} task got no allocation: {env:?}"));
        let job = wait_for("the allocation's release", || {
            let j = d.ctl_json(&["jobs", "get", id]);
            (j["state"] == "SUCCEEDED").then_some(j)
        });
        assert_eq!(job["class"], class, "{job}");
        assert_eq!(job["gpu_memory_mib"], mib, "{job}");
        assert_eq!(job["task"]["kind"], "attached");
        assert!(
            job["name"].as_str().unwrap_or("").starts_with("slurm-"),
            "{job}"
        );
        assert!(
            job["reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("released: the watched process"),
            "{job}"
        );
        let a = &job["assignment"];
        assert_eq!(
            env["CUDA_VISIBLE_DEVICES"],
            a["device_uuid"].as_str().unwrap_or("")
        );
        assert_eq!(
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
            a["mps_share"].to_string()
        );
        assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], format!("0={mib}M"));
        assert!(env.contains_key("CUDA_MPS_PIPE_DIRECTORY"), "{env:?}");
    }
    // Nothing is left holding a partition.
    let active = d.ctl_json(&["jobs", "--state", "running", "--state", "queued"]);
    assert_eq!(active.as_array().map(Vec::len), Some(0), "{active}");

    // A task that cannot get a partition (more memory than any GPU here) fails with the
    // reason on its output, and nothing is stored.
    let big = slurm
        .cmd("srun", &["-p", "offline", "true"])
        .env("MMK_MEMORY", "500GiB")
        .output()
        .expect("srun runs");
    assert!(!big.status.success());
    let said = format!("{}{}", text(&big.stdout), text(&big.stderr));
    assert!(
        said.contains("mmk: no GPU partition for this task"),
        "{said}"
    );
    assert!(said.contains("gpu_memory"), "{said}");
    assert_eq!(d.ctl_json(&["jobs"]).as_array().map(Vec::len), Some(2));
}
