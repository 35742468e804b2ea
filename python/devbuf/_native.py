"""libdevbuf through ctypes: the library, its structures and its functions' signatures.

Every function the package calls has its signature in _SIGNATURES, and `lib` has no other
functions: ctypes would call an unlisted one as returning int, cutting pointers to 32 bits.
python/tests/test_binding.py holds the table, the structures' layouts and _UNBOUND against
include/devbuf.h.

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


class DeviceInfo(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("version", c_char_p), ("global_memory", c_uint64),
                ("max_allocation", c_uint64), ("alignment", c_size_t), ("host_unified", c_int),
                ("svm_capabilities", c_uint64), ("processor", c_int), ("capabilities", c_uint32)]


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
    "devbuf_device_kind_count": (c_size_t,),
    "devbuf_device_kind_name": (c_char_p, c_int),
    "devbuf_device_dlpack_type": (ctypes.c_int32, P),
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
    "devbuf_queue_fill": (c_int, P, P, P, c_size_t),
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

# Header functions the package does not call, and why; the test fails on a header function
# in neither table.
_UNBOUND = {
    # the package reaches these through other calls, or has no use for them
    "devbuf_allocator_device": "not exposed",
    "devbuf_buffer_allocator": "the package never asks a buffer for its allocator",
    "devbuf_buffer_count": "not exposed (the shape gives it)",
    "devbuf_buffer_is_empty": "not exposed (Buffer.nbytes gives it)",
    "devbuf_buffer_synchronize": "Device.synchronize; Buffer.wait waits for its own work",
    "devbuf_buffer_view_as": "Buffer.view then Buffer.reshape",
    "devbuf_device_allocator_for": "no memory kinds in the Python API yet",
    "devbuf_dtype_bytes": "not exposed",
    "devbuf_dtype_dlpack": "devbuf_buffer_to_dlpack sets the DLPack dtype",
    "devbuf_event_retain": "an Event owns one reference",
    "devbuf_queue_device": "not exposed (a Queue is made from its Device)",
    "devbuf_queue_retain": "a Queue owns one reference",
    "devbuf_tensor_file_data_size": "not exposed",
    "devbuf_tensor_file_header_size": "not exposed",
    "devbuf_tensor_file_metadata_get": "TensorFile.metadata reads them all",
    "devbuf_safetensors_inspect": "load is the Python API's only reader",
    "devbuf_safetensors_parse": "load is the Python API's only reader",
    # typed host access: Buffer.read/write hand out memoryviews over contents instead
    "devbuf_buffer_as_array": "memoryviews over contents",
    "devbuf_buffer_as_array_mut": "memoryviews over contents",
    "devbuf_buffer_as_slice": "memoryviews over contents",
    "devbuf_buffer_item": "memoryviews over contents",
    "devbuf_buffer_unsynchronized_ptr": "unordered host writes have no safe Python form",
    "devbuf_buffer_device_handle": "device_ptr is enough until OpenCL interop needs the cl_mem",
    # user allocators and adaptors: C callbacks that Python would have to run on any thread
    "devbuf_allocator_create": "a Python allocator would run under other threads' locks",
    "devbuf_allocator_alloc": "raw allocations: buffers are the Python API's memory",
    "devbuf_allocator_free": "raw allocations: buffers are the Python API's memory",
    "devbuf_caching_allocator_create": "Device's own caching allocator only",
    "devbuf_device_raw_allocator": "Device's own caching allocator only",
    "devbuf_stats_adaptor_create": "the caching allocator's statistics are exposed instead",
    "devbuf_fault_adaptor_create": "fault injection is for the C tests",
    "devbuf_fault_adaptor_arm": "fault injection is for the C tests",
    "devbuf_fault_adaptor_fired": "fault injection is for the C tests",
    "devbuf_trace_replay": "replays are the devbuf tool's (tools/)",
    "devbuf_trace_replay_observed": "replays are the devbuf tool's (tools/)",
    "devbuf_set_host_memory_hooks": "process-wide, before any other call: not for a Python module",
    # sharing between processes: no Python API yet
    "devbuf_buffer_export": "no process sharing in the Python API yet",
    "devbuf_buffer_import": "no process sharing in the Python API yet",
    "devbuf_event_export": "no process sharing in the Python API yet",
    "devbuf_event_import": "no process sharing in the Python API yet",
    "devbuf_export_free": "no process sharing in the Python API yet",
    "devbuf_export_kind_of": "no process sharing in the Python API yet",
    "devbuf_export_pid": "no process sharing in the Python API yet",
    "devbuf_export_receive": "no process sharing in the Python API yet",
    "devbuf_export_reclaim": "no process sharing in the Python API yet",
    "devbuf_export_send": "no process sharing in the Python API yet",
}


class _Library:
    """The library's functions that _SIGNATURES lists, each with its signature set, as
    attributes; any other name raises AttributeError instead of becoming ctypes' default
    function returning int."""

    def __init__(self, path: str, signatures: dict[str, tuple[Any, ...]]):
        self._path = path
        cdll = ctypes.CDLL(path)
        for name, (restype, *argtypes) in signatures.items():
            function = getattr(cdll, name)
            function.restype = restype
            function.argtypes = argtypes
            setattr(self, name, function)

    def __getattr__(self, name: str) -> Any:  # only for names __init__ did not set
        raise AttributeError(f"{name} is not in devbuf._native._SIGNATURES: add its signature there "
                             f"(name: (restype, *argtypes), as include/devbuf.h declares it) to call it")


lib = _Library(_find_library(), _SIGNATURES)


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

    # A copy or a pickle would hold the same handle without its own reference: once either
    # went, the other would use freed memory. Refused, as open files refuse.
    def __reduce_ex__(self, protocol: object) -> Any:
        raise TypeError(f"a devbuf.{type(self).__name__} cannot be pickled or copied (it holds a library object)")

    def __copy__(self) -> Any:
        raise TypeError(f"a devbuf.{type(self).__name__} cannot be copied (it holds a library object)")

    def __deepcopy__(self, memo: object) -> Any:
        raise TypeError(f"a devbuf.{type(self).__name__} cannot be copied (it holds a library object)")

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
