//! Planning latency: `cargo bench -p mmk-partitioner --bench plan`.
//!
//! For 1 and 8 GPUs (H100-80GB, MIG on) and 10, 50 and 200 jobs of the paper's Table III
//! mix (two thirds online with an SLO of three times their solo latency, one third
//! offline), two situations:
//! - `arrival`: the jobs are admitted one by one, each plan applied, by one planner, as
//!   mmkd does (its memo warms up over the admissions as it would in mmkd); every
//!   admission is timed, over several such sequences with a new planner each;
//! - `cold`: every job waits on an empty node (a restart with a full queue), each run by a
//!   new planner (nothing remembered).
//!
//! A new planner first plans one job on another node, so that the layout enumeration it
//! does once in its life is not timed. It prints p50, p99 and max of `Planner::plan` per
//! planner, in microseconds, and how many jobs were placed in the end.

use std::sync::Arc;
use std::time::Instant;

use mmk_partitioner::plan::apply;
use mmk_partitioner::{AnalyticModel, JobDemand, NodeState, PerfModel, Planner, mix, planner};

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

/// A new planner, with its layouts enumerated.
fn fresh(name: &str, model: &Arc<dyn PerfModel>) -> Box<dyn Planner> {
    let p = planner(name, model.clone()).expect("planner");
    std::hint::black_box(p.plan(&node(1), &jobs(1)));
    p
}

fn timed(p: &dyn Planner, node: &NodeState, jobs: &[JobDemand], us: &mut Vec<f64>) -> usize {
    let t = Instant::now();
    let plan = p.plan(node, jobs);
    us.push(t.elapsed().as_secs_f64() * 1e6);
    plan.placements.len()
}

fn main() {
    let model: Arc<dyn PerfModel> = Arc::new(AnalyticModel::default());
    println!(
        "{:<10} {:>4} {:>5} {:<8} {:>10} {:>10} {:>10} {:>7}",
        "planner", "gpus", "jobs", "case", "p50 us", "p99 us", "max us", "placed"
    );
    for name in ["mmk", "miger", "miso", "first-fit"] {
        for gpus in [1u32, 8] {
            for n in [10usize, 50, 200] {
                let all = jobs(n);
                let mut us = Vec::new();
                let mut placed = 0;
                for _ in 0..(1000 / n).max(5) {
                    let p = fresh(name, &model);
                    let (mut nd, mut js) = (node(gpus), Vec::new());
                    for j in &all {
                        js.push(j.clone());
                        let t = Instant::now();
                        let plan = p.plan(&nd, &js);
                        us.push(t.elapsed().as_secs_f64() * 1e6);
                        (nd, js) = apply(&nd, &js, &plan);
                    }
                    placed = js.iter().filter(|j| j.placed.is_some()).count();
                }
                let (p50, p99, max) = percentiles(us);
                println!(
                    "{name:<10} {gpus:>4} {n:>5} {:<8} {p50:>10.1} {p99:>10.1} {max:>10.1} {placed:>7}",
                    "arrival"
                );
                let cold = node(gpus);
                let mut us = Vec::new();
                let mut placed = 0;
                for _ in 0..if n >= 200 { 20 } else { 100 } {
                    let p = fresh(name, &model);
                    placed = timed(p.as_ref(), &cold, &all, &mut us);
                }
                let (p50, p99, max) = percentiles(us);
                println!(
                    "{name:<10} {gpus:>4} {n:>5} {:<8} {p50:>10.1} {p99:>10.1} {max:>10.1} {placed:>7}",
                    "cold"
                );
            }
        }
    }
}
