#!/usr/bin/env bash
# `pip install .` as a new user does it: a fresh virtual environment, the package built
# from the source tree by its pinned build backend, then imported from elsewhere.
# usage: check_pip_install.sh SOURCE_DIR SCRATCH_DIR PYTHON
# Exits 77 (skipped) when pip cannot reach the package index for the build backend.
set -uo pipefail
source_dir=$1 scratch=$2 python=$3
rm -rf "$scratch" && mkdir -p "$scratch"
if ! "$python" -m venv "$scratch/venv" >"$scratch/venv.log" 2>&1; then
  cat "$scratch/venv.log"; echo "FAIL: cannot make a virtual environment with $python"; exit 1
fi
if ! "$scratch/venv/bin/pip" install "$source_dir" >"$scratch/pip.log" 2>&1; then
  if grep -qE "No matching distribution|Could not find a version|connection|Network is unreachable|Temporary failure in name resolution" "$scratch/pip.log"; then
    tail -5 "$scratch/pip.log"; echo "SKIP: pip cannot fetch the build backend (no package index reachable)"; exit 77
  fi
  tail -40 "$scratch/pip.log"; echo "FAIL: pip install $source_dir"; exit 1
fi
expected=$(sed -nE 's/^#define DEVBUF_VERSION_(MAJOR|MINOR|PATCH) ([0-9]+)$/\2/p' "$source_dir/include/devbuf.h" | paste -sd.)
cd "$scratch" || exit 1
version=$("$scratch/venv/bin/python" -c "import devbuf; print(devbuf.__version__)") || { echo "FAIL: import devbuf"; exit 1; }
[ "$version" = "$expected" ] || { echo "FAIL: devbuf.__version__ is $version, devbuf.h says $expected"; exit 1; }
"$scratch/venv/bin/python" - <<'PY' || { echo "FAIL: the installed package does not work"; exit 1; }
import os, devbuf
package = os.path.dirname(devbuf.__file__)
assert os.path.exists(os.path.join(package, "py.typed")) and os.path.exists(os.path.join(package, "libdevbuf.so"))
cpu = devbuf.Device("cpu")
buffer = cpu.zeros((2, 3), "int16")
with buffer.write() as view:
    view[1, 2] = 7
devbuf.save("t.safetensors", {"b": buffer}, metadata={"k": "v"})
loaded = devbuf.load("t.safetensors")
assert loaded.metadata == {"k": "v"} and loaded["b"].to_bytes() == buffer.to_bytes()
assert loaded["b"].read_only
from importlib import metadata  # the licence travels with the package
meta = metadata.metadata("devbuf")
assert meta["License"] == "MIT", meta["License"]
assert "License :: OSI Approved :: MIT License" in meta.get_all("Classifier"), meta.get_all("Classifier")
licences = [f for f in metadata.files("devbuf") if str(f).endswith(".dist-info/licenses/LICENSE")]
assert licences and licences[0].read_text().startswith("MIT License"), metadata.files("devbuf")
print("installed devbuf", devbuf.__version__, "works:", cpu, "- licence", meta["License"])
PY
echo "PASS: pip install, import, version $version"
