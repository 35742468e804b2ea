#!/usr/bin/env python3
"""The C snapshot reader (tools/pickle_reader.c, tools/snapshot_reader.c) against the Python
converter it replaces, and against hostile pickles:

- on the real snapshot of tests/data/snapshots/ and on snapshot-shaped pickles of protocols
  2, 4 and 5 (tests/corpus/make_snapshot_corpus.py, written again here with a marker that a
  called os.system would create), the C reader's trace is byte for byte the trace of
  `tools/snapshot_to_trace.py --times --frames 8`; nothing the pickles name runs;
- `devbuf trace replay RUN.pickle` replays what the committed trace of that run replays, and
  prints PyTorch's own figures of the run as figures.json gives them, and least limits that
  hold (nothing refused at the limit, something refused one byte below); `trace view
  RUN.pickle` draws it; no temporary file is left behind, also when SIGTERM, SIGINT or
  SIGHUP ends it; docs/traces.md's example of it (and docs/tool.md's figure from it) is what
  the tool prints;
- every hostile pickle of tests/corpus/snapshot/expect.txt is refused by the tool with exit 1
  and its phrase; every proper prefix of a small snapshot is refused with a message, and
  one-byte changes at every offset neither crash nor go unexplained (snapshot_convert
  --truncations; the ASan build runs all of this);
- `--least-limit` on a plain trace.
Usage: check_snapshot_reader.py DEVBUF_TOOL SNAPSHOT_CONVERT SOURCE_DIR SCRATCH_DIR"""
import glob
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

tool, convert, source, scratch = sys.argv[1:5]
sys.path.insert(0, os.path.join(source, "tests", "corpus"))
import make_snapshot_corpus  # noqa: E402

shutil.rmtree(scratch, ignore_errors=True)
os.makedirs(scratch)
temporary = os.path.join(scratch, "tmp")  # the tool's TMPDIR: must stay empty
os.makedirs(temporary)
environment = dict(os.environ, TMPDIR=temporary)
marker = os.path.join(scratch, "executed")
converter = os.path.join(source, "tools", "snapshot_to_trace.py")
failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAIL: {what}")


def run(*command):
    return subprocess.run(command, capture_output=True, env=environment)


def compare(path):
    """The C reader's trace against the Python converter's; True when both convert."""
    python_trace = os.path.join(scratch, "python.trace")
    python = run(sys.executable, converter, path, "-o", python_trace, "--times", "--frames", "8")
    c = run(convert, path)
    name = os.path.basename(path)
    expect(c.returncode == python.returncode,
           f"{name}: C exit {c.returncode} ({c.stderr.decode()!r}), Python exit {python.returncode} "
           f"({python.stderr.decode()!r})")
    if c.returncode == 0 and python.returncode == 0:
        wanted = open(python_trace, "rb").read()
        if c.stdout != wanted:
            got_lines, want_lines = c.stdout.splitlines(), wanted.splitlines()
            first = next((i for i, (a, b) in enumerate(zip(got_lines, want_lines)) if a != b),
                         min(len(got_lines), len(want_lines)))
            expect(False, f"{name}: traces differ at line {first + 1}: C "
                          f"{got_lines[first:first + 1]} Python {want_lines[first:first + 1]}")
        return True
    return False


# Snapshot-shaped pickles of every protocol the tool takes, with a live os.system marker.
for name, snapshot in make_snapshot_corpus.snapshots(f"touch {marker}").items():
    for protocol in (2, 4, 5):
        path = os.path.join(scratch, f"{name}_p{protocol}.pickle")
        with open(path, "wb") as f:
            pickle.dump(snapshot, f, protocol=protocol)
        expect(compare(path), f"{name}, protocol {protocol}: both readers convert it")
        replayed = run(tool, "trace", "replay", path, "--json")
        if name == "empty":  # nothing of device 0: refused by name, not replayed as zeros
            expect(replayed.returncode == 1 and not replayed.stdout and
                   b"records no event and no segment of CUDA device 0: nothing to replay" in replayed.stderr,
                   f"empty, protocol {protocol}: devbuf trace replay: exit {replayed.returncode}, "
                   f"{replayed.stdout} {replayed.stderr.decode()}")
            continue
        expect(replayed.returncode == 0 and b'"snapshot": {"device": 0' in replayed.stdout,
               f"{name}, protocol {protocol}: devbuf trace replay: {replayed.stderr.decode()}")
expect(not os.path.exists(marker), "a pickle's os.system call ran")
# CCA's figures where the trace frees a segment held at the start and allocates a new one at
# its address: 40 MiB and 2 MiB held at the start; at the first allocation 20 + 2 MiB, then
# 2 MiB more at the peak; the 40 MiB segment freed before it, two made.
figures_wanted = {"segments_at_start": 2, "reserved_at_start_bytes": 42 << 20,
                  "cca_peak_reserved_bytes": 24 << 20, "cca_system_allocs": 3,
                  "cca_reserved_at_end_bytes": 22 << 20, "cca_segment_allocs": 2, "cca_segment_frees": 2}
replayed = run(tool, "trace", "replay", os.path.join(scratch, "reused_p4.pickle"), "--json")
got = json.loads(replayed.stdout)["snapshot"] if replayed.returncode == 0 else {}
expect(all(got.get(key) == value for key, value in figures_wanted.items()),
       f"reused: CCA's figures {got} {replayed.stderr.decode()}, wanted {figures_wanted}")
# The committed corpus converts the same way.
for path in sorted(glob.glob(os.path.join(source, "tests", "corpus", "snapshot", "valid_*.pickle"))):
    expect(compare(path), f"{os.path.basename(path)}: both readers convert it")

# The real snapshot.
real = os.path.join(source, "tests", "data", "snapshots", "Wedsonlin-assignment2-systems",
                    "medium_128_inference_memory_snapshot.pickle")
stem = "medium_128_inference_memory_snapshot"
traces = os.path.join(source, "tests", "data", "traces", "Wedsonlin-assignment2-systems")
expect(compare(real), "the real snapshot: both readers convert it")
figures = json.load(open(os.path.join(traces, "figures.json")))["traces"][stem]
committed = os.path.join(traces, stem + ".trace")
records = [line for line in run(convert, real).stdout.decode().splitlines() if line[:2] in ("a ", "f ")]
expect(records == [line for line in open(committed).read().splitlines() if line[:2] in ("a ", "f ")],
       "the real snapshot's a/f lines are those of its committed trace")
for policy in ("devbuf", "cca"):
    got = run(tool, "trace", "replay", real, "--json", "--policy", policy)
    want = run(tool, "trace", "replay", committed, "--json", "--policy", policy)
    expect(got.returncode == 0 and want.returncode == 0, f"replay --policy {policy}: {got.stderr}")
    if got.returncode or want.returncode:
        continue
    got, want = json.loads(got.stdout), json.loads(want.stdout)
    for field in ("allocs", "frees", "never_freed", "peak_requested_bytes", "peak_reserved_bytes",
                  "system_allocs", "cache_hits"):
        expect(got[field] == want[field], f"{policy}: {field} {got[field]}, the trace's {want[field]}")
    s = got["snapshot"]
    expect(s["cca_peak_reserved_bytes"] == figures["cca_peak_reserved"]
           and s["cca_system_allocs"] == figures["cca_system_allocs"]
           and s["cca_reserved_at_end_bytes"] == figures["cca_reserved_at_end"]
           and s["segments_at_start"] == figures["segments_at_start"]
           and s["reserved_at_start_bytes"] == figures["reserved_at_start"],
           f"CCA's figures from the snapshot {s} against figures.json")
    # The least limits: nothing refused at them, something refused a byte below.
    for which, flags in (("devbuf", []), ("cca", ["--policy", "cca"])):
        limit = got["least_limit_bytes"][which]
        at = json.loads(run(tool, "trace", "replay", committed, "--json", "--memory-limit", str(limit),
                            *flags).stdout)
        below = json.loads(run(tool, "trace", "replay", committed, "--json", "--memory-limit",
                               str(limit - 1), *flags).stdout)
        expect(limit >= got["peak_requested_bytes"] and at["refused"] == 0 and below["refused"] > 0,
               f"least limit of {which} {limit}: {at['refused']} refused at it, {below['refused']} "
               "a byte below")
    print(f"real snapshot, --policy {policy}: peak reserved {got['peak_reserved_bytes']}, CCA's "
          f"{s['cca_peak_reserved_bytes']}; least limits {got['least_limit_bytes']}")
text = run(tool, "trace", "replay", real)
expect(text.returncode == 0 and b"PyTorch's caching allocator in this run" in text.stdout
       and b"least memory limit" in text.stdout, f"replay's text: {text.stdout} {text.stderr}")
# --cuda-device picks a GPU of the snapshot: 0 is the default; one it records nothing of is
# refused by name, replay and view alike, 0 as any other.
again = run(tool, "trace", "replay", real, "--cuda-device", "0")
expect(again.returncode == 0 and again.stdout == text.stdout, f"--cuda-device 0: {again.stderr}")
for command in (["replay"], ["view", "-o", os.path.join(scratch, "none.html")]):
    other = run(tool, "trace", *command, real, "--cuda-device", "1")
    expect(other.returncode == 1 and b"no event and no segment of CUDA device 1" in other.stderr,
           f"{command[0]} --cuda-device 1: {other.stderr}")
# A snapshot that records nothing at all (no segment; device_traces one empty list, as
# _dump_snapshot writes when no allocation happened) is refused for device 0 too.
nothing = os.path.join(scratch, "nothing.pickle")
with open(nothing, "wb") as f:
    pickle.dump({"segments": [], "device_traces": [[]], "allocator_settings": {"expandable_segments": False},
                 "external_annotations": []}, f, protocol=2)
for command in (["replay"], ["replay", "--json"], ["view", "-o", os.path.join(scratch, "nothing.html")]):
    other = run(tool, "trace", *command, nothing)
    expect(other.returncode == 1 and not other.stdout
           and b"nothing.pickle: it records no event and no segment of CUDA device 0: nothing to replay"
           in other.stderr, f"{command[0]} of a snapshot of nothing: exit {other.returncode}, {other.stderr}")
# A snapshot whose trace records no allocation (an older PyTorch's out-of-memory snapshot:
# one "snapshot" event) replays its end state as live at the start; CCA's peak is what it
# held from the start, and the text says so rather than naming a first recorded allocation.
still = os.path.join(scratch, "still.pickle")
with open(still, "wb") as f:
    pickle.dump({"segments": [{"device": 0, "address": 1 << 32, "total_size": 20 << 20, "blocks": [
        {"size": 8 << 20, "requested_size": (8 << 20) - 5, "state": "active_allocated"},
        {"size": 12 << 20, "requested_size": 0, "state": "inactive"}]}],
        "device_traces": [[{"action": "snapshot", "addr": 0, "size": 8 << 20, "stream": 0}]]}, f, protocol=2)
result = run(tool, "trace", "replay", still)
expect(result.returncode == 0 and b"peak reserved   20 MiB (20,971,520 bytes) from the start (the trace "
       b"records no allocation)\n" in result.stdout and b"1 allocations, 0 frees" in result.stdout,
       f"replay of a snapshot with no allocation recorded: {result.stdout} {result.stderr}")
expect(b"growable" not in result.stdout and b"expandable" not in result.stdout,
       f"a run without expandable segments replays with plain ones: {result.stdout}")
# A run whose PyTorch allocator had expandable segments replays with growable ones unless
# --no-growable says otherwise: six 6 MiB blocks, every other one freed, then 12 MiB, in one
# 48 MiB expandable segment. Plain segments at that peak strand the holes and refuse the
# last; growable ones serve it. Either mark of the setting counts.
mib = 1 << 20
base = 1 << 32
holes_events = [{"action": "alloc", "addr": base + 6 * mib * i, "size": 6 * mib, "stream": 0}
                for i in range(6)]
holes_events += [{"action": "free_completed", "addr": base + 6 * mib * i, "size": 6 * mib, "stream": 0}
                 for i in (0, 2, 4)]
holes_events.append({"action": "alloc", "addr": base + 36 * mib, "size": 12 * mib, "stream": 0})


def holes_snapshot(name, settings, marked):
    blocks = [{"address": base + 6 * mib * i, "size": 6 * mib, "requested_size": 6 * mib,
               "state": "active_allocated" if i % 2 else "inactive"} for i in range(6)]
    blocks.append({"address": base + 36 * mib, "size": 12 * mib, "requested_size": 12 * mib,
                   "state": "active_allocated"})
    segment = {"device": 0, "address": base, "total_size": 48 * mib, "segment_type": "large",
               "blocks": blocks}
    if marked is not None:
        segment["is_expandable"] = marked
    snapshot = {"segments": [segment], "device_traces": [holes_events]}
    if settings is not None:
        snapshot["allocator_settings"] = {"expandable_segments": settings}
    path = os.path.join(scratch, name)
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    return path


for name, settings, marked, expandable in (("set.pickle", True, None, True), ("marked.pickle", False, True, True),
                                            ("plain.pickle", False, False, False),
                                            ("older.pickle", None, None, False),
                                            ("string.pickle", "False", None, False)):  # not a bool: not said
    holes = holes_snapshot(name, settings, marked)
    limit = ["--memory-limit", str(48 * mib)]
    result = run(tool, "trace", "replay", holes, *limit)
    expect(result.returncode == 0 and (b", 0 refused" if expandable else b", 1 refused") in result.stdout and
           (b"growable segments as PyTorch's expandable ones in the run (--no-growable: plain)" in result.stdout
            and b"(the snapshot's own events, device 0, expandable segments)" in result.stdout) == expandable,
           f"{name}: replayed as the run was, growable where it had expandable segments: {result.stdout}")
    document = json.loads(run(tool, "trace", "replay", holes, *limit, "--json").stdout or b"{}")
    expect(document.get("growable") == expandable and document.get("refused") == (0 if expandable else 1) and
           document.get("snapshot", {}).get("expandable_segments") == expandable,
           f"{name} --json: {document}")
    plain = run(tool, "trace", "replay", holes, *limit, "--no-growable")
    grown = run(tool, "trace", "replay", holes, *limit, "--growable")
    expect(b", 1 refused" in plain.stdout and b"growable" not in plain.stdout.split(b"\n")[0] and
           b", 0 refused" in grown.stdout and b"as PyTorch's expandable" not in grown.stdout,
           f"{name}: --no-growable and --growable decide: {plain.stdout} {grown.stdout}")
# A run whose allocator gave its cache back (a 12 MiB segment, idle, freed before a 30 MiB
# one was made: empty_cache(), or the retry after the GPU ran out): the replay gives devbuf's
# cache back at the same point ("# E"), so that it holds no more than PyTorch's did, 30 MiB,
# where keeping the idle 12 MiB held 42.
low, high = base, base + 64 * mib
cleared_events = [{"action": "segment_alloc", "addr": low, "size": 12 * mib, "stream": 0},
                  {"action": "alloc", "addr": low, "size": 12 * mib, "stream": 0},
                  {"action": "free_completed", "addr": low, "size": 12 * mib, "stream": 0},
                  {"action": "segment_free", "addr": low, "size": 12 * mib, "stream": 0},
                  {"action": "segment_alloc", "addr": high, "size": 30 * mib, "stream": 0},
                  {"action": "alloc", "addr": high, "size": 30 * mib, "stream": 0}]
cleared = os.path.join(scratch, "cleared.pickle")
with open(cleared, "wb") as f:
    pickle.dump({"segments": [{"device": 0, "address": high, "total_size": 30 * mib, "segment_type": "large",
                               "blocks": [{"address": high, "size": 30 * mib, "requested_size": 30 * mib,
                                           "state": "active_allocated"}]}],
                 "device_traces": [cleared_events]}, f, protocol=4)
for policy in ("devbuf", "cca"):
    result = run(tool, "trace", "replay", cleared, "--policy", policy)
    document = json.loads(run(tool, "trace", "replay", cleared, "--policy", policy, "--json").stdout or b"{}")
    expect(b"1 cache clears replayed" in result.stdout and document.get("cache_clears") == 1 and
           document.get("peak_reserved_bytes") == 30 * mib == document.get("snapshot", {}).get(
               "cca_peak_reserved_bytes"),
           f"{policy}: the cache given back where the run's was: {result.stdout} {document}")
refused = run(tool, "trace", "replay", holes, "--policy", "cca", "--no-growable")
expect(refused.returncode == 2 and b"takes none of --growable, --no-growable, --page" in refused.stderr,
       f"--policy cca --no-growable: {refused.stderr}")
bad = run(tool, "trace", "replay", real, "--cuda-device", "-1")
expect(bad.returncode == 2 and b"--cuda-device takes a number from 0 to 1023, not '-1'" in bad.stderr,
       f"--cuda-device -1: {bad.stderr}")
page = os.path.join(scratch, "real.html")
viewed = run(tool, "trace", "view", real, "-o", page)
html = open(page, encoding="utf-8").read() if viewed.returncode == 0 else ""
expect(viewed.returncode == 0 and "nsys_profile.py:" in html and '"times": [' in html,
       f"trace view of the snapshot, with stacks and times: {viewed.stderr}")
expect(os.listdir(temporary) == [], f"temporary files left: {os.listdir(temporary)}")

# Hostile pickles: exit 1 with the phrase, through the tool.
corpus = os.path.join(source, "tests", "corpus", "snapshot")
for line in open(os.path.join(corpus, "expect.txt")):
    if line.startswith("#") or not line.strip():
        continue
    name, phrase = line.rstrip("\n").split(" ", 1)
    result = run(tool, "trace", "replay", os.path.join(corpus, name))
    message = result.stderr.decode()
    expect(result.returncode == 1 and phrase in message and "usage:" not in message
           and not result.stdout, f"{name}: exit {result.returncode}, {message!r} (wanted {phrase!r})")
    view = run(tool, "trace", "view", os.path.join(corpus, name), "-o", os.path.join(scratch, "bad.html"))
    expect(view.returncode == 1 and phrase in view.stderr.decode(), f"view {name}: {view.stderr}")
expect(not os.path.exists(marker), "a pickle's os.system call ran")
expect(os.listdir(temporary) == [], f"temporary files left: {os.listdir(temporary)}")
# Every prefix of a small snapshot, and every byte of it changed.
small = os.path.join(scratch, "basic_p4.pickle")
truncated = run(convert, "--truncations", small)
expect(truncated.returncode == 0, f"prefixes and changed bytes: {truncated.stderr.decode()[-2000:]}")
print(truncated.stdout.decode().strip())
# Not a pickle of protocol 2..5: read as a trace, as before.
old = os.path.join(scratch, "protocol1.pickle")
with open(old, "wb") as f:
    pickle.dump({"segments": []}, f, protocol=1)
result = run(tool, "trace", "replay", old)
expect(result.returncode == 1 and b"does not start with" in result.stderr, f"protocol 1: {result.stderr}")

# The docs' example is what the tool prints: docs/traces.md's run of the command it gives,
# line for line (the path aside), and docs/tool.md's figure from it.
docs = open(os.path.join(source, "docs", "traces.md"), encoding="utf-8").read()
block = docs[docs.index("$ devbuf trace replay tests/data/snapshots/"):]
block = block[:block.index("```")].splitlines()
command = block[0][2:].split()
example = run(tool, *command[1:3], os.path.join(source, command[3]), *command[4:]).stdout.decode().splitlines()
expect(len(example) == len(block) - 1 and example[1:] == block[2:] and
       example[0].split(" with ", 1)[1] == block[1].split(" with ", 1)[1],
       "docs/traces.md's example is not what '" + " ".join(command) + "' prints:\n" + "\n".join(example))
tool_doc = open(os.path.join(source, "docs", "tool.md"), encoding="utf-8").read()
quoted = tool_doc[tool_doc.index('("peak requested  ') + 2:]
quoted = quoted[:quoted.index('"')]
expect(any(quoted in line for line in example), f"docs/tool.md quotes {quoted!r}, which the example does not print")

# The temporary trace goes also when SIGTERM, SIGINT or SIGHUP ends the command (it stayed
# in $TMPDIR): the signal arrives once the trace exists, and the process still ends by it.
# A SIGINT the process was started ignoring stays ignored.
for sig, ignored in ((signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGHUP, False), (signal.SIGINT, True)):
    page = os.path.join(scratch, "signalled.html")
    child = subprocess.Popen([tool, "trace", "view", real, "-o", page], env=environment, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL,
                             preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None)
    deadline = time.monotonic() + 60
    while not os.listdir(temporary) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    made = os.listdir(temporary)
    child.send_signal(sig)
    code = child.wait(timeout=120)
    if not made:
        print(f"skipped: {sig.name}: the command ended before its temporary trace was seen")
    expect(code == (0 if ignored else -sig), f"{sig.name}{' (ignored)' if ignored else ''}: exit {code}")
    expect(os.listdir(temporary) == [], f"{sig.name}: temporary files left: {os.listdir(temporary)}")
    for name in os.listdir(temporary):
        os.unlink(os.path.join(temporary, name))

# --least-limit on a plain trace.
plain = os.path.join(source, "tests", "data", "traces", "ZidongLiu-DeComFL", "memory.trace")
result = run(tool, "trace", "replay", plain, "--least-limit", "--json")
got = json.loads(result.stdout) if result.returncode == 0 else {}
expect("least_limit_bytes" in got and "snapshot" not in got, f"--least-limit: {result.stderr}")
if got:
    limit = got["least_limit_bytes"]["devbuf"]
    at = json.loads(run(tool, "trace", "replay", plain, "--json", "--memory-limit", str(limit)).stdout)
    expect(at["refused"] == 0, f"plain trace: {at['refused']} refused at its least limit")
    print(f"ZidongLiu-DeComFL/memory.trace: least limits {got['least_limit_bytes']}, peak requested "
          f"{got['peak_requested_bytes']}")
result = run(tool, "trace", "replay", plain, "--least-limit")
expect(result.returncode == 0 and b"least memory limit" in result.stdout
       and b"PyTorch's caching allocator" not in result.stdout, "--least-limit as text")

print(f"{len(failures)} failures" if failures else "snapshot reader ok")
sys.exit(1 if failures else 0)
