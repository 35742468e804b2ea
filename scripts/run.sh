#!/usr/bin/env bash
# devbuf's main job on the CPU: build, list the devices, run a short benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEVBUF_BUILD_TESTS=OFF >/dev/null
cmake --build build/release --target devbuf_tool >build/release/build.log 2>&1 || { tail -30 build/release/build.log; exit 1; }
build/release/devbuf info
echo
build/release/devbuf bench --quick "$@"
