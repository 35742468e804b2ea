#!/usr/bin/env bash
# Installs the build into a scratch prefix, then checks what a user gets: only devbuf_
# symbols exported, no backend built for the tests only, find_package(devbuf) for both
# libraries, and pkg-config.
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build_dir" --prefix "$scratch/prefix" >/dev/null
libdir=$(ls -d "$scratch"/prefix/lib*/ | head -1)

exported=$(nm -D --defined-only "$libdir/libdevbuf.so" | awk '$2 == "T" || $2 == "D" || $2 == "B" {print $3}')
stray=$(echo "$exported" | grep -v '^devbuf_' || true)
if [ -n "$stray" ]; then echo "exported symbols outside the API: $stray"; exit 1; fi
echo "$exported" | grep -qx devbuf_buffer_new || { echo "devbuf_buffer_new is not exported"; exit 1; }
echo "exports: $(echo "$exported" | wc -l) devbuf_ symbols, nothing else"

# The installed tool finds the installed library by itself and holds no path of the build.
tool="$scratch/prefix/bin/devbuf"
env -u LD_LIBRARY_PATH "$tool" info >"$scratch/info" || { echo "the installed devbuf does not run"; exit 1; }
# The tests' null backend is never installed: not in either library, not among the kinds.
for library in "$libdir/libdevbuf.so" "$libdir/libdevbuf.a"; do
  if nm "$library" 2>/dev/null | grep -q devbuf__backend_null; then
    echo "$library holds the null backend, which is for the tests only"
    exit 1
  fi
done
if grep -q '^null' "$scratch/info"; then echo "the installed devbuf lists the null backend"; exit 1; fi
grep -q '^cpu ' "$scratch/info" || { echo "devbuf info lists no cpu: $(cat "$scratch/info")"; exit 1; }
echo "installed: no test backend in the libraries or among the kinds"
# (Debug information may name where it was compiled; what the program reads may not.)
objcopy --strip-debug "$tool" "$scratch/tool-without-debug-info"
if grep -qF "$(cd "$build_dir" && pwd)" "$scratch/tool-without-debug-info"; then
  echo "the installed devbuf names the build folder"
  exit 1
fi
echo "installed tool: runs from its prefix, no build-tree path in it"

cmake -S "$source_dir" -B "$scratch/consumer" -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/consumer" >/dev/null
LD_LIBRARY_PATH="$libdir" "$scratch/consumer/consumer_shared"
"$scratch/consumer/consumer_static"
echo "find_package(devbuf): shared and static consumers run"

if command -v pkg-config >/dev/null; then
  flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs devbuf)
  cc "$source_dir/consumer.c" $flags -o "$scratch/consumer_pc"
  LD_LIBRARY_PATH="$libdir" "$scratch/consumer_pc"
  echo "pkg-config: consumer runs"
else
  echo "pkg-config: not installed, that part not checked"
fi
