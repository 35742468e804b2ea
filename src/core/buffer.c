// Buffer handles: creation, views, identity, properties and description.
#include "core.h"

#include <stdio.h>
#include <string.h>

// Every field but the handle's id (a storage's first handle has its id from the storage).
static void buffer_init(devbuf_buffer_t *buffer, devbuf__storage *storage, size_t offset,
                        size_t size, devbuf_dtype dtype, const size_t *shape, size_t ndim) {
  devbuf__ref_init(&buffer->refs, 1);
  buffer->storage = storage;
  buffer->offset = offset;
  buffer->size = size;
  buffer->dtype = dtype;
  buffer->ndim = ndim;
  if (ndim == 1)
    buffer->shape[0] = shape[0];
  else if (ndim)
    memcpy(buffer->shape, shape, ndim * sizeof *shape);
}

devbuf_status devbuf__buffer_wrap(devbuf__storage *storage, size_t offset, size_t size,
                                  devbuf_dtype dtype, const size_t *shape, size_t ndim,
                                  devbuf_buffer_t **out) {
  devbuf_buffer_t *buffer = devbuf__record_alloc(DEVBUF__RECORD_BUFFER, sizeof *buffer);
  if (!buffer) {
    devbuf__storage_release(storage);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a buffer handle");
  }
  buffer->handle_id = devbuf__next_id();
  buffer_init(buffer, storage, offset, size, dtype, shape, ndim);
  *out = buffer;
  return DEVBUF_OK;
}

// A new buffer, its storage not allocated yet.
static inline devbuf_status buffer_make(devbuf_allocator_t *allocator, devbuf_dtype dtype,
                                        const size_t *shape, size_t ndim, uint32_t flags,
                                        devbuf_buffer_t **out_buffer) {
  if (!allocator || !out_buffer)
    return devbuf__null_argument("", "allocator, out_buffer",
                                 (const void *[]){allocator, out_buffer});
  if (flags & ~(uint32_t)DEVBUF_BUFFER_ZERO)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "unknown buffer flags 0x%x",
                         flags & ~(unsigned)DEVBUF_BUFFER_ZERO);
  size_t bytes;
  if (!(ndim == 1 && shape && devbuf__one_dimension_bytes(dtype, shape[0], &bytes))) {
    devbuf_status status = devbuf__shape_bytes(dtype, shape, ndim, &bytes, NULL);
    if (status != DEVBUF_OK) return status;
  }
  devbuf__storage *storage;
  devbuf_status status = devbuf__storage_create(allocator, NULL, bytes, flags, &storage);
  if (status != DEVBUF_OK) return status;
  devbuf_buffer_t *buffer = &storage->first_handle;
  buffer_init(buffer, storage, 0, bytes, dtype, shape, ndim);
  *out_buffer = buffer;
  return DEVBUF_OK;
}

devbuf_status devbuf_buffer_new(devbuf_allocator_t *allocator, devbuf_dtype dtype,
                                const size_t *shape, size_t ndim, uint32_t flags,
                                devbuf_buffer_t **out_buffer) {
  return buffer_make(allocator, dtype, shape, ndim, flags, out_buffer);
}

// Allocates the memory of a new buffer (its handle not out yet) and hands the buffer out;
// on failure the buffer goes.
__attribute__((noinline)) static devbuf_status buffer_allocate_memory(devbuf_buffer_t *buffer,
                                                                      devbuf_buffer_t **out) {
  devbuf_status status = devbuf__storage_allocate_private(buffer->storage);
  if (status != DEVBUF_OK) {
    devbuf_buffer_release(buffer);
    return status;
  }
  *out = buffer;
  return DEVBUF_OK;
}

// devbuf_buffer_allocate for any allocator, shape and flags.
__attribute__((noinline)) static devbuf_status
buffer_allocate_general(devbuf_allocator_t *allocator, devbuf_dtype dtype, const size_t *shape,
                        size_t ndim, uint32_t flags, devbuf_buffer_t **out_buffer) {
  if (!out_buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "out_buffer is NULL");
  devbuf_buffer_t *buffer = NULL;
  devbuf_status status = buffer_make(allocator, dtype, shape, ndim, flags, &buffer);
  if (status != DEVBUF_OK) return status;
  return buffer_allocate_memory(buffer, out_buffer);
}

devbuf_status devbuf_buffer_allocate(devbuf_allocator_t *allocator, devbuf_dtype dtype,
                                     const size_t *shape, size_t ndim, uint32_t flags,
                                     devbuf_buffer_t **out_buffer) {
  // Nearly every call: one dimension, no flags, a device's own allocator of plain memory, a
  // storage record, ids and the thread's line at hand, and a block in the thread's bins. It
  // makes no call, so it needs no frame; anything else ends in a call to the general way.
  size_t bytes;
  devbuf__storage *storage;
  if (DEVBUF_UNLIKELY(!allocator || !out_buffer || flags || ndim != 1 || !shape ||
                      !devbuf__one_dimension_bytes(dtype, shape[0], &bytes) || !bytes ||
                      allocator->memory_kind == DEVBUF_MEMORY_SHAREABLE ||
                      !(storage = devbuf__storage_make_at_hand(allocator, bytes, 0))))
    return buffer_allocate_general(allocator, dtype, shape, ndim, flags, out_buffer);
  devbuf_buffer_t *buffer = &storage->first_handle;
  buffer_init(buffer, storage, 0, bytes, dtype, shape, 1);
  if (DEVBUF_UNLIKELY(!devbuf__allocator_alloc_binned(allocator, bytes, &storage->memory)))
    return buffer_allocate_memory(buffer, out_buffer);
  atomic_store_explicit(&storage->state, DEVBUF__ALLOCATED, memory_order_release);
  *out_buffer = buffer;
  return DEVBUF_OK;
}

// Whether `bytes` is a whole number of elements of `bits` each. (a * 8) mod b equals
// ((a mod b) * 8) mod b, which cannot overflow.
static bool whole_elements(size_t bytes, unsigned bits) { return ((bytes % bits) * 8) % bits == 0; }

static size_t elements_in(size_t bytes, unsigned bits) {
  return bits % 8 == 0 ? bytes / (bits / 8) : (size_t)(((unsigned __int128)bytes * 8) / bits);
}

devbuf_status devbuf_buffer_view(devbuf_buffer_t *buffer, size_t offset, size_t size,
                                 devbuf_buffer_t **out_view) {
  if (!buffer || !out_view)
    return devbuf__null_argument("", "buffer, out_view", (const void *[]){buffer, out_view});
  size_t end;
  if (devbuf__add_overflows(offset, size, &end) || end > buffer->size)
    return devbuf__error(DEVBUF_OUT_OF_RANGE,
                         "view(offset %zu, size %zu) does not fit a %zu-byte buffer", offset, size,
                         buffer->size);
  unsigned bits = devbuf_dtype_bits(buffer->dtype);
  if (!whole_elements(offset, bits) || !whole_elements(size, bits))
    return devbuf__error(
        DEVBUF_INVALID_ARGUMENT,
        "view(offset %zu, size %zu) is not a whole number of %s elements (%u bits each)", offset,
        size, devbuf_dtype_name(buffer->dtype), bits);
  size_t count = elements_in(size, bits);
  devbuf__ref_retain(&buffer->storage->refs);
  return devbuf__buffer_wrap(buffer->storage, buffer->offset + offset, size, buffer->dtype, &count,
                             1, out_view);
}

// Elements of another dtype must start where a typed pointer to them is aligned: a byte view
// at an odd offset reinterpreted as floats would hand out a misaligned float pointer. The
// offset counts from the start of the memory, whose own start is aligned (allocations, file
// mappings and imports all are).
static devbuf_status check_alignment(const char *call, size_t storage_offset, devbuf_dtype dtype) {
  size_t alignment = devbuf__dtype_alignment(dtype);
  if (storage_offset % alignment == 0) return DEVBUF_OK;
  return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                       "%s puts %s elements at byte %zu of their memory, not a multiple of their "
                       "%zu-byte alignment",
                       call, devbuf_dtype_name(dtype), storage_offset, alignment);
}

devbuf_status devbuf_buffer_reshape(devbuf_buffer_t *buffer, devbuf_dtype dtype,
                                    const size_t *shape, size_t ndim, devbuf_buffer_t **out_view) {
  if (!buffer || !out_view)
    return devbuf__null_argument("", "buffer, out_view", (const void *[]){buffer, out_view});
  size_t bytes;
  devbuf_status status = devbuf__shape_bytes(dtype, shape, ndim, &bytes, NULL);
  if (status != DEVBUF_OK) return status;
  if (bytes != buffer->size)
    return devbuf__error(DEVBUF_SIZE_MISMATCH, "reshape to %zu bytes of %s from a %zu-byte buffer",
                         bytes, devbuf_dtype_name(dtype), buffer->size);
  status = check_alignment("reshape", buffer->offset, dtype);
  if (status != DEVBUF_OK) return status;
  devbuf__ref_retain(&buffer->storage->refs);
  return devbuf__buffer_wrap(buffer->storage, buffer->offset, bytes, dtype, shape, ndim, out_view);
}

devbuf_status devbuf_buffer_view_as(devbuf_buffer_t *buffer, size_t offset, devbuf_dtype dtype,
                                    const size_t *shape, size_t ndim, devbuf_buffer_t **out_view) {
  if (!buffer || !out_view)
    return devbuf__null_argument("", "buffer, out_view", (const void *[]){buffer, out_view});
  size_t bytes, end;
  devbuf_status status = devbuf__shape_bytes(dtype, shape, ndim, &bytes, NULL);
  if (status != DEVBUF_OK) return status;
  if (devbuf__add_overflows(offset, bytes, &end) || end > buffer->size)
    return devbuf__error(DEVBUF_OUT_OF_RANGE,
                         "view_as(offset %zu, %zu bytes of %s) does not fit a %zu-byte buffer",
                         offset, bytes, devbuf_dtype_name(dtype), buffer->size);
  unsigned bits = devbuf_dtype_bits(dtype);
  if (!whole_elements(offset, bits))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "view_as(offset %zu) is not a whole number of %s elements (%u bits each)",
                         offset, devbuf_dtype_name(dtype), bits);
  status = check_alignment("view_as", buffer->offset + offset, dtype);
  if (status != DEVBUF_OK) return status;
  devbuf__ref_retain(&buffer->storage->refs);
  return devbuf__buffer_wrap(buffer->storage, buffer->offset + offset, bytes, dtype, shape, ndim,
                             out_view);
}

devbuf_buffer_t *devbuf_buffer_retain(devbuf_buffer_t *buffer) {
  if (buffer) devbuf__ref_retain(&buffer->refs);
  return buffer;
}

// devbuf_buffer_release of any handle.
__attribute__((noinline)) static void buffer_release_general(devbuf_buffer_t *buffer) {
  if (!buffer || !devbuf__ref_drop_held(&buffer->refs)) return;
  devbuf__storage *storage = buffer->storage;
  devbuf__host_access_close_handle(storage, buffer); // so that no record names it
  bool last = devbuf__ref_drop_held(&storage->refs);
  if (buffer == &storage->first_handle) { // in the storage's record: it goes with it
    if (last) devbuf__storage_last_release(storage);
    return;
  }
  if (last) devbuf__storage_last_release(storage);
  devbuf__record_free(DEVBUF__RECORD_BUFFER, buffer);
}

void devbuf_buffer_release(devbuf_buffer_t *buffer) {
  // Nearly every call: the sole holder of a buffer's first handle, the storage's only one,
  // of a device's own allocator, nothing else having touched the storage, with room for its
  // block in the thread's bin and for its record in the thread's cache. Every test comes
  // before the first change, and the release makes no call (so it needs no frame) but, for
  // the device's last hold, the device's destruction; anything else ends in a call to the
  // general way.
  devbuf__storage *storage = buffer ? buffer->storage : NULL;
  unsigned line = devbuf__thread_line_plus_one - 1; // the thread's line, if it has asked
  tcache *cache;                                    // the thread's, whose bin takes the block
  if (DEVBUF_UNLIKELY(
          !storage || buffer != &storage->first_handle ||
          atomic_load_explicit(&buffer->refs.count, memory_order_acquire) != 1 ||
          atomic_load_explicit(&storage->refs.count, memory_order_acquire) != 1 ||
          !devbuf__storage_untouched(storage) || !storage->allocator ||
          storage->allocator->link != DEVBUF__EMBEDDED || !storage->size ||
          atomic_load_explicit(&storage->state, memory_order_acquire) != DEVBUF__ALLOCATED ||
          line == (unsigned)-1 || !devbuf__record_cache_has_room(DEVBUF__RECORD_STORAGE) ||
          !(cache = devbuf__allocator_bin_for(storage->allocator, &storage->memory)))) {
    buffer_release_general(buffer);
    return;
  }
  devbuf__allocator_free_to_bin(cache, &storage->memory);
  devbuf_device_t *device = storage->device;
  devbuf__record_put_cached(DEVBUF__RECORD_STORAGE, storage);
  devbuf__device_unhold_on_line(device, line);
}

devbuf_status devbuf_buffer_ensure_allocated(devbuf_buffer_t *buffer) {
  if (!buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "buffer is NULL");
  return devbuf__storage_ensure_allocated(buffer->storage);
}

int devbuf_buffer_is_allocated(const devbuf_buffer_t *buffer) {
  return buffer &&
         atomic_load_explicit(&buffer->storage->state, memory_order_acquire) == DEVBUF__ALLOCATED;
}

size_t devbuf_buffer_size(const devbuf_buffer_t *buffer) { return buffer ? buffer->size : 0; }
int devbuf_buffer_is_empty(const devbuf_buffer_t *buffer) { return buffer && buffer->size == 0; }
size_t devbuf_buffer_offset(const devbuf_buffer_t *buffer) { return buffer ? buffer->offset : 0; }
devbuf_dtype devbuf_buffer_dtype(const devbuf_buffer_t *buffer) {
  return buffer ? buffer->dtype : DEVBUF_DTYPE_COUNT;
}
size_t devbuf_buffer_ndim(const devbuf_buffer_t *buffer) { return buffer ? buffer->ndim : 0; }
const size_t *devbuf_buffer_shape(const devbuf_buffer_t *buffer) {
  return buffer ? buffer->shape : NULL;
}
devbuf_allocator_t *devbuf_buffer_allocator(const devbuf_buffer_t *buffer) {
  return buffer ? buffer->storage->allocator : NULL;
}
devbuf_device_t *devbuf_buffer_device(const devbuf_buffer_t *buffer) {
  return buffer ? buffer->storage->device : NULL;
}
uint64_t devbuf_buffer_storage_id(const devbuf_buffer_t *buffer) {
  return buffer ? buffer->storage->id : 0;
}
uint64_t devbuf_buffer_handle_id(const devbuf_buffer_t *buffer) {
  return buffer ? buffer->handle_id : 0;
}
int devbuf_buffer_is_mapped(const devbuf_buffer_t *buffer) {
  return buffer && devbuf__storage_kind_of(buffer->storage)->file_backed;
}
int devbuf_buffer_is_read_only(const devbuf_buffer_t *buffer) {
  return buffer && buffer->storage->read_only;
}
int devbuf_buffer_is_cpu_accessible(const devbuf_buffer_t *buffer) {
  return buffer && devbuf__storage_host_accessible(buffer->storage);
}

size_t devbuf_buffer_count(const devbuf_buffer_t *buffer) {
  if (!buffer) return 0;
  size_t count = 1;
  for (size_t i = 0; i < buffer->ndim; i++) count *= buffer->shape[i]; // checked at creation
  return count;
}

devbuf_status devbuf_buffer_device_ptr(devbuf_buffer_t *buffer, uint64_t *out_address) {
  if (!buffer || !out_address)
    return devbuf__null_argument("", "buffer, out_address", (const void *[]){buffer, out_address});
  if (!devbuf_buffer_is_allocated(buffer))
    return devbuf__error(DEVBUF_NOT_ALLOCATED,
                         "buffer %llu (storage %llu, %zu bytes) has no memory yet",
                         (unsigned long long)buffer->handle_id,
                         (unsigned long long)buffer->storage->id, buffer->size);
  if (buffer->storage->device->memory_handles)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "buffer %llu: %s memory has no device address, only a handle and an "
                         "offset (devbuf_buffer_device_handle)",
                         (unsigned long long)buffer->handle_id, buffer->storage->device->spec);
  *out_address = buffer->size ? buffer->storage->memory.device + buffer->offset : 0;
  return DEVBUF_OK;
}

devbuf_status devbuf_buffer_device_handle(devbuf_buffer_t *buffer, uint64_t *out_handle,
                                          size_t *out_offset) {
  if (!buffer || !out_handle || !out_offset)
    return devbuf__null_argument("", "buffer, out_handle, out_offset",
                                 (const void *[]){buffer, out_handle, out_offset});
  if (!devbuf_buffer_is_allocated(buffer))
    return devbuf__error(DEVBUF_NOT_ALLOCATED,
                         "buffer %llu (storage %llu, %zu bytes) has no memory yet",
                         (unsigned long long)buffer->handle_id,
                         (unsigned long long)buffer->storage->id, buffer->size);
  *out_handle = buffer->storage->memory.device;
  *out_offset = buffer->storage->memory.offset + buffer->offset;
  return DEVBUF_OK;
}

devbuf_status devbuf_buffer_synchronize(devbuf_buffer_t *buffer) {
  if (!buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "buffer is NULL");
  return devbuf_device_synchronize(buffer->storage->device);
}

size_t devbuf_buffer_describe(const devbuf_buffer_t *buffer, char *out_text, size_t capacity) {
  if (!out_text) capacity = 0; // the length alone
  if (!buffer) return (size_t)snprintf(out_text, capacity, "Buffer(NULL)");
  char shape[256];
  size_t used = 0;
  shape[0] = '\0';
  for (size_t i = 0; i < buffer->ndim && used < sizeof shape; i++)
    used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%zu", i ? "," : "",
                             buffer->shape[i]);
  const devbuf__storage *storage = buffer->storage;
  int length = snprintf(
      out_text, capacity,
      "Buffer(id=%llu handle=%llu device=%s dtype=%s shape=[%s] offset=%zu size=%zu %s%s%s)",
      (unsigned long long)storage->id, (unsigned long long)buffer->handle_id, storage->device->spec,
      devbuf_dtype_name(buffer->dtype), shape, buffer->offset, buffer->size,
      devbuf_buffer_is_allocated(buffer) ? "allocated" : "lazy",
      devbuf__storage_kind_of(storage)->file_backed ? " mapped" : "",
      storage->read_only ? " read-only" : "");
  return length < 0 ? 0 : (size_t)length;
}

int devbuf_buffer_in_use(const devbuf_buffer_t *buffer) {
  return buffer && devbuf__storage_in_use(buffer->storage, buffer->offset, buffer->size);
}

devbuf_status devbuf_buffer_wait(devbuf_buffer_t *buffer) {
  if (!buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "buffer is NULL");
  return devbuf__storage_wait_unused(buffer->storage, buffer->offset, buffer->size);
}
