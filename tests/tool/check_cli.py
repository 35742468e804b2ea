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
for args in (["help"], ["--help"], ["-h"]):
    result = run(*args)
    expect(result.returncode == 0 and "usage: devbuf" in result.stdout and not result.stderr, f"{args} on stdout")
for command in ("info", "inspect", "load", "sample", "bench", "trace"):
    for args in ([command, "--help"], ["help", command]):
        result = run(*args)
        expect(result.returncode == 0 and f"usage: devbuf {command}" in result.stdout, f"{' '.join(args)}")
result = run("trace", "replay", "--help")
expect(result.returncode == 0 and "usage: devbuf trace replay" in result.stdout, "trace replay --help")

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
]
for args in mistakes:
    result = run(*args)
    expect(result.returncode == 2 and "usage: devbuf" in result.stderr and not result.stdout,
           f"{args}: exit {result.returncode}, usage on stderr")

# failures: exit 1, a message, no usage
for args in (["inspect", os.path.join(scratch, "missing.safetensors")], ["load", os.path.join(scratch, "missing")],
             ["trace", "replay", os.path.join(scratch, "missing.trace")], ["load", model, "--device", "cuda:7"]):
    result = run(*args)
    expect(result.returncode == 1 and result.stderr and "usage:" not in result.stderr, f"{args}: exit 1")

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
# A request above 10 MiB takes a segment of its own, rounded to the page.
paged = json.loads(run("trace", "replay", big, "--page", str(2 << 20), "--json").stdout)
expect(paged["page_bytes"] == 2 << 20 and paged["peak_reserved_bytes"] == 15 << 21, "trace replay --page 2 MiB")
paged = json.loads(run("trace", "replay", big, "--json").stdout)
expect(paged["page_bytes"] == 4096 and paged["peak_reserved_bytes"] == 30003200, "trace replay at the CPU's page")
result = run("bench", "--only", "threads", "--runs", "1", "--json")
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
