"""The devbuf tool as scripts and people use it.

Every command's --help prints its usage on stdout and exits 0; a call with an unknown
command, option or option value prints the usage on stderr and exits 2; a failure the tool
could not help (a missing file, a device without its driver) exits 1. Every --json
document parses and has its documented fields. `load --verify` prints the SHA-256 that
hashlib computes from each tensor's bytes, and `--expect` passes on a saved list and
fails (exit 1, naming the tensor) on a changed one. The tool holds no path of the build
tree, and `bench` leaves nothing in $TMPDIR.
Usage: check_cli.py DEVBUF_TOOL SCRATCH_FOLDER BUILD_FOLDER SOURCE_FOLDER [SANITIZERS]
"""
import hashlib
import json
import os
import stat
import shutil
import struct
import subprocess
import sys

tool, scratch, build_dir, source_dir = sys.argv[1:5]
sanitizers = sys.argv[5] if len(sys.argv) > 5 else ""
shutil.rmtree(scratch, ignore_errors=True)
os.makedirs(scratch)
env = dict(os.environ, XDG_CACHE_HOME=os.path.join(scratch, "cache"), TMPDIR=os.path.join(scratch, "tmp"))
os.makedirs(env["TMPDIR"])
failures = []


def run(*args, timeout=300):
    return subprocess.run([tool, *args], capture_output=True, text=True, env=env, timeout=timeout)


def expect(condition, what):
    if not condition:
        failures.append(what)
        print("FAIL:", what)


model = os.path.join(scratch, "model.safetensors")
trace = os.path.join(scratch, "run.trace")
with open(trace, "w") as f:
    f.write("# devbuf trace 1\na 1 100\na 2 5000\nf 1\nf 2\n")
expect(run("sample", model, "--mib", "2").returncode == 0, "sample writes a model")

# --version and help
result = run("--version")
expect(result.returncode == 0 and result.stdout.startswith("devbuf "), "--version")
# Output that cannot be written is a failure, not an empty success.
if os.path.exists("/dev/full"):
    for args in (["--version"], ["info"], ["trace", "replay", trace, "--json"]):
        with open("/dev/full", "w") as full:
            result = subprocess.run([tool, *args], stdout=full, stderr=subprocess.PIPE, text=True, env=env)
        expect(result.returncode == 1 and "cannot write the output: No space left on device" in result.stderr,
               f"{' '.join(args)} > /dev/full: exit {result.returncode}, {result.stderr.strip()!r}")
# The trace view never writes its page over the run it draws.
result = run("trace", "view", trace, "-o", trace)
expect(result.returncode == 1 and "would overwrite its input" in result.stderr and
       open(trace).read().startswith("# devbuf trace 1"), f"trace view -o its input: {result.stderr.strip()!r}")
# The view gives the cache back at "# E" as replay does, for both policies: 30 MiB at the
# peak, where keeping the idle 12 MiB segment would show 42.
cleared = os.path.join(scratch, "cleared.trace")
with open(cleared, "w") as f:
    f.write("# devbuf trace 1\na 1 12582912\nf 1\n# E\na 2 31457280\nf 2\n")
result = run("trace", "view", cleared, "-o", os.path.join(scratch, "cleared.html"))
expect(result.returncode == 0 and
       "peak reserved 31457280 bytes (PyTorch's CCA, modelled: 31457280)" in result.stdout,
       f"trace view of a trace that clears its cache: {result.stdout.strip()!r} {result.stderr.strip()!r}")
# The sample model is never renamed over a FIFO (or a device node, as root).
fifo = os.path.join(scratch, "a-fifo")
os.mkfifo(fifo)
result = run("sample", fifo, "--mib", "1")
expect(result.returncode == 1 and "not a regular file (a FIFO)" in result.stderr and
       stat.S_ISFIFO(os.lstat(fifo).st_mode), f"sample over a FIFO: {result.stderr.strip()!r}")
for args in (["help"], ["--help"], ["-h"]):
    result = run(*args)
    expect(result.returncode == 0 and "usage: devbuf" in result.stdout and not result.stderr, f"{args} on stdout")
for command in ("info", "inspect", "load", "sample", "bench", "trace"):
    for args in ([command, "--help"], ["help", command]):
        result = run(*args)
        expect(result.returncode == 0 and f"usage: devbuf {command}" in result.stdout, f"{' '.join(args)}")
result = run("trace", "replay", "--help")
expect(result.returncode == 0 and "usage: devbuf trace replay" in result.stdout, "trace replay --help")
# help about help, and -h, on every command: the usage on stdout, exit 0
for args in (["help", "--help"], ["help", "-h"], ["help", "help"], ["--help", "--help"]):
    result = run(*args)
    expect(result.returncode == 0 and "usage: devbuf <command>" in result.stdout and not result.stderr,
           f"{' '.join(args)}: exit {result.returncode}, usage on stdout")
for args in (["info", "-h"], ["inspect", "-h"], ["load", "-h"], ["sample", "-h"], ["bench", "-h"], ["trace", "-h"],
             ["trace", "view", "--help"], ["trace", "replay", "-h"], ["inspect", model, "--help"]):
    result = run(*args)
    expect(result.returncode == 0 and f"usage: devbuf {args[0]}" in result.stdout and not result.stderr,
           f"{' '.join(args)}: exit {result.returncode}, usage on stdout")

# mistakes in the call: usage on stderr, exit 2
mistakes = [
    [], ["nonsense"], ["help", "nonsense"], ["info", "--bogus"], ["inspect"], ["inspect", model, "--bogus"],
    ["inspect", model, model], ["load", model, "--bogus"], ["load", model, "--device"],
    ["load", model, "--device", "bogus:3"], ["load", model, "--expect"], ["sample"], ["sample", model, "--mib", "x"],
    ["sample", model, "--mib", "0"], ["bench", "--only", "nonsense"], ["bench", "--runs", "0"], ["bench", "--runs", "x"],
    ["bench", "--bogus"], ["trace"], ["trace", "nonsense"], ["trace", "replay"], ["trace", "replay", trace, "--bogus"],
    ["trace", "replay", trace, "--memory-limit", "lots"], ["trace", "replay", trace, "--memory-limit"],
    ["trace", "replay", trace, "--page", "1000"], ["trace", "replay", trace, "--page", "x"],
    ["trace", "view", trace], ["trace", "view", trace, "-o"], ["trace", "view", trace, "--json", "-o", "x.html"],
    # words no command takes, once accepted with exit 0 (--cuda-device picks a GPU of a
    # snapshot; a trace has one)
    ["--version", "extra"], ["version", "--bogus"], ["help", "trace", "--bogus"], ["help", "load", "replay"],
    ["trace", "replay", trace, "--cuda-device", "7"],
    ["trace", "view", trace, "-o", os.path.join(scratch, "x.html"), "--cuda-device", "0"],
]
for args in mistakes:
    result = run(*args)
    expect(result.returncode == 2 and "usage: devbuf" in result.stderr and not result.stdout,
           f"{args}: exit {result.returncode}, usage on stderr")

result = run("trace", "replay", trace, "--cuda-device", "7")
expect("--cuda-device chooses a GPU of a PyTorch snapshot" in result.stderr, f"--cuda-device on a trace: {result.stderr}")
result = run("trace", "replay", os.path.join(scratch, "missing.trace"), "--cuda-device", "7")
expect(result.returncode == 1 and "No such file" in result.stderr, f"--cuda-device, missing file: {result.stderr}")
for args in (["help", "trace", "replay"], ["help", "trace", "view", "--help"], ["version", "-h"]):
    result = run(*args)
    expect(result.returncode == 0 and "usage: devbuf" in result.stdout and not result.stderr, f"{args}: help")

# a stray argument is an argument, a stray dash-word an option
for args, word in ((["info", "foo"], "foo"), (["bench", "foo"], "foo"), (["inspect", model, "extra"], "extra"),
                   (["load", model, "extra"], "extra"), (["sample", model, "extra"], "extra"),
                   (["trace", "replay", trace, "extra"], "extra")):
    result = run(*args)
    expect(result.returncode == 2 and "unknown option" not in result.stderr and
           (f"unexpected argument '{word}'" in result.stderr or f"not also '{word}'" in result.stderr),
           f"{args}: '{word}' is called an argument: {result.stderr.splitlines()[:1]}")
for args in (["info", "--foo"], ["bench", "--foo"], ["inspect", model, "--foo"], ["sample", model, "--foo"]):
    result = run(*args)
    expect(result.returncode == 2 and "unknown option '--foo'" in result.stderr, f"{args}: an unknown option")

# sizes take units everywhere (binary: K, M, G, T and KB, MiB, ... are 1024-based)
sized = os.path.join(scratch, "sized.trace")
with open(sized, "w") as f:
    f.write("# devbuf trace 1\na 1 30000000\nf 1\n")  # reserves 30,003,200 bytes at 4 KiB pages
for page in ("2097152", "2M", "2MiB", "2mb", "2048K", "2048KiB", "2097152B"):
    result = run("trace", "replay", sized, "--page", page, "--json")
    expect(result.returncode == 0 and json.loads(result.stdout)["page_bytes"] == 2 << 20, f"--page {page}")
for limit, refused in (("28MiB", 1), ("28m", 1), ("29MiB", 0), ("29M", 0), ("1G", 0), ("1gib", 0), ("30003199", 1),
                       ("30003200", 0), ("29299K", 1), ("29299KiB", 1), ("29300kb", 0)):
    result = run("trace", "replay", sized, "--memory-limit", limit, "--json")
    expect(result.returncode == 0 and json.loads(result.stdout)["refused"] == refused,
           f"--memory-limit {limit}: {refused} refused")
for bad, why in (("1.5G", "is not a whole number"), ("-1", "is negative"), ("", "is empty"),
                 ("1X", "has an unknown unit"), ("2 MiB", "has an unknown unit"),
                 ("99999999999999999999", "is more than 2^64"), ("16EiB", "has an unknown unit"),
                 ("20000000T", "is more than 2^64"), ("M", "is not a number")):
    result = run("trace", "replay", sized, "--memory-limit", bad)
    expect(result.returncode == 2 and f"'{bad}' {why}" in result.stderr and "usage: devbuf trace" in result.stderr and not result.stdout,
           f"--memory-limit '{bad}' refused ({why}): {result.stderr.splitlines()[:1]}")
for zero in ("0", "0G", "0B"):  # once silently no limit at all
    result = run("trace", "replay", sized, "--memory-limit", zero)
    expect(result.returncode == 2 and f"--memory-limit takes at least 1 byte, not '{zero}'" in result.stderr
           and not result.stdout, f"--memory-limit {zero} refused: {result.stderr.splitlines()[:1]}")
result = run("trace", "view", sized, "-o", os.path.join(scratch, "zero.html"), "--memory-limit", "0")
expect(result.returncode == 2 and "at least 1 byte" in result.stderr, "trace view --memory-limit 0 refused")
result = run("trace", "replay", sized, "--page", "3M")
expect(result.returncode == 2 and "power of two" in result.stderr and "'3M'" in result.stderr, "--page 3M refused")
result = run("trace", "replay", sized, "--page", "2K")
expect(result.returncode == 2 and "from 4 KiB to 1 GiB" in result.stderr, "--page 2K refused")
result = run("trace", "replay", sized, "--page", "2G")
expect(result.returncode == 2 and "from 4 KiB to 1 GiB, not '2G'" in result.stderr, "--page 2G refused (usage)")

# --passes N: every figure covers the same passes, all N (counts summed, peaks the highest);
# `passes` gives each pass's own system allocations and refusals
for policy in ("devbuf", "cca"):
    for limit in ("28MiB", "1G"):
        one = json.loads(run("trace", "replay", sized, "--policy", policy, "--memory-limit", limit, "--json").stdout)
        result = run("trace", "replay", sized, "--policy", policy, "--memory-limit", limit, "--passes", "3", "--json")
        three = json.loads(result.stdout)
        expect(three["allocs"] == 3 * one["allocs"] and three["frees"] == 3 * one["frees"] and
               three["refused"] == sum(p["refused"] for p in three["passes"]) == 3 * one["refused"] and
               three["never_freed"] == 3 * one["never_freed"] and
               three["system_allocs"] == sum(p["system_allocs"] for p in three["passes"]) and
               three["cache_hits"] + three["system_allocs"] <= three["allocs"] - three["refused"] and
               three["peak_requested_bytes"] == one["peak_requested_bytes"],
               f"--passes 3 --policy {policy} --memory-limit {limit}: {three}")
text = run("trace", "replay", trace, "--passes", "8").stdout
expect("8 passes into one cache: 16 allocations, 16 frees" in text and "15 cache hits" in text and
       "pass 1: 1 system allocations" in text, f"--passes 8 text: {text}")

# `# t` times are numbers as the format's others are: a sign, 2^64 or more, or letters are
# refused naming the line (strtoull made them 2^64 - 5, 2^64 - 1 and 0)
timed = os.path.join(scratch, "timed.trace")
for value, ok in (("-5", False), ("18446744073709551616", False), ("abc", False), ("", False), ("5 x", False),
                  ("18446744073709551615", True), ("0", True)):
    with open(timed, "w") as f:
        f.write(f"# devbuf trace 1\n# t 1\na 1 100\n# t {value}\nf 1\n")
    result = run("trace", "view", timed, "-o", os.path.join(scratch, "timed.html"))
    if ok:
        expect(result.returncode == 0, f"# t {value}: accepted: {result.stderr.strip()!r}")
    else:
        expect(result.returncode == 1 and "trace line 4: '# t' takes the microseconds" in result.stderr and
               f"not '{value}'" in result.stderr and not result.stdout, f"# t {value!r}: {result.stderr.strip()!r}")

# --least-limit on a trace that allocates nothing: 0 bytes, any limit works (it said none
# was found)
empty = os.path.join(scratch, "empty.trace")
with open(empty, "w") as f:
    f.write("# devbuf trace 1\n# t 5\n")
result = run("trace", "replay", empty, "--least-limit")
expect(result.returncode == 0 and result.stdout.count("0 bytes: the trace allocates nothing, so any limit works") == 2
       and "none found" not in result.stdout, f"--least-limit on no allocations: {result.stdout}")
got = json.loads(run("trace", "replay", empty, "--least-limit", "--json").stdout)
expect(got["allocs"] == 0 and got["least_limit_bytes"] == {"devbuf": 0, "cca": 0},
       f"--least-limit --json on no allocations: {got}")

# trace replay's text: human units first, the exact bytes after them (--json keeps bytes)
result = run("trace", "replay", sized)
expect(result.returncode == 0 and "peak requested  28.6 MiB (30,000,000 bytes)" in result.stdout
       and "4 KiB page" in result.stdout, f"trace replay text in human units: {result.stdout}")

# sample --mib N writes a file of exactly N MiB; --size takes units
for args, size in ((["--mib", "1"], 1 << 20), (["--mib", "3"], 3 << 20), (["--size", "1500KiB"], 1500 << 10),
                   (["--size", "2M"], 2 << 20), (["--size", "1234567"], 1234567)):
    path = os.path.join(scratch, "sample-%s.safetensors" % args[1])
    result = run("sample", path, *args)
    expect(result.returncode == 0 and os.path.getsize(path) == size and
           run("load", path, "--verify").returncode == 0, f"sample {' '.join(args)}: {size} bytes, loads")
expect(os.path.getsize(model) == 2 << 20, "sample --mib 2 is 2 MiB")
for args in (["--size", "1.5M"], ["--size", "1000"], ["--size", "2T"], ["--mib", "2M"]):
    result = run("sample", os.path.join(scratch, "never.safetensors"), *args)
    expect(result.returncode == 2 and f"'{args[1]}'" in result.stderr, f"sample {' '.join(args)} refused")

# file errors carry the system's reason
result = run("sample", os.path.join(model, "inside-a-file.safetensors"), "--mib", "1")
expect(result.returncode == 1 and "Not a directory" in result.stderr, f"sample: the reason: {result.stderr}")
result = run("load", model, "--expect", os.path.join(scratch, "no-such-list"))
expect(result.returncode == 1 and "No such file or directory" in result.stderr, "load --expect: the reason")
result = run("inspect", os.path.join(scratch, "no-such.safetensors"))
expect(result.returncode == 1 and "No such file or directory" in result.stderr, "inspect: the reason")
result = subprocess.run([tool, "bench", "--only", "load", "--quick", "--runs", "1"], capture_output=True, text=True,
                        env=dict(env, TMPDIR=os.path.join(scratch, "no-such-folder")), timeout=300)
expect(result.returncode == 0 and "No such file or directory" in result.stdout, "bench: why the load section skipped")

# load --expect reads its list first: a missing or malformed list fails before any loading
fresh_cache = os.path.join(scratch, "fresh-cache")
not_a_list = os.path.join(scratch, "not-a-list.txt")
with open(not_a_list, "w") as f:
    f.write("this is no digest list\n")
twice = os.path.join(scratch, "twice.txt")
with open(twice, "w") as f:
    f.write("  " + "a" * 64 + "  w\n  " + "b" * 64 + "  w\n")
for listing, why in ((os.path.join(scratch, "no-such-list"), "No such file"), (not_a_list, "no digest line"),
                     (twice, "two different digests")):
    result = subprocess.run([tool, "load", "--expect", listing], capture_output=True, text=True, timeout=60,
                            env=dict(env, XDG_CACHE_HOME=fresh_cache))
    expect(result.returncode == 1 and why in result.stderr and not result.stdout and not os.path.exists(fresh_cache),
           f"load --expect {os.path.basename(listing)} fails before loading ({why}): {result.stderr}")
    result = run("load", os.path.join(scratch, "no-such-model"), "--expect", listing)
    expect(result.returncode == 1 and why in result.stderr and "no-such-model" not in result.stderr,
           f"load --expect {os.path.basename(listing)}: the list is read before the file")

info_devices = json.loads(run("info", "--json").stdout)["devices"]

# bench's traces table shows every trace's whole name (it used to cut them from the left)
traces_dir = os.path.join(scratch, "traces")
source = "a-rather-long-source-folder-name-for-the-table"
trace_name = "an_equally_long_trace_file_name_that_used_to_be_cut_off.trace"
os.makedirs(os.path.join(traces_dir, source))
shutil.copy(sized, os.path.join(traces_dir, source, trace_name))
with open(os.path.join(traces_dir, source, "figures.json"), "w") as f:
    json.dump([{"trace": trace_name, "cca_peak_reserved": 31457280, "cca_system_allocs": 1}], f, indent=1)
result = run("bench", "--only", "traces", "--traces", traces_dir, "--runs", "1")
expect(result.returncode == 0 and f"{source}/{trace_name}" in result.stdout.splitlines()[4:6][-1].strip(),
       f"bench traces: the whole name: {result.stdout}")

# ... and sets a run whose CCA had expandable segments against growable segments: six 6 MiB
# blocks, every other one freed, then 12 MiB. Fixed segments at CCA's 48 MiB strand the holes
# and refuse it; growable ones give the holes' pages back and serve it.
mib = 1 << 20
fragments = os.path.join(scratch, "expandable-traces")
os.makedirs(os.path.join(fragments, "runs"))
with open(os.path.join(fragments, "runs", "holes.trace"), "w") as f:
    f.write("# devbuf trace 1\n" + "".join(f"a {i} {6 * mib}\n" for i in range(1, 7)) +
            "f 1\nf 3\nf 5\n" + f"a 7 {12 * mib}\n")
for expandable, refused in ((False, "2"), (True, "0")):  # both passes
    with open(os.path.join(fragments, "runs", "figures.json"), "w") as f:
        json.dump([{"trace": "holes.trace", "cca_peak_reserved": 48 * mib, "cca_system_allocs": 1,
                    "allocator_settings": {"expandable_segments": expandable}}], f, indent=1)
    result = run("bench", "--only", "traces", "--traces", fragments, "--runs", "1")
    lines = result.stdout.splitlines()
    named = [i for i, line in enumerate(lines) if "runs/holes.trace" in line]
    rows = [lines[i].split() for i in range(named[0] + 1, named[0] + 3)] if named else []
    expect(result.returncode == 0 and len(rows) == 2 and all(row[0] == "2" or row[0] == "4" for row in rows) and
           all(row[row.index("|") + 1] == refused and ("*|" in " ".join(row)) != expandable for row in rows) and
           ("(CCA ran with expandable segments" in lines[named[0]]) == expandable,
           f"bench traces, expandable segments {expandable}: {refused} refused at CCA's peak: {result.stdout}")

# ... and escapes what it prints from the folder's names and figures.json
hostile = os.path.join(scratch, "traces\x1b]0;x\x07")
os.makedirs(os.path.join(hostile, "src\x1b[31m"))
shutil.copy(sized, os.path.join(hostile, "src\x1b[31m", "t\x1b[2J.trace"))
with open(os.path.join(hostile, "src\x1b[31m", "figures.json"), "w") as f:
    f.write('[{"trace": "t\x1b[2J.trace", "cca_peak_reserved": 31457280, "cca_system_allocs": 1}]')
result = run("bench", "--only", "traces", "--traces", hostile, "--runs", "1")
expect(result.returncode == 0 and "\x1b" not in result.stdout + result.stderr and "\x07" not in result.stdout and
       "traces\\x1b]0;x\\x07)" in result.stdout and "src\\x1b[31m/t\\x1b[2J.trace" in result.stdout,
       f"bench traces: names escaped: {result.stdout[:600]!r}")

# ... and fails (exit 1, each named on stderr, --json too) where figures.json names a
# trace that is missing or malformed, gives an entry no figures, or is not there
broken = os.path.join(scratch, "broken-traces")
os.makedirs(os.path.join(broken, "a"))
os.makedirs(os.path.join(broken, "b"))
os.makedirs(os.path.join(broken, "c"))
shutil.copy(sized, os.path.join(broken, "a", "ok.trace"))
with open(os.path.join(broken, "a", "bad.trace"), "w") as f:
    f.write("# devbuf trace 1\na 2 5\n")
with open(os.path.join(broken, "a", "figures.json"), "w") as f:
    json.dump([{"trace": name, "cca_peak_reserved": 31457280, "cca_system_allocs": 1}
               for name in ("ok.trace", "missing.trace", "bad.trace")] + [{"trace": "bare.trace"}], f)
with open(os.path.join(broken, "b", "figures.json"), "w") as f:
    f.write("{}")
for extra in ([], ["--json"]):
    result = run("bench", "--only", "traces", "--traces", broken, "--runs", "1", *extra)
    expect(result.returncode == 1 and "a/missing.trace at the 2 MiB page cannot be replayed" in result.stderr and
           "a/bad.trace at the 4 KiB page cannot be replayed: FORMAT_ERROR: trace line 2" in result.stderr and
           "the entry of bare.trace lacks" in result.stderr and "b/figures.json names no trace" in result.stderr and
           "cannot read " + os.path.join(broken, "c", "figures.json") in result.stderr and
           "7 trace rows or figures could not be measured" in result.stderr,
           f"bench --traces with broken entries {extra}: exit {result.returncode}, {result.stderr!r}")
    if extra:
        expect(any("ok.trace" in f["name"] for f in json.loads(result.stdout)["figures"]),
               "bench --json still gives the rows it measured")
# bench --json whose document cannot be written fails, as any other output
if os.path.exists("/dev/full"):
    with open("/dev/full", "w") as full:
        result = subprocess.run([tool, "bench", "--only", "threads", "--quick", "--runs", "1", "--json"], stdout=full,
                                stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    expect(result.returncode == 1 and "cannot write the output: No space left on device" in result.stderr,
           f"bench --json > /dev/full: exit {result.returncode}, {result.stderr.strip()!r}")
# --only, --load and --traces are refused where the device's benchmarks would ignore them
# (OpenCL measures alloc, copy and queue; CUDA alloc, copy and load), and run as asked where
# it measures them
result = run("bench", "--only", "alloc", "--traces", traces_dir)
expect(result.returncode == 2 and "--traces is for the traces section" in result.stderr, "bench --only alloc --traces")
fake_cuda = os.path.join(build_dir, "tests", "libfake_cuda.so")
devices = [d["spec"] for d in info_devices if d["available"] and d["spec"] == "opencl:0"]
cuda_env = dict(env, DEVBUF_CUDA_LIBRARY=fake_cuda)
# A replay with another device's policy maps growable segments through its counting
# upstream, in the page asked for: a CUDA device's own 2 MiB maps do not bind it.
if os.path.exists(fake_cuda):
    result = subprocess.run([tool, "trace", "replay", sized, "--device", "cuda:0", "--page", "4KiB",
                             "--growable"], capture_output=True, text=True, env=cuda_env, timeout=60)
    expect(result.returncode == 0 and "4 KiB page, growable segments" in result.stdout,
           f"trace replay --device cuda:0 --page 4KiB --growable: {result.returncode} {result.stderr}")
for spec, device_env, wrong, right in (("opencl:0", env, ["threads", "traces", "share", "load"], "queue"),
                                       ("cuda:0", cuda_env, ["threads", "traces", "queue"], "alloc")):
    if (spec == "opencl:0" and not devices) or (spec == "cuda:0" and not os.path.exists(fake_cuda)):
        print(f"skipped: bench --device {spec} (not available)")
        continue
    for args, why in [(["--load"] if section == "load" else ["--only", section], f"{spec} measures no such section")
                      for section in wrong] + [(["--traces", traces_dir], "measures no traces")]:
        try:  # refused at once: a run of the device's sections would take minutes
            result = subprocess.run([tool, "bench", "--device", spec, "--quick", "--runs", "1", *args],
                                    capture_output=True, text=True, env=device_env, timeout=60)
            expect(result.returncode == 2 and why in result.stderr and not result.stdout,
                   f"bench --device {spec} {' '.join(args)}: exit {result.returncode}, {result.stderr.splitlines()[:1]}")
        except subprocess.TimeoutExpired:
            expect(False, f"bench --device {spec} {' '.join(args)}: ran the device's benchmarks")
    result = subprocess.run([tool, "bench", "--device", spec, "--only", right, "--quick", "--runs", "1"],
                            capture_output=True, text=True, env=device_env, timeout=300)
    expect(result.returncode == 0 and result.stdout.count("\n== ") == 1,
           f"bench --device {spec} --only {right}: one section: {result.stdout}")

# failures: exit 1, a message, no usage
for args in (["inspect", os.path.join(scratch, "missing.safetensors")], ["load", os.path.join(scratch, "missing")],
             ["trace", "replay", os.path.join(scratch, "missing.trace")], ["load", model, "--device", "cuda:7"]):
    result = run(*args)
    expect(result.returncode == 1 and result.stderr and "usage:" not in result.stderr, f"{args}: exit 1")

# a missing trace is named whole, escaped, however long its path (it was cut at 200
# characters, which could leave the name of a folder that exists)
deep = os.path.join(scratch, "d" * 240)
os.makedirs(deep, exist_ok=True)
for missing in (os.path.join(deep, "missing.trace"), os.path.join(deep, "esc\x1b[2J" + "e" * 200 + ".trace")):
    shown = missing.replace("\x1b", "\\x1b")
    for args in (["trace", "replay", missing], ["trace", "view", missing, "-o", os.path.join(scratch, "m.html")]):
        result = run(*args)
        expect(result.returncode == 1 and f"cannot open '{shown}': No such file or directory" in result.stderr
               and "\x1b" not in result.stderr, f"{args[:2]} names the missing {len(missing)}-byte path whole: "
               f"{result.stderr.strip()[:80]!r}...{result.stderr.strip()[-80:]!r}")

# a FIFO where a file is expected: refused at once, never waited on
fifo = os.path.join(scratch, "fifo")
os.mkfifo(fifo)
for args in (["trace", "view", fifo, "-o", os.path.join(scratch, "fifo.html")], ["load", model, "--expect", fifo],
             ["inspect", fifo], ["trace", "replay", fifo]):
    try:
        result = run(*args, timeout=20)
        expect(result.returncode == 1 and "regular file" in result.stderr, f"{args}: a FIFO is refused")
    except subprocess.TimeoutExpired:
        expect(False, f"{args}: waited on a FIFO")
# ... and where the page is to be written: never opened to wait for a reader
for target, kind in ((fifo, "a FIFO"), ("/dev/null", "a character device"), (scratch, "a folder")):
    try:
        result = run("trace", "view", trace, "-o", target, timeout=20)
        expect(result.returncode == 1 and f"it is {kind}, not a regular file" in result.stderr and not result.stdout,
               f"trace view -o {target}: refused: {result.returncode} {result.stderr.strip()!r}")
    except subprocess.TimeoutExpired:
        expect(False, f"trace view -o {target}: waited on it")
expect(stat.S_ISFIFO(os.lstat(fifo).st_mode), "trace view -o FIFO: the FIFO is left as it was")

# --json documents
info = json.loads(run("info", "--json").stdout)
expect(info["version"] and any(d["spec"] == "cpu" and d["available"] for d in info["devices"]), "info --json")
expect(all(("reason" in d) != d["available"] for d in info["devices"]), "info --json: a reason for each absent device")
inspected = json.loads(run("inspect", model, "--json").stdout)
expect({"file", "header_size", "data_size", "metadata", "tensors"} <= set(inspected), "inspect --json fields")
replayed = json.loads(run("trace", "replay", trace, "--json").stdout)
expect(replayed["allocs"] == 2 and replayed["frees"] == 2 and replayed["peak_requested_bytes"] == 5100 and
       replayed["peak_reserved_bytes"] >= 5100, "trace replay --json figures")
big = os.path.join(scratch, "big.trace")
with open(big, "w") as f:
    f.write("# devbuf trace 1\na 1 30000000\nf 1\n")
# A request above 10 MiB takes a segment of its own, rounded to 2 MiB (or a larger page).
paged = json.loads(run("trace", "replay", big, "--page", str(2 << 20), "--json").stdout)
expect(paged["page_bytes"] == 2 << 20 and paged["peak_reserved_bytes"] == 15 << 21, "trace replay --page 2 MiB")
paged = json.loads(run("trace", "replay", big, "--json").stdout)
expect(paged["page_bytes"] == 4096 and paged["peak_reserved_bytes"] == 15 << 21, "trace replay at the CPU's page")
paged = json.loads(run("trace", "replay", big, "--page", str(4 << 20), "--json").stdout)
expect(paged["page_bytes"] == 4 << 20 and paged["peak_reserved_bytes"] == 8 << 22, "trace replay --page 4 MiB")
result = run("bench", "--only", "threads", "--quick", "--runs", "1", "--json")
benched = json.loads(result.stdout)
expect(result.returncode == 0 and benched["device"] == "cpu" and
       all({"section", "name", "value", "unit"} <= set(f) for f in benched["figures"]) and benched["figures"],
       "bench --json")
result = run("load", model, "--verify", "--json")
loaded = json.loads(result.stdout)
expect(result.returncode == 0 and loaded["tensors"] == len(loaded["digests"]) > 0, "load --verify --json")

# digests: what hashlib computes from the file's bytes
with open(model, "rb") as f:
    data = f.read()
header_size = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + header_size])
base = 8 + header_size
by_name = {d["name"]: d["sha256"] for d in loaded["digests"]}
for name, entry in header.items():
    if name == "__metadata__":
        continue
    begin, end = entry["data_offsets"]
    expect(by_name.get(name) == hashlib.sha256(data[base + begin:base + end]).hexdigest(), f"digest of {name}")

# the portable SHA-256 gives the same digests as the one with the CPU's SHA extensions
portable = subprocess.run([tool, "load", model, "--verify", "--json"], capture_output=True, text=True,
                          env=dict(env, DEVBUF_SHA256_PORTABLE="1"))
expect({d["name"]: d["sha256"] for d in json.loads(portable.stdout)["digests"]} == by_name,
       "portable SHA-256 digests")

# --expect: a saved text output passes; a changed digest fails naming the tensor
saved = os.path.join(scratch, "digests.txt")
with open(saved, "w") as f:
    f.write(run("load", model, "--verify").stdout)
result = run("load", model, "--expect", saved)
expect(result.returncode == 0, "--expect passes on the saved list")
lines = open(saved).read().splitlines()
changed = next(i for i, line in enumerate(lines) if len(line.strip()) > 66 and line.strip()[64:66] == "  ")
victim = lines[changed].strip()[66:]
digest = lines[changed].strip()[:64]
lines[changed] = "  " + ("0" if digest[0] != "0" else "1") + digest[1:] + "  " + victim
with open(saved, "w") as f:
    f.write("\n".join(lines) + "\n")
result = run("load", model, "--expect", saved)
expect(result.returncode == 1 and f"tensor '{victim}' differs" in result.stderr, "--expect fails on a changed digest")
lines.append("  " + "a" * 64 + "  no.such.tensor")
with open(saved, "w") as f:
    f.write("\n".join(lines) + "\n")
result = run("load", model, "--expect", saved)
expect(result.returncode == 1 and "no.such.tensor" in result.stderr, "--expect names a tensor missing from the file")

# --expect matches the raw bytes of names: a tensor named "w" + byte 0x01 does not pass a
# list that names the literal text "w\x01" (escapes are only for printing), and names
# from the list are printed escaped, never raw to the terminal
def write_one_tensor(path, name):
    header = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
odd = os.path.join(scratch, "odd_name.safetensors")
write_one_tensor(odd, "w\x01")
odd_digests = run("load", odd, "--verify").stdout
expect("w\\x01" in odd_digests and "\x01" not in odd_digests, "a control byte in a name is printed escaped")
with open(saved, "w") as f:
    f.write(odd_digests)
expect(run("load", odd, "--expect", saved).returncode == 0, "--expect passes on the name's own escaped form")
renamed = os.path.join(scratch, "renamed.safetensors")
write_one_tensor(renamed, "w\\x01")  # the literal text: backslash, x, 0, 1
result = run("load", renamed, "--expect", saved)
expect(result.returncode == 1 and "not in the expected list" in result.stderr,
       "a tensor renamed to the escaped text of another name does not pass")
expect("w\\x5cx01" in run("load", renamed, "--verify").stdout, "a literal backslash is printed escaped")
with open(saved, "w") as f:
    f.write("  " + "a" * 64 + "  evil\x1b]0;title\x07\n")
    f.write("  " + "a" * 64 + "  raw\x1b[31mred\n")
result = run("load", odd, "--expect", saved)
expect(result.returncode == 1 and "\x1b" not in result.stderr and "\x07" not in result.stderr
       and "evil\\x1b]0;title\\x07" in result.stderr, "names from the list are printed escaped")

# The tool's own digest lists pass --expect: with a line given twice, with an empty name,
# and with a name longer than any fixed buffer (printed whole).
for label, name in (("empty", ""), ("long", "n" * 3000 + "\x01")):
    path = os.path.join(scratch, f"{label}_name.safetensors")
    write_one_tensor(path, name)
    digests = run("load", path, "--verify").stdout
    with open(saved, "w") as f:
        f.write(digests + digests)  # every line twice
    result = run("load", path, "--expect", saved)
    expect(result.returncode == 0, f"--expect on its own list, twice over, {label} name: {result.stderr[-300:]!r}")

# load without FILE: the sample model in the cache folder, not in the build tree
result = run("load", "--json")
expect(result.returncode == 0 and json.loads(result.stdout)["file"].startswith(env["XDG_CACHE_HOME"]),
       "load without FILE uses the cache folder")

# no build-tree path in the tool's data (its debug information may name sources, and so do
# the sanitizers' reports, which a sanitized build compiles in)
rodata = subprocess.run(["readelf", "-p", ".rodata", tool], capture_output=True).stdout.decode("utf-8", "replace")
rodata = "".join(line.split("]", 1)[-1].strip() for line in rodata.splitlines())
if sanitizers:
    print(f"skipped: the search for build paths in the tool ({sanitizers} builds name their sources)")
else:
    for folder in {os.path.realpath(build_dir), os.path.realpath(source_dir)}:
        expect(folder not in rodata, f"the tool's data names {folder}")

# bench leaves nothing in $TMPDIR (its weight file included)
result = run("bench", "--only", "load", "--quick", "--runs", "1", timeout=900)
expect(result.returncode == 0, f"bench --only load: exit {result.returncode}: {result.stderr[-300:]}")
expect(os.listdir(env["TMPDIR"]) == [], f"bench left {os.listdir(env['TMPDIR'])} in TMPDIR")

print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
