// Storage: the memory shared by a buffer and its views. Reference counted; allocated
// lazily exactly once. On the last release the memory goes back at once: to the
// allocator if no submitted work uses it, otherwise to the allocator's pending list, from
// which work may reuse it (ordered after the old work by the hazard tracker) and which
// hands it to the allocator when the old work completes.
#include "hazard.h"

static atomic_uint_least64_t id_counter = 1;

uint64_t devbuf__next_id(void) { return atomic_fetch_add_explicit(&id_counter, 1, memory_order_relaxed); }

devbuf_status devbuf__storage_create(devbuf_allocator_t *allocator, devbuf_device_t *device, size_t size,
                                     uint32_t flags, devbuf__storage **out) {
  devbuf__storage *storage = devbuf__calloc(1, sizeof *storage);
  if (!storage) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a buffer's storage record");
  atomic_init(&storage->refs, 1);
  atomic_init(&storage->state, DEVBUF__UNALLOCATED);
  atomic_init(&storage->hazard, NULL);
  atomic_init(&storage->open_accesses, 0);
  storage->id = devbuf__next_id();
  storage->allocator = allocator ? devbuf_allocator_retain(allocator) : NULL;
  storage->device = allocator ? allocator->device : devbuf_device_retain(device);
  storage->size = size;
  storage->flags = flags;
  devbuf__mutex_init(&storage->lock);
  *out = storage;
  return DEVBUF_OK;
}

// Frees the record itself (its memory has been handed on or given back).
static void storage_free_record(devbuf__storage *storage) {
  pthread_mutex_destroy(&storage->lock);
  if (storage->allocator)
    devbuf_allocator_release(storage->allocator);
  else
    devbuf_device_release(storage->device);
  devbuf__free(storage);
}

static void storage_finalize(devbuf__storage *storage) {
  if (storage->release_external)
    storage->release_external(storage);
  else if (storage->allocator && storage->size &&
           atomic_load_explicit(&storage->state, memory_order_acquire) == DEVBUF__ALLOCATED)
    devbuf_allocator_free(storage->allocator, &storage->memory);
  devbuf__hazard_destroy(atomic_load(&storage->hazard));
  storage_free_record(storage);
}

// ---- the allocator's pending list ------------------------------------------------------

static void pending_unlink_locked(devbuf_allocator_t *allocator, devbuf__storage *storage) {
  if (storage->prev_pending)
    storage->prev_pending->next_pending = storage->next_pending;
  else
    allocator->pending = storage->next_pending;
  if (storage->next_pending) storage->next_pending->prev_pending = storage->prev_pending;
  atomic_fetch_sub(&allocator->pending_bytes, storage->memory.size);
  atomic_fetch_sub(&allocator->pending_count, 1);
}

static bool is_pending(const devbuf_allocator_t *allocator, const devbuf__storage *storage) {
  return storage->prev_pending || allocator->pending == storage;
}

// The old work completed: the memory goes to the allocator.
static void finalize_when_idle(void *context) {
  devbuf__storage *storage = context;
  devbuf_allocator_t *allocator = storage->allocator;
  if (allocator) {
    pthread_mutex_lock(&allocator->pending_lock);
    if (is_pending(allocator, storage)) pending_unlink_locked(allocator, storage);
    pthread_mutex_unlock(&allocator->pending_lock);
  }
  storage_finalize(storage);
}

static bool reusable_for_work(const devbuf__storage *storage) {
  return storage->allocator && storage->size && !storage->mapped &&
         atomic_load_explicit(&storage->state, memory_order_acquire) == DEVBUF__ALLOCATED;
}

void devbuf__storage_release(devbuf__storage *storage) {
  if (!storage || atomic_fetch_sub_explicit(&storage->refs, 1, memory_order_acq_rel) != 1) return;
  while (storage->accesses) { // left open by handles that were released: close them
    devbuf__host_access *access = storage->accesses;
    storage->accesses = access->next;
    devbuf__free(access);
  }
  devbuf__hazard *hazard = atomic_load(&storage->hazard);
  if (!hazard) {
    storage_finalize(storage);
    return;
  }
  devbuf_allocator_t *allocator = reusable_for_work(storage) ? storage->allocator : NULL;
  if (allocator) { // listed before it is armed: a reuser takes only armed entries
    pthread_mutex_lock(&allocator->pending_lock);
    storage->prev_pending = NULL;
    storage->next_pending = allocator->pending;
    if (allocator->pending) allocator->pending->prev_pending = storage;
    allocator->pending = storage;
    atomic_fetch_add(&allocator->pending_bytes, storage->memory.size);
    atomic_fetch_add(&allocator->pending_count, 1);
    pthread_mutex_unlock(&allocator->pending_lock);
  }
  devbuf__spin_lock(&hazard->lock);
  bool busy = hazard->records != 0;
  if (busy) {
    hazard->on_idle = finalize_when_idle;
    hazard->idle_ctx = storage;
  }
  devbuf__spin_unlock(&hazard->lock);
  if (!busy) finalize_when_idle(storage);
}

// Moves the best fitting pending memory (and its tracker) of the allocator to `storage`.
static bool take_pending(devbuf__storage *storage) {
  devbuf_allocator_t *allocator = storage->allocator;
  if (!atomic_load_explicit(&allocator->pending_count, memory_order_relaxed)) return false;
  size_t limit = devbuf__fit_limit(storage->size, storage->device->page_size);
  devbuf__storage *best = NULL;
  pthread_mutex_lock(&allocator->pending_lock);
  for (devbuf__storage *candidate = allocator->pending; candidate; candidate = candidate->next_pending) {
    size_t size = candidate->memory.size;
    if (size < storage->size || size > limit || (best && size >= best->memory.size)) continue;
    devbuf__hazard *hazard = atomic_load(&candidate->hazard);
    devbuf__spin_lock(&hazard->lock);
    bool armed = hazard->on_idle == finalize_when_idle;
    devbuf__spin_unlock(&hazard->lock);
    if (armed) best = candidate;
  }
  if (best) {
    devbuf__hazard *hazard = atomic_load(&best->hazard);
    devbuf__spin_lock(&hazard->lock);
    bool armed = hazard->on_idle == finalize_when_idle;
    if (armed) hazard->on_idle = NULL; // its work runs on; this storage owns it now
    devbuf__spin_unlock(&hazard->lock);
    if (armed)
      pending_unlink_locked(allocator, best);
    else
      best = NULL;
  }
  pthread_mutex_unlock(&allocator->pending_lock);
  if (!best) return false;
  storage->memory = best->memory;
  atomic_store(&storage->hazard, atomic_load(&best->hazard));
  storage_free_record(best);
  return true;
}

// ---- allocation --------------------------------------------------------------------------

static devbuf_status allocate_locked(devbuf__storage *storage) {
  if (storage->size == 0) return DEVBUF_OK; // zero-length storage owns no memory
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

static devbuf_status ensure_allocated(devbuf__storage *storage, bool for_work) {
  if (DEVBUF_LIKELY(atomic_load_explicit(&storage->state, memory_order_acquire) == DEVBUF__ALLOCATED))
    return DEVBUF_OK;
  pthread_mutex_lock(&storage->lock);
  devbuf_status status = DEVBUF_OK;
  if (atomic_load_explicit(&storage->state, memory_order_relaxed) != DEVBUF__ALLOCATED) {
    // Reused memory is only clean once its old work is done: zeroed buffers do not reuse.
    bool reused = for_work && storage->size && !(storage->flags & DEVBUF_BUFFER_ZERO) && take_pending(storage);
    if (!reused) status = allocate_locked(storage);
    if (status == DEVBUF_OK) atomic_store_explicit(&storage->state, DEVBUF__ALLOCATED, memory_order_release);
  }
  pthread_mutex_unlock(&storage->lock);
  return status;
}

devbuf_status devbuf__storage_ensure_allocated(devbuf__storage *storage) { return ensure_allocated(storage, false); }

devbuf_status devbuf__storage_ensure_allocated_for_work(devbuf__storage *storage) {
  return ensure_allocated(storage, true);
}

// ---- hazards seen from the host ----------------------------------------------------------

devbuf__hazard *devbuf__storage_hazard_locked(devbuf__storage *storage) {
  devbuf__hazard *hazard = atomic_load_explicit(&storage->hazard, memory_order_acquire);
  if (!hazard) {
    hazard = devbuf__hazard_create();
    atomic_store_explicit(&storage->hazard, hazard, memory_order_release);
  }
  return hazard;
}

// The worst conflict of submitted work with host access to any of the ranges.
static devbuf__conflict ranges_conflict(const devbuf__hazard *hazard, const devbuf__byte_range *ranges, size_t count,
                                        uint64_t owner, bool ignore_own, const devbuf__byte_range **out_range) {
  devbuf__conflict worst = DEVBUF__NO_CONFLICT;
  for (size_t i = 0; i < count && worst != DEVBUF__CONFLICT_OWN; i++) {
    if (!ranges[i].size) continue; // an empty range overlaps nothing
    devbuf__conflict conflict =
        devbuf__hazard_conflict(hazard, ranges[i].offset, ranges[i].size, ranges[i].write, owner, ignore_own);
    if (conflict > worst) {
      worst = conflict;
      *out_range = &ranges[i];
    }
  }
  return worst;
}

devbuf_status devbuf__storage_lock_idle(devbuf__storage *storage, const devbuf__byte_range *ranges, size_t count,
                                        devbuf__own_work own, const char *what, devbuf__hazard **out_hazard) {
  for (;;) {
    pthread_mutex_lock(&storage->lock);
    devbuf__hazard *hazard = atomic_load_explicit(&storage->hazard, memory_order_acquire);
    *out_hazard = hazard;
    if (!hazard) return DEVBUF_OK;
    devbuf__spin_lock(&hazard->lock);
    const devbuf__byte_range *range = NULL;
    devbuf__conflict conflict = ranges_conflict(hazard, ranges, count, storage->id, own == DEVBUF__OWN_IGNORE, &range);
    if (conflict == DEVBUF__NO_CONFLICT) return DEVBUF_OK;
    if (conflict == DEVBUF__CONFLICT_OWN && own == DEVBUF__OWN_REFUSE) {
      devbuf__storage_unlock(storage, hazard);
      return devbuf__error(DEVBUF_IN_USE, "%s of bytes [%zu, %zu) of storage %llu: submitted work %s them", what,
                           range->offset, range->offset + range->size, (unsigned long long)storage->id,
                           range->write ? "uses" : "writes");
    }
    pthread_mutex_unlock(&storage->lock);
    devbuf__hazard_wait_progress(hazard); // the storage is alive, so is its tracker
    devbuf__spin_unlock(&hazard->lock);
  }
}

void devbuf__storage_unlock(devbuf__storage *storage, devbuf__hazard *hazard) {
  if (hazard) devbuf__spin_unlock(&hazard->lock);
  pthread_mutex_unlock(&storage->lock);
}

bool devbuf__storage_in_use(devbuf__storage *storage, size_t offset, size_t size) {
  devbuf__hazard *hazard = atomic_load_explicit(&storage->hazard, memory_order_acquire);
  if (!hazard || size == 0) return false;
  devbuf__spin_lock(&hazard->lock);
  bool used = devbuf__hazard_overlaps(hazard, offset, size);
  devbuf__spin_unlock(&hazard->lock);
  return used;
}

void devbuf__storage_wait_unused(devbuf__storage *storage, size_t offset, size_t size) {
  devbuf__hazard *hazard = atomic_load_explicit(&storage->hazard, memory_order_acquire);
  if (!hazard || size == 0) return;
  devbuf__spin_lock(&hazard->lock);
  while (devbuf__hazard_overlaps(hazard, offset, size)) devbuf__hazard_wait_progress(hazard);
  devbuf__spin_unlock(&hazard->lock);
}
