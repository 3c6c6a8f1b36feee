"""The tables of docs/simulate.md from a folder's sweeps: python3 tables.py [FOLDER]
(this script's folder by default)."""
import json
import os
import sys

HERE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
NAMES = {"default": "Default", "mps": "MPS", "miso": "MISO", "miger": "MIGER", "mmk": "MMK",
         "first-fit": "First fit"}


def pct(v):
    if abs(v) < 0.05:
        return "0"
    return f"{v:+.1f} %".replace("-", "\u2212")


def spread(s):
    if max(abs(s["min"]), abs(s["max"]), abs(s["mean"])) < 0.05:
        return "0"
    lo, hi = (pct(s[k]).replace(" %", "") for k in ("min", "max"))
    return f"{pct(s['mean'])} ({lo}..{hi} %)"


def miss(v):
    if v < 0.005:
        return "0"
    return f"{v:.2f} %" if v < 1 else f"{v:.1f} %"


def sweep(name):
    d = json.load(open(os.path.join(HERE, name)))
    print(f"\n{name}\n")
    print("| interval | policy | avg JCT | JCT | makespan | STP | SLO miss |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in d["rows"]:
        print(f"| {r['interval_s']:.0f} s | {NAMES[r['policy']]} | {r['avg_jct_s']['mean']:,.0f} s | "
              f"{spread(r['jct_vs_miger_pct'])} | {spread(r['makespan_vs_miger_pct'])} | "
              f"{spread(r['stp_vs_miger_pct'])} | {miss(r['slo_miss_pct']['mean'])} |")
    return d


def effect(on, off, truth):
    rows = lambda d: {(r["interval_s"], r["policy"]): r for r in d["rows"]}
    a, b = rows(on), rows(off)
    for (i, p), r in sorted(b.items()):
        if p != "mmk":
            continue
        o = a[(i, p)]
        print(f"| {truth} | {i:.0f} s | {pct(r['jct_vs_miger_pct']['mean'])} \u2192 "
              f"{pct(o['jct_vs_miger_pct']['mean'])} | {miss(r['slo_miss_pct']['mean'])} \u2192 "
              f"{miss(o['slo_miss_pct']['mean'])} | {r['mixed_pct']['mean']:.1f} % \u2192 "
              f"{o['mixed_pct']['mean']:.1f} % |")
    print("MIGER mixed:", " / ".join(f"{r['mixed_pct']['mean']:.1f}" for (i, p), r in
                                     sorted(a.items()) if p == "miger"))


m = sweep("sweep-measured.json")
an = sweep("sweep-analytic.json")
print("\n| truth | interval | JCT vs MIGER, off \u2192 on | SLO miss, off \u2192 on | MIXED, off \u2192 on |")
print("| --- | --- | --- | --- | --- |")
effect(m, json.load(open(os.path.join(HERE, "sweep-measured-ksoff.json"))), "measured")
effect(an, json.load(open(os.path.join(HERE, "sweep-analytic-ksoff.json"))), "analytic")
# Small scale, and plain MPS and first fit on the paper's setup, where a folder has them.
for name in ("sweep-small.json", "sweep-first-fit.json", "sweep-small-first-fit.json"):
    if os.path.exists(os.path.join(HERE, name)):
        sweep(name)
