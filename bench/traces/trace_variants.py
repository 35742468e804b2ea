#!/usr/bin/env python3
"""Does devbuf's caching allocator fit wherever PyTorch's does, on runs it has never seen?

The real traces in tests/data/traces are few, and a policy tuned on them proves little. This
makes variants of each (other batch or sequence sizes, random perturbations; below) and sets
devbuf's policy against the model of PyTorch's caching allocator (`devbuf trace replay
--policy cca`, which reproduces PyTorch's own figures on the real traces) on every one:

- the least memory limit under which each policy refuses nothing (`--least-limit`): devbuf
  fits wherever CCA fits on a trace when its least limit is at most CCA's;
- at a memory limit of CCA's peak: what devbuf refuses, and its system allocations;
- without a limit: devbuf's peak reserved against CCA's, and system allocations;
- growable segments: peak mapped without a limit against min(CCA's peak, 1.02 x peak
  requested), and refusals at a limit of 1.02 x peak requested.

Every figure is a count of bytes or calls, exact and the same on every machine.

A variant of a trace, with a seed of its own:
- scale: every allocation the trace frees (activations, temporaries; what a batch or a
  sequence length sizes) is scaled by k; each distinct size maps to one new size, so that
  tensors of one shape stay of one size; sizes that were multiples of 512 stay so. The
  allocations never freed (weights, optimizer state) keep their sizes.
- jitter: each distinct size also moves by a random factor within +-j.
- swap: with probability s, a free followed by an allocation trades places (one lifetime
  grows by an event: another order of the same program).

Usage: trace_variants.py [--tool build/release/devbuf] [--traces tests/data/traces]
                         [--page 2MiB] [--only NAME] [--json]
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import zlib

# (scale, jitter, swap): smaller and larger runs, plain and perturbed.
VARIANTS = [(0.5, 0.0, 0.0), (0.75, 0.05, 0.02), (1.3, 0.05, 0.02), (2.0, 0.0, 0.05), (1.0, 0.15, 0.1)]


def make_variant(lines, scale, jitter, swap, seed):
    rng = random.Random(seed)
    freed = {line.split()[1] for line in lines if line.startswith("f ")}
    sizes = {}

    def resized(size):
        if size not in sizes:
            value = max(1, int(size * scale * (1 + rng.uniform(-jitter, jitter))))
            sizes[size] = max(512, value // 512 * 512) if size % 512 == 0 else value
        return sizes[size]

    records = ["# devbuf trace 1"]
    for line in lines:
        if line.startswith("a "):
            _, number, size = line.split()
            records.append(f"a {number} {resized(int(size)) if number in freed else size}")
        elif line.startswith("f "):
            records.append(line)
    i = 1
    while i < len(records) - 1:
        first, second = records[i], records[i + 1]
        if first.startswith("f ") and second.startswith("a ") and rng.random() < swap:
            records[i], records[i + 1] = second, first
            i += 2
        else:
            i += 1
    return "\n".join(records) + "\n"


def replay(tool, path, *options):
    result = subprocess.run([tool, "trace", "replay", path, "--json", *options], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{path} {' '.join(options)}: {result.stderr.strip()}")
    return json.loads(result.stdout)


def measure(tool, path, page):
    cca = replay(tool, path, "--policy", "cca", "--least-limit")
    peak = cca["peak_reserved_bytes"]
    mine = replay(tool, path, "--page", page, "--least-limit")
    limited = replay(tool, path, "--page", page, "--memory-limit", str(peak))
    bound = cca["peak_requested_bytes"] * 102 // 100
    growable = replay(tool, path, "--page", page, "--growable")
    growable_limited = replay(tool, path, "--page", page, "--growable", "--memory-limit", str(bound))
    return {
        "requested": cca["peak_requested_bytes"],
        "cca_peak": peak, "cca_sys": cca["system_allocs"], "cca_least": cca["least_limit_bytes"]["cca"],
        "devbuf_peak": mine["peak_reserved_bytes"], "devbuf_sys": mine["system_allocs"],
        "devbuf_least": mine["least_limit_bytes"]["devbuf"],
        "refused_at_cca_peak": limited["refused"], "sys_at_cca_peak": limited["system_allocs"],
        "growable_peak": growable["peak_reserved_bytes"], "growable_sys": growable["system_allocs"],
        "growable_refused": growable_limited["refused"],
    }


def misses(row):
    found = []
    if row["devbuf_least"] > row["cca_least"]:
        found.append("least limit")
    if row["refused_at_cca_peak"]:
        found.append("refused")
    if row["devbuf_peak"] > 1.03 * row["cca_peak"]:
        found.append("peak")
    if row["devbuf_sys"] > row["cca_sys"] or row["sys_at_cca_peak"] > row["cca_sys"]:
        found.append("sys")
    if row["growable_refused"] or row["growable_peak"] > min(row["cca_peak"], row["requested"] * 1.02):
        found.append("growable")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool", default="build/release/devbuf")
    parser.add_argument("--traces", default="tests/data/traces")
    parser.add_argument("--page", default="2MiB")
    parser.add_argument("--only", help="traces whose path contains this")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    traces = sorted(t for t in glob.glob(os.path.join(args.traces, "*", "*.trace")) if not args.only or args.only in t)
    if not traces:
        print(f"trace_variants: no trace under {args.traces}", file=sys.stderr)
        return 1
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for number, trace in enumerate(traces):
            name = os.path.relpath(trace, args.traces)[:-len(".trace")]
            lines = open(trace).read().splitlines()
            cases = [("real", trace)]
            for k, (scale, jitter, swap) in enumerate(VARIANTS):
                path = os.path.join(scratch, f"{number}-{k}.trace")
                with open(path, "w") as f:
                    # The seed follows the trace's name: a variant is the same with --only.
                    f.write(make_variant(lines, scale, jitter, swap, seed=zlib.crc32(name.encode()) + k))
                cases.append((f"x{scale} j{jitter} s{swap}", path))
            for variant, path in cases:
                row = {"trace": name, "variant": variant, **measure(args.tool, path, args.page)}
                row["misses"] = misses(row)
                rows.append(row)
    if args.json:
        print(json.dumps({"page": args.page, "rows": rows}))
        return 0
    GiB = 1 << 30
    print(f"devbuf's policy ({args.page} page) against the CCA model, on the real traces and "
          f"{len(VARIANTS)} variants of each; GiB = 2^30 bytes")
    print(f"{'variant':18} {'requested':>9} {'CCA peak':>9} {'least: CCA':>10} {'devbuf':>7} "
          f"{'peak/CCA':>8} {'sys/CCA':>9} {'at CCA peak: refused':>20} {'sys':>5} {'growable /req':>13}  misses")
    for row in rows:
        if row["variant"] == "real":
            print(row["trace"])
        print(f"  {row['variant']:16} {row['requested'] / GiB:9.3f} {row['cca_peak'] / GiB:9.3f} "
              f"{row['cca_least'] / GiB:10.3f} {row['devbuf_least'] / row['cca_least']:7.3f} "
              f"{row['devbuf_peak'] / row['cca_peak']:8.3f} {row['devbuf_sys']:>4}/{row['cca_sys']:<4} "
              f"{row['refused_at_cca_peak']:>20} {row['sys_at_cca_peak']:>5} "
              f"{row['growable_peak'] / row['requested']:8.3f} {row['growable_refused']:>4}  {', '.join(row['misses'])}")
    count = len(rows)
    fits = sum(1 for r in rows if r["devbuf_least"] <= r["cca_least"])
    clean = sum(1 for r in rows if not r["misses"])
    print(f"least limit: devbuf's column is its least limit / CCA's (<= 1: it fits wherever CCA fits). "
          f"growable: peak mapped / peak requested, refusals at 1.02 x requested.")
    print(f"{fits} of {count} fit wherever CCA fits; {sum(1 for r in rows if not r['refused_at_cca_peak'])} of "
          f"{count} refuse nothing at CCA's peak; {clean} of {count} meet every target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
