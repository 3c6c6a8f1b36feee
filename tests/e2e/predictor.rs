//! mmkd planning with a model file given by `--model` (one that `mmk-lab predictor train`
//! writes; here the forest that mmkd ships), and refusing a corrupted one.

use std::process::Command;

use mmk_proto::v1;

use crate::harness::{Daemon, text, wait_state};

#[tokio::test]
async fn mmkd_plans_with_a_model_file_and_refuses_a_corrupted_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let shipped = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/predictor/h200-2026-11-21.mmk"
    );
    let mut bytes = std::fs::read(shipped).expect("the shipped model");
    let model = d.join("model.mmk");
    std::fs::write(&model, &bytes).expect("write");

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
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(d.join("broken.mmk"), &bytes).expect("write");
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
