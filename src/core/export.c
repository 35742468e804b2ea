// The export object: what a buffer or an event export says, the descriptors that carry it,
// and the wire between processes. A received message is checked field by field before
// anything maps it: it may come from any process that can reach the socket.
#include "core.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

devbuf_status devbuf__export_new(const devbuf__export_header *header, const int *fds,
                                 devbuf_export_t **out) {
  size_t count = devbuf__export_fd_count(header->kind);
  devbuf_export_t *shared = devbuf__malloc(sizeof *shared);
  if (!shared) {
    devbuf__close_fds(fds, count);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an export");
  }
  shared->header = *header;
  for (size_t i = 0; i < DEVBUF__EXPORT_FDS; i++) shared->fds[i] = i < count ? fds[i] : -1;
  atomic_init(&shared->claimed, false);
  *out = shared;
  return DEVBUF_OK;
}

int devbuf__export_take_fd(devbuf_export_t *shared, int which) {
  int fd = shared->fds[which];
  shared->fds[which] = -1;
  return fd;
}

devbuf_status devbuf__export_claim(devbuf_export_t *shared, const char *what) {
  if (atomic_exchange_explicit(&shared->claimed, true, memory_order_acquire))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%s: another thread is sending or importing this export at the same "
                         "time (each export goes once)",
                         what);
  size_t count = devbuf__export_fd_count(shared->header.kind);
  for (size_t i = 0; i < count; i++)
    if (shared->fds[i] < 0) {
      devbuf__export_unclaim(shared);
      return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                           "%s: this export was sent or imported already (each export goes "
                           "once): export again",
                           what);
    }
  return DEVBUF_OK;
}

void devbuf__export_unclaim(devbuf_export_t *shared) {
  atomic_store_explicit(&shared->claimed, false, memory_order_release);
}

void devbuf_export_free(devbuf_export_t *shared) {
  if (!shared) return;
  devbuf__close_fds(shared->fds, DEVBUF__EXPORT_FDS);
  devbuf__free(shared);
}

devbuf_export_kind devbuf_export_kind_of(const devbuf_export_t *shared) {
  return shared ? (devbuf_export_kind)shared->header.kind : (devbuf_export_kind)0;
}

int devbuf_export_pid(const devbuf_export_t *shared) { return shared ? shared->header.pid : 0; }

devbuf_status devbuf_export_send(devbuf_export_t *shared, int socket) {
  if (!shared) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "export is NULL");
  devbuf_status status = devbuf__export_claim(shared, "devbuf_export_send");
  if (status != DEVBUF_OK) return status;
  size_t count = devbuf__export_fd_count(shared->header.kind);
  bool fds_sent = false;
  status = devbuf__send_with_fds(socket, &shared->header, sizeof shared->header, shared->fds, count,
                                 &fds_sent);
  // Once the descriptors went they are the peer's, even when the rest of the message failed:
  // sending them again would hand out a second lease.
  if (status == DEVBUF_OK || fds_sent)
    for (size_t i = 0; i < count; i++) close(devbuf__export_take_fd(shared, (int)i));
  devbuf__export_unclaim(shared);
  return status;
}

// The checks of a buffer's fields; the sizes are the sender's word, to be held against the
// descriptor's own size when it is mapped.
static devbuf_status check_buffer_header(const devbuf__export_header *h) {
  const devbuf__backend_entry *entry = devbuf__backend_of_kind((devbuf_device_kind)h->device_kind);
  if (!entry || !entry->backend->raw_export)
    return devbuf__error(DEVBUF_FORMAT_ERROR, "export: device kind %u (%s) cannot share memory",
                         h->device_kind, entry ? entry->name : "no kind of this build");
  if (h->dtype >= DEVBUF_DTYPE_COUNT || h->ndim > DEVBUF_MAX_NDIM || h->read_only > 1)
    return devbuf__error(DEVBUF_FORMAT_ERROR, "export: dtype %u, ndim %u, read_only %u", h->dtype,
                         h->ndim, h->read_only);
  size_t shape[DEVBUF_MAX_NDIM], bytes = 0;
  for (uint32_t i = 0; i < h->ndim; i++) {
    if (h->shape[i] > SIZE_MAX)
      return devbuf__error(DEVBUF_FORMAT_ERROR, "export: dimension %u is %llu", i,
                           (unsigned long long)h->shape[i]);
    shape[i] = (size_t)h->shape[i];
  }
  devbuf_status status = devbuf__shape_bytes((devbuf_dtype)h->dtype, shape, h->ndim, &bytes, NULL);
  if (status != DEVBUF_OK)
    return devbuf__error_cause(DEVBUF_FORMAT_ERROR, "export: its shape is invalid");
  if (bytes != h->view_size)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "export: the shape holds %zu bytes, the view says %llu", bytes,
                         (unsigned long long)h->view_size);
  if (h->view_offset > h->storage_size || h->view_size > h->storage_size - h->view_offset ||
      h->storage_offset > h->segment_size ||
      h->storage_size > h->segment_size - h->storage_offset || h->segment_size == 0 ||
      h->segment_size > SIZE_MAX)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "export: a view of %llu bytes at %llu in a storage of %llu bytes at %llu "
                         "in %llu bytes of memory does not fit",
                         (unsigned long long)h->view_size, (unsigned long long)h->view_offset,
                         (unsigned long long)h->storage_size, (unsigned long long)h->storage_offset,
                         (unsigned long long)h->segment_size);
  size_t alignment = devbuf__dtype_alignment((devbuf_dtype)h->dtype);
  if ((h->storage_offset + h->view_offset) % alignment) // both within the memory: no overflow
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "export: its %s view starts at byte %llu of the memory (storage at %llu, "
                         "view at %llu in it), not a multiple of its elements' %zu-byte alignment",
                         devbuf_dtype_name((devbuf_dtype)h->dtype),
                         (unsigned long long)(h->storage_offset + h->view_offset),
                         (unsigned long long)h->storage_offset, (unsigned long long)h->view_offset,
                         alignment);
  return DEVBUF_OK;
}

static devbuf_status check_header(const devbuf__export_header *h) {
  if (memcmp(h->magic, DEVBUF__EXPORT_MAGIC, sizeof h->magic) != 0) {
    char seen[4 * sizeof h->magic + 1], *at = seen; // printable bytes as they are, others \xNN
    for (size_t i = 0; i < sizeof h->magic; i++) {
      unsigned char c = (unsigned char)h->magic[i];
      at += c >= 0x20 && c < 0x7f && c != '\\' ? snprintf(at, 2, "%c", c)
                                               : snprintf(at, 5, "\\x%02x", c);
    }
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "export: the message does not start with '%s' but with '%s' (not a "
                         "devbuf export of this version)",
                         DEVBUF__EXPORT_MAGIC, seen);
  }
  if (h->pid <= 0) return devbuf__error(DEVBUF_FORMAT_ERROR, "export: process id %d", (int)h->pid);
  if (h->kind == DEVBUF_EXPORT_BUFFER) return check_buffer_header(h);
  if (h->kind != DEVBUF_EXPORT_EVENT)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "export: kind %u is neither a buffer (1) nor an "
                         "event (2)",
                         h->kind);
  return DEVBUF_OK;
}

devbuf_status devbuf_export_receive(int socket, devbuf_export_t **out_export) {
  if (!out_export) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "out_export is NULL");
  devbuf__export_header header;
  int fds[DEVBUF__EXPORT_FDS] = {-1, -1, -1};
  size_t count = 0;
  devbuf_status status =
      devbuf__receive_with_fds(socket, &header, sizeof header, fds, DEVBUF__EXPORT_FDS, &count);
  if (status != DEVBUF_OK) return status;
  status = check_header(&header);
  if (status == DEVBUF_OK && count != devbuf__export_fd_count(header.kind))
    status = devbuf__error(DEVBUF_FORMAT_ERROR, "export: %zu descriptors came, %zu belong to it",
                           count, devbuf__export_fd_count(header.kind));
  if (status != DEVBUF_OK) {
    devbuf__close_fds(fds, count);
    return status;
  }
  return devbuf__export_new(&header, fds, out_export);
}
