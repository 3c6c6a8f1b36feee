//! What a run comes to: average, median and tail JCT, makespan, system throughput, the
//! online jobs' time out of SLO, and the relative-JCT distribution (JCT over the job's solo time, the paper's Fig. 7).

use std::fmt::Write as _;

use serde::Serialize;

use mmk_core::stats::quantile;

use crate::engine::RunResult;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub policy: String,
    pub jobs: usize,
    pub avg_jct_s: f64,
    pub p50_jct_s: f64,
    pub p99_jct_s: f64,
    /// Last finish minus first arrival.
    pub makespan_s: f64,
    /// System throughput: the summed normalized performance (speed over speed alone on a
    /// whole GPU) of the jobs a GPU runs, averaged over the time GPUs run jobs. One job
    /// alone on a whole GPU is 1; two that share one at 0.6 each, 1.2.
    pub stp: f64,
    /// Of the time online jobs were in the system (arrival to finish), the share in which
    /// they missed their latency SLO (percent): waiting, starting or down, or running too
    /// slowly; none when there was no online job with an SLO.
    pub slo_miss_pct: Option<f64>,
    /// Of the time jobs ran, the share beside a job of the other class in the same
    /// partition (percent): where a kernel scheduler acts.
    pub mixed_pct: f64,
    pub reconfigurations: u64,
    pub moves: u64,
    /// Average JCT of each class apart (seconds); none without jobs of the class.
    pub online_avg_jct_s: Option<f64>,
    pub offline_avg_jct_s: Option<f64>,
    /// The 95th percentile of the offline jobs' JCT over their solo time.
    pub offline_p95_slowdown: Option<f64>,
    /// The share of jobs (percent) whose JCT was more than 10 times their solo time.
    pub slowed_10x_pct: f64,
}

impl Summary {
    pub fn of(r: &RunResult) -> Summary {
        let mut jct: Vec<f64> = r.jobs.iter().map(|j| j.jct_s()).collect();
        jct.sort_by(f64::total_cmp);
        let first = r
            .jobs
            .iter()
            .map(|j| j.arrival_s)
            .fold(f64::INFINITY, f64::min);
        let last = r.jobs.iter().map(|j| j.finish_s).fold(0.0, f64::max);
        let makespan = if r.jobs.is_empty() { 0.0 } else { last - first };
        Summary {
            policy: r.policy.clone(),
            jobs: r.jobs.len(),
            avg_jct_s: jct.iter().sum::<f64>() / jct.len().max(1) as f64,
            p50_jct_s: quantile(&jct, 0.5),
            p99_jct_s: quantile(&jct, 0.99),
            makespan_s: makespan,
            stp: if r.gpu_busy_s > 0.0 {
                r.stp_integral / r.gpu_busy_s
            } else {
                0.0
            },
            slo_miss_pct: (r.online_run_s > 0.0).then(|| 100.0 * r.slo_miss_s / r.online_run_s),
            mixed_pct: if r.job_run_s > 0.0 {
                100.0 * r.mixed_run_s / r.job_run_s
            } else {
                0.0
            },
            reconfigurations: r.reconfigurations,
            moves: r.moves,
            online_avg_jct_s: class_avg_jct(r, true),
            offline_avg_jct_s: class_avg_jct(r, false),
            offline_p95_slowdown: {
                let mut s: Vec<f64> = r
                    .jobs
                    .iter()
                    .filter(|j| !j.online)
                    .map(|j| j.jct_s() / j.solo_s)
                    .collect();
                s.sort_by(f64::total_cmp);
                (!s.is_empty()).then(|| quantile(&s, 0.95))
            },
            slowed_10x_pct: if r.jobs.is_empty() {
                0.0
            } else {
                100.0
                    * r.jobs
                        .iter()
                        .filter(|j| j.jct_s() > 10.0 * j.solo_s)
                        .count() as f64
                    / r.jobs.len() as f64
            },
        }
    }
}

/// The average JCT of the online (or the offline) jobs of a run.
fn class_avg_jct(r: &RunResult, online: bool) -> Option<f64> {
    let jct: Vec<f64> = r
        .jobs
        .iter()
        .filter(|j| j.online == online)
        .map(|j| j.jct_s())
        .collect();
    (!jct.is_empty()).then(|| jct.iter().sum::<f64>() / jct.len() as f64)
}

/// Each job's JCT over its solo time, sorted (the CDF's x values).
pub fn relative_jct(r: &RunResult) -> Vec<f64> {
    let mut v: Vec<f64> = r.jobs.iter().map(|j| j.jct_s() / j.solo_s).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// `(new - base) / base` in percent.
pub fn change_pct(new: f64, base: f64) -> f64 {
    if base == 0.0 {
        0.0
    } else {
        100.0 * (new - base) / base
    }
}

/// The relative-JCT CDF of each run as an SVG line chart (x: JCT / solo time, log scale).
pub fn cdf_svg(runs: &[&RunResult]) -> String {
    const W: f64 = 640.0;
    const H: f64 = 400.0;
    const L: f64 = 60.0;
    const B: f64 = 50.0;
    const COLORS: [&str; 6] = [
        "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    ];
    let all: Vec<Vec<f64>> = runs.iter().map(|r| relative_jct(r)).collect();
    let max = all
        .iter()
        .flat_map(|v| v.last().copied())
        .fold(2.0_f64, f64::max);
    let (lo, hi) = (0.0_f64, max.log10().ceil().max(1.0));
    let x = |v: f64| L + (v.max(1.0).log10() - lo) / (hi - lo) * (W - L - 20.0);
    let y = |p: f64| H - B - p * (H - B - 20.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<line x1="{L}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{L}" y1="20" x2="{L}" y2="{}" stroke="black"/>"#,
        H - B,
        W - 20.0,
        H - B,
        H - B
    );
    let mut d = 0.0;
    while d <= hi + 1e-9 {
        let v = 10f64.powf(d);
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            x(v),
            H - B + 16.0,
            v
        );
        d += 1.0;
    }
    for p in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{p}</text>"#,
            L - 6.0,
            y(p) + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">relative JCT (JCT / solo time, log scale)</text>"#,
        (W + L) / 2.0,
        H - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">CDF of jobs</text>"#,
        H / 2.0,
        H / 2.0
    );
    for (k, (r, v)) in runs.iter().zip(&all).enumerate() {
        let color = COLORS[k % COLORS.len()];
        let n = v.len().max(1) as f64;
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, rel)| format!("{:.1},{:.1}", x(*rel), y((i + 1) as f64 / n)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = 30.0 + 16.0 * k as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            W - 150.0,
            W - 130.0,
            W - 125.0,
            ly + 4.0,
            r.policy
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One CSV row per job of each run: when it arrived, started and finished, its JCT, its
/// time alone on a whole GPU, its wait before it first ran, and its JCT over its solo
/// time.
pub fn jobs_csv(runs: &[&RunResult]) -> String {
    let mut s = String::from(
        "policy,id,workload,class,arrival_s,start_s,finish_s,jct_s,solo_s,wait_s,relative_jct,moves\n",
    );
    for r in runs {
        for j in &r.jobs {
            let _ = writeln!(
                s,
                "{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.4},{}",
                r.policy,
                j.id,
                j.workload,
                if j.online { "online" } else { "offline" },
                j.arrival_s,
                j.start_s,
                j.finish_s,
                j.jct_s(),
                j.solo_s,
                j.start_s - j.arrival_s,
                j.jct_s() / j.solo_s,
                j.moves
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::JobOutcome;

    #[test]
    fn a_jobs_row_has_its_times_and_its_wait() {
        let r = RunResult {
            jobs: vec![JobOutcome {
                id: 3,
                workload: "bert-train",
                online: false,
                arrival_s: 10.0,
                start_s: 25.0,
                finish_s: 110.0,
                solo_s: 50.0,
                moves: 2,
            }],
            plans: 1,
            ..RunResult::empty("mmk")
        };
        let csv = jobs_csv(&[&r]);
        let mut lines = csv.lines();
        assert!(lines.next().is_some_and(|h| h.starts_with("policy,id,")));
        assert_eq!(
            lines.next(),
            Some("mmk,3,bert-train,offline,10.000,25.000,110.000,100.000,50.000,15.000,2.0000,2")
        );
        assert_eq!(lines.next(), None);
    }
}
