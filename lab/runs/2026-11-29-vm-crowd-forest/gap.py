"""Each policy's average JCT and SLO miss against the reference schedules of a
`mmk-lab simulate --output json` sweep run with `--policies ...,reference` and/or
`reference-prompt`, per interval over the seeds: mean (lowest..highest), the searches'
exact runs, and MMK's gap to each reference per seed, sorted.

  python3 gap.py SWEEP.json
"""
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
policies = [p["policy"] for p in d["runs"][0]["policies"]]
refs = [p for p in policies if p.startswith("reference")]
print(f"{d['jobs_per_run']} jobs on {d['gpus']} x {d['gpu_model']}, seeds {d['seeds']}")


def by(r):
    return {p["policy"]: p for p in r["policies"]}


def spread(v):
    return f"{statistics.fmean(v):+.1f} % ({min(v):+.1f}..{max(v):+.1f})"


for interval in d["intervals_s"]:
    runs = [r for r in d["runs"] if r["interval_s"] == interval]
    print(f"\n### {interval:.0f} s\n")
    print("| policy | " + " | ".join(f"avg JCT vs {x}" for x in refs)
          + " | online time out of SLO | exact runs |")
    print("| --- | " + " | ".join("---" for _ in refs) + " | --- | --- |")
    for pol in policies:
        gaps = [spread([100 * (by(r)[pol]["avg_jct_s"] / by(r)[x]["avg_jct_s"] - 1)
                        for r in runs]) for x in refs]
        slo = statistics.fmean(by(r)[pol]["slo_miss_pct"] for r in runs)
        exact = sum(bool((by(r)[pol].get("search") or {}).get("exact")) for r in runs)
        ex = f"{exact} of {len(runs)}" if pol in refs else ""
        print(f"| {pol} | " + " | ".join(gaps) + f" | {slo:.1f} % | {ex} |")
    for x in refs:
        g = sorted(100 * (by(r)["mmk"]["avg_jct_s"] / by(r)[x]["avg_jct_s"] - 1) for r in runs)
        print(f"\nMMK against {x} per seed, sorted: " + ", ".join(f"{v:.1f}" for v in g))
