#!/usr/bin/env python3
"""The cost of a kernel launch from Python: devbuf's Queue.launch against pyopencl, side by
side in one process, on one OpenCL device (opencl:0: PoCL's CPU device in CI's image).

    PYTHONPATH=build/gcc/python python3 bench/python/bench_launch.py [--launches N] [--runs N]

It needs pyopencl from PyPI (pip install pyopencl==2026.1.4); without it, it says so and
exits 77. Both sides run the same OpenCL C kernel on buffers of the same size with the same
scalar, in their own context on the same device:
- devbuf: queue.launch(program, "add", 64, uses=[(x, "rw")], args=[value]);
- pyopencl: kernel(queue, (64,), None, x, value), its fastest documented call.
Each run launches N kernels and waits for them (finish), in alternating order. Two figures
per side: "submit", the time to make the N calls (what Python and the library add per
launch), and "total", up to the end of the finish (the device's work included). Medians over
the runs; the machine is shared and noisy, so the ratios are taken in one run.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

import devbuf

SOURCE = "__kernel void add(__global float *x, float v) { x[get_global_id(0)] += v; }"
SIZE = 64


def devbuf_side(launches):
    device = devbuf.Device("opencl:0")
    program = devbuf.Program(device, SOURCE)
    x = device.zeros(SIZE)
    queue = device.queue()
    queue.set_depth(0)  # the same as pyopencl's queue: no bound on the items held
    value = np.float32(1)

    def run():
        start = time.perf_counter()
        for _ in range(launches):
            queue.launch(program, "add", SIZE, uses=[(x, "rw")], args=[value])
        submitted = time.perf_counter()
        queue.finish()
        return submitted - start, time.perf_counter() - start

    def result():
        return np.frombuffer(x.to_bytes(), np.float32)[0]

    return run, result


def pyopencl_side(launches, cl):
    platform = next(p for p in cl.get_platforms() if p.get_devices())
    context = cl.Context([platform.get_devices()[0]])
    queue = cl.CommandQueue(context)
    kernel = cl.Program(context, SOURCE).build().add
    x = cl.Buffer(context, cl.mem_flags.READ_WRITE, SIZE * 4)
    cl.enqueue_fill_buffer(queue, x, np.float32(0), 0, SIZE * 4)
    value = np.float32(1)

    def run():
        start = time.perf_counter()
        for _ in range(launches):
            kernel(queue, (SIZE,), None, x, value)
        submitted = time.perf_counter()
        queue.finish()
        return submitted - start, time.perf_counter() - start

    def result():
        out = np.empty(SIZE, np.float32)
        cl.enqueue_copy(queue, out, x)
        return out[0]

    return run, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    try:
        import pyopencl as cl
    except ImportError:
        print("SKIP: pyopencl is not installed (pip install pyopencl==2026.1.4)")
        return 77
    os.environ.setdefault("POCL_CACHE_DIR", os.path.join(os.getcwd(), "build", "pocl-cache"))
    try:
        sides = {"devbuf": devbuf_side(options.launches), "pyopencl": pyopencl_side(options.launches, cl)}
    except devbuf.UnavailableError as missing:
        print(f"SKIP: no OpenCL device: {missing}")
        return 77
    for run, _ in sides.values():  # warm up: kernel builds, first allocations, worker threads
        run()
    times = {name: ([], []) for name in sides}
    for _ in range(options.runs):
        for name, (run, _) in sides.items():
            submit, total = run()
            times[name][0].append(submit)
            times[name][1].append(total)
    for name, (_, result) in sides.items():
        expected = options.launches * (options.runs + 1)
        if result() != expected:
            print(f"{name}: x[0] is {result()}, not {expected}: the launches did not all run")
            return 1
    print(f"{options.launches} launches of one kernel over {SIZE} floats, medians of {options.runs} runs, "
          f"per launch (opencl:0: {devbuf.Device('opencl:0').name})")
    print(f"{'':10} {'submit':>10} {'total':>10}")
    medians = {}
    for name, (submits, totals) in times.items():
        medians[name] = (statistics.median(submits) / options.launches, statistics.median(totals) / options.launches)
        print(f"{name:10} {medians[name][0] * 1e6:8.2f} us {medians[name][1] * 1e6:8.2f} us")
    ratio = [medians["devbuf"][i] / medians["pyopencl"][i] for i in range(2)]
    print(f"{'devbuf / pyopencl':10} {ratio[0]:8.2f} x  {ratio[1]:8.2f} x   (target: at most 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
