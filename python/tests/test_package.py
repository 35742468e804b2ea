"""The package itself: its version, devices and their facts."""
import os
import re

import pytest

import devbuf

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_version_is_the_library_version():
    header = open(os.path.join(ROOT, "include", "devbuf.h")).read()
    parts = [re.search(rf"#define DEVBUF_VERSION_{p} (\d+)", header).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    assert devbuf.__version__ == ".".join(parts)


def test_devices_start_with_the_cpu():
    found = devbuf.devices()
    assert found[0].spec == "cpu" and found[0].kind == "cpu"
    assert len({d.spec for d in found}) == len(found)
    for device in found:  # a kind's name is its specs' prefix
        assert device.spec.partition(":")[0] == device.kind


def test_device_facts(cpu):
    assert cpu == devbuf.Device("cpu:0")
    assert cpu.page_size >= 4096 and cpu.page_size & (cpu.page_size - 1) == 0
    info = cpu.info
    assert info["host_unified"] is True and info["global_memory"] > 0 and info["name"]
    assert info["processor"] == "cpu"
    assert info["capabilities"] == {"queues", "c-kernels", "sharing", "growable-segments"}
    assert "cpu" in repr(cpu)


def test_missing_and_malformed_devices():
    with pytest.raises(devbuf.InvalidArgumentError) as malformed:
        devbuf.Device("tpu:0")
    assert "tpu:0" in str(malformed.value)
    try:
        devbuf.Device("cuda:0")
    except devbuf.UnavailableError as missing:
        assert missing.status == "UNAVAILABLE" and missing.message
    else:
        pytest.skip("a CUDA device is here: its absence cannot be tested")


def test_every_dtype_of_the_library_has_a_name():
    assert devbuf.dtypes[:3] == ("bool", "int8", "int16") and "bfloat16" in devbuf.dtypes
    for name in devbuf.dtypes:
        assert devbuf.Device("cpu").empty((2, 8), name).dtype == name


def test_typed_package_ships_its_marker():
    import devbuf as package

    assert os.path.exists(os.path.join(os.path.dirname(package.__file__), "py.typed"))
