// The open host accesses of a storage: the one file that makes, links, unlinks and frees
// their records. Submissions read the list (under the storage's lock, or its count
// without it) to refuse work that would race with an open access.
#include "core.h"

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

devbuf_status devbuf__host_access_open(devbuf__storage *storage, const devbuf__host_access *wanted,
                                       size_t count, devbuf__own_work own, bool exclusive,
                                       const char *what, devbuf__host_access **out_accesses) {
  devbuf__host_access *records[DEVBUF__HOST_ACCESS_RANGES] = {NULL, NULL};
  devbuf__byte_range ranges[DEVBUF__HOST_ACCESS_RANGES] = {{0, 0, false}, {0, 0, false}};
  if (count > DEVBUF__HOST_ACCESS_RANGES)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: %zu ranges at once (at most %d)", what,
                         count, DEVBUF__HOST_ACCESS_RANGES);
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

// Which records to close: one record, or a handle's record at an address, or all of a
// handle's records.
typedef struct closing {
  const devbuf__host_access *record;
  const devbuf_buffer_t *handle;
  const void *data;
  bool all_of_handle;
} closing;

static bool closes(const closing *which, const devbuf__host_access *access) {
  if (which->record) return access == which->record;
  return access->handle == which->handle && (which->all_of_handle || access->data == which->data);
}

// Unlinks and frees the records `which` names (the first only, unless all of a handle's);
// how many. Takes the storage's lock.
static size_t close_records(devbuf__storage *storage, const closing *which) {
  size_t closed = 0;
  pthread_mutex_lock(&storage->lock);
  for (devbuf__host_access **link = &storage->accesses; *link;) {
    devbuf__host_access *access = *link;
    if (!closes(which, access)) {
      link = &access->next;
      continue;
    }
    *link = access->next;
    atomic_fetch_sub(&storage->open_accesses, 1);
    devbuf__free(access);
    closed++;
    if (!which->all_of_handle) break;
  }
  pthread_mutex_unlock(&storage->lock);
  return closed;
}

void devbuf__host_access_close(devbuf__storage *storage, devbuf__host_access *access) {
  close_records(storage, &(closing){.record = access});
}

bool devbuf__host_access_close_at(devbuf__storage *storage, const devbuf_buffer_t *handle,
                                  const void *data) {
  return close_records(storage, &(closing){.handle = handle, .data = data}) == 1;
}

void devbuf__host_access_close_all_of(devbuf__storage *storage, const devbuf_buffer_t *handle) {
  close_records(storage, &(closing){.handle = handle, .all_of_handle = true});
}

void devbuf__host_access_close_all(devbuf__storage *storage) {
  while (storage->accesses) {
    devbuf__host_access *access = storage->accesses;
    storage->accesses = access->next;
    devbuf__free(access);
  }
  atomic_store(&storage->open_accesses, 0);
}

size_t devbuf__host_access_count(devbuf__storage *storage, const devbuf_buffer_t *buffer) {
  size_t count = 0;
  pthread_mutex_lock(&storage->lock);
  for (const devbuf__host_access *access = storage->accesses; access; access = access->next)
    count += ranges_overlap(buffer->offset, buffer->size, access->offset, access->size) ||
             (buffer->size == 0 && access->handle == buffer);
  pthread_mutex_unlock(&storage->lock);
  return count;
}
