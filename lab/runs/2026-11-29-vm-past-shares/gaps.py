"""MMK's average JCT against the reference schedules, before and after this record's
rules, on the small traces: per interval, the mean gap over the seeds (lowest..highest)
and MMK's online time out of SLO. The reference rows are those of the earlier records
(the searches read only the trace and the ground truth), MMK's before from the build
before's record (or, given BEFORE, that record's `*-jobs-mmk.json`), MMK's after from the
folder it runs in.

  python3 gaps.py [BEFORE]   (run in this folder, it prints gaps.md)
"""
import json
import os
import statistics
import sys

RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..") + "/"
SETS = [
    ("5 jobs", "reference", RUNS + "2026-11-29-vm-crowd-forest/five-jobs-seeds-101-110.json",
     RUNS + "2026-11-29-vm-crowd-forest/five-jobs-seeds-101-110.json", "five-jobs-mmk.json"),
    ("6 jobs", "reference-prompt", RUNS + "2026-11-29-vm-exact/six-jobs-seeds-101-110.json",
     RUNS + "2026-11-29-vm-crowd-forest/six-jobs-planners-seeds-101-110.json", "six-jobs-mmk.json"),
    ("20 jobs", "reference-prompt", RUNS + "2026-11-29-vm-exact/twenty-jobs-seeds-61-70.json",
     RUNS + "2026-11-29-vm-crowd-forest/twenty-jobs-planners-seeds-61-70.json",
     "twenty-jobs-mmk.json"),
]


if len(sys.argv) > 1:
    SETS = [(name, ref, ref_path, os.path.join(sys.argv[1], after), after)
            for name, ref, ref_path, _, after in SETS]


def rows(path, policy):
    d = json.load(open(path))
    out = {}
    for r in d["runs"]:
        for p in r["policies"]:
            if p["policy"] == policy:
                out[(r["interval_s"], r["seed"])] = p
    return out


def spread(v):
    return f"{statistics.fmean(v):+.1f} % ({min(v):+.1f}..{max(v):+.1f})"


print("| jobs | interval | MMK vs the reference, before | after | out of SLO before / after |")
print("| --- | --- | --- | --- | --- |")
for name, ref, ref_path, before_path, after_path in SETS:
    R = rows(ref_path, ref)
    B = rows(before_path, "mmk")
    A = rows(after_path, "mmk")
    for interval in sorted({k[0] for k in R}):
        keys = sorted(k for k in R if k[0] == interval)
        gap = lambda X: [100 * (X[k]["avg_jct_s"] / R[k]["avg_jct_s"] - 1) for k in keys]
        slo = lambda X: statistics.fmean(X[k]["slo_miss_pct"] for k in keys)
        print(f"| {name} (`{ref}`) | {interval:.0f} s | {spread(gap(B))} | {spread(gap(A))} "
              f"| {slo(B):.1f} / {slo(A):.1f} % |")
