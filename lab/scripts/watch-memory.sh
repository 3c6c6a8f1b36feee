#!/usr/bin/env bash
# mmkd's memory under watchers that never read: 200 jobs of about 255 KB each, then
# `mmkctl jobs watch --current` piped into a reader that never reads, as four users, up to
# WATCHERS in all; prints mmkd's RSS before, with them and after they close, and how many
# watches were refused.
# Runs as root; makes the users mmk-watch-a, -b, -c (group mmk-watch) and removes them.
# A lab script: it measures.
#
#   lab/scripts/watch-memory.sh BIN [WATCHERS]     # BIN: a folder with mmkd and mmkctl
set -euo pipefail
BIN=$(realpath "$1")
WATCHERS=${2:-100}
W=$(mktemp -d)
chmod 755 "$W"
PIDS=()
users=(root mmk-watch-a mmk-watch-b mmk-watch-c)
cleanup() {
    set +e
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    pkill -f "mmkctl --socket $W/mmkd.sock" 2>/dev/null
    [ -n "${MMKD:-}" ] && kill "$MMKD" 2>/dev/null && wait "$MMKD" 2>/dev/null
    for u in "${users[@]:1}"; do userdel "$u" 2>/dev/null; done
    groupdel mmk-watch 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT
groupadd -f mmk-watch
for u in "${users[@]:1}"; do id "$u" >/dev/null 2>&1 || useradd -M -N -g mmk-watch "$u"; done

"$BIN/mmkd" --backend sim --sim-gpus a100-80gb:1 --kernel-policy off --metrics off \
    --socket "$W/mmkd.sock" --socket-group mmk-watch --data-dir "$W/data" > "$W/mmkd.log" 2>&1 &
MMKD=$!
for _ in $(seq 100); do [ -S "$W/mmkd.sock" ] && break; sleep 0.1; done
rss() { awk '/VmRSS/ {print $2 / 1024 " MiB"}' "/proc/$MMKD/status"; }

# 200 jobs (one at a time on the GPU), each with 4 x 63 KB of arguments.
arg=$(head -c 64000 /dev/zero | tr '\0' x)
printf 'name: big\ngpu_memory: 70GiB\ncommand:\n  args: [/bin/true, %s, %s, %s, %s]\n' \
    "$arg" "$arg" "$arg" "$arg" > "$W/big.yaml"
chmod 644 "$W/big.yaml"
for _ in $(seq 200); do
    "$BIN/mmkctl" --socket "$W/mmkd.sock" submit --offline "$W/big.yaml" > /dev/null
done
echo "after 200 jobs: mmkd RSS $(rss)"

for i in $(seq "$WATCHERS"); do
    u=${users[$((i % 4))]}
    # The reader never reads: mmkctl blocks on its output and stops reading the stream.
    (cd / && runuser -u "$u" -- "$BIN/mmkctl" --socket "$W/mmkd.sock" jobs watch --current \
        --output json 2>> "$W/refused.txt" | sleep 600) &
    PIDS+=($!)
done
sleep 20
echo "after $WATCHERS watchers that never read (20 s): mmkd RSS $(rss)"
echo "watches refused: $(grep -c 'watches open' "$W/refused.txt" || true)"

# The watchers go: what their streams took is given back.
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
pkill -f "mmkctl --socket $W/mmkd.sock" 2>/dev/null || true
PIDS=()
sleep 10
echo "10 s after the watchers closed: mmkd RSS $(rss)"
