#!/usr/bin/env bash
# The GPU profiling dataset (issue 9, docs/measure.md), on the GPU machine, from the repo root:
#   lab/scripts/gpu/measure.sh BIN_DIR OUT_DIR alone|pairs|repeat|groups|kernels|deep [RESUME_FROM.jsonl]
# BIN_DIR holds a release mmk-lab (and libmmk_interposer.so for kernels). Starts one MPS
# control daemon with private pipe and log directories, runs `mmk-lab measure` on
# lab/scripts/gpu/measure-plan.yaml for that part of the plan (repeat:
# lab/scripts/gpu/measure-repeat.yaml, a second measurement alone; groups:
# lab/scripts/gpu/measure-groups.yaml, three jobs side by side, or the plan in $GROUPS_PLAN),
# and quits the daemon;
# changes no other GPU setting. kernels and deep (every job alone at 100 %, under the
# interposer's record mode or under ncu with --clock-control none) need no MPS daemon and
# start none. With RESUME_FROM, the runs in it are kept and only the others are measured.
set -u
bin=$(realpath "$1"); out=$(realpath "$2"); part=$3; from=${4:-}
if [ "$part" != kernels ] && [ "$part" != deep ]; then
  mps=$(mktemp -d /tmp/mmk-measure-mps.XXXXXX)
  mkdir -p "$mps/pipe" "$mps/log"
  export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
  nvidia-cuda-mps-control -d || { echo "cannot start the MPS control daemon" >&2; exit 1; }
  trap 'echo quit | nvidia-cuda-mps-control; sleep 1' EXIT
fi
raw=$out/raw-$part.jsonl
resume=()
if [ -n "$from" ]; then cp "$from" "$raw"; chmod u+w "$raw"; resume=(--resume); fi
nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current,clocks.max.sm --format=csv >"$out/gpu-$part.csv"
if [ "$part" = repeat ]; then
  "$bin/mmk-lab" measure lab/scripts/gpu/measure-repeat.yaml -o "$raw" "${resume[@]}"
elif [ "$part" = groups ]; then
  "$bin/mmk-lab" measure "${GROUPS_PLAN:-lab/scripts/gpu/measure-groups.yaml}" -o "$raw" "${resume[@]}"
elif [ "$part" = kernels ]; then
  "$bin/mmk-lab" measure lab/scripts/gpu/measure-plan.yaml -o "$raw" --only kernels \
    --interposer "$bin/libmmk_interposer.so" "${resume[@]}"
elif [ "$part" = deep ]; then
  "$bin/mmk-lab" measure lab/scripts/gpu/measure-plan.yaml -o "$raw" --only deep \
    --ncu-launches "${NCU_LAUNCHES:-200}" "${resume[@]}"
else
  "$bin/mmk-lab" measure lab/scripts/gpu/measure-plan.yaml -o "$raw" --only "$part" "${resume[@]}"
fi
rc=$?
exit $rc
