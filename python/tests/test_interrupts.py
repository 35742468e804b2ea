"""A KeyboardInterrupt never leaves a host access open: not while `with buf.read():` waits
for queued work, and not when it arrives at any moment of a loop of such blocks."""
import _thread
import random
import signal
import threading
import time

import pytest

import devbuf


def submits_freely(cpu, buffer):
    """Queued work that writes the buffer is accepted (no access was left open)."""
    with cpu.queue() as queue:
        queue.fill(buffer, 7)
    with buffer.read() as view:
        assert list(view) == [7] * len(view)


@pytest.mark.parametrize("write", [False, True])
def test_interrupt_while_waiting_for_work(cpu, write):
    buffer = cpu.zeros((64,), "int32")
    gate = devbuf.Event()
    queue = cpu.queue()
    queue.wait(gate, 1)
    queue.fill(buffer, 3)  # the access below waits for this
    # The interrupt arrives while the access waits; the work completes after it.
    threading.Timer(0.2, _thread.interrupt_main).start()
    threading.Timer(0.4, lambda: gate.signal(1)).start()
    with pytest.raises(KeyboardInterrupt):
        with (buffer.write() if write else buffer.read()):
            time.sleep(5)  # reached only if the wait ended before the interrupt
    queue.finish()
    submits_freely(cpu, buffer)


def test_interrupts_at_random_moments(cpu):
    """SIGINT at random moments of a loop of access blocks: after each interrupt the buffer
    takes queued work, so no access was left behind."""
    buffer = cpu.zeros((256,), "int32")
    rng = random.Random(1234)
    interrupted = 0
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for attempt in range(600):
            timer = threading.Timer(rng.uniform(0, 0.0004), _thread.interrupt_main)
            try:
                timer.start()  # the interrupt may already land while the timer starts
                for _ in range(20):
                    with buffer.write() as view:
                        view[0] = attempt
                    with buffer.read() as view:
                        _ = view[0]
                timer.join()
                time.sleep(0.001)  # an interrupt that is late still lands in this try
            except KeyboardInterrupt:
                interrupted += 1
            timer.join()
            with cpu.queue() as queue:  # refused with HOST_ACCESS_OPEN if an access leaked
                queue.fill(buffer, 1)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted > 100  # the interrupts did land inside the blocks
    submits_freely(cpu, buffer)


def test_interrupt_just_after_a_submission_keeps_the_task(cpu):
    """Ctrl-C landing between a host task's submission and the queue keeping its Task freed
    the Task the worker then ran (a crash). Here a trace function raises it on that line."""
    import gc
    import sys

    from devbuf import _queue

    queue, gate, ran = cpu.queue(), devbuf.Event(), []
    queue.wait(gate, 1)
    submit_code = _queue.Queue._submit_task.__code__

    def tracer(frame, event, arg):
        if frame.f_code is not submit_code:
            return None
        submitted = []

        def local(frame, event, arg):  # on the line after the one that submits
            if event == "line":
                if submitted:
                    sys.settrace(None)
                    raise KeyboardInterrupt
                if "submit(self._handle" in _source_line(frame):
                    submitted.append(True)
            return local

        return local

    sys.settrace(tracer)
    try:
        queue.host_task(lambda: ran.append(1))
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    gc.collect()
    gate.signal(1)
    queue.finish()
    assert ran == [1]


def _source_line(frame):
    import linecache

    return linecache.getline(frame.f_code.co_filename, frame.f_lineno)
