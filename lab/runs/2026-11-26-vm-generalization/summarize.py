"""MMK against each baseline per case and arrival rate: python3 summarize.py [CASE...]
(RUNS_DIR=DIR: the sweeps in DIR instead of this folder.)
Mean over the seeds of average JCT, makespan and STP, MMK's difference against Default,
MISO and MIGER (negative JCT and makespan, positive STP: MMK ahead), and the SLO misses.
A cell marked * is a loss of more than 0.5 %."""
import json
import os
import sys
from collections import defaultdict

# The sweeps' folder: this one, or RUNS_DIR (another record's sweeps, made with run.sh).
HERE = os.environ.get("RUNS_DIR") or os.path.dirname(os.path.abspath(__file__))
ALL_CASES = ["h100", "h200", "a100-40gb", "a30", "online10", "online50", "online90",
             "gpus32", "gpus128"]
BASE = ["default", "miso", "miger"]


def means(d):
    acc = defaultdict(lambda: defaultdict(list))
    for run in d["runs"]:
        for p in run["policies"]:
            for k in ("avg_jct_s", "makespan_s", "stp", "slo_miss_pct"):
                acc[(run["interval_s"], p["policy"])][k].append(p[k])
    return {key: {k: sum(v) / len(v) for k, v in m.items()} for key, m in acc.items()}


def runs(cases):
    """(case, its sweep, its means) for each case whose CASE.json is here."""
    for case in cases:
        path = os.path.join(HERE, f"{case}.json")
        if os.path.exists(path):
            d = json.load(open(path))
            yield case, d, means(d)


def cell(mmk, other, key):
    d = (mmk - other) / other * 100
    loss = d > 0.5 if key != "stp" else d < -0.5
    return f"{d:+.1f}{'*' if loss else ''}", loss


def main():
    losses = 0
    for case, d, m in runs(sys.argv[1:] or ALL_CASES):
        print(f"\n{case}: {d['gpus']} x {d['gpu_model']}, {d['jobs_per_run']} jobs, seeds {d['seeds']}")
        print("interval | MMK JCT | vs Default / MISO / MIGER: JCT % | makespan % | STP % | SLO miss MMK / Def / MISO / MIGER / MPS")
        for (interval, policy) in sorted(k for k in m if k[1] == "mmk"):
            mm = m[(interval, "mmk")]
            cols = []
            for key in ("avg_jct_s", "makespan_s", "stp"):
                cs = []
                for b in BASE:
                    if (interval, b) not in m:
                        cs.append("-")
                        continue
                    c, loss = cell(mm[key], m[(interval, b)][key], key)
                    losses += loss
                    cs.append(c)
                cols.append(" / ".join(cs))
            slo = " / ".join(f"{m[(interval, p)]['slo_miss_pct']:.1f}" for p in
                             ["mmk"] + BASE + ["mps"] if (interval, p) in m)
            print(f"{interval:g} s | {mm['avg_jct_s']:,.0f} s | {cols[0]} | {cols[1]} | {cols[2]} | {slo}")
    print(f"\nlosses over 0.5 %: {losses}")


if __name__ == "__main__":
    main()
