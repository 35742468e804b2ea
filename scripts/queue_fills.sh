#!/usr/bin/env bash
# Queued 256-byte fills on a process's first queue (bench/queue_fills.c), for each build folder
# given, alternating build by build ROUNDS times: the machine's speed drifts, so two builds are
# compared within one call. ns per item, submitted then finished; medians of 9 runs each.
# usage: scripts/queue_fills.sh BUILD_DIR [BUILD_DIR ...]   (ROUNDS=3 by default; after
# scripts/run.sh, build/release is one)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/queue_fills.sh BUILD_DIR [BUILD_DIR ...]"; exit 2; }
rounds=${ROUNDS:-3}
programs=()
trap 'rm -f "${programs[@]}"' EXIT
for build in "$@"; do
  [ -f "$build/libdevbuf.a" ] || { echo "queue_fills: no $build/libdevbuf.a"; exit 1; }
  program=$(mktemp)
  programs+=("$program")
  cc -O2 -std=c11 -Iinclude bench/queue_fills.c "$build/libdevbuf.a" -lpthread -ldl -lm -o "$program"
done
for round in $(seq "$rounds"); do
  for i in "${!programs[@]}"; do
    echo "round $round, ${@:i+1:1}: $("${programs[$i]}")"
  done
done
