#!/usr/bin/env python3
"""Checks embed-tokenize against Hugging Face tokenizers, line by line.

usage: check_tokens.py EMBED_TOKENIZE MODEL_DIR [DATA_FILE...]

Runs EMBED_TOKENIZE MODEL_DIR FILE over each data file (by default corpus.txt and
invalid_utf8.txt next to this repository's tests/data/embed/) and compares every output
line with tokenizers.Tokenizer.from_file(MODEL_DIR/tokenizer.json).encode(line) with
truncation to 256 and no padding. A line is what bytes.split(b'\n') gives (a final '\n'
ends the last line), decoded with errors='replace'. Prints the first differing line with
both id lists and exits 1 on any difference, 0 when all agree, 2 on a usage or run error.
Tested with tokenizers 0.22.1 (tests/data/embed/README.md).

--sweep adds every Unicode scalar value c as the line "a<c>a" (but the newline): each must
tokenize alike too. Where tokenizers' older category tables differ from utf8proc's, the
tokenizer follows examples/embed/unicode_overrides.h (tests/embed/make_unicode_overrides.py
writes it); a newer tokenizers or utf8proc shows up here first.
"""
import json
import os
import subprocess
import sys
import tempfile

MAX_LEN = 256
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, '..', 'data', 'embed')


def hf_tokenizer(model_dir):
    from tokenizers import Tokenizer
    path = os.path.join(model_dir, 'tokenizer.json')
    settings = json.load(open(path, encoding='utf-8'))
    # The file itself truncates to 128 and pads to 128; the embed example uses 256, unpadded.
    print('tokenizer.json: truncation %s, padding %s; checking with max_length=%d, no padding'
          % (settings.get('truncation'), settings.get('padding'), MAX_LEN))
    tok = Tokenizer.from_file(path)
    tok.no_padding()
    tok.enable_truncation(max_length=MAX_LEN)
    return tok


def lines_of(data):
    lines = data.split(b'\n')
    if lines and lines[-1] == b'':
        lines.pop()
    return lines


def run_c(exe, model_dir, path):
    r = subprocess.run([exe, model_dir, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        sys.exit('%s failed on %s (exit %d): %s' % (exe, path, r.returncode, r.stderr.decode(errors='replace')))
    return [[int(x) for x in l.split()] for l in r.stdout.decode().split('\n')[:-1]]


def expected(tok, lines):
    texts = [l.decode('utf-8', errors='replace') for l in lines]
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]


def check_file(exe, model_dir, tok, path):
    lines = lines_of(open(path, 'rb').read())
    got = run_c(exe, model_dir, path)
    want = expected(tok, lines)
    if len(got) != len(want):
        print('%s: embed-tokenize printed %d lines for %d input lines' % (path, len(got), len(want)))
        return False
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            print('%s: line %d differs: %r' % (path, i + 1, lines[i][:200]))
            print('  embed-tokenize (%d): %s' % (len(g), ' '.join(map(str, g))))
            print('  tokenizers     (%d): %s' % (len(w), ' '.join(map(str, w))))
            return False
    longest = max((len(w) for w in want), default=0)
    print('%s: %d of %d lines equal (longest %d ids)' % (os.path.basename(path), len(want), len(want), longest))
    return True


def sweep(exe, model_dir, tok):
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c != 0x0A]
    lines = [('a%sa' % chr(c)).encode('utf-8') for c in cps]
    with tempfile.NamedTemporaryFile(suffix='.txt') as f:
        f.write(b'\n'.join(lines) + b'\n')
        f.flush()
        got = run_c(exe, model_dir, f.name)
    want = expected(tok, lines)
    bad = ['%04X' % c for c, g, w in zip(cps, got, want) if g != w]
    print('sweep: %d of %d code points differ%s' % (len(bad), len(cps), (': ' + ' '.join(bad[:40]) + (' ...' if len(bad) > 40 else '')) if bad else ''))
    return not bad


def main(argv):
    do_sweep = '--sweep' in argv
    args = [a for a in argv[1:] if a != '--sweep']
    if len(args) < 2:
        print(__doc__)
        return 2
    exe, model_dir = args[0], args[1]
    files = args[2:] or [os.path.join(DATA, 'corpus.txt'), os.path.join(DATA, 'invalid_utf8.txt')]
    tok = hf_tokenizer(model_dir)
    ok = all([check_file(exe, model_dir, tok, p) for p in files])
    if do_sweep:
        ok = sweep(exe, model_dir, tok) and ok
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv))
