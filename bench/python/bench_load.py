#!/usr/bin/env python3
"""devbuf.load + numpy.from_dlpack against the safetensors package, side by side in one
process, on one file of about 1 GiB (256 float32 tensors of 4 MiB, written once).

    PYTHONPATH=build/gcc/python build/pyenv/bin/python3 bench/python/bench_load.py [--mib N] [--runs N]

(or with the package pip-installed). Each run times, in alternating order:
- devbuf: devbuf.load(path), then numpy.from_dlpack of every tensor (zero-copy views of one
  mapping of the file);
- safetensors.numpy.load_file(path) (reads every tensor into a new array);
- safe_open(path, framework="numpy") and get_tensor of every tensor;
- numpy.memmap of the file, each tensor a view at its offsets from the header (the other
  zero-copy way: reading every byte can be no faster through devbuf than through it).
Two end-to-end figures: "arrays" (every tensor is a numpy array) and "read" (also every
byte read once, a sum over the array seen as uint64: what using the weights costs at least,
the same work on both sides). Time to first tensor: from the load call to the first numpy
array. The file is in the page cache for every run (it was just written), so the figures
compare the libraries, not the disk. Medians over the runs; the machine is shared and noisy.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import devbuf


def touch(arrays):
    total = 0
    for array in arrays:
        total += int(array.view(np.uint8).reshape(-1).view(np.uint64).sum(dtype=np.uint64))
    return total


FIRST = "layer.000.weight"  # a program asks for a tensor by its name


def run_devbuf(path, read):
    start = time.perf_counter()
    loaded = devbuf.load(path)
    first = np.from_dlpack(loaded[FIRST])
    first_at = time.perf_counter()
    arrays = [first] + [np.from_dlpack(loaded[name]) for name in loaded if name != FIRST]
    ready = time.perf_counter()
    checksum = touch(arrays) if read else None
    return first_at - start, ready - start, time.perf_counter() - start, checksum


def run_load_file(path, read):
    start = time.perf_counter()
    tensors = load_file(path)
    first_at = ready = time.perf_counter()  # every tensor comes at once
    arrays = list(tensors.values())
    checksum = touch(arrays) if read else None
    return first_at - start, ready - start, time.perf_counter() - start, checksum


def run_safe_open(path, read):
    start = time.perf_counter()
    with safe_open(path, framework="numpy") as opened:
        arrays = [opened.get_tensor(FIRST)]
        first_at = time.perf_counter()
        arrays += [opened.get_tensor(name) for name in opened.keys() if name != FIRST]
    ready = time.perf_counter()
    checksum = touch(arrays) if read else None
    return first_at - start, ready - start, time.perf_counter() - start, checksum


def run_memmap(path, read):
    start = time.perf_counter()
    with open(path, "rb") as file:
        header_size = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(header_size))
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + header_size

    def view(name):
        entry = header[name]
        begin, end = entry["data_offsets"]
        return mapped[base + begin:base + end].view(np.float32).reshape(entry["shape"])

    arrays = [view(FIRST)]
    first_at = time.perf_counter()
    arrays += [view(name) for name in header if name not in (FIRST, "__metadata__")]
    ready = time.perf_counter()
    checksum = touch(arrays) if read else None
    return first_at - start, ready - start, time.perf_counter() - start, checksum


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024, help="file size in MiB (4 MiB tensors)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    count = max(args.mib // 4, 1)
    path = os.path.join(args.dir, f"devbuf-bench-{os.getpid()}.safetensors")
    rng = np.random.default_rng(0)
    save_file({f"layer.{i:03d}.weight": rng.standard_normal((1024, 1024), dtype=np.float32) for i in range(count)},
              path)
    size = os.path.getsize(path)
    contenders = {"devbuf.load + from_dlpack": run_devbuf, "safetensors load_file": run_load_file,
                  "safetensors safe_open": run_safe_open, "numpy.memmap views": run_memmap}
    figures = {name: {"first": [], "arrays": [], "read": []} for name in contenders}
    checksums = set()
    try:
        for run in range(args.runs):
            order = list(contenders.items())
            if run % 2:
                order.reverse()
            for name, function in order:
                first, ready, _, _ = function(path, read=False)
                _, _, total, checksum = function(path, read=True)
                figures[name]["first"].append(first)
                figures[name]["arrays"].append(ready)
                figures[name]["read"].append(total)
                checksums.add(checksum)
    finally:
        os.unlink(path)
    if len(checksums) != 1:
        sys.exit(f"the contenders read different bytes: {checksums}")
    print(f"{count} float32 tensors, {size / 2**30:.3f} GiB, page cache warm; medians of {args.runs} runs "
          f"(devbuf {devbuf.__version__}, numpy {np.__version__})")
    print(f"{'':28s} {'first tensor':>14s} {'arrays ready':>14s} {'+ every byte read':>18s}")
    medians = {name: {k: statistics.median(v) for k, v in f.items()} for name, f in figures.items()}
    for name, m in medians.items():
        print(f"{name:28s} {m['first'] * 1e3:11.3f} ms {m['arrays'] * 1e3:11.2f} ms {m['read'] * 1e3:15.1f} ms")
    ours = medians["devbuf.load + from_dlpack"]
    for name in ("safetensors load_file", "safetensors safe_open", "numpy.memmap views"):
        theirs = medians[name]
        print(f"devbuf vs {name}: {theirs['arrays'] / ours['arrays']:.1f}x faster to all arrays, "
              f"{theirs['read'] / ours['read']:.2f}x with every byte read")
    print(f"targets: >= 5x end to end (arrays ready): "
          f"{'met' if all(medians[n]['arrays'] >= 5 * ours['arrays'] for n in medians if n.startswith('safetensors')) else 'MISSED'} "
          f"(against safetensors); "
          f"first tensor under 1 ms: {'met' if ours['first'] < 1e-3 else 'MISSED'} ({ours['first'] * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
