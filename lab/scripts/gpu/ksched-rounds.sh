#!/usr/bin/env bash
# Issue 7's targets, measured against run-to-run drift. On the GPU machine, from the repo root:
#   lab/scripts/gpu/ksched-rounds.sh BIN_DIR [OUT_DIR] [ROUNDS] [SECONDS]
#
# One run of each configuration per round, rounds one after another and each round's order
# rotated, so slow drift of the machine falls on every configuration alike (docs/kernel-sched.md, "Co-location").
# The co-location benchmark (lab/scripts/gpu/ksched-colocate.py), service on a stream of its own:
#   ideal                      the service alone
#   mps                        plain MPS, both jobs at 100 %
#   ksfull-passthrough-cprio   plain MPS, interposer with stream priority, MPS client priority
#   ksfull-orion-cprio         the same with the orion policy
# CONFIGS (comma-separated) replaces the list (any name of ksched-colocate.py: ks-, ksfull-
# and tsks- configurations with their suffixes); SERVE_GRAPH=1 has the service replay its
# forward pass as one CUDA graph per request (colocate.py --graph); SERVE_GPU_TIME=1 has it time
# each request's GPU work with CUDA events (colocate.py --gpu-time); ALT_BIN=DIR runs the
# configurations named "...-alt" with DIR's interposer and mmk-gate (an A/B of two builds). Per configuration it reports the pooled p50
# and p99 of every request of every round against the pooled ideal, the range of the
# per-round p99 ratios (each against the same round's ideal run), training steps per
# second against the same round's plain-MPS run ("mps" with the same "-train..." suffix for
# a synthetic training), and with SERVE_GPU_TIME=1 each request's wait and GPU time.
# BIN_DIR holds libmmk_interposer.so, mmk-gate and mmkctl (release builds). Starts one MPS
# control daemon with private directories and quits it; changes no GPU setting.
set -euo pipefail
bin=${1:?usage: ksched-rounds.sh BIN_DIR [OUT_DIR] [ROUNDS] [SECONDS]}
out=${2:-${OUT:-/tmp}}
rounds=${3:-3}
secs=${4:-15}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a whole number >= 1, not '$rounds'" >&2; exit 2; }
[[ "$secs" =~ ^[0-9]+([.][0-9]+)?$ ]] && [[ "$secs" != 0 ]] || { echo "SECONDS must be a number > 0, not '$secs'" >&2; exit 2; }
work=$out/raw   # written run by run: a cut-off call keeps what finished
mkdir -p "$work"
base=${CONFIGS:-ideal,mps,ksfull-passthrough-cprio,ksfull-orion-cprio}
configs=""
read -ra list <<<"${base//,/ }"
n=${#list[@]}
for r in $(seq 1 "$rounds"); do
    # Round r starts (r-1) places further along the list, so no configuration always runs
    # at the same place in a round (the two runs of 2026-11-21 did not rotate).
    for i in $(seq 0 $((n - 1))); do
        c=${list[$(((i + r - 1) % n))]}
        name=$c
        [ "$r" -gt 1 ] && name="$c@$r"
        configs="${configs:+$configs,}$name"
    done
done
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv | tee "$out/gpu.txt"
extra=()
[ "${SERVE_GRAPH:-0}" = 1 ] && extra+=(--serve-graph)
[ "${SERVE_GPU_TIME:-0}" = 1 ] && extra+=(--serve-gpu-time)
[ -n "${ALT_BIN:-}" ] && extra+=(--alt-bin "$ALT_BIN")
python3 "$(dirname "$0")/ksched-colocate.py" "$bin" "$work" --serve-stream side "${extra[@]}" \
    --seconds "$secs" --configs "$configs" 2>&1 | tee "$out/rounds.log"
cp "$work/colocate.json" "$out/rounds.json"
python3 "$(dirname "$0")/ksched-rounds.py" "$out/rounds.json" | tee "$out/rounds.txt"
