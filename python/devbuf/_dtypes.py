"""devbuf's dtypes by name, as the library names them ("float32", "bfloat16", ...)."""
from __future__ import annotations

import ctypes
import sys
from typing import Any

from ._errors import InvalidArgumentError
from ._native import lib

def _name_of(value: int) -> str | None:
    name = lib.devbuf_dtype_name(value)
    return name.decode() if name else None


# The library's dtype table, in enum order: every name it knows, and nothing else.
NAMES: tuple[str, ...] = tuple(name for name in (_name_of(i) for i in range(64)) if name is not None)
CODES = {name: code for code, name in enumerate(NAMES)}

# memoryview formats for the dtypes memoryview.cast takes (half floats from Python 3.12 on).
FORMATS = {"bool": "?", "int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint8": "B", "uint16": "H",
           "uint32": "I", "uint64": "Q", "float32": "f", "float64": "d"}
if sys.version_info >= (3, 12):
    FORMATS["float16"] = "e"
# struct formats, for numbers written as one element (Queue.fill).
STRUCT_FORMATS = dict(FORMATS, float16="e")


def code_of(dtype: Any) -> int:
    """The library's value for a dtype given by name (devbuf's "float32" or safetensors'
    "F32"), or by anything whose str() is one (a numpy dtype)."""
    name = dtype if isinstance(dtype, str) else str(getattr(dtype, "name", dtype))
    if name in CODES:
        return CODES[name]
    value = ctypes.c_int()
    if lib.devbuf_dtype_from_name(name.encode(), ctypes.byref(value)) == 0:
        return value.value
    raise InvalidArgumentError(f"unknown dtype {name!r}; devbuf's are {', '.join(NAMES)}")


def bits(code: int) -> int:
    return int(lib.devbuf_dtype_bits(code))
