"""MMK before and after the rule against the best of Default, MISO and MIGER, per setup and
interval (means over seeds): online JCT, offline JCT, offline p95 slowdown, makespan (MMK /
best - 1) and STP (best / MMK - 1), in %; negative: MMK ahead. The baselines' runs are in
the before-*.json files (the rule changes MMK only); after-*.json hold MMK's runs on the
build with the rule.

Usage: python3 compare.py   (in this folder; prints a markdown table)
"""
import glob
import json
import statistics as st

FIG = [("online JCT", "online_avg_jct_s", min), ("offline JCT", "offline_avg_jct_s", min),
       ("offline p95 slowdown", "offline_p95_slowdown", min), ("makespan", "makespan_s", min),
       ("STP", "stp", max)]


def means(path, policy):
    by = {}
    for r in json.load(open(path))["runs"]:
        for p in r["policies"]:
            if p["policy"] == policy:
                by.setdefault(r["interval_s"], []).append(p)
    return {iv: {k: st.mean(p[k] for p in ps) for _, k, _ in FIG} for iv, ps in by.items()}


print("| setup | interval | " + " | ".join(f"{f[0]} before / after" for f in FIG) + " |")
print("| --- | --- | " + " | ".join("---" for _ in FIG) + " |")
for before in sorted(glob.glob("before-*.json")):
    setup = before[len("before-"):-len(".json")]
    base = {pol: means(before, pol) for pol in ("default", "miso", "miger")}
    old, new = means(before, "mmk"), means(f"after-{setup}.json", "mmk")
    for iv in sorted(new):
        cells = []
        for _, k, best in FIG:
            b = best(base[pol][iv][k] for pol in base)
            gap = (lambda m: (m / b - 1) * 100) if best is min else (lambda m: (b / m - 1) * 100)
            cells.append(f"{gap(old[iv][k]):+.1f} / {gap(new[iv][k]):+.1f} %")
        print(f"| {setup} | {iv:g} s | " + " | ".join(cells) + " |")
