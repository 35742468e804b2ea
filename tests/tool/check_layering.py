#!/usr/bin/env python3
"""The layering rule of src/ (docs/architecture.md), checked two ways:

- includes: a file in folder L may include headers of L and of the layers below it; a
  backend (each folder of backend/) the backend layer's own backend.h but not another
  backend; only the registry (backend/registry.c) names every backend; no file may sit in
  src/ outside a layer;
- symbols (with the object files of a build): what each object file calls or reads of
  another file of src/, from `nm`, may only point to its own layer or below.

Layers, lowest first, and the wrong-way uses still to be broken are listed in
src/layers.txt; any other wrong-way use fails the check, and so does an allowance that is no
longer needed (the list only shrinks).

usage: check_layering.py SOURCE_DIR [OBJECT_DIR]
       check_layering.py --self-test     (shows the check failing on a wrong-way include)
"""
import os
import re
import subprocess
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_rules(src):
    layers, allowed = [], set()
    for raw in open(os.path.join(src, "layers.txt")):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("allow "):
            what, arrow, target = line[len("allow "):].partition(" -> ")
            allowed.add((what.strip(), target.strip()))
        else:
            layers.append(line)
    return layers, allowed


def layer_of(path, layers):
    """The layer of a path relative to src/ ("backend/opencl/x.c" -> "backend") and its group
    (a backend's own folder; "backend" for what all backends share)."""
    parts = path.split("/")
    if len(parts) == 1 or parts[0] not in layers:
        raise SystemExit(f"check_layering: {path} is in no layer of layers.txt")
    group = "/".join(parts[:2]) if parts[0] == "backend" and len(parts) > 2 else parts[0]
    return parts[0], group


REGISTRY = "backend/registry.c"


def wrong_way(a, b, layers):
    (la, ga), (lb, gb) = layer_of(a, layers), layer_of(b, layers)
    if layers.index(lb) > layers.index(la):
        return True
    # One backend reaching into another, or the shared part into a backend: only the registry,
    # whose entries name each backend's table, may.
    return la == lb == "backend" and ga != gb and gb != "backend" and a != REGISTRY


def sources(src):
    for folder, _, files in os.walk(src):
        for name in files:
            if name.endswith((".c", ".h", ".cu")):
                yield os.path.relpath(os.path.join(folder, name), src)


def include_uses(src):
    for path in sources(src):
        text = open(os.path.join(src, path), errors="replace").read()
        for target in INCLUDE.findall(text):
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
            if os.path.exists(os.path.join(src, resolved)):
                yield path, resolved


def symbol_uses(src, object_dirs):
    defined, used = {}, {}
    for objects, (folder, _, files) in ((d, w) for d in object_dirs for w in os.walk(d)):
        for name in files:
            if not name.endswith(".o"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), objects)
            if not rel.startswith("src/"):
                continue
            source = rel[len("src/"):-len(".o")]
            if not os.path.exists(os.path.join(src, source)):
                continue  # left over from an older layout of the build folder
            out = subprocess.run(["nm", os.path.join(folder, name)], capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                fields = line.split()
                if len(fields) == 3 and fields[1] in "TDBRC":
                    defined[fields[2]] = source
                elif len(fields) == 2 and fields[0] == "U":
                    used.setdefault(source, set()).add(fields[1])
    for source, symbols in sorted(used.items()):
        for target in sorted({defined[s] for s in symbols if s in defined and defined[s] != source}):
            yield source, target


def check(src, objects=None):
    layers, allowed = read_rules(src)
    found = set()
    problems = []
    uses = list(include_uses(src)) + (list(symbol_uses(src, objects)) if objects else [])
    for a, b in uses:
        if wrong_way(a, b, layers):
            found.add((a, b))
            if (a, b) not in allowed:
                kind = "includes" if b.endswith(".h") else "uses"
                problems.append(f"{a} ({layer_of(a, layers)[0]}) {kind} {b} "
                                f"({layer_of(b, layers)[0]}): a lower layer may not reach up")
    checked_symbols = objects is not None
    for a, b in sorted(allowed - found):
        if b.endswith(".h") or checked_symbols:
            problems.append(f"layers.txt allows {a} -> {b}, which is no longer used: remove the line")
    return problems, len(uses), len(found)


def self_test():
    with tempfile.TemporaryDirectory() as src:
        os.makedirs(os.path.join(src, "base"))
        os.makedirs(os.path.join(src, "core"))
        open(os.path.join(src, "layers.txt"), "w").write("base\ncore\n")
        open(os.path.join(src, "core", "core.h"), "w").write("")
        open(os.path.join(src, "base", "low.c"), "w").write('#include "../core/core.h"\n')
        problems, _, _ = check(src)
        if not any("base/low.c (base) includes core/core.h (core)" in p for p in problems):
            print("FAIL: the check let a wrong-way include through:", problems)
            return 1
        print("self-test: a wrong-way include is refused:", problems[0])
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    src = os.path.join(sys.argv[1], "src")
    # The library's objects, its registry, and the tests' registry with their backends.
    objects = [os.path.join(sys.argv[2], "CMakeFiles", d + ".dir")
               for d in ("devbuf_objects", "devbuf_registry", "devbuf_test_registry")] if len(sys.argv) > 2 else None
    problems, uses, wrong = check(src, objects)
    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print(f"layering: {uses} uses between files of src/ checked ({'includes and symbols' if objects else 'includes'}); "
          f"{wrong} wrong-way uses, each listed in src/layers.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
