#!/usr/bin/env python3
"""Cross-checks devbuf against the reference implementations, through ctypes.

- Files the reference `safetensors` package writes are read by devbuf bit-exact, and files
  devbuf writes (every dtype) are read by the reference reader bit-exact.
- numpy reads a devbuf DLPack export with np.from_dlpack without a copy; devbuf imports a
  numpy array without a copy, and lets it go on the last release.

usage: test_interop.py LIBDEVBUF_SO SCRATCH_DIR
Exits 77 (skipped) with the reason when numpy or safetensors is missing.
"""
import ctypes
import gc
import os
import shutil
import sys
import tempfile

try:
    import numpy as np
    import safetensors
    from safetensors import deserialize, serialize
    from safetensors.numpy import save_file, safe_open
except ImportError as missing:
    print(f"SKIP: {missing}; scripts/test.sh installs numpy and safetensors into build/pyenv")
    sys.exit(77)

lib = ctypes.CDLL(sys.argv[1])
scratch = tempfile.mkdtemp(dir=sys.argv[2] if len(sys.argv) > 2 else None)
failures = 0
P = ctypes.c_void_p

# devbuf's dtypes in enum order, with their safetensors names and bits.
DTYPES = [("BOOL", 8), ("I8", 8), ("I16", 16), ("I32", 32), ("I64", 64), ("U8", 8), ("U16", 16),
          ("U32", 32), ("U64", 64), ("F16", 16), ("BF16", 16), ("F32", 32), ("F64", 64), ("C64", 64),
          ("F8_E4M3", 8), ("F8_E5M2", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8),
          ("F6_E2M3", 6), ("F6_E3M2", 6), ("F4", 4)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_size_t),
                ("shape", ctypes.POINTER(ctypes.c_size_t)), ("begin", ctypes.c_uint64),
                ("end", ctypes.c_uint64), ("file_offset", ctypes.c_uint64)]


class NamedBuffer(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("buffer", P)]


class MetadataEntry(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("value", ctypes.c_char_p)]


def declare(name, restype, *argtypes):
    function = getattr(lib, name)
    function.restype = restype
    function.argtypes = list(argtypes)


declare("devbuf_last_error", ctypes.c_char_p)
declare("devbuf_device_open", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(P))
declare("devbuf_device_allocator", P, P)
declare("devbuf_buffer_allocate", ctypes.c_int, P, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
        ctypes.c_uint32, ctypes.POINTER(P))
declare("devbuf_buffer_copyin", ctypes.c_int, P, ctypes.c_char_p, ctypes.c_size_t)
declare("devbuf_buffer_copyout", ctypes.c_int, P, P, ctypes.c_size_t)
declare("devbuf_buffer_size", ctypes.c_size_t, P)
declare("devbuf_buffer_dtype", ctypes.c_int, P)
declare("devbuf_buffer_release", None, P)
declare("devbuf_buffer_device_ptr", ctypes.c_int, P, ctypes.POINTER(ctypes.c_uint64))
declare("devbuf_buffer_open_accesses", ctypes.c_size_t, P)
declare("devbuf_buffer_is_read_only", ctypes.c_int, P)
declare("devbuf_safetensors_write", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(NamedBuffer), ctypes.c_size_t,
        ctypes.POINTER(MetadataEntry), ctypes.c_size_t)
declare("devbuf_safetensors_load", ctypes.c_int, P, ctypes.c_char_p, P, ctypes.POINTER(P))
declare("devbuf_tensor_file_count", ctypes.c_size_t, P)
declare("devbuf_tensor_file_info", ctypes.c_int, P, ctypes.c_size_t, ctypes.POINTER(TensorInfo))
declare("devbuf_tensor_file_buffer", P, P, ctypes.c_size_t)
declare("devbuf_tensor_file_metadata_get", ctypes.c_char_p, P, ctypes.c_char_p)
declare("devbuf_tensor_file_release", None, P)
declare("devbuf_buffer_to_dlpack_versioned", ctypes.c_int, P, ctypes.c_uint32, ctypes.POINTER(P))
declare("devbuf_buffer_to_dlpack", ctypes.c_int, P, ctypes.c_uint32, ctypes.POINTER(P))
declare("devbuf_buffer_from_dlpack_versioned", ctypes.c_int, P, ctypes.POINTER(P))
declare("devbuf_buffer_from_dlpack", ctypes.c_int, P, ctypes.POINTER(P))


def check(condition, what):
    global failures
    if not condition:
        failures += 1
        print(f"  CHECK failed: {what}")


def ok(status, what):
    check(status == 0, f"{what}: {lib.devbuf_last_error().decode()}")
    return status == 0


device = P()
assert lib.devbuf_device_open(b"cpu", ctypes.byref(device)) == 0
allocator = lib.devbuf_device_allocator(device)


def new_buffer(dtype_index, shape, data):
    dims = (ctypes.c_size_t * max(1, len(shape)))(*shape)
    buffer = P()
    ok(lib.devbuf_buffer_allocate(allocator, dtype_index, dims, len(shape), 0, ctypes.byref(buffer)), "allocate")
    ok(lib.devbuf_buffer_copyin(buffer, data, len(data)), "copyin")
    return buffer


def buffer_bytes(buffer):
    size = lib.devbuf_buffer_size(buffer)
    out = ctypes.create_string_buffer(max(1, size))
    ok(lib.devbuf_buffer_copyout(buffer, out, size), "copyout")
    return out.raw[:size]


def load(path):
    """{name: (dtype name, shape, bytes)} and metadata 'k' read by devbuf."""
    table = P()
    if not ok(lib.devbuf_safetensors_load(device, path.encode(), None, ctypes.byref(table)), f"load {path}"):
        return {}, None
    result = {}
    for i in range(lib.devbuf_tensor_file_count(table)):
        info = TensorInfo()
        ok(lib.devbuf_tensor_file_info(table, i, ctypes.byref(info)), "info")
        shape = [info.shape[d] for d in range(info.ndim)]
        result[info.name.decode()] = (DTYPES[info.dtype][0], shape, buffer_bytes(lib.devbuf_tensor_file_buffer(table, i)))
    metadata = lib.devbuf_tensor_file_metadata_get(table, b"k")
    lib.devbuf_tensor_file_release(table)
    return result, metadata


def noise(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_reference_files_read_by_devbuf():
    # numpy arrays through safetensors.numpy.save_file
    arrays = {"bool": np.array([[True, False, True]]), "u8": np.arange(7, dtype=np.uint8),
              "i16": -np.arange(6, dtype=np.int16).reshape(2, 3), "u32": np.arange(5, dtype=np.uint32) * 7919,
              "i64": np.array(-3, dtype=np.int64), "f16": np.linspace(-1, 1, 9, dtype=np.float16),
              "f32": np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32),
              "f64": np.random.default_rng(2).standard_normal(3), "c64": np.array([1 + 2j, -3j], dtype=np.complex64),
              "empty": np.zeros((0, 4), dtype=np.float32), "u64": np.array([2**64 - 1], dtype=np.uint64),
              "i8": np.array([-128, 127], dtype=np.int8), "u16": np.array([65535], dtype=np.uint16),
              "i32": np.array([[-(2**31)]], dtype=np.int32)}
    path = os.path.join(scratch, "numpy.safetensors")
    save_file(arrays, path, metadata={"k": "numpy"})
    names = {"bool": "BOOL", "uint8": "U8", "int16": "I16", "uint32": "U32", "int64": "I64", "float16": "F16",
             "float32": "F32", "float64": "F64", "complex64": "C64", "uint64": "U64", "int8": "I8",
             "uint16": "U16", "int32": "I32"}
    table, metadata = load(path)
    check(metadata == b"numpy", f"metadata {metadata}")
    check(set(table) == set(arrays), f"names {sorted(table)}")
    for name, array in arrays.items():
        dtype, shape, data = table.get(name, (None, None, None))
        check(dtype == names[array.dtype.name], f"{name} dtype {dtype}")
        check(shape == list(array.shape), f"{name} shape {shape}")
        check(data == array.tobytes(), f"{name} bytes")
    # Every dtype the reference writer knows (all but the 6-bit floats), from raw bytes.
    writer_names = {"bool": "BOOL", "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16", "int32": "I32",
                    "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16", "float32": "F32",
                    "float64": "F64", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3",
                    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2": "F8_E5M2", "float8_e5m2fnuz": "F8_E5M2FNUZ",
                    "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4", "complex64": "C64"}
    bits = dict(DTYPES)
    specs, keep, expected = {}, [], {}
    for seed, (kind, code) in enumerate(writer_names.items()):
        size = 24 * bits[code] // 8
        data = noise(size, seed)
        keep.append(ctypes.create_string_buffer(data, size))
        # the writer takes float4 pairs in their storage shape and doubles the last dimension
        shape = [3, 4] if code == "F4" else [3, 8]
        specs[f"r.{kind}"] = safetensors.TensorSpec(dtype=kind, shape=shape, data_ptr=ctypes.addressof(keep[-1]),
                                                    data_len=size)
        expected[f"r.{kind}"] = (code, [3, 8], data)
    path = os.path.join(scratch, "raw.safetensors")
    with open(path, "wb") as out:
        out.write(serialize(specs, metadata={"k": "raw"}))
    table, metadata = load(path)
    check(metadata == b"raw", f"metadata {metadata}")
    check(set(table) == set(expected), f"names {sorted(table)}")
    for name, want in expected.items():
        check(table.get(name) == want, f"{name}: {table.get(name, '')!r:.80}")


def test_devbuf_files_read_by_reference():
    shape = [3, 8]  # 24 elements: whole bytes for 4- and 6-bit types
    expected = {}
    named = (NamedBuffer * len(DTYPES))()
    buffers = []
    for index, (name, bits) in enumerate(DTYPES):
        data = noise(24 * bits // 8, index)
        buffers.append(new_buffer(index, shape, data))
        tensor_name = f"t.{name.lower()}.\u00e9"
        named[index] = NamedBuffer(tensor_name.encode(), buffers[-1])
        expected[tensor_name] = (name, shape, data)
    metadata = (MetadataEntry * 2)(MetadataEntry(b"k", "v\u20ac \"q\"\n".encode()), MetadataEntry(b"format", b"np"))
    path = os.path.join(scratch, "devbuf.safetensors")
    ok(lib.devbuf_safetensors_write(path.encode(), named, len(DTYPES), metadata, 2), "write")
    with open(path, "rb") as f:
        read = deserialize(f.read())
    check(len(read) == len(DTYPES), f"{len(read)} tensors")
    for name, info in read:
        check(expected.get(name) == (info["dtype"], info["shape"], bytes(info["data"])), f"{name} differs")
    with safe_open(path, framework="np") as f:
        check(f.metadata() == {"k": "v\u20ac \"q\"\n", "format": "np"}, f"metadata {f.metadata()}")
        f32 = f.get_tensor("t.f32.\u00e9")
        check(f32.dtype == np.float32 and f32.tobytes() == expected["t.f32.\u00e9"][2], "numpy f32")
    for buffer in buffers:
        lib.devbuf_buffer_release(buffer)


# ---- DLPack: capsules made and taken through the CPython API -----------------------------
api = ctypes.pythonapi
Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
api.PyCapsule_New.restype = ctypes.py_object
api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, Destructor]
api.PyCapsule_IsValid.restype = ctypes.c_int
api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.restype = ctypes.c_int
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# Capsule names must outlive the capsules: module-level bytes.
VERSIONED, LEGACY = b"dltensor_versioned", b"dltensor"
USED_VERSIONED, USED_LEGACY = b"used_dltensor_versioned", b"used_dltensor"
Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


# The same functions taking a raw PyObject*: a capsule being destroyed must not be referenced.
raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", api))
raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", api))


def capsule_destructor(name, deleter_offset):
    """Calls the tensor's deleter if no consumer took the capsule (it still has its name)."""
    def destroy(capsule):
        if raw_is_valid(capsule, name):
            tensor = raw_get_pointer(capsule, name)
            deleter = ctypes.c_void_p.from_address(tensor + deleter_offset).value
            if deleter:
                Deleter(deleter)(tensor)
    return Destructor(destroy)


DESTROY_VERSIONED = capsule_destructor(VERSIONED, 16)  # version, manager_ctx, deleter
DESTROY_LEGACY = capsule_destructor(LEGACY, 48 + 8)    # DLTensor (48 bytes), manager_ctx, deleter


class Exported:
    """A devbuf buffer offered to consumers through the DLPack protocol."""

    def __init__(self, buffer, flags=0):
        self.buffer, self.flags = buffer, flags

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        tensor = P()
        if max_version is not None and max_version[0] >= 1:
            ok(lib.devbuf_buffer_to_dlpack_versioned(self.buffer, self.flags, ctypes.byref(tensor)), "export")
            return api.PyCapsule_New(tensor, VERSIONED, DESTROY_VERSIONED)
        ok(lib.devbuf_buffer_to_dlpack(self.buffer, self.flags, ctypes.byref(tensor)), "export")
        return api.PyCapsule_New(tensor, LEGACY, DESTROY_LEGACY)


def test_numpy_reads_devbuf_export():
    values = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5
    buffer = new_buffer(11, [3, 4], values.tobytes())  # float32
    address = ctypes.c_uint64()
    lib.devbuf_buffer_device_ptr(buffer, ctypes.byref(address))
    array = np.from_dlpack(Exported(buffer))
    check(array.ctypes.data == address.value, "numpy's array is devbuf's memory (no copy)")
    check(array.shape == (3, 4) and array.dtype == np.float32 and np.array_equal(array, values), "values")
    check(lib.devbuf_buffer_open_accesses(buffer) == 1, "the export holds an access while numpy uses it")
    array[2, 3] = 99.0  # a writable export: numpy's writes land in the buffer
    del array
    gc.collect()
    check(lib.devbuf_buffer_open_accesses(buffer) == 0, "numpy's release ends the access")
    check(np.frombuffer(buffer_bytes(buffer), np.float32)[11] == 99.0, "write through numpy")
    read_only = np.from_dlpack(Exported(buffer, flags=1))
    check(not read_only.flags.writeable, "a read-only export gives a read-only array")
    del read_only
    gc.collect()
    # A capsule no consumer takes is deleted by its destructor.
    capsule = Exported(buffer).__dlpack__(max_version=(1, 0))
    check(lib.devbuf_buffer_open_accesses(buffer) == 1, "capsule holds access")
    del capsule
    gc.collect()
    check(lib.devbuf_buffer_open_accesses(buffer) == 0, "unused capsule released")
    lib.devbuf_buffer_release(buffer)


def import_capsule(capsule, versioned):
    name, used = (VERSIONED, USED_VERSIONED) if versioned else (LEGACY, USED_LEGACY)
    check(api.PyCapsule_IsValid(capsule, name) == 1, f"numpy gave a {name} capsule")
    tensor = api.PyCapsule_GetPointer(capsule, name)
    buffer = P()
    function = lib.devbuf_buffer_from_dlpack_versioned if versioned else lib.devbuf_buffer_from_dlpack
    if ok(function(tensor, ctypes.byref(buffer)), "import"):
        api.PyCapsule_SetName(capsule, used)  # devbuf owns it now: the capsule must not delete it
    return buffer


def test_devbuf_imports_numpy():
    for versioned in (True, False):
        array = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float64)
        before = sys.getrefcount(array)
        capsule = array.__dlpack__(max_version=(1, 0)) if versioned else array.__dlpack__()
        buffer = import_capsule(capsule, versioned)
        del capsule
        address = ctypes.c_uint64()
        lib.devbuf_buffer_device_ptr(buffer, ctypes.byref(address))
        check(address.value == array.ctypes.data, "devbuf's buffer is numpy's memory (no copy)")
        check(lib.devbuf_buffer_dtype(buffer) == 12, "float64")
        check(buffer_bytes(buffer) == array.tobytes(), "imported bytes")
        check(sys.getrefcount(array) > before, "the import keeps the array alive")
        lib.devbuf_buffer_release(buffer)
        gc.collect()
        check(sys.getrefcount(array) == before, "the last release calls numpy's deleter")
    frozen = np.arange(4, dtype=np.int32)
    frozen.flags.writeable = False
    buffer = import_capsule(frozen.__dlpack__(max_version=(1, 0)), True)
    check(lib.devbuf_buffer_is_read_only(buffer) == 1, "numpy's read-only flag is kept")
    lib.devbuf_buffer_release(buffer)


print(f"numpy {np.__version__}, safetensors {safetensors.__version__}")
for test in (test_reference_files_read_by_devbuf, test_devbuf_files_read_by_reference,
             test_numpy_reads_devbuf_export, test_devbuf_imports_numpy):
    before = failures
    test()
    print(f"{'ok  ' if failures == before else 'FAIL'} {test.__name__}")
shutil.rmtree(scratch)
sys.exit(1 if failures else 0)
