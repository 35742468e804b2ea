"""Kernels from Python: programs and launches on OpenCL, CPU kernels as C functions, host
tasks as Python callables, in queue order with the C API's hazard rules."""
import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import threading
import weakref

import numpy as np
import pytest

import devbuf

ADD = """
__kernel void add(__global float *x, float v) { x[get_global_id(0)] += v; }
__kernel void axpy(__global const float *x, __global float *y, float a, int n) {
  size_t i = get_global_id(0) + get_global_id(1) * get_global_size(0);
  if (i < (size_t)n) y[i] += a * x[i];
}
"""


@pytest.fixture
def opencl():
    try:
        return devbuf.Device("opencl:0")
    except devbuf.UnavailableError as missing:
        pytest.skip(f"no OpenCL device: {missing}")


def host_array(buffer, dtype=np.float32):
    return np.frombuffer(buffer.to_bytes(), dtype)


# ---- programs and launches -------------------------------------------------------------------


def test_launch_runs_the_kernel_with_each_kind_of_scalar(opencl):
    program = devbuf.Program(opencl, ADD)
    x = opencl.asbuffer(np.arange(8, dtype=np.float32))
    with opencl.queue() as q:
        q.launch(program, "add", 8, uses=[(x, "rw")], args=[np.float32(0.5)])
        q.launch(program, "add", (8,), uses=[(x, "rw")], args=[(1.0, "float32")])
        q.launch(program, "add", [8], local=[4], uses=[(x, "rw")], args=[ctypes.c_float(2.0)])
        q.launch(program, "add", 8, uses=[(x, "rw")], args=[(0.25, np.float32)])
    np.testing.assert_array_equal(host_array(x), np.arange(8, dtype=np.float32) + 3.75)


def test_launch_two_dimensional_grid_matches_numpy(opencl):
    program = devbuf.Program(opencl, ADD)
    rng = np.random.default_rng(7)
    xs, ys = rng.standard_normal(64, dtype=np.float32), rng.standard_normal(64, dtype=np.float32)
    x, y = opencl.asbuffer(xs), opencl.asbuffer(ys)
    with opencl.queue() as q:
        q.launch(program, "axpy", (8, 8), (4, 2), uses=[(x, "r"), (y, "rw")], args=[np.float32(3), np.int32(60)])
    expected = ys.copy()
    expected[:60] += np.float32(3) * xs[:60]
    np.testing.assert_allclose(host_array(y), expected, rtol=1e-6)


def test_launch_orders_after_a_fill_and_before_another_queues_work(opencl):
    program = devbuf.Program(opencl, ADD)
    x, y = opencl.zeros(16), opencl.zeros(16)
    seen = []
    with opencl.queue() as q, opencl.queue() as later:
        q.fill(x, np.float32(1).tobytes())
        q.launch(program, "add", 16, uses=[(x, "rw")], args=[np.float32(1)])
        later.copy(y, x)  # another queue: ordered after the launch by the hazard tracker
        later.host_task(lambda: seen.append(host_array(y).tolist()))
    assert seen == [[2.0] * 16]


def test_build_error_raises_with_the_compiler_log(opencl):
    with pytest.raises(devbuf.DeviceFailureError, match="build log") as failure:
        devbuf.Program(opencl, "__kernel void broken(__global float *x) { x[0] = undeclared; }")
    assert "undeclared" in str(failure.value)


def test_program_is_refused_on_the_cpu():
    with pytest.raises(devbuf.UnsupportedError):
        devbuf.Program("cpu", ADD)


def test_launch_arguments_are_checked_by_name(opencl):
    program = devbuf.Program(opencl, ADD)
    x = opencl.zeros(8)
    q = opencl.queue()
    with pytest.raises(TypeError, match=r"args\[0\] is 0.5, which has no dtype"):
        q.launch(program, "add", 8, uses=[(x, "rw")], args=[0.5])
    with pytest.raises(TypeError, match=r"uses\[0\] is .*give \(buffer, 'r' \| 'w' \| 'rw'\)"):
        q.launch(program, "add", 8, uses=[x], args=[np.float32(1)])
    with pytest.raises(devbuf.InvalidArgumentError, match=r"uses\[0\] has access 'x'"):
        q.launch(program, "add", 8, uses=[(x, "x")], args=[np.float32(1)])
    with pytest.raises(TypeError, match="grid is 'eight'"):
        q.launch(program, "add", "eight", uses=[(x, "rw")], args=[np.float32(1)])
    with pytest.raises(TypeError, match="grid is .*1 to 3 ints"):
        q.launch(program, "add", (1, 1, 1, 1), uses=[(x, "rw")], args=[np.float32(1)])
    with pytest.raises(devbuf.InvalidArgumentError, match="local .* has 2 dimensions"):
        q.launch(program, "add", 8, (4, 2), uses=[(x, "rw")], args=[np.float32(1)])
    with pytest.raises(TypeError, match=r"args\[0\] is a Buffer"):
        q.launch(program, "add", 8, uses=[(x, "rw")], args=[x])
    with pytest.raises(TypeError, match="program is a devbuf.Program"):
        q.launch("add", "add", 8, uses=[(x, "rw")])
    with pytest.raises(TypeError, match="kernel's name is a str"):
        q.launch(program, 3, 8, uses=[(x, "rw")])
    with pytest.raises(TypeError, match="source is OpenCL C or PTX text"):
        devbuf.Program(opencl, 42)
    with pytest.raises(TypeError, match="options is a str"):
        devbuf.Program(opencl, ADD, options=["-O2"])
    q.finish()  # nothing refused reached the queue


def test_a_launch_the_driver_refuses_names_the_kernel(opencl):
    program = devbuf.Program(opencl, ADD)
    x = opencl.zeros(8)
    q = opencl.queue()
    with pytest.raises(devbuf.DevbufError, match="missing"):
        q.launch(program, "missing", 8, uses=[(x, "rw")], args=[np.float32(1)])
        q.finish()


def test_cuda_program_from_an_image_and_a_launch_on_the_stand_in_driver():
    """cuda:0 through tests/fake_cuda.c (kernels are C functions there; any image loads):
    a binary image as bytes, uses and scalars in the driver's parameter layout."""
    fake = os.environ.get("DEVBUF_FAKE_CUDA")
    if not fake:
        pytest.skip("DEVBUF_FAKE_CUDA (the stand-in CUDA driver, set by ctest) is not set")
    done = run_python("""
        import numpy as np, devbuf
        gpu = devbuf.Device("cuda:0")
        program = devbuf.Program(gpu, bytes([0x7f, 0x45, 0x4c, 0x46, 0, 1, 2]))  # an image with NUL bytes
        x = gpu.asbuffer(np.arange(8, dtype=np.float32))
        out = gpu.zeros(8)
        with gpu.queue() as q:
            q.launch(program, "scale", 8, uses=[(out, "w"), (x, "r")], args=[np.float32(2.5), (6, "uint64")])
        print(np.frombuffer(out.to_bytes(), np.float32).tolist())
    """, DEVBUF_CUDA_LIBRARY=fake)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == str([i * 2.5 for i in range(6)] + [0.0, 0.0])


# ---- CPU kernels -----------------------------------------------------------------------------


@devbuf.CPU_KERNEL
def scale_in_place(args):
    a = args.contents
    factor = ctypes.c_double.from_address(a.scalars + 8).value  # after an int8 and padding
    values = (ctypes.c_float * (a.sizes[0] // 4)).from_address(a.data[0])
    for i in range(len(values)):
        values[i] *= factor * ctypes.c_int8.from_address(a.scalars).value
    return 0


def test_submit_runs_a_ctypes_kernel_with_scalars_laid_out_as_a_structure(cpu):
    x = cpu.asbuffer(np.arange(4, dtype=np.float32))
    sizes = []

    @devbuf.CPU_KERNEL
    def record(args):
        sizes.append((args.contents.count, args.contents.scalars_size))
        return 0

    with cpu.queue() as q:
        q.submit(scale_in_place, uses=[(x, "rw")], args=[np.int8(2), np.float64(1.5)])
        q.submit(record, uses=[(x, "r")], args=[np.int8(2), np.float64(1.5)])
    np.testing.assert_array_equal(host_array(x), np.arange(4, dtype=np.float32) * 3)
    assert sizes == [(1, 16)]


def test_submit_takes_a_kernel_by_address(cpu):
    x = cpu.asbuffer(np.arange(4, dtype=np.float32))
    address = ctypes.cast(scale_in_place, ctypes.c_void_p).value  # as a numba cfunc's .address
    with cpu.queue() as q:
        q.submit(address, uses=[(x, "rw")], args=[(1, "int8"), (2.0, "float64")])
    np.testing.assert_array_equal(host_array(x), np.arange(4, dtype=np.float32) * 2)


def test_a_failing_cpu_kernel_fails_the_queue_with_its_status(cpu):
    @devbuf.CPU_KERNEL
    def refuse(args):
        return 4  # OUT_OF_RANGE

    q = cpu.queue()
    q.submit(refuse)
    with pytest.raises(devbuf.OutOfRangeError):
        q.finish()


def test_submit_arguments_are_checked_by_name(cpu):
    q = cpu.queue()
    with pytest.raises(TypeError, match="a Python callable goes to Queue.host_task"):
        q.submit(lambda args: 0)
    with pytest.raises(devbuf.InvalidArgumentError, match="address 0x0"):
        q.submit(0)
    with pytest.raises(TypeError, match=r"args\[1\] is 3, which has no dtype"):
        q.submit(scale_in_place, args=[np.int8(1), 3])
    with pytest.raises(devbuf.InvalidArgumentError, match="300 is not a int8"):
        q.submit(scale_in_place, args=[(300, "int8")])
    with pytest.raises(TypeError, match="uses is a list"):
        q.submit(scale_in_place, uses="rw")


# ---- host tasks ------------------------------------------------------------------------------


def test_host_task_gets_typed_views_and_writes_through(cpu):
    x = cpu.asbuffer(np.arange(6, dtype=np.float32).reshape(2, 3))
    shapes = []

    def double(view, readonly_view):
        shapes.append((view.format, view.shape, readonly_view.readonly))
        np.asarray(view)[...] *= 2
        del view  # np.asarray's array is gone with the frame

    other = cpu.zeros(4, "int32")
    with cpu.queue() as q:
        q.host_task(double, uses=[(x, "rw"), (other, "r")])
    assert shapes == [("f", (2, 3), True)]
    np.testing.assert_array_equal(host_array(x), np.arange(6, dtype=np.float32) * 2)


def test_host_task_exception_fails_the_queue_and_reaches_events(cpu):
    def broken():
        raise ValueError("the checksum is wrong")

    q = cpu.queue()
    event, gate = devbuf.Event(), devbuf.Event()
    q.wait(gate, 1)  # the task fails only once the signal is queued behind it
    q.host_task(broken)
    q.signal(event, 1)
    gate.signal(1)
    with pytest.raises(devbuf.DeviceFailureError, match="host task .*broken raised ValueError: the checksum is wrong"):
        event.wait(1, timeout=10)
    with pytest.raises(devbuf.DeviceFailureError) as failure:
        q.finish()
    assert isinstance(failure.value.__cause__, ValueError)


def test_host_task_raising_a_devbuf_error_keeps_its_status(cpu):
    def out_of_memory():
        raise devbuf.OutOfMemoryError("no room for the staging copy")

    q = cpu.queue()
    q.host_task(out_of_memory)
    with pytest.raises(devbuf.OutOfMemoryError, match="no room for the staging copy"):
        q.finish()


def test_host_task_that_keeps_a_view_fails(cpu):
    x = cpu.zeros(4)
    kept = []
    q = cpu.queue()
    q.host_task(lambda view: kept.append(np.asarray(view)), uses=[(x, "rw")])
    with pytest.raises(devbuf.DeviceFailureError, match="a view of use 0 .* outlived the task"):
        q.finish()
    # The kept view holds the buffer: its bytes are not freed under it when the buffer closes.
    live = cpu.memory_stats()["live_buffers"]
    x.close()
    assert cpu.memory_stats()["live_buffers"] == live
    kept[0][:] = 1
    assert kept[0].sum() == 4
    kept.clear()
    assert cpu.memory_stats()["live_buffers"] == live - 1


def test_host_task_cannot_write_a_read_use(cpu):
    x = cpu.zeros(4)

    def write(view):
        view[0] = 1.0

    q = cpu.queue()
    q.host_task(write, uses=[(x, "r")])
    with pytest.raises(devbuf.DeviceFailureError, match="TypeError"):
        q.finish()
    np.testing.assert_array_equal(host_array(x), np.zeros(4, np.float32))


def test_host_task_waits_for_its_own_queue_refuses(cpu):
    q = cpu.queue()
    q.host_task(lambda: q.finish())
    with pytest.raises(devbuf.DevbufError, match="raised InvalidArgumentError"):
        q.finish()


def test_host_task_arguments_are_checked(cpu):
    q = cpu.queue()
    with pytest.raises(TypeError, match="task is a callable"):
        q.host_task("print")


# ---- what Python keeps, and for how long -------------------------------------------------


class Callable:
    def __init__(self):
        self.ran = threading.Event()

    def __call__(self):
        self.ran.set()


def task_held_back(cpu):
    """A queue held at an event with a host task behind it that only the queue references:
    the queue, the event, the task's `ran` flag and a weak reference to the task."""
    q, gate = cpu.queue(), devbuf.Event()
    q.wait(gate, 1)
    task = Callable()
    q.host_task(task)
    return q, gate, task.ran, weakref.ref(task)


def test_a_task_is_kept_until_it_has_run(cpu):
    q, gate, ran, alive = task_held_back(cpu)
    gc.collect()
    assert alive() is not None
    gate.signal(1)
    q.finish()
    assert ran.is_set()
    gc.collect()
    assert alive() is None


def test_a_cancelled_task_is_let_go(cpu):
    q, gate, ran, alive = task_held_back(cpu)
    q.cancel()
    gc.collect()
    assert alive() is None and not ran.is_set()


def test_a_closed_queue_still_runs_its_tasks(cpu):
    q, gate, ran, alive = task_held_back(cpu)
    q.close()
    gc.collect()
    assert alive() is not None
    gate.signal(1)
    assert ran.wait(10)
    for _ in range(1000):  # the orphan's event is signalled just after the task has run
        devbuf._queue._let_orphans_go()
        gc.collect()
        if alive() is None:
            break
    assert alive() is None


def run_python(code, **environment):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **environment)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=60)


def test_exit_with_tasks_queued_and_running_is_clean():
    done = run_python("""
        import time, devbuf
        cpu = devbuf.Device("cpu")
        held, gate = cpu.queue(), devbuf.Event()
        held.wait(gate, 1)
        held.host_task(lambda: print("never"))     # behind an event nobody signals
        busy = cpu.queue()
        busy.host_task(lambda: (time.sleep(0.3), print("ran", flush=True)))
        time.sleep(0.1)                             # the task is running at exit
        print("exiting", flush=True)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["exiting", "ran"] and done.stderr == ""


def test_queue_and_event_arguments_name_themselves(cpu):
    q, x = cpu.queue(), cpu.zeros(4)
    with pytest.raises(devbuf.ArgumentTypeError, match=r"src b'abcd' \(bytes\): give a devbuf.Buffer"):
        q.copy(x, b"abcd")
    with pytest.raises(devbuf.ArgumentTypeError, match=r"event 3 \(int\): give a devbuf.Event"):
        q.signal(3, 1)
    with pytest.raises(devbuf.ArgumentTypeError, match="event None"):
        q.wait(None, 1)
    with pytest.raises(devbuf.ArgumentTypeError, match="timeout '5' .*seconds"):
        devbuf.Event().wait(1, timeout="5")
