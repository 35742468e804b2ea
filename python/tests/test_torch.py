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
