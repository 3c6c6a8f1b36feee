#!/usr/bin/env bash
# A second check of the measured truth's rule for several co-runners, on the GPU machine,
# from the repo root:   lab/scripts/gpu/measure-groups-check.sh BIN_DIR OUT_DIR
# Groups of three at new splits with each job alone (measure-groups-2.yaml) into
# OUT_DIR/three/raw-groups.jsonl, then groups of four (measure-groups-4.yaml) into
# OUT_DIR/four/raw-groups.jsonl, each by lab/scripts/gpu/measure.sh (one MPS control daemon
# with private directories per part, quit after it; no other GPU setting changes).
set -u
bin=$1; out=$2
mkdir -p "$out/three" "$out/four"
GROUPS_PLAN=lab/scripts/gpu/measure-groups-2.yaml lab/scripts/gpu/measure.sh "$bin" "$out/three" groups
rc3=$?
GROUPS_PLAN=lab/scripts/gpu/measure-groups-4.yaml lab/scripts/gpu/measure.sh "$bin" "$out/four" groups
rc4=$?
echo "three: exit $rc3, four: exit $rc4"
[ "$rc3" = 0 ] && [ "$rc4" = 0 ]
