#!/usr/bin/env bash
# Builds the libFuzzer targets with ASan+UBSan and runs each for SECONDS (default 60),
# starting from the hostile corpus and the real files in tests/data. A crash, leak or timeout
# fails the run and leaves the input in build/fuzz/artifacts/.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=build/fuzz
CC=clang cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEVBUF_FUZZ=ON \
  -DDEVBUF_WERROR=ON -DDEVBUF_SANITIZE=address,undefined -DDEVBUF_BUILD_TESTS=OFF >"$build.configure.log" 2>&1 &&
  cmake --build "$build" --target fuzz_safetensors fuzz_dlpack fuzz_export >"$build.build.log" 2>&1 ||
  { cat "$build.configure.log" "$build.build.log" 2>/dev/null | tail -30; echo "fuzz: BUILD FAILED"; exit 1; }

mkdir -p "$build/corpus/safetensors" "$build/corpus/dlpack" "$build/corpus/export" "$build/artifacts"
cp tests/corpus/safetensors/*.safetensors "$build/corpus/safetensors/"
cp tests/data/safetensors/*/*.safetensors "$build/corpus/safetensors/" 2>/dev/null || true

status=0
for target in safetensors dlpack export; do
  echo "== fuzz_$target: ${seconds}s"
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     "$build/fuzz_$target" "$build/corpus/$target" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
       -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/artifacts/$target-" \
       >"$build/$target.log" 2>&1; then
    grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$build/$target.log" | tail -2
  else
    tail -40 "$build/$target.log"
    echo "== fuzz_$target: FAILED"
    status=1
  fi
done
exit $status
