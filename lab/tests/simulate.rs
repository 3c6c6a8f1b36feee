//! `mmk-lab simulate` end to end: no mmkd, a generated trace, every policy.

use crate::harness::{lab_in as lab, text};

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end story, read top to bottom; the 150-line limit is for product code"
)]
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
        "--jobs-out",
        "jobs.csv",
    ];
    let out = lab(d, &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let policies = report["policies"].as_array().expect("policies");
    let names: Vec<&str> = policies
        .iter()
        .filter_map(|p| p["policy"].as_str())
        .collect();
    assert_eq!(names, ["default", "mps", "miso", "miger", "mmk", "mmk-ks"]);
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
    // Default runs each job alone on a GPU: never beside a job of the other class.
    assert_eq!(policies[0]["mixed_pct"], 0.0);
    // `mmk-ks` runs MMK on the kernel scheduler's effect under mmkd's defaults, measured
    // per pairing of a service and a training family (docs/simulate.md): a ResNet-50
    // service beside BERT training keeps 51 % of its slowdown (three calls); a transformer
    // service beside BERT training 48 % (a BERT service 84 %, a decoder 29 % and 32 % in
    // two calls); 53 % and offline at 93 % on average over the four pairings.
    let effect = &report["kernel_sched"];
    assert_eq!(
        effect["source"],
        "mmk-noslo, measured per pairing: h100-call-1, h100-call-2, h200-resnet50-bert; \
         h200-resnet50-resnet152; h200-bert-bert, h200-decoder-bert-call-1, \
         h200-decoder-bert-call-2; h200-bert-resnet152, h200-decoder-resnet152",
        "{effect}"
    );
    let kept = effect["online_excess_kept"].as_f64().expect("kept");
    let offline = effect["offline_kept"].as_f64().expect("offline");
    assert!((0.525..0.535).contains(&kept), "{effect}");
    assert!((0.92..0.935).contains(&offline), "{effect}");
    let pairs = effect["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 4, "{effect}");
    let pair = |online: &str, offline: &str| {
        pairs
            .iter()
            .find(|p| p["online"] == online && p["offline"] == offline)
            .and_then(|p| p["online_excess_kept"].as_f64())
            .expect("pairing")
    };
    assert!(
        (0.51..0.52).contains(&pair("convolutional", "transformer")),
        "{effect}"
    );
    assert!(
        (0.475..0.49).contains(&pair("transformer", "transformer")),
        "{effect}"
    );
    let svg = std::fs::read_to_string(d.join("cdf.svg")).expect("svg");
    assert!(svg.starts_with("<svg") && svg.matches("<polyline").count() == 6);
    // A row per job and policy, whose JCTs average to the report's.
    let jobs = std::fs::read_to_string(d.join("jobs.csv")).expect("jobs.csv");
    assert!(jobs.starts_with("policy,id,workload,class,arrival_s,start_s,finish_s,jct_s,"));
    let mmk: Vec<f64> = jobs
        .lines()
        .filter(|l| l.starts_with("mmk,"))
        .map(|l| {
            l.split(',')
                .nth(7)
                .and_then(|v| v.parse().ok())
                .expect("jct")
        })
        .collect();
    assert_eq!((jobs.lines().count(), mmk.len()), (1 + 6 * 30, 30));
    let mean = mmk.iter().sum::<f64>() / 30.0;
    let reported = policies[4]["avg_jct_s"].as_f64().expect("jct");
    assert!(
        (mean - reported).abs() < 0.01 * reported,
        "{mean} against {reported}"
    );

    // The same seed, or the saved trace, gives the same numbers.
    let again: serde_json::Value = serde_json::from_slice(&lab(d, &args).stdout).expect("JSON");
    assert_eq!(again["policies"][4]["avg_jct_s"], policies[4]["avg_jct_s"]);
    let replay = lab(
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

    // Without the kernel scheduler the report says so, and there is no `mmk-ks`; a report
    // that is not there is named.
    let off = lab(
        d,
        &[
            "simulate",
            "--online",
            "4",
            "--offline",
            "2",
            "--gpus",
            "1",
            "--model",
            "analytic",
            "--kernel-sched",
            "off",
            "--output",
            "json",
        ],
    );
    assert!(off.status.success(), "{}", text(&off.stderr));
    let off: serde_json::Value = serde_json::from_slice(&off.stdout).expect("JSON");
    assert_eq!(off["kernel_sched"], serde_json::Value::Null);
    let names: Vec<&str> = off["policies"]
        .as_array()
        .expect("policies")
        .iter()
        .filter_map(|p| p["policy"].as_str())
        .collect();
    assert_eq!(names, ["default", "mps", "miso", "miger", "mmk"]);
    let out = lab(
        d,
        &["simulate", "--policies", "mmk-ks", "--kernel-sched", "off"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "mmk-lab: --policies mmk-ks runs MMK on its kernel scheduler's effect, and --kernel-sched off gives none"
    );
    let out = lab(d, &["simulate", "--kernel-sched", "nope.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).starts_with(
            "mmk-lab: --kernel-sched: \"nope.json\" is not `measured`, `h200-depth8`, `off` or a readable ksim report: "
        ),
        "{}",
        text(&out.stderr)
    );

    // The kernel scheduler changes `mmk-ks`'s run and nothing else: on a trace where MMK
    // puts online and offline jobs together, plain MPS (which mixes them all the time) and
    // MMK on the plain truth run the same whichever effect `mmk-ks` takes.
    let with = |k: &str, policies: &str| {
        let out = lab(
            d,
            &[
                "simulate",
                "--online",
                "20",
                "--offline",
                "10",
                "--gpus",
                "1",
                "--interval",
                "20",
                "--seed",
                "2",
                "--truth",
                "analytic",
                "--model",
                "analytic",
                "--policies",
                policies,
                "--kernel-sched",
                k,
                "--output",
                "json",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let mut r = serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON");
        for p in r["policies"].as_array_mut().expect("policies") {
            p["seconds"] = serde_json::Value::Null; // wall time
        }
        r
    };
    let (on, off) = (with("measured", "mps,mmk,mmk-ks"), with("off", "mps,mmk"));
    assert_eq!(
        on["policies"][0], off["policies"][0],
        "plain MPS does not run it"
    );
    assert_eq!(on["policies"][1], off["policies"][1], "MMK does not run it");
    let stp = |r: &serde_json::Value, i: usize| r["policies"][i]["stp"].as_f64().expect("stp");
    assert!(on["policies"][0]["mixed_pct"].as_f64().expect("mixed") > 0.0);
    assert!(
        off["policies"][1]["mixed_pct"].as_f64().expect("mixed") > 0.0,
        "the trace must mix classes under MMK: {off}"
    );
    assert_ne!(stp(&on, 2), stp(&on, 1), "mmk-ks runs under it");

    // A bad trace names the line and the column.
    std::fs::write(
        d.join("bad.csv"),
        "arrival_s,workload,class,duration_s,gpu_memory_mib,checkpoint\n0,resnet50-inference,online,60,4096,maybe\n",
    )
    .expect("write");
    let out = lab(d, &["simulate", "--trace", "bad.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "mmk-lab: bad.csv: line 2, column checkpoint: \"maybe\" must be true or false"
    );
}

#[test]
fn simulate_sweeps_arrival_rates_over_seeds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let out = lab(
        d,
        &[
            "simulate",
            "--online",
            "8",
            "--offline",
            "4",
            "--gpus",
            "1",
            "--model",
            "analytic",
            "--interval",
            "30,120",
            "--seed",
            "1,2,3",
            "--policies",
            "miger,mps,mmk",
            "--output",
            "json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["jobs_per_run"], 12);
    let runs = r["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 6, "two intervals x three seeds");
    let rows = r["rows"].as_array().expect("rows");
    let keys: Vec<(f64, &str)> = rows
        .iter()
        .map(|w| {
            (
                w["interval_s"].as_f64().expect("interval"),
                w["policy"].as_str().expect("policy"),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            (30.0, "miger"),
            (30.0, "mps"),
            (30.0, "mmk"),
            (120.0, "miger"),
            (120.0, "mps"),
            (120.0, "mmk")
        ]
    );
    for row in rows {
        assert_eq!(row["runs"], 3);
        let interval = row["interval_s"].as_f64().expect("interval");
        // The row's mean and range of a figure are those of its runs; returns the mean.
        let checked = |field: &str| {
            let values: Vec<f64> = runs
                .iter()
                .filter(|run| run["interval_s"].as_f64() == Some(interval))
                .flat_map(|run| run["policies"].as_array().expect("policies").iter())
                .filter(|p| p["policy"] == row["policy"])
                .map(|p| p[field].as_f64().expect(field))
                .collect();
            assert_eq!(values.len(), 3, "{field}");
            let spread = &row[field];
            let mean = values.iter().sum::<f64>() / 3.0;
            assert!((spread["mean"].as_f64().expect(field) - mean).abs() < 1e-9);
            let min = values.iter().copied().fold(f64::INFINITY, f64::min);
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert_eq!(spread["min"].as_f64(), Some(min), "{field}");
            assert_eq!(spread["max"].as_f64(), Some(max), "{field}");
            mean
        };
        let jct = checked("jct_vs_miger_pct");
        if row["policy"] == "miger" {
            assert_eq!(jct, 0.0);
        }
        // Also the share of time beside a job of the other class.
        let mixed = checked("mixed_pct");
        if row["policy"] == "mps" {
            assert!(mixed > 0.0, "plain MPS puts both classes together: {row}");
        }
    }
    // Seeds make different traces: the runs of one interval differ.
    let jct = |i: usize| runs[i]["policies"][0]["avg_jct_s"].as_f64();
    assert_ne!(jct(0), jct(1));

    // A sweep cannot replay one trace or draw one picture.
    for (extra, message) in [
        (
            ["--trace", "t.csv"],
            "mmk-lab: --trace replays one trace: several --interval or --seed values generate several",
        ),
        (
            ["--svg", "c.svg"],
            "mmk-lab: --svg, --save-trace and --jobs-out need one trace: give one --interval and one --seed",
        ),
    ] {
        let mut args = vec!["simulate", "--seed", "1,2"];
        args.extend(extra);
        let out = lab(d, &args);
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(text(&out.stderr).trim(), message);
    }
    let out = lab(d, &["simulate", "--seed", "1,2,1"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stderr).trim(), "mmk-lab: --seed: 1 given twice");
    let out = lab(d, &["simulate", "--interval", "40,0"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "mmk-lab: --interval must be greater than zero (got 0)"
    );
    let out = lab(d, &["simulate", "--gpus", "129"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "mmk-lab: --gpus must be between 1 and 128"
    );
}

/// MMK at least level with every baseline that keeps online jobs within their SLO
/// (Default, MISO, MIGER) on a small sweep (120 jobs on 4 GPUs, a busy and a light arrival
/// rate, three seeds): its mean average JCT and makespan no longer, its mean STP no lower,
/// its online jobs' time out of SLO no higher (docs/simulate.md).
#[test]
fn mmk_is_level_with_every_baseline_on_a_small_sweep() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = [
        "simulate",
        "--online",
        "80",
        "--offline",
        "40",
        "--gpus",
        "4",
        "--interval",
        "40,160",
        "--seed",
        "1,2,3",
        "--output",
        "json",
    ];
    let out = lab(dir.path(), &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = report["rows"].as_array().expect("rows");
    let mean = |interval: f64, policy: &str, field: &str| {
        rows.iter()
            .find(|r| r["interval_s"].as_f64() == Some(interval) && r["policy"] == policy)
            .and_then(|r| r[field]["mean"].as_f64())
            .unwrap_or_else(|| panic!("{policy} at {interval} s: no {field}"))
    };
    for interval in [40.0, 160.0] {
        let mmk = |field: &str| mean(interval, "mmk", field);
        for baseline in ["default", "miso", "miger"] {
            let other = |field: &str| mean(interval, baseline, field);
            let at = format!("{interval} s against {baseline}");
            assert!(
                mmk("avg_jct_s") <= other("avg_jct_s") * 1.005,
                "JCT at {at}"
            );
            // Against MIGER in percent: lower is shorter, higher is more throughput.
            assert!(
                mmk("makespan_vs_miger_pct") <= other("makespan_vs_miger_pct") + 0.5,
                "makespan at {at}"
            );
            assert!(
                mmk("stp_vs_miger_pct") >= other("stp_vs_miger_pct") - 0.5,
                "STP at {at}"
            );
            assert!(mmk("slo_miss_pct") <= other("slo_miss_pct"), "SLO at {at}");
        }
    }
}

/// The reference schedule beside the policies on a trace small enough for its search to be
/// exact: Default, whose schedules are in its class, is at or behind it, each policy's JCT
/// is given against it, and its bound is its own average (docs/simulate.md, "Distance from
/// the best schedule").
#[test]
fn simulate_measures_the_policies_against_the_reference_schedule() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let args = [
        "simulate",
        "--online",
        "3",
        "--offline",
        "1",
        "--gpus",
        "2",
        "--model",
        "analytic",
        "--truth",
        "analytic",
        "--kernel-sched",
        "off",
        "--policies",
        "default,miso,mmk,reference",
        "--output",
        "json",
    ];
    let out = lab(d, &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let policies = report["policies"].as_array().expect("policies");
    let row = |name: &str| {
        policies
            .iter()
            .find(|p| p["policy"] == name)
            .unwrap_or_else(|| panic!("no {name} row"))
    };
    let reference = row("reference");
    assert_eq!(reference["jobs"], 4);
    assert_eq!(reference["search"]["exact"], true, "{reference}");
    let avg = reference["avg_jct_s"].as_f64().expect("avg");
    let bound = reference["search"]["lower_bound_avg_jct_s"]
        .as_f64()
        .expect("bound");
    assert!((avg - bound).abs() < 1e-6, "{avg} against {bound}");
    assert_eq!(reference["moves"], 0);
    let vs = row("default")["jct_vs_reference_pct"].as_f64().expect("vs");
    assert!(vs >= -1e-6, "default ahead of the exact reference: {vs}");
    for name in ["miso", "mmk"] {
        assert!(row(name)["jct_vs_reference_pct"].as_f64().is_some());
    }
    // The table says what the search came to.
    let table = lab(d, &args[..args.len() - 2]);
    assert!(table.status.success(), "{}", text(&table.stderr));
    let t = text(&table.stdout);
    assert!(t.contains("reference: exact ("), "{t}");
    assert!(
        t.contains("average JCT against the reference's: default +"),
        "{t}"
    );

    // On the measured truth (some pairs ran faster together than apart) both searches
    // are exact; keeping online jobs from waiting costs average JCT (never gains it), and
    // on this trace leaves less of the online jobs' time out of SLO.
    // One 4-job trace of seed 61 on 2 GPUs, the truth measured, under `policies`.
    let small = |policies: &str, json: bool| {
        let mut args = vec![
            "simulate",
            "--online",
            "3",
            "--offline",
            "1",
            "--gpus",
            "2",
            "--seed",
            "61",
            "--policies",
            policies,
        ];
        if json {
            args.extend(["--output", "json"]);
        }
        lab(d, &args)
    };
    let out = small("mmk,reference,reference-prompt", true);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = report["policies"].as_array().expect("policies");
    let (free, prompt) = (&rows[1], &rows[2]);
    assert_eq!(prompt["policy"], "reference-prompt");
    for r in [free, prompt] {
        assert_eq!(r["search"]["exact"], true, "{r}");
    }
    let avg = |r: &serde_json::Value| r["avg_jct_s"].as_f64().expect("avg");
    let miss = |r: &serde_json::Value| r["slo_miss_pct"].as_f64().expect("miss");
    assert!(avg(prompt) >= avg(free) - 1e-6, "{prompt} against {free}");
    assert!(miss(prompt) < miss(free), "{prompt} against {free}");
    assert!(prompt["jct_vs_reference_pct"].as_f64().expect("vs") >= -1e-6);
    // With only the prompt class's search, policies are measured against it.
    let out = small("mmk,reference-prompt", false);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(t.contains("reference-prompt: exact ("), "{t}");
    let vs = t
        .split("average JCT against the reference's: mmk ")
        .nth(1)
        .and_then(|rest| rest.split('%').next())
        .and_then(|pct| pct.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no figure for mmk: {t}"));
    // The figure printed is the one the report gives for MMK, to its printed precision.
    let out = small("mmk,reference-prompt", true);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let given = report["policies"][0]["jct_vs_reference_pct"]
        .as_f64()
        .expect("mmk against the reference");
    assert!(
        (vs - given).abs() <= 0.05 + 1e-9,
        "{vs} printed, {given} given"
    );

    // Too large for the search: refused before anything runs, naming the flag.
    let out = lab(
        d,
        &["simulate", "--gpus", "8", "--policies", "mmk,reference"],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr)
            .contains("--policies reference: the reference search takes at most 4 GPUs"),
        "{}",
        text(&out.stderr)
    );
    let out = lab(
        d,
        &[
            "simulate",
            "--gpus",
            "8",
            "--policies",
            "mmk,reference-prompt",
        ],
    );
    assert!(
        text(&out.stderr).contains("--policies reference-prompt: the reference search takes"),
        "{}",
        text(&out.stderr)
    );
    let out = lab(d, &["simulate", "--gpus", "2", "--policies", "reference"]);
    assert!(
        text(&out.stderr).contains("at most 40 jobs (--online 80 --offline 40)"),
        "{}",
        text(&out.stderr)
    );
}

/// `--offline-share-max` caps MMK's offline shares as `mmkd --offline-share-max` does: the
/// report says so, and a share mmk never gives is refused naming the flag.
#[test]
fn simulate_caps_offline_shares_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let run = |cap: &str| {
        let out = lab(
            d,
            &[
                "simulate",
                "--online",
                "20",
                "--offline",
                "10",
                "--gpus",
                "2",
                "--interval",
                "160",
                "--model",
                "analytic",
                "--policies",
                "mmk",
                "--offline-share-max",
                cap,
                "--output",
                "json",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")
    };
    let (capped, free) = (run("30"), run("100"));
    assert_eq!(capped["offline_share_max"], 30);
    assert_eq!(free["offline_share_max"], 100);
    // At 30 % a training alone on a GPU runs at a fraction of its speed: the jobs take longer.
    let jct = |r: &serde_json::Value| r["policies"][0]["avg_jct_s"].as_f64().expect("jct");
    assert!(
        jct(&capped) > jct(&free),
        "{} against {}",
        jct(&capped),
        jct(&free)
    );
    let out = lab(d, &["simulate", "--offline-share-max", "85"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--offline-share-max: 85 is not an MPS share mmk gives"),
        "{}",
        text(&out.stderr)
    );
}

/// Each class apart, the jobs slowed more than ten times, and moves per job: with no
/// checkpointable job nothing moves, and the report's figures are the jobs' own.
#[test]
fn simulate_reports_each_class_and_the_moves_of_each_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let run = |checkpointable: &str, out: &str| {
        let out = lab(
            d,
            &[
                "--output",
                "json",
                "simulate",
                "--online",
                "8",
                "--offline",
                "8",
                "--gpus",
                "1",
                "--interval",
                "5",
                "--model",
                "analytic",
                "--truth",
                "analytic",
                "--policies",
                "miso,mmk",
                "--checkpointable",
                checkpointable,
                "--checkpoint-every",
                "30",
                "--jobs-out",
                out,
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")
    };
    let report = run("0", "none.csv");
    assert_eq!(report["checkpointable"], 0.0, "{report}");
    assert_eq!(report["checkpoint_every_s"], 30.0, "{report}");
    let jobs = std::fs::read_to_string(d.join("none.csv")).expect("jobs.csv");
    let header: Vec<&str> = jobs.lines().next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let rows: Vec<Vec<&str>> = jobs
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 2 * 16);
    assert!(
        rows.iter().all(|r| r[col("moves")] == "0"),
        "no job can checkpoint, so none moves:\n{jobs}"
    );
    for s in report["policies"].as_array().expect("policies") {
        let name = s["policy"].as_str().expect("policy");
        let mine: Vec<&Vec<&str>> = rows.iter().filter(|r| r[0] == name).collect();
        let field = |r: &Vec<&str>, c: &str| -> f64 { r[col(c)].parse().expect(c) };
        let avg = |class: &str| {
            let js: Vec<f64> = mine
                .iter()
                .filter(|r| r[col("class")] == class)
                .map(|r| field(r, "jct_s"))
                .collect();
            js.iter().sum::<f64>() / js.len() as f64
        };
        for (class, key) in [
            ("online", "online_avg_jct_s"),
            ("offline", "offline_avg_jct_s"),
        ] {
            let reported = s[key].as_f64().expect(key);
            assert!(
                (avg(class) - reported).abs() <= 0.01 * reported.max(1.0),
                "{name} {class}: {} against {reported}",
                avg(class)
            );
        }
        let over = mine
            .iter()
            .filter(|r| field(r, "relative_jct") > 10.0)
            .count();
        let pct = s["slowed_10x_pct"].as_f64().expect("slowed");
        assert!(
            (pct - 100.0 * over as f64 / mine.len() as f64).abs() < 0.01,
            "{name}: {pct} % against {over} of {}",
            mine.len()
        );
        assert!(s["offline_p95_slowdown"].as_f64().expect("p95") >= 1.0);
        assert_eq!(s["moves"], 0, "{s}");
    }
    // The table shows each class apart.
    let out = lab(
        d,
        &[
            "simulate",
            "--online",
            "4",
            "--offline",
            "4",
            "--gpus",
            "1",
            "--model",
            "analytic",
            "--truth",
            "analytic",
            "--policies",
            "mmk",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("ONLINE JCT") && text(&out.stdout).contains("OVER 10x"),
        "{}",
        text(&out.stdout)
    );
    // A share that is not one is refused, naming the flag.
    let out = lab(d, &["simulate", "--checkpointable", "1.5"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "mmk-lab: --checkpointable: 1.5 is not a share between 0 and 1"
    );
}

/// `--duration-sigma` and `--burst` shape the generated trace, are reported with the
/// setup, and are refused where they cannot act.
#[test]
fn simulate_spreads_durations_and_bursts_arrivals_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let base = [
        "simulate",
        "--online",
        "30",
        "--offline",
        "10",
        "--gpus",
        "2",
        "--interval",
        "30",
        "--model",
        "analytic",
        "--truth",
        "analytic",
        "--policies",
        "mmk",
    ];
    let run = |extra: &[&str], trace: &str| {
        let mut args = vec!["--output", "json"];
        args.extend(base);
        args.extend(extra);
        args.extend(["--save-trace", trace]);
        let out = lab(d, &args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let report = serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON");
        let csv = std::fs::read_to_string(d.join(trace)).expect("trace");
        let rows: Vec<(f64, f64)> = csv
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (
                    f[0].parse().expect("arrival"),
                    f[3].parse().expect("duration"),
                )
            })
            .collect();
        (report, rows)
    };
    let (plain, plain_rows) = run(&[], "plain.csv");
    assert!(
        plain.get("duration_sigma").is_none() && plain.get("burst").is_none(),
        "{plain}"
    );
    let (spread, spread_rows) = run(&["--duration-sigma", "2", "--burst", "4"], "spread.csv");
    assert_eq!(spread["duration_sigma"], 2.0, "{spread}");
    assert_eq!(spread["burst"], 4.0, "{spread}");
    let ratio = |f: fn(&(f64, f64)) -> f64| -> Vec<f64> {
        plain_rows
            .iter()
            .zip(&spread_rows)
            .map(|(a, b)| f(b) / f(a))
            .collect()
    };
    // Uniform durations stay within half the nominal one, so no two of the same job differ
    // by 3x; lognormal ones of sigma 2 spread over orders of magnitude.
    let durations = ratio(|r| r.1);
    assert!(
        durations.iter().any(|&x| !(1.0 / 3.0..3.0).contains(&x)),
        "{durations:?}"
    );
    // Bursts: many jobs follow the one before by the burst's 1 s.
    let one_s_apart = spread_rows
        .windows(2)
        .filter(|w| w[1].0 - w[0].0 == 1.0)
        .count();
    assert!(one_s_apart >= 10, "{one_s_apart} of 40 jobs in bursts");
    for (args, message) in [
        (
            vec!["simulate", "--duration-sigma", "9"],
            "mmk-lab: --duration-sigma: 9 is not a lognormal sigma from 0.1 to 3",
        ),
        (
            vec!["simulate", "--burst", "0.5"],
            "mmk-lab: --burst: 0.5 is not a mean burst size from 1 to 100 jobs",
        ),
        (
            vec!["simulate", "--trace", "plain.csv", "--burst", "3"],
            "mmk-lab: --duration-sigma and --burst shape a generated trace; a replayed --trace has its own",
        ),
    ] {
        let out = lab(d, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(text(&out.stderr).trim(), message);
    }
}
