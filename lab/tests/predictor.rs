//! `mmk-lab predictor` and `mmk-lab measure` end to end.

use crate::harness::{json, lab_in as lab, text};

#[test]
fn generate_train_eval_explain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let out = lab(
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

    let trained = json(&lab(
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

    let report = json(&lab(
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

    let explained = json(&lab(
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
    let out = lab(d, &["predictor", "explain", "broken.mmk"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "mmk-lab: broken.mmk is corrupted: the checksum does not match"
    );
    let bad_csv = csv.replacen(",online,", ",sometimes,", 1);
    std::fs::write(d.join("bad.csv"), bad_csv).expect("write");
    let out = lab(d, &["predictor", "train", "bad.csv", "-o", "x.mmk"]);
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
}

/// A worker in sh (docs/measure.md's protocol): an iteration takes 1 / share seconds.
const SH_WORKER: &str = r#"
ms=$((1000 / CUDA_MPS_ACTIVE_THREAD_PERCENTAGE))
while read -r line; do
  case "$line" in
    *'"op":"info"'*) echo '{"ok":true,"torch":"none"}' ;;
    *'"op":"prepare"'*) echo '{"ok":true,"class":"online","mem_bytes":4096}' ;;
    *'"op":"measure"'*) printf '{"ok":true,"iters":[[1,0.%03d],[2,0.%03d]]}\n' $ms $ms ;;
    *'"op":"quit"'*) exit 0 ;;
    *) echo '{"ok":true}' ;;
  esac
done
"#;

#[test]
fn measure_writes_runs_as_they_come_refuses_to_overwrite_and_resumes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(d.join("worker.sh"), SH_WORKER).expect("worker");
    std::fs::write(
        d.join("plan.yaml"),
        "worker: [sh, worker.sh]\nwindow: 10ms\nalone:\n  shares: [100, 25]\n  jobs: [svc/8]\n",
    )
    .expect("plan");
    let args = [
        "measure",
        "plan.yaml",
        "-o",
        "raw.jsonl",
        "--no-gpm",
        "--output",
        "json",
    ];
    let s = json(&lab(d, &args));
    assert_eq!(
        (s["planned"].as_u64(), s["measured"].as_u64()),
        (Some(2), Some(2))
    );
    let raw = std::fs::read_to_string(d.join("raw.jsonl")).expect("raw");
    assert_eq!(raw.lines().count(), 3, "{raw}");
    assert!(raw.contains("\"gpm_error\":\"--no-gpm\""), "{raw}");
    // Without GPM metrics there is no job_sm_frac: no rows, and the reason.
    let out = lab(d, &["predictor", "import", "raw.jsonl", "-o", "d.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no run of it alone at 100 % with GPM metrics"),
        "{}",
        text(&out.stderr)
    );
    let out = lab(d, &args);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("raw.jsonl exists: give --resume"));
    let mut resume = args.to_vec();
    resume.push("--resume");
    let s = json(&lab(d, &resume));
    assert_eq!(
        (s["kept"].as_u64(), s["measured"].as_u64()),
        (Some(2), Some(0))
    );

    std::fs::write(
        d.join("bad.yaml"),
        "worker: [sh]\nalone:\n  shares: [100]\n  jobs: [svc]\n",
    )
    .expect("plan");
    let out = lab(d, &["measure", "bad.yaml", "-o", "x.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "mmk-lab: bad.yaml: alone.jobs[0]: \"svc\" is not NAME/BATCH (for example resnet50-inf/32)"
    );
    assert!(!d.join("x.jsonl").exists());
}

#[test]
fn the_h200_dataset_imports_and_trains_a_forest_closer_to_it_than_the_analytic_model() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/gpu/h200-2026-11-21");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let raw = |f: &str| data.join(f).display().to_string();
    let i = json(&lab(
        d,
        &[
            "predictor",
            "import",
            &raw("raw-alone.jsonl"),
            &raw("raw-pairs.jsonl"),
            &raw("raw-deep.jsonl"),
            &raw("raw-kernels.jsonl"),
            "-o",
            "h200.csv",
            "--output",
            "json",
        ],
    ));
    // 28 workloads x 6 shares alone, 38 pairs x 4 splits x 2 jobs.
    assert_eq!(i["rows"].as_u64(), Some(28 * 6 + 38 * 4 * 2));
    let shipped = std::fs::read_to_string(data.join("dataset.csv")).expect("dataset.csv");
    let made = std::fs::read_to_string(d.join("h200.csv")).expect("h200.csv");
    // Every job was profiled by ncu: its rows carry IPC and the L2 hit rate.
    assert!(
        made.lines()
            .skip(1)
            .all(|l| l.split(',').nth(13).is_some_and(|ipc| !ipc.is_empty())),
        "a row without IPC"
    );
    assert_eq!(
        made, shipped,
        "data/gpu/h200-2026-11-21/dataset.csv is stale"
    );
    json(&lab(
        d,
        &[
            "predictor",
            "train",
            "h200.csv",
            "-o",
            "m.mmk",
            "--output",
            "json",
        ],
    ));
    let e = json(&lab(
        d,
        &["predictor", "eval", "m.mmk", "h200.csv", "--output", "json"],
    ));
    let err = |name: &str| {
        e["held_out"]
            .as_array()
            .expect("held_out")
            .iter()
            .find(|m| m["model"].as_str().is_some_and(|s| s.starts_with(name)))
            .and_then(|m| m["overall"]["rel_error_pct"].as_f64())
            .expect(name)
    };
    let (rf, lr, analytic) = (err("random forest"), err("linear"), err("analytic"));
    assert!(rf < 10.0 && rf < lr / 2.0, "forest {rf} %, linear {lr} %");
    // Trained on the GPU's numbers, the forest is closer to them than the stand-in model.
    assert!(rf < analytic / 2.0, "forest {rf} %, analytic {analytic} %");
}

/// `predictor sources` on the H200 dataset's runs with the built-in forest: every source's
/// errors, learned profiles no further off than the table's names; a file that is not a
/// measurement is refused with its name and line.
#[test]
fn predictor_sources_scores_each_source_of_the_profiles() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/gpu/h200-2026-11-21");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let raw = |f: &str| data.join(f).display().to_string();
    let c = json(&lab(
        d,
        &[
            "predictor",
            "sources",
            &raw("raw-alone.jsonl"),
            &raw("raw-pairs.jsonl"),
            &raw("raw-kernels.jsonl"),
            "--output",
            "json",
        ],
    ));
    assert_eq!(c["jobs"].as_array().map(Vec::len), Some(28));
    let rel = |source: &str| {
        c["scores"]
            .as_array()
            .expect("scores")
            .iter()
            .find(|s| s["source"] == source)
            .and_then(|s| s["overall"]["rel_error_pct"].as_f64())
            .unwrap_or_else(|| panic!("no {source} in {c}"))
    };
    assert!(rel("learned") <= rel("named"), "{c}");
    assert!(rel("gpm") > 0.0 && rel("prior") > 0.0, "{c}");
    let table = lab(
        d,
        &[
            "predictor",
            "sources",
            &raw("raw-alone.jsonl"),
            &raw("raw-kernels.jsonl"),
        ],
    );
    assert!(table.status.success(), "{}", text(&table.stderr));
    assert!(
        text(&table.stdout).contains("PROFILE"),
        "{}",
        text(&table.stdout)
    );

    std::fs::write(d.join("bad.jsonl"), "{\"kind\":\"run\"}\n").expect("write");
    let bad = lab(d, &["predictor", "sources", "bad.jsonl"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("bad.jsonl: line 1"),
        "{}",
        text(&bad.stderr)
    );
}
