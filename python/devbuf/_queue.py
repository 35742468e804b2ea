"""Queues of device work and events (timelines)."""
from __future__ import annotations

import atexit
import collections
import ctypes
import math
import numbers
import struct
import threading
from typing import TYPE_CHECKING, Any, Callable

from . import _dtypes, _ext, _work
from ._buffer import Buffer
from ._errors import ERRORS, ArgumentTypeError, DevbufError, InvalidArgumentError, check, count, wrong_type
from ._native import CPU_KERNEL, Owned, P, lib

if TYPE_CHECKING:
    from ._device import Device
    from ._program import Program

_FOREVER = 2**64 - 1
_TIMEOUT = 13
_INVALID_ARGUMENT = 1


class Event(Owned):
    """A timeline: a counter that only grows. Queues and the host signal values and wait
    for them; a failure of the work that was to signal it fails every wait."""

    __slots__ = ("_handle", "__weakref__")

    def __init__(self, initial: int = 0):
        out = P()
        check(lib.devbuf_event_create(count(initial, "initial value"), ctypes.byref(out)))
        self._handle = out.value

    _release = lib.devbuf_event_release

    @property
    def _h(self) -> int:
        if not self._handle:
            raise InvalidArgumentError("the event was closed")
        return self._handle

    @property
    def value(self) -> int:
        return int(lib.devbuf_event_value(self._h))

    def signal(self, value: int) -> None:
        """Signals `value` from the host (not below the current value)."""
        check(lib.devbuf_event_signal(self._handle, count(value, "value")))

    def wait(self, value: int, timeout: float | None = None) -> bool:
        """Waits until the value is at least `value`: True, or False when `timeout`
        seconds pass first (0 only checks). Raises the failure (DeviceFailureError,
        CancelledError, ...) if the work that was to signal it failed."""
        target = count(value, "value")
        if timeout is None or timeout == math.inf:
            nanoseconds = _FOREVER
        elif isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise wrong_type("timeout", timeout, "seconds (a number), or None to wait forever")
        elif not timeout >= 0:  # negative, or NaN
            raise InvalidArgumentError(f"timeout {timeout}: give seconds >= 0, or None to wait forever")
        else:  # whole nanoseconds, clamped before any conversion can overflow
            nanoseconds = int(min(float(timeout) * 1e9, float(_FOREVER - 1)))
        status = lib.devbuf_event_wait(self._handle, target, nanoseconds)
        if status == _TIMEOUT:
            return False
        check(status)
        return True

    def check(self) -> None:
        """Raises the failure that reached the event, if any."""
        check(lib.devbuf_event_status(self._handle))

    def __repr__(self) -> str:
        return f"<devbuf.Event value={self.value}>" if self._handle else "<devbuf.Event (closed)>"


# Work from Python runs through the C module's trampoline (devbuf/_ext: tasks.c), which
# reports failures with the library's devbuf_set_error and stops entering the interpreter at
# exit.
_ext.tasks_init(ctypes.cast(lib.devbuf_set_error, ctypes.c_void_p).value or 0,
                {name: code for code, name in enumerate(
                    (lib.devbuf_status_name(i) or b"").decode() for i in range(len(ERRORS) + 1))},
                ctypes.cast(lib.devbuf_buffer_retain, ctypes.c_void_p).value or 0,
                ctypes.cast(lib.devbuf_buffer_release, ctypes.c_void_p).value or 0)
atexit.register(_ext.tasks_close)
_ext.launch_init(ctypes.cast(lib.devbuf_queue_launch, ctypes.c_void_p).value or 0, Buffer)

# Tasks of closed queues that may still run: (an event the queue signals once they have
# retired, or None when nothing can tell, their Tasks).
_orphans: list[tuple[Event | None, list[Any]]] = []


def _let_orphans_go() -> None:
    if _orphans:
        _orphans[:] = [(event, tasks) for event, tasks in _orphans
                       if event is None or (event.value < 1 and lib.devbuf_event_status(event._handle) == 0)]


class Queue(Owned):
    """An in-order queue of work on one device. Each submission declares what it reads and
    writes; work on other queues touching the same bytes is ordered after it, and host
    access that would race with it is refused or waits."""

    __slots__ = ("_handle", "device", "_tasks", "_tasks_lock", "__weakref__")

    def __init__(self, device: Device):
        self._handle = None
        # Work that holds Python objects (host tasks, ctypes kernels), oldest first, each as
        # [Task, whether its submission has returned]: kept until it has run, or until a
        # finish or cancel that began after its submission returned has retired it.
        self._tasks: collections.deque[list[Any]] = collections.deque()
        # Submissions and finishes from several threads: a check-then-pop on the deque could
        # let go of a Task that has not run (it was freed under the worker).
        self._tasks_lock = threading.Lock()
        out = P()
        check(lib.devbuf_queue_create(device._handle, ctypes.byref(out)))
        self._handle = out.value
        self.device = device

    _release = lib.devbuf_queue_release  # close(): submitted work still runs

    def close(self) -> None:
        """Drops the queue (submitted work still runs)."""
        handle = getattr(self, "_handle", None)
        tasks = getattr(self, "_tasks", None)
        if handle and tasks:
            _orphan(handle, [task for task, _ in tasks])
            tasks.clear()
        super().close()

    def set_depth(self, max_items: int, *, refuse_when_full: bool = False) -> None:
        """Bounds the work the queue holds (0: no bound; new queues hold 4096 items). A
        submission to a full queue waits for room, or with refuse_when_full raises
        a TimeoutError (devbuf.DevbufTimeoutError) at once."""
        max_items = count(max_items, "a queue's depth")  # 2**64 would wrap to 0: no bound
        check(lib.devbuf_queue_set_depth(self._handle, max_items, 1 if refuse_when_full else 0))

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def fill(self, buffer: Buffer, pattern: Any) -> None:
        """Fills `buffer` with a repeated pattern: bytes (any bytes-like object), or a number
        (Python's or numpy's) written as one element of the buffer's dtype."""
        if not isinstance(buffer, Buffer):
            raise wrong_type("buffer", buffer, "a devbuf.Buffer")
        if getattr(pattern, "ndim", None) == 0 and hasattr(pattern, "item"):
            pattern = pattern.item()  # a numpy scalar: its value, written as the buffer's dtype
        if isinstance(pattern, (int, float, bool)):
            fmt = _dtypes.STRUCT_FORMATS.get(buffer.dtype)
            if fmt is None:
                raise InvalidArgumentError(f"a number cannot be written as {buffer.dtype}: give the pattern as bytes")
            try:
                pattern = struct.pack("<" + fmt, pattern)
            except (struct.error, OverflowError) as wrong:
                raise InvalidArgumentError(f"{pattern!r} is not a {buffer.dtype}: {wrong}") from None
        try:
            data = memoryview(pattern).tobytes()
        except TypeError:
            raise wrong_type("pattern", pattern, "bytes (a bytes-like object) or a number") from None
        check(lib.devbuf_queue_fill(self._handle, buffer._h, data, len(data)))

    def copy(self, dst: Buffer, src: Buffer) -> None:
        """Copies `src` into `dst` (equal byte sizes)."""
        for name, value in (("dst", dst), ("src", src)):
            if not isinstance(value, Buffer):
                raise wrong_type(name, value, "a devbuf.Buffer")
        check(lib.devbuf_queue_copy(self._handle, dst._h, src._h))

    def signal(self, event: Event, value: int) -> None:
        """Signals `value` on `event` once the work submitted before has completed."""
        if not isinstance(event, Event):
            raise wrong_type("event", event, "a devbuf.Event")
        check(lib.devbuf_queue_signal(self._handle, event._handle, count(value, "value")))

    def wait(self, event: Event, value: int) -> None:
        """Holds the work submitted after this until `event` reaches `value`."""
        if not isinstance(event, Event):
            raise wrong_type("event", event, "a devbuf.Event")
        check(lib.devbuf_queue_wait(self._handle, event._handle, count(value, "value")))

    def finish(self) -> None:
        """Waits until all submitted work has completed; raises the queue's failure (with
        the exception of the host task that failed it as its cause)."""
        retiring = self._submitted()
        status = lib.devbuf_queue_finish(self._handle)
        _check_with_cause(status, None if self._refused(status) else self._let_go(retiring))

    def cancel(self) -> None:
        """Drops the work not started yet (its events fail with CANCELLED)."""
        retiring = self._submitted()
        status = lib.devbuf_queue_cancel(self._handle)
        if not self._refused(status):
            self._let_go(retiring)
        check(status)

    def _refused(self, status: int) -> bool:
        """Whether finish or cancel answered INVALID_ARGUMENT for being called from the
        queue's own work (nothing retired, the running Task stays), not for a failure of
        the queue with that status (a host task that raised InvalidArgumentError)."""
        return status == _INVALID_ARGUMENT and lib.devbuf_queue_status(self._handle) == 0

    # ---- kernels and host tasks ----------------------------------------------------------
    def launch(self, program: Program, name: str, grid: int | tuple[int, ...], local: Any = None, *,
               uses: Any = (), args: Any = ()) -> None:
        """Launches kernel `name` of `program` (built for this queue's device) over a grid
        of global size `grid` (an int, or 1 to 3 ints) with local size `local` (None: the
        driver's choice). Its arguments are the uses' buffers, [(buffer, "r" | "w" | "rw"),
        ...], then the scalars `args`: numpy scalars, ctypes scalars, or (number, dtype)
        pairs. Ordered like every submission."""
        from ._program import Program

        if not isinstance(program, Program):
            raise ArgumentTypeError(f"launch: program is a devbuf.Program, not {type(program).__name__} "
                            "(CPU kernels go through Queue.submit)")
        kernel = program._name(name)
        status = _ext.launch(self._handle, program._handle, kernel, grid, local, uses, args)
        if status is not NotImplemented:
            check(status)
            return
        launch = _work.launch_grid(grid, local, "launch")
        use_array, use_count, _, _ = _work.uses_array(uses, "launch")
        arg_array, arg_count, _scalar_bytes = _work.launch_args(args, "launch")  # held over the call
        check(lib.devbuf_queue_launch(self._handle, program._h, kernel, ctypes.byref(launch), use_array,
                                      use_count, arg_array, arg_count))

    def submit(self, kernel: Any, *, uses: Any = (), args: Any = ()) -> None:
        """Runs a CPU kernel (a C function, devbuf_cpu_kernel_fn) on the queue's worker
        over `uses`, [(buffer, "r" | "w" | "rw"), ...]: a ctypes function of the type
        devbuf.CPU_KERNEL, or the address (an int) of one, such as a numba cfunc's. `args`
        are its scalars (numpy or ctypes scalars, (number, dtype) pairs, ctypes structures,
        bytes), laid out as the fields of a C structure, in order."""
        use_array, use_count, _, _ = _work.uses_array(uses, "submit")
        scalars = _work.packed_scalars(args, "submit")
        if isinstance(kernel, int) and not isinstance(kernel, bool):
            if kernel <= 0:
                raise InvalidArgumentError(f"submit: kernel address {kernel:#x} is not a function's")
            check(lib.devbuf_queue_submit(self._handle, kernel, use_array, use_count, scalars, len(scalars)))
            return
        if not isinstance(kernel, ctypes._CFuncPtr):  # type: ignore[attr-defined]  # every CFUNCTYPE's base
            raise ArgumentTypeError(f"submit: kernel is a ctypes function (devbuf.CPU_KERNEL) or a function's address, not "
                            f"{type(kernel).__name__} (a Python callable goes to Queue.host_task)")
        address = ctypes.cast(kernel, ctypes.c_void_p).value or 0
        self._submit_task(lib.devbuf_queue_submit, _ext.Task(address, kernel, ()), use_array, use_count, scalars)

    def host_task(self, task: Callable[..., Any], *, uses: Any = ()) -> None:
        """Runs `task`, a Python callable, on the queue's worker in queue order (after the
        work submitted before it has completed, before the work submitted after it starts),
        on a queue of any device, with the GIL taken there. It gets one argument per use: a
        memoryview of the use's bytes (typed and shaped where Python has a format for the
        dtype; read-only for "r"), or None where the CPU cannot address the memory. The
        views are valid during the call only: a task that keeps one fails. An exception
        fails the queue like a failing kernel; its message reaches the queue's events and
        finish() raises with the exception as the cause."""
        if not callable(task):
            raise ArgumentTypeError(f"host_task: task is a callable, not {type(task).__name__}")
        use_array, use_count, buffers, modes = _work.uses_array(uses, "host_task")
        views = tuple((_dtypes.FORMATS.get(buffer.dtype), tuple(buffer.shape), mode == "r", buffer._h)
                      for buffer, mode in zip(buffers, modes))
        self._submit_task(lib.devbuf_queue_host_task, _ext.Task(0, task, views), use_array, use_count, b"")

    def _submit_task(self, submit: Any, task: Any, use_array: Any, use_count: int, scalars: bytes) -> None:
        """Submits work that holds Python objects through the trampoline, and keeps `task`
        until it has run."""
        data = task.header + scalars
        # Kept before it is submitted: an interrupt (Ctrl-C, a signal handler's exception)
        # between the submission and keeping it freed a Task the queue was still to run.
        with self._tasks_lock:
            tasks = self._tasks
            while tasks and tasks[0][0].done:
                tasks.popleft()
            kept = [task, False]
            tasks.append(kept)
        status = submit(self._handle, _ext.TRAMPOLINE, use_array, use_count, data, len(data))
        with self._tasks_lock:
            if status == 0:
                # Only from here may a finish or cancel let it go: one that began before
                # the submission returned need not have waited for it.
                kept[1] = True
            else:  # refused: nothing will run it
                self._tasks = collections.deque(entry for entry in self._tasks if entry is not kept)
        check(status)
        _let_orphans_go()

    def _submitted(self) -> list[list[Any]]:
        """The kept tasks whose submissions have returned: a finish or cancel that begins
        now retires their work."""
        with self._tasks_lock:
            return [entry for entry in self._tasks if entry[1]]

    def _let_go(self, retiring: list[list[Any]]) -> BaseException | None:
        """Lets go of `retiring` (a finish or cancel has retired their work, which ran or was
        dropped); the first exception one of them raised. Tasks submitted meanwhile stay."""
        gone = {id(entry) for entry in retiring}
        with self._tasks_lock:
            self._tasks = collections.deque(entry for entry in self._tasks if id(entry) not in gone)
        return next((task.exception for task, _ in retiring if task.exception is not None), None)

    def check(self) -> None:
        """Raises the failure that stopped the queue, if any."""
        check(lib.devbuf_queue_status(self._handle))


def _check_with_cause(status: int, cause: BaseException | None) -> None:
    try:
        check(status)
    except DevbufError as error:
        if cause is None:
            raise
        raise error from cause


def _orphan(handle: int, tasks: list[Any]) -> None:
    """Keeps the Tasks of a queue that is being dropped until its work has retired."""
    event = Event()
    if lib.devbuf_queue_signal(handle, event._handle, 1) == 0:
        _orphans.append((event, tasks))
    elif lib.devbuf_queue_finish(handle) == _INVALID_ARGUMENT:
        _orphans.append((None, tasks))  # dropped by its own work: nothing can wait here
    _let_orphans_go()


__all__ = ["Event", "Queue", "CPU_KERNEL"]
