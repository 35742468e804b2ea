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


def test_reimported_devbuf_capsules_leave_nothing(cpu):
    """devbuf's own capsule consumed by devbuf: its proxy goes with it (tracemalloc counts
    the raw allocations the proxies take)."""
    import tracemalloc

    buffer = cpu.zeros((16,), "float32")

    class Producer:  # another object whose __dlpack__ is a devbuf buffer's: a capsule each time
        def __dlpack__(self, **kwargs):
            return buffer.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return buffer.__dlpack_device__()

    def reimports(count):
        for _ in range(count):
            imported = devbuf.from_dlpack(Producer())
            del imported

    reimports(200)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reimports(5000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes stayed after 5000 imports"
