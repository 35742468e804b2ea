// devbuf._ext: the two things of the Python package that Python cannot do itself; the rest
// of the binding is Python over libdevbuf (ctypes).
// - DLPack capsules. A capsule's destructor runs inside the interpreter's deallocation,
//   possibly while an exception is being raised, so it is C: it calls the tensor's deleter
//   only if no consumer took the tensor (a consumer renames the capsule "used_..."), as the
//   DLPack Python specification asks.
// - HostMemory: the bytes of an open host access as a buffer-protocol object that counts
//   its exports (every view derived from a memoryview shares the one export it holds), so
//   that the access ends only once no memoryview or array made from it is left: when the
//   Python side cannot end it yet, HostMemory ends it itself as the last view goes, calling
//   libdevbuf's functions directly (no Python code runs while a buffer is released).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../../src/interop/dlpack_abi.h"

static const char versioned_name[] = "dltensor_versioned";
static const char legacy_name[] = "dltensor";
static const char used_versioned_name[] = "used_dltensor_versioned";
static const char used_legacy_name[] = "used_dltensor";

static void versioned_destructor(PyObject *capsule) {
  if (!PyCapsule_IsValid(capsule, versioned_name)) return; // taken by a consumer
  DLManagedTensorVersioned *tensor = PyCapsule_GetPointer(capsule, versioned_name);
  if (tensor && tensor->deleter) tensor->deleter(tensor);
}

static void legacy_destructor(PyObject *capsule) {
  if (!PyCapsule_IsValid(capsule, legacy_name)) return;
  DLManagedTensor *tensor = PyCapsule_GetPointer(capsule, legacy_name);
  if (tensor && tensor->deleter) tensor->deleter(tensor);
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
  PyObject *capsule =
      PyCapsule_New((void *)(uintptr_t)address, versioned ? versioned_name : legacy_name,
                    versioned ? versioned_destructor : legacy_destructor);
  if (!capsule) { // nobody else will give the tensor back
    if (versioned) {
      DLManagedTensorVersioned *tensor = (DLManagedTensorVersioned *)(uintptr_t)address;
      if (tensor->deleter) tensor->deleter(tensor);
    } else {
      DLManagedTensor *tensor = (DLManagedTensor *)(uintptr_t)address;
      if (tensor->deleter) tensor->deleter(tensor);
    }
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
  if (PyCapsule_SetName(capsule, versioned ? used_versioned_name : used_legacy_name) != 0)
    return NULL;
  if (PyCapsule_SetDestructor(capsule, NULL) != 0) return NULL;
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
  // After end_later: the access to end, and the handle reference to drop, with the last view.
  end_access_fn end_access;
  release_fn release;
  void *buffer;
} HostMemory;

static void end_now(HostMemory *self) {
  end_access_fn end = self->end_access;
  self->end_access = NULL;
  self->closed = 1;
  if (end) {
    end(self->buffer, self->size ? self->address : NULL);
    self->release(self->buffer);
  }
}

static int host_memory_init(PyObject *object, PyObject *args, PyObject *kwargs) {
  HostMemory *self = (HostMemory *)object;
  unsigned long long address;
  Py_ssize_t size;
  int readonly;
  if (kwargs && PyDict_Size(kwargs)) {
    PyErr_SetString(PyExc_TypeError, "HostMemory(address, size, readonly) takes no keywords");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "Knp", &address, &size, &readonly)) return -1;
  if (size < 0 || (!address && size)) {
    PyErr_SetString(PyExc_ValueError, "HostMemory needs an address for a size above 0");
    return -1;
  }
  self->address = (void *)(uintptr_t)address;
  self->size = size;
  self->readonly = readonly;
  self->closed = 0;
  self->exports = 0;
  self->end_access = NULL;
  return 0;
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
  if (--self->exports == 0 && self->end_access) end_now(self);
}

// close(): no further views; BufferError while a view made before is still alive.
static PyObject *host_memory_close(PyObject *object, PyObject *unused) {
  (void)unused;
  HostMemory *self = (HostMemory *)object;
  if (self->exports > 0) {
    PyErr_Format(PyExc_BufferError, "%zd view(s) of the host access's memory are still alive",
                 self->exports);
    return NULL;
  }
  self->closed = 1;
  Py_RETURN_NONE;
}

// end_later(end_access, release, buffer): once no view is left (now, if none is), calls
// end_access(buffer, address) and release(buffer), both libdevbuf functions given by address;
// the caller hands over one reference to `buffer`.
static PyObject *host_memory_end_later(PyObject *object, PyObject *args) {
  HostMemory *self = (HostMemory *)object;
  unsigned long long end, release, buffer;
  if (!PyArg_ParseTuple(args, "KKK", &end, &release, &buffer)) return NULL;
  if (self->end_access || !end || !release || !buffer) {
    PyErr_SetString(PyExc_ValueError, "end_later takes three addresses, once");
    return NULL;
  }
  self->end_access = (end_access_fn)(uintptr_t)end;
  self->release = (release_fn)(uintptr_t)release;
  self->buffer = (void *)(uintptr_t)buffer;
  if (self->exports == 0) end_now(self);
  Py_RETURN_NONE;
}

static PyObject *host_memory_exports(PyObject *object, void *unused) {
  (void)unused;
  return PyLong_FromSsize_t(((HostMemory *)object)->exports);
}

static PyMethodDef host_memory_methods[] = {
    {"close", host_memory_close, METH_NOARGS,
     "close(): refuse further views (BufferError while views are alive)"},
    {"end_later", host_memory_end_later, METH_VARARGS,
     "end_later(end_access, release, buffer): end the access when the last view goes"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef host_memory_getset[] = {
    {"exports", host_memory_exports, NULL, "views of the memory alive now", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyBufferProcs host_memory_buffer = {host_memory_getbuffer, host_memory_releasebuffer};

static PyTypeObject host_memory_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "devbuf._ext.HostMemory",
    .tp_basicsize = sizeof(HostMemory),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "HostMemory(address, size, readonly): the bytes of an open host access, counting "
              "their views",
    .tp_new = PyType_GenericNew,
    .tp_init = host_memory_init,
    .tp_as_buffer = &host_memory_buffer,
    .tp_methods = host_memory_methods,
    .tp_getset = host_memory_getset,
};

// ---- the module ------------------------------------------------------------------------

static PyMethodDef methods[] = {
    {"wrap", wrap, METH_VARARGS, "wrap(address, versioned) -> a DLPack capsule owning the tensor"},
    {"peek", peek, METH_O, "peek(capsule) -> (address, versioned) of an unconsumed DLPack capsule"},
    {"consume", consume, METH_O, "consume(capsule): mark the capsule's tensor as taken"},
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
  if (PyType_Ready(&host_memory_type) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (!m) return NULL;
  Py_INCREF(&host_memory_type);
  if (PyModule_AddObject(m, "HostMemory", (PyObject *)&host_memory_type) < 0) {
    Py_DECREF(&host_memory_type);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
