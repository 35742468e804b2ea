#!/usr/bin/env python3
"""Sentences per second of examples/embed/embed.py (the model through the Python package)
against devbuf-embed on the same OpenCL device, input and batch sizes, interleaved (C,
Python, C, ...) so that both see the same machine; each figure is the --json document's
`seconds` (first tokenization to last embedding read back, both programs alike). With
--empty-kernels, also both programs' own cost: the same runs with every kernel empty.

    PYTHONPATH=build/release/python build/pyenv/bin/python3 bench/embed/bench_embed_py.py \\
        --tool build/release/examples/embed/devbuf-embed [--device opencl:0] [--runs 3] \\
        [--batches 1,32] [--corpus FILE] [--empty-kernels]

The model comes from scripts/fetch_model.sh; embed.py runs under this Python. Medians over
--runs; the machine is shared and noisy, so the ratio of the two medians of one run is the
figure to quote.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..", "..")
script = os.path.join(root, "examples", "embed", "embed.py")


def seconds(command, empty):
    result = subprocess.run(command + (["--empty-kernels"] if empty else []), capture_output=True, timeout=3600)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {result.returncode}: {result.stderr.decode(errors='replace')}")
    document = json.loads(result.stdout)
    return document["seconds"], len(document["sentences"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", required=True, help="devbuf-embed")
    parser.add_argument("--device", default="opencl:0")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--corpus", default=os.path.join(root, "tests", "data", "embed", "corpus.txt"))
    parser.add_argument("--empty-kernels", action="store_true")
    o = parser.parse_args()
    model = subprocess.run([os.path.join(root, "scripts", "fetch_model.sh")], capture_output=True, text=True,
                           check=True).stdout.strip()
    print(f"{o.device}, {o.corpus}, medians of {o.runs} interleaved runs")
    print("| batch | kernels | devbuf-embed sentences/s | embed.py sentences/s | embed.py / devbuf-embed |")
    print("|---|---|---|---|---|")
    for batch in (int(b) for b in o.batches.split(",")):
        for empty in ((False, True) if o.empty_kernels else (False,)):
            common = ["--model", model, "--device", o.device, "--batch", str(batch), "--json", o.corpus]
            c_times, py_times = [], []
            for _ in range(o.runs):
                c, count = seconds([o.tool, *common], empty)
                py, _ = seconds([sys.executable, script, *common], empty)
                c_times.append(c), py_times.append(py)
            c_rate, py_rate = count / statistics.median(c_times), count / statistics.median(py_times)
            print(f"| {batch} | {'empty' if empty else 'real'} | {c_rate:.1f} | {py_rate:.1f} | "
                  f"{py_rate / c_rate:.2f} |", flush=True)


if __name__ == "__main__":
    main()
