//! The kernel scheduler's lab tools end to end on the fake driver: `mmk-lab profile`
//! writes a job's kernel profile, `ksim` replays the traces under each kernel policy,
//! `simulate` takes MMK's kernel-scheduler effect from ksim's report, and `measure` records
//! each job's kernels through the interposer and ncu.

use std::path::Path;

use mmk_kernel_sched::Profile;
use mmk_kernel_sched::artifacts::{FAKE_APP, INTERPOSER};

use crate::harness::{built, fake_driver_in, lab_in, text};

#[test]
fn profile_ksim_and_simulate_work_end_to_end() {
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

    let out = lab_in(
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
    // The kernel's mean is that of the times the trace measured: at least the fake's
    // 200 us, with most of them close to it (a launching thread that a loaded machine stops
    // between the events around a launch stretches a few by milliseconds).
    let mean = profile.kernels[0].mean_ns;
    let traced = mmk_kernel_sched::trace::parse(
        &std::fs::read_to_string(dir.path().join("serve.csv")).expect("the saved trace"),
    )
    .expect("a valid trace");
    let mut took: Vec<u64> = traced.iter().filter_map(|r| r.duration_ns()).collect();
    took.sort_unstable();
    assert_eq!(took.len(), 60, "every launch measured");
    let traced_mean = took.iter().sum::<u64>() / took.len() as u64;
    let median = took[took.len() / 2];
    assert!(
        mean >= 150_000
            && mean.abs_diff(traced_mean) <= traced_mean / 100
            && (150_000..2_000_000).contains(&median),
        "the fake's 200 us kernel measured {mean} ns on average, {traced_mean} ns in the \
         trace, {median} ns at the median"
    );
    let out = lab_in(
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
    let out = lab_in(
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
        assert!(online["mean_vs_alone"].as_f64().unwrap() >= 0.99, "{r}");
    }

    // The job-level simulator takes MMK's kernel-scheduler effect from that report.
    std::fs::write(dir.path().join("ksim.json"), &out.stdout).expect("write");
    let out = lab_in(
        dir.path(),
        &[
            "--output",
            "json",
            "simulate",
            "--online",
            "6",
            "--offline",
            "3",
            "--gpus",
            "1",
            "--model",
            "analytic",
            "--policies",
            "miger,mmk-ks",
            "--kernel-sched",
            "ksim.json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sim: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let effect = &sim["kernel_sched"];
    assert_eq!(
        effect["source"],
        "the kernel-level simulator's mmk policy, ksim.json"
    );
    let offline_kept = rows[1]["offline"][0]["vs_passthrough"].as_f64().unwrap();
    assert_eq!(effect["offline_kept"].as_f64(), Some(offline_kept.min(1.0)));
    // The online part kept: mmk's mean slowdown over passthrough's (1 where passthrough
    // slowed it by under 1 %).
    let mean = |r: &serde_json::Value| r["online"][0]["mean_vs_alone"].as_f64().unwrap();
    let (plain, mmk) = (mean(&rows[0]) - 1.0, mean(&rows[1]) - 1.0);
    let kept = if plain > 0.01 {
        (mmk / plain).clamp(0.0, 1.0)
    } else {
        1.0
    };
    let got = effect["online_excess_kept"].as_f64().expect("kept");
    assert!((got - kept).abs() < 1e-12, "{effect} against {kept}");
    assert_eq!(sim["policies"][1]["jobs"], 9, "{sim}");
    let out = lab_in(dir.path(), &["ksim", "--online", "nope.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("nope.csv"),
        "{}",
        text(&out.stderr)
    );
}

/// A measure worker in sh that runs the fake driver's app on `measure` (so its kernels
/// pass through the interposer that mmk-lab preloads) and marks a `"profile": true`.
const KERNEL_WORKER: &str = r#"
while read -r line; do
  case "$line" in
    *'"op":"info"'*) echo '{"ok":true,"sms":"132"}' ;;
    *'"op":"prepare"'*) echo '{"ok":true,"class":"online","mem_bytes":4096}' ;;
    *'"op":"measure"'*)
      case "$line" in *'"profile":true'*) touch profiled ;; esac
      "$APP" --api driver --kernels 30 --duration-us 200 --gap-us 300 >/dev/null
      echo '{"ok":true,"iters":[[1,0.01],[2,0.01],[3,0.01]]}' ;;
    *'"op":"quit"'*) exit 0 ;;
    *) echo '{"ok":true}' ;;
  esac
done
"#;

/// A stand-in for ncu: runs the command after its options, speaks on stdout as ncu does,
/// and writes a raw CSV report to --log-file only if the worker started the profiler.
const FAKE_NCU: &str = r#"#!/bin/sh
log=
while [ $# -gt 0 ]; do
  case "$1" in
    --log-file) log=$2; shift 2 ;;
    --csv) shift ;;
    --*) shift 2 ;;
    *) break ;;
  esac
done
echo "==PROF== Connected to process $$"
"$@"
if [ -e profiled ]; then
  cat >"$log" <<'CSV'
==PROF== Disconnected
"ID","Kernel Name","gpu__time_duration.sum","sm__warps_active.avg.pct_of_peak_sustained_active","sm__inst_executed.avg.per_cycle_active","lts__t_sector_hit_rate.pct","dram__throughput.avg.pct_of_peak_sustained_elapsed"
"","","ns","%","inst/cycle","%","%"
"0","gemm","3,000","50","2.0","80","20"
"1","relu","1,000","90","0.5","40","n/a"
"2","gemm","3,000","50","2.0","80","20"
CSV
fi
"#;

#[test]
fn measure_records_each_jobs_kernels_through_the_interposer_and_ncu() {
    let bin = built();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let lib = fake_driver_in(&bin, d);
    std::fs::write(d.join("worker.sh"), KERNEL_WORKER).expect("worker");
    std::fs::write(d.join("ncu.sh"), FAKE_NCU).expect("ncu");
    std::fs::write(
        d.join("plan.yaml"),
        "worker: [sh, worker.sh]\nwindow: 3s\nsettle: 1ms\nalone:\n  shares: [100]\n  jobs: [svc/8, other/4]\n",
    )
    .expect("plan");
    let run = |out: &str, extra: &[&str]| {
        let mut args = vec!["--output", "json", "measure", "plan.yaml", "-o", out];
        args.extend_from_slice(extra);
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mmk-lab"));
        cmd.current_dir(d)
            .args(&args)
            .env("APP", bin.join(FAKE_APP))
            .env("LD_LIBRARY_PATH", &lib);
        cmd.output().expect("mmk-lab runs")
    };
    let interposer = bin.join(INTERPOSER).display().to_string();
    let out = run(
        "raw.jsonl",
        &["--only", "kernels", "--no-gpm", "--interposer", &interposer],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        (s["planned"].as_u64(), s["measured"].as_u64()),
        (Some(2), Some(2))
    );
    assert!(
        text(&out.stderr).contains("svc-b8 (kernels): 30 launches"),
        "{}",
        text(&out.stderr)
    );
    let recs =
        mmk_predictor::measured::parse(&std::fs::read_to_string(d.join("raw.jsonl")).unwrap())
            .expect("a valid measurement file");
    let kernels: Vec<_> = recs
        .iter()
        .filter_map(|r| match r {
            mmk_predictor::measured::Record::Kernels(k) => Some(k),
            _ => None,
        })
        .collect();
    assert!(matches!(
        recs[0],
        mmk_predictor::measured::Record::Header(_)
    ));
    assert_eq!(kernels.len(), 2);
    let k = kernels[0];
    assert_eq!(
        (k.launches, k.distinct, k.gpu_sms, k.iters),
        (30, 1, Some(132), 3)
    );
    assert!(
        (150.0..2_000.0).contains(&k.p50_us),
        "the fake's 200 us kernels measured {} us",
        k.p50_us
    );
    assert!(k.busy_frac > 0.0 && k.busy_frac < 0.5, "{}", k.busy_frac);
    // No kernel measured under 100 us (the fake's run 200 us, and a loaded machine only
    // lengthens what the events around a launch measure); those of 100 us-1 ms, most of
    // them, measured as such.
    assert_eq!(
        k.time_by_duration[..2],
        [0.0, 0.0],
        "no kernel under 100 us: {:?}",
        k.time_by_duration
    );
    assert!(
        k.time_by_duration[2] > 0.0,
        "kernels of 100 us-1 ms: {:?}",
        k.time_by_duration
    );

    // --deep under the stand-in ncu: the worker is asked to start the profiler, ncu's own
    // line on stdout does not upset the protocol, and the report becomes a deep record.
    let ncu = d.join("ncu.sh");
    std::fs::set_permissions(&ncu, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let out = run(
        "raw.jsonl",
        &[
            "--only",
            "deep",
            "--no-gpm",
            "--resume",
            "--ncu",
            &ncu.display().to_string(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let recs =
        mmk_predictor::measured::parse(&std::fs::read_to_string(d.join("raw.jsonl")).unwrap())
            .expect("a valid measurement file");
    let deep: Vec<_> = recs
        .iter()
        .filter_map(|r| match r {
            mmk_predictor::measured::Record::Deep(k) => Some(k),
            _ => None,
        })
        .collect();
    assert_eq!(deep.len(), 2);
    assert_eq!(deep[0].profiled, 3);
    assert_eq!(deep[0].top[0].name, "gemm");
    assert!((deep[0].ipc.unwrap() - (2.0 * 6.0 + 0.5) / 7.0).abs() < 1e-9);
    assert!(
        (deep[0].dram_tput_frac.unwrap() - 0.2).abs() < 1e-9,
        "n/a is left out"
    );

    // ncu that writes nothing: each job's failure says why, and the exit code is 2.
    std::fs::remove_file(d.join("profiled")).ok();
    std::fs::write(
        d.join("worker.sh"),
        KERNEL_WORKER.replace("touch profiled", "true"),
    )
    .expect("worker");
    let out = run(
        "raw2.jsonl",
        &[
            "--only",
            "deep",
            "--no-gpm",
            "--ncu",
            &ncu.display().to_string(),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("wrote no report"),
        "{}",
        text(&out.stderr)
    );
}

/// The kernel-level simulator on the co-location matrix's recorded traces (H100,
/// lab/data/kernel-sched/h100-2026-11-26) orders `passthrough` and the gate with a 10 % hold
/// budget as the GPU did (docs/colocation-matrix-h100.json, its eager tier: the services
/// the traces were recorded from launch kernel by kernel): the holds cost every training
/// throughput, and where the simulator has the holds lower a service's p99, the GPU had it
/// too. (Where it predicts no change, for ResNet-50, the GPU had the holds raise the p99:
/// the simulator does not model what holding costs the online job.)
#[test]
fn ksim_orders_the_matrix_configurations_as_the_gpu_did() {
    let lab = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = lab.join("data/kernel-sched/h100-2026-11-26");
    let gpu: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(lab.join("../docs/colocation-matrix-h100.json")).expect("read"),
    )
    .expect("the GPU table");
    // The recorded runs' mean intervals between requests.
    let services = [("resnet50", "7968us"), ("bert", "15683us")];
    let mut p99_checked = 0;
    for (service, interval) in services {
        for training in ["bert", "resnet152"] {
            let online = data.join(format!("serve-{service}.csv"));
            let offline = data.join(format!("train-{training}.csv"));
            let out = lab_in(
                &data,
                &[
                    "--output",
                    "json",
                    "ksim",
                    "--online",
                    online.to_str().unwrap(),
                    "--offline",
                    offline.to_str().unwrap(),
                    "--interval",
                    interval,
                    "--online-share",
                    "100",
                    "--offline-share",
                    "80",
                    "--policies",
                    "passthrough,mmk",
                    "--hold-budget",
                    "10",
                    "--duration",
                    "10s",
                ],
            );
            assert!(out.status.success(), "{}", text(&out.stderr));
            let sim: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
            let rows = sim["policies"].as_array().expect("policies");
            let (plain, held) = (&rows[0], &rows[1]);
            let pair = gpu["tiers"]["eager"]["pairs"]
                .as_array()
                .expect("pairs")
                .iter()
                .find(|p| p["online"] == service && p["offline"] == training)
                .unwrap_or_else(|| panic!("{service} + {training} in the GPU table"));
            let on_gpu = |config: &str, key: &str| {
                pair["configs"][config][key]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{config}.{key} for {service} + {training}"))
            };
            let what = format!("{service} + {training}: ksim {sim}, GPU {pair}");
            // Training: held over passthrough, in the simulator and on the GPU.
            let sim_train = held["offline"][0]["vs_passthrough"].as_f64().expect("rate");
            let gpu_train =
                on_gpu("mmk-budget10", "train_vs_mps") / on_gpu("mmk-passthrough", "train_vs_mps");
            assert!(sim_train < 1.0 && gpu_train < 1.0, "{what}");
            // The service's p99, where the simulator tells the two apart.
            let p99 = |r: &serde_json::Value| r["online"][0]["p99_ms"].as_f64().expect("p99");
            let sim_p99 = p99(held) / p99(plain);
            if (sim_p99 - 1.0).abs() > 0.01 {
                let gpu_p99 =
                    on_gpu("mmk-budget10", "p99_ratio") / on_gpu("mmk-passthrough", "p99_ratio");
                assert_eq!(sim_p99 < 1.0, gpu_p99 < 1.0, "{what}");
                p99_checked += 1;
            }
        }
    }
    assert!(
        p99_checked >= 2,
        "the simulator told the p99s apart in at least two pairs"
    );
}
