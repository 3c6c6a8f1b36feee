"""The reference rows of one `mmk-lab simulate --output json` sweep added to another sweep
of the same traces (same jobs, GPUs, seeds and intervals) run without them. The reference
searches read only the trace and the ground truth, not the planners' model, so their
schedules do not change with the planners; `../2026-11-29-vm-exact/gap.py` then reads the merged sweep. The rows
are copied as they are: their figures against MIGER and their seconds are the other run's.

  python3 with-references.py PLANNERS.json REFERENCES.json > MERGED.json
"""
import json
import sys

new, old = (json.load(open(p)) for p in sys.argv[1:3])
for k in ("jobs_per_run", "gpus", "gpu_model", "ground_truth", "seeds", "intervals_s"):
    if new[k] != old[k]:
        sys.exit(f"the sweeps differ in {k}: {new[k]} against {old[k]}")
refs = {(r["interval_s"], r["seed"]): [p for p in r["policies"]
                                        if p["policy"].startswith("reference")]
        for r in old["runs"]}
for r in new["runs"]:
    found = refs.get((r["interval_s"], r["seed"]))
    if not found:
        sys.exit(f"no reference at {r['interval_s']} s, seed {r['seed']}")
    r["policies"] = [p for p in r["policies"] if not p["policy"].startswith("reference")] + found
json.dump(new, sys.stdout, indent=1)
