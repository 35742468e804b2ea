#!/usr/bin/env bash
# Installs what building and testing devbuf needs, when it is missing, on Debian and Ubuntu
# (Debian 12 and 13, Ubuntu 22.04 and 24.04 checked by name): as root, or through sudo.
# Packages that follow a compiler's version (its sanitizer and fuzzer runtimes) are chosen
# for the compilers installed. Safe to run again: it does nothing when all is there.
# Without root and without sudo it prints what is missing and the command that installs it.
set -euo pipefail

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v gcc >/dev/null || need+=(gcc)
command -v clang >/dev/null || need+=(clang)
command -v python3 >/dev/null || need+=(python3)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v readelf >/dev/null || need+=(binutils)
command -v python3 >/dev/null && ! python3 -c "import venv, ensurepip" 2>/dev/null && need+=(python3-venv)
# Python's headers, for the Python package's C module.
command -v python3 >/dev/null && ! python3 -c "import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" 2>/dev/null &&
  need+=(python3-dev)

have_apt=0
command -v apt-get >/dev/null && command -v apt-cache >/dev/null && have_apt=1

# The first of the candidate packages that the archive knows (apt-cache), else the first.
first_known() {
  if [ "$have_apt" -eq 1 ]; then
    for name in "$@"; do
      if apt-cache show "$name" >/dev/null 2>&1; then echo "$name"; return; fi
    done
  fi
  echo "$1"
}

# clang's libFuzzer runtime: libclang-rt-N-dev since LLVM 15 (and Debian's 14), inside
# libclang-common-N-dev before that (Ubuntu 22.04's clang 14).
if command -v clang >/dev/null && ! clang -print-file-name=libclang_rt.fuzzer-x86_64.a | grep -q /; then
  major=$(clang -dumpversion | cut -d. -f1)
  need+=("$(first_known "libclang-rt-$major-dev" "libclang-common-$major-dev" libclang-rt-dev)")
fi
# gcc's sanitizer runtimes (ASan, UBSan, TSan) come with libgcc-N-dev.
if command -v gcc >/dev/null; then
  for lib in libasan.so libubsan.so libtsan.so; do
    if ! gcc -print-file-name="$lib" | grep -q /; then
      need+=("$(first_known "libgcc-$(gcc -dumpversion | cut -d. -f1)-dev")")
      break
    fi
  done
fi
# Open MPI for the MPI example and its tests (the library does not depend on it).
command -v mpicc >/dev/null || need+=(openmpi-bin libopenmpi-dev)
# clang-format 14 checks the layout of the C files (test_format).
command -v clang-format-14 >/dev/null || need+=(clang-format-14)
# The embedding example (examples/embed/): utf8proc for its tokenizer and OpenBLAS for its
# CPU kernels' matrix products (the library depends on neither).
[ -e /usr/include/utf8proc.h ] || need+=(libutf8proc-dev)
compgen -G "/usr/include/*/openblas*/cblas.h" >/dev/null || compgen -G "/usr/include/openblas/cblas.h" >/dev/null ||
  need+=(libopenblas-dev)
# OpenCL on the CPU (PoCL) and the ICD loader, for the OpenCL backend's tests.
if [ ! -e /etc/OpenCL/vendors/pocl.icd ] || ! ldconfig -p 2>/dev/null | grep -q 'libOpenCL.so.1 '; then
  need+=(pocl-opencl-icd ocl-icd-libopencl1)
fi

if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$have_apt" -eq 0 ]; then
  echo "setup: missing ${need[*]} (Debian/Ubuntu package names); this system has no apt-get: install the" \
       "equivalents with its package manager, then run this again" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo="sudo"
  elif command -v sudo >/dev/null && [ -t 0 ]; then
    sudo="sudo" # it asks for the password
  else
    echo "setup: missing ${need[*]}; installing needs root, and this user is not root and cannot use sudo." >&2
    echo "setup: as root, run: apt-get update && apt-get install -y ${need[*]}" >&2
    exit 1
  fi
fi
echo "setup: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${need[@]}" >/dev/null
