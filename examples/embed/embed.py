#!/usr/bin/env python3
"""devbuf-embed from Python: sentence embeddings of all-MiniLM-L6-v2 on opencl:N through the
devbuf package (docs/embed.md, "From Python").

    embed.py --model DIR [--device opencl:0] [--batch N] [--json] FILE|-

The same program as devbuf-embed on a device: the OpenCL C kernels of kernels.cl (read
from the file next to this script: one copy of the kernels), the same 74 launches per
batch, the weights loaded by devbuf.load into one allocation of device memory, every
activation a devbuf buffer released right after the submission of its last reader, the same
batches (longest first, activations sized for the first) and the same two-queue pipeline.
Token ids come from Hugging Face `tokenizers` on DIR/tokenizer.json, which gives the ids of
devbuf-embed's own tokenizer (tests/embed/check_tokens.py). The output is devbuf-embed's:
one line of 384 '%.9g' floats per sentence, or with --json one document.

Exit status: 0; 1 with one line on stderr (missing model folder, unreadable input, no such
device, a devbuf failure); 2 for a usage error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

HIDDEN, HEADS, FFN, LAYERS = 384, 12, 1536, 6
VOCAB, POSITIONS, MAX_TOKENS = 30522, 512, 256
FFN_PARTS = 4  # the feed-forward layer's 1536 columns live in 4 activations of 384
PART = FFN // FFN_PARTS
KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.cl")

# The tensors the model uses, with their shapes (model.c's table); {} is the layer.
MODEL_TENSORS = {
    "embeddings.word_embeddings.weight": (VOCAB, HIDDEN),
    "embeddings.position_embeddings.weight": (POSITIONS, HIDDEN),
    "embeddings.token_type_embeddings.weight": (2, HIDDEN),
    "embeddings.LayerNorm.weight": (HIDDEN,),
    "embeddings.LayerNorm.bias": (HIDDEN,),
}
LAYER_TENSORS = {
    "query_w": ("attention.self.query.weight", (HIDDEN, HIDDEN)),
    "query_b": ("attention.self.query.bias", (HIDDEN,)),
    "key_w": ("attention.self.key.weight", (HIDDEN, HIDDEN)),
    "key_b": ("attention.self.key.bias", (HIDDEN,)),
    "value_w": ("attention.self.value.weight", (HIDDEN, HIDDEN)),
    "value_b": ("attention.self.value.bias", (HIDDEN,)),
    "out_w": ("attention.output.dense.weight", (HIDDEN, HIDDEN)),
    "out_b": ("attention.output.dense.bias", (HIDDEN,)),
    "norm1_g": ("attention.output.LayerNorm.weight", (HIDDEN,)),
    "norm1_b": ("attention.output.LayerNorm.bias", (HIDDEN,)),
    "up_w": ("intermediate.dense.weight", (FFN, HIDDEN)),
    "up_b": ("intermediate.dense.bias", (FFN,)),
    "down_w": ("output.dense.weight", (HIDDEN, FFN)),
    "down_b": ("output.dense.bias", (HIDDEN,)),
    "norm2_g": ("output.LayerNorm.weight", (HIDDEN,)),
    "norm2_b": ("output.LayerNorm.bias", (HIDDEN,)),
}


class Failure(Exception):
    """A failure reported as one line on stderr with exit status 1."""


# ---- the command line --------------------------------------------------------------------

def batch_size(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 4096:
        raise argparse.ArgumentTypeError("--batch takes 1 to 4096")
    return int(text)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="embed.py", allow_abbrev=False,
        description="Sentence embeddings of all-MiniLM-L6-v2 on an OpenCL device, through devbuf's Python package.")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="the model folder (model.safetensors, tokenizer.json)")
    parser.add_argument("--device", default="opencl:0", metavar="SPEC", help="opencl:N (default opencl:0)")
    parser.add_argument("--batch", type=batch_size, default=32, metavar="N",
                        help="sentences per batch (default 32, at most 4096)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON document: texts, token ids, embeddings, memory, seconds")
    # Diagnostic, as devbuf-embed's: the same submissions and buffers, every kernel empty.
    parser.add_argument("--empty-kernels", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("input", metavar="FILE", help="one UTF-8 sentence per line; - reads standard input")
    return parser.parse_args(argv)


def read_lines(path: str) -> list[bytes]:
    """Lines split at '\\n'; a last line without one counts, an empty input has none."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as error:
        raise Failure(f"cannot read '{'standard input' if path == '-' else path}': {error.strerror}") from None
    lines = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        lines.pop()
    return lines


# ---- the model ---------------------------------------------------------------------------


class Model:
    """The weights the model uses, each checked for dtype and shape, on the device in one
    allocation (as devbuf-embed loads them): attributes as model.c's names."""

    def __init__(self, devbuf: Any, device: Any, folder: str):
        path = os.path.join(folder, "model.safetensors")
        wanted = dict(MODEL_TENSORS)
        for layer in range(LAYERS):
            for name, shape in LAYER_TENSORS.values():
                wanted[f"encoder.layer.{layer}.{name}"] = shape
        # Only the tensors used are read (the position ids and the pooler stay in the file).
        file = devbuf.load(path, device, names=wanted, one_allocation=True)
        try:
            tensors = {name: self._take(file, path, name, shape) for name, shape in wanted.items()}
        finally:
            file.close()  # the buffers outlive it
        self.word, self.position, self.type, self.norm_g, self.norm_b = (
            tensors[name] for name in MODEL_TENSORS)
        self.layers = []
        for layer in range(LAYERS):
            weights = {key: tensors[f"encoder.layer.{layer}.{name}"] for key, (name, _) in LAYER_TENSORS.items()}
            # The feed-forward layer's parts: views of the rows of its first matrix and bias.
            weights["up_w_part"] = [weights["up_w"].byte_view(p * PART * HIDDEN * 4, PART * HIDDEN * 4)
                                    for p in range(FFN_PARTS)]
            weights["up_b_part"] = [weights["up_b"].byte_view(p * PART * 4, PART * 4) for p in range(FFN_PARTS)]
            self.layers.append(weights)
        self.weight_bytes = sum(buffer.nbytes for buffer in tensors.values())

    @staticmethod
    def _take(file: Any, path: str, name: str, shape: tuple[int, ...]) -> Any:
        try:
            buffer = file[name]
        except KeyError:
            raise Failure(f"{path}: no tensor '{name}'") from None
        if buffer.dtype != "float32" or buffer.shape != shape:
            raise Failure(f"{path}: tensor '{name}' is {buffer.dtype} {list(buffer.shape)}; "
                          f"expected float32 {list(shape)}")
        return buffer


# ---- the forward graph (kernels_device.c's launches, model.c's order) ---------------------

class Forward:
    """Submits batches' forward passes to the compute queue: kernels.cl's kernels with the
    grids devbuf-embed gives them on the same device."""

    def __init__(self, np: Any, device: Any, program: Any, queue: Any, model: Model, cpu_device: bool,
                 capacity: int):
        self.np, self.device, self.program, self.q, self.m = np, device, program, queue, model
        self.cpu_device = cpu_device
        self.capacity = capacity  # rows of every activation: the first (largest) batch's

    def activation(self, cols: int) -> Any:
        # Lazy: its memory comes at the submission of its writer, which may reuse memory that
        # earlier work still uses (ordered after that work).
        return self.device.empty((self.capacity, cols), "float32")

    def launch(self, name: str, grid: tuple[int, ...], local: tuple[int, ...] | None, uses: list[tuple[Any, str]],
               scalars: list[Any] | tuple[()] = ()) -> None:
        self.q.launch(self.program, name, grid, local, uses=uses, args=scalars)

    def scalars(self, *values: int) -> list[Any]:
        # The kernels' scalars are uint; made once per batch (a numpy scalar costs ~1 us).
        return [self.np.uint32(value) for value in values]

    def linear(self, out: Any, inp: Any, w: Any, bias: Any, mask: Any, rows: int, n: int, scalars: list[Any]) -> None:
        uses = [(out, "w"), (inp, "r"), (w, "r"), (bias, "r"), (mask, "r")]
        if self.cpu_device:
            self.launch("linear", (n // 4, (rows + 3) // 4), None, uses, scalars)
        else:
            self.launch("linear", (n // 4, (rows + 63) // 64 * 16), (16, 16), uses, scalars)

    def __call__(self, ids: Any, mask: Any, embeddings: Any, seqs: int, tokens: int) -> None:
        m, rows = self.m, seqs * tokens
        square = self.scalars(rows, HIDDEN, HIDDEN, 0)  # rows, n, k, gelu
        up, down = self.scalars(rows, PART, HIDDEN, 1), self.scalars(rows, HIDDEN, PART)
        per_token = self.scalars(tokens)
        h = self.activation(HIDDEN)
        self.launch("embed_tokens", (128 * rows,), (128,),
                    [(h, "w"), (ids, "r"), (m.word, "r"), (m.position, "r"), (m.type, "r"), (m.norm_g, "r"),
                     (m.norm_b, "r"), (mask, "r")], self.scalars(tokens, VOCAB))
        for w in m.layers:
            q, key, v = self.activation(HIDDEN), self.activation(HIDDEN), self.activation(HIDDEN)
            for out, name in ((q, "query"), (key, "key"), (v, "value")):
                self.linear(out, h, w[name + "_w"], w[name + "_b"], mask, rows, HIDDEN, square)
            ctx = self.activation(HIDDEN)
            self.launch("attention", ((tokens + 63) // 64 * 64, seqs * HEADS), (64, 1),
                        [(ctx, "w"), (q, "r"), (key, "r"), (v, "r"), (mask, "r")], per_token)
            q.close(), key.close(), v.close()  # released in flight: the next activations reuse them
            a = self.activation(HIDDEN)
            self.linear(a, ctx, w["out_w"], w["out_b"], mask, rows, HIDDEN, square)
            ctx.close()
            h1 = self.activation(HIDDEN)
            self.launch("add_norm", (128 * rows,), (128,),
                        [(h1, "w"), (a, "r"), (h, "r"), (w["norm1_g"], "r"), (w["norm1_b"], "r"), (mask, "r")])
            a.close(), h.close()
            f = [self.activation(PART) for _ in range(FFN_PARTS)]
            for p in range(FFN_PARTS):
                self.linear(f[p], h1, w["up_w_part"][p], w["up_b_part"][p], mask, rows, PART, up)
            o = self.activation(HIDDEN)
            uses = [(o, "w"), *((part, "r") for part in f), (w["down_w"], "r"), (w["down_b"], "r"), (mask, "r")]
            if self.cpu_device:
                self.launch("linear_parts", (HIDDEN // 4, (rows + 3) // 4), None, uses, down)
            else:
                self.launch("linear_parts", (HIDDEN // 4, (rows + 63) // 64 * 16), (16, 16), uses, down)
            for part in f:
                part.close()
            h = self.activation(HIDDEN)
            self.launch("add_norm", (128 * rows,), (128,),
                        [(h, "w"), (o, "r"), (h1, "r"), (w["norm2_g"], "r"), (w["norm2_b"], "r"), (mask, "r")])
            o.close(), h1.close()
        self.launch("pool", (128 * seqs,), (128,), [(embeddings, "w"), (h, "r"), (mask, "r")], per_token)
        h.close()


# ---- batches and the pipeline (batch.c) ---------------------------------------------------

def round_up(size: int) -> int:
    return (size + 4095) & ~4095


@dataclass
class Slot:
    """One of the pipeline's two staging buffers (batch b uses slot b % 2), and the views of
    its current batch."""
    io: Any
    ids: Any = None
    mask: Any = None
    embeddings: Any = None
    first: int = 0
    seqs: int = 0
    tokens: int = 0


def embed_all(devbuf: Any, np: Any, device: Any, program: Any, model: Model, cpu_device: bool,
              sequences: list[list[int]], batch: int) -> Any:
    """Embeds every sequence, in batches of at most `batch`, longest first; the embeddings as
    a [count, 384] float32 array in the sequences' order. Batch i + 1's ids and mask are
    written while batch i computes; batch i is read back once batch i + 1 is submitted."""
    count = len(sequences)
    embeddings = np.zeros((count, HIDDEN), np.float32)
    if count == 0:
        return embeddings
    order = sorted(range(count), key=lambda i: -len(sequences[i]))  # stable: input order among equals
    seq_capacity = min(count, batch)
    capacity = seq_capacity * len(sequences[order[0]])
    batches = (count + batch - 1) // batch
    # A slot's bytes: ids, mask and embeddings, each at a multiple of 4096 (the alignment
    # OpenCL and CUDA ask of the views their kernels get).
    at = [0, round_up(capacity * 4)]
    at += [at[1] + round_up(capacity * 4), at[1] + round_up(capacity * 4) + seq_capacity * HIDDEN * 4]
    compute, upload = device.queue(), device.queue()
    uploaded = devbuf.Event(0)  # value b + 1: batch b's ids and mask are on the device
    forward = Forward(np, device, program, compute, model, cpu_device, capacity)
    host_ids = np.zeros(capacity, np.int32)
    host_mask = np.zeros(capacity, np.float32)

    def slot_buffer() -> Any:
        # Allocated now, not at a submission (a host write allocates at once): so it never
        # takes memory that compute work still uses, as devbuf_buffer_allocate in batch.c.
        io = device.empty((at[3],), "uint8")
        io.copy_from(bytes(at[3]))
        return io

    slots = [Slot(slot_buffer()) for _ in range(min(2, batches))]

    def stage(b: int) -> None:
        s = slots[b % 2]
        s.first = b * batch
        s.seqs = min(batch, count - s.first)
        s.tokens = len(sequences[order[s.first]])
        rows = s.seqs * s.tokens
        ids, mask = host_ids[:rows].reshape(s.seqs, s.tokens), host_mask[:rows].reshape(s.seqs, s.tokens)
        ids[:], mask[:] = 0, 0.0  # [PAD], and mask 0 on the padding
        for i in range(s.seqs):
            sequence = sequences[order[s.first + i]]
            ids[i, :len(sequence)] = sequence
            mask[i, :len(sequence)] = 1.0
        s.ids = s.io.byte_view(at[0], rows * 4).reshape((rows,), "int32")
        s.mask = s.io.byte_view(at[1], rows * 4).reshape((rows,), "float32")
        s.embeddings = s.io.byte_view(at[2], s.seqs * HIDDEN * 4).reshape((s.seqs * HIDDEN,), "float32")
        # The package has no host-visible staging memory nor copies from the CPU on a
        # device's queue: a host write (devbuf-embed's own path on devices without
        # host-visible memory). The slot's previous batch has been read back, so it does
        # not wait.
        s.ids.copy_from(host_ids[:rows])
        s.mask.copy_from(host_mask[:rows])
        upload.signal(uploaded, b + 1)

    def run(b: int) -> None:
        s = slots[b % 2]
        compute.wait(uploaded, b + 1)
        forward(s.ids, s.mask, s.embeddings, s.seqs, s.tokens)
        s.ids.close(), s.mask.close()  # the pooling kernel was the last reader of both

    def read_back(b: int) -> None:
        s = slots[b % 2]
        rows = np.frombuffer(s.embeddings.to_bytes(), np.float32).reshape(s.seqs, HIDDEN)  # waits for pool
        s.embeddings.close()
        embeddings[order[s.first:s.first + s.seqs]] = rows

    try:
        stage(0)
        for b in range(batches):
            run(b)
            if b > 0:
                read_back(b - 1)
            if b + 1 < batches:
                stage(b + 1)
        read_back(batches - 1)
    finally:
        for s in slots:
            for buffer in (s.ids, s.mask, s.embeddings, s.io):
                if buffer is not None:
                    buffer.close()
        # Only here does anything wait for the queues as a whole.
        compute.finish()
        upload.finish()
    return embeddings


# ---- output ------------------------------------------------------------------------------

def write_text(out: BinaryIO, embeddings: Any) -> None:
    for row in embeddings.tolist():  # Python floats: '%.9g' of the float's value, as printf
        out.write((" ".join(["%.9g" % value for value in row]) + "\n").encode())


def write_json(out: BinaryIO, spec: str, lines: list[bytes], sequences: list[list[int]], embeddings: Any,
               memory: dict[str, int], seconds: float) -> None:
    def number(value: float) -> str:
        return "%.9g" % value if value - value == 0 else "null"  # NaN and infinities: null

    # json.dumps without ensure_ascii escapes what devbuf-embed escapes (quote, backslash,
    # control characters) and writes the rest as UTF-8; errors='replace' replaces each
    # maximal ill-formed subsequence with U+FFFD, as devbuf-embed does.
    parts = ['{"device": ', json.dumps(spec), ', "sentences": [']
    for i, (line, ids, row) in enumerate(zip(lines, sequences, embeddings.tolist())):
        parts.append('{"text": ' if i == 0 else ', {"text": ')
        parts.append(json.dumps(line.decode("utf-8", errors="replace"), ensure_ascii=False))
        parts.append(', "ids": [' + ", ".join(map(str, ids)) + '], "embedding": [')
        parts.append(", ".join(map(number, row)) + "]}")
    parts.append(f'],\n "memory": {{"peak_reserved": {memory["peak_reserved"]}, "peak_active": '
                 f'{memory["peak_active"]}, "system_allocs": {memory["system_allocs"]}}}, '
                 f'"seconds": {seconds:.6f}}}\n')
    out.write("".join(parts).encode())


# ---- the run -----------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    o = parse(argv)
    lines = read_lines(o.input)
    if not os.path.isdir(o.model):
        reason = "Not a directory" if os.path.exists(o.model) else "No such file or directory"
        raise Failure(f"model folder '{o.model}': {reason}")
    try:
        import numpy as np
        from tokenizers import Tokenizer
    except ImportError as missing:
        raise Failure(f"{missing.name} is not installed for {sys.executable} "
                      "(scripts/python_env.sh installs numpy and tokenizers in build/pyenv)") from None
    try:
        import devbuf
    except ImportError as missing:
        raise Failure(f"cannot import devbuf ({missing}): put the package's folder on PYTHONPATH "
                      "(build/release/python in a build tree)") from None

    tokenizer_path = os.path.join(o.model, "tokenizer.json")
    try:
        tokenizer = Tokenizer.from_file(tokenizer_path)
    except Exception as error:  # tokenizers raises its own Exception subclass
        raise Failure(f"{tokenizer_path}: {error}") from None
    # tokenizer.json pads and truncates to 128; devbuf-embed (and sentence-transformers)
    # truncate at 256 and pad each batch to its longest sentence.
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=MAX_TOKENS)

    device = devbuf.Device(o.device)
    if device.kind != "opencl":
        raise Failure(f"{device.spec}: embed.py runs the OpenCL C kernels of kernels.cl: give --device opencl:N")
    model = Model(devbuf, device, o.model)
    # On a CPU (PoCL) the products are 4 x 4 outputs per item with no local memory: the
    # options devbuf-embed builds with, so both share PoCL's cache of the build.
    cpu_device = device.info["processor"] == "cpu"
    with open(KERNELS) as f:
        source = f.read()
    options = f"-DEMBED_EMPTY={int(o.empty_kernels)} -DEMBED_CPU_DEVICE={int(cpu_device)}"
    program = devbuf.Program(device, source, options)

    # As devbuf-embed: from the first sentence's tokenization to the last embedding read back.
    start = time.perf_counter()
    texts = [line.decode("utf-8", errors="replace") for line in lines]
    sequences = [encoding.ids for encoding in tokenizer.encode_batch(texts, add_special_tokens=True)]
    for number, ids in enumerate(sequences, 1):
        if not ids or min(ids) < 0 or max(ids) >= VOCAB:
            raise Failure(f"line {number}: token ids out of the vocabulary's {VOCAB}")
    embeddings = embed_all(devbuf, np, device, program, model, cpu_device, sequences, o.batch)
    seconds = time.perf_counter() - start
    stats = device.memory_stats()
    memory = {"peak_reserved": int(stats["peak_reserved"]), "peak_active": int(stats["peak"]),
              "system_allocs": int(stats["system_allocs"])}

    out = sys.stdout.buffer
    try:
        if o.json:
            write_json(out, device.spec, lines, sequences, embeddings, memory, seconds)
        else:
            write_text(out, embeddings)
        out.flush()
    except OSError as error:
        raise Failure(f"cannot write the output: {error.strerror or error}") from None
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Failure as failure:
        print(f"embed.py: {failure}", file=sys.stderr)
        sys.exit(1)
    except Exception as error:
        # devbuf's failures (no such device, a kernel that fails) name themselves.
        if not type(error).__module__.startswith("devbuf"):
            raise
        memory = "device out of memory: " if isinstance(error, MemoryError) else ""
        print(f"embed.py: {memory}{error}", file=sys.stderr)
        sys.exit(1)
