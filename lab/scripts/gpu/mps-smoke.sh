#!/usr/bin/env bash
# Real-GPU check of mmk's MPS supervision, on the GPU machine (MIG off: one whole-GPU
# partition), with prebuilt x86-64 binaries in $BIN (default .gpu-bin):
#  1. facts of the real nvidia-cuda-mps-control that the fake copies (replies, pid file,
#     server status text, the server's environment), with private pipe and log dirs;
#  2. mmkd --backend nvml --mps nvidia with two managed PyTorch jobs (an online and an
#     offline one, with the shares the MMK planner gives them); each reports the SMs it
#     sees and its matmul throughput; the daemon runs while they run and is gone after
#     mmkd stops.
# Prints a pass/fail table last; logs go to $OUT. It never changes MIG mode, clocks or any
# other GPU setting, and quits every MPS daemon it started.
set -u
BIN=${BIN:-.gpu-bin}
OUT=${OUT:-/tmp/mmk-mps-smoke}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
work=$(mktemp -d /tmp/mmk-smoke.XXXX)
export MMK_SOCKET="$work/mmkd.sock"
declare -a rows
row() { rows+=("$(printf '%-46s %-4s %s' "$1" "$2" "$3")"); }
ctl() { "$BIN/mmkctl" "$@"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

MPS=$(command -v nvidia-cuda-mps-control || true)
gpu_uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,uuid,mig.mode.current,driver_version --format=csv > "$OUT/gpu.txt" 2>&1

# ---- 1. the real control program ------------------------------------------------------
facts="$OUT/mps-facts.txt"
{
  echo "program: ${MPS:-missing}"
  p="$work/raw/pipe"; l="$work/raw/log"; mkdir -p "$p" "$l"
  export CUDA_MPS_PIPE_DIRECTORY="$p" CUDA_MPS_LOG_DIRECTORY="$l"
  CUDA_VISIBLE_DEVICES="$gpu_uuid" "$MPS" -d; echo "-d exit: $?"
  sleep 0.5
  echo "pipe dir: $(ls "$p" | tr '\n' ' ')"
  echo "pid file: $(cat "$p/nvidia-cuda-mps-control.pid" 2>&1)"
  for c in get_server_list "set_default_active_thread_percentage 100" \
           get_default_active_thread_percentage "set_default_device_pinned_mem_limit 0 4096M" \
           "get_default_device_pinned_mem_limit 0" "set_default_active_thread_percentage 140" \
           frobnicate; do
    r=$(echo "$c" | "$MPS" 2>&1); echo "[$c] exit=$? reply=<$r>"
  done
  CUDA_VISIBLE_DEVICES="$gpu_uuid" python3 -c "import torch,time; torch.zeros(1,device='cuda'); time.sleep(4)" &
  client=$!
  srv=""
  for _ in $(seq 1 60); do
    srv=$(echo get_server_list | "$MPS" 2>&1 | head -1)
    [ -n "$srv" ] && break
    sleep 0.5
  done
  sleep 1
  echo "server: <$srv>"
  r=$(echo "get_server_status 999999" | "$MPS" 2>&1); echo "[get_server_status 999999] exit=$? reply=<$r>"
  r=$(echo "get_server_status $srv" | "$MPS" 2>&1); echo "[get_server_status] reply=<$r>"
  r=$(echo "get_client_list $srv" | "$MPS" 2>&1); echo "[get_client_list] reply=<$r> client=$client"
  echo "server env has pipe dir: $(tr '\0' '\n' < /proc/$srv/environ 2>/dev/null | grep -c "^CUDA_MPS_PIPE_DIRECTORY=$p$")"
  echo "server comm: $(cat /proc/$srv/comm 2>/dev/null)"
  wait $client
  r=$(echo quit | "$MPS" 2>&1); echo "[quit] exit=$? reply=<$r>"
  sleep 1
  echo "control alive after quit: $(pgrep -f nvidia-cuda-mps-control >/dev/null && echo yes || echo no)"
  echo "--- control.log"; tail -20 "$l/control.log" 2>&1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
} > "$facts" 2>&1
grep -q "get_server_status\] reply=<ACTIVE>" "$facts" \
  && row "real daemon: server status reads ACTIVE" PASS "" \
  || row "real daemon: server status reads ACTIVE" FAIL "$(grep get_server_status "$facts")"

# ---- 2. mmkd with two managed jobs ----------------------------------------------------
"$BIN/mmkd" --backend nvml --mps nvidia --data-dir "$work/data" > "$OUT/mmkd.log" 2>&1 &
mmkd=$!
for _ in $(seq 1 100); do [ -S "$MMK_SOCKET" ] && break; sleep 0.1; done
cp "$HERE/mps-probe.py" "$work/probe.py"
cat > "$work/online.yaml" <<YAML
name: serve
class: online
slo: 20ms
gpu_memory: 4GiB
command:
  args: [python3, $work/probe.py, "20"]
  profile: resnet50-inference
YAML
cat > "$work/offline.yaml" <<YAML
name: train
class: offline
gpu_memory: 6GiB
command:
  args: [python3, $work/probe.py, "20"]
  profile: resnet50-train
YAML
ctl submit "$work/online.yaml" > "$OUT/submit.txt" 2>&1
ctl submit "$work/offline.yaml" >> "$OUT/submit.txt" 2>&1
sleep 8
ctl jobs > "$OUT/jobs-during.txt" 2>&1
ctl partitions show > "$OUT/partitions-during.txt" 2>&1
parts=$(ctl --output json partitions show)
dpid=$(echo "$parts" | json 'd[0]["partitions"][0]["mps"]["pid"]' 2>/dev/null)
running=$(ctl --output json jobs | json 'sum(1 for j in d if j["state"]=="RUNNING")' 2>/dev/null)
if [ -n "$dpid" ] && [ "$(cat /proc/$dpid/comm 2>/dev/null)" = "nvidia-cuda-mps" ]; then
  row "mps daemon runs while the jobs run" PASS "pid $dpid, $running jobs running"
else
  row "mps daemon runs while the jobs run" FAIL "pid '$dpid'"
fi
[ "$running" = 2 ] && row "both jobs run at once" PASS "" || row "both jobs run at once" FAIL "$running running"
for id in 1 2; do
  for _ in $(seq 1 120); do
    st=$(ctl --output json jobs get $id | json 'd["state"]' 2>/dev/null)
    case "$st" in SUCCEEDED|FAILED|CANCELLED) break;; esac
    sleep 1
  done
  ctl --output json jobs get $id > "$OUT/job$id.json" 2>&1
  ctl jobs logs $id > "$OUT/job$id.stdout" 2>&1
  ctl jobs logs $id --stderr > "$OUT/job$id.stderr" 2>&1
  line=$(grep '^share=' "$OUT/job$id.stdout")
  share=$(sed -n 's/.*share=\([0-9]*\).*/\1/p' <<<"$line")
  sms=$(sed -n 's/.*sms=\([0-9]*\).*/\1/p' <<<"$line")
  tf=$(sed -n 's/.*tflops=\([0-9.]*\).*/\1/p' <<<"$line")
  want=$(( 132 * ${share:-0} / 100 ))
  if [ "$st" = SUCCEEDED ] && [ -n "$sms" ] && [ $(( sms - want )) -le 4 ] && [ $(( want - sms )) -le 4 ]; then
    row "job $id ($share% share) sees its SMs" PASS "$sms of 132 SMs (132 x $share% = $want); $tf TFLOP/s bf16"
  else
    row "job $id ($share% share) sees its SMs" FAIL "state $st; $line"
  fi
  if grep -q "over_limit_alloc=refused" "$OUT/job$id.stdout"; then
    row "job $id: its pinned memory limit holds" PASS "$(grep -o 'memlimit=[^ ]*' "$OUT/job$id.stdout")"
  else
    row "job $id: its pinned memory limit holds" FAIL "$(grep over_limit "$OUT/job$id.stdout")"
  fi
done
kill -TERM $mmkd; wait $mmkd; echo "mmkd exit $?" >> "$OUT/mmkd.log"
sleep 0.5
# A daemonized process whose parent is gone waits for PID 1 to reap it; where PID 1 does
# not reap (some containers), it stays a zombie: exited, holding nothing.
live=""
for pid in $(pgrep nvidia-cuda-mps); do
  st=$(awk '{print $3}' /proc/$pid/stat 2>/dev/null)
  [ -n "$st" ] && [ "$st" != Z ] && live="$live $pid"
done
ps -eo pid,ppid,stat,comm | grep -E "PID|nvidia-cuda-mps" > "$OUT/mps-after.txt" 2>&1
echo "pid 1: $(cat /proc/1/comm)" >> "$OUT/mps-after.txt"
dstate=$(awk '{print $3}' /proc/$dpid/stat 2>/dev/null)
if [ -n "$dpid" ] && { [ -z "$dstate" ] || [ "$dstate" = Z ]; } && [ -z "$live" ]; then
  if [ -n "$dstate" ]; then d="exited (a zombie: PID 1 does not reap)"; else d="gone"; fi
  row "daemon gone after mmkd stops" PASS "pid $dpid $d"
else
  row "daemon gone after mmkd stops" FAIL "still running:$live"
fi
# ---- 3. faults: the daemon killed under a job; mmkd killed ---------------------------
gone() { local st; st=$(awk '{print $3}' /proc/$1/stat 2>/dev/null); [ -z "$st" ] || [ "$st" = Z ]; }
data3="$work/data3"
"$BIN/mmkd" --backend nvml --mps nvidia --data-dir "$data3" > "$OUT/mmkd3.log" 2>&1 &
mmkd=$!
for _ in $(seq 1 100); do [ -S "$MMK_SOCKET" ] && break; sleep 0.1; done
sed 's/"20"/"12"/' "$work/online.yaml" > "$work/fault.yaml"
ctl submit "$work/fault.yaml" > /dev/null 2>&1
sleep 6
old=$(ctl --output json partitions show | json 'd[0]["partitions"][0]["mps"]["pid"]' 2>/dev/null)
kill -9 "$old"
sleep 3
new=$(ctl --output json partitions show | json 'd[0]["partitions"][0]["mps"]["pid"]' 2>/dev/null)
# The job either still runs (its reason names the restart) or died with its server (its
# end names the daemon).
reason=$(ctl --output json jobs get 1 | json 'd["state"] + ": " + d["reason"]' 2>/dev/null)
ctl --output json jobs get 1 > "$OUT/job3-after-kill.json" 2>&1
if [ -n "$new" ] && [ "$new" != "$old" ] && ! gone "$new" && grep -q "MPS control daemon" <<<"$reason"; then
  row "killed daemon restarted, job record says so" PASS "pid $old -> $new; job $reason"
else
  row "killed daemon restarted, job record says so" FAIL "old $old new $new; reason: $reason"
fi
kill -9 $mmkd; wait $mmkd 2>/dev/null
sleep 0.5
orphan=$(cat "$data3/mps/g0/pipe/nvidia-cuda-mps-control.pid" 2>/dev/null)
orphan_alive=$(gone "$orphan" && echo no || echo yes)
rm -f "$MMK_SOCKET"
"$BIN/mmkd" --backend nvml --mps nvidia --data-dir "$data3" > "$OUT/mmkd4.log" 2>&1 &
mmkd=$!
for _ in $(seq 1 100); do [ -S "$MMK_SOCKET" ] && break; sleep 0.1; done
if [ -n "$orphan" ] && gone "$orphan" && grep -q "stopped MPS daemons the previous mmkd left" "$OUT/mmkd4.log"; then
  row "kill -9 mmkd: next start stops the orphan" PASS "pid $orphan (alive after the kill: $orphan_alive)"
else
  row "kill -9 mmkd: next start stops the orphan" FAIL "pid '$orphan'"
fi
kill -TERM $mmkd; wait $mmkd

{
  printf '%-46s %-4s %s\n' check "" detail
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/table.txt"
