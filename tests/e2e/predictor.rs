//! `mmkctl predictor` end to end, and mmkd planning with the model file it writes.

use std::process::{Command, Output};

use mmk_proto::v1;

use crate::harness::{Daemon, mmkctl_in as mmkctl, text, wait_state};

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[tokio::test]
async fn generate_train_eval_explain_then_mmkd_plans_with_the_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let out = mmkctl(
        d,
        &[
            "predictor",
            "generate",
            "-o",
            "data.csv",
            "--rows",
            "300",
            "--seed",
            "2",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("ground-truth model"));
    let csv = std::fs::read_to_string(d.join("data.csv")).expect("data.csv");
    assert_eq!(csv.lines().count(), 301);

    let trained = json(&mmkctl(
        d,
        &[
            "predictor",
            "train",
            "data.csv",
            "-o",
            "model.mmk",
            "--output",
            "json",
        ],
    ));
    assert_eq!(trained["rows"], 300);
    assert_eq!(
        trained["cross_validation"].as_array().map(Vec::len),
        Some(4)
    );
    assert!(
        trained["chosen"]
            .as_str()
            .is_some_and(|c| c.starts_with("100 trees"))
    );

    let report = json(&mmkctl(
        d,
        &[
            "predictor",
            "eval",
            "model.mmk",
            "data.csv",
            "--output",
            "json",
        ],
    ));
    let held = report["held_out"].as_array().expect("held_out");
    let names: Vec<&str> = held.iter().filter_map(|m| m["model"].as_str()).collect();
    assert_eq!(names[0], "random forest");
    assert!(names.iter().any(|n| n.starts_with("linear regression")));
    assert!(names.iter().any(|n| n.starts_with("SVR")));
    assert_eq!(held[0]["overall"]["rows"], 60, "a 20 % hold-out");
    let rel = |i: usize| held[i]["overall"]["rel_error_pct"].as_f64().expect("rel");
    assert!(
        rel(0) < rel(1),
        "the forest beats linear regression: {} vs {}",
        rel(0),
        rel(1)
    );
    assert!(
        held[0]["per_workload"]
            .as_object()
            .is_some_and(|w| w.len() > 5)
    );

    let explained = json(&mmkctl(
        d,
        &["predictor", "explain", "model.mmk", "--output", "json"],
    ));
    let imp = explained["importances"].as_array().expect("importances");
    assert_eq!(imp.len(), 24);
    let sum: f64 = imp.iter().filter_map(|p| p[1].as_f64()).sum();
    assert!((sum - 1.0).abs() < 1e-6, "{sum}");

    // Bad files: the reason, exit code 2.
    let mut bytes = std::fs::read(d.join("model.mmk")).expect("model");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(d.join("broken.mmk"), &bytes).expect("write");
    let out = mmkctl(d, &["predictor", "explain", "broken.mmk"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "mmkctl: broken.mmk is corrupted: the checksum does not match"
    );
    let bad_csv = csv.replacen(",online,", ",sometimes,", 1);
    std::fs::write(d.join("bad.csv"), bad_csv).expect("write");
    let out = mmkctl(d, &["predictor", "train", "bad.csv", "-o", "x.mmk"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("bad.csv: line "),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("column class: \"sometimes\" must be online or offline"),
        "{}",
        text(&out.stderr)
    );
    assert!(!d.join("x.mmk").exists());

    // mmkd plans with the model.
    let model = d.join("model.mmk");
    let daemon = Daemon::start_with(
        "a100-80gb:1",
        &[
            "--planner",
            "mmk",
            "--model",
            model.to_str().expect("utf-8"),
        ],
    );
    assert!(
        daemon
            .startup
            .iter()
            .any(|l| l.contains("performance model: random forest")),
        "{:?}",
        daemon.startup
    );
    let mut c = daemon.clients().await;
    let id = daemon.submit("--online", "name: serve\ngpu_memory: 4GiB\nslo: 50ms\nworkload:\n  name: resnet50-inference\n  duration: 1h\n");
    let job = wait_state(&mut c, id, v1::JobState::Running).await;
    assert!(job.assignment.is_some_and(|a| a.mps_share >= 10));

    // A bad model file stops mmkd at start, naming it.
    let out = Command::new(env!("CARGO_BIN_EXE_mmkd"))
        .args(["--backend", "sim", "--model"])
        .arg(d.join("broken.mmk"))
        .args(["--data-dir"])
        .arg(d.join("data2"))
        .args(["--socket"])
        .arg(d.join("s2.sock"))
        .output()
        .expect("mmkd runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--model")
            && text(&out.stderr).contains("broken.mmk is corrupted"),
        "{}",
        text(&out.stderr)
    );
}
