"""Several Python threads using devbuf at once: every call releases the GIL, and the
library is thread-safe."""
import threading

import pytest

import devbuf

np = pytest.importorskip("numpy", reason="numpy is not installed (scripts/python_env.sh installs it)")

THREADS = 8
ROUNDS = 300


def worker(cpu, number, errors):
    try:
        queue = cpu.queue()
        rng = np.random.default_rng(number)  # each thread its own numbers
        for round_ in range(ROUNDS):
            n = int(rng.integers(1, 5000))
            data = rng.integers(0, 1 << 30, n, dtype=np.int32)
            buffer = cpu.asbuffer(data)
            copy = cpu.empty((n,), "int32")
            queue.copy(copy, buffer)
            queue.fill(buffer, round_)
            with copy.read() as view:  # waits for the copy
                assert np.array_equal(np.frombuffer(view, np.int32), data)
            queue.finish()
            assert np.all(np.from_dlpack(buffer.read_only_export()) == round_)
            imported = devbuf.from_dlpack(data)
            assert imported.to_bytes() == data.tobytes()
            del buffer, copy, imported
    except BaseException as failure:  # reported by the main thread
        errors.append(failure)


def test_threads_share_a_device(cpu):
    live = cpu.memory_stats()["live_buffers"]
    errors = []
    threads = [threading.Thread(target=worker, args=(cpu, number, errors)) for number in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)
    assert not errors, errors[0]
    import gc

    gc.collect()
    assert cpu.memory_stats()["live_buffers"] == live


def test_one_buffer_many_readers(cpu):
    shared = cpu.asbuffer(np.arange(1 << 16, dtype=np.float32))
    expected = float(np.arange(1 << 16, dtype=np.float64).sum())
    sums, errors = [], []

    def read():
        try:
            for _ in range(200):
                with shared.read() as view:
                    sums.append(float(np.frombuffer(view, np.float32).sum(dtype=np.float64)))
        except BaseException as failure:
            errors.append(failure)

    threads = [threading.Thread(target=read) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[0]
    assert sums == [expected] * (200 * THREADS) and shared.open_accesses == 0
