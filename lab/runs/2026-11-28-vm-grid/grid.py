"""MMK against the best baseline (Default, MISO, MIGER) in every cell of the grid that
run.sh makes: per GPU model, checkpointable share and interval, the means over seeds of
online JCT, offline JCT, makespan, STP and SLO miss. A cell's figure is MMK's relative
distance from the best baseline's (JCT, makespan: MMK / best - 1; STP: best / MMK - 1;
SLO miss: MMK's minus the best's, in points); above 1 % (1 point) is behind.

Usage: python3 grid.py [DIR]   (prints the markdown table and the count of cells behind)
"""
import glob
import json
import os
import statistics as st
import sys

d = sys.argv[1] if len(sys.argv) > 1 else "."
FIG = [("online JCT", "online_avg_jct_s", min), ("offline JCT", "offline_avg_jct_s", min),
       ("makespan", "makespan_s", min), ("STP", "stp", max), ("SLO miss", "slo_miss_pct", min)]
rows, behind, total = [], {f[0]: 0 for f in FIG}, 0
def order(path):
    model, c = os.path.basename(path)[:-5].rsplit("-c", 1)
    return model, float(c)


for path in sorted(glob.glob(os.path.join(d, "*-c*.json")), key=order):
    name = os.path.basename(path)[:-5]
    model, c = name.rsplit("-c", 1)
    rep = json.load(open(path))
    by = {}
    for r in rep["runs"]:
        for p in r["policies"]:
            by.setdefault((r["interval_s"], p["policy"]), []).append(p)
    for iv in sorted({k[0] for k in by}):
        cells = []
        total += 1
        for label, key, best in FIG:
            mean = {pol: st.mean(p[key] for p in by[(iv, pol)]) for pol in ("default", "miso", "miger", "mmk")}
            b = best(mean[pol] for pol in ("default", "miso", "miger"))
            m = mean["mmk"]
            if label == "SLO miss":
                gap = m - b
                bad = gap > 1.0
                cells.append(f"{'**' if bad else ''}{gap:+.1f}{'**' if bad else ''}")
            else:
                gap = (m / b - 1) * 100 if best is min else (b / m - 1) * 100
                bad = gap > 1.0
                cells.append(f"{'**' if bad else ''}{gap:+.1f} %{'**' if bad else ''}")
            behind[label] += bad
        rows.append(f"| {model} | {c} | {iv:g} s | " + " | ".join(cells) + " |")
print("| GPU | checkpointable | interval | " + " | ".join(f[0] for f in FIG) + " |")
print("| --- | --- | --- | " + " | ".join("---" for _ in FIG) + " |")
print("\n".join(rows))
print()
print(f"cells: {total}; behind by more than 1 % (1 point for SLO miss): "
      + ", ".join(f"{k} {v}" for k, v in behind.items()))
