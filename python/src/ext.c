// devbuf._ext: the two things of the Python package that Python cannot do itself; the rest
// of the binding is Python over libdevbuf (ctypes).
// - DLPack capsules. A capsule's destructor runs inside the interpreter's deallocation,
//   possibly while an exception is being raised, so it is C: it calls the tensor's deleter
//   only if no consumer took the tensor (a consumer renames the capsule "used_..."), as the
//   DLPack Python specification asks, and never again after a failing consumer called it.
// - Host accesses (Access, a context manager): the access's bytes are a HostMemory, a
//   buffer-protocol object that counts its exports (every view derived from a memoryview
//   shares the one export it holds), so that the access ends only once no memoryview or
//   array made from it is left, as the last view goes, calling libdevbuf's functions
//   directly (no Python code runs while a buffer is released).
// - Work from Python on a queue's worker thread (tasks.c), and kernel launches (launch.c).
#include "ext.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "../../src/interop/dlpack_abi.h"

static const char versioned_name[] = "dltensor_versioned";
static const char legacy_name[] = "dltensor";
static const char used_versioned_name[] = "used_dltensor_versioned";
static const char used_legacy_name[] = "used_dltensor";

// What a capsule holds: a copy of the producer's tensor whose deleter is ours. Consumers
// differ in what they do with a capsule: one that takes the tensor renames the capsule and
// calls the deleter once, later; one that fails (torch.from_dlpack of a device it cannot
// use) may call the deleter itself and leave the capsule's name alone. Either way the
// producer's deleter runs exactly once, and the proxy is freed once both the capsule and
// the consumer are done with it.
enum { ORIGINAL_DELETED = 1, CONSUMER_DONE = 2, CAPSULE_GONE = 4 };

typedef struct capsule_proxy {
  union { // first: the capsule's pointer is the tensor the consumer sees
    DLManagedTensorVersioned versioned;
    DLManagedTensor legacy;
  } tensor;
  int is_versioned;
  void *original; // the producer's DLManagedTensor(Versioned)
  _Atomic int state;
} capsule_proxy;

static void delete_original(int versioned, void *original) {
  if (versioned) {
    DLManagedTensorVersioned *tensor = original;
    if (tensor->deleter) tensor->deleter(tensor);
  } else {
    DLManagedTensor *tensor = original;
    if (tensor->deleter) tensor->deleter(tensor);
  }
}

static void delete_original_once(capsule_proxy *proxy) {
  if (!(atomic_fetch_or(&proxy->state, ORIGINAL_DELETED) & ORIGINAL_DELETED))
    delete_original(proxy->is_versioned, proxy->original);
}

// The consumer's call (once, or once more after a failure): the producer's deleter runs
// once; the proxy goes if the capsule is gone already.
static void consumer_done(capsule_proxy *proxy) {
  delete_original_once(proxy);
  if (atomic_fetch_or(&proxy->state, CONSUMER_DONE) & CAPSULE_GONE) PyMem_RawFree(proxy);
}
static void proxy_versioned_deleter(DLManagedTensorVersioned *tensor) {
  consumer_done(tensor->manager_ctx);
}
static void proxy_legacy_deleter(DLManagedTensor *tensor) { consumer_done(tensor->manager_ctx); }

static void capsule_destructor(PyObject *capsule) {
  const char *name = PyCapsule_GetName(capsule);
  capsule_proxy *proxy = PyCapsule_GetPointer(capsule, name);
  if (!proxy) {
    PyErr_Clear();
    return;
  }
  bool taken = name && strncmp(name, "used_", 5) == 0;
  if (!taken) { // nobody took the tensor (a failing consumer may have deleted it already)
    delete_original_once(proxy);
    PyMem_RawFree(proxy);
    return;
  }
  if (atomic_fetch_or(&proxy->state, CAPSULE_GONE) & CONSUMER_DONE) PyMem_RawFree(proxy);
}

// wrap(address, versioned) -> capsule owning the DLManagedTensor(Versioned) at `address`.
static PyObject *wrap(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long address;
  int versioned;
  if (!PyArg_ParseTuple(args, "Kp", &address, &versioned)) return NULL;
  if (!address) {
    PyErr_SetString(PyExc_ValueError, "a DLPack capsule needs a tensor, not NULL");
    return NULL;
  }
  void *original = (void *)(uintptr_t)address;
  capsule_proxy *proxy = PyMem_RawCalloc(1, sizeof *proxy);
  if (!proxy) {
    delete_original(versioned, original); // nobody else will give the tensor back
    return PyErr_NoMemory();
  }
  proxy->is_versioned = versioned;
  proxy->original = original;
  atomic_init(&proxy->state, 0);
  if (versioned) {
    proxy->tensor.versioned = *(DLManagedTensorVersioned *)original;
    proxy->tensor.versioned.manager_ctx = proxy;
    proxy->tensor.versioned.deleter = proxy_versioned_deleter;
  } else {
    proxy->tensor.legacy = *(DLManagedTensor *)original;
    proxy->tensor.legacy.manager_ctx = proxy;
    proxy->tensor.legacy.deleter = proxy_legacy_deleter;
  }
  PyObject *capsule =
      PyCapsule_New(proxy, versioned ? versioned_name : legacy_name, capsule_destructor);
  if (!capsule) {
    delete_original(versioned, original);
    PyMem_RawFree(proxy);
  }
  return capsule;
}

// peek(capsule) -> (address, versioned): the tensor of an unconsumed DLPack capsule.
static PyObject *peek(PyObject *self, PyObject *capsule) {
  (void)self;
  int versioned = PyCapsule_IsValid(capsule, versioned_name);
  if (!versioned && !PyCapsule_IsValid(capsule, legacy_name)) {
    PyErr_SetString(PyExc_TypeError,
                    "not an unconsumed DLPack capsule (named 'dltensor_versioned' or 'dltensor')");
    return NULL;
  }
  void *tensor = PyCapsule_GetPointer(capsule, versioned ? versioned_name : legacy_name);
  if (!tensor) return NULL;
  return Py_BuildValue("(KO)", (unsigned long long)(uintptr_t)tensor,
                       versioned ? Py_True : Py_False);
}

// consume(capsule): the tensor now belongs to the caller; the capsule will not delete it.
static PyObject *consume(PyObject *self, PyObject *capsule) {
  (void)self;
  int versioned = PyCapsule_IsValid(capsule, versioned_name);
  if (!versioned && !PyCapsule_IsValid(capsule, legacy_name)) {
    PyErr_SetString(PyExc_TypeError, "not an unconsumed DLPack capsule");
    return NULL;
  }
  bool ours = PyCapsule_GetDestructor(capsule) == capsule_destructor;
  if (PyCapsule_SetName(capsule, versioned ? used_versioned_name : used_legacy_name) != 0)
    return NULL;
  // Ours frees its proxy once both the consumer and the capsule are done (the renamed
  // capsule tells it the tensor was taken): clearing it leaked the proxy at every import.
  // Another producer's destructor may not look at the name: cleared.
  if (!ours && PyCapsule_SetDestructor(capsule, NULL) != 0) return NULL;
  Py_RETURN_NONE;
}

// ---- HostMemory -----------------------------------------------------------------------

typedef int (*end_access_fn)(void *buffer, const void *data); // devbuf_buffer_end_access
typedef void (*release_fn)(void *buffer);                     // devbuf_buffer_release

typedef struct {
  PyObject_HEAD void *address;
  Py_ssize_t size;
  int readonly;
  int closed;
  Py_ssize_t exports;
  // The access to end, and the handle reference to drop, when the last view goes (or now).
  end_access_fn end_access;
  release_fn release;
  void *buffer;
} HostMemory;

static void end_now(HostMemory *self) {
  end_access_fn end = self->end_access;
  void *buffer = self->buffer;
  self->end_access = NULL;
  self->buffer = NULL;
  self->closed = 1;
  if (end) end(buffer, self->size ? self->address : NULL);
  if (buffer) self->release(buffer); // an access's reference, or a hold's
}

static int host_memory_getbuffer(PyObject *object, Py_buffer *view, int flags) {
  HostMemory *self = (HostMemory *)object;
  if (self->closed) {
    PyErr_SetString(PyExc_BufferError, "the host access has ended");
    view->obj = NULL;
    return -1;
  }
  static char empty[1];
  if (PyBuffer_FillInfo(view, object, self->size ? self->address : empty, self->size,
                        self->readonly, flags) < 0)
    return -1;
  self->exports++;
  return 0;
}

static void host_memory_releasebuffer(PyObject *object, Py_buffer *view) {
  (void)view;
  HostMemory *self = (HostMemory *)object;
  if (--self->exports == 0 && (self->end_access || self->buffer)) end_now(self);
}

// A HostMemory owns its access from the moment an Access opens it, and ends it when it goes:
// however Python code around it is interrupted, the access cannot outlive it.
static void host_memory_dealloc(PyObject *object) {
  HostMemory *self = (HostMemory *)object;
  if (self->end_access || self->buffer) end_now(self);
  Py_TYPE(object)->tp_free(object);
}

static PyBufferProcs host_memory_buffer = {host_memory_getbuffer, host_memory_releasebuffer};
static PyTypeObject host_memory_type;

PyObject *devbuf_ext_memory_new(void *address, Py_ssize_t size, int readonly) {
  HostMemory *memory = PyObject_New(HostMemory, &host_memory_type);
  if (!memory) return NULL;
  memory->address = address;
  memory->size = size;
  memory->readonly = readonly;
  memory->closed = 0;
  memory->exports = 0;
  memory->end_access = NULL;
  memory->release = NULL;
  memory->buffer = NULL;
  return (PyObject *)memory;
}

Py_ssize_t devbuf_ext_memory_exports(PyObject *memory) { return ((HostMemory *)memory)->exports; }

void devbuf_ext_memory_close(PyObject *memory) { ((HostMemory *)memory)->closed = 1; }

void devbuf_ext_memory_hold(PyObject *memory, void *buffer, void (*release)(void *buffer)) {
  HostMemory *self = (HostMemory *)memory;
  self->buffer = buffer;
  self->release = release;
}

static PyTypeObject host_memory_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "devbuf._ext.HostMemory",
    .tp_basicsize = sizeof(HostMemory),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "the bytes of an open host access (made by Access.__enter__), counting "
              "their views",
    .tp_dealloc = host_memory_dealloc,
    .tp_as_buffer = &host_memory_buffer,
};

// ---- Access ----------------------------------------------------------------------------
// A host access as a context manager, all of it in C: between opening the access and
// recording who owns it, and between leaving the block and ending it, no Python code runs,
// so a KeyboardInterrupt (raised only between Python instructions) cannot leave an access
// open. The access belongs to a HostMemory from the moment it opens: if anything fails or
// is interrupted after that, dropping the HostMemory ends it.

typedef int (*open_fn)(void *buffer, void **data, size_t *size); // devbuf_buffer_contents*
typedef void *(*retain_fn)(void *buffer);                        // devbuf_buffer_retain

typedef struct {
  PyObject_HEAD open_fn open;
  end_access_fn end_access;
  release_fn release;
  retain_fn retain;
  void *buffer; // borrowed: the Python Buffer in `owner` holds it
  int readonly;
  PyObject *owner;      // the Python Buffer, kept alive while this lives
  PyObject *format;     // a struct format for the memoryview, or None
  PyObject *shape;      // a tuple
  PyObject *check;      // check(status): raises the error of a status
  PyObject *open_error; // raised when views outlive the block
  HostMemory *memory;   // while open
  PyObject *view;       // the memoryview handed out, while open
} Access;

static int access_init(PyObject *object, PyObject *args, PyObject *kwargs) {
  Access *self = (Access *)object;
  unsigned long long open, end, release, retain, buffer;
  PyObject *owner, *format, *shape, *check, *open_error;
  if (kwargs && PyDict_Size(kwargs)) {
    PyErr_SetString(PyExc_TypeError, "Access takes no keywords");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "KKKKKpOOO!OO", &open, &end, &release, &retain, &buffer,
                        &self->readonly, &owner, &format, &PyTuple_Type, &shape, &check,
                        &open_error))
    return -1;
  if (!open || !end || !release || !retain || !buffer) {
    PyErr_SetString(PyExc_ValueError, "Access needs four function addresses and a buffer");
    return -1;
  }
  self->open = (open_fn)(uintptr_t)open;
  self->end_access = (end_access_fn)(uintptr_t)end;
  self->release = (release_fn)(uintptr_t)release;
  self->retain = (retain_fn)(uintptr_t)retain;
  // Its own reference from the start: a Buffer closed before the block is entered (or
  // between two entries) must not leave the access a freed handle.
  if (self->buffer) self->release(self->buffer); // __init__ called again
  self->buffer = self->retain((void *)(uintptr_t)buffer);
  Py_XSETREF(self->owner, Py_NewRef(owner));
  Py_XSETREF(self->format, Py_NewRef(format));
  Py_XSETREF(self->shape, Py_NewRef(shape));
  Py_XSETREF(self->check, Py_NewRef(check));
  Py_XSETREF(self->open_error, Py_NewRef(open_error));
  return 0;
}

static PyObject *raise_status(Access *self, int status) {
  PyObject *result = PyObject_CallFunction(self->check, "i", status);
  Py_XDECREF(result);
  if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "devbuf status %d", status);
  return NULL;
}

static PyObject *access_enter(PyObject *object, PyObject *unused) {
  (void)unused;
  Access *self = (Access *)object;
  if (self->memory) return raise_status(self, 1); // INVALID_ARGUMENT: open already
  void *data = NULL;
  size_t size = 0;
  int status;
  Py_BEGIN_ALLOW_THREADS status = self->open(self->buffer, &data, &size); // may wait for work
  Py_END_ALLOW_THREADS if (status != 0) return raise_status(self, status);
  HostMemory *memory = (HostMemory *)devbuf_ext_memory_new(data, (Py_ssize_t)size, self->readonly);
  if (!memory) { // nothing owns the access yet: end it here
    self->end_access(self->buffer, data);
    return NULL;
  }
  memory->end_access = self->end_access; // from here on, dropping `memory` ends the access
  memory->release = self->release;
  memory->buffer = self->retain(self->buffer);
  PyObject *view = PyMemoryView_FromObject((PyObject *)memory);
  if (view && self->format != Py_None && size) {
    PyObject *cast = PyObject_CallMethod(view, "cast", "OO", self->format, self->shape);
    Py_SETREF(view, cast);
  }
  if (!view) {
    Py_DECREF(memory);
    return NULL;
  }
  self->memory = memory;
  self->view = Py_NewRef(view);
  return view;
}

// Ends the access now, or (when views made from the block's view are alive) when the last
// of them goes, raising the open-access error then.
static PyObject *access_close(PyObject *object, PyObject *unused) {
  (void)unused;
  Access *self = (Access *)object;
  HostMemory *memory = self->memory;
  if (!memory) Py_RETURN_NONE;
  PyObject *view = self->view;
  self->view = NULL;
  self->memory = NULL;
  if (view) {
    PyObject *released = PyObject_CallMethod(view, "release", NULL);
    if (released)
      Py_DECREF(released);
    else
      PyErr_Clear(); // an array holds this very view: the memory counts it
    Py_DECREF(view);
  }
  Py_ssize_t alive = memory->exports;
  if (alive == 0)
    end_now(memory);
  else
    memory->closed = 1; // no new views; the last one ends the access
  Py_DECREF(memory);
  if (alive == 0) Py_RETURN_NONE;
  PyErr_Format(self->open_error,
               "HOST_ACCESS_OPEN: %zd view(s) of the host access's memory are still alive: the "
               "access ends when the last of them is gone, and queued work on the bytes is "
               "refused until then",
               alive);
  return NULL;
}

static PyObject *access_exit(PyObject *object, PyObject *args) {
  (void)args;
  return access_close(object, NULL);
}

static void access_dealloc(PyObject *object) {
  Access *self = (Access *)object;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyObject *closed = access_close(object, NULL);
  if (closed)
    Py_DECREF(closed);
  else
    PyErr_Clear(); // views still alive: the access ends with the last of them
  PyErr_Restore(type, value, traceback);
  if (self->buffer) self->release(self->buffer);
  self->buffer = NULL;
  Py_CLEAR(self->owner);
  Py_CLEAR(self->format);
  Py_CLEAR(self->shape);
  Py_CLEAR(self->check);
  Py_CLEAR(self->open_error);
  Py_TYPE(object)->tp_free(object);
}

static PyObject *access_is_open(PyObject *object, void *unused) {
  (void)unused;
  return PyBool_FromLong(((Access *)object)->memory != NULL);
}

static PyMethodDef access_methods[] = {
    {"__enter__", access_enter, METH_NOARGS, "opens the access: a memoryview of its bytes"},
    {"__exit__", access_exit, METH_VARARGS, "ends the access (see close)"},
    {"close", access_close, METH_NOARGS,
     "ends the access; while views of it are alive, raises and ends it with the last one"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef access_getset[] = {
    {"is_open", access_is_open, NULL, "whether the access is open", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject access_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "devbuf._ext.Access",
    .tp_basicsize = sizeof(Access),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Access(open, end_access, release, retain, buffer, readonly, owner, format, shape, "
              "check, open_error): a host access as a context manager",
    .tp_new = PyType_GenericNew,
    .tp_init = access_init,
    .tp_dealloc = access_dealloc,
    .tp_methods = access_methods,
    .tp_getset = access_getset,
};

// ---- the module ------------------------------------------------------------------------

PyObject *devbuf_ext_layouts(PyObject *self, PyObject *unused); // layouts.c
static PyMethodDef methods[] = {
    {"wrap", wrap, METH_VARARGS, "wrap(address, versioned) -> a DLPack capsule owning the tensor"},
    {"peek", peek, METH_O, "peek(capsule) -> (address, versioned) of an unconsumed DLPack capsule"},
    {"consume", consume, METH_O, "consume(capsule): mark the capsule's tensor as taken"},
    {"layouts", devbuf_ext_layouts, METH_NOARGS, "{structure: (sizeof, {field: offsetof})}"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_ext",
    "DLPack capsules and host-access memory for devbuf.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__ext(void) {
  if (PyType_Ready(&host_memory_type) < 0 || PyType_Ready(&access_type) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (!m) return NULL;
  if (devbuf_ext_add_tasks(m) < 0 || devbuf_ext_add_launch(m) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(&access_type);
  if (PyModule_AddObject(m, "Access", (PyObject *)&access_type) < 0) {
    Py_DECREF(&access_type);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
