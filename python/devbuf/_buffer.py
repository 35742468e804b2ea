"""Buffer: a handle to a devbuf buffer or view, with host access and DLPack both ways."""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Iterator, cast

from . import _dtypes, _ext
from ._errors import DevbufError, HostAccessOpenError, InvalidArgumentError, check, count
from ._native import DLPACK_READ_ONLY, Owned, P, lib

if TYPE_CHECKING:
    from ._device import Device

# DLPack device types (dlpack.h) of devbuf's device kinds.
_DL_CPU, _DL_CUDA, _DL_OPENCL = 1, 2, 4
_KIND_TO_DL = {1: _DL_CPU, 2: _DL_OPENCL, 3: _DL_CUDA}


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
        if not self._handle:
            return "<devbuf.Buffer (closed)>"
        text = ctypes.create_string_buffer(256)
        lib.devbuf_buffer_describe(self._handle, text, len(text))
        return f"<devbuf.Buffer {text.value.decode(errors='replace')}>"

    # ---- views -------------------------------------------------------------------------
    def view(self, offset: int, size: int) -> Buffer:
        """`size` bytes at byte `offset`, same dtype (both whole elements)."""
        out = P()
        check(lib.devbuf_buffer_view(self._h, count(offset, "offset"), count(size, "size"), ctypes.byref(out)))
        return Buffer._own(out.value, self._export_read_only)

    def __getitem__(self, key: slice) -> Buffer:
        """A view by a slice of bytes: buf[16:64] is the bytes 16 to 63 (whole elements)."""
        if not isinstance(key, slice):
            raise TypeError("index a Buffer with a slice of bytes, such as buf[0:16]")
        start, stop, step = key.indices(self.nbytes)
        if step != 1:
            raise InvalidArgumentError(f"a view is contiguous: step {step} is not 1")
        return self.view(start, max(stop - start, 0))

    def reshape(self, shape: tuple[int, ...] | list[int], dtype: Any = None) -> Buffer:
        """The same bytes seen with another shape (and dtype); the byte size must match."""
        code = _dtypes.code_of(dtype) if dtype is not None else lib.devbuf_buffer_dtype(self._h)
        dims = (ctypes.c_size_t * max(len(shape), 1))(*[count(d, "dimension") for d in shape])
        out = P()
        check(lib.devbuf_buffer_reshape(self._h, code, dims, len(shape), ctypes.byref(out)))
        return Buffer._own(out.value, self._export_read_only)

    # ---- copies ------------------------------------------------------------------------
    def copy_from(self, source: Any) -> None:
        """Copies a Buffer (any device) or a bytes-like object of the same byte size into
        this buffer, waiting for work on the bytes first."""
        if isinstance(source, Buffer):
            check(lib.devbuf_buffer_copy_from(self._h, source._h))
            return
        with _host_bytes(source) as (address, size):
            check(lib.devbuf_buffer_copyin(self._h, address, size))

    def to_bytes(self) -> bytes:
        """The bytes of the buffer (waiting for work that writes them)."""
        size = self.nbytes
        data = _new_bytes(size)
        check(lib.devbuf_buffer_copyout(self._h, _bytes_address(data), size))
        return data

    def copy(self, device: Device | str | None = None) -> Buffer:
        """A new buffer (on `device`, default this one's) holding a copy of these bytes."""
        from ._device import Device

        target = self.device if device is None else device if isinstance(device, Device) else Device(device)
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
        kind = lib.devbuf_device_kind_of(device)
        return (_KIND_TO_DL[kind], _spec_index(lib.devbuf_device_spec(device).decode()))

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
        view = self.view(0, self.nbytes)
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
    """A new bytes object of `size` bytes for the library to fill (nothing else sees it yet)."""
    return cast(bytes, _PyBytes_FromStringAndSize(None, size))


def _bytes_address(data: bytes) -> int:
    return cast(int, _PyBytes_AsString(data))


class _host_bytes:
    """The address and size of a bytes-like object's bytes (C-contiguous ones in place;
    others copied into C order first) for the duration of a `with` block."""

    def __init__(self, source: Any):
        self._source = source
        self._keep: Any = None

    def __enter__(self) -> tuple[int | None, int]:
        source = self._source
        if isinstance(source, bytes):
            self._keep = source
            return (_bytes_address(source) if source else None), len(source)
        view = memoryview(source)
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


def iter_dims(shape: Any) -> Iterator[int]:
    for dim in ((shape,) if isinstance(shape, int) else shape):
        yield count(dim, f"shape {shape!r}: dimension")
