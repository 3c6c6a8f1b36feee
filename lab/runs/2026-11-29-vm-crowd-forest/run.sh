#!/bin/sh
# The grid on the build whose forest learns crowds past their shares: six GPU models x online
# shares 10 / 30 / 50 / 70 % x checkpointable 0 / 0.5 / 1 x rates 20-240 s, 600 jobs on 8
# GPUs, held-out seeds 51-53, on equal terms (defaults otherwise). Writes M-oS-cC.json.
set -eu
bin=${BIN:-mmk-lab}
for model in a100-40gb a100-80gb h100-80gb h100-94gb h200-141gb a30-24gb; do
  for share in 10 30 50 70; do
    online=$((600 * share / 100))
    for c in 0 0.5 1; do
      "$bin" --output json simulate --online $online --offline $((600 - online)) --gpus 8 \
        --gpu-model $model --interval 20,40,80,160,240 --seed 51,52,53 --checkpointable $c \
        --policies default,miso,miger,mmk > $model-o$share-c$c.json 2>/dev/null
    done
  done
done
