#!/usr/bin/env python3
"""bench/traces/trace_variants.py on one real trace: its variants are traces devbuf replays,
sized as they say (half the activations take less memory than the real run, twice as much
more), the same on a second run (seeds follow the trace's name, not the run), and its
figures are what `devbuf trace replay` prints for the real trace: CCA's least limit no more
than CCA's peak, devbuf's refusals at CCA's peak zero wherever devbuf's least limit is under
it. Usage: check_trace_variants.py DEVBUF_TOOL SOURCE_DIR"""
import json
import os
import subprocess
import sys

tool, source = sys.argv[1:3]
script = os.path.join(source, "bench", "traces", "trace_variants.py")
traces = os.path.join(source, "tests", "data", "traces")
failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAIL:", what)


def run(*options):
    result = subprocess.run([sys.executable, script, "--tool", tool, "--traces", traces, "--only", "ZidongLiu",
                             "--json", *options], capture_output=True, text=True)
    expect(result.returncode == 0, f"trace_variants.py {options}: {result.stderr}")
    return json.loads(result.stdout)["rows"] if result.returncode == 0 else []


rows = run()
expect(len(rows) == 6 and rows[0]["variant"] == "real", f"{len(rows)} rows: the real trace and 5 variants")
by_name = {row["variant"]: row for row in rows}
real = by_name.get("real", {})
half, double = by_name.get("x0.5 j0.0 s0.0", {}), by_name.get("x2.0 j0.0 s0.05", {})
expect(half.get("requested", 1 << 62) < real.get("requested", 0) < double.get("requested", 0),
       f"peak requested: x0.5 {half.get('requested')} < real {real.get('requested')} < x2 {double.get('requested')}")
path = os.path.join(traces, "ZidongLiu-DeComFL", "memory.trace")
replayed = json.loads(subprocess.run([tool, "trace", "replay", path, "--policy", "cca", "--json", "--least-limit"],
                                     capture_output=True, text=True).stdout)
expect(real.get("cca_peak") == replayed["peak_reserved_bytes"] and real.get("cca_least") == replayed["least_limit_bytes"]["cca"],
       "the real row's CCA figures are replay's")
for row in rows:
    expect(row["cca_least"] <= row["cca_peak"], f"{row['variant']}: CCA's least limit over its peak")
    if row["devbuf_least"] <= row["cca_peak"]:
        expect(row["refused_at_cca_peak"] == 0, f"{row['variant']}: refusals at CCA's peak, above devbuf's least limit")
again = run("--page", "2MiB")
expect([r["devbuf_least"] for r in again] == [r["devbuf_least"] for r in rows], "the same variants on a second run")
print(f"{len(rows)} rows; {len(failures)} failures")
sys.exit(1 if failures else 0)
