//! Planning latency: `cargo bench -p mmk-partitioner --bench plan`.
//!
//! For 1 and 8 GPUs (H100-80GB, MIG on) and 10, 50 and 200 jobs of the paper's Table III
//! mix (two thirds online with an SLO of three times their solo latency, one third
//! offline), two situations:
//! - `arrival`: all jobs but one were admitted one by one (each plan applied), and the
//!   last one arrives: what mmkd does at each admission;
//! - `cold`: every job waits on an empty node (a restart with a full queue).
//!
//! It prints p50, p99 and max of `Planner::plan` per planner, in microseconds.

use std::sync::Arc;
use std::time::Instant;

use mmk_partitioner::plan::apply;
use mmk_partitioner::{AnalyticModel, JobDemand, NodeState, Planner, mix, planner};

fn node(gpus: u32) -> NodeState {
    mix::empty_node("h100-80gb", gpus).expect("h100-80gb is in the catalog")
}

fn jobs(n: usize) -> Vec<JobDemand> {
    mix::table_iii_mix(n)
}

fn percentiles(mut us: Vec<f64>) -> (f64, f64, f64) {
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99), us[us.len() - 1])
}

fn time(p: &dyn Planner, node: &NodeState, jobs: &[JobDemand], runs: usize) -> (f64, f64, f64) {
    let mut us = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let plan = p.plan(node, jobs);
        us.push(t.elapsed().as_secs_f64() * 1e6);
        std::hint::black_box(plan);
    }
    percentiles(us)
}

fn main() {
    let model = Arc::new(AnalyticModel::default());
    println!(
        "{:<10} {:>4} {:>5} {:<8} {:>10} {:>10} {:>10} {:>7}",
        "planner", "gpus", "jobs", "case", "p50 us", "p99 us", "max us", "placed"
    );
    for name in ["mmk", "miger", "miso", "first-fit"] {
        let p = planner(name, model.clone()).expect("planner");
        for gpus in [1u32, 8] {
            for n in [10usize, 50, 200] {
                let all = jobs(n);
                // Admit one by one.
                let (mut nd, mut js) = (node(gpus), Vec::new());
                for j in &all[..n - 1] {
                    js.push(j.clone());
                    let plan = p.plan(&nd, &js);
                    (nd, js) = apply(&nd, &js, &plan);
                }
                js.push(all[n - 1].clone());
                let placed = js.iter().filter(|j| j.placed.is_some()).count();
                let runs = if n >= 200 { 200 } else { 1000 };
                let (p50, p99, max) = time(p.as_ref(), &nd, &js, runs);
                println!(
                    "{name:<10} {gpus:>4} {n:>5} {:<8} {p50:>10.1} {p99:>10.1} {max:>10.1} {placed:>7}",
                    "arrival"
                );
                let cold = node(gpus);
                let runs = if n >= 200 { 50 } else { 200 };
                let (p50, p99, max) = time(p.as_ref(), &cold, &all, runs);
                let placed = p.plan(&cold, &all).placements.len();
                println!(
                    "{name:<10} {gpus:>4} {n:>5} {:<8} {p50:>10.1} {p99:>10.1} {max:>10.1} {placed:>7}",
                    "cold"
                );
            }
        }
    }
}
