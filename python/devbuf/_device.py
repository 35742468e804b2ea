"""Devices: where buffers live, their caching allocator's figures, limits and tracing."""
from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any, Iterator, cast

from . import _dtypes
from ._buffer import Buffer, _host_bytes, shape_dims
from ._errors import DevbufError, InvalidArgumentError, c_text, check, count, wrong_type
from ._native import BUFFER_ZERO, AllocatorStats, CachingOptions, DeviceInfo, Owned, P, Snapshot, lib

_CAPABILITIES = ((1, "queues"), (2, "c-kernels"), (4, "programs"), (8, "sharing"), (16, "growable-segments"))
_BLOCK_STATES = {0: "free", 1: "active", 2: "in_flight", 3: "thread_cached", 4: "unmapped"}

# Allocators that new buffers of a device come from while a trace is recorded (by spec: every
# Device object of one device shares them).
_tracing: dict[str, list[int]] = {}
_tracing_lock = threading.Lock()


class Device(Owned):
    """A device by spec: "cpu", "opencl:N" or "cuda:N". Opening a device that is missing
    raises devbuf.UnavailableError with the reason."""

    __slots__ = ("_handle", "__weakref__")
    _handle: int | None

    @property
    def _h(self) -> int:
        if not self._handle:
            raise InvalidArgumentError("the device was closed")
        return self._handle

    def __init__(self, spec: str | Device = "cpu"):
        if isinstance(spec, Device):
            spec = spec.spec
        if not isinstance(spec, str):
            raise wrong_type("spec", spec, 'a device spec ("cpu", "opencl:0", "cuda:0") or a devbuf.Device')
        out = P()
        check(lib.devbuf_device_open(c_text(spec, "a device spec"), ctypes.byref(out)))
        self._handle = out.value

    @classmethod
    def _borrow(cls, handle: int) -> Device:
        device = object.__new__(cls)
        device._handle = lib.devbuf_device_retain(handle)
        return device

    _release = lib.devbuf_device_release

    # ---- facts -------------------------------------------------------------------------
    @property
    def spec(self) -> str:
        return str(lib.devbuf_device_spec(self._h).decode())

    @property
    def kind(self) -> str:
        return str(lib.devbuf_device_kind_name(lib.devbuf_device_kind_of(self._h)).decode())

    @property
    def name(self) -> str:
        return str(lib.devbuf_device_name(self._h).decode(errors="replace"))

    @property
    def page_size(self) -> int:
        return int(lib.devbuf_device_page_size(self._h))

    @property
    def info(self) -> dict[str, Any]:
        """What the driver reports: name, version, global_memory, max_allocation,
        alignment, host_unified, processor: what runs its kernels ("cpu", "gpu" or
        "accelerator"), and capabilities: what its backend does, a set of "queues",
        "c-kernels", "programs", "sharing" and "growable-segments"."""
        info = DeviceInfo()
        check(lib.devbuf_device_info(self._h, ctypes.byref(info)))
        return {"name": (info.name or b"").decode(errors="replace"),
                "version": (info.version or b"").decode(errors="replace"),
                "global_memory": info.global_memory, "max_allocation": info.max_allocation,
                "alignment": info.alignment, "host_unified": bool(info.host_unified),
                "processor": {1: "cpu", 2: "gpu", 3: "accelerator"}.get(info.processor, "unknown"),
                "capabilities": {name for bit, name in _CAPABILITIES if info.capabilities & bit}}

    def __repr__(self) -> str:
        return f"<devbuf.Device {self.spec}: {self.name}>" if self._handle else "<devbuf.Device (closed)>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other._handle == self._handle

    def __hash__(self) -> int:
        return hash(self._handle)

    def synchronize(self) -> None:
        """Waits for all work submitted to the device."""
        check(lib.devbuf_device_synchronize(self._h))

    # ---- buffers -----------------------------------------------------------------------
    def _allocator(self) -> int:
        """The allocator new buffers come from, retained (a trace may end meanwhile)."""
        with _tracing_lock:
            stack = _tracing.get(self.spec)
            return cast(int, lib.devbuf_allocator_retain(stack[-1] if stack else lib.devbuf_device_allocator(self._h)))

    def _new(self, shape: Any, dtype: Any, flags: int) -> Buffer:
        dims_list = shape_dims(shape)
        array = (ctypes.c_size_t * max(len(dims_list), 1))(*dims_list)
        code = _dtypes.code_of(dtype)
        out = P()
        if not _tracing:  # no trace anywhere: the device's own allocator, which the device holds
            check(lib.devbuf_buffer_new(lib.devbuf_device_allocator(self._h), code, array, len(dims_list),
                                        flags, ctypes.byref(out)))
            return Buffer._own(out.value)
        allocator = self._allocator()
        try:
            check(lib.devbuf_buffer_new(allocator, code, array, len(dims_list), flags, ctypes.byref(out)))
        finally:
            lib.devbuf_allocator_release(allocator)
        return Buffer._own(out.value)

    def empty(self, shape: Any, dtype: Any = "float32") -> Buffer:
        """A buffer of `shape` (an integer or a sequence of them) and `dtype` (any spelling
        numpy takes: "float32", np.float32, "<f4", or devbuf's own names such as "bfloat16")
        whose memory is taken on first use."""
        return self._new(shape, dtype, 0)

    def zeros(self, shape: Any, dtype: Any = "float32") -> Buffer:
        """A buffer that reads back zero."""
        return self._new(shape, dtype, BUFFER_ZERO)

    def asbuffer(self, data: Any, dtype: Any = None, shape: Any = None) -> Buffer:
        """A new buffer on this device holding a copy of `data`: a Buffer, anything with
        __dlpack__ on the CPU (numpy, torch), or a bytes-like object (dtype and shape from
        its format, or as given). `dtype` and `shape` as empty() takes them."""
        source = None
        if isinstance(data, Buffer):
            source = data
        elif hasattr(data, "__dlpack__"):
            from ._dlpack import from_dlpack

            try:
                source = from_dlpack(data)
            except (DevbufError, BufferError, TypeError) as refused:  # strided, say: copy in C order
                try:
                    data = memoryview(data)
                except (TypeError, ValueError):
                    if isinstance(refused, DevbufError):
                        raise refused from None
                    raise InvalidArgumentError(f"data cannot be taken: {refused}") from None
        if source is None:
            try:
                view = memoryview(data)
            except TypeError:
                raise wrong_type("data", data, "a devbuf.Buffer, an array with __dlpack__ (numpy, torch) or a "
                                 "bytes-like object") from None
            except ValueError as wrong:  # numpy datetimes, say: no buffer of them
                raise InvalidArgumentError(f"data has no buffer devbuf can read: {wrong}") from None
            known = _FORMAT_TO_DTYPE.get(view.format.lstrip("@=<"))
            if known is None and dtype is None:  # big-endian, say: never bytes by stealth
                raise InvalidArgumentError(
                    f"data of format {view.format!r}, which no devbuf dtype is: give dtype= to take its bytes "
                    f"as that dtype, or convert it (numpy: .astype(native type))")
            name = _dtypes.name_of(dtype) if dtype is not None else known
            if shape is not None:
                dims = shape
            elif dtype is None and known:
                dims = view.shape
            else:  # the bytes as elements of the dtype asked for
                element_bits = _dtypes.bits(_dtypes.code_of(name))
                if (view.nbytes * 8) % element_bits:
                    raise InvalidArgumentError(f"{view.nbytes} bytes are not a whole number of {name} elements")
                dims = ((view.nbytes * 8) // element_bits,)
            out = self.empty(dims, name)
            with _host_bytes(data, "data", "a bytes-like object") as (address, size):
                check(lib.devbuf_buffer_copyin(out._h, address, size))
            return out
        out = self.empty(source.shape if shape is None else shape, source.dtype if dtype is None else dtype)
        out.copy_from(source)
        return out

    def queue(self) -> Any:
        """A new in-order queue of work on this device."""
        from ._queue import Queue

        return Queue(self)

    # ---- memory ------------------------------------------------------------------------
    @property
    def _caching(self) -> int:
        return cast(int, lib.devbuf_device_allocator(self._h))

    def memory_stats(self) -> dict[str, float]:
        """The caching allocator's statistics: active, peak, reserved, cached,
        released_in_flight, segments, largest_free_block, fragmentation, mapped,
        live_buffers, system_allocs, system_frees, cache_hits, alloc_calls, failed_allocs,
        peak_reserved."""
        stats = AllocatorStats()
        check(lib.devbuf_allocator_stats(self._caching, ctypes.byref(stats)))
        return {field[0]: getattr(stats, field[0]) for field in AllocatorStats._fields_}

    def reset_peak(self) -> None:
        lib.devbuf_allocator_reset_peak(self._caching)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every segment the caching allocator holds, with its blocks: a list of
        {"serial", "address", "size", "pool", "blocks": [{"offset", "size", "state"}]}, state
        one of "free", "active", "in_flight", "thread_cached", "unmapped"."""
        out = ctypes.POINTER(Snapshot)()
        check(lib.devbuf_allocator_snapshot(self._caching, ctypes.byref(out)))
        try:
            picture = out.contents
            segments = []
            for i in range(picture.segment_count):
                segment = picture.segments[i]
                blocks = [{"offset": b.offset, "size": b.size, "state": _BLOCK_STATES.get(b.state, str(b.state))}
                          for b in (segment.blocks[j] for j in range(segment.block_count))]
                segments.append({"serial": segment.serial, "address": segment.device, "size": segment.size,
                                 "pool": segment.pool.decode(), "blocks": blocks})
            return segments
        finally:
            lib.devbuf_allocator_snapshot_free(out)

    def set_limits(self, *, memory: int | None = None, cache: int | None = None,
                   max_buffers: int | None = None) -> None:
        """Sets the caching allocator's limits (bytes reserved, bytes cached, live
        buffers); None is no limit. Lowering a limit gives idle segments back at once."""
        options = CachingOptions(memory_limit=_limit(memory, "memory"), cache_limit=_limit(cache, "cache"),
                                 max_buffers=_limit(max_buffers, "max_buffers"))
        check(lib.devbuf_caching_allocator_set_options(self._caching, ctypes.byref(options)))

    def use_growable_segments(self) -> None:
        """Makes the caching allocator's pools growable segments (reserved addresses,
        mapped as blocks reach them), before the device's first allocation; an error once
        it holds memory, or where the device cannot map memory into reserved addresses."""
        options = CachingOptions(growable=1)
        check(lib.devbuf_caching_allocator_configure(self._caching, ctypes.byref(options)))

    def clear_cache(self) -> None:
        """Gives every cached block back to the system. A trace open on this device records
        it ("# E"), and its replay gives the cache back there too."""
        with _tracing_lock:  # retained: a trace may end meanwhile
            tracers = [lib.devbuf_allocator_retain(tracer) for tracer in _tracing.get(self.spec, ())]
        for tracer in tracers:  # each passes the call on to the device's allocator
            lib.devbuf_allocator_clear_cache(tracer)
            lib.devbuf_allocator_release(tracer)
        if not tracers:
            lib.devbuf_allocator_clear_cache(self._caching)

    @contextlib.contextmanager
    def trace(self, path: str) -> Iterator[str]:
        """Records the allocations and frees of the buffers made on this device inside the
        block (by any thread) to `path`, in the format `devbuf trace replay` reads. The
        file is complete once the block has ended and those buffers are gone."""
        out = P()
        check(lib.devbuf_trace_adaptor_create(lib.devbuf_device_allocator(self._h), c_text(str(path), "a trace path"),
                                              ctypes.byref(out)))
        spec, tracer = self.spec, out.value or 0
        with _tracing_lock:
            _tracing.setdefault(spec, []).append(tracer)
        try:
            yield str(path)
        finally:
            with _tracing_lock:
                _tracing[spec].remove(tracer)
                if not _tracing[spec]:
                    del _tracing[spec]  # an empty _tracing lets new buffers skip the lookup
            lib.devbuf_allocator_release(tracer)  # buffers made meanwhile hold it until they go


def _limit(value: int | None, name: str) -> int:
    if value is None:
        return 0
    if count(value, f"{name} limit") == 0:
        raise InvalidArgumentError(f"{name} limit 0: give a positive number, or None for no limit")
    return int(value)


_FORMAT_TO_DTYPE = {fmt: name for name, fmt in _dtypes.FORMATS.items()}
# Half floats are struct's format "e" on every Python (memoryview.cast takes them only from
# 3.12 on, which FORMATS follows); numpy gives complex64 as "Zf".
_FORMAT_TO_DTYPE.update({"l": "int64", "L": "uint64", "c": "uint8", "e": "float16", "Zf": "complex64"})


def as_device(value: Device | str, what: str = "device") -> Device:
    """A Device, or one opened by spec; ArgumentTypeError naming `what` for anything else."""
    if isinstance(value, Device):
        return value
    if not isinstance(value, str):
        raise wrong_type(what, value, 'a devbuf.Device or a device spec ("cpu", "opencl:0", "cuda:0")')
    return Device(value)


def devices() -> list[Device]:
    """The devices that open here, kind by kind as the library lists its backends: the CPU,
    then each OpenCL and CUDA device."""
    found: list[Device] = []
    for kind in range(1, lib.devbuf_device_kind_count() + 1):
        name = lib.devbuf_device_kind_name(kind).decode()
        for index in range(64):
            try:
                found.append(Device(f"{name}:{index}"))
            except DevbufError:
                break
    return found
