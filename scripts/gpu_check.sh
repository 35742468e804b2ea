#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU (under 5 minutes): builds devbuf with
# its CUDA kernels and the tests' (nvcc), runs the conformance suite and the CUDA tests on
# cuda:0 with the real driver (and again on the stand-in driver, as every machine does),
# runs the CUDA benchmarks, and prints a short table last. The "cuda" label includes the
# embedding example on cuda:0 (test_embed_cuda_0), which needs the model in the cache
# (scripts/fetch_model.sh; the GPU machine reaches no registry, so it says it skipped
# unless the cache was filled there) and a Python with numpy, safetensors and tokenizers. Logs go to $OUT when it is set
# (the device tool), else to build/gpu/.
#   bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
build=build/gpu
logs=${OUT:-$build}
mkdir -p "$build" "$logs"
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEVBUF_WERROR=ON >"$logs/configure.log" 2>&1 ||
   ! cmake --build "$build" -j "$(nproc)" >"$logs/build.log" 2>&1; then
  tail -40 "$logs/configure.log" "$logs/build.log"
  echo "gpu_check: BUILD FAILED"
  exit 1
fi
(cd "$build" && timeout 240 ctest -L cuda --output-on-failure) >"$logs/ctest.log" 2>&1
tests_rc=$?
timeout 200 "$build/devbuf" bench --device cuda:0 --runs 5 >"$logs/bench.log" 2>&1
bench_rc=$?
"$build/devbuf" info >"$logs/info.log" 2>&1

echo
echo "---- ctest -L cuda (full log: ctest.log) ----"
grep -E "Test +#|tests passed|CHECK|returned|SKIP" "$logs/ctest.log" | head -40
echo "---- devbuf bench --device cuda:0 (exit $bench_rc) ----"
cat "$logs/bench.log"
echo "---- summary ----"
grep -E "^cuda:0" -A2 "$logs/info.log"
grep -E "tests passed" "$logs/ctest.log" || echo "no ctest summary"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
