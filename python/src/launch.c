// Queue.launch's fast path: the uses, scalars and grid of a launch read from Python objects
// and handed to devbuf_queue_launch in C, without ctypes' per-field conversions (those cost
// several times the launch itself). Anything unusual (a wrong type, a (number, dtype) pair,
// more uses or scalars than fit here) goes back to the Python path, which checks and
// reports it by name (devbuf/_work.py).
#include "ext.h"

#include <string.h>

#include "../../include/devbuf.h"

typedef devbuf_status (*queue_launch_fn)(void *queue, void *program, const char *name,
                                         const devbuf_launch_t *launch, const devbuf_use_t *uses,
                                         size_t use_count, const devbuf_arg_t *args,
                                         size_t arg_count);

static queue_launch_fn queue_launch; // devbuf_queue_launch, from launch_init
static PyTypeObject *buffer_type;    // devbuf.Buffer, from launch_init
static PyObject *handle_name, *read_name, *write_name, *read_write_name;

enum { MOST_USES = 16, MOST_ARGS = 16 };

// A launch that the fast path does not take (returned as NotImplemented).
static PyObject *not_here(void) { Py_RETURN_NOTIMPLEMENTED; }

static int read_dims(PyObject *value, size_t out[3], unsigned *out_count) {
  if (PyLong_CheckExact(value)) {
    out[0] = PyLong_AsSize_t(value);
    *out_count = 1;
    return out[0] == (size_t)-1 && PyErr_Occurred() ? -1 : 0;
  }
  if (!PyTuple_CheckExact(value) || PyTuple_GET_SIZE(value) < 1 || PyTuple_GET_SIZE(value) > 3)
    return -1;
  *out_count = (unsigned)PyTuple_GET_SIZE(value);
  for (unsigned i = 0; i < *out_count; i++) {
    PyObject *size = PyTuple_GET_ITEM(value, i);
    if (!PyLong_CheckExact(size)) return -1;
    out[i] = PyLong_AsSize_t(size);
    if (out[i] == (size_t)-1 && PyErr_Occurred()) return -1;
  }
  return 0;
}

static int read_use(PyObject *use, devbuf_use_t *out) {
  if (!PyTuple_CheckExact(use) || PyTuple_GET_SIZE(use) != 2) return -1;
  PyObject *buffer = PyTuple_GET_ITEM(use, 0), *mode = PyTuple_GET_ITEM(use, 1);
  if (!buffer_type || !PyObject_TypeCheck(buffer, buffer_type) || !PyUnicode_Check(mode)) return -1;
  if (mode == read_name || PyUnicode_Compare(mode, read_name) == 0)
    out->access = DEVBUF_ACCESS_READ;
  else if (mode == write_name || PyUnicode_Compare(mode, write_name) == 0)
    out->access = DEVBUF_ACCESS_WRITE;
  else if (mode == read_write_name || PyUnicode_Compare(mode, read_write_name) == 0)
    out->access = DEVBUF_ACCESS_READ_WRITE;
  else
    return -1;
  PyObject *handle = PyObject_GetAttr(buffer, handle_name); // None once closed

  if (!handle) return -1;
  out->buffer = PyLong_Check(handle) ? PyLong_AsVoidPtr(handle) : NULL;
  Py_DECREF(handle);
  return out->buffer ? 0 : -1;
}

// launch(queue, program, name, grid, local, uses, args) -> status, or NotImplemented.
static PyObject *launch(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
  (void)self;
  if (argc != 7 || !queue_launch || !PyBytes_CheckExact(argv[2])) return not_here();
  void *queue = PyLong_AsVoidPtr(argv[0]), *program = PyLong_AsVoidPtr(argv[1]);
  PyObject *uses = argv[5], *args = argv[6];
  if (PyErr_Occurred() || !queue || !program) {
    PyErr_Clear();
    return not_here();
  }
  devbuf_launch_t grid = {0};
  size_t local[3] = {0};
  unsigned local_dims = 0;
  if (read_dims(argv[3], grid.global, &grid.dims) < 0 ||
      (argv[4] != Py_None &&
       (read_dims(argv[4], local, &local_dims) < 0 || local_dims != grid.dims))) {
    PyErr_Clear();
    return not_here();
  }
  memcpy(grid.local, local, sizeof local);
  if (!PyList_CheckExact(uses) && !PyTuple_CheckExact(uses)) return not_here();
  if (!PyList_CheckExact(args) && !PyTuple_CheckExact(args)) return not_here();
  Py_ssize_t use_count = PySequence_Fast_GET_SIZE(uses), arg_count = PySequence_Fast_GET_SIZE(args);
  if (use_count > MOST_USES || arg_count > MOST_ARGS) return not_here();
  devbuf_use_t use_array[MOST_USES];
  for (Py_ssize_t i = 0; i < use_count; i++)
    if (read_use(PySequence_Fast_GET_ITEM(uses, i), &use_array[i]) < 0) {
      PyErr_Clear();
      return not_here();
    }
  // Scalars: numpy and ctypes scalars (their buffers have no dimensions), and bytes. Plain
  // numbers (no dtype), pairs, arrays and buffers go to the Python path, which refuses or
  // converts them.
  devbuf_arg_t arg_array[MOST_ARGS];
  Py_buffer views[MOST_ARGS];
  Py_ssize_t viewed = 0;
  PyObject *result = NULL;
  for (; viewed < arg_count; viewed++) {
    PyObject *arg = PySequence_Fast_GET_ITEM(args, viewed);
    if (PyObject_GetBuffer(arg, &views[viewed], PyBUF_C_CONTIGUOUS) < 0) break;
    if (views[viewed].ndim != 0 && !PyBytes_CheckExact(arg)) { // an array, not a scalar
      PyBuffer_Release(&views[viewed]);
      break;
    }
    arg_array[viewed].data = views[viewed].buf;
    arg_array[viewed].size = (size_t)views[viewed].len;
  }
  if (viewed < arg_count) {
    PyErr_Clear();
    result = not_here();
  } else {
    const char *name = PyBytes_AS_STRING(argv[2]);
    devbuf_status status;
    // Released: a launch into a full queue waits for room, and the worker may need the GIL
    // (a host task) to make it.
    Py_BEGIN_ALLOW_THREADS status = queue_launch(queue, program, name, &grid, use_array,
                                                 (size_t)use_count, arg_array, (size_t)arg_count);
    Py_END_ALLOW_THREADS result = PyLong_FromLong(status);
  }
  for (Py_ssize_t i = 0; i < viewed; i++) PyBuffer_Release(&views[i]);
  return result;
}

static PyObject *launch_init(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *address, *type;
  if (!PyArg_ParseTuple(args, "OO!", &address, &PyType_Type, &type)) return NULL;
  void *function = PyLong_AsVoidPtr(address);
  if (!function) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_ValueError, "launch_init needs devbuf_queue_launch's address");
    return NULL;
  }
  queue_launch = (queue_launch_fn)(uintptr_t)function;
  Py_XSETREF(buffer_type, (PyTypeObject *)Py_NewRef(type));
  Py_RETURN_NONE;
}

static PyMethodDef launch_functions[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(queue, program, name, grid, local, uses, args) -> devbuf status, or "
     "NotImplemented for the Python path"},
    {"launch_init", launch_init, METH_VARARGS,
     "launch_init(devbuf_queue_launch's address, devbuf.Buffer)"},
    {NULL, NULL, 0, NULL},
};

int devbuf_ext_add_launch(PyObject *module) {
  handle_name = PyUnicode_InternFromString("_handle");
  read_name = PyUnicode_InternFromString("r");
  write_name = PyUnicode_InternFromString("w");
  read_write_name = PyUnicode_InternFromString("rw");
  if (!handle_name || !read_name || !write_name || !read_write_name) return -1;
  return PyModule_AddFunctions(module, launch_functions);
}
