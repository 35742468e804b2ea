"""numpy's rules: dtypes in every spelling numpy takes, indexing by elements along the first
axis, byte views by name, a repr that says dtype, shape and device, and wrong-typed arguments
refused by name."""
import gc
import os
import re
import subprocess
import sys
import warnings

import pytest

import devbuf

np = pytest.importorskip("numpy", reason="numpy is not installed (scripts/python_env.sh installs it)")


@pytest.fixture(autouse=True)
def collect_after():
    """Caught exceptions hold their frames, and so the buffers in them, in a cycle: the
    buffers go now, not at some later collection that another module's count of live
    buffers would see."""
    yield
    gc.collect()


SPELLINGS = {
    "float32": [np.float32, "f4", "<f4", "=f4", "float32", "single", "F32", np.dtype("float32"), np.dtype("<f4"),
                np.dtype(np.float32)],
    "float64": [np.float64, float, "f8", "d", "double", "float64", "F64", np.dtype("<f8")],
    "float16": [np.float16, "f2", "<f2", "e", "half", "float16", "F16"],
    "int16": [np.int16, "i2", "<i2", "h", "int16", "I16", np.dtype("int16")],
    "int64": [np.int64, "i8", "<i8", "int64", "I64"],
    "uint8": [np.uint8, "u1", "|u1", "B", "uint8", "U8", np.dtype("u1")],
    "uint32": [np.uint32, "u4", "<u4", "uint32", "U32"],
    "bool": [np.bool_, bool, "?", "b1", "|b1", "bool", "BOOL", np.dtype(bool)],
    "complex64": [np.complex64, "c8", "<c8", "complex64", "C64"],
}


@pytest.mark.parametrize("name,spelling", [(name, s) for name, spellings in SPELLINGS.items() for s in spellings])
def test_every_numpy_spelling_gives_the_same_dtype(cpu, name, spelling):
    assert cpu.empty((2, 3), spelling).dtype == name
    assert cpu.zeros(4, spelling).dtype == name
    same_bytes = cpu.empty((8,), "uint8").reshape((8 // np.dtype(name).itemsize,), spelling)
    assert same_bytes.dtype == name


def test_dtypes_numpy_lacks_go_by_name(cpu):
    # devbuf's own names, safetensors' names and ml_dtypes' names of the same types
    for spelling, name in [("bfloat16", "bfloat16"), ("BF16", "bfloat16"), ("float8_e4m3", "float8_e4m3"),
                           ("float8_e4m3fn", "float8_e4m3"), ("F8_E4M3", "float8_e4m3"),
                           ("float8_e5m2", "float8_e5m2"), ("float8_e8m0fnu", "float8_e8m0"),
                           ("float8_e4m3fnuz", "float8_e4m3fnuz"), ("float6_e2m3fn", "float6_e2m3"),
                           ("float4_e2m1fn", "float4_e2m1")]:
        assert cpu.empty((4,), spelling).dtype == name, spelling


class DtypeLike:
    """Shaped like a numpy dtype, as ml_dtypes' dtypes are: a "void" kind with a name of its own."""

    def __init__(self, name, itemsize, kind="V", byteorder="|"):
        self.name, self.itemsize, self.kind, self.byteorder = name, itemsize, kind, byteorder
        self.str = f"{byteorder}V{itemsize}"


def test_dtype_objects_are_read_by_their_fields():
    assert devbuf.Device("cpu").empty((2,), DtypeLike("bfloat16", 2)).dtype == "bfloat16"
    assert devbuf.Device("cpu").empty((2,), DtypeLike("float8_e4m3fn", 1)).dtype == "float8_e4m3"
    # ml_dtypes' float8_e4m3 has infinities: not devbuf's float8_e4m3, which is e4m3fn
    with pytest.raises(devbuf.InvalidArgumentError, match="float8_e4m3.*no such type"):
        devbuf.Device("cpu").empty((2,), DtypeLike("float8_e4m3", 1))
    with pytest.raises(devbuf.InvalidArgumentError, match="no such type"):
        devbuf.Device("cpu").empty((2,), DtypeLike("int4", 1))


def test_ml_dtypes_types(cpu):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (the test env does not add it)")
    assert cpu.empty((2,), ml_dtypes.bfloat16).dtype == "bfloat16"
    assert cpu.empty((2,), np.dtype(ml_dtypes.bfloat16)).dtype == "bfloat16"
    assert np.dtype(ml_dtypes.bfloat16).name == "bfloat16"
    assert cpu.empty((2,), ml_dtypes.float8_e4m3fn).dtype == "float8_e4m3"
    assert cpu.empty((2,), ml_dtypes.float8_e5m2).dtype == "float8_e5m2"
    if hasattr(ml_dtypes, "float8_e4m3"):  # the IEEE-like one, with infinities (ml_dtypes 0.5 on)
        with pytest.raises(devbuf.InvalidArgumentError, match="no such type"):
            cpu.empty((2,), ml_dtypes.float8_e4m3)


@pytest.mark.parametrize("dtype,named", [
    (">f4", r"'>f4' \(numpy's float32, >f4\) is big-endian.*give '<f4'"),
    (np.dtype(">i2"), r">i2.*big-endian.*give '<i2'"),
    (np.complex128, r"complex128.*c16.*no such type"), ("complex128", r"'complex128'.*no such type"),
    (object, r"object.*no such type"), (str, r"str.*no such type"), ("U4", r"'U4'.*no such type"),
    ("float99", r"'float99' is unknown"), (np.dtype([("a", "<f4")]), r"no such type"),
    (np.longdouble, r"no such type"),
])
def test_dtypes_devbuf_lacks_are_refused_by_name(cpu, dtype, named):
    with pytest.raises(devbuf.InvalidArgumentError, match=named) as refused:
        cpu.empty((2,), dtype)
    if "big-endian" not in str(refused.value):  # that one says the little-endian spelling to give
        assert "bfloat16" in str(refused.value) and "float32" in str(refused.value)  # what it takes


def test_a_dtype_of_no_kind_is_a_type_error(cpu):
    for wrong in (5, None, 1.5, ["float32"]):
        with pytest.raises(TypeError, match=r"dtype .* give a devbuf dtype name") as refused:
            cpu.empty((2,), wrong)
        assert isinstance(refused.value, devbuf.InvalidArgumentError)


def run_python(code):
    """Runs `code` in a fresh interpreter that imports this devbuf."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_package_does_not_import_numpy():
    out = run_python("import sys, devbuf\n"
                     "devbuf.Device('cpu').empty((2,), 'float32'); devbuf.Device('cpu').empty((2,), 'BF16')\n"
                     "print('numpy' in sys.modules)")
    assert out.strip() == "False"


def test_without_numpy_names_and_python_types_still_work():
    out = run_python("import sys\n"
                     "sys.modules['numpy'] = None  # as if numpy were not installed\n"
                     "import devbuf\n"
                     "cpu = devbuf.Device('cpu')\n"
                     "print(cpu.empty(2, 'float32').dtype, cpu.empty(2, 'F16').dtype, cpu.empty(2, float).dtype,\n"
                     "      cpu.empty(2, 'float8_e4m3fn').dtype)\n"
                     "try:\n"
                     "    cpu.empty(2, 'f4')\n"
                     "except devbuf.InvalidArgumentError as refused:\n"
                     "    print(refused)\n")
    first, refusal = out.splitlines()
    assert first == "float32 float16 float64 float8_e4m3"
    assert "'f4'" in refusal and "numpy" in refusal


# ---- indexing ---------------------------------------------------------------------------------
MATRIX_KEYS = [0, 1, 3, -1, -4, np.int64(2), slice(1, 3), slice(None, 2), slice(2, None), slice(-3, -1),
               slice(2, 100), slice(-100, 2), slice(3, 1), slice(4, None), slice(None), ..., (), (1,), (1, 2),
               (-1, -1), (1, slice(2, 4)), (2, slice(None)), (1, ...), (..., slice(None)), (slice(1, 2), 3),
               (slice(None), slice(None)), (None, 1), (1, None)]


@pytest.fixture
def matrix(cpu):
    array = np.arange(24, dtype=np.float32).reshape(4, 6)
    return array, cpu.asbuffer(array)


@pytest.mark.parametrize("key", MATRIX_KEYS, ids=repr)
def test_indexing_gives_what_numpy_gives(matrix, key):
    array, buffer = matrix
    view = buffer[key]
    expected = array[key]
    assert view.shape == expected.shape and view.dtype == "float32"
    assert view.storage_id == buffer.storage_id  # a view, not a copy
    assert view.to_bytes() == expected.tobytes()
    np.testing.assert_array_equal(np.from_dlpack(view), expected)


def test_rows_of_a_matrix(matrix):
    array, buffer = matrix
    row = buffer[1]
    assert row.shape == (6,) and row.offset == 24
    assert buffer[1:3].shape == (2, 6) and buffer[1:3].offset == 24
    assert buffer[-1].offset == 3 * 24
    assert [r.to_bytes() for r in buffer] == [r.tobytes() for r in array]


def test_three_axes(cpu):
    array = np.arange(2 * 3 * 4, dtype=np.int16).reshape(2, 3, 4)
    buffer = cpu.asbuffer(array)
    for key in [1, -2, slice(0, 1), (1, 2), (1, -1, 3), (0, slice(1, 3)), (1, ..., slice(None)), (..., ),
                (0, 1, slice(1, 3))]:
        assert buffer[key].to_bytes() == array[key].tobytes(), key
        assert buffer[key].shape == array[key].shape, key


def test_views_write_through(cpu, matrix):
    array, buffer = matrix
    queue = cpu.queue()
    queue.fill(buffer[2], 7.0)
    queue.finish()
    array[2] = 7.0
    np.testing.assert_array_equal(np.from_dlpack(buffer), array)


@pytest.mark.parametrize("key,message", [
    (4, r"buf\[4\]: index 4 is out of range for axis 0 of size 4"),
    (-5, r"index -5 is out of range for axis 0 of size 4"),
    ((0, 6), r"index 6 is out of range for axis 1 of size 6"),
    ((1, 2, 3), r"too many indices for a 2-d buffer"),
])
def test_out_of_range_is_an_index_error(matrix, key, message):
    with pytest.raises(IndexError, match=message) as refused:
        matrix[1][key]
    assert isinstance(refused.value, devbuf.OutOfRangeError)


@pytest.mark.parametrize("key,message", [
    (slice(None, None, 2), r"buf\[::2\]: the slice ::2 is not contiguous \(step 2\)"),
    (slice(3, 0, -1), r"the slice 3:0:-1 is not contiguous \(step -1\)"),
    ((slice(None), 0), r"buf\[:, 0\] is not contiguous"),
    ((slice(1, 3), slice(0, 2)), r"buf\[1:3, 0:2\] is not contiguous"),
    ([0, 2], r"an index array gathers elements"),
    (np.array([True, False, True, True]), r"a boolean index is a mask"),
    ((..., ...), r"one ellipsis"),
])
def test_selections_that_are_not_contiguous_are_refused(matrix, key, message):
    with pytest.raises(devbuf.InvalidArgumentError, match=message):
        matrix[1][key]


def test_a_0d_buffer_has_no_axis_to_index(cpu):
    scalar = cpu.zeros((), "float32")
    with pytest.raises(IndexError, match=r"buf\[0\]: a 0-d buffer has no axis to index"):
        scalar[0]
    with pytest.raises(IndexError, match="0-d"):
        scalar[0:1]
    with pytest.raises(TypeError, match="iteration over a 0-d buffer"):
        iter(scalar)
    assert scalar[...].shape == () and scalar[()].shape == ()  # numpy's whole-array indices


def test_sub_byte_dtypes_index_whole_bytes(cpu):
    packed = cpu.zeros((8,), "float4_e2m1")
    assert packed[2:6].shape == (4,) and packed[2:6].offset == 1
    with pytest.raises(devbuf.InvalidArgumentError, match="inside a byte"):
        packed[1]


def test_byte_view(matrix):
    array, buffer = matrix
    view = buffer.byte_view(8, 16)  # bytes 8..23: elements 2..5 of the first row
    assert view.shape == (4,) and view.offset == 8 and view.storage_id == buffer.storage_id
    np.testing.assert_array_equal(np.from_dlpack(view), array.ravel()[2:6])
    with pytest.raises(devbuf.OutOfRangeError):
        buffer.byte_view(90, 8)
    with pytest.deprecated_call(match="byte_view"):
        old = buffer.view(8, 16)
    assert old.shape == view.shape and old.offset == view.offset


def test_whole_views_keep_their_shape(matrix):
    _, buffer = matrix
    assert devbuf.from_dlpack(buffer).shape == (4, 6)
    assert buffer.read_only_export().shape == (4, 6)


def test_repr_says_dtype_shape_and_device(matrix, cpu):
    _, buffer = matrix
    text = repr(buffer)
    assert text.startswith("<devbuf.Buffer float32[4, 6] on cpu ") and text.endswith(">")
    assert "offset=0" in text and "size=96" in text and f"id={buffer.storage_id}" in text
    assert repr(buffer[1]).startswith("<devbuf.Buffer float32[6] on cpu ") and "offset=24" in repr(buffer[1])
    assert repr(cpu.zeros((), "bfloat16")).startswith("<devbuf.Buffer bfloat16[] on cpu ")
    buffer.close()
    assert repr(buffer) == "<devbuf.Buffer (closed)>"


# ---- wrong-typed arguments ----------------------------------------------------------------------
def wrong_calls(cpu, tmp_path):
    buffer = cpu.zeros((4,), "float32")
    queue = cpu.queue()
    event = devbuf.Event()
    path = str(tmp_path / "t.safetensors")
    return [
        (lambda: devbuf.Device(5), r"spec 5 \(int\): give a device spec"),
        (lambda: cpu.empty("abc"), r"shape 'abc' \(str\): give an integer or a sequence of integers"),
        (lambda: cpu.zeros(None), r"shape None \(NoneType\)"),
        (lambda: cpu.empty((2,), 7), r"dtype 7 \(int\): give a devbuf dtype name"),
        (lambda: cpu.asbuffer("abc"), r"data 'abc' \(str\): give a devbuf.Buffer, an array with __dlpack__"),
        (lambda: buffer.copy_from("abc"), r"source 'abc' \(str\): give a devbuf.Buffer or a bytes-like object"),
        (lambda: buffer.copy(device=5), r"device 5 \(int\): give a devbuf.Device or a device spec"),
        (lambda: buffer.reshape("x"), r"shape 'x' \(str\)"),
        (lambda: buffer.reshape((4,), 3.5), r"dtype 3.5 \(float\)"),
        (lambda: buffer.byte_view("0", 4), r"offset '0' \(str\): give an integer"),
        (lambda: buffer.byte_view(0, None), r"nbytes None \(NoneType\): give an integer"),
        (lambda: buffer[1.5], r"index 1.5 \(float\): give integers, slices"),
        (lambda: buffer["a"], r"index 'a' \(str\)"),
        (lambda: buffer[0:"a"], r"slice bound"),
        (lambda: queue.fill(buffer, "abc"), r"pattern 'abc' \(str\): give bytes \(a bytes-like object\) or a number"),
        (lambda: queue.fill("x", 1.0), r"buffer 'x' \(str\): give a devbuf.Buffer"),
        (lambda: queue.signal(event, "1"), r"value '1' \(str\): give an integer"),
        (lambda: queue.wait(event, None), r"value None \(NoneType\): give an integer"),
        (lambda: devbuf.Event("0"), r"initial value '0' \(str\): give an integer"),
        (lambda: event.signal([1]), r"value \[1\] \(list\): give an integer"),
        (lambda: cpu.set_limits(memory="1G"), r"memory limit '1G' \(str\): give an integer"),
        (lambda: devbuf.from_dlpack(object()), r"source <object object .*> \(object\): give an object with __dlpack__"),
        (lambda: devbuf.load(5), r"path 5 \(int\): give a file path"),
        (lambda: devbuf.load(path, device=0), r"device 0 \(int\): give a devbuf.Device or a device spec"),
        (lambda: devbuf.load(path, names="w"), r"names 'w' \(str\): give an iterable of tensor names"),
        (lambda: devbuf.load(path, names=[b"w"]), r"a tensor name in names b'w' \(bytes\): give a str"),
        (lambda: devbuf.save(None, {"w": buffer}), r"path None \(NoneType\): give a file path"),
        (lambda: devbuf.save(path, [buffer]), r"tensors \[.* \(list\): give a mapping of names"),
        (lambda: devbuf.save(path, {1: buffer}), r"a tensor name in tensors 1 \(int\): give a str"),
        (lambda: devbuf.save(path, {"w": object()}), r"tensor 'w' <object object .*> \(object\): give a devbuf.Buffer"),
        (lambda: devbuf.save(path, {"w": buffer}, metadata=[("a", "b")]), r"metadata \[.* \(list\): give a mapping"),
        (lambda: devbuf.save(path, {"w": buffer}, metadata={"a": 1}), r"metadata entry 'a' 1 \(int\): give str keys"),
    ]


def test_wrong_types_name_the_argument(cpu, tmp_path):
    for call, message in wrong_calls(cpu, tmp_path):
        with pytest.raises(TypeError, match=message) as refused:
            call()
        assert isinstance(refused.value, devbuf.InvalidArgumentError), message  # the package's class too
        assert isinstance(refused.value, devbuf.ArgumentTypeError)


def test_values_of_the_right_type_still_work(cpu, tmp_path):
    buffer = cpu.zeros((2, 2), "float32")
    queue = cpu.queue()
    queue.fill(buffer, np.float32(1.5))  # numpy scalars are numbers
    queue.fill(buffer[1], np.array([2.5], dtype=np.float32))  # and arrays are bytes
    queue.finish()
    np.testing.assert_array_equal(np.from_dlpack(buffer), [[1.5, 1.5], [2.5, 2.5]])
    assert cpu.empty(np.int64(3), np.float16).shape == (3,)
    assert buffer.byte_view(np.uint8(4), 4).offset == 4
    path = tmp_path / "t.safetensors"
    devbuf.save(path, {"w": buffer})
    assert devbuf.load(path, names=(n for n in ["w"]))["w"].shape == (2, 2)


def test_messages_quote_the_index_as_written(matrix):
    _, buffer = matrix
    with pytest.raises(devbuf.InvalidArgumentError) as refused:
        buffer[1:3, ::2]
    assert re.search(r"buf\[1:3, ::2\]", str(refused.value))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # indexing itself warns of nothing
        buffer[1:3]


# ---- what the differential probe against numpy found ------------------------------------------
@pytest.mark.parametrize("shape,key", [
    ((4, 1), (slice(None), 0)), ((3, 3, 1), (..., -1)), ((12, 1), (slice(None), None, 0)),
    ((3, 11), (slice(None), slice(None, 0))), ((3, 11), (slice(None), slice(5, 2))),
    ((4, 1, 5), (slice(None, 2), slice(None), slice(5, None))), ((2, 1, 1, 3), (1, slice(None), 0)),
    ((5, 0, 3), (slice(1, 4), slice(None), 1)),
], ids=repr)
def test_selections_that_skip_nothing_are_views(cpu, shape, key):
    array = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    buffer = cpu.asbuffer(array)
    view = buffer[key]
    assert view.shape == array[key].shape and view.to_bytes() == array[key].tobytes()
    assert view.storage_id == buffer.storage_id


def test_every_index_is_checked_before_contiguity(cpu):
    buffer = cpu.zeros((6, 4, 1), "int8")
    with pytest.raises(devbuf.OutOfRangeError, match="index -3 is out of range for axis 2 of size 1"):
        buffer[..., 2, -3]


def test_empty_selections_of_sub_byte_dtypes(cpu):
    packed = cpu.zeros((4,), "float6_e3m2")
    assert packed[3:0].shape == (0,) and packed[3:0].to_bytes() == b""


@pytest.mark.parametrize("key", [np.array([0, 1]), np.array([1]), np.array([[0]]), [1]], ids=repr)
def test_index_arrays_are_refused_as_gathers(matrix, key):
    with pytest.raises(devbuf.InvalidArgumentError, match="an index array gathers elements"):
        matrix[1][key]


def test_a_slice_step_of_zero_is_refused(matrix):
    with pytest.raises(devbuf.InvalidArgumentError, match=r"the slice 0:2:0 is not contiguous \(step 0\)"):
        matrix[1][0:2:0]


@pytest.mark.parametrize("name", ["F32\0garbage", "BF16\0x", "I8\0", "float32\0"])
def test_dtype_names_with_nul_bytes_are_refused(cpu, name):
    with pytest.raises(devbuf.InvalidArgumentError, match="NUL byte"):
        cpu.empty(3, name)


@pytest.mark.parametrize("shape", [(2.0, 3), (True, 2), [3.0], True, np.array([True, True])], ids=repr)
def test_shapes_take_integers_only(cpu, shape):
    with pytest.raises(devbuf.ArgumentTypeError, match="give an integer"):
        cpu.empty(shape, "int8")


def test_to_bytes_beyond_python_is_out_of_memory(cpu):
    huge = cpu.empty(2**63 - 1, "uint8")  # lazy: nothing is allocated
    with pytest.raises(devbuf.OutOfMemoryError, match=r"to_bytes: .* 9223372036854775807 bytes"):
        huge.to_bytes()


@pytest.mark.parametrize("dtype", ["float16", "complex64"])
def test_asbuffer_copies_strided_arrays_of_every_format(cpu, dtype):
    array = (np.arange(12) * (1.5 + (1j if dtype == "complex64" else 0))).astype(dtype).reshape(3, 4)
    for source in (array[:, ::2], array[::-1], memoryview(array)):
        expected = np.ascontiguousarray(np.asarray(source))
        copied = cpu.asbuffer(source)
        assert copied.dtype == dtype and copied.shape == expected.shape
        assert copied.to_bytes() == expected.tobytes()
