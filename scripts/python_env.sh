#!/usr/bin/env bash
# A Python environment for the cross-checks and the Python package's tests: pinned numpy,
# safetensors, pytest, tokenizers (the embedding example's token ids) and mypy (the package's
# types) from PyPI in build/pyenv. When it cannot be made (no Python, no network), the Python
# tests skip and say why; nothing else depends on it.
cd "$(dirname "$0")/.."
NUMPY=numpy==2.2.6
SAFETENSORS=safetensors==0.8.0
PYTEST=pytest==8.4.2
TOKENIZERS=tokenizers==0.22.1
MYPY=mypy==2.4.1
env=build/pyenv
if [ -x "$env/bin/python3" ] && "$env/bin/python3" -c "
import numpy, safetensors, pytest, tokenizers, mypy.version, sys
sys.exit(not (numpy.__version__ == '${NUMPY#*==}' and safetensors.__version__ == '${SAFETENSORS#*==}'
              and pytest.__version__ == '${PYTEST#*==}'
              and tokenizers.__version__ == '${TOKENIZERS#*==}'
              and mypy.version.__version__ == '${MYPY#*==}'))" 2>/dev/null; then
  exit 0
fi
if ! command -v python3 >/dev/null; then
  echo "python_env: no python3; the Python cross-checks will skip"
  exit 0
fi
rm -rf "$env"
mkdir -p build
if ! python3 -m venv "$env" >build/pyenv.log 2>&1 ||
   ! "$env/bin/pip" install -q "$NUMPY" "$SAFETENSORS" "$PYTEST" "$TOKENIZERS" "$MYPY" >>build/pyenv.log 2>&1; then
  echo "python_env: cannot install $NUMPY $SAFETENSORS $PYTEST $TOKENIZERS $MYPY (see build/pyenv.log); the Python tests will skip"
  rm -rf "$env"
fi
exit 0
