use std::sync::Arc;

use mmk_core::workload;
use mmk_partitioner::{AnalyticModel, planner};

use super::*;
use crate::trace::{TraceJob, TraceSpec, generate};
use mmk_partitioner::PartitionShape;

fn job(arrival_s: f64, name: &str, duration_s: f64) -> TraceJob {
    let w = workload::find(name).expect("workload");
    TraceJob {
        arrival_s,
        workload: w,
        class: w.class(),
        duration_s,
        memory_mib: w.nominal_memory_mib,
        checkpoint: false,
    }
}

fn jct_sum(r: &RunResult) -> f64 {
    r.jobs.iter().map(|j| j.jct_s()).sum()
}

/// The search with nothing pruned: every schedule of the class.
fn brute(
    trace: &Trace,
    cfg: &SimConfig,
    truth: &dyn PerfModel,
    opts: &ReferenceOptions,
) -> Reference {
    let model = catalog::model(&cfg.gpu_model).expect("model");
    let mut s = Search::new(trace, cfg, model, truth, opts, true);
    s.run().expect("searched");
    finish(s, trace, cfg, truth).expect("a schedule")
}

/// Small traces of the generator's mix, their jobs cut short so that they overlap.
fn small(n: usize, seed: u64, interval: f64) -> Trace {
    let mut t = generate(TraceSpec {
        online: n - n / 3,
        offline: n / 3,
        mean_interval_s: interval,
        seed,
        checkpointable: 1.0,
        durations: crate::trace::Durations::Uniform,
        burst: 1.0,
    });
    for j in &mut t.jobs {
        j.duration_s = j.duration_s.min(300.0);
    }
    t
}

#[test]
fn branch_and_bound_finds_what_brute_force_finds() {
    let truth = AnalyticModel::default();
    let opts = ReferenceOptions {
        shares: vec![100, 50],
        node_limit: u64::MAX,
        prompt_online: false,
    };
    for (gpus, seed) in [(1, 1), (1, 2), (2, 3), (2, 4)] {
        let t = small(3, seed, 30.0);
        let cfg = SimConfig::new("a100-80gb", gpus);
        let exact = solve(&t, &cfg, &truth, &opts).expect("solved");
        let all = brute(&t, &cfg, &truth, &opts);
        assert!(exact.exact);
        assert!(
            (jct_sum(&exact.run) - jct_sum(&all.run)).abs() < 1e-6,
            "{gpus} GPUs, seed {seed}: {} against brute force {}",
            jct_sum(&exact.run),
            jct_sum(&all.run)
        );
        assert!(
            exact.nodes < all.nodes,
            "{gpus} GPUs, seed {seed}: the bound pruned nothing"
        );
        assert!((exact.lower_bound_jct_sum_s - jct_sum(&exact.run)).abs() < 1e-6);
    }
}

/// The search simulates as the engine does: the schedule it found, replayed through
/// `simulate`, has the JCTs it computed (`solve` checks, and fails otherwise).
#[test]
fn the_engine_replays_the_schedule_the_search_found() {
    let truth = AnalyticModel::default();
    for (gpus, seed) in [(1, 5), (2, 6), (2, 7)] {
        let t = small(6, seed, 20.0);
        let cfg = SimConfig::new("a100-80gb", gpus);
        let r = solve(
            &t,
            &cfg,
            &truth,
            &ReferenceOptions {
                node_limit: 2_000,
                ..ReferenceOptions::default()
            },
        )
        .expect("solved and replayed");
        assert_eq!(r.run.policy, "reference");
        assert_eq!(r.run.jobs.len(), t.jobs.len());
        assert_eq!(r.run.moves, 0);
        assert!(r.lower_bound_jct_sum_s <= jct_sum(&r.run) + 1e-6);
    }
}

/// Default's schedules are in the class, so the exact reference is never behind them.
#[test]
fn default_never_beats_the_exact_reference() {
    let truth = AnalyticModel::default();
    for seed in 1..=3 {
        let t = small(4, seed, 40.0);
        let cfg = SimConfig::new("a100-80gb", 2);
        let r = solve(&t, &cfg, &truth, &ReferenceOptions::default()).expect("solved");
        assert!(r.exact);
        let p = planner("default", Arc::new(AnalyticModel::default())).expect("planner");
        let run = simulate(&t, &cfg, p.as_ref(), &truth, &mut |_, _| {}).expect("run");
        assert!(
            jct_sum(&r.run) <= jct_sum(&run) + 1e-6,
            "seed {seed}: reference {} behind default {}",
            jct_sum(&r.run),
            jct_sum(&run)
        );
    }
}

/// A truth where company speeds a job up, with no bound of its own, is searched against
/// the bound every truth has (no job runs faster than alone on a whole GPU): the search
/// is exact, and finds what brute force finds.
#[test]
fn a_truth_where_company_helps_is_searched_within_its_bound() {
    #[derive(Debug)]
    struct Company(bool);
    impl PerfModel for Company {
        fn estimate(
            &self,
            _: &mmk_partitioner::JobProfile,
            p: &PartitionShape,
            _: u8,
            co: &[CoRunner],
        ) -> f64 {
            let frac = f64::from(p.sm_count) / f64::from(p.gpu_sm_count);
            (frac * 0.5 * (1.0 + co.len() as f64)).min(1.0)
        }
        /// `Company(true)` claims that company never helps: a bound it breaks.
        fn company_never_helps(&self) -> bool {
            self.0
        }
    }
    let t = small(3, 2, 10.0);
    let cfg = SimConfig::new("a100-80gb", 1);
    let opts = ReferenceOptions {
        shares: vec![100, 50],
        node_limit: u64::MAX,
        prompt_online: false,
    };
    let r = solve(&t, &cfg, &Company(false), &opts).expect("solved");
    let all = brute(&t, &cfg, &Company(false), &opts);
    assert!(r.exact);
    assert!((jct_sum(&r.run) - jct_sum(&all.run)).abs() < 1e-6);
    // A truth that breaks the bound it declares gets no exact claim, and the bound falls
    // back to the solo times.
    let r = solve(&t, &cfg, &Company(true), &opts).expect("solved");
    assert!(!r.exact);
    let solo: f64 = t.jobs.iter().map(|j| j.duration_s).sum();
    assert!((r.lower_bound_jct_sum_s - solo).abs() < 1e-6);
}

/// The measured truth's pairs sometimes ran faster together than apart; its bound (the
/// job alone times the largest gain measured for it) holds for every speed the search
/// asks, so the search on it is exact and finds what brute force finds, pruning some.
#[test]
fn the_measured_truth_is_searched_exactly() {
    let (truth, profiles) = crate::experiment::measured_truth().expect("measured truth");
    let opts = ReferenceOptions {
        shares: vec![100, 50],
        node_limit: u64::MAX,
        prompt_online: false,
    };
    // Seeds 5 and 8 co-locate a pair that ran faster together than apart: a bound of
    // the job alone breaks there.
    for (gpus, seed) in [(1, 5), (2, 8), (2, 3)] {
        let t = small(3, seed, 20.0);
        let mut cfg = SimConfig::new("a100-80gb", gpus);
        cfg.profiles = profiles.clone();
        let r = solve(&t, &cfg, &truth, &opts).expect("solved");
        let all = brute(&t, &cfg, &truth, &opts);
        assert!(r.exact, "{gpus} GPUs, seed {seed}");
        assert!(
            (jct_sum(&r.run) - jct_sum(&all.run)).abs() < 1e-6,
            "{gpus} GPUs, seed {seed}: {} against brute force {}",
            jct_sum(&r.run),
            jct_sum(&all.run)
        );
        assert!(
            r.nodes < all.nodes,
            "{gpus} GPUs, seed {seed}: nothing pruned"
        );
    }
}

#[test]
fn two_jobs_on_one_gpu_share_it_or_queue_as_their_speeds_say() {
    // Two trainings arriving together on one GPU. Nothing slows a co-runner: they
    // share the GPU. Co-runners that crawl: one after the other.
    #[derive(Debug)]
    struct Corunner(f64);
    impl PerfModel for Corunner {
        fn estimate(
            &self,
            _: &mmk_partitioner::JobProfile,
            p: &PartitionShape,
            share: u8,
            co: &[CoRunner],
        ) -> f64 {
            let frac = f64::from(p.sm_count) / f64::from(p.gpu_sm_count);
            (frac * f64::from(share) / 100.0 * self.0.powi(co.len() as i32)).min(1.0)
        }
        fn company_never_helps(&self) -> bool {
            self.0 <= 1.0
        }
    }
    let t = Trace {
        jobs: vec![
            job(0.0, "resnet50-train", 100.0),
            job(0.0, "bert-train", 100.0),
        ],
    };
    let cfg = SimConfig::new("a100-80gb", 1);
    let opts = ReferenceOptions {
        shares: vec![100],
        node_limit: u64::MAX,
        prompt_online: false,
    };
    let setup = cfg.create_s;
    // The 7g.80gb instance has 98 of the A100's 108 SMs.
    let solo = 100.0 * 108.0 / 98.0;
    let r = solve(&t, &cfg, &Corunner(1.0), &opts).expect("solved");
    assert!(r.exact);
    assert!(
        (jct_sum(&r.run) - 2.0 * (solo + setup)).abs() < 1e-6,
        "{:?}",
        r.run.jobs
    );
    let r = solve(&t, &cfg, &Corunner(0.3), &opts).expect("solved");
    assert!(
        (jct_sum(&r.run) - (solo + setup + 2.0 * solo + setup)).abs() < 1e-6,
        "{:?}",
        r.run.jobs
    );
}

#[test]
fn a_search_cut_short_keeps_its_best_and_a_bound_below_it() {
    let truth = AnalyticModel::default();
    let t = small(8, 3, 15.0);
    let cfg = SimConfig::new("a100-80gb", 2);
    let r = solve(
        &t,
        &cfg,
        &truth,
        &ReferenceOptions {
            node_limit: 50,
            ..ReferenceOptions::default()
        },
    )
    .expect("solved");
    assert!(!r.exact);
    // The prompt class's search, then the whole class's, each cut at 50.
    assert_eq!(r.nodes, 100);
    assert!(r.lower_bound_jct_sum_s < jct_sum(&r.run));
    let solo: f64 = t.jobs.iter().map(|j| j.duration_s).sum();
    assert!(r.lower_bound_jct_sum_s >= solo - 1e-6);
}

#[test]
fn bad_requests_are_refused() {
    let truth = AnalyticModel::default();
    let t = small(4, 1, 30.0);
    let e = solve(
        &t,
        &SimConfig::new("a100-80gb", 5),
        &truth,
        &ReferenceOptions::default(),
    )
    .expect_err("too many GPUs");
    assert!(e.to_string().contains("at most 40 jobs and 4 GPUs"), "{e}");
    let e = solve(
        &t,
        &SimConfig::new("a100-80gb", 1),
        &truth,
        &ReferenceOptions {
            shares: vec![0],
            ..ReferenceOptions::default()
        },
    )
    .expect_err("no share");
    assert_eq!(e, ReferenceError::Shares(vec![0]));
    #[derive(Debug)]
    struct Fast;
    impl PerfModel for Fast {
        fn estimate(
            &self,
            _: &mmk_partitioner::JobProfile,
            _: &PartitionShape,
            _: u8,
            _: &[CoRunner],
        ) -> f64 {
            1.5
        }
    }
    let e = solve(
        &t,
        &SimConfig::new("a100-80gb", 1),
        &Fast,
        &ReferenceOptions::default(),
    )
    .expect_err("faster than alone");
    assert!(matches!(e, ReferenceError::FasterThanAlone { .. }), "{e}");
}

/// A class that keeps online jobs from waiting is searched exactly too (what brute force
/// finds), is never ahead of the class that may let them wait, and on some trace the
/// constraint costs average JCT and saves online waits.
#[test]
fn prompt_online_jobs_cost_average_jct_and_save_their_waits() {
    let (truth, profiles) = crate::experiment::measured_truth().expect("measured truth");
    let opts = |prompt_online| ReferenceOptions {
        shares: vec![100, 50],
        node_limit: u64::MAX,
        prompt_online,
    };
    let online_wait = |r: &RunResult| -> f64 {
        r.jobs
            .iter()
            .filter(|j| j.online)
            .map(|j| j.start_s - j.arrival_s)
            .sum()
    };
    let mut bit = 0;
    for (gpus, seed) in [(1, 1), (1, 2), (2, 5), (2, 8)] {
        let t = small(3, seed, 20.0);
        let mut cfg = SimConfig::new("a100-80gb", gpus);
        cfg.profiles = profiles.clone();
        let free = solve(&t, &cfg, &truth, &opts(false)).expect("solved");
        let prompt = solve(&t, &cfg, &truth, &opts(true)).expect("solved");
        let all = brute(&t, &cfg, &truth, &opts(true));
        assert!(prompt.exact, "{gpus} GPUs, seed {seed}");
        assert!((jct_sum(&prompt.run) - jct_sum(&all.run)).abs() < 1e-6);
        assert!(jct_sum(&prompt.run) >= jct_sum(&free.run) - 1e-6);
        if jct_sum(&prompt.run) > jct_sum(&free.run) + 1e-6 {
            assert!(online_wait(&prompt.run) < online_wait(&free.run));
            bit += 1;
        }
    }
    assert!(bit > 0, "the constraint changed no schedule");
}
