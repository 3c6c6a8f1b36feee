#!/usr/bin/env bash
# mmkd's NVML backend on a real GPU (MIG off, left as it is): what it reads of the GPU and
# its profiles, that a layout change is refused (MIG disabled) and changes nothing, what it
# says of the GPU's layout at start, the layout as a mig-parted config, and the driver's own
# profile table to compare with the catalog and the fake libnvidia-ml. Changes nothing on
# the GPU (MPS and the kernel scheduler off, no job).
#   lab/scripts/gpu/nvml-backend-check.sh BIN_DIR OUT_DIR
# BIN_DIR holds mmkd, mmkctl and real_nvml, the test binary of mmkd/tests/real_nvml.rs
# (`cargo test -p mmkd --release --test real_nvml --no-run` prints its path).
set -u
bin=$1 out=$2
mkdir -p "$out"
dir=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,mig.mode.current --format=csv,noheader > "$out/gpu.txt"
nvidia-smi mig -lgip > "$out/nvidia-smi-mig-lgip.txt" 2>&1
nvidia-smi mig -lgipp > "$out/nvidia-smi-mig-lgipp.txt" 2>&1
"$bin/real_nvml" --ignored --nocapture > "$out/real_nvml.txt" 2>&1
echo "real_nvml: exit $?" >> "$out/real_nvml.txt"
"$bin/mmkd" --backend nvml --mps off --kernel-policy off --metrics off \
  --data-dir "$dir/data" --socket "$dir/mmkd.sock" > "$out/mmkd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$dir/mmkd.sock" ] && break; sleep 0.1; done
"$bin/mmkctl" --socket "$dir/mmkd.sock" --output json gpus > "$out/gpus.json"
"$bin/mmkctl" --socket "$dir/mmkd.sock" partitions export --format mig-parted > "$out/mig-parted.yaml"
kill "$pid"; wait "$pid"
rm -rf "$dir"
nvidia-smi --query-gpu=name,mig.mode.current --format=csv,noheader > "$out/gpu-after.txt"
cat "$out/gpu.txt" "$out/real_nvml.txt"
grep -E "backend|MIG" "$out/mmkd.log" | head -5
cat "$out/mig-parted.yaml" "$out/gpu-after.txt"
