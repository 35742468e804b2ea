#!/usr/bin/env python3
"""The embedding example's benchmark: sentences per second of devbuf-embed on the corpus at
batch 1 and 32 on cpu (and opencl:0 where it exists), beside sentence-transformers on CPU
torch with the same thread count, measured in one run and interleaved (devbuf, torch,
devbuf, ...) so that both see the same machine; and devbuf's own share, the same run with
every kernel empty (--empty-kernels: the same submissions, buffers and waits).

    python3 bench/embed/bench_embed.py --tool build/release/examples/embed/devbuf-embed \\
        [--torch-python /path/to/venv/bin/python] [--runs 5] [--threads 2] [--opencl] [--corpus FILE]

The model comes from scripts/fetch_model.sh. --torch-python names a Python with torch and
sentence-transformers (a bench venv: never the test suite's); without it the torch column
says it was not measured. Medians over --runs; the machines are shared and noisy, so the
ratio of the two medians of one run is the figure to quote.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..", "..")
default_corpus = os.path.join(root, "tests", "data", "embed", "corpus.txt")


def count_lines(path):
    raw = open(path, "rb").read()
    return raw.count(b"\n") + (0 if raw.endswith(b"\n") or not raw else 1)


def devbuf_rate(tool, model, corpus, device, batch, threads, empty=False):
    args = [tool, "--model", model, "--device", device, "--batch", str(batch), "--json"]
    if threads:
        args += ["--threads", str(threads)]
    if empty:
        args.append("--empty-kernels")
    result = subprocess.run(args + [corpus], capture_output=True, timeout=3600)
    if result.returncode != 0:
        sys.exit(f"devbuf-embed failed: {result.stderr.decode(errors='replace')}")
    document = json.loads(result.stdout)
    return len(document["sentences"]) / document["seconds"], document["seconds"], document["memory"]


def torch_rates(python, model, corpus, threads):
    script = os.path.join(here, "torch_throughput.py")
    result = subprocess.run([python, script, "--model", model, "--corpus", corpus, "--threads",
                             str(threads), "--runs", "1"], capture_output=True, timeout=3600)
    if result.returncode != 0:
        sys.exit(f"torch_throughput.py failed: {result.stderr.decode(errors='replace')[-400:]}")
    figures = json.loads(result.stdout)
    return figures["batch1"], figures["batch32"], figures["versions"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--torch-python")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--opencl", action="store_true", help="also opencl:0")
    ap.add_argument("--corpus", default=default_corpus, help="one sentence per line (default: the test corpus)")
    options = ap.parse_args()
    fetched = subprocess.run([os.path.join(root, "scripts", "fetch_model.sh")], capture_output=True, text=True)
    if fetched.returncode != 0:
        sys.exit(f"bench_embed: no model: {fetched.stderr.strip()}")
    model = fetched.stdout.strip()
    corpus = options.corpus
    devices = ["cpu"] + (["opencl:0"] if options.opencl else [])
    rates = {}
    versions = None
    for _ in range(options.runs):
        for device in devices:
            for batch in (1, 32):
                rate, seconds, memory = devbuf_rate(options.tool, model, corpus, device, batch, options.threads)
                rates.setdefault((device, batch, "full"), []).append((rate, seconds, memory))
                rate, seconds, _ = devbuf_rate(options.tool, model, corpus, device, batch, options.threads, True)
                rates.setdefault((device, batch, "empty"), []).append((rate, seconds, None))
        if options.torch_python:
            b1, b32, versions = torch_rates(options.torch_python, model, corpus, options.threads)
            rates.setdefault(("torch", 1, "full"), []).append((b1, None, None))
            rates.setdefault(("torch", 32, "full"), []).append((b32, None, None))

    def median(key, index=0):
        return statistics.median(r[index] for r in rates[key]) if key in rates else None

    print(f"{count_lines(corpus)} sentences, {options.threads} threads, medians of {options.runs} runs")
    print("| device | batch | sentences/s | vs sentence-transformers | devbuf's share (empty kernels) | peak reserved / peak active |")
    print("|---|---|---|---|---|---|")
    for device in devices:
        for batch in (1, 32):
            full = median((device, batch, "full"))
            seconds, empty_seconds = median((device, batch, "full"), 1), median((device, batch, "empty"), 1)
            torch = median(("torch", batch, "full"))
            memory = rates[(device, batch, "full")][-1][2]
            ratio = f"{full / torch:.2f}x" if torch and device == "cpu" else "-"
            print(f"| {device} | {batch} | {full:.1f} | {ratio} | {100 * empty_seconds / seconds:.1f}% "
                  f"| {memory['peak_reserved']} / {memory['peak_active']} ({memory['peak_reserved'] / memory['peak_active']:.3f}) |")
    for batch in (1, 32):
        torch = median(("torch", batch, "full"))
        print(f"| sentence-transformers (torch, cpu) | {batch} | "
              f"{f'{torch:.1f}' if torch else 'not measured (--torch-python)'} | | | |")
    if versions:
        print(f"torch side: {json.dumps(versions)}")


main()
