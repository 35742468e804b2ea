// Storage: the memory shared by a buffer and its views. Reference counted; allocated
// lazily exactly once. On the last release the memory goes back at once: to the
// allocator if no submitted work uses it, otherwise (to a caching allocator) in flight: its
// bytes are then handed only to memory allocated for work, which inherits the old work on
// them and is ordered after it; the record and its tracker stay until that work is done.
// Memory exported to other processes never goes in flight: once its work is done it waits
// for the importers' leases (buffer_share.c).
#include "hazard.h"

#include <stddef.h>
#include <string.h>

devbuf_status devbuf__storage_create_slow(devbuf_allocator_t *allocator, devbuf_device_t *device,
                                          size_t size, uint32_t flags, devbuf__storage **out) {
  devbuf__storage *storage = devbuf__record_alloc(DEVBUF__RECORD_STORAGE, sizeof *storage);
  if (!storage)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a buffer's storage record");
  devbuf__storage_init(storage, allocator, size, flags, devbuf__next_id_pair());
  if (!allocator)
    storage->device = devbuf_device_retain(device);
  else if (storage->device = allocator->device, allocator->link == DEVBUF__EMBEDDED)
    devbuf__device_hold(allocator->device); // a device's own allocator goes with it
  else
    devbuf_allocator_retain(allocator);
  *out = storage;
  return DEVBUF_OK;
}

// Frees the record itself (its memory has been handed on or given back), with what it
// inherited or watched.
static void storage_free_record(devbuf__storage *storage) {
  if (DEVBUF_UNLIKELY(storage->inherited)) { // reused bytes whose earlier work it waited for
    for (size_t i = 0; i < storage->inherited_count; i++)
      devbuf__fence_release(storage->inherited[i]);
    devbuf__free(storage->inherited);
  }
  if (DEVBUF_UNLIKELY(storage->lease_watches)) // exported; its leases ended or were parked
    devbuf__free(storage->lease_watches);
  devbuf__storage_free_plain_record(storage);
}

static void give_back_allocation(devbuf__storage *storage) {
  devbuf__storage_give_back_allocation(storage);
}

const devbuf__storage_kind devbuf__storage_allocation = {
    .name = "buffer",
    .releases_in_flight = true,
    .give_back = give_back_allocation,
};

// No submitted work uses the memory any more: it goes back (or, released in flight, its
// bytes stop being in flight), and the record goes.
static inline void finalize(devbuf__storage *storage) {
  if (storage->in_flight)
    devbuf__allocator_fence_done(storage->allocator, storage->in_flight);
  else if (storage->lease_count && devbuf__storage_prune_leases(storage))
    devbuf__storage_park(storage);
  else if (DEVBUF_LIKELY(!storage->kind))
    give_back_allocation(storage);
  else
    storage->kind->give_back(storage);
  devbuf__hazard *hazard = atomic_load_explicit(&storage->hazard, memory_order_acquire);
  if (hazard) devbuf__hazard_destroy(hazard);
  storage_free_record(storage);
}

// The same as the tracker's callback, once the storage's work is done.
static void storage_finalize(void *context) { finalize(context); }

static bool reusable_for_work(const devbuf__storage *storage) {
  return devbuf__storage_kind_of(storage)->releases_in_flight && storage->allocator &&
         storage->size && !storage->lease_count &&
         devbuf__allocator_reuses_in_flight(storage->allocator) &&
         atomic_load_explicit(&storage->state, memory_order_acquire) == DEVBUF__ALLOCATED;
}

// Waits for inherited work and lets go of it: when no tracker could be made to order it, and
// when memory whose earlier owners' work may still use the bytes goes back without being
// released in flight (no host memory for the record).
static void wait_inherited_now(devbuf__storage *storage) {
  for (size_t i = 0; i < storage->inherited_count; i++) {
    devbuf__fence_wait(storage->inherited[i]);
    devbuf__fence_release(storage->inherited[i]);
  }
  storage->inherited_count = 0;
}

static bool inherits_unfinished(const devbuf__storage *storage) {
  for (size_t i = 0; i < storage->inherited_count; i++)
    if (!devbuf__fence_done(storage->inherited[i])) return true;
  return false;
}

void devbuf__storage_last_release_slow(devbuf__storage *storage) {
  if (storage->accesses) devbuf__host_access_close_all(storage);   // left open by released handles
  if (storage->lease_count) devbuf__storage_prune_leases(storage); // importers that are done
  devbuf__hazard *hazard = atomic_load(&storage->hazard);
  if (!hazard) {       // and so nothing inherited (a storage that inherits work has a tracker)
    finalize(storage); // inline: the way of nearly every buffer
    return;
  }
  // The bytes go back to the cache at once, in flight under this record (whose tracker says
  // which work uses which of them) until the work is done. Without a caching allocator (or
  // host memory for the in-flight record) the memory waits for the work instead.
  // Bytes whose earlier owners' work is still running go back in flight too when none of
  // this storage's work waited for it (its submission was cancelled or refused): then at
  // once out of flight again, into the free blocks, where the earlier owners' own ranges
  // keep them from host allocations and order the next work after theirs. (Waiting here
  // blocked the release on work the caller may only start later.)
  devbuf__spin_lock(&hazard->lock);
  bool busy = hazard->records != 0; // a first look: settled under the lock below
  devbuf__spin_unlock(&hazard->lock);
  if ((busy || inherits_unfinished(storage)) && reusable_for_work(storage) &&
      devbuf__allocator_free_in_flight(storage->allocator, &storage->memory, storage,
                                       &storage->in_flight) != DEVBUF_OK)
    storage->in_flight = NULL;
  devbuf__spin_lock(&hazard->lock);
  busy = hazard->records != 0;
  if (busy) {
    hazard->on_idle = storage_finalize;
    hazard->idle_ctx = storage;
  }
  devbuf__spin_unlock(&hazard->lock);
  if (!busy) { // its own work, which waited for what it inherited, is done, or never was
    if (!storage->in_flight) wait_inherited_now(storage);
    storage_finalize(storage);
  }
}

// ---- allocation --------------------------------------------------------------------------

// The caching allocator's visit of an in-flight range that memory for `context` reuses: the
// newest work of each queue on those bytes of the earlier owner is inherited, and what that
// owner inherited and is still running too. The allocator passes over older ranges that
// this one covers, and the earlier owner's work, which waited for those, may never have run
// (cancelled, or behind a failure) or may not cover these bytes.
static bool inherit_work(void *context, void *fence, size_t offset, size_t size) {
  devbuf__storage *storage = context, *earlier = fence;
  // An ancestor process's work never runs here (and its lock may have been held at the fork).
  if (DEVBUF_UNLIKELY(earlier->epoch != storage->epoch)) return true;
  devbuf__hazard *hazard = atomic_load_explicit(&earlier->hazard, memory_order_acquire);
  devbuf__spin_lock(&hazard->lock);
  bool ok = devbuf__hazard_collect(hazard, offset, size, &storage->inherited,
                                   &storage->inherited_count, &storage->inherited_capacity);
  for (size_t i = 0; ok && i < earlier->inherited_count; i++)
    if (!devbuf__fence_done(earlier->inherited[i]))
      ok = devbuf__fences_push(&storage->inherited, &storage->inherited_count,
                               &storage->inherited_capacity, earlier->inherited[i]);
  devbuf__spin_unlock(&hazard->lock);
  return ok;
}

devbuf_status devbuf__storage_allocation_failed(const devbuf__storage *storage,
                                                devbuf_status status) {
  char size[32];
  return devbuf__error_cause(status, "allocating %s on %s", devbuf__bytes_text(storage->size, size),
                             storage->device->spec);
}

devbuf_status devbuf__storage_no_host_address(devbuf__storage *storage) {
  devbuf_allocator_free(storage->allocator, &storage->memory);
  storage->memory = (devbuf_memory_t){0};
  return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                       "the allocator handed out %zu bytes without a host address on %s, whose "
                       "buffers the CPU reads and writes (memory of addresses only serves "
                       "devbuf_allocator_alloc)",
                       storage->size, storage->device->spec);
}

static devbuf_status allocate_locked(devbuf__storage *storage, bool for_work) {
  if (storage->size == 0) return DEVBUF_OK; // zero-length storage owns no memory
  if (storage->allocator->memory_kind == DEVBUF_MEMORY_SHAREABLE) devbuf__shareable_allocating();
  // Reused memory is only clean once its old work is done: zeroed buffers do not reuse.
  bool ordered = for_work && !(storage->flags & DEVBUF_BUFFER_ZERO) &&
                 devbuf__allocator_reuses_in_flight(storage->allocator);
  devbuf_status status =
      ordered ? devbuf__allocator_alloc_ordered(storage->allocator, storage->size, inherit_work,
                                                storage, &storage->memory)
              : devbuf__allocator_alloc_known(storage->allocator, storage->size, &storage->memory);
  if (status != DEVBUF_OK) return devbuf__storage_allocation_failed(storage, status);
  if (!storage->memory.host && devbuf__storage_host_accessible(storage))
    return devbuf__storage_no_host_address(storage);
  if (storage->inherited_count && !devbuf__storage_hazard_locked(storage))
    wait_inherited_now(storage);
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
  if (DEVBUF_LIKELY(atomic_load_explicit(&storage->state, memory_order_acquire) ==
                    DEVBUF__ALLOCATED))
    return DEVBUF_OK;
  pthread_mutex_lock(&storage->lock);
  devbuf_status status = DEVBUF_OK;
  if (atomic_load_explicit(&storage->state, memory_order_relaxed) != DEVBUF__ALLOCATED) {
    status = allocate_locked(storage, for_work);
    if (status == DEVBUF_OK)
      atomic_store_explicit(&storage->state, DEVBUF__ALLOCATED, memory_order_release);
  }
  pthread_mutex_unlock(&storage->lock);
  return status;
}

devbuf_status devbuf__storage_allocate_private_slow(devbuf__storage *storage) {
  devbuf_status status = allocate_locked(storage, false); // no other thread can take the lock
  if (status == DEVBUF_OK)
    atomic_store_explicit(&storage->state, DEVBUF__ALLOCATED, memory_order_release);
  return status;
}

devbuf_status devbuf__storage_allocate_now(devbuf__storage *storage) {
  return ensure_allocated(storage, false);
}

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

// ---- submitted work's uses --------------------------------------------------------------------

// The record joins the tracker (whose lock the caller holds) with the work it conflicts with,
// and the unfinished work of the bytes' earlier owners (but its own queue's) joins `deps`.
// The record's segment is set once it is in the tracker, also when a later step fails: the
// caller then takes it out again.
static devbuf_status add_record(devbuf__storage *storage, devbuf__hazard *hazard,
                                devbuf__record *record, devbuf__dep **deps, uint32_t *dep_count,
                                uint32_t *dep_capacity) {
  devbuf_queue_t *queue = devbuf__record_fence(record)->queue;
  if (!devbuf__hazard_add(hazard, record, queue, deps, dep_count, dep_capacity))
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to track a use");
  for (size_t i = 0; i < storage->inherited_count; i++) {
    devbuf__fence *earlier = storage->inherited[i];
    if (earlier->queue == queue || devbuf__fence_done(earlier)) continue; // its queue orders it
    if (!devbuf__deps_push(deps, dep_count, dep_capacity, earlier, true))
      return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to track a use");
  }
  return DEVBUF_OK;
}

devbuf_status devbuf__storage_track_use(devbuf__storage *storage, devbuf__record *record,
                                        devbuf__dep **deps, uint32_t *dep_count,
                                        uint32_t *dep_capacity) {
  // Fast path: a tracker and no open host access (accesses are opened holding the tracker's
  // lock, so under it the count cannot change). Otherwise under the storage's lock too.
  devbuf__hazard *hazard = atomic_load_explicit(&storage->hazard, memory_order_acquire);
  bool storage_locked = false;
  if (hazard) devbuf__spin_lock(&hazard->lock);
  if (!hazard || atomic_load(&storage->open_accesses)) {
    if (hazard) devbuf__spin_unlock(&hazard->lock);
    pthread_mutex_lock(&storage->lock);
    storage_locked = true;
    devbuf_status status = devbuf__check_host_conflicts(storage, record->offset, record->size,
                                                        record->write, "submitting work");
    if (status == DEVBUF_OK && !(hazard = devbuf__storage_hazard_locked(storage)))
      status = devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a hazard tracker");
    if (status != DEVBUF_OK) {
      pthread_mutex_unlock(&storage->lock);
      return status;
    }
    devbuf__spin_lock(&hazard->lock);
  }
  devbuf_status status = add_record(storage, hazard, record, deps, dep_count, dep_capacity);
  devbuf__spin_unlock(&hazard->lock);
  if (storage_locked) pthread_mutex_unlock(&storage->lock);
  return status;
}

// The first of the ranges that submitted work conflicts with host access to, or NULL.
static const devbuf__byte_range *conflicting_range(const devbuf__hazard *hazard,
                                                   const devbuf__byte_range *ranges, size_t count) {
  for (size_t i = 0; i < count; i++) // an empty range overlaps nothing
    if (ranges[i].size &&
        devbuf__hazard_conflicts(hazard, ranges[i].offset, ranges[i].size, ranges[i].write))
      return &ranges[i];
  return NULL;
}

// The first inherited work not yet completed; the completed ones are let go on the way.
// Caller holds the tracker's lock.
static devbuf__fence *first_unfinished_inherited(devbuf__storage *storage) {
  while (storage->inherited_count) {
    devbuf__fence *work = storage->inherited[storage->inherited_count - 1];
    if (!devbuf__fence_done(work)) return work;
    devbuf__fence_release(work);
    storage->inherited_count--;
  }
  return NULL;
}

// Whether waiting for the work on `ranges` (with `own`: the storage's own work too) means
// waiting for work of the queue whose worker this thread is. Caller holds the tracker's lock.
static bool waits_for_this_worker(devbuf__storage *storage, const devbuf__hazard *hazard,
                                  const devbuf__byte_range *ranges, size_t count, bool own) {
  for (size_t i = 0; i < storage->inherited_count; i++)
    if (storage->inherited[i]->queue == devbuf__worker_queue &&
        !devbuf__fence_done(storage->inherited[i]))
      return true;
  for (size_t i = 0; i < count && own; i++)
    if (ranges[i].size &&
        devbuf__hazard_queue_conflicts(hazard, devbuf__worker_queue, ranges[i].offset,
                                       ranges[i].size, ranges[i].write))
      return true;
  return false;
}

devbuf_status devbuf__storage_lock_idle(devbuf__storage *storage, const devbuf__byte_range *ranges,
                                        size_t count, devbuf__own_work own, const char *what,
                                        devbuf__hazard **out_hazard) {
  for (bool settled = false;;) {
    pthread_mutex_lock(&storage->lock);
    devbuf__hazard *hazard = atomic_load_explicit(&storage->hazard, memory_order_acquire);
    *out_hazard = hazard;
    if (!hazard) return DEVBUF_OK;
    devbuf__spin_lock(&hazard->lock);
    // The tracker holds this storage's own work only; earlier owners' is inherited.
    const devbuf__byte_range *range =
        own == DEVBUF__OWN_IGNORE ? NULL : conflicting_range(hazard, ranges, count);
    if (range && own == DEVBUF__OWN_REFUSE) {
      devbuf__storage_unlock(storage, hazard);
      if (devbuf__settle_before_blocking())
        continue; // it may have been work this worker ran already
      return devbuf__error(DEVBUF_IN_USE,
                           "%s of bytes [%zu, %zu) of storage %llu: submitted work %s them", what,
                           range->offset, range->offset + range->size,
                           (unsigned long long)storage->id, range->write ? "uses" : "writes");
    }
    if (DEVBUF_UNLIKELY(devbuf__worker_queue) &&
        waits_for_this_worker(storage, hazard, ranges, count, own == DEVBUF__OWN_WAIT)) {
      devbuf__storage_unlock(storage, hazard);
      if (devbuf__settle_before_blocking()) continue;
      return devbuf__refuse_self_wait(what);
    }
    devbuf__fence *earlier = first_unfinished_inherited(storage);
    if ((earlier || range) && !settled && DEVBUF_UNLIKELY(devbuf__worker_settle != NULL)) {
      devbuf__storage_unlock(storage, hazard); // about to block: see devbuf__worker_settle
      devbuf__settle_before_blocking();
      settled = true;
      continue;
    }
    if (earlier) { // an earlier owner's work on reused bytes: wait for it, then look again
      devbuf__fence_retain(earlier);
      devbuf__storage_unlock(storage, hazard);
      devbuf__fence_wait(earlier);
      devbuf__fence_release(earlier);
      continue;
    }
    if (!range) return DEVBUF_OK;
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
  bool used = first_unfinished_inherited(storage) || devbuf__hazard_overlaps(hazard, offset, size);
  devbuf__spin_unlock(&hazard->lock);
  return used;
}

devbuf_status devbuf__storage_wait_unused(devbuf__storage *storage, size_t offset, size_t size) {
  devbuf__hazard *hazard = atomic_load_explicit(&storage->hazard, memory_order_acquire);
  if (!hazard || size == 0) return DEVBUF_OK;
  devbuf__spin_lock(&hazard->lock);
  devbuf__byte_range range = {offset, size, true};
  while (DEVBUF_UNLIKELY(devbuf__worker_queue) &&
         waits_for_this_worker(storage, hazard, &range, 1, true)) {
    devbuf__spin_unlock(&hazard->lock);
    if (!devbuf__settle_before_blocking()) return devbuf__refuse_self_wait("buffer_wait");
    devbuf__spin_lock(&hazard->lock);
  }
  if (DEVBUF_UNLIKELY(devbuf__worker_settle != NULL) &&
      (first_unfinished_inherited(storage) || devbuf__hazard_overlaps(hazard, offset, size))) {
    devbuf__spin_unlock(&hazard->lock); // about to block: see devbuf__worker_settle
    devbuf__settle_before_blocking();
    devbuf__spin_lock(&hazard->lock);
  }
  for (devbuf__fence *earlier; (earlier = first_unfinished_inherited(storage));) {
    devbuf__fence_retain(earlier);
    devbuf__spin_unlock(&hazard->lock);
    devbuf__fence_wait(earlier);
    devbuf__fence_release(earlier);
    devbuf__spin_lock(&hazard->lock);
  }
  while (devbuf__hazard_overlaps(hazard, offset, size)) devbuf__hazard_wait_progress(hazard);
  devbuf__spin_unlock(&hazard->lock);
  return DEVBUF_OK;
}
