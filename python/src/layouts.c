// devbuf._ext.layouts(): the size and field offsets of every structure the ctypes binding
// mirrors (python/devbuf/_native.py), as this compiler lays them out from devbuf.h.
// python/tests/test_binding.py compares them with ctypes' layout of the mirrors: a mirror
// that drifts from the header would otherwise read and write the wrong bytes in silence.
// A new mirror needs its structure here, every field of it (the test compares the names
// with the header's).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <string.h>

#include "../../include/devbuf.h"

typedef struct member {
  const char *structure;
  const char *field; // NULL: the row gives the structure's size
  size_t value;
} member;

#define SIZE(type) \
  { #type, NULL, sizeof(type) }
#define FIELD(type, name) \
  { #type, #name, offsetof(type, name) }

static const member members[] = {
    SIZE(devbuf_device_info_t),
    FIELD(devbuf_device_info_t, name),
    FIELD(devbuf_device_info_t, version),
    FIELD(devbuf_device_info_t, global_memory),
    FIELD(devbuf_device_info_t, max_allocation),
    FIELD(devbuf_device_info_t, alignment),
    FIELD(devbuf_device_info_t, host_unified),
    FIELD(devbuf_device_info_t, svm_capabilities),
    FIELD(devbuf_device_info_t, processor),
    FIELD(devbuf_device_info_t, capabilities),

    SIZE(devbuf_allocator_stats_t),
    FIELD(devbuf_allocator_stats_t, active),
    FIELD(devbuf_allocator_stats_t, peak),
    FIELD(devbuf_allocator_stats_t, reserved),
    FIELD(devbuf_allocator_stats_t, cached),
    FIELD(devbuf_allocator_stats_t, released_in_flight),
    FIELD(devbuf_allocator_stats_t, segments),
    FIELD(devbuf_allocator_stats_t, largest_free_block),
    FIELD(devbuf_allocator_stats_t, fragmentation),
    FIELD(devbuf_allocator_stats_t, mapped),
    FIELD(devbuf_allocator_stats_t, live_buffers),
    FIELD(devbuf_allocator_stats_t, system_allocs),
    FIELD(devbuf_allocator_stats_t, system_frees),
    FIELD(devbuf_allocator_stats_t, cache_hits),
    FIELD(devbuf_allocator_stats_t, alloc_calls),
    FIELD(devbuf_allocator_stats_t, failed_allocs),
    FIELD(devbuf_allocator_stats_t, peak_reserved),

    SIZE(devbuf_caching_options_t),
    FIELD(devbuf_caching_options_t, memory_limit),
    FIELD(devbuf_caching_options_t, cache_limit),
    FIELD(devbuf_caching_options_t, max_buffers),
    FIELD(devbuf_caching_options_t, page_size),
    FIELD(devbuf_caching_options_t, growable),

    SIZE(devbuf_snapshot_block_t),
    FIELD(devbuf_snapshot_block_t, offset),
    FIELD(devbuf_snapshot_block_t, size),
    FIELD(devbuf_snapshot_block_t, state),

    SIZE(devbuf_snapshot_segment_t),
    FIELD(devbuf_snapshot_segment_t, serial),
    FIELD(devbuf_snapshot_segment_t, device),
    FIELD(devbuf_snapshot_segment_t, size),
    FIELD(devbuf_snapshot_segment_t, pool),
    FIELD(devbuf_snapshot_segment_t, block_count),
    FIELD(devbuf_snapshot_segment_t, blocks),

    SIZE(devbuf_allocator_snapshot_t),
    FIELD(devbuf_allocator_snapshot_t, segment_count),
    FIELD(devbuf_allocator_snapshot_t, segments),

    SIZE(devbuf_tensor_info_t),
    FIELD(devbuf_tensor_info_t, name),
    FIELD(devbuf_tensor_info_t, dtype),
    FIELD(devbuf_tensor_info_t, ndim),
    FIELD(devbuf_tensor_info_t, shape),
    FIELD(devbuf_tensor_info_t, begin),
    FIELD(devbuf_tensor_info_t, end),
    FIELD(devbuf_tensor_info_t, file_offset),

    SIZE(devbuf_load_options_t),
    FIELD(devbuf_load_options_t, flags),
    FIELD(devbuf_load_options_t, on_tensor),
    FIELD(devbuf_load_options_t, context),
    FIELD(devbuf_load_options_t, allocator),
    FIELD(devbuf_load_options_t, select),

    SIZE(devbuf_named_buffer_t),
    FIELD(devbuf_named_buffer_t, name),
    FIELD(devbuf_named_buffer_t, buffer),

    SIZE(devbuf_metadata_entry_t),
    FIELD(devbuf_metadata_entry_t, key),
    FIELD(devbuf_metadata_entry_t, value),

    SIZE(devbuf_use_t),
    FIELD(devbuf_use_t, buffer),
    FIELD(devbuf_use_t, access),

    SIZE(devbuf_launch_t),
    FIELD(devbuf_launch_t, dims),
    FIELD(devbuf_launch_t, global),
    FIELD(devbuf_launch_t, local),

    SIZE(devbuf_arg_t),
    FIELD(devbuf_arg_t, data),
    FIELD(devbuf_arg_t, size),

    SIZE(devbuf_kernel_args_t),
    FIELD(devbuf_kernel_args_t, data),
    FIELD(devbuf_kernel_args_t, sizes),
    FIELD(devbuf_kernel_args_t, count),
    FIELD(devbuf_kernel_args_t, scalars),
    FIELD(devbuf_kernel_args_t, scalars_size),
};

// {structure: (sizeof, {field: offsetof})}. Rows of one structure follow its SIZE row.
PyObject *devbuf_ext_layouts(PyObject *self, PyObject *unused) {
  PyObject *result = PyDict_New();
  PyObject *fields = NULL; // the last structure's, borrowed from result
  const char *structure = "";
  if (!result) return NULL;
  for (size_t i = 0; i < sizeof members / sizeof members[0]; i++) {
    const member *row = &members[i];
    if (row->field && strcmp(row->structure, structure) != 0) {
      PyErr_Format(PyExc_SystemError, "layouts.c: %s.%s does not follow SIZE(%s)", row->structure,
                   row->field, row->structure);
      goto fail;
    }
    PyObject *entry = row->field ? PyLong_FromSize_t(row->value)
                                 : Py_BuildValue("(nN)", (Py_ssize_t)row->value, PyDict_New());
    if (!entry) goto fail;
    int failed;
    if (row->field) {
      failed = PyDict_SetItemString(fields, row->field, entry);
    } else {
      fields = PyTuple_GET_ITEM(entry, 1);
      structure = row->structure;
      failed = PyDict_SetItemString(result, row->structure, entry);
    }
    Py_DECREF(entry);
    if (failed) goto fail;
  }
  return result;
fail:
  Py_DECREF(result);
  return NULL;
}
