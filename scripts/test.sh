#!/usr/bin/env bash
# The whole test suite: gcc and clang builds with -Werror, every test; again under
# ASan+UBSan; the concurrency tests and the CUDA backend on its stand-in driver under TSan;
# a gcc Debug build (built only); each fuzzer for a minute. Prints each suite's build and test seconds as it goes, and one
# summary line at the end.
#   scripts/test.sh           everything (20 minutes and more)
#   scripts/test.sh --quick   one gcc Release build with -Werror and its tests, no
#                             sanitizers, no fuzzers, not pip install (a few minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  -h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
scripts/setup.sh || exit 1
# PoCL needs a writable kernel cache, or its device silently disappears.
export POCL_CACHE_DIR="${POCL_CACHE_DIR:-$PWD/build/pocl-cache}"
mkdir -p "$POCL_CACHE_DIR"
scripts/python_env.sh

passed=0
failed=0
skipped=0
log_dir=build/logs
mkdir -p "$log_dir"
times=() # "name: build N s, test N s", one per suite, for the summary

# suite NAME CC SANITIZE BUILD_TYPE [ctest args...]
suite() {
  local name=$1 cc=$2 sanitize=$3 build_type=$4
  shift 4
  echo "== $name: build"
  # The sanitizer suites also run the debug validators (DEVBUF_DEBUG_CHECKS).
  local debug_checks=OFF
  [ -n "$sanitize" ] && debug_checks=ON
  local start=$SECONDS
  if ! CC=$cc cmake -S . -B "build/$name" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" \
      -DDEVBUF_SANITIZE="$sanitize" -DDEVBUF_DEBUG_CHECKS=$debug_checks -DDEVBUF_WERROR=ON >"$log_dir/$name.configure" 2>&1 ||
     ! cmake --build "build/$name" >"$log_dir/$name.build" 2>&1; then
    cat "$log_dir/$name.configure" "$log_dir/$name.build" 2>/dev/null | tail -40
    echo "== $name: BUILD FAILED after $((SECONDS - start)) s"
    times+=("$name: build failed after $((SECONDS - start)) s")
    failed=$((failed + 1))
    return
  fi
  local built=$((SECONDS - start))
  echo "== $name: built in $built s; test"
  start=$SECONDS
  (cd "build/$name" && ctest --output-on-failure "$@") | tee "$log_dir/$name.test" | grep -E "tests passed|Failed|\*\*\*|Skipped|SKIP" || true
  local tested=$((SECONDS - start))
  echo "== $name: tested in $tested s"
  times+=("$name: build $built s, test $tested s")
  local line
  line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$log_dir/$name.test" | tail -1)
  if [ -z "$line" ]; then
    echo "== $name: no ctest summary"
    failed=$((failed + 1))
    return
  fi
  local bad total skip
  bad=$(echo "$line" | sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/')
  total=$(echo "$line" | sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/')
  skip=$(grep -cE "\*\*\*Skipped|Not Run.*Skipped" "$log_dir/$name.test" || true)
  passed=$((passed + total - bad - skip))
  failed=$((failed + bad))
  skipped=$((skipped + skip))
}

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

if [ "$quick" -eq 1 ]; then
  # test_pip_install builds the whole library again inside pip: the full run has it.
  suite gcc gcc "" Release -E '^test_pip_install$'
else
  suite gcc gcc "" Release
  suite clang clang "" RelWithDebInfo
  suite asan gcc "address,undefined" RelWithDebInfo
  suite tsan gcc "thread" RelWithDebInfo -L "concurrency|fake_cuda"

  # A gcc Debug build with -Werror, built and not run: at -O0 gcc warns where its optimizers
  # know more (a format truncation in examples/embed did), and users build Debug. It counts
  # as one passed, or one failed.
  start=$SECONDS
  echo "== gcc-debug: build"
  if CC=gcc cmake -S . -B build/gcc-debug -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDEVBUF_WERROR=ON \
       >"$log_dir/gcc-debug.configure" 2>&1 && cmake --build build/gcc-debug >"$log_dir/gcc-debug.build" 2>&1; then
    passed=$((passed + 1))
    echo "== gcc-debug: built in $((SECONDS - start)) s"
  else
    cat "$log_dir/gcc-debug.configure" "$log_dir/gcc-debug.build" 2>/dev/null | tail -40
    echo "== gcc-debug: BUILD FAILED after $((SECONDS - start)) s"
    failed=$((failed + 1))
  fi
  times+=("gcc-debug: build $((SECONDS - start)) s")

  # The fuzzers of the parsers of untrusted input (fuzz/fuzz_*.c), DEVBUF_FUZZ_SECONDS each
  # (60 by default): each one that ran and passed counts as passed, each that failed or did
  # not run as failed.
  start=$SECONDS
  scripts/fuzz.sh "${DEVBUF_FUZZ_SECONDS:-60}" | tee "$log_dir/fuzz.log"
  fuzzers=$(ls fuzz/fuzz_*.c | wc -l)
  fuzz_passed=$(grep -cE '^== fuzz_[a-z_0-9]+: passed' "$log_dir/fuzz.log" || true)
  fuzz_failed=$(grep -cE '^== fuzz_[a-z_0-9]+: FAILED' "$log_dir/fuzz.log" || true)
  not_run=$((fuzzers - fuzz_passed - fuzz_failed))
  [ "$not_run" -gt 0 ] && echo "== fuzz: $not_run of $fuzzers fuzzers did not run"
  passed=$((passed + fuzz_passed))
  failed=$((failed + fuzz_failed + (not_run > 0 ? not_run : 0)))
  times+=("fuzz: $fuzz_passed of $fuzzers fuzzers passed in $((SECONDS - start)) s (build included)")
fi

echo
printf '%s\n' "${times[@]}"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
