//! `mmkctl simulate` end to end: no mmkd, a generated trace, every policy.

use crate::harness::{mmkctl_in as mmkctl, text};

#[test]
fn simulate_compares_every_policy_reproducibly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let args = [
        "simulate",
        "--online",
        "20",
        "--offline",
        "10",
        "--gpus",
        "2",
        "--model",
        "analytic",
        "--seed",
        "4",
        "--output",
        "json",
        "--svg",
        "cdf.svg",
        "--save-trace",
        "trace.csv",
    ];
    let out = mmkctl(d, &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let policies = report["policies"].as_array().expect("policies");
    let names: Vec<&str> = policies
        .iter()
        .filter_map(|p| p["policy"].as_str())
        .collect();
    assert_eq!(names, ["default", "mps", "miso", "miger", "mmk"]);
    for p in policies {
        assert_eq!(
            p["jobs"], 30,
            "every job finishes once under {}",
            p["policy"]
        );
        assert!(p["avg_jct_s"].as_f64().is_some_and(|v| v > 0.0));
    }
    assert_eq!(policies[0]["jct_vs_default_pct"], 0.0);
    assert_eq!(policies[3]["jct_vs_miger_pct"], 0.0);
    let svg = std::fs::read_to_string(d.join("cdf.svg")).expect("svg");
    assert!(svg.starts_with("<svg") && svg.matches("<polyline").count() == 5);

    // The same seed, or the saved trace, gives the same numbers.
    let again: serde_json::Value = serde_json::from_slice(&mmkctl(d, &args).stdout).expect("JSON");
    assert_eq!(again["policies"][4]["avg_jct_s"], policies[4]["avg_jct_s"]);
    let replay = mmkctl(
        d,
        &[
            "simulate",
            "--trace",
            "trace.csv",
            "--gpus",
            "2",
            "--model",
            "analytic",
            "--policies",
            "mmk",
            "--output",
            "json",
        ],
    );
    let replay: serde_json::Value = serde_json::from_slice(&replay.stdout).expect("JSON");
    // The saved trace rounds times to milliseconds: close, not bit-equal.
    let (a, b) = (
        replay["policies"][0]["avg_jct_s"].as_f64().expect("jct"),
        policies[4]["avg_jct_s"].as_f64().expect("jct"),
    );
    assert!((a - b).abs() / b < 0.01, "{a} vs {b}");

    // A bad trace names the line and the column.
    std::fs::write(
        d.join("bad.csv"),
        "arrival_s,workload,class,duration_s,gpu_memory_mib,checkpoint\n0,resnet50-inference,online,60,4096,maybe\n",
    )
    .expect("write");
    let out = mmkctl(d, &["simulate", "--trace", "bad.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "mmkctl: bad.csv: line 2, column checkpoint: \"maybe\" must be true or false"
    );
}
