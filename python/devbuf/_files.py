"""Weight files: devbuf.load (a lazy, read-only mapping of name -> Buffer) and devbuf.save."""
from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Mapping
from typing import Any, Iterator, cast

from ._buffer import Buffer
from ._device import Device, as_device
from ._errors import DevbufError, InvalidArgumentError, NotFoundError, c_text, check, wrong_type
from ._native import (LOAD_COPY, LOAD_ONE_ALLOCATION, SELECT_TENSOR, LoadOptions, MetadataEntry, NamedBuffer, Owned,
                      P, TensorInfo, lib)


class TensorFile(Owned, Mapping[str, Buffer]):
    """The tensors of a safetensors file by name, in file order. On the CPU each tensor is
    a zero-copy, read-only view of one mapping of the file (pages are read when first
    touched); elsewhere each is a copy in device memory. Buffers handed out outlive the
    TensorFile and the file."""

    def __init__(self, handle: int | None, path: str):
        self._handle: int | None = handle
        self.path = path
        self._names: list[str] | None = None
        self._metadata: dict[str, str] | None = None

    _release = lib.devbuf_tensor_file_release  # close(): buffers handed out stay valid

    @property
    def _h(self) -> int:
        if not self._handle:
            raise InvalidArgumentError(f"the tensor file {self.path} was closed")
        return self._handle

    def __getitem__(self, name: str) -> Buffer:
        index = ctypes.c_size_t()
        status = lib.devbuf_tensor_file_find(self._h, c_text(str(name), "a tensor name"), ctypes.byref(index))
        if status != 0:
            try:
                check(status)
            except NotFoundError as missing:
                raise KeyError(name) from missing
        handle = lib.devbuf_tensor_file_buffer(self._h, index.value)
        if not handle:  # left out by load(names=...)
            raise KeyError(name)
        return Buffer._borrow(handle)

    def _all_names(self) -> list[str]:
        if self._names is None:
            names = []
            info = TensorInfo()
            for i in range(lib.devbuf_tensor_file_count(self._h)):
                check(lib.devbuf_tensor_file_info(self._h, i, ctypes.byref(info)))
                if lib.devbuf_tensor_file_buffer(self._h, i):
                    names.append(info.name.decode())
            self._names = names
        return self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._all_names())

    def __len__(self) -> int:
        return len(self._all_names())

    def __contains__(self, name: object) -> bool:
        index = ctypes.c_size_t()
        # A name with a NUL byte names no tensor (C would read only what comes before it).
        return (isinstance(name, str) and "\0" not in name
                and lib.devbuf_tensor_file_find(self._h, name.encode(), ctypes.byref(index)) == 0
                and bool(lib.devbuf_tensor_file_buffer(self._h, index.value)))

    @property
    def metadata(self) -> dict[str, str]:
        """The header's "__metadata__" entries."""
        if self._metadata is None:
            key, value = ctypes.c_char_p(), ctypes.c_char_p()
            entries = {}
            for i in range(lib.devbuf_tensor_file_metadata_count(self._h)):
                check(lib.devbuf_tensor_file_metadata(self._h, i, ctypes.byref(key), ctypes.byref(value)))
                entries[(key.value or b"").decode()] = (value.value or b"").decode()
            self._metadata = entries
        return dict(self._metadata)

    def __repr__(self) -> str:
        return f"<devbuf.TensorFile {self.path}: {len(self)} tensors>" if self._handle else "<devbuf.TensorFile (closed)>"


def load(path: str | os.PathLike[str], device: Device | str = "cpu", *, copy: bool = False,
         names: Iterable[str] | None = None, one_allocation: bool = False) -> TensorFile:
    """Opens a safetensors file on `device`, checked against every rule of the reference
    reader (devbuf.FormatError names what is wrong). copy=True gives writable copies even
    on the CPU. names: only these tensors are loaded (the others are not read, and the
    TensorFile holds only these). one_allocation=True puts the copies in one allocation of
    the device's memory, each tensor aligned."""
    where = _path(path)
    target = as_device(device)
    flags = (LOAD_COPY if copy else 0) | (LOAD_ONE_ALLOCATION if one_allocation else 0)
    options = LoadOptions(flags=flags)
    if names is not None:
        if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
            raise wrong_type("names", names, "an iterable of tensor names (str), such as [\"embed.weight\"]")
        listed = list(names)
        for name in listed:
            if not isinstance(name, str):
                raise wrong_type("a tensor name in names", name, "a str")
        wanted = {name.encode() for name in listed}
        options.select = SELECT_TENSOR(lambda context, index, info: int(info.contents.name in wanted))
    out = P()
    check(lib.devbuf_safetensors_load(target._handle, c_text(os.fsencode(where), "the path"), ctypes.byref(options),
                                      ctypes.byref(out)))
    return TensorFile(out.value, os.fsdecode(where))


def save(path: str | os.PathLike[str], tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> None:
    """Writes `tensors` (Buffers, numpy arrays, torch tensors, anything with __dlpack__ or
    the buffer protocol) and optional string metadata to `path` atomically: readers see the
    old file or the whole new one."""
    from ._dlpack import from_dlpack

    where = _path(path)
    if not isinstance(tensors, Mapping):
        raise wrong_type("tensors", tensors, "a mapping of names (str) to Buffers or arrays, such as a dict")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise wrong_type("metadata", metadata, "a mapping of str to str, or None")
    buffers = []
    try:
        for name, value in tensors.items():
            if not isinstance(name, str):
                raise wrong_type("a tensor name in tensors", name, "a str")
            buffers.append((name, _as_buffer(name, value, from_dlpack)))
        named = (NamedBuffer * max(len(buffers), 1))(*[NamedBuffer(c_text(n, "a tensor name"), b._h) for n, b in buffers])
        entries = list((metadata or {}).items())
        for key, value in entries:
            if not isinstance(key, str) or not isinstance(value, str):
                raise wrong_type(f"metadata entry {key!r}", value if isinstance(key, str) else key,
                                 "str keys and str values")
        meta = (MetadataEntry * max(len(entries), 1))(*[MetadataEntry(c_text(k, "a metadata key"), c_text(v, "a metadata value")) for k, v in entries])
        check(lib.devbuf_safetensors_write(c_text(os.fsencode(where), "the path"), named, len(buffers), meta, len(entries)))
    finally:
        for _, buffer in buffers:
            buffer.close()


def _as_buffer(name: str, value: Any, from_dlpack: Any) -> Buffer:
    if isinstance(value, Buffer):
        return value._alias()
    if hasattr(value, "__dlpack__"):
        try:
            return cast(Buffer, from_dlpack(value))  # zero-copy where it can be
        except (DevbufError, BufferError, TypeError):
            pass
    try:
        memoryview(value)
    except TypeError:
        raise wrong_type(f"tensor {name!r}", value, "a devbuf.Buffer, an array with __dlpack__ (numpy, torch) "
                         "or a bytes-like object") from None
    return Device("cpu").asbuffer(value)  # a copy (strided arrays in C order)


def _path(path: Any) -> str | bytes:
    """A file path (str, bytes or os.PathLike), or ArgumentTypeError naming it."""
    try:
        where: str | bytes = os.fspath(path)
    except TypeError:
        raise wrong_type("path", path, "a file path (str, bytes or os.PathLike)") from None
    return where
