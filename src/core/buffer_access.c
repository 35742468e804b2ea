// Host access: pointers for reading and writing that stay open until ended,
// typed views, item, and the unsynchronized pointer.
#include "core.h"

#include <string.h>

#define HOST_OPERATION_RANGES 2 // a copy within one storage: its source and its destination

// An empty range overlaps nothing, not even a range around its offset.
static bool ranges_overlap(size_t a_offset, size_t a_size, size_t b_offset, size_t b_size) {
  return a_size && b_size && a_offset < b_offset + b_size && b_offset < a_offset + a_size;
}

devbuf_status devbuf__check_host_conflicts(devbuf__storage *storage, size_t offset, size_t size,
                                           bool write, const char *what) {
  for (const devbuf__host_access *access = storage->accesses; access; access = access->next) {
    if ((write || access->write) && ranges_overlap(offset, size, access->offset, access->size))
      return devbuf__error(
          DEVBUF_HOST_ACCESS_OPEN,
          "%s of bytes [%zu, %zu) of storage %llu: a host %s access to bytes [%zu, %zu) is open",
          what, offset, offset + size, (unsigned long long)storage->id,
          access->write ? "write" : "read", access->offset, access->offset + access->size);
  }
  return DEVBUF_OK;
}

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
                         storage->mapped ? "mapped file" : "buffer");
  devbuf_status status = devbuf__storage_ensure_allocated(storage);
  if (status != DEVBUF_OK) return status;
  *out_data = buffer->size ? (char *)storage->memory.host + buffer->offset : NULL;
  return DEVBUF_OK;
}

// Records `count` host accesses at once when no submitted work conflicts, treating
// the storage's own work as `own` says. With `exclusive`, other open host accesses that
// conflict refuse them (HOST_ACCESS_OPEN): copies need that; host pointers from several
// threads may overlap, as the CPU orders its own threads. The new accesses never conflict
// with each other (a copy within one storage reads one range and writes the other).
// Recorded accesses make racing submissions refuse.
static devbuf_status record_accesses(devbuf__storage *storage, const devbuf__host_access *wanted,
                                     size_t count, devbuf__own_work own, bool exclusive,
                                     const char *what, devbuf__host_access **out_accesses) {
  devbuf__host_access *records[HOST_OPERATION_RANGES] = {NULL, NULL};
  devbuf__byte_range ranges[HOST_OPERATION_RANGES] = {{0, 0, false}, {0, 0, false}};
  if (count > HOST_OPERATION_RANGES)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: %zu ranges at once (at most %d)", what,
                         count, HOST_OPERATION_RANGES);
  for (size_t i = 0; i < count; i++) {
    records[i] = devbuf__malloc(sizeof *records[i]);
    if (!records[i]) {
      devbuf__free(records[0]);
      return devbuf__error(DEVBUF_OUT_OF_MEMORY, "%s: no host memory for an access record", what);
    }
    *records[i] = wanted[i];
    ranges[i] = (devbuf__byte_range){wanted[i].offset, wanted[i].size, wanted[i].write};
  }
  struct devbuf__hazard *hazard = NULL;
  devbuf_status status = devbuf__storage_lock_idle(storage, ranges, count, own, what, &hazard);
  if (status == DEVBUF_OK) { // holding the storage's and the tracker's locks
    for (size_t i = 0; i < count && exclusive && status == DEVBUF_OK; i++)
      status = devbuf__check_host_conflicts(storage, ranges[i].offset, ranges[i].size,
                                            ranges[i].write, what);
    for (size_t i = 0; i < count && status == DEVBUF_OK; i++) {
      records[i]->next = storage->accesses;
      storage->accesses = records[i];
      atomic_fetch_add(&storage->open_accesses, 1);
    }
    devbuf__storage_unlock(storage, hazard);
  }
  if (status != DEVBUF_OK) {
    for (size_t i = 0; i < count; i++) devbuf__free(records[i]);
    return status;
  }
  for (size_t i = 0; i < count && out_accesses; i++) out_accesses[i] = records[i];
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
  status = record_accesses(buffer->storage, &wanted, 1, own, false, what, NULL);
  if (status == DEVBUF_OK) *out_data = data;
  return status;
}

devbuf_status devbuf__host_operation_begin(devbuf__storage *storage,
                                           const devbuf__byte_range *ranges, size_t count,
                                           const char *what, devbuf__host_access **out_accesses) {
  devbuf__host_access wanted[HOST_OPERATION_RANGES] = {{.write = false}, {.write = false}};
  for (size_t i = 0; i < count && i < HOST_OPERATION_RANGES; i++)
    wanted[i] = (devbuf__host_access){
        .offset = ranges[i].offset, .size = ranges[i].size, .write = ranges[i].write};
  return record_accesses(storage, wanted, count, DEVBUF__OWN_WAIT, true, what, out_accesses);
}

void devbuf__host_operation_end(devbuf__storage *storage, devbuf__host_access *access) {
  pthread_mutex_lock(&storage->lock);
  for (devbuf__host_access **link = &storage->accesses; *link; link = &(*link)->next) {
    if (*link == access) {
      *link = access->next;
      atomic_fetch_sub(&storage->open_accesses, 1);
      break;
    }
  }
  pthread_mutex_unlock(&storage->lock);
  devbuf__free(access);
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
  devbuf__storage *storage = buffer->storage;
  devbuf__host_access *found = NULL;
  pthread_mutex_lock(&storage->lock);
  for (devbuf__host_access **link = &storage->accesses; *link; link = &(*link)->next) {
    if ((*link)->handle == buffer && (*link)->data == data) {
      found = *link;
      *link = found->next;
      atomic_fetch_sub(&storage->open_accesses, 1);
      break;
    }
  }
  pthread_mutex_unlock(&storage->lock);
  if (!found)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "end_access: buffer %llu has no open access at %p",
                         (unsigned long long)buffer->handle_id, data);
  devbuf__free(found);
  return DEVBUF_OK;
}

size_t devbuf_buffer_open_accesses(const devbuf_buffer_t *buffer) {
  if (!buffer) return 0;
  devbuf__storage *storage = buffer->storage;
  size_t count = 0;
  pthread_mutex_lock(&storage->lock);
  for (const devbuf__host_access *access = storage->accesses; access; access = access->next)
    count += ranges_overlap(buffer->offset, buffer->size, access->offset, access->size) ||
             (buffer->size == 0 && access->handle == buffer);
  pthread_mutex_unlock(&storage->lock);
  return count;
}

static devbuf_status check_dtype(const devbuf_buffer_t *buffer, devbuf_dtype dtype,
                                 const char *what) {
  if (!buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: buffer is NULL", what);
  if (buffer->dtype != dtype)
    return devbuf__error(DEVBUF_TYPE_MISMATCH, "%s as %s of a %s buffer", what,
                         devbuf_dtype_name(dtype) ? devbuf_dtype_name(dtype) : "an unknown dtype",
                         devbuf_dtype_name(buffer->dtype));
  return DEVBUF_OK;
}

static devbuf_status as_array(devbuf_buffer_t *buffer, devbuf_dtype dtype, bool write,
                              devbuf_array_t *out) {
  const char *what = write ? "as_array_mut" : "as_array";
  devbuf_status status = check_dtype(buffer, dtype, what);
  if (status != DEVBUF_OK) return status;
  if (!out) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: out_array is NULL", what);
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
  devbuf_status status = check_dtype(buffer, dtype, "as_slice");
  if (status != DEVBUF_OK) return status;
  status = devbuf_buffer_contents(buffer, out_data, NULL);
  if (status == DEVBUF_OK && out_count) *out_count = devbuf_buffer_count(buffer);
  return status;
}

devbuf_status devbuf_buffer_item(devbuf_buffer_t *buffer, devbuf_dtype dtype, void *out_value) {
  devbuf_status status = check_dtype(buffer, dtype, "item");
  if (status != DEVBUF_OK) return status;
  size_t count = devbuf_buffer_count(buffer);
  if (count != 1)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "item needs exactly one element; buffer %llu holds %zu",
                         (unsigned long long)buffer->handle_id, count);
  if (!out_value) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "item: out_value is NULL");
  return devbuf_buffer_copyout(buffer, out_value, buffer->size); // works on every backend
}

devbuf_status devbuf_buffer_unsynchronized_ptr(devbuf_buffer_t *buffer, void **out_data,
                                               size_t *out_size) {
  if (!out_data)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "unsynchronized_ptr: out_data is NULL");
  char *data = NULL;
  devbuf_status status = prepare_host(buffer, true, "unsynchronized_ptr", &data);
  if (status != DEVBUF_OK) return status;
  // Only a previous owner's work on reused memory is waited for: the caller orders its own.
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
