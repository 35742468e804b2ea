// Host access: pointers for reading and writing that stay open until ended,
// typed views, item, and the unsynchronized pointer.
#include "core.h"

#include <string.h>

// Checks what every host access needs and returns the view's address.
static devbuf_status prepare_host(devbuf_buffer_t *buffer, bool write, const char *what,
                                  char **out_data) {
  if (!buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: buffer is NULL", what);
  devbuf__storage *storage = buffer->storage;
  if (!devbuf__storage_host_accessible(storage))
    return devbuf__error(DEVBUF_NOT_CPU_ACCESSIBLE,
                         "%s: buffer %llu lives in %s memory the CPU cannot access; use copies",
                         what, (unsigned long long)buffer->handle_id, storage->device->spec);
  if (write && storage->read_only)
    return devbuf__error(DEVBUF_READ_ONLY, "%s: buffer %llu is a read-only %s", what,
                         (unsigned long long)buffer->handle_id,
                         devbuf__storage_kind_of(storage)->name);
  devbuf_status status = devbuf__storage_ensure_allocated(storage);
  if (status != DEVBUF_OK) return status;
  *out_data = buffer->size ? (char *)storage->memory.host + buffer->offset : NULL;
  return DEVBUF_OK;
}

static devbuf_status open_access(devbuf_buffer_t *buffer, bool write, devbuf__own_work own,
                                 const char *what, char **out_data) {
  char *data = NULL;
  devbuf_status status = prepare_host(buffer, write, what, &data);
  if (status != DEVBUF_OK) return status;
  devbuf__host_access wanted = {.handle = buffer,
                                .data = data,
                                .offset = buffer->offset,
                                .size = buffer->size,
                                .write = write};
  status = devbuf__host_access_open(buffer->storage, &wanted, 1, own, false, what, NULL);
  if (status == DEVBUF_OK) *out_data = data;
  return status;
}

devbuf_status devbuf__host_operation_begin(devbuf__storage *storage,
                                           const devbuf__byte_range *ranges, size_t count,
                                           const char *what, devbuf__host_access **out_accesses) {
  devbuf__host_access wanted[DEVBUF__HOST_ACCESS_RANGES] = {{.write = false}, {.write = false}};
  for (size_t i = 0; i < count && i < DEVBUF__HOST_ACCESS_RANGES; i++)
    wanted[i] = (devbuf__host_access){
        .offset = ranges[i].offset, .size = ranges[i].size, .write = ranges[i].write};
  return devbuf__host_access_open(storage, wanted, count, DEVBUF__OWN_WAIT, true, what,
                                  out_accesses);
}

void devbuf__host_operation_end(devbuf__storage *storage, devbuf__host_access *access) {
  devbuf__host_access_close(storage, access);
}

static devbuf_status contents(devbuf_buffer_t *buffer, bool write, devbuf__own_work own,
                              const char *what, void **out_data, size_t *out_size) {
  if (!out_data) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: out_data is NULL", what);
  char *data = NULL;
  devbuf_status status = open_access(buffer, write, own, what, &data);
  if (status != DEVBUF_OK) return status;
  *out_data = data;
  if (out_size) *out_size = buffer->size;
  return DEVBUF_OK;
}

devbuf_status devbuf_buffer_contents(devbuf_buffer_t *buffer, const void **out_data,
                                     size_t *out_size) {
  return contents(buffer, false, DEVBUF__OWN_REFUSE, "contents", (void **)out_data, out_size);
}

devbuf_status devbuf_buffer_contents_mut(devbuf_buffer_t *buffer, void **out_data,
                                         size_t *out_size) {
  return contents(buffer, true, DEVBUF__OWN_REFUSE, "contents_mut", out_data, out_size);
}

devbuf_status devbuf_buffer_contents_wait(devbuf_buffer_t *buffer, const void **out_data,
                                          size_t *out_size) {
  return contents(buffer, false, DEVBUF__OWN_WAIT, "contents_wait", (void **)out_data, out_size);
}

devbuf_status devbuf_buffer_contents_mut_wait(devbuf_buffer_t *buffer, void **out_data,
                                              size_t *out_size) {
  return contents(buffer, true, DEVBUF__OWN_WAIT, "contents_mut_wait", out_data, out_size);
}

devbuf_status devbuf_buffer_end_access(devbuf_buffer_t *buffer, const void *data) {
  if (!buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "end_access: buffer is NULL");
  if (!devbuf__host_access_close_at(buffer->storage, buffer, data))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "end_access: buffer %llu has no open access at %p",
                         (unsigned long long)buffer->handle_id, data);
  return DEVBUF_OK;
}

size_t devbuf_buffer_open_accesses(const devbuf_buffer_t *buffer) {
  return buffer ? devbuf__host_access_count(buffer->storage, buffer) : 0;
}

// The buffer and the pointer the result goes to (`out`, named `out_name`) first, as the NULL
// rule has it; then the dtype.
static devbuf_status check_dtype(const devbuf_buffer_t *buffer, devbuf_dtype dtype, const void *out,
                                 const char *out_name, const char *what) {
  if (!buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: buffer is NULL", what);
  if (!out) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: %s is NULL", what, out_name);
  if (!devbuf_dtype_name(dtype))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s as dtype %d, which is none (of a %s buffer)",
                         what, (int)dtype, devbuf_dtype_name(buffer->dtype));
  if (buffer->dtype != dtype)
    return devbuf__error(DEVBUF_TYPE_MISMATCH, "%s as %s of a %s buffer", what,
                         devbuf_dtype_name(dtype), devbuf_dtype_name(buffer->dtype));
  return DEVBUF_OK;
}

static devbuf_status as_array(devbuf_buffer_t *buffer, devbuf_dtype dtype, bool write,
                              devbuf_array_t *out) {
  const char *what = write ? "as_array_mut" : "as_array";
  devbuf_status status = check_dtype(buffer, dtype, out, "out_array", what);
  if (status != DEVBUF_OK) return status;
  char *data = NULL;
  status = open_access(buffer, write, DEVBUF__OWN_REFUSE, what, &data);
  if (status != DEVBUF_OK) return status;
  out->data = data;
  out->dtype = dtype;
  out->ndim = buffer->ndim;
  int64_t stride = 1;
  for (size_t i = buffer->ndim; i-- > 0;) {
    out->shape[i] = buffer->shape[i];
    out->strides[i] = stride;
    stride *= (int64_t)buffer->shape[i];
  }
  return DEVBUF_OK;
}

devbuf_status devbuf_buffer_as_array(devbuf_buffer_t *buffer, devbuf_dtype dtype,
                                     devbuf_array_t *out_array) {
  return as_array(buffer, dtype, false, out_array);
}

devbuf_status devbuf_buffer_as_array_mut(devbuf_buffer_t *buffer, devbuf_dtype dtype,
                                         devbuf_array_t *out_array) {
  return as_array(buffer, dtype, true, out_array);
}

devbuf_status devbuf_buffer_as_slice(devbuf_buffer_t *buffer, devbuf_dtype dtype,
                                     const void **out_data, size_t *out_count) {
  devbuf_status status = check_dtype(buffer, dtype, out_data, "out_data", "as_slice");
  if (status != DEVBUF_OK) return status;
  status = devbuf_buffer_contents(buffer, out_data, NULL);
  if (status != DEVBUF_OK) return devbuf__error_cause(status, "as_slice");
  if (out_count) *out_count = devbuf_buffer_count(buffer);
  return status;
}

devbuf_status devbuf_buffer_item(devbuf_buffer_t *buffer, devbuf_dtype dtype, void *out_value) {
  devbuf_status status = check_dtype(buffer, dtype, out_value, "out_value", "item");
  if (status != DEVBUF_OK) return status;
  size_t count = devbuf_buffer_count(buffer);
  unsigned char value[16]; // one element of any dtype
  if (count != 1 || buffer->size > sizeof value)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "item needs exactly one element; buffer %llu holds %zu",
                         (unsigned long long)buffer->handle_id, count);
  // Read apart, so that a read that fails part-way (a file cut under its mapping) leaves
  // the caller's value as it was.
  status = devbuf_buffer_copyout(buffer, value, buffer->size); // works on every backend
  if (status != DEVBUF_OK) return devbuf__error_cause(status, "item");
  memcpy(out_value, value, buffer->size);
  return DEVBUF_OK;
}

// Every case but the one below: its own function, so that the one below needs no frame.
static __attribute__((noinline)) devbuf_status
unsynchronized_ptr_checked(devbuf_buffer_t *buffer, void **out_data, size_t *out_size) {
  if (!out_data)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "unsynchronized_ptr: out_data is NULL");
  char *data = NULL;
  devbuf_status status = prepare_host(buffer, true, "unsynchronized_ptr", &data);
  if (status != DEVBUF_OK) return status;
  // Only a previous owner's work on reused memory is waited for: the caller orders its own.
  // Memory that inherited such work got its tracker before it was allocated (which
  // prepare_host saw), so without one there is nothing to wait for, and no lock to take.
  if (!atomic_load_explicit(&buffer->storage->hazard, memory_order_acquire)) {
    *out_data = data;
    if (out_size) *out_size = buffer->size;
    return DEVBUF_OK;
  }
  struct devbuf__hazard *hazard = NULL;
  devbuf__byte_range range = {buffer->offset, buffer->size, true};
  status = devbuf__storage_lock_idle(buffer->storage, &range, 1, DEVBUF__OWN_IGNORE,
                                     "unsynchronized_ptr", &hazard);
  if (status != DEVBUF_OK) return status;
  devbuf__storage_unlock(buffer->storage, hazard);
  *out_data = data;
  if (out_size) *out_size = buffer->size;
  return DEVBUF_OK;
}

devbuf_status devbuf_buffer_unsynchronized_ptr(devbuf_buffer_t *buffer, void **out_data,
                                               size_t *out_size) {
  // Nearly every call: allocated, writable memory of a device the CPU addresses (the CPU's
  // own: a storage's allocator is its device's), with no tracker. Its address, with no call.
  devbuf__storage *storage = buffer && out_data ? buffer->storage : NULL;
  if (DEVBUF_LIKELY(storage && storage->device->host_accessible && !storage->read_only &&
                    atomic_load_explicit(&storage->state, memory_order_acquire) ==
                        DEVBUF__ALLOCATED &&
                    !atomic_load_explicit(&storage->hazard, memory_order_acquire))) {
    *out_data = buffer->size ? (char *)storage->memory.host + buffer->offset : NULL;
    if (out_size) *out_size = buffer->size;
    return DEVBUF_OK;
  }
  return unsynchronized_ptr_checked(buffer, out_data, out_size);
}
