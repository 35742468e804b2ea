#!/usr/bin/env python3
"""Replays every trace of a folder of PyTorch allocation traces (tests/data/traces: each
sub-folder holds *.trace and a figures.json with the figures of PyTorch's own CUDA caching
allocator, CCA) through `devbuf trace replay` at a CUDA device's 2 MiB page and at the CPU's
4 KiB page, without a limit and with a memory limit equal to CCA's peak reserved, and prints
one table: peak requested, CCA's peak reserved, devbuf's peak reserved and its ratio, system
allocations devbuf / CCA (CCA's counted as the traces' README defines), and refusals at
the limit. Usage: trace_bench.py [DEVBUF_TOOL] [TRACES_FOLDER] [--json]
"""
import json
import os
import subprocess
import sys

args = [a for a in sys.argv[1:] if a != "--json"]
tool = args[0] if args else "build/release/devbuf"
folder = args[1] if len(args) > 1 else "tests/data/traces"
GiB = 1 << 30
rows = []
for source in sorted(os.listdir(folder)):
    figures_path = os.path.join(folder, source, "figures.json")
    if not os.path.exists(figures_path):
        continue
    figures = json.load(open(figures_path))["traces"]
    for stem, cca in sorted(figures.items()):
        trace = os.path.join(folder, source, cca["trace"])
        for page in (2 << 20, 4096):
            def replay(*extra):
                out = subprocess.run([tool, "trace", "replay", trace, "--page", str(page), "--json", *extra],
                                     capture_output=True, text=True, check=True).stdout
                return json.loads(out)
            free = replay()
            limited = replay("--memory-limit", str(cca["cca_peak_reserved"]))
            rows.append({"trace": f"{source}/{stem}", "page": page, "peak_requested": free["peak_requested_bytes"],
                         "cca_peak_reserved": cca["cca_peak_reserved"], "devbuf_peak_reserved": free["peak_reserved_bytes"],
                         "ratio": free["peak_reserved_bytes"] / cca["cca_peak_reserved"],
                         "devbuf_system_allocs": free["system_allocs"], "cca_system_allocs": cca["cca_system_allocs"],
                         "refused_at_cca_peak": limited["refused"],
                         "system_allocs_at_cca_peak": limited["system_allocs"]})
if "--json" in sys.argv:
    print(json.dumps(rows, indent=1))
    sys.exit(0)
print(f"{'trace':<62} {'page':>7} {'requested':>9} {'CCA':>7} {'devbuf':>7} {'ratio':>6} "
      f"{'sys allocs devbuf/CCA':>22} {'refused at CCA peak':>20}")
for r in rows:
    print(f"{r['trace']:<62} {'2 MiB' if r['page'] > 4096 else '4 KiB':>7} {r['peak_requested'] / GiB:9.3f} "
          f"{r['cca_peak_reserved'] / GiB:7.3f} {r['devbuf_peak_reserved'] / GiB:7.3f} {r['ratio']:6.3f} "
          f"{r['devbuf_system_allocs']:>11} / {r['cca_system_allocs']:<8} {r['refused_at_cca_peak']:>20}")
print("GiB = 2^30 bytes; devbuf replays over an upstream that counts bytes and holds no memory")
