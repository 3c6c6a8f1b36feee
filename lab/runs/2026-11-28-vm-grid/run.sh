#!/bin/sh
# The grid: six GPU models x checkpointable 0 / 0.5 / 1 x rates 20-240 s, 600 jobs (two
# thirds online) on 8 GPUs, held-out seeds 51-53, on equal terms (defaults otherwise).
set -eu
bin=${BIN:-mmk-lab}
for model in a100-40gb a100-80gb h100-80gb h100-94gb h200-141gb a30-24gb; do
  for c in 0 0.5 1; do
    "$bin" --output json simulate --online 400 --offline 200 --gpus 8 --gpu-model $model \
      --interval 20,40,80,160,240 --seed 51,52,53 --checkpointable $c \
      --policies default,miso,miger,mmk > $model-c$c.json 2>/dev/null
  done
done
