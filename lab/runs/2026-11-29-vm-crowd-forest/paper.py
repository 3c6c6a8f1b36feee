"""The paper's setup on seeds 51-53 (`paper-seeds-51-53.json`) beside the same setup on the
build before (`../2026-11-28-vm-holds/paper-seeds-51-53.json`, or BEFORE): per interval
and policy, the means over the seeds. Run in the folder of the record to print.

  python3 paper.py [BEFORE]
"""
import json
import statistics as st
import sys

FIELDS = [("avg JCT", "avg_jct_s", "{:,.0f} s"), ("online JCT", "online_avg_jct_s", "{:,.0f} s"),
          ("offline JCT", "offline_avg_jct_s", "{:,.0f} s"), ("makespan", "makespan_s", "{:,.0f} s"),
          ("STP", "stp", "{:.3f}"), ("SLO miss", "slo_miss_pct", "{:.1f} %"),
          ("offline p95 slowdown", "offline_p95_slowdown", "{:.1f}x")]


def means(path):
    by = {}
    for r in json.load(open(path))["runs"]:
        for p in r["policies"]:
            by.setdefault((r["interval_s"], p["policy"]), []).append(p)
    return {k: {f: st.mean(p[f] for p in v) for _, f, _ in FIELDS} for k, v in by.items()}


after = means("paper-seeds-51-53.json")
before = means(sys.argv[1] if len(sys.argv) > 1 else "../2026-11-28-vm-holds/paper-seeds-51-53.json")
print("| interval | policy | build | " + " | ".join(f[0] for f in FIELDS) + " |")
print("| --- | --- | --- | " + " | ".join("---" for _ in FIELDS) + " |")
for (iv, pol) in sorted(after):
    for name, m in (("before", before), ("after", after)):
        if (iv, pol) in m and (name == "after" or pol.startswith("mmk")):
            row = m[(iv, pol)]
            print(f"| {iv:g} s | {pol} | {name} | "
                  + " | ".join(fmt.format(row[f]) for _, f, fmt in FIELDS) + " |")
