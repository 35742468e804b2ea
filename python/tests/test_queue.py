"""Queues, events, and host access as context managers against queued work."""
import struct
import threading
import time

import pytest

import devbuf


def held_queue(cpu):
    """A queue whose work waits for an event the test signals."""
    gate = devbuf.Event()
    queue = cpu.queue()
    queue.wait(gate, 1)
    return queue, gate


def test_fill_copy_signal(cpu):
    src, dst = cpu.empty((16,), "float32"), cpu.zeros((16,), "float32")
    done = devbuf.Event()
    with cpu.queue() as queue:
        queue.fill(src, 1.5)
        queue.copy(dst, src)
        queue.signal(done, 3)
    assert done.value == 3 and done.wait(3, timeout=0)
    assert struct.unpack("<16f", dst.to_bytes()) == (1.5,) * 16
    with pytest.raises(devbuf.InvalidArgumentError):
        cpu.queue().fill(cpu.empty((3,), "bfloat16"), 1.0)
    with pytest.raises(devbuf.InvalidArgumentError):
        cpu.queue().fill(cpu.empty((3,), "int32"), 1.5)
    half = cpu.empty((2,), "float16")
    with cpu.queue() as queue:
        queue.fill(half, 1.0)
    assert half.to_bytes() == bytes.fromhex("003c003c")


def test_host_access_against_queued_work(cpu):
    buffer = cpu.zeros((8,), "int32")
    queue, gate = held_queue(cpu)
    queue.fill(buffer, 5)
    with pytest.raises(devbuf.InUseError):
        with buffer.read(wait=False):
            pass
    with pytest.raises(devbuf.InUseError):
        with buffer.write(wait=False):
            pass
    assert buffer.in_use and buffer.open_accesses == 0
    threading.Timer(0.05, gate.signal, args=(1,)).start()
    with buffer.read() as view:  # waits for the fill
        assert view.tolist() == [5] * 8 and view.readonly
        with pytest.raises(devbuf.HostAccessOpenError):
            queue.fill(buffer, 6)  # would race with the open access
    assert buffer.open_accesses == 0
    with buffer.write() as view:
        view[3] = -1
    queue.finish()
    assert struct.unpack("<8i", buffer.to_bytes())[3] == -1


def test_access_that_outlives_its_block_ends_with_its_last_view(cpu):
    buffer = cpu.zeros((4,), "float64")
    queue = cpu.queue()
    with pytest.raises(devbuf.HostAccessOpenError):
        with buffer.write() as view:
            kept = view.cast("B")  # an object still made from the view
    assert buffer.open_accesses == 1
    with pytest.raises(devbuf.HostAccessOpenError):
        queue.fill(buffer, 1.0)  # would race with `kept`
    kept[0] = 1
    kept.release()
    assert buffer.open_accesses == 0
    np = pytest.importorskip("numpy", reason="numpy is not installed")
    with pytest.raises(devbuf.HostAccessOpenError):
        with buffer.read() as view:
            array = np.asarray(view)  # holds the view itself
    assert buffer.open_accesses == 1 and array[0] != 0
    buffer.close()  # the access holds its own reference: the memory stays
    assert array.sum() == array[0]
    del array, view
    queue.finish()


def test_access_made_before_its_buffer_closes(cpu):
    buffer = cpu.zeros((4,), "float64")
    with buffer.write() as view:
        view[1] = 2.5
    access = buffer.read()  # not entered yet: it holds its own reference from here
    buffer.close()
    with access as view:
        assert view[1] == 2.5
    with access as view:  # and again
        assert view[1] == 2.5


def test_typed_views_where_python_has_a_format(cpu):
    for dtype, size in (("float16", 8), ("bfloat16", 8), ("float8_e4m3", 4)):
        with cpu.zeros((4,), dtype).read() as view:
            assert view.nbytes == size and view.tobytes() == bytes(size)
    with cpu.zeros((2, 3), "int64").read() as view:
        assert view.shape == (2, 3) and view.format == "q"


def test_event_waits_timeouts_and_failures(cpu):
    event = devbuf.Event(2)
    assert event.wait(2) and not event.wait(3, timeout=0.01)
    with pytest.raises(devbuf.InvalidArgumentError):
        event.signal(1)  # below the current value
    with pytest.raises(devbuf.InvalidArgumentError):
        event.wait(3, timeout=-1)
    queue, gate = held_queue(cpu)
    cancelled = devbuf.Event()
    queue.signal(cancelled, 1)
    queue.cancel()
    with pytest.raises(devbuf.CancelledError):
        cancelled.wait(1, timeout=5)


def test_waits_release_the_gil(cpu):
    event = devbuf.Event()
    start = time.monotonic()
    signaller = threading.Thread(target=lambda: (time.sleep(0.05), event.signal(1)))
    signaller.start()
    assert event.wait(1, timeout=10)  # the other thread ran Python meanwhile
    signaller.join()
    assert time.monotonic() - start < 5


def test_a_full_queue_refuses_or_waits(cpu):
    queue, gate = held_queue(cpu)
    buffer = cpu.zeros((4,), "int32")
    queue.set_depth(3, refuse_when_full=True)
    queue.fill(buffer, 1)
    queue.fill(buffer, 2)  # with the wait: 3 items
    with pytest.raises(TimeoutError, match="its depth 3"):  # no excinfo kept: no cycle holds buffer
        queue.fill(buffer, 3)
    with pytest.raises(devbuf.InvalidArgumentError, match="2\\*\\*64"):
        queue.set_depth(2**64)  # no wrap to 0 (no bound)
    with pytest.raises(devbuf.InvalidArgumentError, match="below 2\\*\\*64"):
        devbuf._work.launch_grid(2**64 + 4, None, "launch")
    queue.set_depth(3)  # now a full queue waits: the fill below returns once the gate opens
    threading.Timer(0.05, gate.signal, (1,)).start()
    queue.fill(buffer, 4)
    queue.finish()
    assert struct.unpack("<4i", buffer.to_bytes()) == (4,) * 4
    with pytest.raises(devbuf.InvalidArgumentError):
        queue.set_depth(-1)


FORK_WHILE_A_TASK_RUNS = """
import os, sys, threading
import devbuf
started, gate = threading.Event(), threading.Event()
queue = devbuf.Device("cpu").queue()
queue.host_task(lambda: (started.set(), gate.wait(10)))
started.wait(10)
child = os.fork()
if child == 0:
    sys.exit(0)  # the exit hook must not wait for a task that runs only in the parent
gate.set()
queue.finish()
import time
for _ in range(400):  # 20 s, then the child is killed: a hang fails, and leaves nothing behind
    done, status = os.waitpid(child, os.WNOHANG)
    if done:
        sys.exit(os.waitstatus_to_exitcode(status))
    time.sleep(0.05)
os.kill(child, 9)
os.waitpid(child, 0)
sys.exit(3)
"""


def test_child_forked_while_a_task_runs_exits():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FORK_WHILE_A_TASK_RUNS], timeout=60)
    assert done.returncode == 0


def test_finish_inside_its_own_task_keeps_the_running_task(cpu):
    """finish from the queue's own host task is refused, and the Task that runs it is not let
    go of (it was freed under the worker: a crash)."""
    for _ in range(50):
        queue = cpu.queue()
        refused = []

        def task():
            for call in (queue.finish, queue.cancel):
                try:
                    call()
                except devbuf.InvalidArgumentError as error:
                    refused.append(error)
            raise ValueError("the task's own failure")

        queue.host_task(task)
        with pytest.raises(devbuf.DevbufError) as failed:
            queue.finish()
        assert len(refused) == 2
        assert isinstance(failed.value.__cause__, ValueError)
        queue.close()


def test_host_tasks_from_several_threads(cpu):
    """Submissions and finishes from several threads share the queue's list of Tasks."""
    import sys
    queue, ran, errors = cpu.queue(), [], []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two steps of the list's upkeep

    def submit():
        try:
            for i in range(300):
                queue.host_task(lambda i=i: ran.append(i))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    def finish():
        try:
            for _ in range(100):
                queue.finish()
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=submit) for _ in range(3)] + [threading.Thread(target=finish)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    queue.finish()
    assert not errors and len(ran) == 900
    queue.close()


def test_a_finish_during_a_submission_keeps_its_task(cpu):
    """A finish that begins while a host task is being submitted (from another thread) does
    not wait for that task, so it must not let go of it either: the work would run a freed
    Task (a crash, one run in fifteen of the test above)."""
    import gc

    from devbuf import _ext, _queue
    queue, gate, ran = cpu.queue(), devbuf.Event(), []

    def submit_after_a_finish(*args):
        finisher = threading.Thread(target=queue.finish)  # what another thread does meanwhile
        finisher.start()
        finisher.join()
        queue.wait(gate, 1)  # the task runs after the test has dropped its own references
        return _queue.lib.devbuf_queue_host_task(*args)

    task = _ext.Task(0, lambda: ran.append(1), ())
    queue._submit_task(submit_after_a_finish, task, None, 0, b"")
    assert any(task in entry for entry in queue._tasks), "the queue let go of a task yet to run"
    del task
    gc.collect()
    gate.signal(1)
    queue.finish()
    assert ran == [1] and not queue._tasks


def test_finish_tells_the_cause_of_a_task_that_raised_a_devbuf_error(cpu):
    """A task that raised InvalidArgumentError fails its queue with that status, which finish()
    took for its own refusal (from the queue's own work): no cause, and the Task kept."""
    queue = cpu.queue()
    queue.host_task(lambda: cpu.empty(-1))
    with pytest.raises(devbuf.DevbufError) as failed:
        queue.finish()
    assert isinstance(failed.value.__cause__, devbuf.InvalidArgumentError)
    assert len(queue._tasks) == 0


def test_a_task_that_keeps_the_views_object_gets_no_view_later(cpu):
    """A host task that kept `view.obj` (not the view) made a view after the task, over bytes
    another buffer had by then: writing it changed that buffer."""
    buffer, queue, kept = cpu.zeros((1 << 16,), "int32"), cpu.queue(), []
    queue.host_task(lambda view: kept.append(view.obj), uses=[(buffer, "rw")])
    queue.finish()
    with pytest.raises(BufferError):
        memoryview(kept[0])
