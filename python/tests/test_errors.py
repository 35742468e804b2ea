"""Errors are exceptions that carry devbuf's status name and the library's message."""
import pytest

import devbuf
from devbuf import _errors


def test_every_status_has_its_class():
    value = 1
    while _errors.status_name(value) != "UNKNOWN":
        cls = _errors.ERRORS[_errors.status_name(value)]
        assert issubclass(cls, devbuf.DevbufError) and cls.status == _errors.status_name(value)
        value += 1
    assert value == len(_errors.ERRORS) + 1


def test_messages_name_the_values(cpu):
    buffer = cpu.empty((16,), "float32")
    with pytest.raises(devbuf.OutOfRangeError) as out_of_range:
        buffer.view(32, 64)
    assert "32" in out_of_range.value.message and "64" in out_of_range.value.message
    assert str(out_of_range.value).startswith("OUT_OF_RANGE: ")
    assert isinstance(out_of_range.value, IndexError)
    with pytest.raises(devbuf.SizeMismatchError):
        buffer.copy_from(b"\0" * 3)
    with pytest.raises(devbuf.SizeMismatchError):
        buffer.reshape((3,))
    with pytest.raises(devbuf.SizeOverflowError):
        cpu.empty((2**62, 2**62), "float32")
    with pytest.raises(devbuf.InvalidArgumentError):
        cpu.empty((4,), "float99")
    with pytest.raises(devbuf.InvalidArgumentError):
        cpu.empty((-1,), "float32")


def test_closed_buffers_refuse(cpu):
    buffer = cpu.empty((4,))
    buffer.close()
    with pytest.raises(devbuf.InvalidArgumentError):
        buffer.to_bytes()
    assert "closed" in repr(buffer)
