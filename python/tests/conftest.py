"""Shared fixtures of the Python package's tests (run by ctest's test_python_package, or
`pytest python/tests` with the package importable)."""
import gc

import pytest

import devbuf


@pytest.fixture
def cpu():
    return devbuf.Device("cpu")


@pytest.fixture
def own_limits(cpu):
    """Tests that set limits on the CPU device's caching allocator give them back."""
    yield cpu
    cpu.set_limits()
    gc.collect()
