#!/usr/bin/env bash
# Real-GPU check of mmkd's NVML backend (read-only): run on the GPU machine with prebuilt
# x86-64 binaries in $BIN (default .gpu-bin). It starts mmkd --backend nvml, records what
# `mmkctl gpus` and `mmkctl partitions show` report next to nvidia-smi's own view, runs one
# managed job that prints the GPU it sees, and stops mmkd with SIGTERM.
# It never changes MIG mode, clocks or any other GPU setting.
set -u
BIN=${BIN:-.gpu-bin}
OUT=${OUT:-/tmp/mmk-nvml-check}
mkdir -p "$OUT"
work=$(mktemp -d)
export MMK_SOCKET="$work/mmkd.sock"

{
  echo "## nvidia-smi"
  nvidia-smi --query-gpu=index,name,uuid,memory.total,mig.mode.current,driver_version --format=csv
  echo "## nvidia-smi mig -lgip"
  nvidia-smi mig -lgip 2>&1 | head -40
} > "$OUT/nvidia-smi.txt" 2>&1

"$BIN/mmkd" --backend nvml --data-dir "$work/data" > "$OUT/mmkd.log" 2>&1 &
mmkd=$!
for _ in $(seq 1 100); do
  [ -S "$MMK_SOCKET" ] && break
  kill -0 $mmkd 2>/dev/null || break
  sleep 0.1
done

"$BIN/mmkctl" gpus > "$OUT/gpus.txt" 2>&1
"$BIN/mmkctl" --output json gpus > "$OUT/gpus.json" 2>&1
"$BIN/mmkctl" partitions show > "$OUT/partitions.txt" 2>&1

cat > "$work/probe.yaml" <<'YAML'
name: device-probe
class: offline
gpu_memory: 2GiB
command:
  args: [python3, -c, "import os, torch; p = torch.cuda.get_device_properties(0); print('CUDA_VISIBLE_DEVICES', os.environ['CUDA_VISIBLE_DEVICES']); print('device', p.name, 'sms', p.multi_processor_count, 'memory_gib', round(p.total_memory / 2**30, 1))"]
YAML
"$BIN/mmkctl" submit "$work/probe.yaml" > "$OUT/probe.txt" 2>&1
for _ in $(seq 1 600); do
  state=$("$BIN/mmkctl" --output json jobs get 1 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null)
  case "$state" in SUCCEEDED|FAILED|CANCELLED) break ;; esac
  sleep 0.1
done
"$BIN/mmkctl" jobs get 1 >> "$OUT/probe.txt" 2>&1
cat "$work/data/jobs/1/stdout.log" "$work/data/jobs/1/stderr.log" >> "$OUT/probe.txt" 2>/dev/null

kill -TERM $mmkd
wait $mmkd
echo "mmkd exit status: $?" >> "$OUT/mmkd.log"
[ -e "$MMK_SOCKET" ] && echo "socket left behind" >> "$OUT/mmkd.log"
cat "$OUT/nvidia-smi.txt" "$OUT/gpus.txt" "$OUT/partitions.txt" "$OUT/probe.txt" "$OUT/mmkd.log"
