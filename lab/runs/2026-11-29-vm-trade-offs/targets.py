"""The grid's target asked of every policy: in each of the 360 cells of the held-out grid
(../2026-11-29-vm-past-shares), is the policy within 1 % (SLO miss: 1 point) of the best of
the others on online JCT, offline JCT, makespan, STP and SLO miss, all at once? MMK is read
against the three baselines, each baseline against the other two. Also per figure: the
cells where each policy is within 1 % of the best of the others on that figure alone, and
the cells where a different baseline is the best on online and on offline JCT; and, in the
light-load cells (160 and 240 s) where MMK is behind on STP, how far it is from the best
baseline on online and offline JCT and makespan there; and the cells where some baseline
is ahead of MMK (by more than 1 %, SLO miss 1 point) on every one of the five figures at
once, or on every figure where the two are not level, with MMK ahead on none.
  python3 targets.py [GRID]   (run in this folder, it prints targets.md; GRID: another
                               folder of grid runs, e.g. a later record's)
"""
import glob
import json
import os
import statistics as st
import sys

GRID = sys.argv[1] if len(sys.argv) > 1 else "../2026-11-29-vm-past-shares/"
FIG = [("online JCT", "online_avg_jct_s", min), ("offline JCT", "offline_avg_jct_s", min),
       ("makespan", "makespan_s", min), ("STP", "stp", max), ("SLO miss", "slo_miss_pct", min)]
BASELINES = ("default", "miso", "miger")
POLICIES = BASELINES + ("mmk",)


def gap(m, b, label, best):
    if label == "SLO miss":
        return m - b
    if b == 0 or m == 0:
        return 0.0
    return (m / b - 1) * 100 if best is min else (b / m - 1) * 100


name_of = {"default": "Default", "miso": "MISO", "miger": "MIGER"}
total = 0
all_at_once = {p: 0 for p in POLICIES}
per_figure = {p: {f[0]: 0 for f in FIG} for p in POLICIES}
split = 0
light = []  # (STP, online JCT, offline JCT, makespan) gaps where MMK is behind on STP
dominated_all = dominated = 0
weak_cells = []
for path in sorted(glob.glob(os.path.join(GRID, "*-o*-c*.json"))):
    by = {}
    for r in json.load(open(path))["runs"]:
        for p in r["policies"]:
            by.setdefault((r["interval_s"], p["policy"]), []).append(p)
    for iv in sorted({k[0] for k in by}):
        total += 1
        mean = {(pol, k): st.mean(p[k] for p in by[(iv, pol)]) for pol in POLICIES for _, k, _ in FIG}
        best_on = min(BASELINES, key=lambda p: mean[(p, "online_avg_jct_s")])
        best_off = min(BASELINES, key=lambda p: mean[(p, "offline_avg_jct_s")])
        split += best_on != best_off
        # A baseline ahead on every figure, or ahead on some and level on the rest.
        strict = weak = False
        for o in BASELINES:
            g = [gap(mean[("mmk", k)], mean[(o, k)], label, best) for label, k, best in FIG]
            strict |= all(x > 1.0 for x in g)
            if all(x >= -1.0 for x in g) and any(x > 1.0 for x in g):
                weak = True
                weak_cells.append(f"{os.path.basename(path)[:-5]} at {iv:g} s ({name_of[o]})")
        dominated_all += strict
        dominated += weak
        if iv >= 160:
            g = [gap(mean[("mmk", k)], best(mean[(o, k)] for o in BASELINES), label, best)
                 for label, k, best in (FIG[3], FIG[0], FIG[1], FIG[2])]
            if g[0] > 1.0:
                light.append(g)
        for pol in POLICIES:
            others = [o for o in BASELINES if o != pol]
            ok = True
            for label, key, best in FIG:
                g = gap(mean[(pol, key)], best(mean[(o, key)] for o in others), label, best)
                if g <= 1.0:
                    per_figure[pol][label] += 1
                else:
                    ok = False
            all_at_once[pol] += ok
name = {"default": "Default", "miso": "MISO", "miger": "MIGER", "mmk": "MMK"}
print(f"| policy (against) | all five at once | " + " | ".join(f[0] for f in FIG) + " |")
print("| --- | --- | " + " | ".join("---" for _ in FIG) + " |")
for pol in POLICIES:
    against = "the three baselines" if pol == "mmk" else "the other two baselines"
    print(f"| {name[pol]} ({against}) | {all_at_once[pol]} of {total} | "
          + " | ".join(str(per_figure[pol][f[0]]) for f in FIG) + " |")
print(f"\nCells where the best baseline on online JCT is not the best on offline JCT: {split} of {total}.")
print(f"\nLight load (160 and 240 s), cells where MMK is more than 1 % behind on STP: {len(light)}; "
      "there, MMK against the best baseline (mean, most behind): "
      + ", ".join(f"{name_} {st.mean(g[i] for g in light):+.1f} % ({max(g[i] for g in light):+.1f} %)"
                  for i, name_ in ((0, "STP"), (1, "online JCT"), (2, "offline JCT"), (3, "makespan"))) + ".")
print(f"\nCells where one baseline is ahead of MMK on all five figures: {dominated_all} of {total}; "
      f"ahead on some and level (within 1 %) on the rest: {dominated} of {total}"
      + (f" ({', '.join(weak_cells)})." if weak_cells else "."))
