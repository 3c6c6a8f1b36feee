//! Predictor figures (docs/predictor.md): training on 1,400 generated rows with the
//! standard search, model file size and load time, and the latency of one prediction.
//!
//! `cargo bench -p mmk-predictor` (release build).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mmk_core::JobClass;
use mmk_partitioner::plan::apply;
use mmk_partitioner::{
    AnalyticModel, CoRunner, JobProfile, PartitionShape, PerfModel, mix, planner,
};
use mmk_predictor::{Predictor, TrainOptions, eval, groundtruth};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let data = groundtruth::generate(1400, 1);
    let t = Instant::now();
    let model = match Predictor::train(&data, &TrainOptions::standard(1)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("training failed: {e}");
            std::process::exit(1);
        }
    };
    let train = t.elapsed();
    println!(
        "train 1400 rows (standard search, {} candidates x 3 folds + final): {:.2} s",
        model.cv.len(),
        train.as_secs_f64()
    );
    println!("chosen: {}", model.params);

    let dir = std::env::temp_dir().join(format!("mmk-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("model.mmk");
    if let Err(e) = model.save(&path) {
        eprintln!("save failed: {e}");
        std::process::exit(1);
    }
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let mut loads = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let m = Predictor::load(&path);
        loads.push(t.elapsed());
        assert!(m.is_ok());
    }
    loads.sort();
    println!(
        "model file: {} KiB; load p50 {:.1} ms, max {:.1} ms",
        size / 1024,
        pct(&loads, 0.5).as_secs_f64() * 1e3,
        loads[loads.len() - 1].as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(&dir);

    let shape = PartitionShape {
        sm_count: 42,
        gpu_sm_count: 98,
        memory_slices: 4,
        gpu_memory_slices: 8,
    };
    let job = JobProfile {
        class: JobClass::Online,
        sm_demand: 0.4,
        bw_demand: 0.35,
        solo_latency_ms: Some(6.0),
    };
    let co = [CoRunner {
        profile: JobProfile {
            class: JobClass::Offline,
            sm_demand: 0.8,
            bw_demand: 0.55,
            solo_latency_ms: None,
        },
        mps_share: 50,
    }];
    let mut lat = Vec::with_capacity(20_000);
    let mut sink = 0.0;
    for i in 0..20_000u32 {
        let share = 10 + (i % 5) as u8 * 10;
        // Distinct questions (the memo would answer repeats): the forest's own cost.
        let job = JobProfile {
            sm_demand: 0.2 + f64::from(i) * 1e-5,
            ..job
        };
        let t = Instant::now();
        sink += model.estimate(&job, &shape, share, &co);
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "one prediction (PerfModel::estimate, 20000 calls): p50 {:.1} us, p99 {:.1} us (sum {sink:.1})",
        pct(&lat, 0.5).as_secs_f64() * 1e6,
        pct(&lat, 0.99).as_secs_f64() * 1e6
    );

    match model.try_clone() {
        Ok(copy) => admission(Arc::new(copy), "random forest", false),
        Err(e) => eprintln!("cannot copy the model: {e}"),
    }
    admission(Arc::new(AnalyticModel::default()), "analytic", false);
    match mmk_predictor::shipped::load() {
        Ok(m) => {
            let m: Arc<dyn PerfModel> = Arc::new(m);
            admission(Arc::clone(&m), "built-in (mmkd's default)", false);
            admission(
                m,
                "built-in (mmkd's default), every job with the prior",
                true,
            );
        }
        Err(e) => eprintln!("the built-in model: {e}"),
    }

    let t = Instant::now();
    match eval::compare(&data, model.params, 1) {
        Ok(scores) => {
            println!(
                "held-out 20 % of the same 1400 rows ({:.1} s):",
                t.elapsed().as_secs_f64()
            );
            for s in scores {
                println!(
                    "  {:<28} abs {:.4}  rel {:.2} %",
                    s.model, s.overall.abs_error, s.overall.rel_error_pct
                );
            }
        }
        Err(e) => eprintln!("evaluation failed: {e}"),
    }
}

/// The MMK planner's latency at one admission on 8 H100s with 49 jobs placed (one by one)
/// and a 50th arriving, with `model` as its performance model; `prior`: the jobs carry the
/// prior (nobody profiled them) instead of their Table III profiles.
fn admission(model: Arc<dyn PerfModel>, label: &str, prior: bool) {
    let p = planner("mmk", model).expect("the mmk planner");
    let node = mix::empty_node("h100-80gb", 8).expect("h100-80gb is in the catalog");
    let mut all = mix::table_iii_mix(50);
    if prior {
        for j in &mut all {
            j.profile = JobProfile::prior(j.class);
        }
    }
    let (mut nd, mut js) = (node, Vec::new());
    for j in &all[..49] {
        js.push(j.clone());
        let plan = p.plan(&nd, &js);
        (nd, js) = apply(&nd, &js, &plan);
    }
    js.push(all[49].clone());
    // The first plan with the newcomer asks questions never asked before.
    let t = Instant::now();
    std::hint::black_box(p.plan(&nd, &js));
    let first = t.elapsed();
    let mut lat: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(p.plan(&nd, &js));
            t.elapsed()
        })
        .collect();
    lat.sort();
    println!(
        "mmk admission, 8 GPUs / 50 jobs, {label} model: first {:.2} ms, then p50 {:.2} ms, p99 {:.2} ms",
        first.as_secs_f64() * 1e3,
        pct(&lat, 0.5).as_secs_f64() * 1e3,
        pct(&lat, 0.99).as_secs_f64() * 1e3
    );
}
