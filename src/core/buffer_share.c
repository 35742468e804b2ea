// Buffers shared with other processes: export (a descriptor of the segment that holds the
// storage, and a lease), import (the segment mapped again, as a storage of its own that keeps
// the exporter's id), and the exporter's side of the lifetime: a storage released while
// importers hold leases on it parks its memory here until they have all let go.
#include "core.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct parked {
  devbuf_allocator_t *allocator; // retained
  devbuf_memory_t memory;
  int *watches;
  size_t watch_count;
  struct parked *next;
} parked;

static pthread_mutex_t parked_lock = PTHREAD_MUTEX_INITIALIZER;
static parked *parked_list;        // under parked_lock
static atomic_size_t parked_count; // read without the lock by allocations
static atomic_uint_least64_t last_reclaim_ns;

// A leaf lock: taken late in a fork's prepare steps (after the devices' and allocators').
static void parked_fork_prepare(void) { pthread_mutex_lock(&parked_lock); }
static void parked_fork_release(void) { pthread_mutex_unlock(&parked_lock); }
DEVBUF__FORK_HOOK(80, parked_fork_prepare, parked_fork_release, parked_fork_release)

static bool any_held(const int *watches, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (devbuf__lease_held(watches[i])) return true;
  return false;
}

// Closes the watches of leases nobody holds any more (importers that are done), keeping the
// rest; how many are left. Caller holds the storage's lock, or the storage's last reference.
size_t devbuf__storage_prune_leases(devbuf__storage *storage) {
  size_t kept = 0;
  for (size_t i = 0; i < storage->lease_count; i++) {
    if (devbuf__lease_held(storage->lease_watches[i]))
      storage->lease_watches[kept++] = storage->lease_watches[i];
    else
      close(storage->lease_watches[i]);
  }
  storage->lease_count = kept;
  return kept;
}

devbuf_status devbuf_export_reclaim(uint64_t *out_bytes_held) {
  parked *done = NULL;
  uint64_t held = 0;
  pthread_mutex_lock(&parked_lock);
  for (parked **link = &parked_list; *link;) {
    parked *entry = *link;
    if (any_held(entry->watches, entry->watch_count)) {
      held += entry->memory.size;
      link = &entry->next;
      continue;
    }
    *link = entry->next;
    entry->next = done;
    done = entry;
    atomic_fetch_sub(&parked_count, 1);
  }
  pthread_mutex_unlock(&parked_lock);
  while (done) { // outside the lock: freeing may call into the allocator's upstream
    parked *next = done->next;
    devbuf_allocator_free(done->allocator, &done->memory);
    devbuf_allocator_release(done->allocator);
    devbuf__close_fds(done->watches, done->watch_count);
    devbuf__free(done->watches);
    devbuf__free(done);
    done = next;
  }
  if (out_bytes_held) *out_bytes_held = held;
  return DEVBUF_OK;
}

// Reclaims at most once a millisecond: allocations call this while memory is parked.
static void reclaim_now_and_then(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  uint64_t at = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
  uint64_t last = atomic_load_explicit(&last_reclaim_ns, memory_order_relaxed);
  if (at - last < 1000000u || !atomic_compare_exchange_strong(&last_reclaim_ns, &last, at)) return;
  devbuf_export_reclaim(NULL);
}

void devbuf__shareable_allocating(void) {
  if (atomic_load_explicit(&parked_count, memory_order_relaxed)) reclaim_now_and_then();
}

void devbuf__storage_park(devbuf__storage *storage) {
  devbuf_export_reclaim(NULL); // what other storages' importers let go of meanwhile
  parked *entry = devbuf__malloc(sizeof *entry);
  if (entry) {
    *entry = (parked){devbuf_allocator_retain(storage->allocator), storage->memory,
                      storage->lease_watches, storage->lease_count, NULL};
    pthread_mutex_lock(&parked_lock);
    entry->next = parked_list;
    parked_list = entry;
    atomic_fetch_add(&parked_count, 1);
    pthread_mutex_unlock(&parked_lock);
    storage->lease_watches = NULL; // the entry's now
  } else { // the memory is kept for good: never handed on while an importer may write it
    devbuf__close_fds(storage->lease_watches, storage->lease_count);
  }
  storage->lease_count = 0;
}

// ---- export -------------------------------------------------------------------------------

typedef struct import_record {
  devbuf_device_t *device; // the storage holds the reference
  devbuf_memory_t mapping; // the whole segment, as the backend mapped it
  int lease;               // held while the storage lives
} import_record;

static void import_release(devbuf__storage *storage) {
  import_record *record = storage->external;
  record->device->backend->raw_unimport(record->device, &record->mapping);
  close(record->lease); // the exporter may now reuse the memory
  devbuf__free(record);
}

// Memory another process exported, mapped here; its lease holds the exporter's memory.
static const devbuf__storage_kind process_import = {
    .name = "buffer imported from another process",
    .give_back = import_release,
};

static devbuf_status exportable(const devbuf__storage *storage) {
  const devbuf_device_t *device = storage->device;
  if (!device->shares_memory)
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s cannot share memory with other processes (%s)",
                         device->spec,
                         device->backend->raw_export
                             ? "its driver cannot export memory as POSIX descriptors"
                             : "the backend has no way to hand its memory to another process");
  if (storage->kind == &process_import)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "storage %llu was imported from process %d: export it there, where its "
                         "memory's lifetime is kept",
                         (unsigned long long)storage->id, (int)(storage->id >> 40));
  if (!storage->allocator || storage->allocator != device->shareable_allocator)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "storage %llu is not shareable memory: allocate it from "
                         "devbuf_device_allocator_for(device, DEVBUF_MEMORY_SHAREABLE)",
                         (unsigned long long)storage->id);
  if (storage->size == 0)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "a zero-length buffer has no memory to share");
  return DEVBUF_OK;
}

static bool push_watch(devbuf__storage *storage, int watch) {
  if (storage->lease_count == storage->lease_capacity) {
    size_t capacity = storage->lease_capacity ? 2 * storage->lease_capacity : 4;
    int *grown = devbuf__realloc(storage->lease_watches, capacity * sizeof *grown);
    if (!grown) return false;
    storage->lease_watches = grown;
    storage->lease_capacity = capacity;
  }
  storage->lease_watches[storage->lease_count++] = watch;
  return true;
}

devbuf_status devbuf_buffer_export(devbuf_buffer_t *buffer, devbuf_export_t **out_export) {
  if (!buffer || !out_export)
    return devbuf__null_argument("", "buffer, out_export", (const void *[]){buffer, out_export});
  devbuf__storage *storage = buffer->storage;
  devbuf_status status = exportable(storage);
  if (status == DEVBUF_OK) status = devbuf__storage_ensure_allocated(storage);
  if (status != DEVBUF_OK) return status;
  // Another process cannot be ordered after the work of the bytes' earlier owner (reused
  // memory): that is over before they go. Its own work is the exporter's to order (events).
  devbuf__byte_range whole = {0, storage->size, true};
  struct devbuf__hazard *hazard = NULL;
  status = devbuf__storage_lock_idle(storage, &whole, 1, DEVBUF__OWN_IGNORE, "export", &hazard);
  if (status != DEVBUF_OK) return status;
  devbuf__storage_unlock(storage, hazard);
  devbuf_export_reclaim(NULL);
  devbuf_device_t *device = storage->device;
  devbuf_memory_t segment;
  size_t offset;
  devbuf__caching_segment_of(&storage->memory, &segment, &offset);
  int memory_fd = -1, hold = -1, watch = -1;
  status = device->backend->raw_export(device, &segment, &memory_fd);
  if (status != DEVBUF_OK) return status;
  status = devbuf__lease_create(&hold, &watch);
  if (status != DEVBUF_OK) {
    close(memory_fd);
    return status;
  }
  pthread_mutex_lock(&storage->lock);
  devbuf__storage_prune_leases(storage);
  bool pushed = push_watch(storage, watch);
  pthread_mutex_unlock(&storage->lock);
  if (!pushed) {
    devbuf__close_fds((int[]){memory_fd, hold, watch}, 3);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to record an export");
  }
  devbuf__export_header header = {.kind = DEVBUF_EXPORT_BUFFER,
                                  .device_kind = (uint32_t)device->kind,
                                  .pid = (int32_t)getpid(),
                                  .dtype = (uint32_t)buffer->dtype,
                                  .ndim = (uint32_t)buffer->ndim,
                                  .read_only = storage->read_only,
                                  .storage_id = storage->id,
                                  .segment_size = segment.size,
                                  .storage_offset = offset,
                                  .storage_size = storage->size,
                                  .view_offset = buffer->offset,
                                  .view_size = buffer->size};
  memcpy(header.magic, DEVBUF__EXPORT_MAGIC, sizeof header.magic);
  memcpy(header.device_uuid, device->uuid, sizeof header.device_uuid);
  for (size_t i = 0; i < buffer->ndim; i++) header.shape[i] = buffer->shape[i];
  // The lease is the export's until it is sent: should this fail, its watch stays with the
  // storage and sees it end.
  return devbuf__export_new(&header, (int[]){memory_fd, hold}, out_export);
}

// ---- import -------------------------------------------------------------------------------

devbuf_status devbuf_buffer_import(devbuf_device_t *device, devbuf_export_t *shared,
                                   devbuf_buffer_t **out_buffer) {
  if (!device || !shared || !out_buffer)
    return devbuf__null_argument("", "device, export, out_buffer",
                                 (const void *[]){device, shared, out_buffer});
  const devbuf__export_header *h = &shared->header;
  if (h->kind != DEVBUF_EXPORT_BUFFER)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "the export is an event, not a buffer");
  if (h->device_kind != (uint32_t)device->kind)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "the export holds memory of another kind of device (%u) than %s",
                         h->device_kind, device->spec);
  if (!device->shares_memory)
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s cannot map memory of other processes",
                         device->spec);
  if (h->storage_offset % device->alignment)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "the export puts its storage at byte %llu of its memory, not a multiple "
                         "of %s's %zu-byte alignment (kernels would get misaligned data)",
                         (unsigned long long)h->storage_offset, device->spec, device->alignment);
  static const unsigned char anywhere[16];
  if (memcmp(h->device_uuid, anywhere, 16) != 0 && memcmp(h->device_uuid, device->uuid, 16) != 0) {
    char theirs[33], ours[33];
    for (int i = 0; i < 16; i++) {
      snprintf(theirs + 2 * i, 3, "%02x", h->device_uuid[i]);
      snprintf(ours + 2 * i, 3, "%02x", device->uuid[i]);
    }
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "the export holds memory of another device than %s (its UUID differs: "
                         "%s, not %s): import it on the device that made it",
                         device->spec, theirs, ours);
  }
  devbuf_status status = devbuf__export_claim(shared, "devbuf_buffer_import");
  if (status != DEVBUF_OK) return status;
  import_record *record = devbuf__calloc(1, sizeof *record);
  status = record ? device->backend->raw_import(device, shared->fds[DEVBUF__EXPORT_MEMORY],
                                                (size_t)h->segment_size, &record->mapping)
                  : devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an import");
  devbuf__storage *storage = NULL;
  if (status == DEVBUF_OK)
    status = devbuf__storage_create(NULL, device, (size_t)h->storage_size, 0, &storage);
  if (status != DEVBUF_OK) {
    if (record && record->mapping.size) device->backend->raw_unimport(device, &record->mapping);
    devbuf__free(record);
    devbuf__export_unclaim(shared);
    return status;
  }
  close(devbuf__export_take_fd(shared, DEVBUF__EXPORT_MEMORY)); // the mapping keeps the memory
  record->device = device;
  record->lease = devbuf__export_take_fd(shared, DEVBUF__EXPORT_LEASE);
  devbuf__export_unclaim(shared);
  storage->id = h->storage_id;
  storage->read_only = h->read_only;
  storage->memory = (devbuf_memory_t){
      .host = record->mapping.host ? (char *)record->mapping.host + h->storage_offset : NULL,
      .device = record->mapping.device + h->storage_offset,
      .size = storage->size};
  atomic_store_explicit(&storage->state, DEVBUF__ALLOCATED, memory_order_release);
  storage->kind = &process_import;
  storage->external = record;
  size_t shape[DEVBUF_MAX_NDIM];
  for (uint32_t i = 0; i < h->ndim; i++) shape[i] = (size_t)h->shape[i];
  return devbuf__buffer_wrap(storage, (size_t)h->view_offset, (size_t)h->view_size,
                             (devbuf_dtype)h->dtype, shape, h->ndim, out_buffer);
}
