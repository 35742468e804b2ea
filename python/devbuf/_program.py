"""Device programs: OpenCL C on opencl:N, PTX or a cubin/fatbin image on cuda:N."""
from __future__ import annotations

import ctypes
from typing import Any

from ._device import Device
from ._errors import ArgumentTypeError, InvalidArgumentError, c_text, check
from ._native import Owned, P, lib


class Program(Owned):
    """A program built for one device: OpenCL C source on opencl:N (built once per device,
    source and options, and cached), PTX text or a cubin/fatbin image (bytes) on cuda:N. A
    build that fails raises devbuf.DeviceFailureError with the compiler's log; the CPU runs
    C functions instead (Queue.submit), so a Program there raises UnsupportedError."""

    __slots__ = ("_handle", "device", "_names", "__weakref__")
    _handle: int | None
    device: Device

    def __init__(self, device: Device | str, source: str | bytes, options: str = ""):
        self._handle = None
        if not isinstance(device, (Device, str)):
            raise ArgumentTypeError(f"device is a devbuf.Device or a spec such as 'opencl:0', not {type(device).__name__}")
        if isinstance(source, str):
            data = c_text(source, "the program's source")
        elif isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
        else:
            raise ArgumentTypeError("source is OpenCL C or PTX text (str), or a cubin/fatbin image (bytes), "
                            f"not {type(source).__name__}")
        if not isinstance(options, str):
            raise ArgumentTypeError(f"options is a str of compiler options, not {type(options).__name__}")
        self.device = device if isinstance(device, Device) else Device(device)
        self._names: dict[str, bytes] = {}
        out = P()
        check(lib.devbuf_program_build(self.device._handle, data, c_text(options, "the build options"), ctypes.byref(out)))
        self._handle = out.value

    _release = lib.devbuf_program_release

    @property
    def _h(self) -> int:
        if not self._handle:
            raise InvalidArgumentError("the program was closed")
        return self._handle

    def _name(self, name: Any) -> bytes:
        """A kernel's name as the library takes it (cached: launches repeat it)."""
        if not isinstance(name, str):  # before the cache, which an unhashable name breaks
            raise ArgumentTypeError(f"the kernel's name is a str, not {type(name).__name__}")
        encoded = self._names.get(name)
        if encoded is None:
            encoded = self._names[name] = c_text(name, "a kernel name")
        return encoded

    def __repr__(self) -> str:
        return f"<devbuf.Program on {self.device.spec}{'' if self._handle else ' (closed)'}>"


__all__ = ["Program"]
