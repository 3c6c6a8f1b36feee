#!/usr/bin/env bash
# CUDA graphs under the kernel scheduler (issue 7). On the GPU machine, from the repo root:
#   lab/scripts/gpu/ksched-capture.sh OUT_DIR BIN_DIR [BIN_DIR ...]
# 1. ksched-capture.py: torch.cuda.graph capture of ResNet-50 under each BIN_DIR's
#    interposer with a gate, online and offline (OUT_DIR/capture/capture.json).
# 2. A short co-location run with the service replaying its forward pass as one CUDA graph
#    per request, under the last BIN_DIR: ideal, plain MPS, and the kernel scheduler (mmk
#    policy, both priorities) (OUT_DIR/smoke/colocate.json).
# Starts one MPS control daemon with private directories for step 2 and quits it; changes
# no GPU setting.
set -euo pipefail
out=${1:?usage: ksched-capture.sh OUT_DIR BIN_DIR [BIN_DIR ...]}
shift
[ $# -ge 1 ] || { echo "usage: ksched-capture.sh OUT_DIR BIN_DIR [BIN_DIR ...]" >&2; exit 2; }
here=$(dirname "$0")
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv | tee "$out/gpu.txt"
python3 "$here/ksched-capture.py" "$out/capture" "$@"
last=${!#}
python3 "$here/ksched-colocate.py" "$last" "$out/smoke" --serve-stream side --serve-graph \
    --seconds "${SECONDS_EACH:-6}" --configs "${CONFIGS:-ideal,mps,ksfull-mmk-cprio}" 2>&1 |
    tee "$out/smoke.log"
