"""The grid of the folder it runs in beside the build before's (../2026-11-29-vm-crowd-forest,
or BEFORE; the same script and seeds): per figure, the cells (of those in both) where MMK
is behind the best of Default, MISO and MIGER by more than 1 % (1 point for SLO miss)
before and after, and per interval. A cell's distance is grid.py's.

  python3 compare.py [BEFORE]   (run in this folder, it prints compare.md)
"""
import glob
import json
import os
import statistics as st
import sys

BEFORE = sys.argv[1] if len(sys.argv) > 1 else "../2026-11-29-vm-crowd-forest"
FIG = [("online JCT", "online_avg_jct_s", min), ("offline JCT", "offline_avg_jct_s", min),
       ("offline p95", "offline_p95_slowdown", min), ("makespan", "makespan_s", min),
       ("STP", "stp", max), ("SLO miss", "slo_miss_pct", min)]


def cells(path):
    by = {}
    for r in json.load(open(path))["runs"]:
        for p in r["policies"]:
            by.setdefault((r["interval_s"], p["policy"]), []).append(p)
    return by


def gap(by, iv, k, best, label):
    mean = {pol: st.mean(p[k] for p in by[(iv, pol)]) for pol in ("default", "miso", "miger", "mmk")}
    b = best(mean[pol] for pol in ("default", "miso", "miger"))
    m = mean["mmk"]
    if label == "SLO miss":
        return m - b
    if b == 0 or m == 0:
        return 0.0
    return (m / b - 1) * 100 if best is min else (b / m - 1) * 100


count = {}
n = {}
for path in sorted(glob.glob("*-o*-c*.json")):
    after, before = cells(path), cells(os.path.join(BEFORE, path))
    for iv in sorted({k[0] for k in after}):
        for row in (iv, "all"):
            n[row] = n.get(row, 0) + 1
        for label, k, best in FIG:
            for which, by in (("before", before), ("after", after)):
                bad = gap(by, iv, k, best, label) > 1.0
                for row in (iv, "all"):
                    count[(row, label, which)] = count.get((row, label, which), 0) + bad
print("| interval | cells | " + " | ".join(f[0] for f in FIG) + " |")
print("| --- | --- | " + " | ".join("---" for _ in FIG) + " |")
for row in sorted(k for k in n if k != "all") + ["all"]:
    name = f"{row:g} s" if row != "all" else "all"
    print(f"| {name} | {n[row]} | " + " | ".join(
        f"{count[(row, f[0], 'before')]} → {count[(row, f[0], 'after')]}" for f in FIG) + " |")
