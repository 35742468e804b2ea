// Work from Python that runs on a queue's worker thread: host tasks (Python callables) and
// CPU kernels given as ctypes functions. Both go through one C trampoline, so that:
// - a Python callable runs with the GIL taken on the worker, gets a memoryview of each use,
//   and its exception fails the queue with the exception named (the queue's events and
//   waiters see the message);
// - nothing submitted from Python enters the interpreter once it is exiting: tasks_close
//   (at exit) stops new entries and waits for those running, and later work fails with
//   CANCELLED instead of taking a GIL that is gone.
// The trampoline's scalars start with a header naming the Task; the user's scalars follow.
// The Python side keeps each Task alive until the work has run or been dropped.
#include "ext.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "../../include/devbuf.h"

typedef devbuf_status (*set_error_fn)(devbuf_status status, const char *format, ...);

static set_error_fn set_error;               // devbuf_set_error, from tasks_init
static void *(*retain_buffer)(void *buffer); // devbuf_buffer_retain, from tasks_init
static void (*release_buffer)(void *buffer); // devbuf_buffer_release, from tasks_init
static PyObject *status_codes;               // {"OUT_OF_MEMORY": 2, ...}, from tasks_init
static atomic_int tasks_running;             // trampolines between their check and their end
static atomic_bool closing;                  // the interpreter is exiting

typedef struct {
  PyObject_HEAD devbuf_cpu_kernel_fn kernel; // a native kernel, or NULL: call `callable`
  PyObject *callable;  // the host task; for a native kernel, what keeps it alive
  PyObject *views;     // per use: (format or None, shape, readonly, buffer handle)
  PyObject *exception; // what the host task raised (written on the worker, under the GIL)
  atomic_bool done;    // the work has run: the last thing the worker writes
} Task;

// What precedes the user's scalars: 16 bytes, so that theirs keep the item's alignment.
typedef struct {
  Task *task;
  void *unused;
} task_header;

// ---- running a Python callable ----------------------------------------------------------

static PyObject *view_of(PyObject *spec, void *data, size_t size, PyObject **out_memory) {
  PyObject *format = PyTuple_GET_ITEM(spec, 0), *shape = PyTuple_GET_ITEM(spec, 1);
  int readonly = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 2));
  *out_memory = devbuf_ext_memory_new(data, (Py_ssize_t)size, readonly);
  if (!*out_memory) return NULL;
  PyObject *view = PyMemoryView_FromObject(*out_memory);
  if (view && format != Py_None && size)
    Py_SETREF(view, PyObject_CallMethod(view, "cast", "OO", format, shape));
  return view;
}

// The status a Python exception fails the work with: a devbuf error's own, DEVICE_FAILURE
// for any other.
static devbuf_status status_of(PyObject *exception) {
  devbuf_status status = DEVBUF_DEVICE_FAILURE;
  PyObject *name = PyObject_GetAttrString(exception, "status");
  if (name && PyUnicode_Check(name) && status_codes) {
    PyObject *code = PyDict_GetItemWithError(status_codes, name);
    if (code) status = (devbuf_status)PyLong_AsLong(code);
  }
  Py_XDECREF(name);
  PyErr_Clear();
  return status == DEVBUF_OK ? DEVBUF_DEVICE_FAILURE : status;
}

// Records the callable's exception on the task and fails the work with it. The traceback's
// frames are cleared: their locals hold the use's views, which must go with the task.
static devbuf_status fail_with_exception(Task *task) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback) {
    PyException_SetTraceback(value, traceback);
    PyObject *module = PyImport_ImportModule("traceback");
    PyObject *cleared = module ? PyObject_CallMethod(module, "clear_frames", "O", traceback) : NULL;
    Py_XDECREF(cleared);
    Py_XDECREF(module);
    PyErr_Clear();
  }
  PyObject *name = PyObject_GetAttrString(task->callable, "__qualname__");
  if (!name) {
    PyErr_Clear();
    name = PyObject_Repr(task->callable);
  }
  PyObject *text = PyUnicode_FromFormat("host task %S raised %s: %S", name ? name : Py_None,
                                        value ? Py_TYPE(value)->tp_name : "an exception",
                                        value ? value : Py_None);
  const char *utf8 = text ? PyUnicode_AsUTF8(text) : NULL;
  devbuf_status status = status_of(value ? value : Py_None);
  PyErr_Clear();
  set_error(status, "%s", utf8 ? utf8 : "host task raised an exception that cannot be shown");
  Py_XDECREF(text);
  Py_XDECREF(name);
  Py_XSETREF(task->exception, value);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  return status;
}

static devbuf_status run_python(Task *task, const devbuf_kernel_args_t *args) {
  PyGILState_STATE gil = PyGILState_Ensure();
  devbuf_status status = DEVBUF_OK;
  size_t count = args->count;
  PyObject *views = PyTuple_New((Py_ssize_t)count), *memories = PyTuple_New((Py_ssize_t)count);
  for (size_t i = 0; views && memories && i < count; i++) {
    PyObject *memory = NULL;
    PyObject *view = args->data[i] ? view_of(PyTuple_GET_ITEM(task->views, (Py_ssize_t)i),
                                             args->data[i], args->sizes[i], &memory)
                                   : Py_NewRef(Py_None); // memory the CPU cannot address
    PyTuple_SET_ITEM(memories, (Py_ssize_t)i, memory ? memory : Py_NewRef(Py_None));
    if (!view) break;
    PyTuple_SET_ITEM(views, (Py_ssize_t)i, view);
  }
  PyObject *result = NULL;
  if (!PyErr_Occurred()) result = PyObject_CallObject(task->callable, views);
  if (!result) status = fail_with_exception(task);
  Py_XDECREF(result);
  Py_XDECREF(views);
  // Every view the task was given is gone now, unless it kept one (or an array over one):
  // that one would race with the queue's later work, so the task fails.
  for (size_t i = 0; memories && i < count; i++) {
    PyObject *memory = PyTuple_GET_ITEM(memories, (Py_ssize_t)i);
    if (!memory || memory == Py_None) continue;
    // No view can be made of it any more: a task that kept the view's `obj` (and no view)
    // made one later, over bytes that other buffers had by then.
    devbuf_ext_memory_close(memory);
    if (devbuf_ext_memory_exports(memory) == 0) continue;
    // The kept view must not outlive the bytes: the memory holds the buffer until it goes.
    void *handle =
        PyLong_AsVoidPtr(PyTuple_GET_ITEM(PyTuple_GET_ITEM(task->views, (Py_ssize_t)i), 3));
    if (handle && retain_buffer)
      devbuf_ext_memory_hold(memory, retain_buffer(handle), release_buffer);
    PyErr_Clear();
    if (status == DEVBUF_OK)
      status = set_error(DEVBUF_DEVICE_FAILURE,
                         "host task: a view of use %zu (%zu bytes) outlived the task (a "
                         "memoryview or array made from it was kept): it would race with the "
                         "queue's later work, so the task fails; copy the bytes instead",
                         i, args->sizes[i]);
  }
  Py_XDECREF(memories);
  PyGILState_Release(gil);
  return status;
}

// ---- the trampoline ----------------------------------------------------------------------

static devbuf_status run_task(const devbuf_kernel_args_t *args) {
  task_header header;
  if (args->scalars_size < sizeof header)
    return set_error(DEVBUF_INVALID_ARGUMENT,
                     "devbuf._ext's trampoline got %zu bytes of scalars, not its header",
                     args->scalars_size);
  memcpy(&header, args->scalars, sizeof header);
  atomic_fetch_add(&tasks_running, 1);
  if (atomic_load(&closing)) {
    atomic_fetch_sub(&tasks_running, 1);
    return set_error(DEVBUF_CANCELLED, "work submitted from Python no longer runs: the "
                                       "interpreter is exiting");
  }
  Task *task = header.task;
  devbuf_kernel_args_t inner = *args;
  inner.scalars = (const char *)args->scalars + sizeof header;
  inner.scalars_size = args->scalars_size - sizeof header;
  devbuf_status status = task->kernel ? task->kernel(&inner) : run_python(task, &inner);
  atomic_store(&task->done, true); // the Python side may let the task go from here on
  atomic_fetch_sub(&tasks_running, 1);
  return status;
}

// ---- Task --------------------------------------------------------------------------------

static int task_init(PyObject *object, PyObject *args, PyObject *kwargs) {
  Task *self = (Task *)object;
  unsigned long long kernel;
  PyObject *callable, *views;
  if (kwargs && PyDict_Size(kwargs)) {
    PyErr_SetString(PyExc_TypeError, "Task takes no keywords");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "KOO!", &kernel, &callable, &PyTuple_Type, &views)) return -1;
  if (!kernel && !PyCallable_Check(callable)) {
    PyErr_SetString(PyExc_TypeError, "a host task is a callable");
    return -1;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(views); i++) {
    PyObject *spec = PyTuple_GET_ITEM(views, i);
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 4 ||
        !PyTuple_Check(PyTuple_GET_ITEM(spec, 1)) || !PyLong_Check(PyTuple_GET_ITEM(spec, 3))) {
      PyErr_SetString(PyExc_TypeError,
                      "a Task's views are (format, shape tuple, readonly, buffer handle)");
      return -1;
    }
  }
  self->kernel = (devbuf_cpu_kernel_fn)(uintptr_t)kernel;
  Py_XSETREF(self->callable, Py_NewRef(callable));
  Py_XSETREF(self->views, Py_NewRef(views));
  atomic_store(&self->done, false);
  return 0;
}

static void task_dealloc(PyObject *object) {
  Task *self = (Task *)object;
  Py_CLEAR(self->callable);
  Py_CLEAR(self->views);
  Py_CLEAR(self->exception);
  Py_TYPE(object)->tp_free(object);
}

static PyObject *task_done(PyObject *object, void *unused) {
  (void)unused;
  return PyBool_FromLong(atomic_load(&((Task *)object)->done));
}

static PyObject *task_exception(PyObject *object, void *unused) {
  (void)unused;
  PyObject *exception = ((Task *)object)->exception;
  return Py_NewRef(exception ? exception : Py_None);
}

static PyObject *task_header_bytes(PyObject *object, void *unused) {
  (void)unused;
  task_header header = {(Task *)object, NULL};
  return PyBytes_FromStringAndSize((const char *)&header, sizeof header);
}

static PyGetSetDef task_getset[] = {
    {"done", task_done, NULL, "whether the work has run", NULL},
    {"exception", task_exception, NULL, "what the host task raised, or None", NULL},
    {"header", task_header_bytes, NULL, "the bytes that start the trampoline's scalars", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject task_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "devbuf._ext.Task",
    .tp_basicsize = sizeof(Task),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Task(kernel, callable, views): work for the trampoline (TRAMPOLINE): a "
              "native kernel's address, or 0 and a Python callable given a view per use",
    .tp_new = PyType_GenericNew,
    .tp_init = task_init,
    .tp_dealloc = task_dealloc,
    .tp_getset = task_getset,
};

// ---- the module's functions ----------------------------------------------------------------

// A child forked while a trampoline ran has no thread to bring the count down: tasks_close
// at its exit would wait for good.
static void tasks_forked_child(void) { atomic_store(&tasks_running, 0); }
static void register_fork_hook(void) { pthread_atfork(NULL, NULL, tasks_forked_child); }

static PyObject *tasks_init(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long address, retain, release;
  PyObject *codes;
  if (!PyArg_ParseTuple(args, "KO!KK", &address, &PyDict_Type, &codes, &retain, &release))
    return NULL;
  if (!address || !retain || !release) {
    PyErr_SetString(PyExc_ValueError, "tasks_init needs the addresses of devbuf_set_error, "
                                      "devbuf_buffer_retain and devbuf_buffer_release");
    return NULL;
  }
  static pthread_once_t fork_hook = PTHREAD_ONCE_INIT;
  pthread_once(&fork_hook, register_fork_hook);
  set_error = (set_error_fn)(uintptr_t)address;
  retain_buffer = (void *(*)(void *))(uintptr_t)retain;
  release_buffer = (void (*)(void *))(uintptr_t)release;
  Py_XSETREF(status_codes, Py_NewRef(codes));
  Py_RETURN_NONE;
}

// At exit: no trampoline enters the interpreter from now on; waits (without the GIL, which
// the running ones need) until those inside have left.
static PyObject *tasks_close(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  atomic_store(&closing, true);
  Py_BEGIN_ALLOW_THREADS while (atomic_load(&tasks_running) > 0) usleep(1000);
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyMethodDef task_functions[] = {
    {"tasks_init", tasks_init, METH_VARARGS,
     "tasks_init(set_error_address, status_codes): what the trampoline reports failures with"},
    {"tasks_close", tasks_close, METH_NOARGS,
     "tasks_close(): at exit, keep work from entering the interpreter and wait for what runs"},
    {NULL, NULL, 0, NULL},
};

int devbuf_ext_add_tasks(PyObject *module) {
  if (PyType_Ready(&task_type) < 0) return -1;
  Py_INCREF(&task_type);
  if (PyModule_AddObject(module, "Task", (PyObject *)&task_type) < 0) {
    Py_DECREF(&task_type);
    return -1;
  }
  devbuf_cpu_kernel_fn trampoline = run_task;
  PyObject *address = PyLong_FromVoidPtr((void *)(uintptr_t)trampoline);
  if (!address || PyModule_AddObject(module, "TRAMPOLINE", address) < 0) {
    Py_XDECREF(address);
    return -1;
  }
  return PyModule_AddFunctions(module, task_functions);
}
