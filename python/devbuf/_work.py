"""What a submission from Python passes to the library: its uses, its scalars and its grid,
checked with messages that name the argument, and packed the way the C structures lay
them out."""
from __future__ import annotations

import ctypes
import struct
from typing import Any, Sequence

from . import _dtypes
from ._buffer import Buffer
from ._errors import ArgumentTypeError, InvalidArgumentError
from ._native import Arg, Launch, Use

_ACCESS = {"r": 1, "w": 2, "rw": 3}
_PLAIN_NUMBERS = (bool, int, float)


def uses_array(uses: Any, where: str) -> tuple[Any, int, tuple[Buffer, ...], tuple[str, ...]]:
    """The devbuf_use_t array of `uses` ([(buffer, "r" | "w" | "rw"), ...]), its length, the
    buffers and their modes."""
    if isinstance(uses, (str, bytes)) or not isinstance(uses, Sequence):
        raise ArgumentTypeError(f"{where}: uses is a list of (buffer, 'r' | 'w' | 'rw') pairs, not {type(uses).__name__}")
    buffers, modes = [], []
    for i, use in enumerate(uses):
        if not (isinstance(use, tuple) and len(use) == 2 and isinstance(use[0], Buffer)):
            raise ArgumentTypeError(f"{where}: uses[{i}] is {use!r}: give (buffer, 'r' | 'w' | 'rw')")
        if use[1] not in _ACCESS:
            raise InvalidArgumentError(f"{where}: uses[{i}] has access {use[1]!r}: give 'r', 'w' or 'rw'")
        buffers.append(use[0])
        modes.append(use[1])
    array = (Use * max(len(buffers), 1))()
    for i, (buffer, mode) in enumerate(zip(buffers, modes)):
        array[i].buffer = buffer._h
        array[i].access = _ACCESS[mode]
    return array, len(buffers), tuple(buffers), tuple(modes)


def scalar_bytes(value: Any, where: str) -> tuple[bytes, int]:
    """The bytes of one scalar argument and their C alignment: a numpy scalar, a ctypes
    object, (value, dtype), or bytes as they are."""
    if isinstance(value, Buffer):
        raise ArgumentTypeError(f"{where} is a Buffer: buffers go in uses=, in the order the kernel takes them")
    if type(value) in _PLAIN_NUMBERS:  # numpy's float64 is a float too, with a dtype
        raise ArgumentTypeError(f"{where} is {value!r}, which has no dtype: give a numpy scalar (numpy.int32({value!r})) "
                        f"or a pair ({value!r}, 'int32')")
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[0], _PLAIN_NUMBERS):
            raise ArgumentTypeError(f"{where} is {value!r}: a pair is (number, dtype), such as (5, 'int32')")
        number, dtype = value
        name = _dtypes.NAMES[_dtypes.code_of(dtype)]
        fmt = _dtypes.STRUCT_FORMATS.get(name)
        if fmt is None:
            raise InvalidArgumentError(f"{where}: a number cannot be written as {name}: give its bytes")
        try:
            data = struct.pack("<" + fmt, number)
        except (struct.error, OverflowError) as wrong:
            raise InvalidArgumentError(f"{where}: {number!r} is not a {name}: {wrong}") from None
        return data, len(data)
    if isinstance(value, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)):
        return bytes(memoryview(value).cast("B")), ctypes.alignment(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), 1
    tobytes, dtype = getattr(value, "tobytes", None), getattr(value, "dtype", None)
    if callable(tobytes) and dtype is not None and getattr(value, "ndim", 0) == 0:  # a numpy scalar
        if getattr(dtype, "byteorder", "=") == ">":
            raise InvalidArgumentError(f"{where} is big-endian ({dtype}): give it in little-endian order")
        data = tobytes()
        return data, min(max(int(getattr(dtype, "alignment", len(data))), 1), 16)
    raise ArgumentTypeError(f"{where} is a {type(value).__name__}: give a numpy scalar, a ctypes scalar or structure, "
                    "a pair (number, dtype), or bytes")


def packed_scalars(args: Any, where: str) -> bytes:
    """A CPU kernel's scalars: `args` laid out as the fields of a C structure, in order."""
    blob = bytearray()
    for i, value in enumerate(_sequence(args, where, "args")):
        data, alignment = scalar_bytes(value, f"{where}: args[{i}]")
        blob += bytes(-len(blob) % alignment)
        blob += data
    return bytes(blob)


def launch_args(args: Any, where: str) -> tuple[Any, int, bytes]:
    """A device kernel's scalar arguments: the devbuf_arg_t array, its length, and the one
    bytes object their data points into (to keep alive over the call)."""
    pieces = [scalar_bytes(value, f"{where}: args[{i}]")[0] for i, value in enumerate(_sequence(args, where, "args"))]
    blob = b"".join(pieces)
    base = ctypes.cast(ctypes.c_char_p(blob), ctypes.c_void_p).value or 0
    array = (Arg * max(len(pieces), 1))()
    offset = 0
    for i, piece in enumerate(pieces):
        array[i].data = base + offset
        array[i].size = len(piece)
        offset += len(piece)
    return array, len(pieces), blob


def launch_grid(grid: Any, local: Any, where: str) -> Any:
    """The devbuf_launch_t of a global size (an int, or 1 to 3 ints) and a local size (None:
    the driver's choice)."""
    dims = _dims(grid, f"{where}: grid")
    sizes = _dims(local, f"{where}: local") if local is not None else (0,) * len(dims)
    if len(sizes) != len(dims):
        raise InvalidArgumentError(f"{where}: local {tuple(sizes)} has {len(sizes)} dimensions, the grid "
                                   f"{tuple(dims)} {len(dims)}")
    return Launch(len(dims), _three(dims), _three(sizes))


def _three(sizes: tuple[int, ...]) -> Any:
    """A size_t[3] of 1 to 3 sizes, 0 after them."""
    return (ctypes.c_size_t * 3)(*sizes, *(0,) * (3 - len(sizes)))


def _dims(value: Any, what: str) -> tuple[int, ...]:
    values = (value,) if isinstance(value, int) else value
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not 1 <= len(values) <= 3:
        raise ArgumentTypeError(f"{what} is {value!r}: give an int or 1 to 3 ints")
    for size in values:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ArgumentTypeError(f"{what} is {value!r}: sizes are ints >= 0")
        if size >= 2**64:  # a size_t would keep its low bits only
            raise InvalidArgumentError(f"{what} is {value!r}: sizes are below 2**64")
    return tuple(values)


def _sequence(values: Any, where: str, name: str) -> Sequence[Any]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ArgumentTypeError(f"{where}: {name} is a list, not {type(values).__name__}")
    return values
