// Work items: made for a submission, alive while a tracker, a dependent or the queue holds
// them; small ones are recycled through a pool. Their fence is what trackers wait for.
#include "queue.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPIN_CHECKS 100 // checks of an item's flag before yielding ...
#define YIELDS      64  // ... and yields before blocking

// Small items (most of them) are recycled: a submission then costs no malloc and no free
// in another thread. Two pools by size: items of one use (a fill, a kernel over one buffer)
// and items of up to four.
#define POOL_CAPACITY 4096
enum { NOT_POOLED, POOL_ONE_USE, POOL_FOUR_USES, POOLS };
static const size_t pool_uses[POOLS] = {0, 1, 4}, pool_scalars[POOLS] = {0, 16, 64};

static devbuf__spinlock pool_lock = DEVBUF__SPINLOCK_INITIALIZER;
// Each pool is a stack of pointers, not a list through the items: a submission finds the
// next items to reuse without reading them, and fetches their lines ahead (prefetch_pooled).
static devbuf__work *pool[POOLS][POOL_CAPACITY];
static size_t pool_count[POOLS];
// Items of each pool's size in existence (queued, running or in the pool): at most
// POOL_CAPACITY. Beyond it (a producer far ahead of an unbounded queue) items are made to
// their exact size and freed when done.
static size_t pool_made[POOLS];

// The pool's lock is the innermost of all (taken under the submission lock and under
// allocator locks, which release fences): its hook runs last of the prepare steps.
static void pool_fork_prepare(void) { devbuf__spin_lock(&pool_lock); }
static void pool_fork_release(void) { devbuf__spin_unlock(&pool_lock); }
DEVBUF__FORK_HOOK(90, pool_fork_prepare, pool_fork_release, pool_fork_release)

devbuf__work *devbuf__work_retain(devbuf__work *work) {
  devbuf__ref_retain(&work->fence.refs);
  return work;
}

static void work_destroy(devbuf__work *work) {
  devbuf__free(work->deps);
  if (work->pool == NOT_POOLED) {
    devbuf__free(work);
    return;
  }
  devbuf__spin_lock(&pool_lock);
  pool_made[work->pool]--;
  devbuf__spin_unlock(&pool_lock);
  devbuf__free_lines(work);
}

#define PARKING_PLACES 64

static struct {
  devbuf__parking place;
  char apart[64]; // neighbours' locks off each other's cache line
} parking[PARKING_PLACES];

__attribute__((constructor)) static void parking_init(void) {
  for (size_t i = 0; i < PARKING_PLACES; i++) {
    devbuf__mutex_init(&parking[i].place.lock);
    pthread_cond_init(&parking[i].place.completed, NULL);
  }
}

devbuf__parking *devbuf__work_parking(const devbuf__work *work) {
  uintptr_t address = (uintptr_t)work;
  return &parking[(address >> 6 ^ address >> 12) % PARKING_PLACES].place;
}

static const devbuf__fence_ops work_fence; // below, with the waits

void devbuf__work_cleanup(devbuf__work *work, devbuf__work **recycled) {
  if (DEVBUF_UNLIKELY(devbuf__work_failed(work))) devbuf__failure_release(work->failure);
  for (uint32_t i = 0; i < work->dep_count; i++)
    devbuf__work_unref(devbuf__work_of(work->deps[i].work), recycled);
  work->dep_count = 0;
  if (work->kind == DEVBUF__WORK_SIGNAL || work->kind == DEVBUF__WORK_WAIT)
    devbuf_event_release(work->event);
  else if (work->kind == DEVBUF__WORK_LAUNCH)
    devbuf_program_release(work->program);
  // CPU items never have a device event: a plain load keeps the locked exchange off their path.
  void *device_event =
      atomic_load_explicit(&work->device_event, memory_order_relaxed)
          ? atomic_exchange_explicit(&work->device_event, NULL, memory_order_acquire)
          : NULL;
  if (device_event) {
    work->event_device->backend->event_release(work->event_device, device_event);
    devbuf_device_release(work->event_device);
    work->event_device = NULL;
  }
  if (work->pool != NOT_POOLED) {
    work->next = *recycled;
    *recycled = work;
  } else {
    work_destroy(work);
  }
}

#if DEVBUF_DEBUG_CHECKS
// Each pool holds only its own unreferenced items, each once; checked on every 64th return.
// Caller holds pool_lock.
static void validate_pool_locked(void) {
  static unsigned steps;
  if ((++steps & 63) != 0) return;
  for (int p = POOL_ONE_USE; p < POOLS; p++) {
    if (pool_count[p] > pool_made[p]) {
      fprintf(stderr, "devbuf: work item pool invariant broken: more pooled items than made\n");
      abort();
    }
    for (size_t i = 0; i < pool_count[p]; i++) {
      const devbuf__work *work = pool[p][i];
      if (work->pool != p || atomic_load(&work->fence.refs.count) != 0) {
        fprintf(stderr, "devbuf: work item pool invariant broken: a referenced or foreign item "
                        "in the pool\n");
        abort();
      }
    }
  }
}
#else
static inline void validate_pool_locked(void) {}
#endif

// Items returned under one taking of the pool's lock at most: sorted by pool before it is
// taken, so that a submission waiting for the lock waits for copies only.
#define RETURN_GROUP 64

// Gives a list of cleaned items to their pools, a group at a time; what does not fit is
// freed.
void devbuf__work_pool_return(devbuf__work *recycled) {
  // One item (a task waited for alone) skips the grouping, which cost it some 70 instructions
  // (`task` of scripts/hot_path_instructions.sh: about 1300 without, 1376 with). Batches keep
  // the groups: pushing item by item under the lock held it so long that queued fills took
  // 70 ns where they took 56 to 60 (scripts/queue_fills.sh, side by side).
  if (recycled && !recycled->next) {
    int p = recycled->pool;
    devbuf__spin_lock(&pool_lock);
    bool kept = pool_count[p] < POOL_CAPACITY;
    if (kept) pool[p][pool_count[p]++] = recycled;
    validate_pool_locked();
    devbuf__spin_unlock(&pool_lock);
    if (!kept) work_destroy(recycled);
    return;
  }
  while (recycled) {
    devbuf__work *group[POOLS][RETURN_GROUP];
    size_t counts[POOLS] = {0};
    for (size_t taken = 0; recycled && taken < RETURN_GROUP; taken++) {
      int p = recycled->pool;
      group[p][counts[p]++] = recycled;
      recycled = recycled->next;
    }
    size_t kept[POOLS] = {0};
    devbuf__spin_lock(&pool_lock);
    for (int p = POOL_ONE_USE; p < POOLS; p++) {
      size_t room = POOL_CAPACITY - pool_count[p];
      kept[p] = counts[p] < room ? counts[p] : room;
      memcpy(&pool[p][pool_count[p]], group[p], kept[p] * sizeof *group[p]);
      pool_count[p] += kept[p];
    }
    validate_pool_locked();
    devbuf__spin_unlock(&pool_lock);
    for (int p = POOL_ONE_USE; p < POOLS; p++)
      for (size_t i = kept[p]; i < counts[p]; i++) work_destroy(group[p][i]);
  }
}

void devbuf__work_pool_trim(void) {
  devbuf__work *items = NULL;
  devbuf__spin_lock(&pool_lock);
  for (int p = 0; p < POOLS; p++) {
    while (pool_count[p]) {
      devbuf__work *work = pool[p][--pool_count[p]];
      work->next = items;
      items = work;
    }
  }
  devbuf__spin_unlock(&pool_lock);
  while (items) {
    devbuf__work *next = items->next;
    work_destroy(items);
    items = next;
  }
}

void devbuf__work_release(devbuf__work *work) {
  devbuf__work *recycled = NULL;
  devbuf__work_unref(work, &recycled);
  devbuf__work_pool_return(recycled);
}

// The items that the next submissions will reuse were last written by the worker that
// retired them, on another core: their lines are fetched now, for writing, so that a
// submission does not wait for them (a line's move costs some hundreds of cycles where
// the submission's own work takes a few hundred). Two ahead: the one after next has
// the time of a whole submission to arrive.
// The size every item of pool `p` is made to: any item kind of the pool's counts fits.
static inline size_t pool_item_bytes(int p) {
  return devbuf__work_bytes(DEVBUF__WORK_KERNEL, pool_uses[p], pool_scalars[p]);
}

static inline void prefetch_pooled(devbuf__work *const *stack, size_t count, int p) {
  size_t bytes = pool_item_bytes(p);
  if (count) devbuf__prefetch_bytes_for_write(stack[count - 1], bytes);
  if (count > 1) devbuf__prefetch_bytes_for_write(stack[count - 2], bytes);
}

devbuf__work *devbuf__work_new(devbuf_queue_t *queue, devbuf__work_kind kind, size_t use_count,
                               size_t scalars_size) {
  if (use_count > DEVBUF__WORK_MAX_USES || scalars_size > DEVBUF__WORK_MAX_SCALARS)
    return NULL; // submissions refuse them first, naming the counts
  size_t bytes = devbuf__work_bytes(kind, use_count, scalars_size);
  int p = NOT_POOLED;
  for (int q = POOL_ONE_USE; q < POOLS && p == NOT_POOLED; q++)
    if (use_count <= pool_uses[q] && scalars_size <= pool_scalars[q]) p = q;
  devbuf__work *work = NULL;
  if (p != NOT_POOLED) {
    devbuf__spin_lock(&pool_lock);
    size_t count = pool_count[p];
    if (count) {
      work = pool[p][--count];
      pool_count[p] = count;
      prefetch_pooled(pool[p], count, p);
    } else if (pool_made[p] < POOL_CAPACITY) {
      pool_made[p]++; // made below, to the pool's size
      bytes = pool_item_bytes(p);
    } else {
      p = NOT_POOLED;
    }
    devbuf__spin_unlock(&pool_lock);
  }
  if (!work) { // every field is set below or before use (pooled ones come cleared anyway)
    // Pooled items on lines of their own: packed as malloc packs them, the worker retiring
    // one item and the submitter writing its neighbour moved their shared line between the
    // cores, and a queued 256-byte fill took 10 to 15% longer (docs/hazards.md).
    work = p != NOT_POOLED ? devbuf__calloc_lines(bytes) : devbuf__malloc(bytes);
    if (!work) {
      if (p != NOT_POOLED) {
        devbuf__spin_lock(&pool_lock);
        pool_made[p]--;
        devbuf__spin_unlock(&pool_lock);
      }
      return NULL;
    }
    work->pool = (uint8_t)p;
    work->deps = NULL;
    work->dep_count = work->dep_capacity = 0;
    atomic_init(&work->device_event, NULL);
    work->event_device = NULL;
  }
  devbuf__ref_init(&work->fence.refs, 1);
  work->fence.ops = &work_fence;
  work->fence.queue = queue;
  work->fence.epoch = devbuf__epoch();
  atomic_init(&work->cancel, false);
  atomic_init(&work->fence.done, false);
  atomic_init(&work->waiters, 0);
  work->kind = kind;
  work->next = NULL;
  work->status = DEVBUF_OK;
  work->event = NULL; // and the rest of what its kind needs
  work->value = 0;
  work->gate = NULL;
  work->arg_count = 0;
  work->use_count = (uint32_t)use_count;
  work->scalars_size = (uint32_t)scalars_size;
  for (size_t i = 0; i < use_count; i++) { // each record finds the fence by its distance
    work->uses[i].record.segment = NULL;
    work->uses[i].record.fence_distance = (uint32_t)((char *)&work->uses[i].record - (char *)work);
  }
  return work;
}

static devbuf_status wait_not_done(devbuf__work *work) {
  // The other queue is usually about to finish it: spin a little, then give the core away
  // (on a busy machine the other worker may need it), and only then sleep.
  for (int spin = 0; spin < SPIN_CHECKS + YIELDS; spin++) {
    if (atomic_load_explicit(&work->fence.done, memory_order_acquire)) return work->status;
    if (spin >= SPIN_CHECKS) {
      sched_yield();
    } else {
      devbuf__cpu_pause();
    }
  }
  // Items that share the place wake this thread too: it looks at its own again.
  devbuf__parking *place = devbuf__work_parking(work);
  pthread_mutex_lock(&place->lock);
  atomic_fetch_add(&work->waiters, 1);
  while (!atomic_load(&work->fence.done)) pthread_cond_wait(&place->completed, &place->lock);
  atomic_fetch_sub(&work->waiters, 1);
  pthread_mutex_unlock(&place->lock);
  return work->status;
}

// Waits on the host until `work` has retired; its status.
devbuf_status devbuf__work_wait_done(devbuf__work *work) {
  if (DEVBUF_UNLIKELY(work->fence.epoch != devbuf__epoch())) return DEVBUF_OK; // an ancestor's
  if (atomic_load_explicit(&work->fence.done, memory_order_acquire)) return work->status;
  devbuf__wait_begins();
  devbuf_status status = wait_not_done(work);
  devbuf__wait_ends();
  return status;
}

// The fence of a work item, as trackers and storages see it.
static void fence_wait(devbuf__fence *fence) {
  (void)devbuf__work_wait_done(devbuf__work_of(fence));
}

static void fence_last_release(devbuf__fence *fence) {
  devbuf__work *recycled = NULL;
  devbuf__work_cleanup(devbuf__work_of(fence), &recycled);
  devbuf__work_pool_return(recycled);
}

static const devbuf__fence_ops work_fence = {.wait = fence_wait,
                                             .last_release = fence_last_release};
