"""MMK against the best baseline (Default, MISO, MIGER) in every cell of the grid that
run.sh makes: per GPU model, online share, checkpointable share and interval, the means
over seeds of online JCT, offline JCT, the offline p95 slowdown, makespan, STP and SLO miss.
A cell's figure is MMK's relative distance from the best baseline's (JCT, slowdown,
makespan: MMK / best - 1; STP: best / MMK - 1; SLO miss: MMK's minus the best's, in
points); above 1 % (1 point) is behind, in bold.

Usage: python3 grid.py [DIR]   (prints the markdown table, the cells behind per figure,
and the same counts per online share and per rate)
"""
import glob
import json
import os
import re
import statistics as st
import sys

d = sys.argv[1] if len(sys.argv) > 1 else "."
FIG = [("online JCT", "online_avg_jct_s", min), ("offline JCT", "offline_avg_jct_s", min),
       ("offline p95", "offline_p95_slowdown", min), ("makespan", "makespan_s", min),
       ("STP", "stp", max), ("SLO miss", "slo_miss_pct", min)]
NAME = re.compile(r"(.+)-o(\d+)-c([\d.]+)\.json$")
rows, total = [], 0
behind = {f[0]: 0 for f in FIG}
by_share, by_rate = {}, {}


def key(path):
    m = NAME.match(os.path.basename(path))
    return m.group(1), int(m.group(2)), float(m.group(3))


for path in sorted(glob.glob(os.path.join(d, "*-o*-c*.json")), key=key):
    model, share, c = key(path)
    by = {}
    for r in json.load(open(path))["runs"]:
        for p in r["policies"]:
            by.setdefault((r["interval_s"], p["policy"]), []).append(p)
    for iv in sorted({k[0] for k in by}):
        cells = []
        total += 1
        for label, k, best in FIG:
            mean = {pol: st.mean(p[k] for p in by[(iv, pol)]) for pol in ("default", "miso", "miger", "mmk")}
            b = best(mean[pol] for pol in ("default", "miso", "miger"))
            m = mean["mmk"]
            if label == "SLO miss":
                gap, unit = m - b, ""
            elif b == 0 or m == 0:
                gap, unit = 0.0, " %"
            else:
                gap = (m / b - 1) * 100 if best is min else (b / m - 1) * 100
                unit = " %"
            bad = gap > 1.0
            cells.append(f"{'**' if bad else ''}{gap:+.1f}{unit}{'**' if bad else ''}")
            behind[label] += bad
            for tally, k2 in ((by_share, share), (by_rate, iv)):
                t = tally.setdefault(k2, {"cells": 0, **{f[0]: 0 for f in FIG}})
                t[label] += bad
        by_share[share]["cells"] += 1
        by_rate[iv]["cells"] += 1
        rows.append(f"| {model} | {share} % | {c:g} | {iv:g} s | " + " | ".join(cells) + " |")
print("| GPU | online | checkpointable | interval | " + " | ".join(f[0] for f in FIG) + " |")
print("| --- | --- | --- | --- | " + " | ".join("---" for _ in FIG) + " |")
print("\n".join(rows))
print()
print(f"cells: {total}; behind by more than 1 % (1 point for SLO miss): "
      + ", ".join(f"{k} {v}" for k, v in behind.items()))
print()
for title, tally, fmt in (("online share", by_share, "{} %"), ("interval", by_rate, "{:g} s")):
    print(f"| {title} | cells | " + " | ".join(f[0] for f in FIG) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in FIG) + " |")
    for k2 in sorted(tally):
        t = tally[k2]
        print(f"| {fmt.format(k2)} | {t['cells']} | " + " | ".join(str(t[f[0]]) for f in FIG) + " |")
    print()
