// What the C files of devbuf._ext share (ext.c, tasks.c).
#ifndef DEVBUF_EXT_H
#define DEVBUF_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

// A buffer-protocol object over `size` bytes at `address` that counts the views made from
// it (ext.c); it owns nothing. NULL with an exception set on failure.
PyObject *devbuf_ext_memory_new(void *address, Py_ssize_t size, int readonly);
// How many views of it are alive.
Py_ssize_t devbuf_ext_memory_exports(PyObject *memory);
// No new views of it from now on (those alive stay).
void devbuf_ext_memory_close(PyObject *memory);
// Makes `memory` hold `buffer` (a reference of the caller's, dropped with `release`) until
// its last view goes: bytes a view still shows are never freed under it.
void devbuf_ext_memory_hold(PyObject *memory, void *buffer, void (*release)(void *buffer));

// Adds Task, TRAMPOLINE, tasks_init and tasks_close to the module (tasks.c); -1 with an
// exception set on failure.
int devbuf_ext_add_tasks(PyObject *module);

// Adds launch and launch_init, Queue.launch's fast path (launch.c).
int devbuf_ext_add_launch(PyObject *module);

#endif // DEVBUF_EXT_H
