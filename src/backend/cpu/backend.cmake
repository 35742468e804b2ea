# The CPU backend (docs/backends.md): host memory, operations on the queue's worker thread.
devbuf_backend(cpu SOURCES backend_cpu.c cpu_ops.c)
