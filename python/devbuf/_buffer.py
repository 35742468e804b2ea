"""Buffer: a handle to a devbuf buffer or view, with host access and DLPack both ways."""
from __future__ import annotations

import collections.abc
import ctypes
import math
import operator
import warnings
from typing import TYPE_CHECKING, Any, Iterator, cast

from . import _dtypes, _ext
from ._errors import (DevbufError, HostAccessOpenError, InvalidArgumentError, OutOfMemoryError, OutOfRangeError,
                      check, count, short_repr, wrong_type)
from ._native import DLPACK_READ_ONLY, Owned, P, lib

if TYPE_CHECKING:
    from ._device import Device

# DLPack device types (dlpack.h) that the package treats apart.
_DL_CPU, _DL_CUDA = 1, 2


def _spec_index(spec: str) -> int:
    return int(spec.partition(":")[2] or 0)


class Buffer(Owned):
    """A reference to a devbuf buffer (or a view of one): memory of one dtype and shape on
    one device. Buffers come from Device.empty/zeros/asbuffer, devbuf.load and
    devbuf.from_dlpack. Views share the storage; the memory goes back to the device's cache
    when the last reference is gone (or at close())."""

    __slots__ = ("_handle", "_export_read_only", "__weakref__")
    _handle: int | None
    _export_read_only: bool

    def __init__(self) -> None:
        raise TypeError("Buffers come from Device.empty/zeros/asbuffer, devbuf.load and devbuf.from_dlpack")

    @classmethod
    def _own(cls, handle: int | None, export_read_only: bool = False) -> Buffer:
        """Wraps a handle whose reference this object now holds."""
        buffer = object.__new__(cls)
        buffer._handle = handle
        buffer._export_read_only = export_read_only
        return buffer

    @classmethod
    def _borrow(cls, handle: int | None) -> Buffer:
        return cls._own(lib.devbuf_buffer_retain(handle))

    # ---- lifetime ----------------------------------------------------------------------
    _release = lib.devbuf_buffer_release

    @property
    def _h(self) -> int:
        if not self._handle:
            raise InvalidArgumentError("the buffer was closed")
        return self._handle

    # ---- facts -------------------------------------------------------------------------
    @property
    def dtype(self) -> str:
        return _dtypes.NAMES[int(lib.devbuf_buffer_dtype(self._h))]

    @property
    def shape(self) -> tuple[int, ...]:
        ndim = lib.devbuf_buffer_ndim(self._h)
        dims = lib.devbuf_buffer_shape(self._h)
        return tuple(dims[i] for i in range(ndim))

    @property
    def ndim(self) -> int:
        return int(lib.devbuf_buffer_ndim(self._h))

    @property
    def nbytes(self) -> int:
        return int(lib.devbuf_buffer_size(self._h))

    @property
    def offset(self) -> int:
        """Bytes from the start of the storage to this view."""
        return int(lib.devbuf_buffer_offset(self._h))

    @property
    def device(self) -> Device:
        from ._device import Device

        return Device._borrow(lib.devbuf_buffer_device(self._h))

    @property
    def storage_id(self) -> int:
        """Shared by a buffer and all its views."""
        return int(lib.devbuf_buffer_storage_id(self._h))

    @property
    def handle_id(self) -> int:
        """Unique to this handle."""
        return int(lib.devbuf_buffer_handle_id(self._h))

    @property
    def read_only(self) -> bool:
        return bool(lib.devbuf_buffer_is_read_only(self._h))

    @property
    def is_mapped(self) -> bool:
        return bool(lib.devbuf_buffer_is_mapped(self._h))

    @property
    def cpu_accessible(self) -> bool:
        return bool(lib.devbuf_buffer_is_cpu_accessible(self._h))

    @property
    def in_use(self) -> bool:
        """Whether submitted work still uses the bytes."""
        return bool(lib.devbuf_buffer_in_use(self._h))

    @property
    def allocated(self) -> bool:
        return bool(lib.devbuf_buffer_is_allocated(self._h))

    @property
    def device_ptr(self) -> int:
        """The device address of the first byte (on the CPU, the host address), for
        kernels; allocates first. devbuf.UnsupportedError on OpenCL (no addresses)."""
        check(lib.devbuf_buffer_ensure_allocated(self._h))
        address = ctypes.c_uint64()
        check(lib.devbuf_buffer_device_ptr(self._h, ctypes.byref(address)))
        return address.value

    @property
    def open_accesses(self) -> int:
        return int(lib.devbuf_buffer_open_accesses(self._h))

    def __repr__(self) -> str:
        """<devbuf.Buffer float32[4, 6] on cpu id=... handle=... offset=0 size=96 lazy>: the
        dtype, shape and device first, then the library's other facts (its description)."""
        if not self._handle:
            return "<devbuf.Buffer (closed)>"
        text = ctypes.create_string_buffer(lib.devbuf_buffer_describe(self._handle, None, 0) + 1)
        lib.devbuf_buffer_describe(self._handle, text, len(text))
        described = text.value.decode(errors="replace")
        # The description reads "Buffer(id=... device=cpu dtype=float32 shape=[4,6] ...)":
        # what the head already says is left out of the tail.
        inner = described.removeprefix("Buffer(").removesuffix(")")
        extras = " ".join(word for word in inner.split() if not word.startswith(("device=", "dtype=", "shape=")))
        spec = lib.devbuf_device_spec(lib.devbuf_buffer_device(self._handle)).decode()
        return f"<devbuf.Buffer {self.dtype}[{', '.join(map(str, self.shape))}] on {spec} {extras}>"

    # ---- views -------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Buffer:
        """A view, indexed as numpy indexes an array: buf[i] and buf[a:b] count rows (elements
        of the first axis), so for shape (4, 6) buf[1] has shape (6,) and buf[1:3] (2, 6);
        negative indices count from the end, slices clip, an integer out of range raises
        IndexError (devbuf.OutOfRangeError). Tuples of leading integers then one slice
        (buf[1, 2:4], buf[..., :]) work too. A view is contiguous, so a step other than 1,
        or a selection that skips elements (buf[:, 0]), is refused (InvalidArgumentError).
        Byte offsets: byte_view()."""
        start, size, shape = _select(self.shape, key)
        element_bits = _dtypes.bits(lib.devbuf_buffer_dtype(self._h))
        if (start * element_bits) % 8 or (size * element_bits) % 8:
            raise InvalidArgumentError(f"buf[{_key_text(key)}] starts or ends inside a byte of {self.dtype} "
                                       f"elements ({element_bits} bits each): views take whole bytes")
        with self.byte_view(start * element_bits // 8, size * element_bits // 8) as flat:
            return flat.reshape(shape)

    def __iter__(self) -> Iterator[Buffer]:
        """The views of the rows (buf[0], buf[1], ...), as iterating a numpy array gives."""
        shape = self.shape
        if not shape:
            raise TypeError("iteration over a 0-d buffer: it has no rows")
        return (self[i] for i in range(shape[0]))

    def byte_view(self, offset: int, nbytes: int) -> Buffer:
        """A 1-d view of `nbytes` bytes at byte `offset` of this view (both whole elements),
        same dtype, sharing the storage: the view by bytes, where indexing counts elements."""
        out = P()
        check(lib.devbuf_buffer_view(self._h, count(offset, "offset"), count(nbytes, "nbytes"), ctypes.byref(out)))
        return Buffer._own(out.value, self._export_read_only)

    def _alias(self) -> Buffer:
        """Another handle to the same bytes, dtype and shape (its own reference)."""
        with self.byte_view(0, self.nbytes) as flat:
            return flat.reshape(self.shape)

    def view(self, offset: int, size: int) -> Buffer:
        """Deprecated: byte_view(offset, size), its old name. Where numpy's arr.view(dtype)
        reinterprets the dtype, this takes bytes, so the byte method has a name that says so."""
        warnings.warn("Buffer.view(offset, size) is Buffer.byte_view(offset, nbytes) now; index buf[a:b] "
                      "counts rows, as numpy does", DeprecationWarning, stacklevel=2)
        return self.byte_view(offset, size)

    def reshape(self, shape: Any, dtype: Any = None) -> Buffer:
        """The same bytes seen with another shape (an integer or a sequence of them) and
        dtype (any spelling numpy takes; default this one's); the byte size must match."""
        code = _dtypes.code_of(dtype) if dtype is not None else lib.devbuf_buffer_dtype(self._h)
        dims_list = shape_dims(shape)
        array = (ctypes.c_size_t * max(len(dims_list), 1))(*dims_list)
        out = P()
        check(lib.devbuf_buffer_reshape(self._h, code, array, len(dims_list), ctypes.byref(out)))
        return Buffer._own(out.value, self._export_read_only)

    # ---- copies ------------------------------------------------------------------------
    def copy_from(self, source: Any) -> None:
        """Copies a Buffer (any device) or a bytes-like object of the same byte size into
        this buffer, waiting for work on the bytes first."""
        if isinstance(source, Buffer):
            check(lib.devbuf_buffer_copy_from(self._h, source._h))
            return
        accepted = "a devbuf.Buffer or a bytes-like object (bytes, a numpy array)"
        with _host_bytes(source, "source", accepted) as (address, size):
            check(lib.devbuf_buffer_copyin(self._h, address, size))

    def to_bytes(self) -> bytes:
        """The bytes of the buffer (waiting for work that writes them)."""
        size = self.nbytes
        try:
            data = _new_bytes(size)
        except (MemoryError, OverflowError):
            raise OutOfMemoryError(f"to_bytes: Python could not make a bytes object of {size} bytes "
                                   f"(the {self.dtype}{list(self.shape)} buffer's)") from None
        check(lib.devbuf_buffer_copyout(self._h, _bytes_address(data), size))
        return data

    def copy(self, device: Device | str | None = None) -> Buffer:
        """A new buffer (on `device`, default this one's) holding a copy of these bytes."""
        from ._device import as_device

        target = self.device if device is None else as_device(device)
        out = target.empty(self.shape, self.dtype)
        out.copy_from(self)
        return out

    def wait(self) -> None:
        """Waits for the submitted work that uses these bytes."""
        check(lib.devbuf_buffer_wait(self._h))

    # ---- host access -------------------------------------------------------------------
    def read(self, *, wait: bool = True) -> HostAccess:
        """A read access as a context manager: `with buf.read() as view:` gives a read-only
        memoryview (typed where Python has a format for the dtype) that is valid inside the
        block. wait=False answers devbuf.InUseError instead of waiting for work that writes
        the bytes."""
        return HostAccess(self, write=False, wait=wait)

    def write(self, *, wait: bool = True) -> HostAccess:
        """A write access as a context manager, like read() with a writable memoryview."""
        return HostAccess(self, write=True, wait=wait)

    # ---- DLPack ------------------------------------------------------------------------
    def __dlpack_device__(self) -> tuple[int, int]:
        device = lib.devbuf_buffer_device(self._h)
        return (int(lib.devbuf_device_dlpack_type(device)), _spec_index(lib.devbuf_device_spec(device).decode()))

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """Exports the buffer as a DLPack capsule (DLPack 1.1 when the consumer asks for
        max_version >= (1, 0), the legacy capsule otherwise). The consumer's array holds a
        host access (a read access for read-only exports) until it lets the tensor go, so
        queued work cannot race with it."""
        on_cuda = self.__dlpack_device__()[0] == _DL_CUDA
        if stream is not None and stream != -1 and not on_cuda:
            raise BufferError(f"stream {stream!r}: only CUDA buffers take a stream (None here)")
        source = self
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            if tuple(dl_device) != (_DL_CPU, 0) or copy is False:
                raise BufferError(f"cannot export to DLPack device {tuple(dl_device)} without a copy to the CPU")
            source = self.copy("cpu")
        elif copy:
            source = self.copy()
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        read_only = self._export_read_only or source.read_only
        if not versioned and read_only:
            raise BufferError("the buffer is read-only and a legacy (pre-1.0) DLPack capsule cannot say so: "
                              "ask with max_version=(1, 0) or later")
        out = P()
        export = lib.devbuf_buffer_to_dlpack_versioned if versioned else lib.devbuf_buffer_to_dlpack
        try:
            if stream != -1 and on_cuda:
                # devbuf's streams are its own: the consumer's stream sees complete bytes
                # once devbuf's work on them is done.
                check(lib.devbuf_buffer_wait(source._h))
            check(export(source._h, DLPACK_READ_ONLY if read_only else 0, ctypes.byref(out)))
        except DevbufError as refused:
            raise BufferError(str(refused)) from refused
        return _ext.wrap(out.value or 0, versioned)

    def read_only_export(self) -> Buffer:
        """A view of the same bytes whose DLPack exports are read-only: numpy.from_dlpack of
        it gives a read-only array that holds a read access (other readers may go on)."""
        view = self._alias()
        view._export_read_only = True
        return view


def _address_of(function: Any) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value or 0


_END_ACCESS, _RELEASE = _address_of(lib.devbuf_buffer_end_access), _address_of(lib.devbuf_buffer_release)
_RETAIN = _address_of(lib.devbuf_buffer_retain)


class HostAccess(_ext.Access):
    """An open host access while its `with` block runs (see Buffer.read/write). The access
    ends when the block does, however it is left (an exception, a KeyboardInterrupt at any
    moment): opening it and ending it run in C, where no Python code can be interrupted. If
    a memoryview or array made from the view is still alive, leaving the block raises
    devbuf.HostAccessOpenError and the access ends by itself when the last of them goes
    (ending it earlier would let queued work race with them). The access holds its own
    reference to the buffer meanwhile."""

    def __init__(self, buffer: Buffer, *, write: bool, wait: bool):
        if write:
            opener = lib.devbuf_buffer_contents_mut_wait if wait else lib.devbuf_buffer_contents_mut
        else:
            opener = lib.devbuf_buffer_contents_wait if wait else lib.devbuf_buffer_contents
        fmt = _dtypes.FORMATS.get(buffer.dtype)
        super().__init__(_address_of(opener), _END_ACCESS, _RELEASE, _RETAIN, buffer._h, not write,
                         buffer, fmt, tuple(buffer.shape), check, HostAccessOpenError)


# ---- bytes-like objects ----------------------------------------------------------------------
_PyBytes_FromStringAndSize = ctypes.pythonapi.PyBytes_FromStringAndSize
_PyBytes_FromStringAndSize.restype = ctypes.py_object
_PyBytes_FromStringAndSize.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_PyBytes_AsString = ctypes.pythonapi.PyBytes_AsString
_PyBytes_AsString.restype = ctypes.c_void_p
_PyBytes_AsString.argtypes = [ctypes.py_object]


def _new_bytes(size: int) -> bytes:
    """A new bytes object of `size` bytes for the library to fill (nothing else sees it yet);
    MemoryError (no memory) or OverflowError (beyond Python's largest bytes) where it cannot."""
    return cast(bytes, _PyBytes_FromStringAndSize(None, size))


def _bytes_address(data: bytes) -> int:
    return cast(int, _PyBytes_AsString(data))


class _host_bytes:
    """The address and size of a bytes-like object's bytes (C-contiguous ones in place;
    others copied into C order first) for the duration of a `with` block. Anything else
    raises ArgumentTypeError naming the argument (`what`) and what it takes (`accepted`)."""

    def __init__(self, source: Any, what: str, accepted: str):
        self._source = source
        self._what = what
        self._accepted = accepted
        self._keep: Any = None

    def __enter__(self) -> tuple[int | None, int]:
        source = self._source
        if isinstance(source, bytes):
            self._keep = source
            return (_bytes_address(source) if source else None), len(source)
        try:
            view = memoryview(source)
        except TypeError:
            raise wrong_type(self._what, source, self._accepted) from None
        if not view.c_contiguous:
            data = view.tobytes()
            self._keep = data
            return (_bytes_address(data) if data else None), len(data)
        if view.readonly:
            interface = getattr(source, "__array_interface__", None)
            if interface is not None:  # numpy and its kin: the address without a copy
                self._keep = source
                return interface["data"][0], view.nbytes
            data = view.tobytes()
            self._keep = data
            return (_bytes_address(data) if data else None), len(data)
        flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        holder = (ctypes.c_char * flat.nbytes).from_buffer(flat) if flat.nbytes else None
        self._keep = (view, flat, holder)
        return (ctypes.addressof(holder) if holder is not None else None), flat.nbytes

    def __exit__(self, *exc: object) -> None:
        self._keep = None


def shape_dims(shape: Any, what: str = "shape") -> list[int]:
    """A shape's dimensions: an integer (one dimension) or a sequence of integers."""
    if type(shape) in (tuple, list) and all(type(dim) is int and 0 <= dim < 2**64 for dim in shape):
        return list(shape)  # the usual case, without building the messages below
    if getattr(shape, "ndim", 0):  # a numpy array of dimensions (it has __index__ too)
        shape = list(shape)
    elif hasattr(shape, "__index__"):
        return [_dimension(shape, what)]
    if isinstance(shape, (str, bytes, collections.abc.Mapping, collections.abc.Set)) or not hasattr(
            shape, "__iter__"):
        raise wrong_type(what, shape, "an integer or a sequence of integers, such as (4, 6)")
    return [_dimension(dim, f"{what} {short_repr(shape)}: dimension") for dim in shape]


def _dimension(value: Any, what: str) -> int:
    """One dimension of a shape: an integer, as numpy takes it (not a bool, nor a float that
    happens to be whole, which numpy refuses in shapes too)."""
    if isinstance(value, bool) or _is_bool_array(value) or not hasattr(value, "__index__"):
        raise wrong_type(what, value, "an integer")
    return count(value, what)


def _is_bool_array(value: Any) -> bool:
    return str(getattr(getattr(value, "dtype", None), "kind", "")) == "b"


# ---- indexing --------------------------------------------------------------------------------
_NOT_CONTIGUOUS = "views are contiguous bytes (numpy can copy other selections: np.from_dlpack(buf)[...])"


def _select(shape: tuple[int, ...], key: Any) -> tuple[int, int, tuple[int, ...]]:
    """The first element, the element count and the shape of a numpy index into a
    C-contiguous array of `shape`, where what it selects is contiguous."""
    items = key if isinstance(key, tuple) else (key,)
    text = _key_text(key)
    for item in items:
        if item is None or item is Ellipsis or isinstance(item, slice):
            continue
        if isinstance(item, bool) or _is_bool_array(item):
            raise InvalidArgumentError(f"buf[{text}]: a boolean index is a mask; {_NOT_CONTIGUOUS}")
        # numpy arrays have __index__ whatever their shape; as indices, those with axes gather.
        if getattr(item, "ndim", 0) or not hasattr(item, "__index__"):
            if not isinstance(item, (str, bytes)) and (hasattr(item, "__len__") or hasattr(item, "__array__")):
                raise InvalidArgumentError(f"buf[{text}]: an index array gathers elements; {_NOT_CONTIGUOUS}")
            raise wrong_type("index", item, "integers, slices with step 1, ... or None, or a tuple of them")
    if sum(item is Ellipsis for item in items) > 1:
        raise InvalidArgumentError(f"buf[{text}]: an index takes one ellipsis ('...') at most")
    indexed = sum(item is not None and item is not Ellipsis for item in items)
    if indexed > len(shape):
        what = "a 0-d buffer has no axis to index" if not shape else \
            f"too many indices for a {len(shape)}-d buffer (shape {shape})"
        raise OutOfRangeError(f"buf[{text}]: {what}")
    rest = (slice(None),) * (len(shape) - indexed)
    if any(item is Ellipsis for item in items):
        at = next(i for i, item in enumerate(items) if item is Ellipsis)
        items = items[:at] + rest + items[at + 1:]
    else:
        items = items + rest
    # Every index is checked first, as numpy checks them, and only then whether what they
    # select is contiguous.
    taken: list[tuple[int, int, Any]] = []  # per axis: its first element, how many, the index
    out: list[int] = []
    for item in items:
        if item is None:
            out.append(1)
            continue
        size = shape[len(taken)]
        if isinstance(item, slice):
            try:
                first, stop, step = item.indices(size)
            except TypeError:
                raise wrong_type("slice bound", item, "integers or None") from None
            except ValueError:  # a step of 0
                first, stop, step = 0, 0, 0
            if step != 1:
                raise InvalidArgumentError(f"buf[{text}]: the slice {_item_text(item)} is not contiguous (step "
                                           f"{step}); {_NOT_CONTIGUOUS}")
            taken.append((first, max(stop - first, 0), item))
            out.append(taken[-1][1])
        else:
            try:
                index = operator.index(item)
            except TypeError:  # a numpy 0-d array of floats, say
                raise wrong_type("index", item, "integers, slices with step 1, ... or None, or a tuple of "
                                 "them") from None
            if not -size <= index < size:
                raise OutOfRangeError(f"buf[{text}]: index {index} is out of range for axis {len(taken)} of "
                                      f"size {size}")
            taken.append((index % size, 1, item))
    elements = math.prod(out)
    if not elements:  # nothing is selected, which any place holds: the start of the buffer
        return 0, 0, tuple(out)
    start, runs = 0, 1  # runs: how many separate rows the axes so far select
    for axis, (first, length, item) in enumerate(taken):
        if runs > 1 and length != shape[axis]:
            part = "part" if isinstance(item, slice) else "one element"
            raise InvalidArgumentError(f"buf[{text}] is not contiguous: it takes {part} of axis {axis} in each "
                                       f"of {runs} rows; {_NOT_CONTIGUOUS}")
        start += first * math.prod(shape[axis + 1:])
        runs *= length
    return start, elements, tuple(out)


def _item_text(item: Any) -> str:
    if item is Ellipsis:
        return "..."
    if isinstance(item, slice):
        bounds = ":".join("" if bound is None else str(bound) for bound in (item.start, item.stop))
        return bounds if item.step is None else f"{bounds}:{item.step}"
    return short_repr(item)


def _key_text(key: Any) -> str:
    """An index as it was written between the brackets, for messages."""
    return ", ".join(map(_item_text, key)) if isinstance(key, tuple) else _item_text(key)
