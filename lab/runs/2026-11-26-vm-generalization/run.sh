#!/bin/bash
# MMK against the baselines on setups no test or tuning uses (issue: "other online shares,
# other GPU models, clusters of 8 to 128 GPUs"). Usage: run.sh MMKCTL [CASE...]
# Each case writes CASE.json (mmkctl simulate --output json) and CASE.err here.
set -u
MMKCTL=$1; shift
# OUT=DIR writes there instead (another build's sweeps; summarize.py reads them with RUNS_DIR).
HERE=${OUT:-$(cd "$(dirname "$0")" && pwd)}
SEEDS=1,2,3
declare -A SEEDS_OF=([gpus128]=1)
run() {  # name, then mmkctl simulate flags
    local name=$1; shift
    [ -s "$HERE/$name.json" ] && return
    /usr/bin/time -f "%e s" "$MMKCTL" simulate --seed "${SEEDS_OF[$name]:-$SEEDS}" --output json "$@" \
        > "$HERE/$name.json.tmp" 2> "$HERE/$name.err" && mv "$HERE/$name.json.tmp" "$HERE/$name.json"
}
# The paper's job count per GPU (150) and its 8-GPU arrival rates, 2/3 online.
PAPER="--online 800 --offline 400 --interval 20,40,80,160"
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(h100 h200 a100-40gb a30 online10 online50 online90 gpus32 gpus128)
for c in "${cases[@]}"; do
    case $c in
        h100) run h100 $PAPER --gpu-model h100-80gb ;;
        h200) run h200 $PAPER --gpu-model h200-141gb ;;
        a100-40gb) run a100-40gb $PAPER --gpu-model a100-40gb ;;
        a30) run a30 $PAPER --gpu-model a30-24gb ;;
        # 1,200 jobs on 8 A100-80GB with 10, 50 and 90 % of them online.
        online10) run online10 --online 120 --offline 1080 --interval 20,40,80,160 ;;
        online50) run online50 --online 600 --offline 600 --interval 20,40,80,160 ;;
        online90) run online90 --online 1080 --offline 120 --interval 20,40,80,160 ;;
        # The paper's load per GPU on larger clusters (arrivals scaled with the GPUs).
        gpus32) run gpus32 --online 3200 --offline 1600 --interval 5,10,20,40 --gpus 32 ;;
        gpus128) run gpus128 --online 6667 --offline 3333 --interval 2.5,5,10 --gpus 128 ;;
        *) echo "unknown case $c" >&2 ;;
    esac
done
