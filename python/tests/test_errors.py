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
        buffer.byte_view(32, 64)
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


def test_misuse_is_refused_by_name(cpu):
    buffer = cpu.empty((16,), "float32")
    for bad in (-1, 2.5, "3", 2**64):
        with pytest.raises(devbuf.InvalidArgumentError):
            buffer.byte_view(bad, 4)
    with pytest.raises(devbuf.InvalidArgumentError) as dimension:
        cpu.empty((4, 1.5), "int8")
    assert "1.5" in dimension.value.message
    with pytest.raises(devbuf.InvalidArgumentError):
        devbuf.Event(-1)
    event = devbuf.Event(1)
    assert event.wait(1, timeout=float("inf"))
    with pytest.raises(devbuf.InvalidArgumentError):
        event.wait(2, timeout=float("nan"))
    with pytest.raises(devbuf.InvalidArgumentError):
        event.signal(-3)
    with pytest.raises(devbuf.InvalidArgumentError):
        cpu.set_limits(memory=-5)
    with pytest.raises(TypeError):
        devbuf.Buffer()
    with pytest.raises(TypeError):
        buffer[1.5]
    with pytest.raises(devbuf.InvalidArgumentError):
        buffer[::2]
    with pytest.raises(TypeError):
        devbuf.from_dlpack(object())
    with pytest.raises(devbuf.InvalidArgumentError):
        cpu.queue().fill(buffer, b"")


def test_an_access_dropped_unclosed_ends(cpu):
    import gc

    buffer = cpu.zeros((4,), "int32")
    access = buffer.write()
    access.__enter__()
    assert buffer.open_accesses == 1
    del access
    gc.collect()
    assert buffer.open_accesses == 0


def test_handles_refuse_pickle_and_copy(cpu):
    """A copy would share the handle without its own reference: one going frees the other's."""
    import copy
    import pickle
    buffer, queue, event = cpu.zeros((4,), "float32"), cpu.queue(), devbuf.Event()
    for thing in (buffer, queue, event, cpu):
        with pytest.raises(TypeError, match="cannot be"):
            pickle.dumps(thing)
        with pytest.raises(TypeError, match="cannot be copied"):
            copy.copy(thing)
        with pytest.raises(TypeError, match="cannot be copied"):
            copy.deepcopy(thing)
    queue.close()


def test_nul_bytes_in_names_are_refused(cpu, tmp_path):
    """C would read a string only up to its first NUL: another path, another name."""
    with pytest.raises(devbuf.InvalidArgumentError, match="NUL byte at 3"):
        devbuf.Device("cpu\0junk")
    target = tmp_path / "x"
    with pytest.raises(devbuf.InvalidArgumentError, match="NUL byte at"):
        devbuf.save(str(target) + "\0y", {"a": cpu.zeros((2,), "float32")})
    assert not target.exists()
    with pytest.raises(devbuf.InvalidArgumentError, match="a tensor name 'a\\\\x00b' holds a NUL byte"):
        devbuf.save(str(target), {"a\0b": cpu.zeros((2,), "float32")})
    with pytest.raises(devbuf.InvalidArgumentError, match="a metadata key"):
        devbuf.save(str(target), {"a": cpu.zeros((2,), "float32")}, metadata={"k\0x": "v"})
    devbuf.save(str(target), {"a": cpu.zeros((2,), "float32")})
    with pytest.raises(devbuf.InvalidArgumentError, match="the path"):
        devbuf.load(str(target) + "\0ignored")
    assert "a\0b" not in devbuf.load(str(target))


def test_closed_devices_and_events_refuse():
    device = devbuf.Device("cpu")
    device.close()
    with pytest.raises(devbuf.InvalidArgumentError, match="device was closed"):
        device.spec  # noqa: B018 (it raised AttributeError from a NULL name)
    assert "closed" in repr(device)
    event = devbuf.Event(3)
    event.close()
    with pytest.raises(devbuf.InvalidArgumentError, match="event was closed"):
        event.value  # noqa: B018 (it answered 0)
    assert "closed" in repr(event)


def test_odd_but_valid_arguments(cpu):
    import fractions

    import numpy

    event = devbuf.Event(5)
    assert event.wait(1, timeout=1e300)  # OverflowError before the clamp
    assert event.wait(1, timeout=numpy.float32(0.01))  # refused as no number
    assert not event.wait(9, timeout=fractions.Fraction(1, 1000))
    assert cpu.empty(numpy.array([2, 3]), "int8").shape == (2, 3)  # taken for one dimension
    with pytest.raises(devbuf.ArgumentTypeError):
        cpu.empty({2: 3}, "int8")  # its keys were taken for a shape
    queue = cpu.queue()
    with pytest.raises(devbuf.InvalidArgumentError):
        queue.fill(cpu.zeros((4,), "float32"), 1e300)  # a bare OverflowError
    with pytest.raises(devbuf.InvalidArgumentError):
        cpu.asbuffer(numpy.zeros(2, "M8[s]"))  # a bare BufferError
