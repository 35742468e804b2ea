// Storage: the memory shared by a buffer and its views. Reference counted; allocated
// lazily exactly once (B1); returns its memory to the allocator on the last release (B10).
#include "internal.h"

#include <sys/mman.h>

static atomic_uint_least64_t id_counter = 1;

uint64_t devbuf__next_id(void) { return atomic_fetch_add_explicit(&id_counter, 1, memory_order_relaxed); }

devbuf_status devbuf__storage_create(devbuf_allocator_t *allocator, devbuf_device_t *device, size_t size,
                                     uint32_t flags, devbuf__storage **out) {
  devbuf__storage *storage = devbuf__calloc(1, sizeof *storage);
  if (!storage) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a buffer's storage record");
  atomic_init(&storage->refs, 1);
  atomic_init(&storage->state, DEVBUF__UNALLOCATED);
  storage->id = devbuf__next_id();
  storage->allocator = allocator ? devbuf_allocator_retain(allocator) : NULL;
  storage->device = allocator ? allocator->device : devbuf_device_retain(device);
  storage->size = size;
  storage->flags = flags;
  pthread_mutex_init(&storage->lock, NULL);
  *out = storage;
  return DEVBUF_OK;
}

void devbuf__storage_release(devbuf__storage *storage) {
  if (!storage || atomic_fetch_sub_explicit(&storage->refs, 1, memory_order_acq_rel) != 1) return;
  if (atomic_load_explicit(&storage->state, memory_order_acquire) == DEVBUF__ALLOCATED && storage->size) {
    if (storage->mapped) {
      munmap(storage->memory.host, storage->memory.size);
      size_t page = storage->device->page_size;
      atomic_fetch_sub(&storage->device->mapped_bytes, (storage->memory.size + page - 1) & ~(page - 1));
    } else {
      devbuf_allocator_free(storage->allocator, &storage->memory);
    }
  }
  while (storage->accesses) { // left open by handles that were released: close them
    devbuf__host_access *access = storage->accesses;
    storage->accesses = access->next;
    devbuf__free(access);
  }
  pthread_mutex_destroy(&storage->lock);
  if (storage->allocator)
    devbuf_allocator_release(storage->allocator);
  else
    devbuf_device_release(storage->device);
  devbuf__free(storage);
}

static devbuf_status allocate_locked(devbuf__storage *storage) {
  if (storage->size == 0) return DEVBUF_OK; // B11: zero-length storage owns no memory
  devbuf_status status = devbuf_allocator_alloc(storage->allocator, storage->size, &storage->memory);
  if (status != DEVBUF_OK) return status;
  if (storage->flags & DEVBUF_BUFFER_ZERO) {
    devbuf_device_t *device = storage->device;
    status = device->backend->zero(device, &storage->memory, 0, storage->size);
    if (status != DEVBUF_OK) {
      devbuf_allocator_free(storage->allocator, &storage->memory);
      return status;
    }
  }
  return DEVBUF_OK;
}

devbuf_status devbuf__storage_ensure_allocated(devbuf__storage *storage) {
  if (DEVBUF_LIKELY(atomic_load_explicit(&storage->state, memory_order_acquire) == DEVBUF__ALLOCATED))
    return DEVBUF_OK;
  pthread_mutex_lock(&storage->lock);
  devbuf_status status = DEVBUF_OK;
  if (atomic_load_explicit(&storage->state, memory_order_relaxed) != DEVBUF__ALLOCATED) {
    status = allocate_locked(storage);
    if (status == DEVBUF_OK) atomic_store_explicit(&storage->state, DEVBUF__ALLOCATED, memory_order_release);
  }
  pthread_mutex_unlock(&storage->lock);
  return status;
}
