#!/usr/bin/env bash
# Each class apart in the simulator: MMK, MISO and MIGER on the paper's setup (800 online +
# 400 offline jobs, 8 A100-80GB, mean interval 40 s) over seeds, with a share of the
# offline jobs checkpointable and with or without periodic checkpoints.
#   lab/scripts/sim-classes.sh MMK_LAB OUT [SEEDS]
set -euo pipefail
lab=$1 out=$2 seeds=${3:-11,12,13}
mkdir -p "$out"
for every in none 600; do
  for frac in 0 0.5 1; do
    for seed in ${seeds//,/ }; do
      extra=()
      [ "$every" = none ] || extra=(--checkpoint-every "$every")
      f="$out/ckpt$frac-every$every-seed$seed.json"
      "$lab" --output json simulate --preset mmk-paper --seed "$seed" \
        --policies miso,miger,mmk --checkpointable "$frac" "${extra[@]}" > "$f" 2>/dev/null
      echo "wrote $f" >&2
    done
  done
done
python3 - "$out" <<'PY'
import json, glob, os, sys, statistics as st
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    name = os.path.basename(f)[:-5]
    frac, every, seed = name.split("-")
    r = json.load(open(f))
    for p in r["policies"]:
        rows.setdefault((frac[4:], every[5:], p["policy"]), []).append(p)
print("checkpointable every  policy  avg_jct online_jct offline_jct off_p95_slow over10x% makespan moves (mean over seeds)")
for (frac, every, pol), ps in sorted(rows.items()):
    m = lambda k: st.mean(p[k] or 0 for p in ps)
    print(f"{frac:>14} {every:>5} {pol:>7} {m('avg_jct_s'):8.0f} {m('online_avg_jct_s'):10.0f} {m('offline_avg_jct_s'):11.0f} {m('offline_p95_slowdown'):12.1f} {m('slowed_10x_pct'):8.1f} {m('makespan_s'):8.0f} {m('moves'):5.0f}")
PY
