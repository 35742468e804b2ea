// Copies: host to buffer, buffer to host, buffer to buffer on one device or across
// devices. Overlapping views of one storage behave like memmove.
#include "core.h"

#include <string.h>

// Bounce buffer size when neither side of a cross-device copy is host-accessible.
#define STAGING_CHUNK ((size_t)4 << 20)

// What a copy needs from one side before it starts: a size match, write permission. Its
// memory comes after every check, and only for a copy of some bytes: a refused copy does
// nothing else, and an empty one allocates nothing.
static devbuf_status check_side(devbuf_buffer_t *buffer, size_t size, bool write,
                                const char *what) {
  if (!buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: buffer is NULL", what);
  if (size != buffer->size)
    return devbuf__error(DEVBUF_SIZE_MISMATCH, "%s of %zu bytes with a %zu-byte buffer (%llu)",
                         what, size, buffer->size, (unsigned long long)buffer->handle_id);
  if (write && buffer->storage->read_only)
    return devbuf__error(DEVBUF_READ_ONLY, "%s into read-only buffer %llu", what,
                         (unsigned long long)buffer->handle_id);
  return DEVBUF_OK;
}

// A copy is a host operation: it waits for conflicting submitted work, refuses bytes
// under an open host access, and holds an access of its own while it runs, so that no
// submission races with it.
static devbuf_status begin(devbuf_buffer_t *buffer, bool write, const char *what,
                           devbuf__host_access **out) {
  devbuf__byte_range range = {buffer->offset, buffer->size, write};
  return devbuf__host_operation_begin(buffer->storage, &range, 1, what, out);
}

devbuf_status devbuf_buffer_copyin(devbuf_buffer_t *buffer, const void *src, size_t size) {
  if (buffer && size && !src) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "copyin: src is NULL");
  devbuf_status status = check_side(buffer, size, true, "copyin");
  if (status != DEVBUF_OK || size == 0) return status;
  status = devbuf__storage_ensure_allocated(buffer->storage);
  if (status != DEVBUF_OK) return status;
  devbuf__host_access *access = NULL;
  status = begin(buffer, true, "copyin", &access);
  if (status != DEVBUF_OK) return status;
  devbuf__storage *storage = buffer->storage;
  status =
      storage->device->backend->write(storage->device, &storage->memory, buffer->offset, src, size);
  devbuf__host_operation_end(storage, access);
  return status;
}

devbuf_status devbuf_buffer_copyout(devbuf_buffer_t *buffer, void *dst, size_t size) {
  if (buffer && size && !dst) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "copyout: dst is NULL");
  devbuf_status status = check_side(buffer, size, false, "copyout");
  if (status != DEVBUF_OK || size == 0) return status;
  status = devbuf__storage_ensure_allocated(buffer->storage);
  if (status != DEVBUF_OK) return status;
  devbuf__host_access *access = NULL;
  status = begin(buffer, false, "copyout", &access);
  if (status != DEVBUF_OK) return status;
  devbuf__storage *storage = buffer->storage;
  if (devbuf__storage_kind_of(storage)->file_backed)
    status = devbuf__guarded_file_copy(dst, &storage->memory, buffer->offset, size, "copyout");
  else
    status = storage->device->backend->read(storage->device, &storage->memory, buffer->offset, dst,
                                            size);
  devbuf__host_operation_end(storage, access);
  return status;
}

devbuf_status
devbuf__buffer_read_pieces(devbuf_buffer_t *buffer, void *staging, size_t staging_size,
                           devbuf_status (*sink)(void *context, const void *data, size_t size),
                           void *context, const char *what) {
  if (buffer->size == 0) return DEVBUF_OK;
  devbuf_status status = devbuf__storage_ensure_allocated(buffer->storage);
  if (status != DEVBUF_OK) return status;
  devbuf__host_access *access = NULL;
  status = begin(buffer, false, what, &access);
  if (status != DEVBUF_OK) return status;
  devbuf__storage *storage = buffer->storage;
  devbuf_device_t *device = storage->device;
  bool file = devbuf__storage_kind_of(storage)->file_backed;
  bool direct = !file && storage->memory.host && devbuf__storage_host_accessible(storage);
  for (size_t done = 0; done < buffer->size && status == DEVBUF_OK;) {
    size_t piece = buffer->size - done < staging_size ? buffer->size - done : staging_size;
    size_t at = buffer->offset + done;
    const void *data = staging;
    if (direct)
      data = (const char *)storage->memory.host + at;
    else if (file)
      status = devbuf__guarded_file_copy(staging, &storage->memory, at, piece, what);
    else
      status = device->backend->read(device, &storage->memory, at, staging, piece);
    if (status == DEVBUF_OK) status = sink(context, data, piece);
    done += piece;
  }
  devbuf__host_operation_end(storage, access);
  return status;
}

// Out of a mapped file, whose pages fault if the file shrank: read by the CPU under a guard,
// into the destination directly where the CPU can address it, else through a bounce buffer.
static devbuf_status copy_from_mapping(devbuf__storage *dst, size_t dst_offset,
                                       devbuf__storage *src, size_t src_offset, size_t size) {
  if (devbuf__storage_host_accessible(dst))
    return devbuf__guarded_file_copy((char *)dst->memory.host + dst_offset, &src->memory,
                                     src_offset, size, "copy_from");
  size_t chunk = size < STAGING_CHUNK ? size : STAGING_CHUNK;
  char *bounce = devbuf__malloc(chunk);
  if (!bounce)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY,
                         "copy_from: no host memory for a %zu-byte staging buffer", chunk);
  devbuf_device_t *device = dst->device;
  devbuf_status status = DEVBUF_OK;
  for (size_t done = 0; done < size && status == DEVBUF_OK; done += chunk) {
    size_t piece = size - done < chunk ? size - done : chunk;
    status = devbuf__guarded_file_copy(bounce, &src->memory, src_offset + done, piece, "copy_from");
    if (status == DEVBUF_OK)
      status = device->backend->write(device, &dst->memory, dst_offset + done, bounce, piece);
  }
  devbuf__free(bounce);
  return status;
}

// Through a bounce buffer, a piece at a time: from the last piece back where `backward`
// (the destination starts after the source in bytes they share), as memmove does.
static devbuf_status copy_through_bounce(devbuf__storage *dst, size_t dst_offset,
                                         devbuf__storage *src, size_t src_offset, size_t size,
                                         bool backward) {
  devbuf_device_t *dst_device = dst->device, *src_device = src->device;
  size_t chunk = size < STAGING_CHUNK ? size : STAGING_CHUNK;
  char *bounce = devbuf__malloc(chunk);
  if (!bounce)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY,
                         "copy_from: no host memory for a %zu-byte staging buffer", chunk);
  devbuf_status status = DEVBUF_OK;
  for (size_t done = 0; done < size && status == DEVBUF_OK; done += chunk) {
    size_t piece = size - done < chunk ? size - done : chunk;
    size_t at = backward ? size - done - piece : done;
    status = src_device->backend->read(src_device, &src->memory, src_offset + at, bounce, piece);
    if (status == DEVBUF_OK)
      status = dst_device->backend->write(dst_device, &dst->memory, dst_offset + at, bounce, piece);
  }
  devbuf__free(bounce);
  return status;
}

// Between devices: through whichever side the CPU can address, else via a bounce buffer.
static devbuf_status copy_across(devbuf__storage *dst, size_t dst_offset, devbuf__storage *src,
                                 size_t src_offset, size_t size) {
  devbuf_device_t *dst_device = dst->device, *src_device = src->device;
  if (devbuf__storage_host_accessible(src))
    return dst_device->backend->write(dst_device, &dst->memory, dst_offset,
                                      (const char *)src->memory.host + src_offset, size);
  if (devbuf__storage_host_accessible(dst))
    return src_device->backend->read(src_device, &src->memory, src_offset,
                                     (char *)dst->memory.host + dst_offset, size);
  return copy_through_bounce(dst, dst_offset, src, src_offset, size, false);
}

devbuf_status devbuf_buffer_copy_from(devbuf_buffer_t *dst, devbuf_buffer_t *src) {
  if (!src) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "copy_from: src is NULL");
  devbuf_status status = check_side(dst, src->size, true, "copy_from (destination)");
  if (status == DEVBUF_OK) status = check_side(src, dst->size, false, "copy_from (source)");
  if (status != DEVBUF_OK || dst->size == 0) return status;
  status = devbuf__storage_ensure_allocated(dst->storage);
  if (status == DEVBUF_OK) status = devbuf__storage_ensure_allocated(src->storage);
  if (status != DEVBUF_OK) return status;
  devbuf__storage *to = dst->storage, *from = src->storage;
  devbuf__host_access *dst_access = NULL, *src_access = NULL;
  if (to == from) { // both views' accesses at once: they may overlap each other
    devbuf__byte_range ranges[2] = {{dst->offset, dst->size, true},
                                    {src->offset, src->size, false}};
    devbuf__host_access *accesses[2];
    status = devbuf__host_operation_begin(to, ranges, 2, "copy_from", accesses);
    if (status == DEVBUF_OK) {
      dst_access = accesses[0];
      src_access = accesses[1];
    }
  } else {
    status = begin(dst, true, "copy_from (destination)", &dst_access);
    if (status == DEVBUF_OK) {
      status = begin(src, false, "copy_from (source)", &src_access);
      if (status != DEVBUF_OK) devbuf__host_operation_end(to, dst_access);
    }
  }
  if (status != DEVBUF_OK) return status;
  if (devbuf__storage_kind_of(from)->file_backed && to != from)
    status = copy_from_mapping(to, dst->offset, from, src->offset, dst->size);
  else if (devbuf__storages_alias(to, dst->offset, from, src->offset, dst->size)) // memmove
    status = copy_through_bounce(to, dst->offset, from, src->offset, dst->size,
                                 dst->offset > src->offset);
  else if (to->device == from->device)
    status = to->device->backend->copy(to->device, &to->memory, dst->offset, &from->memory,
                                       src->offset, dst->size);
  else
    status = copy_across(to, dst->offset, from, src->offset, dst->size);
  devbuf__host_operation_end(to, dst_access);
  if (src_access) devbuf__host_operation_end(from, src_access);
  return status;
}
