// One reference count for every shared object of the library (devices, allocators,
// storages, buffer handles, events, queues, programs, work items): an atomic counter that
// starts at the holders it is made with; the call that drops the last reference destroys
// the object. Retaining needs no ordering (the caller already holds a reference); a drop
// publishes the holder's writes and the last drop acquires them all, so the destroyer sees
// what every holder did.
#ifndef DEVBUF_REFCOUNT_H
#define DEVBUF_REFCOUNT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct devbuf__refcount {
  atomic_size_t count;
} devbuf__refcount;

static inline void devbuf__ref_init(devbuf__refcount *ref, size_t holders) {
  atomic_init(&ref->count, holders);
}

static inline void devbuf__ref_retain(devbuf__refcount *ref) {
  atomic_fetch_add_explicit(&ref->count, 1, memory_order_relaxed);
}

// Drops one reference; true when it was the last (the caller destroys the object).
static inline bool devbuf__ref_drop(devbuf__refcount *ref) {
  return atomic_fetch_sub_explicit(&ref->count, 1, memory_order_acq_rel) == 1;
}

// devbuf__ref_drop for objects that no one retains without holding a reference already
// (no lookup finds them): a sole holder sees the count at 1 and skips the locked
// instruction, as no other thread can raise it meanwhile.
static inline bool devbuf__ref_drop_held(devbuf__refcount *ref) {
  if (atomic_load_explicit(&ref->count, memory_order_acquire) == 1) return true;
  return devbuf__ref_drop(ref);
}

// Drops one reference unless it is the last; false leaves the last one to the caller, who
// drops it with devbuf__ref_drop under whatever lock makes the destruction safe.
static inline bool devbuf__ref_drop_unless_last(devbuf__refcount *ref) {
  size_t count = atomic_load_explicit(&ref->count, memory_order_relaxed);
  while (count > 1)
    if (atomic_compare_exchange_weak_explicit(&ref->count, &count, count - 1, memory_order_acq_rel,
                                              memory_order_relaxed))
      return true;
  return false;
}

#endif
