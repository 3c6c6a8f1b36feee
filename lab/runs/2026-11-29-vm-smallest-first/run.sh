#!/bin/sh
# MMK alone on the grid of ../2026-11-28-vm-holds/run.sh (six GPU models x online 10-70 %
# x checkpointable 0 / 0.5 / 1 x 20-240 s, 600 jobs on 8 GPUs, held-out seeds 51-53), then
# merged with the baselines' runs of ../2026-11-29-vm-past-shares (the baselines' plans
# do not depend on MMK's rules) into M-oS-cC.json, which ../2026-11-28-vm-holds/grid.py
# reads. Writes mmk/M-oS-cC.json and M-oS-cC.json; with MERGE_ONLY=1, only the merged
# files, from mmk/ (the record keeps mmk/ and not the merged copies).
set -eu
bin=${BIN:-mmk-lab}
mkdir -p mmk
for model in a100-40gb a100-80gb h100-80gb h100-94gb h200-141gb a30-24gb; do
  for share in 10 30 50 70; do
    online=$((600 * share / 100))
    for c in 0 0.5 1; do
      if [ -z "${MERGE_ONLY:-}" ]; then
        "$bin" --output json simulate --online $online --offline $((600 - online)) --gpus 8 \
          --gpu-model $model --interval 20,40,80,160,240 --seed 51,52,53 --checkpointable $c \
          --policies mmk > mmk/$model-o$share-c$c.json 2>/dev/null
      fi
      python3 merge.py ../2026-11-29-vm-past-shares/$model-o$share-c$c.json \
        mmk/$model-o$share-c$c.json > $model-o$share-c$c.json
    done
  done
done
