"""libdevbuf through ctypes: the library, its structures and its functions' signatures.

ctypes releases the GIL around every call into the library, so waits and copies let other
Python threads run. The library is the package's own copy (installed beside this file);
DEVBUF_LIBRARY names another one (a build tree's, for tests).
"""
from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_char_p, c_double, c_int, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Any, TypeVar

P = c_void_p


def _find_library() -> str:
    override = os.environ.get("DEVBUF_LIBRARY")
    if override:
        return override
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.startswith("libdevbuf.so"):
            return os.path.join(here, name)
    raise ImportError(f"devbuf: libdevbuf.so is not in {here} (reinstall the package, or set DEVBUF_LIBRARY)")


lib = ctypes.CDLL(_find_library())

class DeviceInfo(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("version", c_char_p), ("global_memory", c_uint64),
                ("max_allocation", c_uint64), ("alignment", c_size_t), ("host_unified", c_int),
                ("svm_capabilities", c_uint64), ("processor", c_int)]


class AllocatorStats(ctypes.Structure):
    _fields_ = [("active", c_uint64), ("peak", c_uint64), ("reserved", c_uint64), ("cached", c_uint64),
                ("released_in_flight", c_uint64), ("segments", c_uint64), ("largest_free_block", c_uint64),
                ("fragmentation", c_double), ("mapped", c_uint64), ("live_buffers", c_uint64),
                ("system_allocs", c_uint64), ("system_frees", c_uint64), ("cache_hits", c_uint64),
                ("alloc_calls", c_uint64), ("failed_allocs", c_uint64), ("peak_reserved", c_uint64)]


class CachingOptions(ctypes.Structure):
    _fields_ = [("memory_limit", c_uint64), ("cache_limit", c_uint64), ("max_buffers", c_uint64),
                ("page_size", c_uint64), ("growable", c_uint32)]


class SnapshotBlock(ctypes.Structure):
    _fields_ = [("offset", c_uint64), ("size", c_uint64), ("state", c_int)]


class SnapshotSegment(ctypes.Structure):
    _fields_ = [("serial", c_uint64), ("device", c_uint64), ("size", c_uint64), ("pool", c_char_p),
                ("block_count", c_size_t), ("blocks", POINTER(SnapshotBlock))]


class Snapshot(ctypes.Structure):
    _fields_ = [("segment_count", c_size_t), ("segments", POINTER(SnapshotSegment))]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("ndim", c_size_t), ("shape", POINTER(c_size_t)),
                ("begin", c_uint64), ("end", c_uint64), ("file_offset", c_uint64)]


ON_TENSOR = ctypes.CFUNCTYPE(None, P, c_size_t, POINTER(TensorInfo), P)


SELECT_TENSOR = ctypes.CFUNCTYPE(c_int, P, c_size_t, POINTER(TensorInfo))


class LoadOptions(ctypes.Structure):
    _fields_ = [("flags", c_uint32), ("on_tensor", ON_TENSOR), ("context", P), ("allocator", P),
                ("select", SELECT_TENSOR)]


class NamedBuffer(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("buffer", P)]


class MetadataEntry(ctypes.Structure):
    _fields_ = [("key", c_char_p), ("value", c_char_p)]


class Use(ctypes.Structure):
    _fields_ = [("buffer", P), ("access", c_int)]


class Launch(ctypes.Structure):
    _fields_ = [("dims", ctypes.c_uint), ("global_", c_size_t * 3), ("local", c_size_t * 3)]


class Arg(ctypes.Structure):
    _fields_ = [("data", P), ("size", c_size_t)]


class KernelArgs(ctypes.Structure):
    """What a CPU kernel receives (devbuf_kernel_args_t)."""

    _fields_ = [("data", POINTER(P)), ("sizes", POINTER(c_size_t)), ("count", c_size_t), ("scalars", P),
                ("scalars_size", c_size_t)]


# A CPU kernel (devbuf_cpu_kernel_fn): returns a devbuf status, 0 for success.
CPU_KERNEL = ctypes.CFUNCTYPE(c_int, POINTER(KernelArgs))


LOAD_COPY = 1
LOAD_ONE_ALLOCATION = 2
BUFFER_ZERO = 1
DLPACK_READ_ONLY = 1

_SIGNATURES = {
    # status and dtypes
    "devbuf_status_name": (c_char_p, c_int),
    "devbuf_status_str": (c_char_p, c_int),
    "devbuf_last_error": (c_char_p,),
    "devbuf_dtype_name": (c_char_p, c_int),
    "devbuf_dtype_bits": (ctypes.c_uint, c_int),
    "devbuf_dtype_from_name": (c_int, c_char_p, POINTER(c_int)),
    "devbuf_dtype_safetensors_name": (c_char_p, c_int),
    # devices and allocators
    "devbuf_device_open": (c_int, c_char_p, POINTER(P)),
    "devbuf_device_retain": (P, P),
    "devbuf_device_release": (None, P),
    "devbuf_device_kind_of": (c_int, P),
    "devbuf_device_spec": (c_char_p, P),
    "devbuf_device_name": (c_char_p, P),
    "devbuf_device_page_size": (c_size_t, P),
    "devbuf_device_allocator": (P, P),
    "devbuf_device_info": (c_int, P, POINTER(DeviceInfo)),
    "devbuf_device_synchronize": (c_int, P),
    "devbuf_allocator_retain": (P, P),
    "devbuf_allocator_release": (None, P),
    "devbuf_allocator_kind": (c_char_p, P),
    "devbuf_allocator_stats": (c_int, P, POINTER(AllocatorStats)),
    "devbuf_allocator_reset_peak": (None, P),
    "devbuf_allocator_clear_cache": (None, P),
    "devbuf_allocator_snapshot": (c_int, P, POINTER(POINTER(Snapshot))),
    "devbuf_allocator_snapshot_free": (None, POINTER(Snapshot)),
    "devbuf_caching_allocator_set_options": (c_int, P, POINTER(CachingOptions)),
    "devbuf_caching_allocator_configure": (c_int, P, POINTER(CachingOptions)),
    "devbuf_trace_adaptor_create": (c_int, P, c_char_p, POINTER(P)),
    # buffers
    "devbuf_buffer_new": (c_int, P, c_int, POINTER(c_size_t), c_size_t, c_uint32, POINTER(P)),
    "devbuf_buffer_allocate": (c_int, P, c_int, POINTER(c_size_t), c_size_t, c_uint32, POINTER(P)),
    "devbuf_buffer_map_file": (c_int, P, c_char_p, POINTER(P)),
    "devbuf_buffer_view": (c_int, P, c_size_t, c_size_t, POINTER(P)),
    "devbuf_buffer_reshape": (c_int, P, c_int, POINTER(c_size_t), c_size_t, POINTER(P)),
    "devbuf_buffer_retain": (P, P),
    "devbuf_buffer_release": (None, P),
    "devbuf_buffer_ensure_allocated": (c_int, P),
    "devbuf_buffer_is_allocated": (c_int, P),
    "devbuf_buffer_size": (c_size_t, P),
    "devbuf_buffer_offset": (c_size_t, P),
    "devbuf_buffer_dtype": (c_int, P),
    "devbuf_buffer_ndim": (c_size_t, P),
    "devbuf_buffer_shape": (POINTER(c_size_t), P),
    "devbuf_buffer_device": (P, P),
    "devbuf_buffer_storage_id": (c_uint64, P),
    "devbuf_buffer_handle_id": (c_uint64, P),
    "devbuf_buffer_is_mapped": (c_int, P),
    "devbuf_buffer_is_read_only": (c_int, P),
    "devbuf_buffer_is_cpu_accessible": (c_int, P),
    "devbuf_buffer_in_use": (c_int, P),
    "devbuf_buffer_contents": (c_int, P, POINTER(P), POINTER(c_size_t)),
    "devbuf_buffer_contents_mut": (c_int, P, POINTER(P), POINTER(c_size_t)),
    "devbuf_buffer_contents_wait": (c_int, P, POINTER(P), POINTER(c_size_t)),
    "devbuf_buffer_contents_mut_wait": (c_int, P, POINTER(P), POINTER(c_size_t)),
    "devbuf_buffer_end_access": (c_int, P, P),
    "devbuf_buffer_open_accesses": (c_size_t, P),
    "devbuf_buffer_copyin": (c_int, P, P, c_size_t),
    "devbuf_buffer_copyout": (c_int, P, P, c_size_t),
    "devbuf_buffer_copy_from": (c_int, P, P),
    "devbuf_buffer_wait": (c_int, P),
    "devbuf_buffer_device_ptr": (c_int, P, POINTER(c_uint64)),
    "devbuf_buffer_describe": (c_size_t, P, c_char_p, c_size_t),
    "devbuf_buffer_to_dlpack_versioned": (c_int, P, c_uint32, POINTER(P)),
    "devbuf_buffer_to_dlpack": (c_int, P, c_uint32, POINTER(P)),
    "devbuf_buffer_from_dlpack_versioned": (c_int, P, POINTER(P)),
    "devbuf_buffer_from_dlpack": (c_int, P, POINTER(P)),
    # events and queues
    "devbuf_event_create": (c_int, c_uint64, POINTER(P)),
    "devbuf_event_release": (None, P),
    "devbuf_event_signal": (c_int, P, c_uint64),
    "devbuf_event_wait": (c_int, P, c_uint64, c_uint64),
    "devbuf_event_value": (c_uint64, P),
    "devbuf_event_status": (c_int, P),
    "devbuf_queue_create": (c_int, P, POINTER(P)),
    "devbuf_queue_release": (None, P),
    "devbuf_queue_fill": (c_int, P, P, c_char_p, c_size_t),
    "devbuf_queue_copy": (c_int, P, P, P),
    "devbuf_queue_signal": (c_int, P, P, c_uint64),
    "devbuf_queue_wait": (c_int, P, P, c_uint64),
    "devbuf_queue_finish": (c_int, P),
    "devbuf_queue_set_depth": (c_int, P, c_uint64, c_uint32),
    "devbuf_queue_cancel": (c_int, P),
    "devbuf_queue_submit": (c_int, P, P, POINTER(Use), c_size_t, P, c_size_t),
    "devbuf_queue_host_task": (c_int, P, P, POINTER(Use), c_size_t, P, c_size_t),
    "devbuf_queue_launch": (c_int, P, P, c_char_p, POINTER(Launch), POINTER(Use), c_size_t, POINTER(Arg),
                            c_size_t),
    "devbuf_program_build": (c_int, P, c_char_p, c_char_p, POINTER(P)),
    "devbuf_program_retain": (P, P),
    "devbuf_program_release": (None, P),
    "devbuf_set_error": (c_int, c_int, c_char_p),
    "devbuf_queue_status": (c_int, P),
    # weight files
    "devbuf_safetensors_load": (c_int, P, c_char_p, POINTER(LoadOptions), POINTER(P)),
    "devbuf_tensor_file_release": (None, P),
    "devbuf_tensor_file_count": (c_size_t, P),
    "devbuf_tensor_file_info": (c_int, P, c_size_t, POINTER(TensorInfo)),
    "devbuf_tensor_file_find": (c_int, P, c_char_p, POINTER(c_size_t)),
    "devbuf_tensor_file_buffer": (P, P, c_size_t),
    "devbuf_tensor_file_metadata_count": (c_size_t, P),
    "devbuf_tensor_file_metadata": (c_int, P, c_size_t, POINTER(c_char_p), POINTER(c_char_p)),
    "devbuf_safetensors_write": (c_int, c_char_p, POINTER(NamedBuffer), c_size_t, POINTER(MetadataEntry), c_size_t),
}

for _name, (_restype, *_argtypes) in _SIGNATURES.items():
    _function = getattr(lib, _name)
    _function.restype = _restype
    _function.argtypes = _argtypes


_Self = TypeVar("_Self", bound="Owned")


class Owned:
    """A Python object holding one reference to a library object (`_handle`): dropped by
    close(), or when the object goes. Subclasses name the library's release function."""

    __slots__ = ()
    _release: Any  # the library's release function (a class attribute)

    def close(self) -> None:
        """Drops the reference now (the object is unusable afterwards; not while another
        thread is using the same object)."""
        handle = getattr(self, "_handle", None)
        setattr(self, "_handle", None)  # every subclass has the slot or a __dict__
        if handle:
            type(self)._release(handle)

    def __del__(self) -> None:
        self.close()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
