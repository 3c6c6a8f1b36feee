"""Writes, to standard output, the first simulate JSON with its MMK runs replaced by the
second's (same trace options, intervals and seeds; checked) and its summary rows without
MMK's (they were figures of the runs replaced).
  python3 merge.py BASELINES.json MMK.json > MERGED.json
"""
import json
import sys

base, ours = (json.load(open(p)) for p in sys.argv[1:3])
for key in ("jobs_per_run", "gpus", "gpu_model", "checkpointable", "seeds", "intervals_s"):
    if base[key] != ours[key]:
        sys.exit(f"merge.py: {key} differs: {base[key]} against {ours[key]}")
mmk = {(r["interval_s"], r["seed"]): p for r in ours["runs"] for p in r["policies"] if p["policy"] == "mmk"}
for r in base["runs"]:
    r["policies"] = [mmk[(r["interval_s"], r["seed"])] if p["policy"] == "mmk" else p
                     for p in r["policies"]]
base["rows"] = [row for row in base["rows"] if row["policy"] != "mmk"]
json.dump(base, sys.stdout, indent=2)
print()
