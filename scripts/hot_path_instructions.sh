#!/usr/bin/env bash
# Instructions per alloc + free of the device's caching allocator (256 B, 4 KiB, 64 KiB, 1 MiB,
# 64 MiB), per buffer allocate + release (4 KiB; buffer_write: with the pointer and a one-byte
# write between, as the threads benchmark does), per queued fill of 256 B (submitted, run,
# retired) and per host task over 4 KiB waited for alone (submitted, then run and retired by
# devbuf_queue_finish), counted by callgrind: deterministic figures for the hot path, to compare two
# commits side by side (give each one's build folder). The queue's figure includes its worker thread,
# which callgrind runs interleaved with the submitter: it moves by a few instructions.
# usage: scripts/hot_path_instructions.sh [BUILD_DIR [DEVICE]]   (default build/release, after
# scripts/run.sh, and cpu). Another device (opencl:0 on PoCL) counts the allocator and buffer
# cases; a queue there runs on the driver's threads, which callgrind does not count alike.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
device=${2:-cpu}
export POCL_CACHE_DIR="${POCL_CACHE_DIR:-$PWD/build/pocl-cache}"
mkdir -p "$POCL_CACHE_DIR"
cases=("allocator 256" "allocator 4096" "allocator 65536" "allocator 1048576" "allocator 67108864"
       "buffer 4096" "buffer_write 4096")
[ "$device" = cpu ] && cases+=("queue 256" "task 4096")
command -v valgrind >/dev/null || { echo "hot_path_instructions: valgrind is not installed"; exit 1; }
[ -f "$build/libdevbuf.a" ] || { echo "hot_path_instructions: no $build/libdevbuf.a (run scripts/run.sh)"; exit 1; }
program=$(mktemp)
trap 'rm -f "$program"' EXIT
cc -O2 -std=c11 -Iinclude bench/hot_path_instructions.c "$build/libdevbuf.a" -lpthread -ldl -lm -o "$program"
instructions() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$program" "$@" 2>&1 | awk '/Collected/ {print $4}'
}
for case in "${cases[@]}"; do
  set -- $case
  base=$(instructions "$1" "$2" 50000 "$device")
  more=$(instructions "$1" "$2" 100000 "$device")
  echo "$1 $2 B: $(( (more - base) / 50000 )) instructions per cycle"
done
