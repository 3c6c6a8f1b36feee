"""The light-load frontier: MMK's mean average JCT against Default's (the best JCT) and its
mean STP against MIGER's (the best STP) over the five seeds, per packing threshold.

  python3 table.py   (reads delta-*.json here)
"""
import glob
import json
import re
import statistics

rows = []
for path in glob.glob("delta-*.json"):
    name = re.fullmatch(r"delta-(.*)\.json", path).group(1)
    jct, stp, mk, mixed = [], [], [], []
    for run in json.load(open(path))["runs"]:
        p = {x["policy"]: x for x in run["policies"]}
        m = p["mmk"]
        jct.append(100 * (m["avg_jct_s"] / min(p[b]["avg_jct_s"] for b in ("default", "miger")) - 1))
        stp.append(100 * (m["stp"] / max(p[b]["stp"] for b in ("default", "miger")) - 1))
        mk.append(100 * (m["makespan_s"] / min(p[b]["makespan_s"] for b in ("default", "miger")) - 1))
        mixed.append(m["mixed_pct"])
    rows.append((name, jct, stp, mk, mixed))
print("| threshold | avg JCT vs the best (Default) | STP vs the best (MIGER) | makespan vs the best | MMK's mixed time |")
print("| --- | --- | --- | --- | --- |")
for name, jct, stp, mk, mixed in sorted(rows, key=lambda r: (float(r[0].split("-")[0]), r[0])):
    f = lambda xs: f"{statistics.fmean(xs):+.2f} % ({min(xs):+.2f} .. {max(xs):+.2f})"
    print(f"| {name} | {f(jct)} | {f(stp)} | {statistics.fmean(mk):+.2f} % | {statistics.fmean(mixed):.1f} % |")
