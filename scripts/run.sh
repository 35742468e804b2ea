#!/usr/bin/env bash
# devbuf's main job on the CPU: build, list the devices, then load a weight file into
# buffers and print the SHA-256 of every tensor. Without arguments it loads the sample model the
# build writes (build/release/sample-model.safetensors); give a .safetensors file (and any
# `devbuf load` options, such as --device SPEC) to load that instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# PoCL needs a writable kernel cache, or its device silently disappears.
export POCL_CACHE_DIR="${POCL_CACHE_DIR:-$PWD/build/pocl-cache}"
mkdir -p "$POCL_CACHE_DIR"
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEVBUF_BUILD_TESTS=OFF >/dev/null
cmake --build build/release --target devbuf_tool sample_model >build/release/build.log 2>&1 || { tail -30 build/release/build.log; exit 1; }
build/release/devbuf info
echo
if [ $# -eq 0 ]; then set -- build/release/sample-model.safetensors; fi
build/release/devbuf load --verify "$@"
