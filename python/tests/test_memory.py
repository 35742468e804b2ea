"""The caching allocator from Python: statistics, snapshot, limits, clear_cache, tracing."""
import gc
import os
import subprocess
import sys

import pytest

import devbuf

MiB = 1 << 20


def test_stats_follow_buffers(cpu):
    gc.collect()
    before = cpu.memory_stats()
    buffers = [cpu.zeros((MiB // 4,), "float32") for _ in range(3)]
    for buffer in buffers:
        buffer.to_bytes()  # allocates
    del buffer
    during = cpu.memory_stats()
    assert during["active"] - before["active"] == 3 * MiB
    assert during["live_buffers"] - before["live_buffers"] == 3
    assert set(during) >= {"reserved", "cached", "segments", "largest_free_block", "fragmentation", "peak"}
    del buffers
    gc.collect()
    assert cpu.memory_stats()["active"] == before["active"]


def test_snapshot_shows_every_block(cpu):
    keep = cpu.zeros((1000,), "uint8")
    keep.to_bytes()
    pictures = cpu.snapshot()
    assert pictures and all(s["pool"] in ("small", "large") for s in pictures)
    for segment in pictures:
        assert sum(b["size"] for b in segment["blocks"]) == segment["size"]
        assert {b["state"] for b in segment["blocks"]} <= {"free", "active", "in_flight", "thread_cached", "unmapped"}
    address = keep.device_ptr
    assert any(s["address"] + b["offset"] == address and b["state"] == "active"
               for s in pictures for b in s["blocks"])


def test_limits_refuse_with_the_figures(own_limits):
    cpu = own_limits
    cpu.clear_cache()
    reserved = cpu.memory_stats()["reserved"]
    cpu.set_limits(memory=reserved + 8 * MiB)
    with pytest.raises(devbuf.OutOfMemoryError) as refused:
        cpu.zeros((64 * MiB,), "uint8").to_bytes()
    assert "limit" in refused.value.message and str(reserved + 8 * MiB) in refused.value.message
    cpu.set_limits(max_buffers=cpu.memory_stats()["live_buffers"] + 1)
    first = cpu.zeros((4,), "uint8")
    first.to_bytes()
    with pytest.raises(devbuf.OutOfMemoryError):
        cpu.zeros((4,), "uint8").to_bytes()
    with pytest.raises(devbuf.InvalidArgumentError):
        cpu.set_limits(cache=0)


def test_clear_cache_gives_memory_back(cpu):
    block = cpu.zeros((32 * MiB,), "uint8")
    block.to_bytes()
    del block
    gc.collect()
    assert cpu.memory_stats()["cached"] >= 32 * MiB
    cpu.clear_cache()
    assert cpu.memory_stats()["cached"] < 32 * MiB


def test_trace_writes_what_replay_reads(cpu, tmp_path):
    path = tmp_path / "run.trace"
    with cpu.trace(path):
        a = cpu.zeros((1000,), "float32")
        b = cpu.zeros((10,), "int64")
        a.to_bytes(), b.to_bytes()
        del a
        gc.collect()
        cpu.clear_cache()  # recorded: "# E"
    outside = cpu.zeros((5,), "uint8")  # not traced
    outside.to_bytes()
    del b
    gc.collect()
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#") or line == "# E"]
    assert lines == ["a 1 4000", "a 2 80", "f 1", "# E", "f 2"]
    tool = os.environ.get("DEVBUF_TOOL")
    if tool:
        replay = subprocess.run([tool, "trace", "replay", str(path), "--json"], capture_output=True, text=True)
        assert replay.returncode == 0, replay.stderr
        assert '"allocs": 2' in replay.stdout.replace("  ", " ")
        assert '"cache_clears": 1' in replay.stdout


def test_growable_segments_before_the_first_allocation(cpu):
    cpu.zeros((4,), "uint8").to_bytes()
    with pytest.raises(devbuf.InvalidArgumentError) as refused:
        cpu.use_growable_segments()  # this process's CPU allocator already holds memory
    assert "before its first allocation" in refused.value.message
    fresh = ("import devbuf; cpu = devbuf.Device('cpu'); cpu.use_growable_segments(); "
             "block = cpu.zeros((300000,), 'uint8'); block.to_bytes(); "
             "print(cpu.memory_stats()['reserved'])")
    run = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) == 303104  # 300000 rounded to the page, not a 2 MiB segment
