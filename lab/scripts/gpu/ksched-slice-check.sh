#!/usr/bin/env bash
# Issue 7: cutting the training job's long GEMMs (kernel-sched/src/slice.rs), checked on the
# GPU machine. From the repo root:
#   lab/scripts/gpu/ksched-slice-check.sh BIN_DIR OUT_DIR [MFLOP...]
# For each limit (default 8000 and 2000 MFLOP a piece) it makes a passthrough gate that
# cuts GEMMs and runs lab/scripts/gpu/ksched-slice-check.py in an offline job under the
# interposer: BERT's three long GEMMs whole and cut (bit-for-bit equal? how long?), then
# three training steps, with the interposer's stats. No MPS; changes no GPU setting.
# BIN_DIR holds libmmk_interposer.so and mmk-gate (release builds).
set -euo pipefail
bin=${1:?usage: ksched-slice-check.sh BIN_DIR OUT_DIR [MFLOP...]}
out=${2:?usage: ksched-slice-check.sh BIN_DIR OUT_DIR [MFLOP...]}
shift 2
limits=("$@")
[ ${#limits[@]} -gt 0 ] || limits=(8000 2000)
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv | tee "$out/gpu.txt"
for mflop in "${limits[@]}"; do
    [[ "$mflop" =~ ^[1-9][0-9]*$ ]] || { echo "MFLOP must be a whole number > 0, not '$mflop'" >&2; exit 2; }
    gate=$out/slice$mflop.gate
    "$bin/mmk-gate" create "$gate" --policy passthrough --gemm-slice-mflop "$mflop"
    LD_PRELOAD="$bin/libmmk_interposer.so" MMK_GATE="$gate" MMK_JOB_CLASS=offline \
        MMK_KSCHED_STATS="$out/slice$mflop.stats.json" \
        python3 "$(dirname "$0")/ksched-slice-check.py" "$bin/libmmk_interposer.so" \
        "$out/slice$mflop.json" 2>&1 | tee "$out/slice$mflop.log"
    "$bin/mmk-gate" show "$gate" | tee "$out/slice$mflop.gate.json"
    rm -f "$gate"
done
