#!/usr/bin/env python3
"""examples/embed/embed.py (the Python package's run of the model) against devbuf-embed on
the same device and input: the --json documents' shape, the same texts and token ids, the
same embeddings (measured: the same bits, both run the same kernels with the same grids;
asked: max abs difference <= 1e-6 and cosine >= 0.999999 per sentence), the same memory
figures (same allocator, same requests in the same order), and cosine >= 0.9999 with
sentence-transformers' embeddings (tests/data/embed/reference.safetensors, as check_embed.py
asks on opencl:0); the same documents on tests/data/embed/invalid_utf8.txt. Then the text
output on a subset at other batch sizes and from standard input, and the exits: 1 naming a
missing model folder, an unreadable input or a device that is not OpenCL; 2 for a usage
error.

usage: check_embed_py.py EMBED_PY DEVBUF_EMBED MODEL_DIR DEVICE
Runs embed.py with this Python (the package on PYTHONPATH); exits 77 (skip) where the
device does not open or this Python lacks numpy, safetensors or tokenizers."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

missing = [name for name in ("numpy", "safetensors", "tokenizers") if importlib.util.find_spec(name) is None]
if missing:
    print(f"SKIP: {sys.executable} lacks {', '.join(missing)} (scripts/python_env.sh installs them)")
    sys.exit(77)

import numpy as np  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from corpus import read_lines  # noqa: E402  (tests/embed/corpus.py)

here = os.path.dirname(os.path.abspath(__file__))
data = os.path.join(here, "..", "data", "embed")
script, tool, model, device = sys.argv[1:5]
MAX_ABS, MIN_COSINE, MIN_REFERENCE_COSINE = 1e-6, 0.999999, 0.9999
failures = 0


def expect(condition, what):
    global failures
    if not condition:
        failures += 1
        print(f"FAIL: {what}", file=sys.stderr)


def run(command, stdin=None):
    return subprocess.run(command, input=stdin, capture_output=True, timeout=600)


def both(args, stdin=None):
    """The outputs of devbuf-embed and embed.py with the same arguments."""
    outputs = []
    for name, command in (("devbuf-embed", [tool]), ("embed.py", [sys.executable, script])):
        result = run(command + ["--model", model, "--device", device, *args], stdin)
        if result.returncode == 1 and b"UNAVAILABLE" in result.stderr:  # no such device here
            print(f"SKIP: {result.stderr.decode(errors='replace').strip()}")
            sys.exit(77)
        if result.returncode != 0:
            sys.exit(f"{name} {' '.join(args)} exited {result.returncode}: {result.stderr.decode(errors='replace')}")
        outputs.append(result.stdout)
    return outputs


def compare(what, c_rows, py_rows):
    """Embeddings of both programs, row by row: the largest difference and the lowest cosine."""
    c, py = np.asarray(c_rows, np.float64), np.asarray(py_rows, np.float64)
    if c.shape != py.shape:
        expect(False, f"{what}: embeddings of shape {py.shape}, devbuf-embed's {c.shape}")
        return
    worst = float(np.abs(c - py).max()) if c.size else 0.0
    cosines = (c * py).sum(1) / (np.linalg.norm(c, axis=1) * np.linalg.norm(py, axis=1)) if len(c) else np.ones(1)
    lowest = float(np.nan_to_num(cosines, nan=-2.0).min())
    identical = np.array_equal(c, py)
    print(f"{what}: {len(c)} embeddings, max abs difference {worst:.3g}, min cosine {lowest:.9f}"
          f"{' (identical)' if identical else ''}")
    expect(worst <= MAX_ABS, f"{what}: max abs difference {worst:.3g} over {MAX_ABS}")
    expect(lowest >= MIN_COSINE, f"{what}: min cosine {lowest:.9f} below {MIN_COSINE}")


corpus_path = os.path.join(data, "corpus.txt")
_, lines = read_lines(corpus_path)
c_out, py_out = both(["--json", corpus_path])
c_doc, py_doc = json.loads(c_out), json.loads(py_out)
expect(set(py_doc) == {"device", "sentences", "memory", "seconds"}, f"top-level keys {sorted(py_doc)}")
expect(py_doc["device"] == c_doc["device"] == device, f"device {py_doc['device']!r}")
expect(set(py_doc["memory"]) == {"peak_reserved", "peak_active", "system_allocs"},
       f"memory keys {sorted(py_doc['memory'])}")
expect(isinstance(py_doc["seconds"], (int, float)) and py_doc["seconds"] > 0, "seconds")
sentences = py_doc["sentences"]
expect(len(sentences) == len(c_doc["sentences"]) == len(lines),
       f"{len(sentences)} sentences, devbuf-embed {len(c_doc['sentences'])}, {len(lines)} lines")
ids_differ = [i for i, (p, c) in enumerate(zip(sentences, c_doc["sentences"])) if p["ids"] != c["ids"]]
expect(not ids_differ, f"token ids differ from devbuf-embed's on lines {[i + 1 for i in ids_differ[:10]]}")
for i, (p, c) in enumerate(zip(sentences, c_doc["sentences"])):
    expect(set(p) == {"text", "ids", "embedding"}, f"sentence {i} keys {sorted(p)}")
    expect(p["text"] == c["text"] == lines[i].decode("utf-8", errors="replace"), f"sentence {i} text")
print(f"{device}: {len(sentences)} sentences, token ids equal on {len(sentences) - len(ids_differ)}")
compare(f"{device} corpus --json", [s["embedding"] for s in c_doc["sentences"]], [s["embedding"] for s in sentences])
# The whole document but the time: the same bytes where the embeddings are the same.
strip = lambda text: text[:text.rindex(b'"seconds"')]  # noqa: E731
print(f"{device}: documents without seconds {'byte-identical' if strip(c_out) == strip(py_out) else 'differ'}")
print(f"{device}: memory {py_doc['memory']}, devbuf-embed {c_doc['memory']}")
expect(py_doc["memory"] == c_doc["memory"], f"memory {py_doc['memory']}, devbuf-embed's {c_doc['memory']}")
print(f"{device}: seconds {py_doc['seconds']:.3f}, devbuf-embed {c_doc['seconds']:.3f}")

reference = load_file(os.path.join(data, "reference.safetensors"))["embeddings"].astype(np.float64)
got = np.asarray([s["embedding"] for s in sentences], np.float64)
if got.shape == reference.shape:
    cosines = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
    lowest = float(np.nan_to_num(cosines, nan=-2.0).min())
    print(f"{device}: min cosine with sentence-transformers {lowest:.9f} (line {int(cosines.argmin()) + 1})")
    expect(lowest >= MIN_REFERENCE_COSINE, f"min cosine with the reference {lowest:.9f} below {MIN_REFERENCE_COSINE}")
else:
    expect(False, f"embeddings {got.shape}, reference {reference.shape}")

# Ill-formed UTF-8: the same replaced texts (JSON escapes included) and ids.
invalid = os.path.join(data, "invalid_utf8.txt")
c_out, py_out = both(["--json", invalid])
c_doc, py_doc = json.loads(c_out), json.loads(py_out)
expect([(s["text"], s["ids"]) for s in py_doc["sentences"]] == [(s["text"], s["ids"]) for s in c_doc["sentences"]],
       "invalid_utf8.txt: texts or ids differ from devbuf-embed's")
compare(f"{device} invalid_utf8.txt --json", [s["embedding"] for s in c_doc["sentences"]],
        [s["embedding"] for s in py_doc["sentences"]])
expect(strip(c_out) == strip(py_out), "invalid_utf8.txt: the documents (but seconds) differ")

with tempfile.TemporaryDirectory() as scratch:
    # The text output at other batch shapes, from a file and from standard input.
    subset = os.path.join(scratch, "subset.txt")
    text = b"".join(line + b"\n" for line in lines[:40])
    open(subset, "wb").write(text)
    for args, stdin in ((["--batch", "1", subset], None), (["--batch", "7", "-"], text)):
        c_text, py_text = both(args, stdin)
        c_rows = [[float(v) for v in row.split()] for row in c_text.decode().splitlines()]
        py_rows = [[float(v) for v in row.split()] for row in py_text.decode().splitlines()]
        expect(len(py_rows) == 40 and all(len(row) == 384 for row in py_rows), f"{args}: 40 lines of 384 floats")
        compare(f"{device} text {' '.join(args)}", c_rows, py_rows)
    empty = os.path.join(scratch, "empty.txt")
    open(empty, "wb").close()
    c_empty, py_empty = both(["--json", empty])
    expect(json.loads(py_empty)["sentences"] == [], "an empty input has no sentences")

    def embed_py(*args):
        return run([sys.executable, script, *args])

    no_model = embed_py("--model", os.path.join(scratch, "no-model"), "--device", device, subset)
    expect(no_model.returncode == 1 and b"no-model" in no_model.stderr and no_model.stderr.count(b"\n") == 1,
           f"a missing model folder exits 1 naming it on one line: {no_model.returncode} {no_model.stderr[-300:]!r}")
    no_input = embed_py("--model", model, "--device", device, os.path.join(scratch, "no-input.txt"))
    expect(no_input.returncode == 1 and b"no-input.txt" in no_input.stderr,
           f"an unreadable input exits 1 naming it: {no_input.returncode} {no_input.stderr[-300:]!r}")
    cpu = embed_py("--model", model, "--device", "cpu", subset)
    expect(cpu.returncode == 1 and b"opencl" in cpu.stderr and cpu.stderr.count(b"\n") == 1,
           f"--device cpu exits 1 asking for opencl:N: {cpu.returncode} {cpu.stderr[-300:]!r}")
    nowhere = embed_py("--model", model, "--device", "opencl:63", subset)
    expect(nowhere.returncode == 1 and b"UNAVAILABLE" in nowhere.stderr and nowhere.stderr.count(b"\n") == 1,
           f"a device that does not open exits 1 on one line: {nowhere.returncode} {nowhere.stderr[-300:]!r}")
    expect(embed_py("--model", model, "--batch", "zero", subset).returncode == 2, "a bad --batch exits 2")
    expect(embed_py("--bogus").returncode == 2, "an unknown option exits 2")

sys.exit(1 if failures else 0)
