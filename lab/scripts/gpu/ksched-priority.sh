#!/usr/bin/env bash
# Issue 7, deliverable 3: does priority help the online service? On the GPU machine, from the
# repo root: lab/scripts/gpu/ksched-priority.sh BIN_DIR [OUT_DIR] [SECONDS]
#
# The co-location benchmark (lab/scripts/gpu/ksched-colocate.py) with the service on a stream of
# its own (--serve-stream side), under plain MPS:
#   mps                          no priority at all
#   mps-cprio                    MPS client priority: offline below normal (what mmkd sets)
#   ksfull-passthrough-keepprio  the interposer loaded, stream priorities left alone
#   ksfull-passthrough           the interposer raises the service's streams to the greatest
#   ksfull-passthrough-cprio     both kinds of priority
#   ksfull-{orion,mmk}-cprio     both, with a gating policy
#   ks-passthrough-cprio         both, with MPS shares 60/40
# and `ideal` (the service alone). CONFIGS (comma-separated) replaces the list; "NAME@2"
# runs NAME again under its own name. Ratios are to the mean of the ideal runs and to the
# mean training speed of the plain-MPS runs.
# BIN_DIR holds libmmk_interposer.so, mmk-gate and mmkctl (release builds). Starts one MPS
# control daemon with private directories and quits it; changes no GPU setting.
set -euo pipefail
bin=${1:?usage: ksched-priority.sh BIN_DIR [OUT_DIR] [SECONDS]}
out=${2:-${OUT:-/tmp}}
secs=${3:-20}
work=$(mktemp -d)
configs=${CONFIGS:-ideal,mps,mps-cprio,ksfull-passthrough-keepprio,ksfull-passthrough,ksfull-passthrough-cprio,ksfull-orion-cprio,ksfull-mmk-cprio,ks-passthrough-cprio,ideal@2}
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv | tee "$out/gpu.txt"
python3 "$(dirname "$0")/ksched-colocate.py" "$bin" "$work" --serve-stream side \
    --seconds "$secs" --configs "$configs" 2>&1 | tee "$out/priority.log"
cp "$work/colocate.json" "$out/priority.json"
cp "$work/all.tar.gz" "$out/priority.tar.gz"
python3 - "$out/priority.json" <<'PY'
import json, sys
import statistics
r = json.load(open(sys.argv[1]))["configs"]
def runs(name):
    return [v for c, v in r.items() if c.split("@")[0] == name]
ideal = {k: statistics.fmean(v[k] for v in runs("ideal")) for k in ["p50_ms", "p99_ms"]}
base = statistics.fmean(v["train_steps_per_s"] for v in runs("mps")) if runs("mps") else None
print(f"{'config':30} {'p50 ms':>7} {'p99 ms':>7} {'p50/ideal':>9} {'p99/ideal':>9} {'train/mps':>9} prio")
for c, v in r.items():
    if "p50_ms" not in v:
        continue
    t = v.get("train_steps_per_s")
    tr = f"{t / base:9.2f}" if t and base else " " * 9
    print(f"{c:30} {v['p50_ms']:7.2f} {v['p99_ms']:7.2f} {v['p50_ms'] / ideal['p50_ms']:9.2f} "
          f"{v['p99_ms'] / ideal['p99_ms']:9.2f} {tr} {v.get('stream_priority')}")
PY
