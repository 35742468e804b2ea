#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU (about 5 minutes; each step has its own
# limit): builds devbuf with its CUDA kernels and the tests' (nvcc), runs the conformance
# suite and the CUDA tests on cuda:0 with the real driver (and again on the stand-in
# driver, as every machine does),
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
# The real driver only: a DEVBUF_CUDA_LIBRARY left over from a shell that ran the tests would
# point the "real" run at the stand-in driver, which passes without a GPU.
unset DEVBUF_CUDA_LIBRARY
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1
# The kernels are built by this nvcc: a driver older than its CUDA version rejects them
# (UNSUPPORTED_PTX_VERSION), which reads as a kernel failure below.
echo "nvcc: $(nvcc --version 2>&1 | grep -m1 -o 'release [0-9.]*'); the driver's CUDA version: \
$(nvidia-smi 2>/dev/null | grep -m1 -o 'CUDA Version: [0-9.]*')"
# Ninja where there is one; the default generator elsewhere.
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if ! cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDEVBUF_WERROR=ON >"$logs/configure.log" 2>&1 ||
   ! cmake --build "$build" -j "$(nproc)" >"$logs/build.log" 2>&1; then
  tail -40 "$logs/configure.log" "$logs/build.log"
  echo "gpu_check: BUILD FAILED"
  exit 1
fi
export POCL_CACHE_DIR="${POCL_CACHE_DIR:-$PWD/$build/pocl-cache}"
mkdir -p "$POCL_CACHE_DIR"
# The real driver's tests one by one, each under its own limit, so that a hang names its
# case and leaves the others their time; a skip (no driver, cuInit failing, an entry point
# missing) fails the check: it would otherwise pass without touching the GPU.
tests_rc=0
: >"$logs/real.log"
for args in "test_conformance cuda:0" "test_cuda" "test_cuda --fault"; do
  log="$logs/$(echo "$args" | tr -c 'a-z0-9\n' _).log"
  timeout 90 stdbuf -oL "$build/tests/"$args >"$log" 2>&1
  rc=$?
  case $rc in
  0) if grep -q -i "fake" "$log"; then result="FAILED: ran on the stand-in driver: $(grep -m1 '^on ' "$log")"; rc=1
     else result="passed"; fi ;;
  77) result="SKIPPED: $(grep -m1 SKIP "$log")" ;;
  124) result="HUNG: killed after 90 s; its last line (a case prints once it ends): $(tail -1 "$log")" ;;
  *) result="FAILED (exit $rc): $(grep -m3 -E "CHECK|FAIL" "$log" | tr '\n' ' ')" ;;
  esac
  [ "$rc" -eq 0 ] || tests_rc=1
  echo "$args: $result" >>"$logs/real.log"
done
(cd "$build" && timeout 150 ctest -L cuda -E '^(conformance_cuda|test_cuda|test_cuda_fault)$' \
  --output-on-failure) >"$logs/ctest.log" 2>&1 || tests_rc=1
timeout 150 "$build/devbuf" bench --device cuda:0 --runs 5 >"$logs/bench.log" 2>&1
bench_rc=$?
# A section that says it skipped (no copy figures, no weight file) leaves the GPU unmeasured.
grep -qE "^== .*skipped" "$logs/bench.log" && bench_rc=1
"$build/devbuf" info >"$logs/info.log" 2>&1

echo
echo "---- the real driver: conformance and test_cuda (logs: test_*.log) ----"
cat "$logs/real.log"
echo "---- ctest -L cuda, the rest: the stand-in driver, the model (full log: ctest.log) ----"
grep -E "Test +#|tests passed|CHECK|returned|SKIP" "$logs/ctest.log" | head -40
echo "---- devbuf bench --device cuda:0 (exit $bench_rc) ----"
cat "$logs/bench.log"
echo "---- summary ----"
grep -E "^cuda:0" -A2 "$logs/info.log"
grep -E "tests passed" "$logs/ctest.log" || echo "no ctest summary"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
