#!/usr/bin/env python3
"""Writes examples/embed/unicode_overrides.h: the code points whose class Hugging Face
`tokenizers` sees otherwise than utf8proc's categories say.

usage: make_unicode_overrides.py MODEL_DIR [OUT]   (OUT: default examples/embed/unicode_overrides.h)

BertNormalizer and BertPreTokenizer sort each code point into one of four classes: space
(split there), dropped (a control or format character, or a nonspacing mark when accents
are stripped), punctuation (a word of its own), or plain (part of a word). `tokenizers`
takes categories from its own tables, of an older Unicode than utf8proc's, so some hundreds
of code points added or recategorised since fall into another class there. The tokenizer
keeps utf8proc as its source and looks these up first.

The class HF gives a code point c is read from how `tokenizers` (the Python package, with
MODEL_DIR's tokenizer.json) tokenizes the line "a<c>a"; the class utf8proc gives it from
utf8proc_category (through ctypes, the library the example links). Only the ones that differ
are written, as ranges. Run it again with another `tokenizers` or utf8proc and check the
sweep of tests/embed/check_tokens.py (--sweep) reports no difference.
"""
import ctypes
import ctypes.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, '..', '..', 'examples', 'embed', 'unicode_overrides.h')
CLASSES = ['SPACE', 'DROP', 'PUNCT', 'PLAIN']

# utf8proc_category_t values (utf8proc.h)
ZS, ZL, ZP, CC, CF, CS, CO, MN = 23, 24, 25, 26, 27, 28, 29, 6
PUNCTS = range(12, 19)  # PC PD PS PE PI PF PO
UTF8PROC_DECOMPOSE = 1 << 4  # utf8proc.h


def code_point_class(lib, c):
    """The class the tokenizer gives one code point of an NFD decomposition."""
    if c < 0x80:
        if c < 0x20 and c not in (9, 10, 13) or c == 0x7F:
            return 'DROP'
        if c == 0x20 or 9 <= c <= 13:
            return 'SPACE'
        return 'PUNCT' if (33 <= c <= 47 or 58 <= c <= 64 or 91 <= c <= 96 or 123 <= c <= 126) else 'PLAIN'
    k = lib.utf8proc_category(c)
    if k in (CC, CF, CS, CO, MN):
        return 'DROP'
    if k in (ZS, ZL, ZP):
        return 'SPACE'
    return 'PUNCT' if k in PUNCTS else 'PLAIN'


def utf8proc_class(lib, c):
    """As clean_text drops controls first, then NFD drops marks from the decomposition."""
    whole = code_point_class(lib, c)
    if whole in ('DROP', 'SPACE'):
        return whole
    parts = (ctypes.c_int32 * 32)()
    last = ctypes.c_int(0)
    n = lib.utf8proc_decompose_char(c, parts, 32, UTF8PROC_DECOMPOSE, ctypes.byref(last))
    kept = [code_point_class(lib, parts[i]) for i in range(n)]
    kept = [k for k in kept if k != 'DROP']
    if not kept:
        return 'DROP'
    return 'PUNCT' if 'PUNCT' in kept else kept[0] if len(kept) == 1 else 'PLAIN'


def hf_classes(model_dir, cps):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model_dir, 'tokenizer.json'))
    tok.no_padding()
    tok.no_truncation()
    a = tok.token_to_id('a')
    aa = tok.token_to_id('aa')
    out = []
    texts = ['a%sa' % chr(c) for c in cps]
    for c, enc in zip(cps, tok.encode_batch(texts, add_special_tokens=False)):
        ids = enc.ids
        if ids == [a, a]:
            out.append('SPACE')
        elif ids == [aa]:
            out.append('DROP')
        elif len(ids) >= 3 and ids[0] == a and ids[-1] == a and enc.offsets[0] == (0, 1):
            out.append('PUNCT')  # a, the character's own word, a
        else:
            out.append('PLAIN')
    return out


def is_chinese(c):  # spaced by handle_chinese_chars on both sides: not a class of its own
    return (0x4E00 <= c <= 0x9FFF or 0x3400 <= c <= 0x4DBF or 0x20000 <= c <= 0x2A6DF or
            0x2A700 <= c <= 0x2B73F or 0x2B740 <= c <= 0x2B81F or 0x2B920 <= c <= 0x2CEAF or
            0xF900 <= c <= 0xFAFF or 0x2F800 <= c <= 0x2FA1F)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    model_dir = argv[1]
    out_path = argv[2] if len(argv) > 2 else OUT
    settings = json.load(open(os.path.join(model_dir, 'tokenizer.json'), encoding='utf-8'))
    norm = settings.get('normalizer') or {}
    if norm.get('type') != 'BertNormalizer' or not norm.get('lowercase') or norm.get('strip_accents') is False:
        sys.exit('make_unicode_overrides: %s must be an uncased BertNormalizer that strips accents' % model_dir)
    lib = ctypes.CDLL(ctypes.util.find_library('utf8proc') or 'libutf8proc.so.2')
    lib.utf8proc_category.restype = ctypes.c_int
    lib.utf8proc_category.argtypes = [ctypes.c_int32]
    lib.utf8proc_unicode_version.restype = ctypes.c_char_p
    lib.utf8proc_decompose_char.restype = ctypes.c_ssize_t
    lib.utf8proc_decompose_char.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.c_ssize_t,
                                            ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    cps = [c for c in range(0x110000)
           if not 0xD800 <= c <= 0xDFFF and c not in (0, 0xFFFD) and not is_chinese(c)]
    hf = hf_classes(model_dir, cps)
    ranges = []  # [first, last, class]
    for c, h in zip(cps, hf):
        if h == utf8proc_class(lib, c):
            continue
        if ranges and ranges[-1][1] == c - 1 and ranges[-1][2] == h:
            ranges[-1][1] = c
        else:
            ranges.append([c, c, h])
    import tokenizers
    with open(out_path, 'w') as f:
        f.write('// Generated by tests/embed/make_unicode_overrides.py from tokenizers %s and utf8proc\n'
                '// (Unicode %s): the code points that tokenizers classes otherwise than utf8proc\'s\n'
                '// categories, %d in %d ranges, sorted. Do not edit: run the script again.\n'
                % (tokenizers.__version__, lib.utf8proc_unicode_version().decode(),
                   sum(r[1] - r[0] + 1 for r in ranges), len(ranges)))
        f.write('static const struct {\n  int32_t first, last;\n  uint8_t hf_class;\n} unicode_overrides[] = {\n'
                '    // clang-format off\n')
        for first, last, h in ranges:
            f.write('    {0x%04X, 0x%04X, HF_%s},\n' % (first, last, h))
        f.write('    // clang-format on\n};\n')
    print('%s: %d ranges' % (out_path, len(ranges)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
