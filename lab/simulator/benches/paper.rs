//! The paper's simulation setup on this machine: 800 online + 400 offline jobs, Poisson
//! arrivals (mean 40 s, the paper's λ), 8 A100-80GB GPUs, every policy; wall time per
//! policy and the summary. The planners' model is a random forest trained on rows
//! generated from the ground-truth model with another seed than the one judged here.
//! `cargo bench -p mmk-simulator`.

use std::sync::Arc;
use std::time::Instant;

use mmk_partitioner::{AnalyticModel, PerfModel, planner};
use mmk_predictor::{Predictor, TrainOptions, groundtruth};
use mmk_simulator::report::change_pct;
use mmk_simulator::{SimConfig, Summary, TraceSpec, simulate, trace};

fn main() {
    let rows = groundtruth::generate(1400, 99);
    let model: Arc<dyn PerfModel> = match Predictor::train(&rows, &TrainOptions::standard(99)) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            eprintln!("training failed: {e}");
            std::process::exit(1);
        }
    };
    let truth = AnalyticModel::default();
    let cfg = SimConfig::new("a100-80gb", 8);
    let interval: f64 = std::env::var("MMK_SIM_INTERVAL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40.0);
    let t = trace::generate(TraceSpec {
        online: 800,
        offline: 400,
        mean_interval_s: interval,
        seed: 1,
        checkpointable: 1.0,
        durations: mmk_simulator::trace::Durations::Uniform,
        burst: 1.0,
    });
    let mut sums = Vec::new();
    for name in ["default", "mps", "miso", "miger", "mmk"] {
        let p = planner(name, model.clone()).expect("planner");
        let started = Instant::now();
        match simulate(&t, &cfg, p.as_ref(), &truth, &mut |_, _| {}) {
            Ok(r) => {
                let s = Summary::of(&r);
                println!(
                    "{name:<8} wall {:>6.2} s  plans {:>5}  avg JCT {:>8.0} s  p99 {:>8.0} s  makespan {:>8.0} s  STP {:>5.2}  reconfig {:>5}  moves {:>4}",
                    started.elapsed().as_secs_f64(),
                    r.plans,
                    s.avg_jct_s,
                    s.p99_jct_s,
                    s.makespan_s,
                    s.stp,
                    s.reconfigurations,
                    s.moves
                );
                sums.push(s);
            }
            Err(e) => println!("{name:<8} failed: {e}"),
        }
    }
    if let (Some(mmk), Some(miger)) = (
        sums.iter().find(|s| s.policy == "mmk"),
        sums.iter().find(|s| s.policy == "miger"),
    ) {
        println!(
            "mmk vs miger: JCT {:+.1} %, makespan {:+.1} %, STP {:+.1} % (paper: -41.18 %, -36.36 %, +31.11 %)",
            change_pct(mmk.avg_jct_s, miger.avg_jct_s),
            change_pct(mmk.makespan_s, miger.makespan_s),
            change_pct(mmk.stp, miger.stp)
        );
    }
}
