"""DLPack both ways with numpy: zero-copy, every dtype numpy has, views, read-only memory,
lifetimes, the legacy capsule."""
import gc

import pytest

import devbuf

np = pytest.importorskip("numpy", reason="numpy is not installed (scripts/python_env.sh installs it)")

# numpy's dtypes that devbuf has too, and those it lacks (refused on import, naming why).
SHARED = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64", "complex64"]
LACKING = ["complex128"]
NOT_EXPORTED = ["longdouble", "clongdouble"]  # numpy itself refuses to export these


def sample(dtype, shape=(3, 5)):
    values = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    return (values % 2 == 1) if dtype == "bool" else (values * 3 - 7).astype(dtype)


def address_of(array):
    return array.__array_interface__["data"][0]


def test_every_numpy_dtype_is_covered():
    names = {np.dtype(c).name for c in np.typecodes["All"] if np.dtype(c).kind not in "OSUVMm"}
    assert names == set(SHARED) | {np.dtype(n).name for n in LACKING + NOT_EXPORTED}


@pytest.mark.parametrize("dtype", SHARED)
def test_numpy_into_devbuf_and_back(dtype):
    array = sample(dtype)
    buffer = devbuf.from_dlpack(array)
    assert buffer.dtype == np.dtype(dtype).name and buffer.shape == array.shape
    assert buffer.device_ptr == address_of(array)  # the same memory
    back = np.from_dlpack(buffer)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert address_of(back) == address_of(array)
    np.testing.assert_array_equal(back, array)
    with pytest.raises(devbuf.HostAccessOpenError):  # numpy's writable array holds a write access
        buffer.to_bytes()
    del back
    assert buffer.to_bytes() == array.tobytes()


@pytest.mark.parametrize("dtype", SHARED)
def test_devbuf_into_numpy(cpu, dtype):
    array = sample(dtype, (4, 2, 3))
    buffer = cpu.asbuffer(array)
    assert buffer.device_ptr != address_of(array)  # asbuffer copies
    out = np.from_dlpack(buffer)
    assert address_of(out) == buffer.device_ptr and out.flags.writeable
    np.testing.assert_array_equal(out, array)
    out[0, 0, 0] = array[0, 0, 1]  # writes reach the buffer
    del out  # its write access ends with it
    assert buffer.to_bytes()[: array.itemsize] == array[0, 0, 1].tobytes()


def test_asbuffer_copies_any_layout(cpu):
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    copy = cpu.asbuffer(strided)
    assert copy.shape == (3, 2) and copy.dtype == "float32"
    np.testing.assert_array_equal(np.from_dlpack(copy), strided)
    raw = cpu.asbuffer(b"\0\0\x80?" * 2, dtype="float32")
    assert raw.shape == (2,) and np.from_dlpack(raw).tolist() == [1.0, 1.0]
    with pytest.raises(devbuf.InvalidArgumentError):
        cpu.asbuffer(b"abc", dtype="int16")
    # A format no dtype is (big-endian) is refused, not taken as its bytes.
    with pytest.raises(devbuf.InvalidArgumentError, match="format '>f'"):
        cpu.asbuffer(np.arange(4, dtype=">f4"))


@pytest.mark.parametrize("dtype", LACKING)
def test_dtypes_devbuf_lacks_are_refused(dtype):
    array = np.ones((2, 2), dtype=dtype)
    with pytest.raises(devbuf.UnsupportedError) as refused:
        devbuf.from_dlpack(array)
    assert "dtype" in refused.value.message.lower() or "bits" in refused.value.message
    del refused
    gc.collect()
    array[0, 0] = 2  # numpy still owns its memory: the refused tensor went back to it
    assert array[0, 0] == 2


@pytest.mark.parametrize("dtype", NOT_EXPORTED)
def test_dtypes_numpy_does_not_export(dtype):
    with pytest.raises(BufferError):
        devbuf.from_dlpack(np.ones(3, dtype=dtype))


def test_dtypes_numpy_lacks_are_refused_by_numpy(cpu):
    buffer = cpu.zeros((4,), "bfloat16")
    with pytest.raises((BufferError, RuntimeError)):  # numpy has no bfloat16: it says so itself
        np.from_dlpack(buffer)
    gc.collect()
    assert buffer.open_accesses == 0  # the tensor it did not take went back


def test_views_both_ways(cpu):
    array = np.arange(24, dtype=np.float32)
    buffer = cpu.asbuffer(array)
    view = buffer[4:12]  # elements 4..11: bytes 16..47
    assert view.shape == (8,) and view.offset == 16 and view.storage_id == buffer.storage_id
    np.testing.assert_array_equal(np.from_dlpack(view), array[4:12])
    sliced = devbuf.from_dlpack(array[6:10])  # a contiguous numpy view: zero-copy
    assert sliced.device_ptr == address_of(array) + 24
    assert sliced.to_bytes() == array[6:10].tobytes()
    with pytest.raises(devbuf.UnsupportedError) as strided:
        devbuf.from_dlpack(array.reshape(4, 6)[:, ::2])
    assert "stride" in strided.value.message


def test_export_holds_a_host_access_until_the_consumer_lets_go(cpu):
    buffer = cpu.zeros((8,), "int32")
    queue = cpu.queue()
    array = np.from_dlpack(buffer)
    assert buffer.open_accesses == 1
    with pytest.raises(devbuf.HostAccessOpenError):
        queue.fill(buffer, 7)  # would race with numpy's array
    del array
    gc.collect()
    assert buffer.open_accesses == 0
    queue.fill(buffer, 7)
    queue.finish()
    np.testing.assert_array_equal(np.from_dlpack(buffer), np.full(8, 7, np.int32))


def test_unconsumed_capsules_give_the_tensor_back(cpu):
    buffer = cpu.zeros((8,), "int32")
    capsule = buffer.__dlpack__(max_version=(1, 0))
    assert buffer.open_accesses == 1
    del capsule
    gc.collect()
    assert buffer.open_accesses == 0


def test_memory_outlives_the_handle(cpu):
    live = cpu.memory_stats()["live_buffers"]
    buffer = cpu.asbuffer(np.arange(1000, dtype=np.float64))
    array = np.from_dlpack(buffer)
    del buffer
    gc.collect()
    assert array.sum() == 999 * 1000 / 2  # the storage lives while numpy's array does
    assert cpu.memory_stats()["live_buffers"] == live + 1
    del array
    gc.collect()
    assert cpu.memory_stats()["live_buffers"] == live


def test_numpy_memory_outlives_the_array():
    array = np.arange(100, dtype=np.int64)
    expected = array.tobytes()
    buffer = devbuf.from_dlpack(array)
    del array
    gc.collect()
    assert buffer.to_bytes() == expected


def test_read_only_both_ways(cpu, tmp_path):
    frozen = np.arange(6, dtype=np.int32)
    frozen.flags.writeable = False
    buffer = devbuf.from_dlpack(frozen)
    assert buffer.read_only
    with pytest.raises(devbuf.ReadOnlyError):
        with buffer.write():
            pass
    writable = cpu.asbuffer(np.arange(4, dtype=np.int16))
    reader = np.from_dlpack(writable.read_only_export())
    assert not reader.flags.writeable
    with pytest.raises(ValueError):
        reader[0] = 1
    with writable.read() as view:  # other readers go on
        assert view.tolist() == [0, 1, 2, 3]
    devbuf.save(tmp_path / "t.safetensors", {"w": np.arange(5, dtype=np.float32)})
    mapped = devbuf.load(tmp_path / "t.safetensors")["w"]
    array = np.from_dlpack(mapped)
    assert mapped.is_mapped and mapped.read_only and not array.flags.writeable
    with pytest.raises(ValueError):
        array[0] = 1
    with pytest.raises(BufferError):  # a legacy capsule could not say "read-only"
        mapped.__dlpack__()


class Legacy:
    """A consumer's view of a producer from before DLPack 1.0."""

    def __init__(self, buffer):
        self.buffer = buffer

    def __dlpack__(self, stream=None):
        return self.buffer.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.buffer.__dlpack_device__()


def test_legacy_capsules(cpu):
    buffer = cpu.asbuffer(np.arange(5, dtype=np.uint8))
    capsule = buffer.__dlpack__()
    assert "dltensor" in repr(capsule) and "versioned" not in repr(capsule)
    del capsule
    array = np.from_dlpack(Legacy(buffer))
    np.testing.assert_array_equal(array, np.arange(5, dtype=np.uint8))
    assert not array.flags.writeable  # numpy's own caution with legacy capsules
    source = np.arange(6, dtype=np.int32)
    back = devbuf.from_dlpack(Legacy(source))  # numpy's legacy capsule
    assert back.device_ptr == address_of(source) and not back.read_only


def test_export_options(cpu):
    buffer = cpu.asbuffer(np.arange(3, dtype=np.float32))
    assert buffer.__dlpack_device__() == (1, 0)
    copied = np.from_dlpack(buffer, copy=True)
    assert address_of(copied) != buffer.device_ptr
    np.testing.assert_array_equal(copied, [0, 1, 2])
    with pytest.raises(BufferError):
        buffer.__dlpack__(max_version=(1, 0), stream=1)
    with pytest.raises(BufferError):
        buffer.__dlpack__(max_version=(1, 0), dl_device=(2, 0))


def test_scalars_and_empty(cpu):
    scalar = devbuf.from_dlpack(np.array(3.5, dtype=np.float64))
    assert scalar.shape == () and np.from_dlpack(scalar) == 3.5
    empty = cpu.empty((0, 4), "int32")
    out = np.from_dlpack(empty)
    assert out.shape == (0, 4)
    with empty.read() as view:
        assert view.nbytes == 0
