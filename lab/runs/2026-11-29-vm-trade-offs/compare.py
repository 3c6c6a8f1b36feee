"""MMK on its rules and the four variants of run.sh, on held-out seeds, against the best
baseline and the reference schedules:

1. per variant, over the twelve grid cells x 3 rates and the paper's setup x 4 rates: the
   cells where MMK is more than 1 % (SLO miss: 1 point) behind the best of Default, MISO
   and MIGER on each figure of the grid's target, with the sum of those gaps; and MMK's
   average JCT (all jobs) against its own on its rules;
2. per cell, each variant's distance from the best baseline on online and offline JCT;
3. the 20-job traces: the mean gap of average JCT to the reference-prompt schedule, per
   rate, per variant, and with the ground truth as MMK's model.

Baselines: ../2026-11-29-vm-past-shares (grid files, paper-seeds-51-53.json); reference:
../2026-11-29-vm-exact/twenty-jobs-seeds-61-70.json.
  python3 compare.py   (run in this folder; prints compare.md)
"""
import json
import statistics as st

BASE = "../2026-11-29-vm-past-shares/"
REF = "../2026-11-29-vm-exact/twenty-jobs-seeds-61-70.json"
VARIANTS = [("none", "MMK's rules"), ("A", "A: past the shares under a long queue"),
            ("B", "B: room to spare in crowds"), ("AB", "A+B"),
            ("A2h", "A, GPUs held past 2 h")]
FIG = [("online JCT", "online_avg_jct_s", min), ("offline JCT", "offline_avg_jct_s", min),
       ("offline p95", "offline_p95_slowdown", min), ("makespan", "makespan_s", min),
       ("STP", "stp", max), ("SLO miss", "slo_miss_pct", min)]
CELLS = [(m, s) for m in ("a100-40gb", "a100-80gb", "h100-80gb", "a30-24gb") for s in (30, 50, 70)]


def means(path, policies):
    by = {}
    for r in json.load(open(path))["runs"]:
        for p in r["policies"]:
            if p["policy"] in policies:
                by.setdefault((r["interval_s"], p["policy"]), []).append(p)
    keys = [f[1] for f in FIG] + ["avg_jct_s"]
    return {k: {x: st.mean(p[x] for p in ps) for x in keys} for k, ps in by.items()}


def gap(m, b, label, best):
    if label == "SLO miss":
        return m - b
    if b == 0 or m == 0:
        return 0.0
    return (m / b - 1) * 100 if best is min else (b / m - 1) * 100


def cells():
    """(name, interval, baselines' means, {variant: MMK's means})"""
    out = []
    for model, share in CELLS + [("paper", None)]:
        if model == "paper":
            base, name = means(BASE + "paper-seeds-51-53.json", ("default", "miso", "miger")), "paper"
        else:
            base = means(BASE + f"{model}-o{share}-c0.5.json", ("default", "miso", "miger"))
            name = f"{model}-o{share}"
        ours = {v: means(f"{v}-{name}.json", ("mmk",)) for v, _ in VARIANTS}
        for iv in sorted({k[0] for k in ours["none"]}):
            out.append((name, iv, {p: base[(iv, p)] for p in ("default", "miso", "miger")},
                        {v: ours[v][(iv, "mmk")] for v, _ in VARIANTS}))
    return out


rows = cells()
print(f"## Behind the best baseline ({len(rows)} cells: 12 grid cells x 20/40/80 s, the paper's setup x 20-160 s)\n")
print("| variant | " + " | ".join(f[0] for f in FIG) + " | average JCT vs MMK's rules (mean, lowest..highest) |")
print("| --- | " + " | ".join("---" for _ in FIG) + " | --- |")
for v, label in VARIANTS:
    cnt = {f[0]: [0, 0.0] for f in FIG}
    for _, _, base, ours in rows:
        for lab, key, best in FIG:
            g = gap(ours[v][key], best(base[p][key] for p in base), lab, best)
            if g > 1.0:
                cnt[lab][0] += 1
                cnt[lab][1] += g
    avg = [(ours[v]["avg_jct_s"] / ours["none"]["avg_jct_s"] - 1) * 100 for _, _, _, ours in rows]
    print(f"| {label} | " + " | ".join(f"{c} ({s:.0f})" for c, s in cnt.values())
          + f" | {st.mean(avg):+.1f} % ({min(avg):+.1f}..{max(avg):+.1f}) |")
print("\nA figure: cells behind by more than 1 % (SLO miss: 1 point), and the sum of those gaps.\n")

print("## Online and offline JCT against the best baseline, per cell\n")
print("| cell | interval | " + " | ".join(f"{label}: online / offline" for _, label in VARIANTS) + " |")
print("| --- | --- | " + " | ".join("---" for _ in VARIANTS) + " |")
for name, iv, base, ours in rows:
    parts = []
    for v, _ in VARIANTS:
        on = gap(ours[v]["online_avg_jct_s"], min(b["online_avg_jct_s"] for b in base.values()), "", min)
        off = gap(ours[v]["offline_avg_jct_s"], min(b["offline_avg_jct_s"] for b in base.values()), "", min)
        parts.append(f"{on:+.0f} / {off:+.0f} %")
    print(f"| {name} | {iv:g} s | " + " | ".join(parts) + " |")

print("\n## 20-job traces: average JCT against the reference-prompt schedule (seeds 61-70)\n")


def by_seed(path, policy):
    out = {}
    for r in json.load(open(path))["runs"]:
        for p in r["policies"]:
            if p["policy"] == policy:
                out[(r["interval_s"], r["seed"])] = p
    return out


ref = by_seed(REF, "reference-prompt")
sets = [(label, f"{v}-twenty-jobs.json") for v, label in VARIANTS]
sets.append(("MMK's rules, the truth as its model", "oracle-twenty-jobs.json"))
ivs = sorted({k[0] for k in ref})
print("| variant | " + " | ".join(f"{iv:g} s" for iv in ivs) + " |")
print("| --- | " + " | ".join("---" for _ in ivs) + " |")
for label, path in sets:
    ours = by_seed(path, "mmk")
    cells_ = []
    for iv in ivs:
        g = [(ours[k]["avg_jct_s"] / ref[k]["avg_jct_s"] - 1) * 100 for k in ref if k[0] == iv]
        slo = st.mean(ours[k]["slo_miss_pct"] for k in ref if k[0] == iv)
        cells_.append(f"{st.mean(g):+.1f} % (out of SLO {slo:.1f} %)")
    print(f"| {label} | " + " | ".join(cells_) + " |")
rslo = [st.mean(ref[k]["slo_miss_pct"] for k in ref if k[0] == iv) for iv in ivs]
print("| the reference's own out of SLO | " + " | ".join(f"{s:.1f} %" for s in rslo) + " |")
