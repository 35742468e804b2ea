#!/usr/bin/env bash
# Each precondition a test needs, removed in turn: the test must say why it skips and exit
# with the skip code (77), never fail or crash. Usage: check_skips.sh TESTS_FOLDER PYTHON
set -uo pipefail
tests=$1
python=$2
failures=0

# expect_skip NAME COMMAND...: runs COMMAND, which must exit 77 and print "SKIP: <reason>".
expect_skip() {
  local name=$1
  shift
  local output status
  output=$("$@" 2>&1)
  status=$?
  local reason
  reason=$(printf '%s\n' "$output" | grep -m1 '^SKIP: ..*')
  if [ "$status" -eq 77 ] && [ -n "$reason" ]; then
    echo "ok   $name: $reason"
  else
    echo "FAIL $name: exit $status, output: $(printf '%s' "$output" | tail -3)"
    failures=$((failures + 1))
  fi
}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
missing=$scratch/no-such-folder
for test in test_safetensors test_mapped test_dlpack; do
  expect_skip "$test without tests/data" env DEVBUF_TESTDATA="$missing" "$tests/$test"
done
expect_skip "test_opencl without a driver" env DEVBUF_OPENCL_LIBRARY="$missing/libOpenCL.so.1" "$tests/test_opencl"
expect_skip "conformance on opencl:0 without a driver" env DEVBUF_OPENCL_LIBRARY="$missing/libOpenCL.so.1" \
  "$tests/test_conformance" opencl:0
expect_skip "conformance on cuda:0 without a driver" env DEVBUF_CUDA_LIBRARY="$missing/libcuda.so.1" \
  "$tests/test_conformance" cuda:0
expect_skip "test_cuda without a driver" env DEVBUF_CUDA_LIBRARY="$missing/libcuda.so.1" "$tests/test_cuda"
expect_skip "test_opencl_no_platform without an ICD loader" env DEVBUF_OPENCL_LIBRARY="$missing/libOpenCL.so.1" \
  "$tests/test_opencl" --expect-unavailable "found no platform"
# Python without numpy and safetensors: an isolated interpreter that sees no site packages.
expect_skip "test_interop without numpy" env PYTHONNOUSERSITE=1 "$python" -S -I \
  "$(dirname "$0")/../python/test_interop.py" "$tests/../libdevbuf.so" "$scratch"
echo "$failures failures"
[ "$failures" -eq 0 ]
