//! How planning time grows with the node and the queue: `cargo bench -p mmk-partitioner
//! --bench growth`.
//!
//! MMK on 8, 32 and 128 H100-80GB GPUs (MIG on), the paper's Table III mix (as in the
//! `plan` bench), the analytic model, with 10, 100 and 1,000 jobs queued:
//! - `cold`: every job waiting on an empty node, planned by a new planner (a restart with
//!   a full queue);
//! - `full`: the node already full (a first plan of the mix placed and applied, by the same
//!   planner), and that many jobs more waiting: one planning pass of a busy node with a
//!   queue, what every arrival and completion costs while the queue lasts. Timed three
//!   times (the memo is warm after the first); the median is printed.
//!
//! It prints milliseconds per plan, and how many jobs were placed.

use std::sync::Arc;
use std::time::Instant;

use mmk_partitioner::plan::apply;
use mmk_partitioner::{AnalyticModel, JobDemand, NodeState, PerfModel, Planner, mix, planner};

fn node(gpus: u32) -> NodeState {
    mix::empty_node("h100-80gb", gpus).expect("h100-80gb is in the catalog")
}

/// `n` jobs of the mix with ids after `after`.
fn jobs(n: usize, after: u64) -> Vec<JobDemand> {
    mix::table_iii_mix(n)
        .into_iter()
        .map(|mut j| {
            j.id += after;
            j
        })
        .collect()
}

fn ms(p: &dyn Planner, node: &NodeState, jobs: &[JobDemand]) -> (f64, usize) {
    let t = Instant::now();
    let plan = p.plan(node, jobs);
    let took = t.elapsed().as_secs_f64() * 1e3;
    (took, plan.placements.len())
}

fn main() {
    let model: Arc<dyn PerfModel> = Arc::new(AnalyticModel::default());
    let fresh = || planner("mmk", model.clone()).expect("mmk");
    println!(
        "{:>4} {:>6} {:<5} {:>10} {:>7}",
        "gpus", "queued", "case", "ms", "placed"
    );
    for gpus in [8u32, 32, 128] {
        for queued in [10usize, 100, 1000] {
            let (took, placed) = ms(fresh().as_ref(), &node(gpus), &jobs(queued, 0));
            println!(
                "{gpus:>4} {queued:>6} {:<5} {took:>10.1} {placed:>7}",
                "cold"
            );

            // Fill the node: enough of the mix that some of it waits.
            let p = fresh();
            let first = jobs(gpus as usize * 8, 0);
            let plan = p.plan(&node(gpus), &first);
            let (full, mut js) = apply(&node(gpus), &first, &plan);
            js.retain(|j| j.placed.is_some());
            let running = js.len();
            js.extend(jobs(queued, 1_000_000));
            let mut runs: Vec<(f64, usize)> = (0..3).map(|_| ms(p.as_ref(), &full, &js)).collect();
            runs.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (took, placed) = runs[1];
            println!(
                "{gpus:>4} {queued:>6} {:<5} {took:>10.1} {placed:>7}   ({running} running)",
                "full"
            );
        }
    }
}
