#!/bin/bash
# MMK on its rules (none) and four lab variants (variants.patch applied to 864e7df):
# A, an online job passes the online shares under a long queue too; B, an online job joins
# a partition of two jobs or more whose shares add up to 100 % or more only where every
# online job there keeps its SLO with 30 % to spare; A+B; A2h, A with GPUs held for
# offline jobs past 2 h (not 3 h). Held-out seeds only: twelve overloaded-to-medium cells of the
# grid (4 GPU models x 30/50/70 % online, checkpointable 0.5, 20/40/80 s, seeds 51-53),
# the paper's setup (seeds 51-53) and the 20-job traces (seeds 61-70). The baselines and
# the reference schedules these are read against are in the earlier records (compare.py).
#   BIN=<mmk-lab built with variants.patch> bash run.sh
set -euo pipefail
bin=${BIN:-mmk-lab}
for variant in ${VARIANTS:-none A B AB A2h}; do
  unset MMK_LAB_PAST_SHARES_UNDER_QUEUE MMK_LAB_CROWD_MARGIN MMK_LAB_RESERVE_AFTER_H
  case $variant in *A*) export MMK_LAB_PAST_SHARES_UNDER_QUEUE=1;; esac
  case $variant in *B*) export MMK_LAB_CROWD_MARGIN=1;; esac
  case $variant in *2h) export MMK_LAB_RESERVE_AFTER_H=2;; esac
  for model in a100-40gb a100-80gb h100-80gb a30-24gb; do
    for share in 30 50 70; do
      online=$((600 * share / 100))
      "$bin" --output json simulate --online $online --offline $((600 - online)) --gpus 8 \
        --gpu-model $model --interval 20,40,80 --seed 51,52,53 --checkpointable 0.5 \
        --policies mmk > $variant-$model-o$share.json 2>/dev/null
    done
  done
  "$bin" --output json simulate --preset mmk-paper --interval 20,40,80,160 --seed 51,52,53 \
    --policies mmk > $variant-paper.json 2>/dev/null
  "$bin" --output json simulate --online 14 --offline 6 --gpus 2 --interval 20,40,80,160 \
    --seed 61,62,63,64,65,66,67,68,69,70 --policies mmk > $variant-twenty-jobs.json 2>/dev/null
done
# The 20-job traces with the ground truth as MMK's model, MMK on its rules.
unset MMK_LAB_PAST_SHARES_UNDER_QUEUE MMK_LAB_CROWD_MARGIN MMK_LAB_RESERVE_AFTER_H
"$bin" --output json simulate --online 14 --offline 6 --gpus 2 --interval 20,40,80,160 \
  --seed 61,62,63,64,65,66,67,68,69,70 --policies mmk --model analytic > oracle-twenty-jobs.json 2>/dev/null
