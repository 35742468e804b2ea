"""devbuf: device memory buffers for CPU, OpenCL and CUDA, from Python.

    import devbuf, numpy as np
    weights = devbuf.load("model.safetensors")          # zero-copy on the CPU
    w = np.from_dlpack(weights["embed.weight"])         # numpy reads it in place
    q = devbuf.Device("cpu").queue()
    print(devbuf.Device("cpu").memory_stats()["reserved"])
"""
from __future__ import annotations

__version__ = "0.1.0"

from ._buffer import Buffer, HostAccess
from ._device import Device, devices
from ._dlpack import from_dlpack
from ._dtypes import NAMES as dtypes
from ._errors import (ArgumentTypeError, CancelledError, DeviceFailureError, DevbufError, DevbufIOError,
                      DevbufTimeoutError, FormatError, HostAccessOpenError, InjectedFaultError, InUseError,
                      InvalidArgumentError, NotAllocatedError, NotCpuAccessibleError, NotFoundError, OutOfMemoryError,
                      OutOfRangeError, ReadOnlyError, SizeMismatchError, SizeOverflowError, TypeMismatchError,
                      UnavailableError, UnsupportedError)
from ._files import TensorFile, load, save
from ._native import CPU_KERNEL, KernelArgs
from ._program import Program
from ._queue import Event, Queue

__all__ = [
    "__version__", "Buffer", "HostAccess", "Device", "devices", "from_dlpack", "dtypes", "TensorFile", "load",
    "save", "Event", "Queue", "Program", "CPU_KERNEL", "KernelArgs", "DevbufError", "InvalidArgumentError", "ArgumentTypeError", "OutOfMemoryError",
    "SizeOverflowError", "OutOfRangeError", "TypeMismatchError", "SizeMismatchError", "NotAllocatedError",
    "NotCpuAccessibleError", "ReadOnlyError", "InUseError", "HostAccessOpenError", "UnavailableError",
    "DevbufTimeoutError", "DevbufIOError", "FormatError", "DeviceFailureError", "UnsupportedError", "NotFoundError",
    "InjectedFaultError", "CancelledError",
]
