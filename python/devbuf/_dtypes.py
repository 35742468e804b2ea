"""devbuf's dtypes by name, as the library names them ("float32", "bfloat16", ...), and the
other spellings of them that numpy takes: np.float32, "f4", "<f4", np.dtype(...), and
ml_dtypes' types (ml_dtypes.bfloat16) for the ones numpy lacks.

numpy is optional: it is imported only when a dtype is given in a spelling that only numpy
can read (a type, or a string that is not a devbuf or safetensors name)."""
from __future__ import annotations

import ctypes
import sys
from typing import Any

from ._errors import InvalidArgumentError, c_text, short_repr, wrong_type
from ._native import lib


def _name_of(value: int) -> str | None:
    name = lib.devbuf_dtype_name(value)
    return name.decode() if name else None


# The library's dtype table, in enum order: every name it knows, and nothing else.
NAMES: tuple[str, ...] = tuple(name for name in (_name_of(i) for i in range(64)) if name is not None)
CODES = {name: code for code, name in enumerate(NAMES)}

# ml_dtypes' names (numpy dtype .name) of devbuf's types where they differ: ml_dtypes adds
# "fn"/"fnu" (finite, NaN, unsigned) where devbuf names the float by its bits alone.
# ml_dtypes' own "float8_e4m3" is the IEEE-like type with infinities, which devbuf lacks, so
# as a dtype object that name is refused (as a string it stays devbuf's own name).
_ML_DTYPES = {"bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3", "float8_e5m2": "float8_e5m2",
              "float8_e8m0fnu": "float8_e8m0", "float8_e4m3fnuz": "float8_e4m3fnuz",
              "float8_e5m2fnuz": "float8_e5m2fnuz", "float6_e2m3fn": "float6_e2m3",
              "float6_e3m2fn": "float6_e3m2", "float4_e2m1fn": "float4_e2m1"}
_ALIASES = {ml: name for ml, name in _ML_DTYPES.items() if ml != name}

# Python's own types as numpy reads them, for when numpy is not installed.
_BUILTIN_TYPES: dict[type, str] = {bool: "bool", int: "int64", float: "float64"}

# memoryview formats for the dtypes memoryview.cast takes (half floats from Python 3.12 on).
FORMATS = {"bool": "?", "int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint8": "B", "uint16": "H",
           "uint32": "I", "uint64": "Q", "float32": "f", "float64": "d"}
if sys.version_info >= (3, 12):
    FORMATS["float16"] = "e"
# struct formats, for numbers written as one element (Queue.fill).
STRUCT_FORMATS = dict(FORMATS, float16="e")

ACCEPTED = ("a devbuf dtype name (" + ", ".join(NAMES) + "), a safetensors name (\"F32\", \"BF16\", ...), "
            "or a numpy spelling of one (np.float32, \"f4\", \"<f4\", np.dtype(...), ml_dtypes.bfloat16)")


def code_of(dtype: Any, what: str = "dtype") -> int:
    """The library's value for a dtype in any spelling numpy takes (see the module's
    docstring). InvalidArgumentError names the dtype when devbuf lacks it (complex128,
    object, str) or its byte order is big-endian; devbuf.ArgumentTypeError (a TypeError)
    when `dtype` is no spelling of a dtype at all."""
    if isinstance(dtype, str):
        code = CODES.get(dtype)
        if code is not None:  # the common case first: no other look-up
            return code
        return _code_of_string(dtype, what)
    if isinstance(dtype, type):
        return _code_of_type(dtype, what)
    if all(hasattr(dtype, field) for field in ("kind", "itemsize", "byteorder", "name", "str")):
        return _code_of_numpy(dtype, dtype, what)  # a numpy dtype, or something shaped like one
    raise wrong_type(what, dtype, ACCEPTED)


def name_of(dtype: Any, what: str = "dtype") -> str:
    """devbuf's name of a dtype in any spelling code_of takes."""
    return NAMES[code_of(dtype, what)]


def _code_of_string(name: str, what: str) -> int:
    alias = _ALIASES.get(name)
    if alias is not None:
        return CODES[alias]
    value = ctypes.c_int()
    if lib.devbuf_dtype_from_name(c_text(name, what), ctypes.byref(value)) == 0:  # "F32", "BF16"
        return value.value
    try:
        import numpy
    except ImportError:
        raise InvalidArgumentError(f"{what} {name!r} is unknown (numpy, which reads numpy's spellings, is not "
                                   f"installed); give {ACCEPTED}") from None
    try:
        parsed = numpy.dtype(name)
    except TypeError:
        raise InvalidArgumentError(f"{what} {name!r} is unknown; give {ACCEPTED}") from None
    return _code_of_numpy(parsed, name, what)


def _code_of_type(kind: type, what: str) -> int:
    """A type as numpy reads it: np.float32, ml_dtypes.bfloat16, Python's float."""
    try:
        import numpy
    except ImportError:
        name = _BUILTIN_TYPES.get(kind)
        if name is None:
            raise wrong_type(what, kind, ACCEPTED + " (numpy, which reads other types, is not installed)") from None
        return CODES[name]
    try:
        parsed = numpy.dtype(kind)
    except TypeError:
        raise wrong_type(what, kind, ACCEPTED) from None
    return _code_of_numpy(parsed, kind, what)


def _code_of_numpy(dtype: Any, given: Any, what: str) -> int:
    """The code of a numpy dtype (or one shaped like it), refusing byte orders and types
    devbuf lacks by name."""
    kind, size, byteorder, called = str(dtype.kind), int(dtype.itemsize), str(dtype.byteorder), str(dtype.name)
    spelled = short_repr(given)
    if given is not dtype or called not in spelled:
        spelled += f" (numpy's {called}, {dtype.str})"
    if byteorder == ">" or (byteorder == "=" and sys.byteorder != "little"):
        raise InvalidArgumentError(f"{what} {spelled} is big-endian: devbuf's dtypes are little-endian "
                                   f"(give '<{str(dtype.str)[1:]}', or convert the data with .astype)")
    # ml_dtypes' types go by name alone: their kind and size say nothing numpy's would.
    name = _ML_DTYPES.get(called)
    if name is None and getattr(dtype, "fields", None) is None and getattr(dtype, "subdtype", None) is None:
        if kind == "b" and size == 1:
            name = "bool"
        elif kind in "iu" and size in (1, 2, 4, 8):
            name = f"{'u' if kind == 'u' else ''}int{size * 8}"
        elif kind == "f" and called == f"float{size * 8}" and size in (2, 4, 8):
            name = called
        elif kind == "c" and size == 8:
            name = "complex64"
    if name is None:
        raise InvalidArgumentError(f"{what} {spelled}: devbuf has no such type; give {ACCEPTED}")
    return CODES[name]


def bits(code: int) -> int:
    return int(lib.devbuf_dtype_bits(code))
