#!/usr/bin/env bash
# The interposer on a real GPU (issue 6): coverage against CUPTI, per-launch cost, and the
# end-to-end slowdown of two PyTorch workloads. MPS stays off; nothing on the GPU changes.
#
# Usage (on the GPU machine, from the repo root):
#   lab/scripts/gpu/ksched-check.sh BIN_DIR [OUT_DIR]
# ONLY=coverage|launch|e2e runs one of the three parts.
# BIN_DIR holds libmmk_interposer.so and mmk-gate, built with
#   cargo build --release -p mmk-interposer -p mmk-kernel-sched
set -uo pipefail
bin=$(cd "${1:?usage: ksched-check.sh BIN_DIR [OUT_DIR]}" && pwd)
out=${2:-${OUT:-/tmp}}
mkdir -p "$out"
so=$bin/libmmk_interposer.so
work=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
log=$out/ksched-check.txt
results=$out/ksched-check.jsonl
: >"$results"
export PYTHONUNBUFFERED=1

say() { echo "$*" | tee -a "$log"; }
# run LABEL ENV... -- COMMAND...: one JSON line from COMMAND, tagged with LABEL
run() {
    local label=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    local line
    line=$(env "${envs[@]}" "$@" 2>>"$out/stderr.txt" | tail -1)
    say "$label $line"
    echo "{\"label\":\"$label\",\"result\":${line:-null}}" >>"$results"
}

say "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current --format=csv,noheader | tee -a "$log"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$log"

part() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }

if part coverage; then
say "== coverage: launches the interposer counted vs kernels CUPTI saw (same region)"
for w in resnet50 bert; do
    run "coverage/$w" LD_PRELOAD=$so MMK_KSCHED_STATS=$work/cov-$w.json MMK_KSCHED_RECORD=$work/trace-$w.csv -- python3 "$here/ksched-workloads.py" coverage $w $work/cupti-$w.json
    say "  stats: $(cat $work/cov-$w.json 2>/dev/null)"
    say "  diff: $(python3 "$here/ksched-coverage-diff.py" $work/trace-$w.csv $work/cupti-$w.json 2>&1 | tail -1)"
done
fi

if part launch; then
say "== per-launch cost (empty kernel, each launch call timed)"
nvcc -O2 -o $work/launch-bench "$here/launch-bench.cu" 2>>"$out/stderr.txt"
for i in 1 2 3; do
    run "launch/none" X=1 -- $work/launch-bench 100000
    run "launch/interposer" LD_PRELOAD=$so -- $work/launch-bench 100000
    run "launch/interposer+stats" LD_PRELOAD=$so MMK_KSCHED_STATS=$work/launch-stats.json -- $work/launch-bench 100000
    say "  stats: $(cat $work/launch-stats.json 2>/dev/null)"
    $bin/mmk-gate create $work/g.gate --sms 132 --policy mmk
    run "launch/interposer+gate-mmk-online" LD_PRELOAD=$so MMK_GATE=$work/g.gate MMK_JOB_CLASS=online MMK_KSCHED_STATS=$work/launch-gate.json -- $work/launch-bench 100000
    say "  stats: $(cat $work/launch-gate.json 2>/dev/null)"
done
fi

if part e2e; then
say "== end to end (median ms per iteration; alternating runs)"
$bin/mmk-gate create $work/p.gate --sms 132 --policy passthrough
$bin/mmk-gate create $work/m.gate --sms 132 --policy mmk
for round in 1 2 3; do
    for w in resnet50 bert; do
        run "time/$w/none" X=1 -- python3 "$here/ksched-workloads.py" time $w
        run "time/$w/interposer" LD_PRELOAD=$so -- python3 "$here/ksched-workloads.py" time $w
        run "time/$w/gate-passthrough" LD_PRELOAD=$so MMK_GATE=$work/p.gate MMK_JOB_CLASS=offline -- python3 "$here/ksched-workloads.py" time $w
        run "time/$w/gate-mmk-online" LD_PRELOAD=$so MMK_GATE=$work/m.gate MMK_JOB_CLASS=online -- python3 "$here/ksched-workloads.py" time $w
    done
done
say "gate totals: passthrough $($bin/mmk-gate show $work/p.gate) mmk $($bin/mmk-gate show $work/m.gate)"
fi
tail -20 "$out/stderr.txt" >>"$log" 2>/dev/null
rm -rf "$work"
