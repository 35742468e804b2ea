"""PyTorch reads devbuf buffers in place and devbuf reads torch tensors, where torch is
installed (the test suite does not download it)."""
import pytest

import devbuf

torch = pytest.importorskip("torch", reason="torch is not installed (not downloaded by the test suite)")


def test_torch_round_trip(cpu):
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    buffer = devbuf.from_dlpack(tensor)
    assert buffer.shape == (3, 4) and buffer.device_ptr == tensor.data_ptr()
    back = torch.from_dlpack(buffer)
    assert back.data_ptr() == tensor.data_ptr() and torch.equal(back, tensor)
    fresh = cpu.zeros((5,), "bfloat16")
    assert torch.from_dlpack(fresh).dtype == torch.bfloat16


def test_torch_writes_to_a_loaded_file_stay_in_the_process(cpu, tmp_path):
    """torch ignores DLPack's read-only flag and hands out a writable tensor over a loaded
    file's mapping: its writes go to copy-on-write pages of this process (as with
    safetensors' own loader), never to the file, and never fault. devbuf itself still
    refuses every write to the buffer."""
    path = tmp_path / "weights.safetensors"
    devbuf.save(path, {"w": cpu.zeros((1024,), "float32")})
    before = path.read_bytes()
    weights = devbuf.load(path)
    tensor = torch.from_dlpack(weights["w"])
    tensor[:] = 3.0  # a SIGSEGV here once (the mapping was read-only)
    assert torch.all(tensor == 3.0)
    assert path.read_bytes() == before
    assert devbuf.load(path)["w"].to_bytes() == bytes(4096)  # a fresh load sees the file
    with pytest.raises(devbuf.ReadOnlyError):
        with weights["w"].write():
            pass
    del tensor


def opencl_or_skip():
    try:
        return devbuf.Device("opencl:0")
    except devbuf.DevbufError as missing:
        pytest.skip(f"no opencl:0: {missing}")


def test_torch_failing_on_an_opencl_buffer_deletes_it_once():
    """torch.from_dlpack of a device it cannot use calls the capsule's deleter itself and
    leaves the capsule's name as it was: the export is deleted once, whatever the capsule's
    destructor does after that, and the buffer's host access is gone."""
    device = opencl_or_skip()
    buffer = device.zeros((256,), "float32")
    for _ in range(20):
        with pytest.raises(Exception):
            torch.from_dlpack(buffer)
    with device.queue() as queue:  # no export is left holding the buffer
        queue.fill(buffer, 2.0)
    assert buffer.to_bytes() == bytes.fromhex("00000040") * 256
