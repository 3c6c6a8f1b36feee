//! Bad input from a user or a client: refused with the field named, nothing stored.

use mmk_proto::v1;
use serde_json::Value;

use crate::harness::{Daemon, text};

/// (case, job.yaml, text the error must hold)
const CASES: &[(&str, &str, &[&str])] = &[
    (
        "malformed yaml",
        "name: [unclosed\nclass: offline\n",
        &["line "],
    ),
    (
        "unknown field",
        "name: a\nclass: offline\ngpu_memory: 1GiB\ngpu_mem: 3\nworkload:\n  name: resnet50-train\n",
        &["gpu_mem", "line 4"],
    ),
    (
        "negative memory",
        "name: a\nclass: offline\ngpu_memory: -5GiB\nworkload:\n  name: resnet50-train\n",
        &["line 3: gpu_memory:", "greater than zero"],
    ),
    (
        "empty name",
        "name: ''\nclass: offline\ngpu_memory: 1GiB\nworkload:\n  name: resnet50-train\n",
        &["line 1: name: must not be empty"],
    ),
    (
        "unknown workload",
        "name: a\nclass: offline\ngpu_memory: 1GiB\nworkload:\n  name: alexnet\n",
        &["line 5: workload.name: unknown workload \"alexnet\""],
    ),
    (
        "slo on an offline job",
        "name: a\nclass: offline\ngpu_memory: 1GiB\nslo: 10ms\nworkload:\n  name: resnet50-train\n",
        &["line 4: slo: only online jobs have an SLO"],
    ),
    (
        "larger than any partition",
        "name: a\nclass: offline\ngpu_memory: 200GiB\nworkload:\n  name: resnet50-train\n",
        &["gpu_memory: 200GiB is more than the largest partition this node can make (78.5GiB)"],
    ),
    (
        "class conflicts with the flag",
        "name: a\nclass: online\ngpu_memory: 1GiB\nworkload:\n  name: resnet50-train\n",
        &["line 2: class: the file says online but --offline was given"],
    ),
];

fn jobs(d: &Daemon) -> Value {
    d.ctl_json(&["jobs"])
}

#[tokio::test]
async fn bad_job_files_are_refused_and_change_nothing() {
    let d = Daemon::start("a100-80gb:1");
    let good = d.submit(
        "--offline",
        "name: keep\ngpu_memory: 1GiB\nworkload:\n  name: resnet18-inference\n  duration: 10h\n",
    );
    let before = jobs(&d);
    for (case, yaml, needles) in CASES {
        let file = d.job_file("bad.yaml", yaml);
        let out = d.ctl(&["submit", "--offline", &file]);
        let err = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{case}: exit code; stderr: {err}"
        );
        assert!(
            err.starts_with(&format!("mmkctl: {file}: ")),
            "{case}: names the file: {err}"
        );
        for n in *needles {
            assert!(err.contains(n), "{case}: {n:?} not in {err:?}");
        }
        assert!(out.stdout.is_empty(), "{case}: prints nothing on stdout");
    }
    let after = jobs(&d);
    assert_eq!(before.as_array().map(Vec::len), Some(1));
    assert_eq!(before[0]["id"], good);
    assert_eq!(
        after.as_array().map(Vec::len),
        Some(1),
        "no bad job was stored"
    );
}

#[tokio::test]
async fn oversized_and_missing_files_are_refused() {
    let d = Daemon::start("a100-80gb:1");
    let big = format!("name: a\n# {}\n", "x".repeat(2 * 1024 * 1024));
    let file = d.job_file("big.yaml", &big);
    let out = d.ctl(&["submit", "--offline", &file]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr)
            .contains("file: is larger than 1048576 bytes; a job file is at most 1048576 bytes"),
        "{}",
        text(&out.stderr)
    );
    let out = d.ctl(&["submit", "--offline", "/no/such/job.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read /no/such/job.yaml"));
    // A device that never ends is read up to the cap: mmkctl comes back (reading to the
    // end it never would) and names the cap. (How fast is the machine's business.)
    let out = d.ctl(&["submit", "--offline", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("/dev/zero: file: is larger than 1048576 bytes"),
        "{}",
        text(&out.stderr)
    );
    // A FIFO nobody writes to: mmkctl gives up instead of hanging (10 s).
    let fifo = d.path().join("job.fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    let out = d.ctl(&["submit", "--offline", &fifo.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no writer opened it within 10s"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(jobs(&d), Value::Array(vec![]));
}

#[tokio::test]
async fn usage_errors_exit_2_and_a_missing_daemon_is_explained() {
    let d = Daemon::start("a100-80gb:1");
    let out = d.ctl(&["jobs", "get", "not-a-number"]);
    assert_eq!(out.status.code(), Some(2));
    let out = d.ctl(&["submit", "--online", "--offline", "x.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .args(["--socket", "/no/such/mmkd.sock", "jobs"])
        .output()
        .expect("mmkctl runs");
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot connect to mmkd at /no/such/mmkd.sock")
            && err.contains("is mmkd running?"),
        "{err}"
    );
}

#[tokio::test]
async fn the_grpc_api_refuses_what_job_yaml_refuses() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    let spec = |f: &dyn Fn(&mut v1::JobSpec)| {
        let mut s = v1::JobSpec {
            name: "x".into(),
            class: v1::JobClass::Offline as i32,
            gpu_memory_mib: 1024,
            task: Some(v1::job_spec::Task::Workload(v1::WorkloadTask {
                name: "resnet50-train".into(),
                batch_size: 0,
                duration_ms: 0,
            })),
            ..Default::default()
        };
        f(&mut s);
        v1::SubmitJobRequest {
            spec: Some(s),
            ..Default::default()
        }
    };
    let cases: Vec<(&str, v1::SubmitJobRequest)> = vec![
        ("gpu_memory", spec(&|s| s.gpu_memory_mib = 0)),
        ("name", spec(&|s| s.name = "bad name".into())),
        ("class", spec(&|s| s.class = 0)),
        ("command", spec(&|s| s.task = None)),
        (
            "command.args",
            spec(&|s| s.task = Some(v1::job_spec::Task::Command(v1::CommandTask::default()))),
        ),
        (
            "spec",
            v1::SubmitJobRequest {
                spec: None,
                ..Default::default()
            },
        ),
    ];
    for (field, req) in cases {
        let err = c.jobs.submit_job(req).await.expect_err(field);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{field}: {err:?}");
        let named = err
            .metadata()
            .get("mmk-field")
            .and_then(|v| v.to_str().ok());
        assert_eq!(named, Some(field), "{field}: {err:?}");
        assert!(
            err.message().starts_with(&format!("{field}: ")),
            "{field}: {}",
            err.message()
        );
    }
    let err = c
        .jobs
        .get_job(v1::GetJobRequest { id: 9 })
        .await
        .expect_err("no job 9");
    assert_eq!(err.code(), tonic::Code::NotFound);
    let list = c
        .jobs
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert!(list.jobs.is_empty());
}

#[test]
fn help_lists_every_command_and_flag() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--help")
        .output()
        .expect("mmkctl runs");
    assert!(out.status.success());
    let help = text(&out.stdout);
    for word in [
        "submit",
        "jobs",
        "partitions",
        "gpus",
        "--socket",
        "--endpoint",
        "--output",
    ] {
        assert!(help.contains(word), "mmkctl --help lacks {word}:\n{help}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mmkd"))
        .arg("--help")
        .output()
        .expect("mmkd runs");
    assert!(out.status.success());
    let help = text(&out.stdout);
    for word in [
        "--config",
        "--socket",
        "--listen",
        "--data-dir",
        "--backend",
        "--sim-gpus",
        "--sim-speed",
        "--stop-grace",
    ] {
        assert!(help.contains(word), "mmkd --help lacks {word}:\n{help}");
    }
}

/// The lab's commands left the client; a user who looks for them there is told where
/// they went, whatever arguments they gave, and `--help` does not list them.
#[test]
fn the_lab_commands_point_to_mmk_lab() {
    for (command, args) in [
        ("simulate", &["--online", "4", "--gpus", "1"][..]),
        ("predictor", &["train", "data.csv", "-o", "m.mmk"][..]),
        ("profile", &["--help"][..]),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mmkctl"))
            .arg(command)
            .args(args)
            .output()
            .expect("mmkctl runs");
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(&format!("`mmkctl {command}` is now `mmk-lab {command}`")),
            "{}",
            text(&out.stderr)
        );
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--help")
        .output()
        .expect("mmkctl runs");
    let commands: Vec<String> = text(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.strip_prefix("  ")?
                .split_whitespace()
                .next()
                .map(str::to_owned)
        })
        .collect();
    assert!(commands.iter().any(|c| c == "submit"), "{commands:?}");
    for lab in ["simulate", "predictor", "profile"] {
        assert!(!commands.iter().any(|c| c == lab), "{commands:?}");
    }
}
