#!/usr/bin/env bash
# Installs what building and testing devbuf needs, when it is missing (Debian/Ubuntu, as
# root or through sudo). Safe to run again: it does nothing when all is there.
set -euo pipefail

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v gcc >/dev/null || need+=(gcc)
command -v clang >/dev/null || need+=(clang)
command -v python3 >/dev/null || need+=(python3)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v python3 >/dev/null && ! python3 -c "import venv, ensurepip" 2>/dev/null && need+=(python3-venv)
# clang's libFuzzer runtime
if command -v clang >/dev/null; then
  clang -print-file-name=libclang_rt.fuzzer-x86_64.a | grep -q / || need+=(libclang-rt-14-dev)
fi
# OpenCL on the CPU (PoCL) and the ICD loader, for the OpenCL backend's tests
if [ ! -e /etc/OpenCL/vendors/pocl.icd ] || ! ldconfig -p 2>/dev/null | grep -q 'libOpenCL.so.1 '; then
  need+=(pocl-opencl-icd ocl-icd-libopencl1)
fi
# gcc's sanitizer runtimes (ASan, UBSan, TSan)
if command -v gcc >/dev/null; then
  for lib in libasan.so libubsan.so libtsan.so; do
    gcc -print-file-name="$lib" | grep -q / || { need+=(libgcc-12-dev); break; }
  done
fi

if [ ${#need[@]} -eq 0 ]; then exit 0; fi
echo "setup: installing ${need[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${need[@]}" >/dev/null
