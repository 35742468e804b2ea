"""Queues of device work and events (timelines)."""
from __future__ import annotations

import ctypes
import math
import struct
from typing import TYPE_CHECKING, Any

from . import _dtypes
from ._buffer import Buffer
from ._errors import InvalidArgumentError, check, count
from ._native import Owned, P, lib

if TYPE_CHECKING:
    from ._device import Device

_FOREVER = 2**64 - 1
_TIMEOUT = 13


class Event(Owned):
    """A timeline: a counter that only grows. Queues and the host signal values and wait
    for them; a failure of the work that was to signal it fails every wait."""

    __slots__ = ("_handle", "__weakref__")

    def __init__(self, initial: int = 0):
        out = P()
        check(lib.devbuf_event_create(count(initial, "initial value"), ctypes.byref(out)))
        self._handle = out.value

    _release = lib.devbuf_event_release

    @property
    def value(self) -> int:
        return int(lib.devbuf_event_value(self._handle))

    def signal(self, value: int) -> None:
        """Signals `value` from the host (not below the current value)."""
        check(lib.devbuf_event_signal(self._handle, count(value, "value")))

    def wait(self, value: int, timeout: float | None = None) -> bool:
        """Waits until the value is at least `value`: True, or False when `timeout`
        seconds pass first (0 only checks). Raises the failure (DeviceFailureError,
        CancelledError, ...) if the work that was to signal it failed."""
        target = count(value, "value")
        if timeout is None or timeout == math.inf:
            nanoseconds = _FOREVER
        elif not timeout >= 0:  # negative, or NaN
            raise InvalidArgumentError(f"timeout {timeout}: give seconds >= 0, or None to wait forever")
        else:
            nanoseconds = min(int(timeout * 1e9), _FOREVER - 1)
        status = lib.devbuf_event_wait(self._handle, target, nanoseconds)
        if status == _TIMEOUT:
            return False
        check(status)
        return True

    def check(self) -> None:
        """Raises the failure that reached the event, if any."""
        check(lib.devbuf_event_status(self._handle))

    def __repr__(self) -> str:
        return f"<devbuf.Event value={self.value}>"


class Queue(Owned):
    """An in-order queue of work on one device. Each submission declares what it reads and
    writes; work on other queues touching the same bytes is ordered after it, and host
    access that would race with it is refused or waits."""

    __slots__ = ("_handle", "device", "__weakref__")

    def __init__(self, device: Device):
        out = P()
        check(lib.devbuf_queue_create(device._handle, ctypes.byref(out)))
        self._handle = out.value
        self.device = device

    _release = lib.devbuf_queue_release  # close(): submitted work still runs

    def set_depth(self, max_items: int, *, refuse_when_full: bool = False) -> None:
        """Bounds the work the queue holds (0: no bound; new queues hold 4096 items). A
        submission to a full queue waits for room, or with refuse_when_full raises
        a TimeoutError (devbuf.DevbufTimeoutError) at once."""
        if max_items < 0:
            raise InvalidArgumentError(f"a queue's depth is a count of items, not {max_items}")
        check(lib.devbuf_queue_set_depth(self._handle, max_items, 1 if refuse_when_full else 0))

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def fill(self, buffer: Buffer, pattern: Any) -> None:
        """Fills `buffer` with a repeated pattern: bytes (any bytes-like object), or a number
        (Python's or numpy's) written as one element of the buffer's dtype."""
        from ._errors import wrong_type

        if not isinstance(buffer, Buffer):
            raise wrong_type("buffer", buffer, "a devbuf.Buffer")
        if getattr(pattern, "ndim", None) == 0 and hasattr(pattern, "item"):
            pattern = pattern.item()  # a numpy scalar: its value, written as the buffer's dtype
        if isinstance(pattern, (int, float, bool)):
            fmt = _dtypes.STRUCT_FORMATS.get(buffer.dtype)
            if fmt is None:
                raise InvalidArgumentError(f"a number cannot be written as {buffer.dtype}: give the pattern as bytes")
            try:
                pattern = struct.pack("<" + fmt, pattern)
            except struct.error as wrong:
                raise InvalidArgumentError(f"{pattern!r} is not a {buffer.dtype}: {wrong}") from None
        try:
            data = memoryview(pattern).tobytes()
        except TypeError:
            raise wrong_type("pattern", pattern, "bytes (a bytes-like object) or a number") from None
        check(lib.devbuf_queue_fill(self._handle, buffer._h, data, len(data)))

    def copy(self, dst: Buffer, src: Buffer) -> None:
        """Copies `src` into `dst` (equal byte sizes)."""
        check(lib.devbuf_queue_copy(self._handle, dst._h, src._h))

    def signal(self, event: Event, value: int) -> None:
        """Signals `value` on `event` once the work submitted before has completed."""
        check(lib.devbuf_queue_signal(self._handle, event._handle, count(value, "value")))

    def wait(self, event: Event, value: int) -> None:
        """Holds the work submitted after this until `event` reaches `value`."""
        check(lib.devbuf_queue_wait(self._handle, event._handle, count(value, "value")))

    def finish(self) -> None:
        """Waits until all submitted work has completed; raises the queue's failure."""
        check(lib.devbuf_queue_finish(self._handle))

    def cancel(self) -> None:
        """Drops the work not started yet (its events fail with CANCELLED)."""
        check(lib.devbuf_queue_cancel(self._handle))

    def check(self) -> None:
        """Raises the failure that stopped the queue, if any."""
        check(lib.devbuf_queue_status(self._handle))


__all__ = ["Event", "Queue"]
