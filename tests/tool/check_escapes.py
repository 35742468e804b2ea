"""The devbuf tool never sends a terminal control character taken from a file or a path.

Hostile weight files (tensor names, dtype strings and metadata holding ESC, BEL, C1
controls, escaped or raw) and a file whose own name holds ESC go through every command
that reads files, on both success and error paths; stdout and stderr must hold no byte
below 0x20 other than newline, no DEL and no UTF-8 C1 control, and `inspect --json`
must stay valid JSON. Usage: check_escapes.py DEVBUF_TOOL SCRATCH_FOLDER
"""
import json
import os
import struct
import subprocess
import sys

tool, scratch = sys.argv[1], sys.argv[2]
os.makedirs(scratch, exist_ok=True)


def safetensors(header: bytes, data: bytes = b"\0" * 4) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


evil = "\x1b]0;owned\x07\x1b[2J\u009b31m"
files = {
    # Escaped control characters in a name and in metadata: a valid file.
    "name.safetensors": safetensors(json.dumps(
        {"__metadata__": {"k" + evil: "v" + evil},
         "t" + evil: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()),
    # An unknown dtype quoted in the error message.
    "dtype.safetensors": safetensors(json.dumps(
        {"x": {"dtype": "F" + evil, "shape": [1], "data_offsets": [0, 4]}}).encode()),
    # A name given twice, quoted in the error message.
    "twice.safetensors": safetensors(
        b'{"a\\u001b[2J":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        b'"a\\u001b[2J":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\0\0"),
    # Offsets that do not tile the data, naming the tensor.
    "offsets.safetensors": safetensors(json.dumps(
        {"n" + evil: {"dtype": "U8", "shape": [2], "data_offsets": [0, 3]}}).encode()),
    # The file's own name holds ESC and BEL.
    "path\x1b[2J\x07.safetensors": safetensors(b'{"ok":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'),
    # Not a weight file at all, with a hostile name.
    "junk\x1b]0;x\x07": b"\x1b[2J" * 8,
}
failures = 0
for name, content in files.items():
    path = os.path.join(scratch, name)
    with open(path, "wb") as f:
        f.write(content)
    runs = [["inspect", path], ["inspect", path, "--json"], ["load", path], ["load", path, "--copy"],
            ["load", path, "--verify"], ["trace", "replay", path]]
    for args in runs:
        result = subprocess.run([tool] + args, capture_output=True, timeout=60)
        for stream, output in (("stdout", result.stdout), ("stderr", result.stderr)):
            bad = [b for b in output if (b < 0x20 and b != 0x0a) or b == 0x7f]
            if bad or b"\xc2\x9b" in output or b"\xc2\x80" in output:
                failures += 1
                print(f"FAIL: devbuf {' '.join(args[:1])} on {name!r}: {stream} holds control bytes: {output[:300]!r}")
        if args[-1] == "--json" and result.returncode == 0:
            try:
                json.loads(result.stdout)
            except ValueError as error:
                failures += 1
                print(f"FAIL: inspect --json on {name!r} is not JSON ({error}): {result.stdout[:300]!r}")
    os.unlink(path)
print(f"{len(files)} hostile files, {failures} failures")
sys.exit(1 if failures else 0)
