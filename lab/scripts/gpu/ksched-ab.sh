#!/usr/bin/env bash
# Coverage against CUPTI, and the interposer's end-to-end cost measured inside one process
# (interposer on vs paused, alternating blocks), for ResNet-50 inference and BERT training.
# Usage (on the GPU machine, from the repo root): lab/scripts/gpu/ksched-ab.sh BIN_DIR [OUT_DIR]
set -uo pipefail
bin=$(cd "${1:?usage: ksched-ab.sh BIN_DIR [OUT_DIR]}" && pwd)
out=${2:-${OUT:-/tmp}}
so=$bin/libmmk_interposer.so
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
export PYTHONUNBUFFERED=1
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for w in resnet50 bert; do
    echo "coverage/$w $(LD_PRELOAD=$so MMK_KSCHED_RECORD=$work/t-$w.csv python3 "$here/ksched-workloads.py" coverage $w $work/c-$w.json 2>/dev/null | tail -1)"
    echo "  diff: $(python3 "$here/ksched-coverage-diff.py" $work/t-$w.csv $work/c-$w.json | tail -1)"
done
$bin/mmk-gate create $work/p.gate --sms 132 --policy passthrough
$bin/mmk-gate create $work/m.gate --sms 132 --policy mmk
for w in resnet50 bert; do
    echo "ab/$w/interposer $(LD_PRELOAD=$so python3 "$here/ksched-workloads.py" ab $w 2>/dev/null | tail -1)"
    echo "ab/$w/gate-passthrough $(LD_PRELOAD=$so MMK_GATE=$work/p.gate MMK_JOB_CLASS=offline python3 "$here/ksched-workloads.py" ab $w 2>/dev/null | tail -1)"
    echo "ab/$w/gate-mmk-online $(LD_PRELOAD=$so MMK_GATE=$work/m.gate MMK_JOB_CLASS=online python3 "$here/ksched-workloads.py" ab $w 2>/dev/null | tail -1)"
done
} 2>&1 | tee "$out/ksched-ab.txt"
rm -rf "$work"
