#!/usr/bin/env bash
# Builds the libFuzzer targets (every fuzz/fuzz_*.c) with ASan+UBSan and runs each for
# SECONDS (default 60), starting from the hostile corpus and the real files in tests/data.
# A crash, leak or timeout fails the run and leaves the input in build/fuzz/artifacts/.
# Prints "== fuzz_NAME: passed" or "== fuzz_NAME: FAILED" for each (scripts/test.sh counts them).
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=build/fuzz
targets=()
for source in fuzz/fuzz_*.c; do targets+=("$(basename "$source" .c)"); done
mkdir -p build
CC=clang cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEVBUF_FUZZ=ON \
  -DDEVBUF_WERROR=ON -DDEVBUF_SANITIZE=address,undefined -DDEVBUF_BUILD_TESTS=OFF >"$build.configure.log" 2>&1 &&
  cmake --build "$build" --target "${targets[@]}" >"$build.build.log" 2>&1 ||
  { cat "$build.configure.log" "$build.build.log" 2>/dev/null | tail -30; echo "fuzz: BUILD FAILED"; exit 1; }

mkdir -p "$build/artifacts"
for target in "${targets[@]}"; do mkdir -p "$build/corpus/${target#fuzz_}"; done
cp tests/corpus/safetensors/*.safetensors "$build/corpus/safetensors/"
cp tests/data/safetensors/*/*.safetensors "$build/corpus/safetensors/" 2>/dev/null || true
# Snapshot-shaped and hostile pickles, and the start of a real snapshot (within -max_len).
cp tests/corpus/snapshot/*.pickle "$build/corpus/snapshot/"
for real in tests/data/snapshots/*/*.pickle; do
  [[ -f "$real" ]] && head -c 60000 "$real" >"$build/corpus/snapshot/truncated_$(basename "$real")"
done
# The start of each real trace, behind first bytes that pick 4 KiB, 2 MiB, growable, a limit
# of 22 MiB and the model of PyTorch's allocator; and the hostile traces.
cp tests/corpus/trace/*.trace "$build/corpus/trace/"
for real in tests/data/traces/*/*.trace; do
  for choice in 00 02 06 4a 20; do
    { printf "\\x$choice"; head -c 20000 "$real"; } >"$build/corpus/trace/${choice}_$(basename "$real")"
  done
done

status=0
for target in "${targets[@]}"; do
  name=${target#fuzz_}
  echo "== $target: ${seconds}s"
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     "$build/$target" "$build/corpus/$name" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
       -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/artifacts/$name-" \
       >"$build/$name.log" 2>&1; then
    grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$build/$name.log" | tail -2
    echo "== $target: passed"
  else
    tail -40 "$build/$name.log"
    echo "== $target: FAILED"
    status=1
  fi
done
exit $status
