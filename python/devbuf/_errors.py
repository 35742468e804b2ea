"""devbuf's statuses as exceptions: one class per status, all derived from DevbufError, each
also derived from the built-in exception a Python user would catch for it."""
from __future__ import annotations

import numbers
import operator

from ._native import lib


class DevbufError(Exception):
    """A devbuf call failed. `status` is the status name ("IN_USE"), `message` what the
    library said about the values involved."""

    status: str = "UNKNOWN"

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        # The library's messages start with the status name already.
        return self.message if self.message.startswith(self.status + ":") else f"{self.status}: {self.message}"


class InvalidArgumentError(DevbufError, ValueError):
    status = "INVALID_ARGUMENT"


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of a type the call does not take. A TypeError, as Python's own calls
    raise, and an InvalidArgumentError, as the library would say: code that catches
    either sees it. The message names the argument and what it accepts."""


class OutOfMemoryError(DevbufError, MemoryError):
    status = "OUT_OF_MEMORY"


class SizeOverflowError(DevbufError, OverflowError):
    status = "OVERFLOW"


class OutOfRangeError(DevbufError, IndexError):
    status = "OUT_OF_RANGE"


class TypeMismatchError(DevbufError, TypeError):
    status = "TYPE_MISMATCH"


class SizeMismatchError(DevbufError, ValueError):
    status = "SIZE_MISMATCH"


class NotAllocatedError(DevbufError):
    status = "NOT_ALLOCATED"


class NotCpuAccessibleError(DevbufError):
    status = "NOT_CPU_ACCESSIBLE"


class ReadOnlyError(DevbufError):
    status = "READ_ONLY"


class InUseError(DevbufError):
    status = "IN_USE"


class HostAccessOpenError(DevbufError):
    status = "HOST_ACCESS_OPEN"


class UnavailableError(DevbufError):
    status = "UNAVAILABLE"


class DevbufTimeoutError(DevbufError, TimeoutError):
    status = "TIMEOUT"


class DevbufIOError(DevbufError, OSError):
    status = "IO_ERROR"


class FormatError(DevbufError, ValueError):
    status = "FORMAT_ERROR"


class DeviceFailureError(DevbufError):
    status = "DEVICE_FAILURE"


class UnsupportedError(DevbufError):
    status = "UNSUPPORTED"


class NotFoundError(DevbufError, LookupError):
    status = "NOT_FOUND"


class InjectedFaultError(DevbufError):
    status = "INJECTED_FAULT"


class CancelledError(DevbufError):
    status = "CANCELLED"


ERRORS: dict[str, type[DevbufError]] = {
    cls.status: cls
    for cls in (InvalidArgumentError, OutOfMemoryError, SizeOverflowError, OutOfRangeError, TypeMismatchError,
                SizeMismatchError, NotAllocatedError, NotCpuAccessibleError, ReadOnlyError, InUseError,
                HostAccessOpenError, UnavailableError, DevbufTimeoutError, DevbufIOError, FormatError,
                DeviceFailureError, UnsupportedError, NotFoundError, InjectedFaultError, CancelledError)
}


def status_name(status: int) -> str:
    return str(lib.devbuf_status_name(status).decode())


def error(status: int) -> DevbufError:
    """The exception for a failed call's status, with the calling thread's message."""
    name = status_name(status)
    message = lib.devbuf_last_error().decode(errors="replace") or lib.devbuf_status_str(status).decode()
    return ERRORS.get(name, DevbufError)(message, name)


def check(status: int) -> None:
    if status != 0:
        raise error(status)


def short_repr(value: object, limit: int = 60) -> str:
    """repr(value), cut short: messages name values, and an array's repr can be long."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def c_text(value: str | bytes, what: str) -> bytes:
    """`value` as the bytes of a C string (str as UTF-8). A NUL byte would end the string
    there and the call would quietly use a shorter one (another path, another name): refused,
    as Python's own open() refuses it."""
    try:
        data = value.encode() if isinstance(value, str) else bytes(value)
    except UnicodeEncodeError as error:
        raise InvalidArgumentError(f"{what} {short_repr(value)} is not valid UTF-8 text: {error.reason}") from None
    at = data.find(b"\0")
    if at >= 0:
        raise InvalidArgumentError(f"{what} {short_repr(value)} holds a NUL byte at {at}: a C string would end there")
    return data


def wrong_type(what: str, value: object, accepted: str) -> ArgumentTypeError:
    """The error for argument `what` given `value` of a type it does not take."""
    return ArgumentTypeError(f"{what} {short_repr(value)} ({type(value).__name__}): give {accepted}")


def count(value: object, what: str) -> int:
    """`value` as a non-negative integer below 2**64: ArgumentTypeError naming it when it is
    no number, InvalidArgumentError when it is a number out of range or with a fraction."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        if not isinstance(value, numbers.Real):
            raise wrong_type(what, value, "an integer") from None
        real = float(value)
        if not real.is_integer():
            raise InvalidArgumentError(f"{what} {value!r} is not an integer") from None
        number = int(real)
    if not 0 <= number < 2**64:
        raise InvalidArgumentError(f"{what} {value!r}: give an integer from 0 to 2**64 - 1")
    return number
