"""DLPack into devbuf: devbuf.from_dlpack(numpy array, torch tensor, capsule)."""
from __future__ import annotations

import ctypes
from typing import Any

from . import _ext
from ._buffer import Buffer
from ._errors import check, wrong_type
from ._native import P, lib

# The newest DLPack devbuf reads (it takes any 1.x).
MAX_VERSION = (1, 1)


def from_dlpack(source: Any) -> Buffer:
    """A buffer over the memory of `source` without copying: anything with __dlpack__
    (numpy arrays, torch tensors) or a DLPack capsule. The buffer keeps the producer's
    memory alive and lets it go when its last view is gone; read-only sources (DLPack 1.x
    read-only flag) give read-only buffers. Strided (non-compact) sources and dtypes devbuf
    lacks raise devbuf.UnsupportedError naming the field."""
    if isinstance(source, Buffer):
        return source._alias()
    capsule = source
    if not hasattr(source, "__dlpack__") and type(source).__name__ != "PyCapsule":
        raise wrong_type("source", source, "an object with __dlpack__ (a numpy array, a torch tensor), a DLPack "
                         "capsule or a devbuf.Buffer")
    if hasattr(source, "__dlpack__"):
        try:
            capsule = source.__dlpack__(max_version=MAX_VERSION)
        except TypeError:  # a producer from before DLPack 1.0
            capsule = source.__dlpack__()
    address, versioned = _ext.peek(capsule)
    out = P()
    importer = lib.devbuf_buffer_from_dlpack_versioned if versioned else lib.devbuf_buffer_from_dlpack
    # On failure the capsule still owns the tensor and its destructor gives it back.
    check(importer(address, ctypes.byref(out)))
    _ext.consume(capsule)
    return Buffer._own(out.value)
