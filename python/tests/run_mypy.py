#!/usr/bin/env python3
"""Type-checks the Python package's sources (python/devbuf, with its stub of devbuf._ext) with
mypy --strict, for ctest.

usage: run_mypy.py PYTHON_DIR CACHE_DIR
Exits 77 (skipped) with the reason when mypy is not installed (scripts/python_env.sh
installs it).
"""
import importlib.util
import subprocess
import sys

python_dir, cache_dir = sys.argv[1], sys.argv[2]
if importlib.util.find_spec("mypy") is None:
    print(f"SKIP: mypy not installed for {sys.executable} (scripts/python_env.sh installs it)")
    sys.exit(77)
# The cache goes to the build tree: the source tree stays clean.
sys.exit(subprocess.call([sys.executable, "-m", "mypy", "--strict", "--cache-dir", cache_dir, "devbuf"], cwd=python_dir))
