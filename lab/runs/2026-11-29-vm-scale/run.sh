#!/usr/bin/env bash
# 10,000 jobs on 128 A100-80GB, MMK alone on equal terms, with two builds of mmk-lab
# interleaved over ROUNDS rounds (in each, first the build before, then the build after;
# this VM's speed drifts by up to a fifth between hours, so only runs of one round compare),
# then the paper's setup on seeds 51-53 with every policy on the build after, to check that
# the plans are the same.
# Usage: run.sh BEFORE_MMK_LAB AFTER_MMK_LAB [ROUNDS [OUT]] (OUT: this folder by default)
set -euo pipefail
before=$1
after=$2
rounds=${3:-3}
out=${4:-$(dirname "$0")}
: > "$out/times.txt"
for round in $(seq "$rounds"); do
    for build in before after; do
        bin=${!build}
        /usr/bin/time -f "round $round $build %e s %M KB" "$bin" simulate --online 6667 \
            --offline 3333 --interval 2.5 --gpus 128 --policies mmk --output json \
            > "$out/scale-$build.json" 2>> "$out/times.txt"
    done
done
"$after" simulate --preset mmk-paper --interval 20,40,80,160 --seed 51,52,53 --output json \
    > "$out/paper-seeds-51-53.json"
