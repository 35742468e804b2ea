// devbuf._capsule: the DLPack capsules of the Python package. A capsule's destructor runs
// inside the interpreter's deallocation, possibly while an exception is being raised, so
// it has to be C: it calls the tensor's deleter only if no consumer took the tensor (a
// consumer renames the capsule "used_..."), as the DLPack Python specification asks.
// Everything else of the binding is Python over libdevbuf (ctypes).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../../src/dlpack_abi.h"

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
  return PyCapsule_New((void *)(uintptr_t)address, versioned ? versioned_name : legacy_name,
                       versioned ? versioned_destructor : legacy_destructor);
}

// peek(capsule) -> (address, versioned): the tensor of an unconsumed DLPack capsule.
static PyObject *peek(PyObject *self, PyObject *capsule) {
  (void)self;
  int versioned = PyCapsule_IsValid(capsule, versioned_name);
  if (!versioned && !PyCapsule_IsValid(capsule, legacy_name)) {
    PyErr_SetString(PyExc_TypeError, "not an unconsumed DLPack capsule (named 'dltensor_versioned' or 'dltensor')");
    return NULL;
  }
  void *tensor = PyCapsule_GetPointer(capsule, versioned ? versioned_name : legacy_name);
  if (!tensor) return NULL;
  return Py_BuildValue("(KO)", (unsigned long long)(uintptr_t)tensor, versioned ? Py_True : Py_False);
}

// consume(capsule): the tensor now belongs to the caller; the capsule will not delete it.
static PyObject *consume(PyObject *self, PyObject *capsule) {
  (void)self;
  int versioned = PyCapsule_IsValid(capsule, versioned_name);
  if (!versioned && !PyCapsule_IsValid(capsule, legacy_name)) {
    PyErr_SetString(PyExc_TypeError, "not an unconsumed DLPack capsule");
    return NULL;
  }
  if (PyCapsule_SetName(capsule, versioned ? used_versioned_name : used_legacy_name) != 0) return NULL;
  if (PyCapsule_SetDestructor(capsule, NULL) != 0) return NULL;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"wrap", wrap, METH_VARARGS, "wrap(address, versioned) -> a DLPack capsule owning the tensor"},
    {"peek", peek, METH_O, "peek(capsule) -> (address, versioned) of an unconsumed DLPack capsule"},
    {"consume", consume, METH_O, "consume(capsule): mark the capsule's tensor as taken"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_capsule", "DLPack capsules for devbuf (C, for their destructors).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__capsule(void) { return PyModule_Create(&module); }
