// The hazard tracker: which submitted work uses which bytes of a piece of
// memory. One tracker per storage, made on its first submission; it stays with the memory
// when the storage is released while work still runs, so that reuse is ordered after it.
#ifndef DEVBUF_HAZARD_H
#define DEVBUF_HAZARD_H

#include "fence.h"

typedef struct devbuf__segment devbuf__segment;
typedef struct devbuf__hazard devbuf__hazard;

// Work of another queue that a work item must wait for. Work submitted through the same
// storage is a data dependency: if it fails, what reads or overwrites its bytes fails too.
// Work of an earlier owner of reused memory (a storage's inherited work) is ordering only:
// its outcome belongs to its own queue and events, never to the next owner of the memory.
typedef struct devbuf__dep {
  devbuf__fence *work; // retained
  bool order_only;
} devbuf__dep;

// One use of the memory by one submitted work item, which holds the record in its own
// allocation: the record finds the item's fence by its distance from it, a pointer less per
// use (queued items are counted in hundreds of thousands).
typedef struct devbuf__record {
  devbuf__segment *segment; // the records of the work's queue; NULL while not in a tracker
  size_t offset, size;      // bytes of the memory
  struct devbuf__record *newer, *older;
  uint32_t fence_distance; // bytes from the work's fence to this record
  bool write;
} devbuf__record;

static inline devbuf__fence *devbuf__record_fence(const devbuf__record *record) {
  return (devbuf__fence *)(void *)((char *)(uintptr_t)record - record->fence_distance);
}

// The in-flight records of one queue, newest first, reads and writes apart: a read only
// has to look among writes. Work of one queue runs in order, so only the newest
// conflicting record of a queue matters. Each list also keeps the byte range its records
// have covered since it was last empty, so that disjoint views are told apart at once.
typedef struct devbuf__record_list {
  devbuf__record *newest;
  size_t count;
  size_t low, high; // covered bytes [low, high) (never shrinks while count > 0)
} devbuf__record_list;

struct devbuf__segment {
  devbuf__hazard *hazard; // the tracker it belongs to, for whoever holds one of its records
  devbuf_queue_t *queue;
  devbuf__record_list reads, writes;
  devbuf__segment *next;
};

// What every submission and retirement touches comes first, in one cache line.
struct devbuf__hazard {
  devbuf__spinlock lock;     // every submission takes it for each use: kept cheap
  devbuf__segment *segments; // a queue's stays while empty: queues come back
  size_t records;
  size_t waiters;
  pthread_mutex_t sleep_lock; // with `progress`: where waiters sleep (taken after `lock`)
  pthread_cond_t progress;    // broadcast when records complete and someone waits
  void (*on_idle)(void *ctx); // called once, unlocked, when records reach zero
  void *idle_ctx;
  unsigned debug_steps; // DEVBUF_DEBUG_CHECKS: changes since the last validation
};

devbuf__hazard *devbuf__hazard_create(void);
void devbuf__hazard_destroy(devbuf__hazard *hazard);

// Caller holds hazard->lock for the following.
// Whether a record conflicts with an access to [offset, offset + size): a write access
// conflicts with every overlapping record, a read access with overlapping writes.
bool devbuf__hazard_conflicts(const devbuf__hazard *hazard, size_t offset, size_t size, bool write);
// The same, among the records of `queue`'s work only.
bool devbuf__hazard_queue_conflicts(const devbuf__hazard *hazard, const devbuf_queue_t *queue,
                                    size_t offset, size_t size, bool write);
// Whether any record overlaps the range.
bool devbuf__hazard_overlaps(const devbuf__hazard *hazard, size_t offset, size_t size);
// Blocks until some record completes (the lock is released while waiting).
void devbuf__hazard_wait_progress(devbuf__hazard *hazard);
// Wakes the threads in devbuf__hazard_wait_progress, if any; the caller holds the lock.
void devbuf__hazard_wake_locked(devbuf__hazard *hazard);
// Adds `record` for work on `queue` and appends to `deps` the newest conflicting record's
// work of every other queue (data dependencies). False when no host memory is left.
bool devbuf__hazard_add(devbuf__hazard *hazard, devbuf__record *record, devbuf_queue_t *queue,
                        devbuf__dep **deps, uint32_t *dep_count, uint32_t *dep_capacity);

// Appends to `works` (retained, once each) the newest work of each queue whose records
// overlap [offset, offset + size): what must complete before anything else uses those
// bytes. False when no host memory is left.
bool devbuf__hazard_collect(const devbuf__hazard *hazard, size_t offset, size_t size,
                            devbuf__fence ***works, size_t *count, size_t *capacity);
// Appends `work` to `works` (retained) unless it is there already. False when no host
// memory is left.
bool devbuf__fences_push(devbuf__fence ***works, size_t *count, size_t *capacity,
                         devbuf__fence *work);

// Appends `work` to `deps` (retained) unless it is there already; a data dependency wins
// over an ordering-only one. False when no host memory is left.
bool devbuf__deps_push(devbuf__dep **deps, uint32_t *count, uint32_t *capacity, devbuf__fence *work,
                       bool order_only);

// Removes a completed record; caller holds the lock. When the last record goes and an idle
// callback is armed, it is disarmed and handed out: the caller calls it after unlocking.
// Caller also wakes waiters (devbuf__hazard_wake_locked) once done removing.
void devbuf__hazard_remove_locked(devbuf__hazard *hazard, devbuf__record *record,
                                  void (**out_on_idle)(void *), void **out_idle_ctx);
// Takes the lock itself: removes a record, wakes waiters, may call on_idle (after
// unlocking), so the hazard may be gone when this returns.
void devbuf__hazard_remove(devbuf__hazard *hazard, devbuf__record *record);

#endif // DEVBUF_HAZARD_H
