#!/usr/bin/env bash
# 10,000 jobs on 128 A100-80GB, MMK alone on equal terms, with two builds of mmk-lab
# interleaved (first the build before, then the build after), and the paper's setup on
# seeds 51-53 with every policy on the build after, to check that the plans are the same.
# Usage: run.sh BEFORE_MMK_LAB AFTER_MMK_LAB
set -euo pipefail
before=$1
after=$2
out=$(dirname "$0")
for build in before after; do
    bin=${!build}
    /usr/bin/time -f "$build %e s %M KB" "$bin" simulate --online 6667 --offline 3333 \
        --interval 2.5 --gpus 128 --policies mmk --output json \
        > "$out/scale-$build.json" 2>> "$out/times.txt"
done
"$after" simulate --preset mmk-paper --interval 20,40,80,160 --seed 51,52,53 --output json \
    > "$out/paper-seeds-51-53.json"
