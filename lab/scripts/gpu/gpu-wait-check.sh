#!/usr/bin/env bash
# Runs lab/scripts/gpu/gpu-wait-check.py without MPS and as an MPS client. On the GPU machine:
#   lab/scripts/gpu/gpu-wait-check.sh OUT_DIR
# Starts one MPS control daemon with private pipe and log directories and quits it; changes
# no GPU setting.
set -euo pipefail
out=${1:?usage: gpu-wait-check.sh OUT_DIR}
here=$(dirname "$0")
mkdir -p "$out/alone" "$out/mps/pipe" "$out/mps/log"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv | tee "$out/gpu.txt"
python3 "$here/gpu-wait-check.py" "$out/alone"
export CUDA_MPS_PIPE_DIRECTORY=$out/mps/pipe CUDA_MPS_LOG_DIRECTORY=$out/mps/log
nvidia-cuda-mps-control -d
trap 'echo quit | nvidia-cuda-mps-control' EXIT
python3 "$here/gpu-wait-check.py" "$out/client"
