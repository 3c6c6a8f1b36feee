use super::*;

#[test]
fn a_plan_is_grouped_by_share_and_bad_fields_are_named() {
    let p = Plan::parse(
        "worker: [python3, workloads.py, worker]\nwindow: 2s\nalone:\n  shares: [20, 100]\n  jobs: [resnet50-inf/32, bert-train/8]\npairs:\n  splits: [[60, 40]]\n  jobs: [[resnet50-inf/32, bert-train/8]]\n",
        Path::new("/x"),
    )
    .unwrap();
    assert_eq!(p.window, Duration::from_secs(2));
    assert_eq!(p.groups.len(), 3);
    assert_eq!(p.runs(), 5);
    assert_eq!(p.groups[2].shares, [60, 40]);
    assert_eq!(
        p.groups[2].refs(&p.groups[2].runs[0])[1],
        JobRef {
            workload: "bert-train".into(),
            batch: 8,
            share_pct: 40
        }
    );
    let bad = |t: &str| match Plan::parse(t, Path::new("/x")) {
        Err(MeasureError::Plan(why)) => why,
        other => panic!("not a plan error: {other:?}"),
    };
    assert_eq!(
        bad("worker: [w]\nalone:\n  shares: [10]\n  jobs: [a/1, b]\n"),
        "alone.jobs[1]: \"b\" is not NAME/BATCH (for example resnet50-inf/32)"
    );
    assert_eq!(
        bad("worker: [w]\nalone:\n  shares: [10, 0]\n  jobs: [a/1]\n"),
        "alone.shares[1]: 0 is outside 1..=100"
    );
    assert_eq!(
        bad("worker: [w]\npairs:\n  splits: [[50, 150]]\n  jobs: [[a/1, b/2]]\n"),
        "pairs.splits[0][1]: 150 is outside 1..=100"
    );
    assert_eq!(
        bad("worker: [w]\n"),
        "the plan measures nothing: give alone, pairs or groups"
    );
    assert_eq!(
        bad("worker: [w]\nwindow: 0s\nalone:\n  shares: [10]\n  jobs: [a/1]\n"),
        "window: 0s must be above 0 and at most 10m"
    );
    assert!(
        bad("worker: [w]\nwindo: 1s\n").starts_with("line 2:"),
        "{}",
        bad("worker: [w]\nwindo: 1s\n")
    );
}

/// A fake worker in sh: an iteration takes 1 / share seconds (10 ms at 100 %), twice
/// as long next to a co-runner is not modelled; `boom/1` fails to prepare.
const FAKE: &str = r#"
share=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
ms=$((1000 / share))
while read -r line; do
  case "$line" in
*'"op":"info"'*) echo '{"ok":true,"torch":"fake 1.0"}' ;;
*'"op":"prepare"'*'"workload":"boom"'*) echo '{"ok":false,"error":"KeyError: unknown workload boom"}' ;;
*'"op":"prepare"'*) echo '{"ok":true,"class":"offline","mem_bytes":1000}' ;;
*'"op":"measure"'*) printf '{"ok":true,"iters":[[1,0.%03d],[2,0.%03d],[3,0.%03d]]}\n' $ms $ms $ms ;;
*'"op":"drop"'*) echo '{"ok":true}' ;;
*'"op":"quit"'*) exit 0 ;;
  esac
done
"#;

struct FakeGpm;
impl Monitor for FakeGpm {
    fn gpu(&self) -> Option<GpuInfo> {
        None
    }
    fn window(&self, _s: u64, end_ns: u64) -> Result<Gpm, MeasureError> {
        sleep_until(end_ns);
        Ok(Gpm {
            sm_util_pct: Some(50.0),
            dram_bw_util_pct: Some(20.0),
            ..Gpm::default()
        })
    }
    fn process_memory(&self, _pid: u32) -> Option<u64> {
        Some(7)
    }
}

#[test]
fn a_sweep_records_every_run_keeps_going_past_failures_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fake.sh"), FAKE).unwrap();
    let plan = Plan::parse(
        "worker: [sh, fake.sh]\nwindow: 20ms\nsettle: 1ms\nalone:\n  shares: [50, 100]\n  jobs: [a/1, boom/1]\npairs:\n  splits: [[100, 50]]\n  jobs: [[boom/1, a/1], [a/1, a/1]]\n",
        dir.path(),
    )
    .unwrap();
    let out = dir.path().join("raw.jsonl");
    let s = sweep(&plan, &FakeGpm, &out, &HashSet::new(), &mut true).unwrap();
    // The pair after a failed one is measured right: no reply of the failed run is
    // left over to be taken for one of its own.
    assert_eq!((s.planned, s.measured, s.failed), (6, 3, 3));
    let recs = measured::parse(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let Record::Header(h) = &recs[0] else {
        panic!("{:?}", recs[0])
    };
    assert_eq!(h.worker["torch"], "fake 1.0");
    let runs: Vec<&Run> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Run(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(runs.len(), 3);
    // 20 ms an iteration at 50 %, 10 ms at 100 %.
    assert!((runs[0].jobs[0].mean_s - 0.020).abs() < 1e-9);
    assert!((runs[1].jobs[0].mean_s - 0.010).abs() < 1e-9);
    assert_eq!(runs[1].jobs[0].process_mem_bytes, Some(7));
    assert_eq!(runs[2].jobs.len(), 2);
    assert!(recs.iter().any(|r| matches!(r, Record::Failed(f)
        if f.error == "boom-b1: prepare: KeyError: unknown workload boom")));
    // The rows: a at 50 % runs at half speed.
    let c = measured::to_dataset(&recs).unwrap();
    assert_eq!(c.dataset.rows.len(), 4);
    assert!((c.dataset.rows[0].normalized_perf - 0.5).abs() < 1e-9);
    // Resuming measures only the failed runs again.
    let done = done_runs(&out).unwrap();
    let s = sweep(&plan, &FakeGpm, &out, &done.runs, &mut false).unwrap();
    assert_eq!((s.kept, s.measured, s.failed), (3, 0, 3));
}

#[test]
fn groups_run_one_worker_per_share_and_their_bad_fields_are_named() {
    let p = Plan::parse(
        "worker: [w]\ngroups:\n  splits: [[100, 100, 100], [40, 30, 30]]\n  jobs:\n    - [resnet50-inf/32, bert-train/8, vgg19-train/32]\n    - [vgg16-inf/32, bert-train/8, resnet152-train/16]\n",
        Path::new("/x"),
    )
    .unwrap();
    assert_eq!(p.groups.len(), 2);
    assert_eq!(p.runs(), 4);
    assert!(p.groups.iter().all(|g| g.mode == Mode::Group));
    assert_eq!(p.groups[1].shares, [40, 30, 30]);
    assert_eq!(
        p.groups[1].refs(&p.groups[1].runs[1])[2],
        JobRef {
            workload: "resnet152-train".into(),
            batch: 16,
            share_pct: 30
        }
    );
    let bad = |t: &str| match Plan::parse(t, Path::new("/x")) {
        Err(MeasureError::Plan(why)) => why,
        other => panic!("not a plan error: {other:?}"),
    };
    assert_eq!(
        bad("worker: [w]\ngroups:\n  splits: [[50, 50]]\n  jobs: [[a/1, b/2]]\n"),
        "groups.jobs[0]: 2 jobs; a group has 3 to 8 (two are pairs)"
    );
    assert_eq!(
        bad(
            "worker: [w]\ngroups:\n  splits: [[50, 50, 50]]\n  jobs: [[a/1, b/2, c/3], [a/1, b/2]]\n"
        ),
        "groups.jobs[1]: 2 jobs, but groups.jobs[0] has 3: every group of a plan has as many"
    );
    assert_eq!(
        bad(
            "worker: [w]\ngroups:\n  splits: [[50, 50, 50], [50, 50]]\n  jobs: [[a/1, b/2, c/3]]\n"
        ),
        "groups.splits[1]: 2 shares for groups of 3 jobs"
    );
    assert_eq!(
        bad("worker: [w]\ngroups:\n  splits: [[50, 0, 50]]\n  jobs: [[a/1, b/2, c/3]]\n"),
        "groups.splits[0][1]: 0 is outside 1..=100"
    );
    assert_eq!(
        bad("worker: [w]\ngroups:\n  splits: [[50, 50, 50]]\n  jobs: [[a/1, b, c/3]]\n"),
        "groups.jobs[0][1]: \"b\" is not NAME/BATCH (for example resnet50-inf/32)"
    );
}

#[test]
fn a_group_run_measures_every_job_over_one_window() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fake.sh"), FAKE).unwrap();
    let plan = Plan::parse(
        "worker: [sh, fake.sh]\nwindow: 20ms\nsettle: 1ms\nalone:\n  shares: [100]\n  jobs: [a/1, b/1, c/1]\ngroups:\n  splits: [[50, 25, 25]]\n  jobs: [[a/1, b/1, c/1]]\n",
        dir.path(),
    )
    .unwrap();
    let out = dir.path().join("raw.jsonl");
    let s = sweep(&plan, &FakeGpm, &out, &HashSet::new(), &mut true).unwrap();
    assert_eq!((s.planned, s.measured, s.failed), (4, 4, 0));
    let recs = measured::parse(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let Some(Record::Run(g)) = recs.last() else {
        panic!("{:?}", recs.last())
    };
    assert_eq!(g.mode, Mode::Group);
    // 20 ms an iteration at 50 %, 40 ms at 25 %.
    let means: Vec<f64> = g.jobs.iter().map(|j| j.mean_s).collect();
    assert_eq!(means, [0.020, 0.040, 0.040]);
    // Each job of the group is a row with its two co-runners.
    let c = measured::to_dataset(&recs).unwrap();
    assert_eq!(c.dataset.rows.len(), 6);
    assert!((c.dataset.rows[5].normalized_perf - 0.25).abs() < 1e-9);
    // Resuming knows the group run.
    let done = done_runs(&out).unwrap();
    let s = sweep(&plan, &FakeGpm, &out, &done.runs, &mut false).unwrap();
    assert_eq!((s.kept, s.measured), (4, 0));
}

#[test]
fn a_worker_that_dies_fails_its_run_and_is_started_again() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("die.sh"),
        "read -r line; echo '{\"ok\":true}'; read -r line; exit 3\n",
    )
    .unwrap();
    let plan = Plan::parse(
        "worker: [sh, die.sh]\nwindow: 10ms\nalone:\n  shares: [100]\n  jobs: [a/1, b/1]\n",
        dir.path(),
    )
    .unwrap();
    let out = dir.path().join("raw.jsonl");
    let s = sweep(
        &plan,
        &NoMonitor {
            reason: "none".into(),
        },
        &out,
        &HashSet::new(),
        &mut true,
    )
    .unwrap();
    assert_eq!((s.measured, s.failed), (0, 2));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("exited"), "{text}");
}
