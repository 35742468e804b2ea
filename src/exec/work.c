// Work items: made for a submission, alive while a tracker, a dependent or the queue holds
// them; small ones are recycled through a pool. Their fence is what trackers wait for.
#include "queue.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#define SPIN_CHECKS 100 // checks of an item's flag before yielding ...
#define YIELDS      64  // ... and yields before blocking

// Small items (most of them) are recycled: a submission then costs no malloc, no free in
// another thread, and no initialisation of the item's lock.
#define POOL_USES     4
#define POOL_SCALARS  64
#define POOL_CAPACITY 4096
#define USE_BYTES \
  (sizeof(devbuf__work_use) + sizeof(devbuf__operand) + sizeof(void *) + sizeof(size_t))
#define POOL_ITEM_BYTES (sizeof(devbuf__work) + POOL_USES * USE_BYTES + POOL_SCALARS)

static devbuf__spinlock pool_lock = DEVBUF__SPINLOCK_INITIALIZER;
static devbuf__work *pool;
static size_t pool_count;

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
  devbuf__free(work);
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
  for (size_t i = 0; i < work->dep_count; i++)
    devbuf__work_unref(devbuf__work_of(work->deps[i].work), recycled);
  work->dep_count = 0;
  devbuf_event_release(work->event);
  work->event = NULL;
  devbuf_program_release(work->program);
  work->program = NULL;
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
  if (work->pooled) {
    work->next = *recycled;
    *recycled = work;
  } else {
    work_destroy(work);
  }
}

// Gives a list of cleaned items to the pool in one step; what does not fit is freed.
#if DEVBUF_DEBUG_CHECKS
// The pool holds as many items as it counts, all of them pooled and unreferenced; checked on
// every 64th return. Caller holds pool_lock.
static void validate_pool_locked(void) {
  static unsigned steps;
  if ((++steps & 63) != 0) return;
  size_t length = 0;
  for (const devbuf__work *work = pool; work; work = work->next) {
    if (++length > pool_count || !work->pooled || atomic_load(&work->fence.refs.count) != 0) {
      fprintf(stderr, "devbuf: work item pool invariant broken: %s\n",
              length > pool_count ? "the pool is longer than its count"
                                  : "a referenced or unpooled item in the pool");
      abort();
    }
  }
  if (length != pool_count) {
    fprintf(stderr,
            "devbuf: work item pool invariant broken: the pool is shorter than its count\n");
    abort();
  }
}
#else
static inline void validate_pool_locked(void) {}
#endif

void devbuf__work_pool_return(devbuf__work *recycled) {
  if (!recycled) return;
  devbuf__spin_lock(&pool_lock);
  while (recycled && pool_count < POOL_CAPACITY) {
    devbuf__work *next = recycled->next;
    recycled->next = pool;
    pool = recycled;
    pool_count++;
    recycled = next;
  }
  validate_pool_locked();
  devbuf__spin_unlock(&pool_lock);
  while (recycled) {
    devbuf__work *next = recycled->next;
    work_destroy(recycled);
    recycled = next;
  }
}

void devbuf__work_pool_trim(void) {
  devbuf__spin_lock(&pool_lock);
  devbuf__work *items = pool;
  pool = NULL;
  pool_count = 0;
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

// Layout of one allocation: the work, its uses, their operands, a C kernel's address and
// size arrays, scalars.
devbuf__work *devbuf__work_new(devbuf_queue_t *queue, devbuf__work_kind kind, size_t use_count,
                               size_t scalars_size) {
  size_t bytes = sizeof(devbuf__work) + use_count * USE_BYTES;
  if (scalars_size > SIZE_MAX - bytes) return NULL;
  bool poolable = use_count <= POOL_USES && scalars_size <= POOL_SCALARS;
  devbuf__work *work = NULL;
  if (poolable) {
    devbuf__spin_lock(&pool_lock);
    work = pool;
    if (work) {
      pool = work->next;
      pool_count--;
    }
    devbuf__spin_unlock(&pool_lock);
  }
  if (!work) { // every field is set below or before use: no need to clear the whole item
    work = devbuf__malloc(poolable ? POOL_ITEM_BYTES : bytes + scalars_size);
    if (!work) return NULL;
    work->pooled = poolable;
    work->deps = NULL;
    work->dep_count = work->dep_capacity = 0;
    work->event = NULL;
    work->program = NULL;
    atomic_init(&work->device_event, NULL);
    work->event_device = NULL;
    work->gate = NULL;
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
  work->kernel = NULL;
  work->value = 0;
  work->use_count = use_count;
  work->operands = (devbuf__operand *)(work->uses + use_count);
  work->scalars_size = scalars_size;
  work->scalars = (char *)work + bytes;
  return work;
}

// Waits on the host until `work` has retired; its status.
devbuf_status devbuf__work_wait_done(devbuf__work *work) {
  if (DEVBUF_UNLIKELY(work->fence.epoch != devbuf__epoch())) return DEVBUF_OK; // an ancestor's
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
