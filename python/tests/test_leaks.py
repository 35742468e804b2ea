"""Creating and dropping buffers leaves memory steady: no handle, capsule or access leaks."""
import gc
import resource

import pytest

import devbuf


def rss_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def churn(cpu, count):
    for i in range(count):
        buffer = cpu.zeros((64,), "float32")
        buffer.to_bytes()
        view = buffer[0:32]
        del view, buffer


def test_100000_buffers_leave_memory_steady(cpu):
    churn(cpu, 5000)  # warm: thread caches, ctypes' own caches
    gc.collect()
    live, rss = cpu.memory_stats()["live_buffers"], rss_kib()
    churn(cpu, 100_000)
    gc.collect()
    assert cpu.memory_stats()["live_buffers"] == live
    assert rss_kib() - rss < 8 * 1024, "resident memory grew by more than 8 MiB"


def test_dlpack_round_trips_leave_memory_steady(cpu):
    np = pytest.importorskip("numpy", reason="numpy is not installed")
    source = np.arange(256, dtype=np.float64)

    def round_trips(count):
        for _ in range(count):
            buffer = devbuf.from_dlpack(source)
            array = np.from_dlpack(buffer)
            capsule = buffer.__dlpack__(max_version=(1, 0))  # never consumed
            del array, capsule, buffer

    round_trips(2000)
    gc.collect()
    live, rss = cpu.memory_stats()["live_buffers"], rss_kib()
    round_trips(20_000)
    gc.collect()
    assert cpu.memory_stats()["live_buffers"] == live
    assert rss_kib() - rss < 8 * 1024
