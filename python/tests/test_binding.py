"""The ctypes binding (devbuf._native) against include/devbuf.h: every function's signature,
every mirrored structure's size, field names, offsets and field types, and the C module's
stub. ctypes trusts whatever it is told, so a binding that drifts from the header passes
wrong values or cuts pointers in silence; these tests make the drift fail instead.

The header is read from the source tree (these tests live in it). The parser below reads the
subset of C the header is written in, and raises on anything else, so that no declaration
goes unchecked because it could not be read.
"""
from __future__ import annotations

import ast
import ctypes
import keyword
import os
import re

import pytest

from devbuf import _ext, _native

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "include", "devbuf.h")

# The C structures _native.py mirrors, by the header's typedef name. A new mirror goes here
# and into python/src/layouts.c.
MIRRORS = {
    "devbuf_device_info_t": _native.DeviceInfo,
    "devbuf_allocator_stats_t": _native.AllocatorStats,
    "devbuf_caching_options_t": _native.CachingOptions,
    "devbuf_snapshot_block_t": _native.SnapshotBlock,
    "devbuf_snapshot_segment_t": _native.SnapshotSegment,
    "devbuf_allocator_snapshot_t": _native.Snapshot,
    "devbuf_tensor_info_t": _native.TensorInfo,
    "devbuf_load_options_t": _native.LoadOptions,
    "devbuf_named_buffer_t": _native.NamedBuffer,
    "devbuf_metadata_entry_t": _native.MetadataEntry,
    "devbuf_use_t": _native.Use,
    "devbuf_launch_t": _native.Launch,
    "devbuf_arg_t": _native.Arg,
    "devbuf_kernel_args_t": _native.KernelArgs,
}

# C scalar types and the one ctypes class each must be bound as (enums are int).
SCALARS = {
    "void": None, "char": ctypes.c_char, "int": ctypes.c_int, "unsigned": ctypes.c_uint,
    "double": ctypes.c_double, "size_t": ctypes.c_size_t, "uint8_t": ctypes.c_uint8,
    "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
    "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
}
_BUILTIN_WORDS = {"const", "unsigned", "signed", "int", "char", "short", "long", "double", "float", "void"}


class HeaderError(Exception):
    """A declaration the parser cannot read: teach the parser, never skip it."""


# ---- the header, parsed ---------------------------------------------------------------
# C types as tuples: ("scalar", name), ("enum", name), ("opaque", name), ("struct", name),
# ("ptr", type), ("array", type, length), ("func", return type, (parameter types), variadic).


def _tokens(text):
    return re.findall(r"\.\.\.|[A-Za-z_]\w*|\d+\w*|\S", text)


def _split(tokens, separator):
    """`tokens` split at `separator` outside parentheses and brackets."""
    parts, depth, current = [], 0, []
    for token in tokens:
        depth += token in "([" and len(token) == 1
        depth -= token in ")]" and len(token) == 1
        if token == separator and depth == 0:
            parts.append(current)
            current = []
        else:
            current.append(token)
    parts.append(current)
    return parts


class Header:
    def __init__(self, text):
        # Array lengths may name the header's integer macros (DEVBUF_MAX_NDIM).
        self.constants = {name: int(value) for name, value in re.findall(r"^#define (\w+) (\d+)u?\s*$", text, re.M)}
        self.types = {name: ("scalar", name) for name in SCALARS if name not in _BUILTIN_WORDS}
        self.functions = {}  # name -> ("func", ...)
        self.structs = {}  # typedef name -> [(field, type)]
        for statement in self._statements(text):
            try:
                self._declare(statement)
            except HeaderError as e:
                raise HeaderError(f"{e}\n  in: {statement}") from None

    @staticmethod
    def _statements(text):
        text = re.sub(r"//[^\n]*", "", text)
        lines, skipping = [], 0
        continued = False
        for line in text.split("\n"):
            directive = continued or line.lstrip().startswith("#")
            continued = directive and line.rstrip().endswith("\\")
            if directive:
                word = line.strip()
                if skipping:
                    skipping += word.startswith("#if") - word.startswith("#endif")
                elif word.startswith("#ifdef __cplusplus"):
                    skipping = 1  # extern "C" and its brace
                continue
            if not skipping:
                lines.append(line)
        statements, depth, start = [], 0, 0
        code = "\n".join(lines)
        for i, char in enumerate(code):
            depth += (char == "{") - (char == "}")
            if char == ";" and depth == 0:
                statements.append(" ".join(code[start:i].split()))
                start = i + 1
        if code[start:].strip():
            raise HeaderError(f"text after the last declaration: {code[start:].strip()[:80]}")
        return statements

    def _declare(self, statement):
        if statement.startswith("DEVBUF_API "):
            body = re.sub(r"__attribute__\s*\(\(.*\)\)\s*$", "", statement[len("DEVBUF_API "):])
            name, ctype = self.declarator(_tokens(body))
            if ctype[0] != "func":
                raise HeaderError(f"{name} is not a function")
            self.functions[name] = ctype
            return
        m = re.fullmatch(r"typedef (struct|enum) (\w+) \{(.*)\} (\w+)", statement)
        if m:
            kind, tag, body, name = m.groups()
            self.types[name] = self.types[f"{kind} {tag}"] = (kind, name)
            if kind == "struct":
                self.structs[name] = self._fields(body)
            return
        m = re.fullmatch(r"typedef struct (\w+) (\w+)", statement)
        if m:
            self.types[m[2]] = self.types[f"struct {m[1]}"] = ("opaque", m[2])
            return
        m = re.fullmatch(r"struct (\w+)", statement)
        if m:
            self.types[statement] = ("opaque", statement)
            return
        if re.fullmatch(r"enum \{.*\}", statement):
            return  # constants only
        if statement.startswith("typedef "):
            name, ctype = self.declarator(_tokens(statement[len("typedef "):]))
            self.types[name] = ctype
            return
        raise HeaderError("not a declaration the binding check knows")

    def _fields(self, body):
        if "{" in body:
            raise HeaderError("a nested structure or union")
        fields = []
        for member in body.split(";"):
            tokens = _tokens(member)
            if not tokens:
                continue
            declarators = _split(tokens, ",")
            base = self.base_length(declarators[0])
            for i, declarator in enumerate(declarators):
                fields.append(self.declarator(declarator if i == 0 else declarators[0][:base] + declarator))
        return fields

    def base_length(self, tokens):
        """How many of `tokens` are the type specifiers (before pointers and the name)."""
        i, named = 0, False
        while i < len(tokens):
            token = tokens[i]
            if token in ("struct", "enum"):
                i, named = i + 2, True
            elif token in _BUILTIN_WORDS:
                i += 1
                named = named or token != "const"
            elif token in self.types and not named:
                i, named = i + 1, True
            else:
                break
        if not named:
            raise HeaderError(f"no type in {' '.join(tokens)!r}")
        return i

    def base_type(self, tokens):
        words = [t for t in tokens if t != "const"]
        if words[0] in ("struct", "enum"):
            key = " ".join(words)
            if key not in self.types:
                raise HeaderError(f"unknown type {key!r}")
            return self.types[key]
        if len(words) == 1 and words[0] in self.types:
            return self.types[words[0]]
        spelling = {("unsigned",): "unsigned", ("unsigned", "int"): "unsigned", ("int",): "int",
                    ("char",): "char", ("double",): "double", ("void",): "void"}.get(tuple(words))
        if spelling is None:
            raise HeaderError(f"unknown type {' '.join(tokens)!r} (add it to SCALARS)")
        return ("scalar", spelling)

    def declarator(self, tokens):
        """(name, type) of one declaration; name None for an unnamed parameter."""
        base = self.base_length(tokens)
        ctype = self.base_type(tokens[:base])
        rest = tokens[base:]
        while rest and rest[0] in ("*", "const"):
            if rest[0] == "*":
                ctype = ("ptr", ctype)
            rest = rest[1:]
        if not rest:
            return None, ctype
        if rest[:2] == ["(", "*"] and len(rest) > 4 and rest[3] == ")" and rest[4] == "(" and rest[-1] == ")":
            return rest[2], ("ptr", self._function(ctype, rest[5:-1]))
        name, rest = rest[0], rest[1:]
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise HeaderError(f"cannot read {' '.join(tokens)!r}")
        if not rest:
            return name, ctype
        if len(rest) == 3 and rest[0] == "[" and rest[2] == "]":
            length = int(rest[1]) if rest[1].isdigit() else self.constants.get(rest[1])
            if length is None:
                raise HeaderError(f"array length {rest[1]!r}: not a number or an integer macro")
            return name, ("array", ctype, length)
        if rest[0] == "(" and rest[-1] == ")":
            return name, self._function(ctype, rest[1:-1])
        raise HeaderError(f"cannot read {' '.join(tokens)!r}")

    def _function(self, result, parameters):
        if parameters in ([], ["void"]):
            return ("func", result, (), False)
        parts = _split(parameters, ",")
        variadic = parts[-1] == ["..."]
        if variadic:
            parts = parts[:-1]
        return ("func", result, tuple(self.declarator(part)[1] for part in parts), variadic)


def spell(ctype):
    """A C spelling of a parsed type, for messages."""
    kind = ctype[0]
    if kind == "ptr":
        return spell(ctype[1]) + "*"
    if kind == "array":
        return f"{spell(ctype[1])}[{ctype[2]}]"
    if kind == "func":
        return f"{spell(ctype[1])}({', '.join(spell(p) for p in ctype[2])}{', ...' if ctype[3] else ''})"
    return ctype[1]


def describe(pytype):
    """A spelling of a ctypes type, for messages."""
    if pytype is None:
        return "None"
    if isinstance(pytype, type) and issubclass(pytype, ctypes._Pointer):
        return f"POINTER({describe(pytype._type_)})"
    if isinstance(pytype, type) and issubclass(pytype, ctypes.Array):
        return f"{describe(pytype._type_)} * {pytype._length_}"
    if isinstance(pytype, type) and issubclass(pytype, ctypes._CFuncPtr):
        return f"CFUNCTYPE({', '.join(describe(t) for t in (pytype._restype_, *pytype._argtypes_))})"
    return getattr(pytype, "__name__", repr(pytype))


def mismatch(ctype, pytype, mirrors=MIRRORS):
    """Why `pytype` cannot stand for the C type `ctype` in a call or a structure; None if it
    can. Classes that ctypes makes one (c_size_t and c_uint64 on LP64) pass for each other:
    they are the same type there."""
    expected = _expected(ctype, mirrors)
    if isinstance(expected, str):
        return expected
    if expected is _FUNCTION_POINTER:
        func = ctype[1]
        if pytype is ctypes.c_void_p:
            return None  # a C function's address (a trampoline of devbuf._ext)
        if not (isinstance(pytype, type) and issubclass(pytype, ctypes._CFuncPtr)):
            return f"{spell(ctype)} is a function pointer: a CFUNCTYPE mirror or c_void_p, not {describe(pytype)}"
        if len(pytype._argtypes_) != len(func[2]) or func[3]:
            return f"{spell(ctype)} takes {len(func[2])} arguments; {describe(pytype)} takes {len(pytype._argtypes_)}"
        for c, p in zip((func[1], *func[2]), (pytype._restype_, *pytype._argtypes_)):
            why = mismatch(c, p, mirrors)
            if why:
                return f"{spell(ctype)} as {describe(pytype)}: {why}"
        return None
    if isinstance(expected, tuple):  # an array
        element, length = expected
        if not (isinstance(pytype, type) and issubclass(pytype, ctypes.Array)) or pytype._length_ != length:
            return f"{spell(ctype)} is {describe(pytype)}"
        return mismatch(element, pytype._type_, mirrors)
    if pytype is not expected:
        return f"{spell(ctype)} is {describe(expected)}, not {describe(pytype)}"
    return None


_FUNCTION_POINTER = object()


def _expected(ctype, mirrors):
    """The ctypes type for `ctype`, _FUNCTION_POINTER, (element C type, length) for an
    array, or a string saying why there is none."""
    kind = ctype[0]
    if kind == "scalar":
        return SCALARS[ctype[1]]
    if kind == "enum":
        return ctypes.c_int
    if kind == "struct":
        return mirrors.get(ctype[1], f"{ctype[1]} has no mirror in _native.py (add one, and to MIRRORS)")
    if kind == "opaque":
        return f"{ctype[1]} is opaque: only pointers to it can be passed"
    if kind == "array":
        return (ctype[1], ctype[2])
    if kind == "func":
        return f"{spell(ctype)} is a function, not a value"
    inner = ctype[1]  # a pointer
    if inner[0] == "func":
        return _FUNCTION_POINTER
    if inner in (("scalar", "char"),):
        return ctypes.c_char_p
    if inner in (("scalar", "void"),) or inner[0] == "opaque":
        return ctypes.c_void_p
    pointee = _expected(inner, mirrors)
    if isinstance(pointee, str):
        return pointee
    if pointee is None or pointee is _FUNCTION_POINTER or isinstance(pointee, tuple):
        return f"no ctypes pointer type for {spell(ctype)}"
    return ctypes.POINTER(pointee)


def signature_mismatches(header, signatures):
    """Every difference between `signatures` (_SIGNATURES' form) and the header's functions."""
    problems = []
    for name, (restype, *argtypes) in signatures.items():
        if name not in header.functions:
            problems.append(f"{name}: not declared in include/devbuf.h")
            continue
        _, result, parameters, variadic = header.functions[name]
        # A variadic function's argtypes are its fixed parameters (ctypes passes the rest as given).
        if len(argtypes) != len(parameters):
            fixed = " fixed" if variadic else ""
            problems.append(f"{name}: the header has {len(parameters)}{fixed} arguments, _SIGNATURES {len(argtypes)}")
            continue
        why = mismatch(result, restype)
        if why:
            problems.append(f"{name}: returns {why}")
        for i, (c, p) in enumerate(zip(parameters, argtypes)):
            why = mismatch(c, p)
            if why:
                problems.append(f"{name}: argument {i + 1}: {why}")
    return problems


def layout_mismatches(header, layouts, mirrors):
    """Every difference between the mirrors and the header's structures: the field names
    and types against the header, sizes and offsets against the C compiler's (`layouts`,
    devbuf._ext.layouts())."""
    problems = []
    for cname, mirror in mirrors.items():
        if cname not in header.structs:
            problems.append(f"{cname} ({mirror.__name__}): no such structure in include/devbuf.h")
            continue
        if cname not in layouts:
            problems.append(f"{cname} ({mirror.__name__}): not in devbuf._ext.layouts() (python/src/layouts.c)")
            continue
        size, offsets = layouts[cname]
        fields = header.structs[cname]
        header_names = [field for field, _ in fields]
        # A field named by a Python keyword takes a trailing underscore ("global_").
        mirror_fields = [(entry[0][:-1] if keyword.iskeyword(entry[0][:-1]) else entry[0], entry[1])
                         for entry in mirror._fields_]
        if list(offsets) != header_names:
            problems.append(f"{cname}: python/src/layouts.c lists {list(offsets)}, the header {header_names}")
        if [field for field, _ in mirror_fields] != header_names:
            problems.append(f"{cname}: {mirror.__name__} has fields {[f for f, _ in mirror_fields]}, "
                            f"the header {header_names}")
            continue
        if ctypes.sizeof(mirror) != size:
            problems.append(f"{cname}: {mirror.__name__} is {ctypes.sizeof(mirror)} bytes, C's {size}")
        for (field, ctype), (_, pytype), entry in zip(fields, mirror_fields, mirror._fields_):
            offset = getattr(mirror, entry[0]).offset
            if field in offsets and offset != offsets[field]:
                problems.append(f"{cname}.{field}: at {offset} in {mirror.__name__}, at {offsets[field]} in C")
            why = mismatch(ctype, pytype, mirrors)
            if why:
                problems.append(f"{cname}.{field}: {why}")
    for cname in layouts:
        if cname not in mirrors:
            problems.append(f"{cname}: in devbuf._ext.layouts() but not in MIRRORS")
    return problems


@pytest.fixture(scope="module")
def header():
    if not os.path.exists(HEADER):
        pytest.fail(f"{HEADER} is missing: these tests run from devbuf's source tree")
    with open(HEADER, encoding="utf-8") as f:
        return Header(f.read())


# ---- functions ---------------------------------------------------------------------------


def test_every_header_function_is_bound_or_listed_as_unbound(header):
    declared = set(header.functions)
    bound, unbound = set(_native._SIGNATURES), set(_native._UNBOUND)
    problems = [f"{name}: declared in include/devbuf.h, in neither _SIGNATURES nor _UNBOUND (with a reason)"
                for name in sorted(declared - bound - unbound)]
    problems += [f"{name}: in both _SIGNATURES and _UNBOUND (remove it from _UNBOUND)" for name in sorted(bound & unbound)]
    problems += [f"{name}: in _UNBOUND but not declared in include/devbuf.h" for name in sorted(unbound - declared)]
    problems += [f"{name}: _UNBOUND gives no reason" for name, why in _native._UNBOUND.items() if not why.strip()]
    assert not problems, "\n".join(problems)


def test_signatures_match_the_header(header):
    problems = signature_mismatches(header, _native._SIGNATURES)
    assert not problems, "\n".join(problems)


def test_the_header_is_read_whole(header):
    with open(HEADER, encoding="utf-8") as f:
        declarations = re.findall(r"^DEVBUF_API ", f.read(), re.M)
    assert len(header.functions) == len(declarations) > 100


# ---- structures --------------------------------------------------------------------------


def test_structures_match_c_layouts_and_the_header(header):
    problems = layout_mismatches(header, _ext.layouts(), MIRRORS)
    mirrored = {cls for cls in vars(_native).values()
                if isinstance(cls, type) and issubclass(cls, ctypes.Structure) and cls.__module__ == _native.__name__}
    problems += [f"{cls.__name__}: a structure of _native.py missing from MIRRORS"
                 for cls in sorted(mirrored - set(MIRRORS.values()), key=lambda c: c.__name__)]
    assert not problems, "\n".join(problems)


# ---- the library object ------------------------------------------------------------------


def test_lib_has_only_the_table_functions():
    with pytest.raises(AttributeError, match=r"devbuf_dtype_dlpack is not in devbuf\._native\._SIGNATURES"):
        _native.lib.devbuf_dtype_dlpack
    assert not hasattr(_native.lib, "devbuf_no_such_function")
    function = _native.lib.devbuf_buffer_retain
    assert function.restype is ctypes.c_void_p and function.argtypes == [ctypes.c_void_p]
    assert ctypes.cast(function, ctypes.c_void_p).value  # how _buffer.py takes addresses


# ---- the checks themselves catch drift ---------------------------------------------------


@pytest.mark.parametrize("name, entry, expected", [
    ("devbuf_buffer_view", (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t),
     "the header has 4 arguments, _SIGNATURES 3"),
    ("devbuf_buffer_copyin", (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t),
     "argument 2: void* is c_void_p, not c_ulong"),
    ("devbuf_queue_set_depth", (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64),
     "argument 3: uint32_t is c_uint, not c_ulong"),
    ("devbuf_event_signal", (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32),
     "argument 2: uint64_t is c_ulong, not c_uint"),
    ("devbuf_event_signal", (ctypes.c_int, ctypes.c_void_p, ctypes.c_double),
     "argument 2: uint64_t is c_ulong, not c_double"),
    ("devbuf_device_open", (ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)),
     "argument 1: char* is c_char_p, not c_void_p"),
    ("devbuf_buffer_retain", (ctypes.c_int, ctypes.c_void_p), "returns devbuf_buffer_t* is c_void_p, not c_int"),
    ("devbuf_buffer_shape", (ctypes.c_void_p, ctypes.c_void_p),
     "returns size_t* is POINTER(c_ulong), not c_void_p"),
    ("devbuf_device_info", (ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_native.AllocatorStats)),
     "argument 2: devbuf_device_info_t* is POINTER(DeviceInfo), not POINTER(AllocatorStats)"),
    ("devbuf_status_name", (ctypes.c_char_p, ctypes.c_double), "argument 1: devbuf_status is c_int, not c_double"),
    ("devbuf_set_error", (ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int),
     "the header has 2 fixed arguments, _SIGNATURES 3"),
    ("devbuf_no_such_function", (None,), "not declared in include/devbuf.h"),
])
def test_a_drifting_signature_fails(header, name, entry, expected):
    problems = signature_mismatches(header, {name: entry})
    assert any(expected in problem for problem in problems), problems


def _mirror(name, fields):
    return type(name, (ctypes.Structure,), {"_fields_": fields})


@pytest.mark.parametrize("cname, fields, expected", [
    ("devbuf_arg_t", [("data", ctypes.c_void_p)], "has fields ['data'], the header ['data', 'size']"),
    # the same size and offsets (padding): the header's field types catch these
    ("devbuf_arg_t", [("data", ctypes.c_void_p), ("size", ctypes.c_uint32)], "size: size_t is c_ulong, not c_uint"),
    ("devbuf_use_t", [("buffer", ctypes.c_void_p), ("access", ctypes.c_uint64)],
     "access: devbuf_access is c_int, not c_ulong"),
    ("devbuf_caching_options_t", [("memory_limit", ctypes.c_uint64), ("cache_limit", ctypes.c_uint64),
                                  ("max_buffers", ctypes.c_uint64), ("page_size", ctypes.c_uint32),
                                  ("growable", ctypes.c_uint32)], "growable: at 28 in CachingOptions, at 32 in C"),
    ("devbuf_launch_t", [("dims", ctypes.c_uint), ("global", ctypes.c_size_t * 2), ("local", ctypes.c_size_t * 3)],
     "size_t[3] is c_ulong * 2"),
    ("devbuf_named_buffer_t", [("name", ctypes.c_void_p), ("buffer", ctypes.c_void_p)],
     "name: char* is c_char_p, not c_void_p"),
    ("devbuf_load_options_t", [("flags", ctypes.c_uint32),
                               ("on_tensor", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)),
                               ("context", ctypes.c_void_p), ("allocator", ctypes.c_void_p),
                               ("select", _native.SELECT_TENSOR)], "takes 4 arguments"),
])
def test_a_drifting_structure_fails(header, cname, fields, expected):
    name = MIRRORS[cname].__name__
    mirrors = dict(MIRRORS, **{cname: _mirror(name, fields)})
    problems = layout_mismatches(header, {cname: _ext.layouts()[cname]}, {cname: mirrors[cname]})
    assert any(expected in problem for problem in problems), problems


def test_the_parser_refuses_what_it_cannot_read():
    with pytest.raises(HeaderError, match="unknown type 'float'"):
        Header("DEVBUF_API float devbuf_f(void);")
    with pytest.raises(HeaderError, match="no type in"):
        Header("DEVBUF_API devbuf_f(devbuf_mystery_t *x);")
    with pytest.raises(HeaderError, match="not a declaration the binding check knows"):
        Header("union devbuf_u { int a; };")
    with pytest.raises(HeaderError, match="nested structure"):
        Header("typedef struct s { struct { int a; } inner; } s_t;")


# ---- the C module and its stub -----------------------------------------------------------


def _stub_names():
    stub = os.path.join(os.path.dirname(os.path.abspath(_ext.__file__)), "_ext.pyi")
    with open(stub, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    module, classes = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            module.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            module.add(node.target.id)
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {item.name if isinstance(item, ast.FunctionDef) else item.target.id
                                  for item in node.body if isinstance(item, (ast.FunctionDef, ast.AnnAssign))}
    return module, classes


def test_the_stub_matches_the_c_module():
    module, classes = _stub_names()
    public = {name for name in dir(_ext) if not name.startswith("_")}
    assert public == module, f"devbuf._ext has {sorted(public)}, _ext.pyi {sorted(module)}"
    for name, members in classes.items():
        cls = getattr(_ext, name)
        # What the type itself defines: its methods and attributes, and the protocols and
        # constructor it implements (slot wrappers of object's own are inherited, not its).
        own = {member for member, value in vars(cls).items()
               if not member.startswith("_") or member in ("__init__", "__enter__", "__exit__", "__iter__",
                                                            "__len__", "__getitem__", "__call__", "__buffer__")}
        assert own == members, f"devbuf._ext.{name} has {sorted(own)}, _ext.pyi {sorted(members)}"
