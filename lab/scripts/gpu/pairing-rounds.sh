#!/bin/sh
# The kernel scheduler's effect per pairing: for each SERVICE:TRAINING pair, plain MPS
# against mmkd's defaults with the SLO control off (`mmk-noslo`), in interleaved rounds
# after three alone runs (lab/scripts/gpu/slo-rounds.py, the protocol of
# docs/colocation.md), then each pair's record cut to the layout the simulator reads
# (lab/scripts/gpu/slo-to-rounds.py).
#
# Usage, on the GPU machine from the repo root, as root:
#   lab/scripts/gpu/pairing-rounds.sh BIN OUT SERVICE:TRAINING [SERVICE:TRAINING ...]
# SERVICE: resnet50, bert or llm (graph services); TRAINING: bert or resnet152.
# ROUNDS (2), WINDOW (5 s), LOAD (0.25), ALONE (12) and CONFIGS (mps,mmk-noslo; see
# slo-rounds.py) in the environment change the run.
# Writes OUT/SERVICE-TRAINING.json (the whole record) and OUT/SERVICE-TRAINING.rounds.json
# per pair; a pair cut short keeps the runs it finished.
set -eu
bin=$1 out=$2
shift 2
mkdir -p "$out"
here=$(dirname "$0")
for pair in "$@"; do
    service=${pair%%:*} training=${pair#*:}
    name=$service-$training
    work=$(mktemp -d)
    python3 "$here/slo-rounds.py" "$bin" "$work" --service "$service" --training "$training" \
        --configs "${CONFIGS:-mps,mmk-noslo}" --rounds "${ROUNDS:-2}" --seconds "${WINDOW:-5}" --warm 8 \
        --load "${LOAD:-0.25}" --alone-seconds "${ALONE:-12}" --noisy-ok || true
    if [ -f "$work/slo-rounds.json" ]; then
        cp "$work/slo-rounds.json" "$out/$name.json"
        python3 "$here/slo-to-rounds.py" "$work/slo-rounds.json" > "$out/$name.rounds.json"
    fi
    rm -rf "$work"
done
