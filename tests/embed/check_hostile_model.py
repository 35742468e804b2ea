#!/usr/bin/env python3
"""devbuf-embed on model folders that are not quite all-MiniLM-L6-v2: each is a copy of the
real folder (its large files linked) with one file changed. Another model's settings (a
deeper config, another activation, CLS pooling, no normalising, a tokenizer whose ids pass
the embedding matrix, a file with a seventh layer) must be refused with exit 1 and a message
naming what is wrong (NaN weights too); what the program can honour (max_seq_length below 256, a file whose
tensors sit at offsets misaligned for floats, settings files that are absent) must run and
give the same embeddings as the real folder.

usage: check_hostile_model.py TOOL MODEL_DIR   (on the CPU; numpy and safetensors from the
test venv)"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

tool, model = sys.argv[1], sys.argv[2]
failures = 0
SENTENCES = "the quick brown fox jumps over the lazy dog\na b c d e f g h i j\n"


def expect(condition, what):
    global failures
    if not condition:
        failures += 1
        print(f"FAIL: {what}", file=sys.stderr)


def copy_folder(scratch, name):
    """The real folder, its files linked (changed files are written anew, never through a link)."""
    folder = os.path.join(scratch, name)
    for root, _, files in os.walk(model):
        target = os.path.join(folder, os.path.relpath(root, model))
        os.makedirs(target, exist_ok=True)
        for f in files:
            os.symlink(os.path.join(root, f), os.path.join(target, f))
    return folder


def rewrite(folder, name, text):
    path = os.path.join(folder, name)
    os.remove(path)
    with open(path, "w") as f:
        f.write(text)


def edit_json(folder, name, change):
    with open(os.path.join(model, name)) as f:
        document = json.load(f)
    change(document)
    rewrite(folder, name, json.dumps(document))


def run(folder, sentences=SENTENCES):
    result = subprocess.run([tool, "--model", folder, "--device", "cpu", "--json", "-"],
                            input=sentences.encode(), capture_output=True, timeout=600)
    return result.returncode, result.stdout, result.stderr.decode(errors="replace")


def embeddings(folder, sentences=SENTENCES):
    code, out, err = run(folder, sentences)
    if code != 0:
        return None, err
    return np.array([s["embedding"] for s in json.loads(out)["sentences"]]), err


def refused(folder, needle, what):
    code, _, err = run(folder)
    expect(code == 1 and needle in err, f"{what}: exit {code}, stderr {err.strip()!r} (wanted {needle!r})")
    if code == 1 and needle in err:
        print(f"refused, as it should be: {what}: {err.strip()}")


with tempfile.TemporaryDirectory() as scratch:
    real, err = embeddings(model)
    if real is None:
        sys.exit(f"the real folder failed: {err}")

    folder = copy_folder(scratch, "layers")
    edit_json(folder, "config.json", lambda c: c.update(num_hidden_layers=12))
    refused(folder, '"num_hidden_layers" is 12', "config.json with 12 layers")

    folder = copy_folder(scratch, "act")
    edit_json(folder, "config.json", lambda c: c.update(hidden_act="relu"))
    refused(folder, '"hidden_act" is "relu"', "config.json with relu")

    folder = copy_folder(scratch, "eps")
    edit_json(folder, "config.json", lambda c: c.update(layer_norm_eps=1e-5))
    refused(folder, '"layer_norm_eps" is 1e-05; this program runs all-MiniLM-L6-v2, which has 1e-12',
        "config.json with epsilon 1e-5")

    folder = copy_folder(scratch, "hidden_missing")
    edit_json(folder, "config.json", lambda c: c.pop("hidden_size"))
    refused(folder, '"hidden_size" is absent', "config.json without hidden_size (BERT-base's 768)")

    folder = copy_folder(scratch, "cls")
    edit_json(folder, "1_Pooling/config.json",
              lambda c: c.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False))
    refused(folder, '"pooling_mode_mean_tokens" is false', "CLS pooling")

    folder = copy_folder(scratch, "modules")
    edit_json(folder, "modules.json", lambda m: m.pop())
    refused(folder, "modules.json: 2 modules", "no Normalize module")

    folder = copy_folder(scratch, "long")
    edit_json(folder, "sentence_bert_config.json", lambda c: c.update(max_seq_length=512))
    refused(folder, "max_seq_length must be a whole number from 2 to 256", "max_seq_length 512")

    folder = copy_folder(scratch, "not_json")
    rewrite(folder, "config.json", '{"hidden_size": 384,')
    refused(folder, "config.json: line 1: expected a key", "a config.json cut short")

    # A tokenizer whose ids pass the embedding matrix: an added token far past it.
    folder = copy_folder(scratch, "added")
    edit_json(folder, "tokenizer.json", lambda t: t["added_tokens"].append(
        {"id": 99999, "content": "zz", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}))
    refused(folder, "the tokenizer gives 100000 ids", "an added token with id 99999")

    # A template that writes other ids for [CLS] than the tokenizer, or the second type row.
    folder = copy_folder(scratch, "special")
    edit_json(folder, "tokenizer.json",
              lambda t: t["post_processor"]["special_tokens"]["[CLS]"].update(ids=[100]))
    refused(folder, 'gives "[CLS]" 1 ids, the first 100; vocab.txt gives it the one id 101',
            "special_tokens with another id for [CLS]")
    folder = copy_folder(scratch, "type_id")
    edit_json(folder, "tokenizer.json",
              lambda t: t["post_processor"]["single"][1]["Sequence"].update(type_id=1))
    refused(folder, "a type id other than 0", "a template of type 1")

    # Another model's vocabulary, with no tokenizer.json to say so.
    folder = copy_folder(scratch, "vocab")
    os.remove(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(model, "vocab.txt")) as f:
        vocab = f.read().split("\n")[:30000]
    rewrite(folder, "vocab.txt", "\n".join(vocab) + "\n")
    refused(folder, "the tokenizer gives 30000 ids", "a vocab.txt of 30000 lines")

    # A seventh layer: all-MiniLM-L12-v2's file would load as six layers otherwise.
    tensors = load_file(os.path.join(model, "model.safetensors"))
    deeper = dict(tensors)
    deeper["encoder.layer.6.output.dense.bias"] = tensors["encoder.layer.5.output.dense.bias"]
    folder = copy_folder(scratch, "deeper")
    os.remove(os.path.join(folder, "model.safetensors"))
    save_file(deeper, os.path.join(folder, "model.safetensors"))
    refused(folder, "tensor 'encoder.layer.6.output.dense.bias' belongs to a layer past the model's 6",
            "a seventh layer")

    # Weights that are not numbers: refused once they reach the embeddings, never printed.
    broken = dict(tensors)
    broken["embeddings.LayerNorm.weight"] = tensors["embeddings.LayerNorm.weight"].copy()
    broken["embeddings.LayerNorm.weight"][7] = np.nan
    folder = copy_folder(scratch, "nan")
    os.remove(os.path.join(folder, "model.safetensors"))
    save_file(broken, os.path.join(folder, "model.safetensors"))
    refused(folder, "the model's weights are not all finite numbers", "a NaN weight")

    # Honoured: the settings files absent.
    folder = copy_folder(scratch, "bare")
    for name in ("config.json", "1_Pooling/config.json", "modules.json", "sentence_bert_config.json"):
        os.remove(os.path.join(folder, name))
    got, err = embeddings(folder)
    expect(got is not None and np.array_equal(got, real), f"a folder without settings files: {err.strip()}")

    # Honoured: sequences cut at max_seq_length, [CLS] and [SEP] included, as sentence-transformers
    # cuts them: with 8, the ten letters embed as their first six.
    folder = copy_folder(scratch, "short")
    edit_json(folder, "sentence_bert_config.json", lambda c: c.update(max_seq_length=8))
    code, out, err = run(folder, "a b c d e f g h i j\n")
    ids = json.loads(out)["sentences"][0]["ids"] if code == 0 else []
    expect(len(ids) == 8, f"max_seq_length 8: {len(ids)} ids, exit {code}: {err.strip()}")
    got, err = embeddings(folder, "a b c d e f g h i j\n")
    want, _ = embeddings(model, "a b c d e f\n")
    expect(got is not None and want is not None and np.allclose(got, want, atol=1e-6),
           f"max_seq_length 8: {err.strip()}")

    # Honoured: every tensor at an offset misaligned for floats (a writer that did not pad its
    # header): the loader copies them into aligned memory, and the embeddings are the same.
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + length].rstrip(b" ")
    while (8 + len(header)) % 4 != 2:
        header += b" "
    folder = copy_folder(scratch, "misaligned")
    os.remove(os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data[8 + length:])
    got, err = embeddings(folder)
    expect(got is not None and np.allclose(got, real, atol=1e-6), f"misaligned tensors: {err.strip()}")

print(f"hostile model folders: {failures} failures")
sys.exit(1 if failures else 0)
