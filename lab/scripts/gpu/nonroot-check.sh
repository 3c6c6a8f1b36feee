#!/usr/bin/env bash
# Two non-root users' jobs under mmkd on a real GPU (NVML backend, the real MPS control
# daemon, the kernel scheduler on):
#   1. user A's PyTorch job runs through a gate of A's own (mode 0600): its launches are
#      counted, its GPU time shows in `mmkctl top`, its profile is learned;
#   2. user B's job, which would fit beside it, waits with a reason naming the one-user
#      rule, and runs once A's job ends;
#   3. the rule is real MPS's: with one control daemon and no mmkd, B's first CUDA call
#      blocks until A's client exits.
# Runs as root from the repo root; BIN holds release builds of mmkd, mmkctl and
# libmmk_interposer.so. Writes what it saw under OUT and `OUT/summary.txt`; removes the
# users, the group, the daemons and the folders it made. Changes no GPU setting.
#
#   lab/scripts/gpu/nonroot-check.sh BIN OUT
set -euo pipefail

BIN=$(realpath "$1")
OUT=$(realpath -m "$2")
mkdir -p "$OUT"
W=/opt/mmk-nonroot-check
A=mmk-gpu-a
B=mmk-gpu-b
GROUP=mmk-gpu
MPS_PIPE=$W/mps/pipe
MPS_LOG=$W/mps/log
MMKD_PID=
# The Python that holds PyTorch, by its path: a job of another user than mmkd's starts
# with the plain PATH, not root's.
PY=$(command -v python3)

say() { echo "== $*" | tee -a "$OUT/summary.txt"; }

cleanup() {
    set +e
    [ -n "$MMKD_PID" ] && kill "$MMKD_PID" 2>/dev/null && wait "$MMKD_PID" 2>/dev/null
    if [ -d "$MPS_PIPE" ]; then
        echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE nvidia-cuda-mps-control 2>/dev/null
    fi
    pkill -u "$A" 2>/dev/null; pkill -u "$B" 2>/dev/null
    sleep 1
    userdel -r "$A" 2>/dev/null; userdel -r "$B" 2>/dev/null; groupdel "$GROUP" 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT

rm -rf "$W"
mkdir -p "$W/bin" "$W/run" "$MPS_PIPE" "$MPS_LOG"
cp "$BIN"/mmkd "$BIN"/mmkctl "$BIN"/libmmk_interposer.so "$W/bin/"
groupadd -f "$GROUP"
for u in "$A" "$B"; do
    id "$u" >/dev/null 2>&1 || useradd -m -s /bin/bash -G "$GROUP" "$u"
done
chmod -R a+rX "$W"

cat > "$W/matmul.py" <<'PY'
# A GPU-bound job: 4096x4096 float matmuls, a sync every 10, for SECONDS.
import sys, time, torch
seconds = float(sys.argv[1])
x = torch.randn(4096, 4096, device="cuda")
n, end = 0, time.time() + seconds
while time.time() < end:
    for _ in range(10):
        y = x @ x
    torch.cuda.synchronize()
    n += 10
print(f"matmuls {n} in {seconds:.0f} s as uid {__import__('os').getuid()}", flush=True)
PY
cat > "$W/first-call.py" <<'PY'
# How long the first CUDA call of this process takes (an MPS client of a second user waits).
import os, time
t = time.time()
import torch
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
print(f"uid {os.getuid()} first CUDA call done after {time.time() - t:.1f} s", flush=True)
PY
chmod a+r "$W"/*.py

nvidia-smi > "$OUT/gpu.txt" 2>&1 || true
say "mmkd (nvml, real MPS, kernel scheduler on) as root; jobs from $A and $B"
"$W/bin/mmkd" --backend nvml --interposer "$W/bin/libmmk_interposer.so" \
    --socket "$W/run/mmkd.sock" --socket-group "$GROUP" --data-dir "$W/data" \
    --metrics off > "$OUT/mmkd.log" 2>&1 &
MMKD_PID=$!
for _ in $(seq 100); do [ -S "$W/run/mmkd.sock" ] && break; sleep 0.2; done
grep -m1 "kernel scheduler" "$OUT/mmkd.log" | tee -a "$OUT/summary.txt" || true

as() { local u=$1; shift; (cd /tmp && runuser -u "$u" -- "$@"); }
ctl() { local u=$1; shift; as "$u" "$W/bin/mmkctl" --socket "$W/run/mmkd.sock" "$@"; }
job() {
    printf 'name: %s\ngpu_memory: 8GiB\ncommand:\n  args: [%s, %s, "%s"]\n  workdir: /tmp\n' \
        "$1" "$PY" "$W/matmul.py" "$2" > "$W/$1.yaml"
    chmod a+r "$W/$1.yaml"
}
state() { ctl "$1" --output json jobs get "$2" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["state"], "|", j["reason"])'; }
wait_state() {
    for _ in $(seq 600); do
        s=$(state "$1" "$2"); case "$s" in "$3"*) echo "$s"; return 0;; esac
        case "$s" in FAILED*|CANCELLED*) echo "$s"; return 1;; esac
        sleep 0.2
    done
    echo "timeout: $s"; return 1
}

job a-train 25
job b-train 8
ida=$(ctl "$A" --output json submit --offline "$W/a-train.yaml" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
say "A's job $ida: $(wait_state "$A" "$ida" RUNNING)"
ctl "$A" --output json partitions show > "$OUT/partitions-running.json"
gate=$(python3 -c 'import json,sys
for g in json.load(open(sys.argv[1])):
    for p in g["partitions"]:
        if p.get("gate"): print(p["gate"]["path"])' "$OUT/partitions-running.json" | head -1)
say "A's gate: $gate: $(stat -c '%U %a' "$gate"); folder $(stat -c '%U %a' "$(dirname "$gate")")"
if as "$B" cat "$gate" > /dev/null 2>&1; then say "B READ A's GATE"; else say "B cannot read A's gate"; fi

idb=$(ctl "$B" --output json submit --offline "$W/b-train.yaml" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
sleep 3
say "B's job $idb while A's runs: $(state "$B" "$idb")"
ctl "$A" --output json top --once --interval 2s > "$OUT/top.json"
say "top as A: $(python3 -c 'import json,sys
for p in json.load(open(sys.argv[1])):
    for j in p["jobs"]:
        print("job", j["id"], j["state"], "user", j["user"], "gpu", j["gpu_pct"], "% kernel_us", j["kernel_us"], "launches", j["launches"])' "$OUT/top.json" | tr '\n' ';')"
say "A's job: $(wait_state "$A" "$ida" SUCCEEDED)"
say "B's job: $(wait_state "$B" "$idb" RUNNING)"
say "B's job: $(wait_state "$B" "$idb" SUCCEEDED)"
ctl "$A" --output json partitions show > "$OUT/partitions-after.json"
say "gate launches after both: $(python3 -c 'import json,sys
print(sum(p["gate"]["launches"] for g in json.load(open(sys.argv[1])) for p in g["partitions"] if p.get("gate")))' "$OUT/partitions-after.json")"
for id in "$ida" "$idb"; do
    cp "$W/data/jobs/$id/stdout.log" "$OUT/job-$id.stdout" 2>/dev/null || true
    cp "$W/data/jobs/$id/stderr.log" "$OUT/job-$id.stderr" 2>/dev/null || true
    say "job $id said: $(cat "$OUT/job-$id.stdout"); unscheduled: $(grep -c unscheduled "$OUT/job-$id.stderr" || true)"
done
for _ in $(seq 50); do
    ctl "$A" --output json profiles > "$OUT/profiles-a.json"
    python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1])) else 1)' "$OUT/profiles-a.json" && break
    sleep 0.2
done
say "A's learned profiles: $(python3 -c 'import json,sys
for p in json.load(open(sys.argv[1])):
    print(p["name"], "runs", p["runs"], "launches", p["launches"], "busy", round(p.get("busy") or 0, 3), "sm_mean", round(p.get("sm_mean") or 0, 3), "kernel_us", round(p.get("kernel_us") or 0, 1))' "$OUT/profiles-a.json" | tr '\n' ';')"
kill "$MMKD_PID"; wait "$MMKD_PID" 2>/dev/null || true; MMKD_PID=

say "real MPS without mmkd: one control daemon; A's client runs 15 s, B's starts 3 s later"
export CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE CUDA_MPS_LOG_DIRECTORY=$MPS_LOG
nvidia-cuda-mps-control -d
as "$A" env CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE "$PY" "$W/matmul.py" 15 > "$OUT/mps-a.txt" 2>&1 &
a_pid=$!
sleep 3
start=$(date +%s.%N)
as "$B" env CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE timeout 120 "$PY" "$W/first-call.py" > "$OUT/mps-b.txt" 2>&1 || true
end=$(date +%s.%N)
wait "$a_pid" || true
say "A: $(cat "$OUT/mps-a.txt" | tail -1)"
say "B: $(cat "$OUT/mps-b.txt" | tail -1) (wall $(python3 -c "print(round($end - $start, 1))") s)"
cp "$MPS_LOG/control.log" "$OUT/mps-control.log" 2>/dev/null || true
echo quit | nvidia-cuda-mps-control || true
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
# At most eight files come back from a device call: the JSON, the jobs' output and the
# MPS check each in one file.
for f in "$OUT"/*.json; do echo "### $(basename "$f")"; cat "$f"; echo; done > "$OUT/json.txt"
for f in "$OUT"/job-*; do echo "### $(basename "$f")"; cat "$f"; done > "$OUT/jobs.txt"
for f in "$OUT"/mps-*; do echo "### $(basename "$f")"; cat "$f"; done > "$OUT/mps.txt"
rm -f "$OUT"/*.json "$OUT"/job-* "$OUT"/mps-*
say "done"
