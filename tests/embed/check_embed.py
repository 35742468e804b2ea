#!/usr/bin/env python3
"""devbuf-embed against sentence-transformers' embeddings (tests/data/embed/reference.safetensors):
the --json document's exact shape, each sentence's text and token count, each embedding's
cosine with the reference, and the memory figures (peak reserved at most 1.05 x peak
active; at a fixed batch shape no system allocation after the first batch). Also its exits:
1 naming the problem for a missing model folder or an unreadable input, 2 for a usage error.

usage: check_embed.py TOOL MODEL_DIR DEVICE MIN_COSINE
Reads the reference with numpy and safetensors (the test venv's)."""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

from corpus import read_lines  # tests/embed/corpus.py

here = os.path.dirname(os.path.abspath(__file__))
data = os.path.join(here, "..", "data", "embed")
tool, model, device, min_cosine = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
failures = 0


def expect(condition, what):
    global failures
    if not condition:
        failures += 1
        print(f"FAIL: {what}", file=sys.stderr)


def embed(path, *extra):
    result = subprocess.run([tool, "--model", model, "--device", device, "--json", *extra, path],
                            capture_output=True, timeout=1200)
    if result.returncode == 1 and b"UNAVAILABLE" in result.stderr:  # no such device here
        print(f"SKIP: {result.stderr.decode(errors='replace').strip()}")
        sys.exit(77)
    if result.returncode != 0:
        sys.exit(f"devbuf-embed {' '.join(extra)} {path} exited {result.returncode}: "
                 f"{result.stderr.decode(errors='replace')}")
    return json.loads(result.stdout)


corpus_path = os.path.join(data, "corpus.txt")
_, lines = read_lines(corpus_path)
reference = load_file(os.path.join(data, "reference.safetensors"))
expected, tokens = reference["embeddings"], reference["num_tokens"]

document = embed(corpus_path)
expect(set(document) == {"device", "sentences", "memory", "seconds"}, f"top-level keys {sorted(document)}")
expect(document["device"] == device, f"device {document['device']!r}")
expect(set(document["memory"]) == {"peak_reserved", "peak_active", "system_allocs"},
       f"memory keys {sorted(document['memory'])}")
expect(isinstance(document["seconds"], (int, float)) and document["seconds"] > 0, "seconds")
sentences = document["sentences"]
expect(len(sentences) == len(lines), f"{len(sentences)} sentences for {len(lines)} lines")
worst = (2.0, -1)
for i, (sentence, line) in enumerate(zip(sentences, lines)):
    expect(set(sentence) == {"text", "ids", "embedding"}, f"sentence {i} keys {sorted(sentence)}")
    expect(sentence["text"] == line.decode("utf-8", errors="replace"), f"sentence {i} text")
    expect(len(sentence["ids"]) == int(tokens[i]), f"sentence {i}: {len(sentence['ids'])} ids, "
           f"sentence-transformers has {int(tokens[i])}")
    got = np.asarray(sentence["embedding"], dtype=np.float64)
    expect(got.shape == (384,), f"sentence {i} embedding shape {got.shape}")
    want = expected[i].astype(np.float64)
    cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
    if not math.isfinite(cosine):
        cosine = -2.0
    worst = min(worst, (cosine, i))
print(f"{device}: {len(sentences)} sentences, min cosine {worst[0]:.9f} (line {worst[1]})")
expect(worst[0] >= min_cosine, f"min cosine {worst[0]:.9f} below {min_cosine} (line {worst[1]})")
memory = document["memory"]
print(f"{device}: memory {memory}")
expect(memory["peak_reserved"] <= 1.05 * memory["peak_active"],
       f"peak reserved {memory['peak_reserved']} over 1.05 x peak active {memory['peak_active']}")

with tempfile.TemporaryDirectory() as scratch:
    # Small working sets too: one sentence at a time, and two short ones.
    subset, short = os.path.join(scratch, "subset.txt"), os.path.join(scratch, "short.txt")
    open(subset, "wb").write(b"".join(line + b"\n" for line in lines[:60]))
    open(short, "w").write("a few words\nand a few more words here\n")
    for path, extra in ((subset, ("--batch", "1")), (short, ())):
        small = embed(path, *extra)["memory"]
        print(f"{device}: memory {small} ({os.path.basename(path)} {' '.join(extra)})")
        expect(small["peak_reserved"] <= 1.05 * small["peak_active"],
               f"{os.path.basename(path)}: peak reserved {small['peak_reserved']} over 1.05 x peak "
               f"active {small['peak_active']}")

    # At a fixed batch shape, batches after the first allocate nothing from the system: as
    # many system allocations for six batches as for two (the pipeline's two staging
    # buffers), and none after the first batch by the program's own count.
    one, three = os.path.join(scratch, "two.txt"), os.path.join(scratch, "six.txt")
    sentence = "the same sentence, batch after batch, in buffers the allocator keeps\n"
    open(one, "w").write(sentence * 16)
    open(three, "w").write(sentence * 48)
    first = embed(one, "--batch", "8")["memory"]["system_allocs"]
    more = embed(three, "--batch", "8")["memory"]["system_allocs"]
    expect(first == more, f"system allocations: {first} for two batches, {more} for six of the same shape")

    def run(*args):
        return subprocess.run([tool, *args], capture_output=True, timeout=600)

    verbose = run("--model", model, "--device", device, "--batch", "8", "--verbose", three)
    expect(b"(0 after the first batch)" in verbose.stderr,
           f"system allocations after the first batch: {verbose.stderr.decode(errors='replace')[-300:]}")

    missing = run("--model", os.path.join(scratch, "no-model"), one)
    expect(missing.returncode == 1 and b"no-model" in missing.stderr, "a missing model folder exits 1 naming it")
    unreadable = run("--model", model, "--device", device, os.path.join(scratch, "no-input.txt"))
    expect(unreadable.returncode == 1 and b"no-input.txt" in unreadable.stderr,
           "an unreadable input exits 1 naming it")
    expect(run("--model", model, "--batch", "zero", one).returncode == 2, "a bad --batch exits 2")
    expect(run("--bogus").returncode == 2, "an unknown option exits 2")

sys.exit(1 if failures else 0)
