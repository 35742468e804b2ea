"""devbuf.load / devbuf.save, interchangeable with the reference safetensors package."""
import os

import pytest

import devbuf

np = pytest.importorskip("numpy", reason="numpy is not installed (scripts/python_env.sh installs it)")
st = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed (scripts/python_env.sh)")

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64"]


def tensors():
    out = {}
    for i, dtype in enumerate(DTYPES):
        values = np.arange(i * 7, i * 7 + 24).reshape(2, 3, 4)
        out[f"layer.{i}.{dtype}"] = (values % 3 == 0) if dtype == "bool" else values.astype(dtype)
    out["scalar"] = np.array(2.5, dtype=np.float32)
    out["empty"] = np.zeros((0, 3), dtype=np.int32)
    return out


def test_devbuf_writes_what_safetensors_reads(tmp_path):
    path = tmp_path / "devbuf.safetensors"
    devbuf.save(path, tensors(), metadata={"format": "np", "by": "devbuf"})
    read = st.load_file(str(path))
    assert set(read) == set(tensors())
    for name, expected in tensors().items():
        np.testing.assert_array_equal(read[name], expected)
        assert read[name].dtype == expected.dtype
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as opened:
        assert opened.metadata() == {"format": "np", "by": "devbuf"}
    assert os.listdir(tmp_path) == ["devbuf.safetensors"]  # no temporary file left


def test_devbuf_reads_what_safetensors_writes(tmp_path):
    path = tmp_path / "reference.safetensors"
    st.save_file(tensors(), str(path), metadata={"k": "v"})
    loaded = devbuf.load(path)
    assert isinstance(loaded, devbuf.TensorFile) and len(loaded) == len(tensors())
    assert set(loaded) == set(tensors()) and loaded.metadata == {"k": "v"}
    for name, expected in tensors().items():
        buffer = loaded[name]
        assert buffer.is_mapped and buffer.read_only and buffer.shape == expected.shape
        array = np.from_dlpack(buffer)
        np.testing.assert_array_equal(array, expected)
        assert array.dtype == expected.dtype
    assert "layer.0.bool" in loaded and "missing" not in loaded
    with pytest.raises(KeyError):
        loaded["missing"]


def test_buffers_outlive_the_table_and_the_file(tmp_path):
    path = tmp_path / "m.safetensors"
    st.save_file({"w": np.arange(10, dtype=np.float32)}, str(path))
    with devbuf.load(path) as loaded:
        weight = loaded["w"]
    os.unlink(path)
    np.testing.assert_array_equal(np.from_dlpack(weight), np.arange(10, dtype=np.float32))
    with pytest.raises(devbuf.InvalidArgumentError):
        loaded["w"]


def test_copies_are_writable(tmp_path, cpu):
    path = tmp_path / "m.safetensors"
    st.save_file({"w": np.arange(4, dtype=np.int64)}, str(path))
    weight = devbuf.load(path, device=cpu, copy=True)["w"]
    assert not weight.is_mapped and not weight.read_only
    with weight.write() as view:
        view[0] = 41
    assert np.frombuffer(weight.to_bytes(), np.int64).tolist() == [41, 1, 2, 3]


def test_load_some_tensors_in_one_allocation(tmp_path, cpu):
    path = tmp_path / "m.safetensors"
    st.save_file(tensors(), str(path))
    wanted = ["layer.10.float32", "layer.3.int32", "scalar"]
    for copy in (False, True):
        loaded = devbuf.load(path, device=cpu, copy=copy, names=wanted, one_allocation=True)
        assert sorted(loaded) == sorted(wanted) and len(loaded) == 3
        assert "layer.0.bool" not in loaded
        with pytest.raises(KeyError):
            loaded["layer.0.bool"]  # in the file, not loaded
        for name in wanted:
            np.testing.assert_array_equal(np.from_dlpack(loaded[name]), tensors()[name])
            assert loaded[name].is_mapped != copy
        if copy:  # one storage for the three copies
            assert len({loaded[name].storage_id for name in wanted}) == 1


def test_save_takes_every_kind_of_array(tmp_path, cpu):
    path = tmp_path / "mixed.safetensors"
    strided = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    devbuf.save(path, {"buffer": cpu.asbuffer(np.arange(3, dtype=np.int16)), "strided": strided,
                       "bytes": bytearray(b"abc"), "view": memoryview(np.arange(4, dtype=np.uint32))})
    read = st.load_file(str(path))
    np.testing.assert_array_equal(read["strided"], strided)
    np.testing.assert_array_equal(read["buffer"], np.arange(3, dtype=np.int16))
    assert read["bytes"].tobytes() == b"abc" and read["view"].tolist() == [0, 1, 2, 3]


def test_broken_files_are_refused_by_name(tmp_path):
    path = tmp_path / "broken.safetensors"
    st.save_file({"w": np.arange(4, dtype=np.float32)}, str(path))
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data[:-4]))  # the data section ends short
    with pytest.raises(devbuf.FormatError) as broken:
        devbuf.load(path)
    assert "w" in broken.value.message
    with pytest.raises(devbuf.DevbufIOError):
        devbuf.load(tmp_path / "absent.safetensors")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(devbuf.DevbufIOError) as fifo:
        devbuf.load(tmp_path / "fifo")
    assert "FIFO" in fifo.value.message


def test_failed_saves_leave_the_old_file(tmp_path):
    path = tmp_path / "m.safetensors"
    st.save_file({"old": np.arange(2, dtype=np.int8)}, str(path))
    with pytest.raises(devbuf.DevbufError):
        devbuf.save(path, {"__metadata__": np.arange(2, dtype=np.int8)})
    with pytest.raises(devbuf.InvalidArgumentError):
        devbuf.save(path, {"x": np.arange(2)}, metadata={"k": 3})
    assert list(st.load_file(str(path))) == ["old"]
    assert os.listdir(tmp_path) == ["m.safetensors"]
