#!/usr/bin/env python3
"""Runs the Python package's tests for ctest against a package directory (the build tree's
layout of the installed package).

usage: run_pytest.py PACKAGE_PARENT_DIR [--torch]
Without --torch: every test but the PyTorch ones; exits 77 (skipped) with the reason when
pytest, numpy or safetensors is missing (scripts/python_env.sh installs them).
With --torch: only the PyTorch interop tests; exits 77 when torch is not installed (the
test suite does not download it).
"""
import importlib.util
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
package_parent = sys.argv[1]
torch_only = "--torch" in sys.argv[2:]
needed = ["pytest", "torch"] if torch_only else ["pytest", "numpy", "safetensors"]
missing = [name for name in needed if importlib.util.find_spec(name) is None]
if missing:
    why = "the test suite does not download torch" if "torch" in missing else "scripts/python_env.sh installs them"
    print(f"SKIP: {', '.join(missing)} not installed for {sys.executable} ({why})")
    sys.exit(77)
sys.path.insert(0, package_parent)
os.environ["PYTHONPATH"] = package_parent + os.pathsep + os.environ.get("PYTHONPATH", "")
import pytest  # noqa: E402

selection = [os.path.join(here, "test_torch.py")] if torch_only else [here, "--ignore", os.path.join(here, "test_torch.py")]
sys.exit(pytest.main(selection + ["-q", "-rs", "-p", "no:cacheprovider"]))
