#!/usr/bin/env python3
"""tools/snapshot_to_trace.py on a snapshot-shaped pickle written here: the trace it gives
is exactly what the conversion rules say, devbuf replays it, and a class reference in the
pickle (os.system, by __reduce__) becomes inert data instead of running.
Usage: check_snapshot_convert.py DEVBUF_TOOL SOURCE_DIR SCRATCH_DIR"""
import os
import pickle
import subprocess
import sys

tool, source, scratch = sys.argv[1:4]
os.makedirs(scratch, exist_ok=True)
marker = os.path.join(scratch, "executed")
if os.path.exists(marker):
    os.unlink(marker)


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))


MiB = 1 << 20
snapshot = {
    "segments": [
        {"device": 0, "address": 0x10000000, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
         "blocks": [{"address": 0x10000000, "size": 512, "requested_size": 100, "state": "active_allocated"},
                    {"address": 0x10000200, "size": 1024, "requested_size": 1000, "state": "active_allocated"},
                    {"address": 0x10000600, "size": 2 * MiB - 1536, "requested_size": 0, "state": "inactive"}]},
        {"device": 0, "address": 0x20000000, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
         "blocks": [{"address": 0x20000000, "size": 20 * MiB, "requested_size": 0, "state": "inactive"}]},
        {"device": 1, "address": 0x90000000, "total_size": 2 * MiB, "stream": 0, "segment_type": "small", "blocks": []},
    ],
    "device_traces": [[
        {"action": "free_requested", "addr": 0x30000000, "size": 300, "stream": 0},
        {"action": "free_completed", "addr": 0x30000000, "size": 300, "stream": 0, "frames": [Evil()]},
        {"action": "segment_alloc", "addr": 0x20000000, "size": 20 * MiB, "stream": 0},
        {"action": "alloc", "addr": 0x20000000, "size": 4 * MiB - 10, "stream": 0},
        {"action": "alloc", "addr": 0x10000200, "size": 1000, "stream": 0},
        {"action": "alloc", "addr": 0x10000600, "size": 0, "stream": 0},
        {"action": "free_completed", "addr": 0x20000000, "size": 4 * MiB - 10, "stream": 0},
        {"action": "segment_free", "addr": 0x30000000, "size": 2 * MiB, "stream": 0},
    ]],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None},
}
pickled = os.path.join(scratch, "snapshot.pickle")
with open(pickled, "wb") as f:
    pickle.dump(snapshot, f, protocol=4)
trace = os.path.join(scratch, "snapshot.trace")
converter = os.path.join(source, "tools", "snapshot_to_trace.py")
result = subprocess.run([sys.executable, converter, pickled, "-o", trace], capture_output=True, text=True)
failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAIL: {what}")


expect(result.returncode == 0, f"converter exit {result.returncode}: {result.stderr}")
expect(not os.path.exists(marker), "the pickle's os.system call ran")
lines = open(trace).read().splitlines() if os.path.exists(trace) else []
expected = [
    "# devbuf trace 1",
    "# stream 0",
    "# s 0 2097152 small",          # held at the start (not allocated by the trace) ...
    "# s 1 2097152 small",          # ... and the one the trace freed
    "# p 0 0 1 512", "a 1 100",     # live throughout
    "# p 1 0 2 512", "a 2 300",     # freed by the trace without an alloc: request rounded to 512
    "f 2",
    "# S 20971520",
    "a 3 4194294",
    "a 4 1000",                     # the zero-byte allocation is left out
    "f 3",
    "# E", "# F 2097152",
]
body = [line for line in lines if not line.startswith("# converted")]
expect(body == expected, "trace lines:\n  " + "\n  ".join(body))
replayed = subprocess.run([tool, "trace", "replay", trace, "--json"], capture_output=True, text=True)
expect(replayed.returncode == 0 and '"allocs": 4' in replayed.stdout and '"never_freed": 2' in replayed.stdout,
       f"devbuf replays it: {replayed.stdout} {replayed.stderr}")
# A segment held at the start, freed by the trace, whose address a new segment gets later:
# held at the start (with the allocation the trace frees in it), and the new one is the
# trace's own (not held at the start although the snapshot holds it at the end).
reused = {
    "segments": [
        {"device": 0, "address": 0x40000000, "total_size": 20 * MiB, "segment_type": "large",
         "blocks": [{"address": 0x40000000, "size": 6 * MiB, "requested_size": 6 * MiB - 100,
                     "state": "active_allocated"}]},
        {"device": 0, "address": 0x50000000, "total_size": 2 * MiB, "segment_type": "small",
         "blocks": [{"address": 0x50000000, "size": 512, "requested_size": 300, "state": "active_allocated"}]},
    ],
    "device_traces": [[
        {"action": "free_completed", "addr": 0x40100000, "size": 1000, "stream": 0},
        {"action": "segment_free", "addr": 0x40000000, "size": 40 * MiB, "stream": 0},
        {"action": "segment_alloc", "addr": 0x40000000, "size": 20 * MiB, "stream": 0},
        {"action": "alloc", "addr": 0x40000000, "size": 6 * MiB - 100, "stream": 0},
        {"action": "segment_alloc", "addr": 0x60000000, "size": 2 * MiB, "stream": 0},
        {"action": "alloc", "addr": 0x60000000, "size": 512, "stream": 0},
        {"action": "free_completed", "addr": 0x60000000, "size": 512, "stream": 0},
        {"action": "segment_free", "addr": 0x60000000, "size": 2 * MiB, "stream": 0},
        {"action": "segment_alloc", "addr": 0x60000000, "size": 4 * MiB, "stream": 0},
        {"action": "segment_free", "addr": 0x60000000, "size": 4 * MiB, "stream": 0},
    ]],
}
with open(pickled, "wb") as f:
    pickle.dump(reused, f, protocol=4)
result = subprocess.run([sys.executable, converter, pickled, "-o", trace], capture_output=True, text=True)
expect(result.returncode == 0, f"converter, reused address: {result.stderr}")
body = [line for line in open(trace).read().splitlines() if not line.startswith("# converted")]
expected = ["# devbuf trace 1", "# stream 0",
            "# s 0 41943040 large", "# s 1 2097152 small",
            "# p 0 1048576 1 1024", "a 1 1000", "# p 1 0 2 512", "a 2 300",
            "f 1", "# E", "# F 41943040", "# S 20971520", "a 3 6291356",
            "# S 2097152", "a 4 512", "f 4", "# E", "# F 2097152", "# S 4194304", "# E", "# F 4194304"]
expect(body == expected, "trace lines, reused address:\n  " + "\n  ".join(body))
# Blocks with no address (older PyTorch versions): each lies where the sizes of the blocks
# before it in its segment end.
unaddressed = {
    "segments": [
        {"device": 0, "address": 0x70000000, "total_size": 20 * MiB, "segment_type": "large",
         "blocks": [{"size": 1 * MiB, "requested_size": MiB - 10, "state": "active_allocated", "history": []},
                    {"size": 3 * MiB, "requested_size": 0, "state": "inactive"},
                    {"size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated"},
                    {"size": 14 * MiB, "requested_size": 0, "state": "inactive"}]},
        {"device": 0, "address": 0x80000000, "total_size": 2 * MiB, "segment_type": "small",
         "blocks": [{"address": 0x80000000, "size": 512, "requested_size": 100, "state": "active_allocated"},
                    {"size": 2 * MiB - 512, "requested_size": 0, "state": "inactive"}]},
    ],
    "device_traces": [[
        {"action": "free_completed", "addr": 0x70100000, "size": 1000, "stream": 0},
        {"action": "alloc", "addr": 0x70400000, "size": 2 * MiB, "stream": 0},
    ]],
}
with open(pickled, "wb") as f:
    pickle.dump(unaddressed, f, protocol=4)
result = subprocess.run([sys.executable, converter, pickled, "-o", trace], capture_output=True, text=True)
expect(result.returncode == 0, f"converter, blocks with no address: {result.stderr}")
body = [line for line in open(trace).read().splitlines() if not line.startswith("# converted")] \
    if result.returncode == 0 else []
expected = ["# devbuf trace 1", "# stream 0",
            "# s 0 20971520 large", "# s 1 2097152 small",
            "# p 0 0 1 1048576", "a 1 1048566",        # block 0: at the segment's address
            "# p 0 1048576 2 1024", "a 2 1000",        # freed by the trace, in block 1
            "# p 1 0 3 512", "a 3 100",                # block 2 (at 4 MiB) is the trace's own
            "f 2", "a 4 2097152"]
expect(body == expected, "trace lines, blocks with no address:\n  " + "\n  ".join(body))
# --times and --frames: `# t` before each recorded record, `# frame` lines before each `a`,
# made printable and cut to the format's line length; replay and view read the result.
timed = {
    "segments": [],
    "device_traces": [[
        {"action": "alloc", "addr": 0x1000, "size": 4096, "stream": 0, "time_us": 1700000000000100,
         "frames": [{"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "malloc"},
                    {"filename": "model.py", "line": 12, "name": "forward"},
                    {"filename": "train.py", "line": 40, "name": "step\nwith a newline"},
                    {"filename": "main.py", "line": 1, "name": "<module>"}]},
        {"action": "alloc", "addr": 0x3000, "size": 512, "stream": 0, "time_us": 1700000000000150,
         "frames": [Evil(), {"filename": "x" * 300, "line": 1, "name": "f"}]},
        {"action": "free_requested", "addr": 0x1000, "size": 4096, "stream": 0, "time_us": 1700000000000190},
        {"action": "free_completed", "addr": 0x1000, "size": 4096, "stream": 0, "time_us": 1700000000000200},
    ]],
}
with open(pickled, "wb") as f:
    pickle.dump(timed, f, protocol=4)
result = subprocess.run([sys.executable, converter, pickled, "-o", trace, "--times", "--frames", "2"],
                        capture_output=True, text=True)
expect(result.returncode == 0, f"converter --times --frames 2: {result.stderr}")
expect(not os.path.exists(marker), "the pickle's os.system call ran")
body = [line for line in open(trace).read().splitlines() if not line.startswith("# converted")]
expected = ["# devbuf trace 1", "# stream 0",
            "# t 1700000000000100", "# frame model.py:12 forward", "# frame train.py:40 step?with a newline", "a 1 4096",
            "# t 1700000000000150", "# frame " + "x" * 237 + "...", "a 2 512",
            "# t 1700000000000200", "f 1"]
expect(body == expected, "trace lines with times and frames:\n  " + "\n  ".join(body))
page = os.path.join(scratch, "timed.html")
viewed = subprocess.run([tool, "trace", "view", trace, "-o", page], capture_output=True, text=True)
html = open(page).read() if viewed.returncode == 0 else ""
expect(viewed.returncode == 0 and '"times": [1700000000000100,1700000000000150,1700000000000200]' in html
       and '[0,"model.py:12 forward","train.py:40 step?with a newline"]' in html,
       f"trace view keeps the times and the stack: {viewed.stderr}")
# Not a snapshot, and not a pickle: a message, exit 1.
junk = os.path.join(scratch, "junk.pickle")
with open(junk, "wb") as f:
    pickle.dump([1, 2, 3], f)
bad = subprocess.run([sys.executable, converter, junk], capture_output=True, text=True)
expect(bad.returncode == 1 and "not a memory snapshot" in bad.stderr, "a list is refused")
with open(junk, "wb") as f:
    f.write(b"\x80\x04garbage")
bad = subprocess.run([sys.executable, converter, junk], capture_output=True, text=True)
expect(bad.returncode == 1 and "snapshot_to_trace:" in bad.stderr, "garbage is refused")
print(f"{len(failures)} failures" if failures else "snapshot conversion ok")
sys.exit(1 if failures else 0)
