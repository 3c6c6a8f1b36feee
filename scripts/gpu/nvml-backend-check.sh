#!/usr/bin/env bash
# mmkd's NVML backend on a real GPU (MIG off, left as it is): what it reads of the GPU and
# its profiles, what it says of the GPU's layout at start, and the layout as a mig-parted
# config. Changes nothing on the GPU (MPS and the kernel scheduler off, no job).
#   scripts/gpu/nvml-backend-check.sh BIN_DIR OUT_DIR
set -u
bin=$1 out=$2
mkdir -p "$out"
dir=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,mig.mode.current --format=csv,noheader > "$out/gpu.txt"
"$bin/mmkd" --backend nvml --mps off --kernel-policy off --metrics off \
  --data-dir "$dir/data" --socket "$dir/mmkd.sock" > "$out/mmkd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$dir/mmkd.sock" ] && break; sleep 0.1; done
"$bin/mmkctl" --socket "$dir/mmkd.sock" --output json gpus > "$out/gpus.json"
"$bin/mmkctl" --socket "$dir/mmkd.sock" partitions export --format mig-parted > "$out/mig-parted.yaml"
kill "$pid"; wait "$pid"
rm -rf "$dir"
grep -E "backend|MIG" "$out/mmkd.log" | head -5
cat "$out/mig-parted.yaml"
