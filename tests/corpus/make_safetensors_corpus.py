#!/usr/bin/env python3
"""Writes the hostile safetensors corpus and its expectations (expect.txt).

Each file breaks one rule of the format; expect.txt names the status every reader entry
point must answer and a phrase the message must contain. The files also seed the fuzzer.
Run from anywhere: python3 tests/corpus/make_safetensors_corpus.py
"""
import json
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "safetensors")
cases = []


def raw(name, data, status, phrase):
    cases.append((name, data, status, phrase))


def header(name, text, data_size, status, phrase, pad=True):
    body = text.encode("utf-8") if isinstance(text, str) else text
    if pad:
        body += b" " * (-(len(body) + 8) % 8)
    raw(name, struct.pack("<Q", len(body)) + body + bytes(data_size), status, phrase)


def tensors(name, table, data_size, status, phrase):
    header(name, json.dumps(table, separators=(",", ":")), data_size, status, phrase)


def f32(n, begin):
    return {"dtype": "F32", "shape": [n], "data_offsets": [begin, begin + 4 * n]}


raw("empty", b"", "FORMAT_ERROR", "too few for the 8-byte header length")
raw("truncated_length", b"\x10\x00\x00", "FORMAT_ERROR", "too few for the 8-byte header length")
raw("length_past_end", struct.pack("<Q", 1000) + b"{}" + bytes(40), "FORMAT_ERROR", "runs past the end")
raw("length_huge", struct.pack("<Q", 1 << 63) + b"{}      ", "FORMAT_ERROR", "exceeds the limit")
raw("length_over_limit", struct.pack("<Q", 100000001) + b"{}      ", "FORMAT_ERROR", "exceeds the limit")
raw("length_zero", struct.pack("<Q", 0) + bytes(8), "FORMAT_ERROR", "cannot hold a JSON object")
header("not_an_object", "[]", 0, "FORMAT_ERROR", "does not start with '{'")
header("leading_letter", "x{}", 0, "FORMAT_ERROR", "does not start with '{' (byte 0 is 0x78)")
header("blanks_only", "        ", 0, "FORMAT_ERROR", "does not start with '{' (its 8 bytes are blanks)")
header("truncated_json", '{"a":{"dtype":"F32"', 0, "FORMAT_ERROR", "expected ',' or '}'", pad=False)
header("unterminated_string", '{"a', 0, "FORMAT_ERROR", "is not terminated", pad=False)
header("trailing_garbage", "{}x", 0, "FORMAT_ERROR", "after the end of the object")
header("trailing_comma", '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},}', 4, "FORMAT_ERROR",
       "trailing ','")
tensors("overlap", {"a": f32(2, 0), "b": f32(2, 4)}, 12, "FORMAT_ERROR", "overlaps tensor 'a'")
tensors("hole", {"a": f32(2, 0), "b": f32(2, 12)}, 20, "FORMAT_ERROR", "belong to no tensor")
tensors("hole_at_start", {"a": f32(2, 4)}, 12, "FORMAT_ERROR", "bytes [0, 4) before tensor 'a'")
tensors("past_data", {"a": f32(2, 0)}, 4, "FORMAT_ERROR", "past the data section of 4 bytes")
tensors("trailing_data", {"a": f32(2, 0)}, 16, "FORMAT_ERROR", "the tensors end at 8 but the data section holds 16")
tensors("span_mismatch", {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8, "FORMAT_ERROR",
        "span 8 bytes but 3 elements of F32 take 12")
tensors("end_before_begin", {"a": {"dtype": "U8", "shape": [0], "data_offsets": [8, 0]}}, 8, "FORMAT_ERROR",
        "end before they begin")
tensors("shape_overflow", {"a": {"dtype": "F32", "shape": [1 << 32, 1 << 32, 16], "data_offsets": [0, 0]}}, 0,
        "FORMAT_ERROR", "overflows at dimension 1 (4294967296)")
tensors("bytes_overflow", {"a": {"dtype": "F64", "shape": [1 << 62], "data_offsets": [0, 0]}}, 0,
        "FORMAT_ERROR", "overflow")
# No element, but strides past INT64_MAX: refused whatever the order of the extents.
tensors("empty_wide_strides", {"a": {"dtype": "F32", "shape": [0, 1 << 61, 4], "data_offsets": [0, 0]}}, 0,
        "FORMAT_ERROR", "in its strides (it has an extent of 0)")
tensors("unknown_dtype", {"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, 16, "FORMAT_ERROR",
        "unknown dtype 'F128'")
tensors("lowercase_dtype", {"a": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}}, 4, "FORMAT_ERROR",
        "unknown dtype 'f32'")
tensors("subbyte_partial", {"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2, "FORMAT_ERROR",
        "do not fill whole bytes")
tensors("too_many_dims", {"a": {"dtype": "U8", "shape": [1] * 33, "data_offsets": [0, 1]}}, 1, "UNSUPPORTED",
        "more than 32 dimensions")
tensors("three_offsets", {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}, 1, "FORMAT_ERROR",
        "more than 2 entries")
tensors("one_offset", {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, 1, "FORMAT_ERROR",
        "has 1 entries, not 2")
tensors("missing_field", {"a": {"dtype": "U8", "shape": [1]}}, 1, "FORMAT_ERROR", "lacks the field 'data_offsets'")
tensors("unknown_field", {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}, 1,
        "FORMAT_ERROR", "field 'x': unknown field")
header("duplicate_field", '{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1,
       "FORMAT_ERROR", "field 'dtype' appears twice")
header("duplicate_tensor", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
       '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', 2, "FORMAT_ERROR", "tensor 'a' appears twice")
header("duplicate_metadata", '{"__metadata__":{},"__metadata__":{}}', 0, "FORMAT_ERROR",
       "'__metadata__' appears twice")
header("duplicate_metadata_key", '{"__metadata__":{"k":"1","k":"2"}}', 0, "FORMAT_ERROR",
       "metadata key 'k' appears twice")
tensors("metadata_number", {"__metadata__": {"k": 1}}, 0, "FORMAT_ERROR", "metadata values are strings")
tensors("metadata_array", {"__metadata__": []}, 0, "FORMAT_ERROR", "expected '{'")
header("invalid_utf8_name", b'{"a\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1, "FORMAT_ERROR",
       "invalid UTF-8")
header("overlong_utf8_name", b'{"a\xc0\xaf":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1,
       "FORMAT_ERROR", "invalid UTF-8")
header("encoded_surrogate_name", b'{"a\xed\xa0\x80":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1,
       "FORMAT_ERROR", "invalid UTF-8")
header("lone_surrogate_escape", '{"a\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1,
       "FORMAT_ERROR", "lone high surrogate")
header("nul_escape_name", '{"a\\u0000":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1, "FORMAT_ERROR",
       "U+0000")
header("control_char_name", '{"a\x01":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1, "FORMAT_ERROR",
       "raw control character")
header("bad_escape", '{"a\\q":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1, "FORMAT_ERROR",
       "unknown escape")
header("deep_nesting", '{"a":' + "[" * 100000 + "]" * 100000 + "}", 0, "FORMAT_ERROR", "expected '{'")
header("deep_nesting_shape", '{"a":{"dtype":"U8","shape":' + "[" * 1000 + "]" * 1000 + ',"data_offsets":[0,0]}}',
       0, "FORMAT_ERROR", "expected a non-negative integer")
header("number_too_large", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551616]}}', 0,
       "FORMAT_ERROR", "is larger than 18446744073709551615")
header("negative_number", '{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', 1, "FORMAT_ERROR",
       "found '-'")
header("fraction", '{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', 1, "FORMAT_ERROR",
       "is not an integer")
header("exponent", '{"a":{"dtype":"U8","shape":[1e0],"data_offsets":[0,1]}}', 1, "FORMAT_ERROR",
       "is not an integer")
header("leading_zero", '{"a":{"dtype":"U8","shape":[01],"data_offsets":[0,1]}}', 1, "FORMAT_ERROR",
       "leading zero")
header("dtype_not_string", '{"a":{"dtype":4,"shape":[1],"data_offsets":[0,1]}}', 1, "FORMAT_ERROR",
       "expected '\"'")
header("name_not_string", '{1:{}}', 0, "FORMAT_ERROR", "expected '\"'")

os.makedirs(HERE, exist_ok=True)
for name in os.listdir(HERE):
    if name.endswith(".safetensors"):
        os.remove(os.path.join(HERE, name))
with open(os.path.join(HERE, "expect.txt"), "w") as out:
    out.write("# file status phrase-in-message (written by ../make_safetensors_corpus.py)\n")
    for name, data, status, phrase in cases:
        with open(os.path.join(HERE, name + ".safetensors"), "wb") as f:
            f.write(data)
        out.write(f"{name}.safetensors {status} {phrase}\n")
print(f"{len(cases)} hostile files in {HERE}")
