// Queues on the CPU backend: one worker thread per queue runs work items in
// submission order while the caller goes on. Submission records every use in the memory's
// hazard tracker and collects the work of other queues that this item must wait for.
#include "queue.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

#define BATCH 64          // items the worker takes from the FIFO at once
#define FEW_ITEMS 4       // fewer taken than this: let the submitter add more first
#define SPIN_CHECKS 100   // checks of a dependency's flag before yielding ...
#define YIELDS 64         // ... and yields before blocking

// The fields are grouped by who writes them and how often, a cache line apart, so that a
// submission (which writes the FIFO under the lock) and the worker (which reads the flags
// for every item and bumps `completed` for every group it retires) do not take each
// other's cache lines away on every item.
#define CACHE_LINE 64
struct devbuf_queue {
  // Set at creation.
  devbuf_device_t *device;          // retained
  void *device_queue;               // the backend's queue, for devices with their own
  pthread_t worker;
  // Read for every item; written when the queue fails or is cancelled, or someone waits.
  atomic_bool cancel_requested;     // drop taken items that have not started
  atomic_bool failed;               // failure != OK, readable without the lock
  atomic_size_t drain_waiters;      // threads waiting on `drained`
  char apart_from_flags[CACHE_LINE];
  // Written by every submission, without a lock: the FIFO reaches the worker as a stack
  // that it takes whole, so that submitting and taking never wait for each other.
  devbuf__work *_Atomic incoming;   // submitted, not taken by the worker: newest first
  atomic_uint_least64_t submitted;  // written under the device's submission lock
  atomic_bool worker_idle;          // the worker waits (or is about to) on work_available
  char apart_from_incoming[CACHE_LINE];
  devbuf__work *taken, *taken_tail; // the worker's: taken, not yet run, oldest first
  pthread_mutex_t lock;             // the fields below, unless marked atomic
  bool released;                    // no references left: the worker exits once drained
  bool worker_frees;                // ... and frees the queue itself (release did not join)
  pthread_cond_t work_available;    // the worker waits here
  pthread_cond_t drained;           // finish and cancel wait here
  devbuf__work *waiting;            // the WAIT item the worker blocks in, for cancel
  devbuf_status failure;            // OK until a work item fails
  char apart_from_submissions[CACHE_LINE];
  // Written by the worker for every group of items it retires.
  atomic_uint_least64_t completed;  // retired items
  char apart_from_completed[CACHE_LINE];
  devbuf__refcount refs;
  char failure_message[512];
};

// ---- work items ------------------------------------------------------------------------

// Small items (most of them) are recycled: a submission then costs no malloc, no free in
// another thread, and no initialisation of the item's lock.
#define POOL_USES 4
#define POOL_SCALARS 64
#define POOL_CAPACITY 4096
#define USE_BYTES (sizeof(devbuf__work_use) + sizeof(devbuf__operand) + sizeof(void *) + sizeof(size_t))
#define POOL_ITEM_BYTES (sizeof(devbuf__work) + POOL_USES * USE_BYTES + POOL_SCALARS)

static devbuf__spinlock pool_lock = DEVBUF__SPINLOCK_INITIALIZER;
static devbuf__work *pool;
static size_t pool_count;

devbuf__work *devbuf__work_retain(devbuf__work *work) {
  devbuf__ref_retain(&work->fence.refs);
  return work;
}

static void work_destroy(devbuf__work *work) {
  devbuf__free(work->deps);
  pthread_cond_destroy(&work->completed);
  pthread_mutex_destroy(&work->lock);
  devbuf__free(work);
}

static void work_cleanup(devbuf__work *work, devbuf__work **recycled);
static const devbuf__fence_ops work_fence; // below, with the waits

// Drops a reference; an item whose last reference goes is cleaned and, if it is a pooled
// one, appended to *recycled (for one push to the pool) instead of being freed.
static void work_unref(devbuf__work *work, devbuf__work **recycled) {
  if (devbuf__ref_drop(&work->fence.refs)) work_cleanup(work, recycled);
}

static void work_cleanup(devbuf__work *work, devbuf__work **recycled) {
  for (size_t i = 0; i < work->dep_count; i++) work_unref(devbuf__work_of(work->deps[i].work), recycled);
  work->dep_count = 0;
  devbuf_event_release(work->event);
  work->event = NULL;
  devbuf_program_release(work->program);
  work->program = NULL;
  // CPU items never have a device event: a plain load keeps the locked exchange off their path.
  void *device_event = atomic_load_explicit(&work->device_event, memory_order_relaxed)
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
static void pool_return(devbuf__work *recycled) {
  if (!recycled) return;
  devbuf__spin_lock(&pool_lock);
  while (recycled && pool_count < POOL_CAPACITY) {
    devbuf__work *next = recycled->next;
    recycled->next = pool;
    pool = recycled;
    pool_count++;
    recycled = next;
  }
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
  work_unref(work, &recycled);
  pool_return(recycled);
}

// Layout of one allocation: the work, its uses, their operands, a C kernel's address and
// size arrays, scalars.
static devbuf__work *work_new(devbuf_queue_t *queue, devbuf__work_kind kind, size_t use_count, size_t scalars_size) {
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
    devbuf__mutex_init(&work->lock);
    pthread_cond_init(&work->completed, NULL);
  }
  devbuf__ref_init(&work->fence.refs, 1);
  work->fence.ops = &work_fence;
  atomic_init(&work->cancel, false);
  atomic_init(&work->fence.done, false);
  atomic_init(&work->waiters, 0);
  work->kind = kind;
  work->queue = queue;
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

static void **work_data(devbuf__work *work) { return (void **)(work->operands + work->use_count); }
static size_t *work_sizes(devbuf__work *work) { return (size_t *)(work_data(work) + work->use_count); }

// Waits on the host until `work` has retired; its status.
static devbuf_status wait_done(devbuf__work *work) {
  // The other queue is usually about to finish it: spin a little, then give the core away
  // (on a busy machine the other worker may need it), and only then sleep.
  for (int spin = 0; spin < SPIN_CHECKS + YIELDS; spin++) {
    if (atomic_load_explicit(&work->fence.done, memory_order_acquire)) return work->status;
    if (spin >= SPIN_CHECKS) {
      sched_yield();
    } else {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
  pthread_mutex_lock(&work->lock);
  atomic_fetch_add(&work->waiters, 1);
  while (!atomic_load(&work->fence.done)) pthread_cond_wait(&work->completed, &work->lock);
  atomic_fetch_sub(&work->waiters, 1);
  pthread_mutex_unlock(&work->lock);
  return work->status;
}

// The fence of a work item, as trackers and storages see it.
static void fence_wait(devbuf__fence *fence) { (void)wait_done(devbuf__work_of(fence)); }

static void fence_last_release(devbuf__fence *fence) {
  devbuf__work *recycled = NULL;
  work_cleanup(devbuf__work_of(fence), &recycled);
  pool_return(recycled);
}

static const devbuf__fence_ops work_fence = {.wait = fence_wait, .last_release = fence_last_release};

// ---- completion ------------------------------------------------------------------------

// Retires finished (or never run) items of one queue, in order: their records leave the
// trackers (one lock per tracker for the whole batch), their events learn of failures,
// dependents and host waiters wake, and the counters move. Each item's status is set.
static devbuf__work *fail_queue(devbuf_queue_t *queue, devbuf_status status, const char *message);
static void retire_unrun(devbuf_queue_t *queue, devbuf__work *list, devbuf_status status);

// Devices whose operations run on after they are enqueued: waits for the items to complete
// there; a failure found there fails the queue as a failing run would (*out_pending: its
// FIFO).
static void complete_on_device(devbuf_queue_t *queue, devbuf__work **items, size_t count, devbuf__work **out_pending) {
  const devbuf__backend *backend = queue->device->backend;
  *out_pending = NULL;
  if (!backend->complete) return;
  devbuf_status failed = DEVBUF_OK;
  char message[512];
  devbuf__device_done done[BATCH]; // retire takes at most a batch, but need not
  for (size_t first = 0; first < count; first += BATCH) {
    size_t chunk = count - first < BATCH ? count - first : BATCH;
    for (size_t i = 0; i < chunk; i++) {
      const devbuf__work *work = items[first + i];
      done[i] = (devbuf__device_done){atomic_load_explicit(&work->device_event, memory_order_acquire),
                                      work->kind == DEVBUF__WORK_LAUNCH ? work->kernel_name : "a command", work->status};
    }
    devbuf_status chunk_failed = backend->complete(queue->device, queue->device_queue, done, chunk);
    for (size_t i = 0; i < chunk; i++) items[first + i]->status = done[i].status;
    if (failed == DEVBUF_OK && chunk_failed != DEVBUF_OK) {
      failed = chunk_failed;
      snprintf(message, sizeof message, "%s", devbuf_last_error());
    }
  }
  if (failed == DEVBUF_OK) return;
  bool behind = false; // what came after the failed item ran on the device, but reports the failure
  for (size_t i = 0; i < count; i++) {
    if (behind && items[i]->status == DEVBUF_OK) items[i]->status = failed;
    behind |= items[i]->status != DEVBUF_OK;
  }
  *out_pending = fail_queue(queue, failed, message);
}

static void retire(devbuf_queue_t *queue, devbuf__work **items, size_t count) {
  if (!count) return;
  devbuf__work *pending;
  complete_on_device(queue, items, count, &pending);
  for (size_t i = 0; i < count; i++) {
    for (size_t u = 0; u < items[i]->use_count; u++) {
      devbuf__hazard *hazard = items[i]->uses[u].hazard;
      if (!hazard) continue;
      void (*on_idle)(void *) = NULL;
      void *idle_ctx = NULL;
      devbuf__spin_lock(&hazard->lock);
      for (size_t j = i; j < count; j++) {
        for (size_t v = 0; v < items[j]->use_count; v++) {
          if (items[j]->uses[v].hazard != hazard) continue;
          devbuf__hazard_remove_locked(hazard, &items[j]->uses[v].record, &on_idle, &idle_ctx);
          items[j]->uses[v].hazard = NULL;
        }
      }
      devbuf__hazard_wake_locked(hazard);
      devbuf__spin_unlock(&hazard->lock);
      if (on_idle) on_idle(idle_ctx); // may destroy the hazard: no use points to it any more
    }
  }
  devbuf__work *recycled = NULL;
  for (size_t i = 0; i < count; i++) {
    devbuf__work *work = items[i];
    if (work->status != DEVBUF_OK && work->kind == DEVBUF__WORK_SIGNAL) {
      char message[512] = "CANCELLED: the queue was cancelled before this work ran";
      pthread_mutex_lock(&queue->lock);
      if (work->status != DEVBUF_CANCELLED) snprintf(message, sizeof message, "%s", queue->failure_message);
      pthread_mutex_unlock(&queue->lock);
      devbuf__event_fail(work->event, work->status, message);
    }
    atomic_store(&work->fence.done, true); // seq_cst: ordered before the load of waiters below
    if (atomic_load(&work->waiters)) {
      pthread_mutex_lock(&work->lock);
      pthread_cond_broadcast(&work->completed);
      pthread_mutex_unlock(&work->lock);
    }
    work_unref(work, &recycled);
  }
  pool_return(recycled);
  devbuf_device_t *device = queue->device;
  atomic_fetch_add(&queue->completed, count);
  if (atomic_load(&queue->drain_waiters)) {
    pthread_mutex_lock(&queue->lock);
    pthread_cond_broadcast(&queue->drained);
    pthread_mutex_unlock(&queue->lock); // a released, drained queue may be gone from here on
  }
  if (atomic_fetch_sub(&device->pending_work, count) == count && atomic_load(&device->sync_waiters)) {
    pthread_mutex_lock(&device->work_lock);
    pthread_cond_broadcast(&device->work_idle);
    pthread_mutex_unlock(&device->work_lock);
  }
  if (pending) retire_unrun(queue, pending, atomic_load(&queue->failed) ? queue->failure : DEVBUF_DEVICE_FAILURE);
}

// Retires, without running them, the items of a detached FIFO, in chunks.
static void retire_unrun(devbuf_queue_t *queue, devbuf__work *list, devbuf_status status) {
  devbuf__work *chunk[BATCH];
  size_t count = 0;
  while (list) {
    devbuf__work *next = list->next;
    list->status = status;
    chunk[count++] = list;
    if (count == BATCH) {
      retire(queue, chunk, count);
      count = 0;
    }
    list = next;
  }
  retire(queue, chunk, count);
}

// Detaches the items submitted since the worker last took some, oldest first.
static devbuf__work *take_incoming(devbuf_queue_t *queue) {
  devbuf__work *newest_first = atomic_exchange(&queue->incoming, NULL), *oldest_first = NULL;
  while (newest_first) {
    devbuf__work *next = newest_first->next;
    newest_first->next = oldest_first;
    oldest_first = newest_first;
    newest_first = next;
  }
  return oldest_first;
}

// The first failure stops the queue: what was queued behind it does not run, and its
// events fail with the same cause. Called by the worker; returns the detached FIFO (what
// the worker took already is retired as failed when it comes to run).
static devbuf__work *fail_queue(devbuf_queue_t *queue, devbuf_status status, const char *message) {
  pthread_mutex_lock(&queue->lock);
  if (queue->failure == DEVBUF_OK) {
    queue->failure = status;
    snprintf(queue->failure_message, sizeof queue->failure_message, "%s", message);
    atomic_store(&queue->failed, true);
  }
  pthread_mutex_unlock(&queue->lock);
  return take_incoming(queue);
}

// ---- execution (the worker thread) -----------------------------------------------------

static void release_deps(devbuf__work *work) {
  for (size_t i = 0; i < work->dep_count; i++) devbuf__fence_release(work->deps[i].work);
  work->dep_count = 0;
}

// Waits for the work of other queues that `work` depends on, except what this device can
// wait for itself: work already enqueued on `device` (NULL: none) joins `waits` (room for
// every dependency), unless only its reuse of memory orders it and the device would pass
// its failure on. DEVICE_FAILURE if a data dependency failed (one that only orders reused
// memory after its previous owner's work does not pass its failure on).
static devbuf_status wait_deps(devbuf__work *work, devbuf_device_t *device, void **waits, size_t *wait_count) {
  devbuf_status failed = DEVBUF_OK;
  bool skip_order_only = device && device->backend->waits_pass_failure;
  for (size_t i = 0; i < work->dep_count; i++) {
    devbuf__work *dep = devbuf__work_of(work->deps[i].work);
    devbuf_status dep_status;
    void *event = atomic_load_explicit(&dep->device_event, memory_order_acquire);
    if (atomic_load_explicit(&dep->fence.done, memory_order_acquire)) {
      dep_status = dep->status;
    } else if (event && dep->event_device == device && !(skip_order_only && work->deps[i].order_only)) {
      waits[(*wait_count)++] = event; // alive while the item holds `dep`
      dep_status = DEVBUF_OK;
    } else {
      dep_status = wait_done(dep);
    }
    if (dep_status != DEVBUF_OK && !work->deps[i].order_only && failed == DEVBUF_OK) failed = dep_status;
  }
  if (failed != DEVBUF_OK)
    return devbuf__error(DEVBUF_DEVICE_FAILURE, "work on another queue that this item waits for failed (%s)",
                         devbuf_status_name(failed));
  return DEVBUF_OK;
}

// What the device does for a fill, copy, launch or C kernel, as data.
static devbuf_status enqueue(devbuf__work *work, void *const *waits, size_t wait_count, void **out_event) {
  devbuf_queue_t *queue = work->queue;
  devbuf__op op = {.operands = work->operands, .operand_count = work->use_count, .waits = waits,
                   .wait_count = wait_count};
  devbuf_kernel_args_t args;
  switch (work->kind) {
  case DEVBUF__WORK_KERNEL:
    args = (devbuf_kernel_args_t){work_data(work), work_sizes(work), work->use_count, work->scalars, work->scalars_size};
    op.kind = DEVBUF__OP_CALL;
    op.kernel = work->kernel;
    op.kernel_args = &args;
    break;
  case DEVBUF__WORK_FILL:
    op.kind = DEVBUF__OP_FILL;
    op.pattern = work->scalars;
    op.pattern_size = work->scalars_size;
    break;
  case DEVBUF__WORK_COPY:
    op.kind = DEVBUF__OP_COPY;
    break;
  case DEVBUF__WORK_LAUNCH:
    op.kind = DEVBUF__OP_LAUNCH;
    op.program = work->program->backend_program;
    op.kernel_name = work->kernel_name;
    op.launch = &work->launch;
    op.arg_count = work->arg_count;
    op.arg_sizes = work->scalars;
    op.arg_bytes = (const size_t *)work->scalars + work->arg_count;
    break;
  default:
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "work item of kind %d is no device operation", (int)work->kind);
  }
  return queue->device->backend->enqueue(queue->device, queue->device_queue, &op, out_event);
}

// Runs an item once what it depends on allows: on the worker (signals, host waits, the
// CPU's operations), or enqueued on the device queue, leaving the driver's event for
// items that depend on it.
static devbuf_status run(devbuf__work *work) {
  devbuf_queue_t *queue = work->queue;
  devbuf_device_t *device = queue->device;
  void *stack_waits[16], **waits = stack_waits;
  if (queue->device_queue && work->dep_count > 16 && !(waits = devbuf__malloc(work->dep_count * sizeof *waits)))
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu dependencies", work->dep_count);
  size_t wait_count = 0;
  devbuf_status status = wait_deps(work, queue->device_queue ? device : NULL, waits, &wait_count);
  void *event = NULL;
  if (status == DEVBUF_OK) {
    if (work->kind == DEVBUF__WORK_SIGNAL)
      devbuf__event_raise(work->event, work->value);
    else if (work->kind == DEVBUF__WORK_WAIT)
      status = devbuf__wait_item_run(work, device, queue->device_queue, &event);
    else
      status = enqueue(work, waits, wait_count, &event);
  }
  release_deps(work); // finished work never keeps a chain of older work alive
  if (waits != stack_waits) devbuf__free(waits);
  if (event) { // dependents on other queues may wait for it on the device from now on
    work->event_device = devbuf__device_keep(device);
    atomic_store_explicit(&work->device_event, event, memory_order_release);
  }
  return status;
}

static void queue_destroy(devbuf_queue_t *queue) {
  if (queue->device_queue) queue->device->backend->queue_destroy(queue->device, queue->device_queue);
  pthread_cond_destroy(&queue->work_available);
  pthread_cond_destroy(&queue->drained);
  pthread_mutex_destroy(&queue->lock);
  devbuf_device_release(queue->device);
  devbuf__free(queue);
}

static bool deps_done(const devbuf__work *work) {
  for (size_t i = 0; i < work->dep_count; i++)
    if (!devbuf__fence_done(work->deps[i].work)) return false;
  return true;
}

// Runs a batch in order. Finished items are retired together, and always before anything
// that may block or be observed from outside (an event operation, a wait for another
// queue), so that nobody waits for an item that has finished but is not retired.
static void run_batch(devbuf_queue_t *queue, devbuf__work **batch, size_t count) {
  size_t retired = 0;
  for (size_t i = 0; i < count; i++) {
    devbuf__work *work = batch[i];
    if (atomic_load(&queue->failed)) { // found on the device while retiring earlier items
      for (size_t j = i; j < count; j++) batch[j]->status = queue->failure;
      retire(queue, batch + retired, count - retired);
      return;
    }
    if (atomic_load(&queue->cancel_requested)) {
      retire(queue, batch + retired, i - retired);
      for (size_t j = i; j < count; j++) batch[j]->status = DEVBUF_CANCELLED;
      retire(queue, batch + i, count - i);
      return;
    }
    bool visible = work->kind == DEVBUF__WORK_SIGNAL || work->kind == DEVBUF__WORK_WAIT || !deps_done(work);
    if (visible) {
      retire(queue, batch + retired, i - retired);
      retired = i;
      if (atomic_load(&queue->failed)) { // the device reported a failure of what ran before
        for (size_t j = i; j < count; j++) batch[j]->status = queue->failure;
        retire(queue, batch + i, count - i);
        return;
      }
    }
    if (work->kind == DEVBUF__WORK_WAIT) {
      pthread_mutex_lock(&queue->lock);
      queue->waiting = work;
      if (atomic_load(&queue->cancel_requested)) atomic_store(&work->cancel, true); // cancel came first
      pthread_mutex_unlock(&queue->lock);
    }
    work->status = run(work);
    if (work->kind == DEVBUF__WORK_WAIT) {
      pthread_mutex_lock(&queue->lock);
      queue->waiting = NULL;
      pthread_mutex_unlock(&queue->lock);
    }
    if (work->status == DEVBUF_CANCELLED && atomic_load(&work->cancel)) continue; // cancel: not a failure
    if (work->status != DEVBUF_OK) {
      char message[512];
      snprintf(message, sizeof message, "%s", devbuf_last_error());
      devbuf__work *pending = fail_queue(queue, work->status, message);
      retire(queue, batch + retired, i + 1 - retired);
      for (size_t j = i + 1; j < count; j++) batch[j]->status = queue->failure;
      retire(queue, batch + i + 1, count - i - 1);
      retire_unrun(queue, pending, queue->failure);
      return;
    }
  }
  retire(queue, batch + retired, count - retired);
}

// Appends what was submitted to the worker's own FIFO; false when nothing was.
static bool take_more(devbuf_queue_t *queue) {
  devbuf__work *more = take_incoming(queue);
  if (!more) return false;
  if (queue->taken)
    queue->taken_tail->next = more;
  else
    queue->taken = more;
  while (more->next) more = more->next;
  queue->taken_tail = more;
  return true;
}

// Sleeps until something is submitted or the queue is released; false when released and
// drained. The submitter reads worker_idle after pushing, the worker reads incoming after
// raising it (both sequentially consistent), so one of them sees the other.
static bool wait_for_work(devbuf_queue_t *queue) {
  pthread_mutex_lock(&queue->lock);
  atomic_store(&queue->worker_idle, true);
  while (!atomic_load(&queue->incoming) && !queue->released) pthread_cond_wait(&queue->work_available, &queue->lock);
  atomic_store(&queue->worker_idle, false);
  bool more = atomic_load(&queue->incoming) != NULL;
  pthread_mutex_unlock(&queue->lock);
  return more;
}

// Whether the list holds at least `count` items.
static bool has_items(const devbuf__work *list, size_t count) {
  for (; list && count; list = list->next) count--;
  return count == 0;
}

static void *worker_main(void *arg) {
  devbuf_queue_t *queue = arg;
  devbuf__work *batch[BATCH];
  for (;;) {
    if (!queue->taken && !take_more(queue)) {
      if (!wait_for_work(queue)) break; // released and drained
      continue;
    }
    if (!has_items(queue->taken, FEW_ITEMS)) {
      // A few items: give the submitter a moment to add more, so that items are taken, run
      // and retired in groups rather than one shared cache line transfer at a time.
      sched_yield();
      take_more(queue);
    }
    size_t count = 0;
    while (queue->taken && count < BATCH) {
      batch[count++] = queue->taken;
      queue->taken = queue->taken->next;
    }
    run_batch(queue, batch, count);
  }
  pthread_mutex_lock(&queue->lock);
  bool frees = queue->worker_frees;
  pthread_mutex_unlock(&queue->lock);
  if (frees) queue_destroy(queue);
  return NULL;
}

// ---- the public queue API --------------------------------------------------------------

devbuf_status devbuf_queue_create(devbuf_device_t *device, devbuf_queue_t **out_queue) {
  if (!device || !out_queue) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "device or out_queue is NULL");
  if (!device->backend->enqueue)
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s has no queues in this build", device->spec);
  void *device_queue = NULL;
  if (device->backend->queue_create) {
    devbuf_status status = device->backend->queue_create(device, &device_queue);
    if (status != DEVBUF_OK) return status;
  }
  devbuf_queue_t *queue = devbuf__calloc(1, sizeof *queue);
  if (!queue && device_queue) device->backend->queue_destroy(device, device_queue);
  if (!queue) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a queue");
  devbuf__ref_init(&queue->refs, 1);
  atomic_init(&queue->incoming, NULL);
  atomic_init(&queue->submitted, 0);
  atomic_init(&queue->worker_idle, false);
  atomic_init(&queue->completed, 0);
  atomic_init(&queue->drain_waiters, 0);
  atomic_init(&queue->cancel_requested, false);
  atomic_init(&queue->failed, false);
  queue->device = devbuf_device_retain(device);
  queue->device_queue = device_queue;
  devbuf__mutex_init(&queue->lock);
  pthread_cond_init(&queue->work_available, NULL);
  pthread_cond_init(&queue->drained, NULL);
  if (pthread_create(&queue->worker, NULL, worker_main, queue) != 0) {
    queue_destroy(queue);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "cannot start a worker thread for a queue on %s", device->spec);
  }
  *out_queue = queue;
  return DEVBUF_OK;
}

devbuf_queue_t *devbuf_queue_retain(devbuf_queue_t *queue) {
  if (queue) devbuf__ref_retain(&queue->refs);
  return queue;
}

void devbuf_queue_release(devbuf_queue_t *queue) {
  if (!queue || !devbuf__ref_drop(&queue->refs)) return;
  pthread_mutex_lock(&queue->lock);
  queue->released = true;
  bool drained = atomic_load(&queue->completed) == atomic_load(&queue->submitted);
  queue->worker_frees = !drained; // pending work: let it finish without blocking the caller
  pthread_t worker = queue->worker;
  pthread_cond_signal(&queue->work_available);
  pthread_mutex_unlock(&queue->lock);
  if (drained) {
    pthread_join(worker, NULL);
    queue_destroy(queue);
  } else {
    pthread_detach(worker); // the worker frees the queue
  }
}

devbuf_device_t *devbuf_queue_device(const devbuf_queue_t *queue) { return queue ? queue->device : NULL; }

void *devbuf__queue_device_queue(const devbuf_queue_t *queue) { return queue->device_queue; }

static devbuf_status failure_locked(const devbuf_queue_t *queue) {
  return devbuf__error(queue->failure, "the queue failed earlier: %s", queue->failure_message);
}

devbuf_status devbuf_queue_status(const devbuf_queue_t *queue) {
  if (!queue) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "queue is NULL");
  devbuf_queue_t *mutable_queue = (devbuf_queue_t *)queue; // the lock is not part of the value
  pthread_mutex_lock(&mutable_queue->lock);
  devbuf_status status = queue->failure == DEVBUF_OK ? DEVBUF_OK : failure_locked(queue);
  pthread_mutex_unlock(&mutable_queue->lock);
  return status;
}

// Waits until every submitted item is retired. Caller holds queue->lock.
static void wait_drained_locked(devbuf_queue_t *queue) {
  atomic_fetch_add(&queue->drain_waiters, 1);
  while (atomic_load(&queue->completed) != atomic_load(&queue->submitted))
    pthread_cond_wait(&queue->drained, &queue->lock);
  atomic_fetch_sub(&queue->drain_waiters, 1);
}

devbuf_status devbuf_queue_finish(devbuf_queue_t *queue) {
  if (!queue) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "queue is NULL");
  pthread_mutex_lock(&queue->lock);
  wait_drained_locked(queue);
  devbuf_status status = queue->failure == DEVBUF_OK ? DEVBUF_OK : failure_locked(queue);
  pthread_mutex_unlock(&queue->lock);
  return status;
}

devbuf_status devbuf_queue_cancel(devbuf_queue_t *queue) {
  if (!queue) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "queue is NULL");
  pthread_mutex_lock(&queue->lock);
  atomic_store(&queue->cancel_requested, true); // the worker drops what it took but has not started
  devbuf__work *pending = take_incoming(queue);
  devbuf__work *waiting = queue->waiting;
  if (waiting) {
    atomic_store(&waiting->cancel, true);
    devbuf__wait_item_cancel(waiting);
  }
  pthread_mutex_unlock(&queue->lock);
  retire_unrun(queue, pending, DEVBUF_CANCELLED);
  pthread_mutex_lock(&queue->lock);
  wait_drained_locked(queue);
  atomic_store(&queue->cancel_requested, false);
  pthread_mutex_unlock(&queue->lock);
  return DEVBUF_OK;
}

// ---- submission ------------------------------------------------------------------------

// Rolls back the records of uses [0, count) of a work item that will not be queued. (The
// submission lock keeps other submissions from having seen them; done is set anyway, so
// that nothing could ever wait for this item.)
static void abandon(devbuf__work *work, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (work->uses[i].hazard) devbuf__hazard_remove(work->uses[i].hazard, &work->uses[i].record);
  atomic_store(&work->fence.done, true);
  devbuf__work_release(work);
}

static devbuf_status check_use(devbuf_queue_t *queue, const devbuf_use_t *use, size_t index) {
  if (!use->buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "use %zu has no buffer", index);
  if (use->access < DEVBUF_ACCESS_READ || use->access > DEVBUF_ACCESS_READ_WRITE)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "use %zu has access %d (expected 1 read, 2 write, 3 both)", index,
                         (int)use->access);
  devbuf__storage *storage = use->buffer->storage;
  if (storage->device != queue->device)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "use %zu: a buffer on %s submitted to a queue on %s", index,
                         storage->device->spec, queue->device->spec);
  if ((use->access & DEVBUF_ACCESS_WRITE) && storage->read_only)
    return devbuf__error(DEVBUF_READ_ONLY, "use %zu writes read-only buffer %llu", index,
                         (unsigned long long)use->buffer->handle_id);
  return devbuf__storage_ensure_allocated_for_work(storage);
}

// Records a use in the storage's tracker (whose lock the caller holds), depending on the
// conflicting work of other queues and on the unfinished work of the bytes' earlier owners.
static devbuf_status add_record(devbuf__work *work, devbuf__work_use *slot, devbuf__storage *storage,
                                devbuf__hazard *hazard) {
  if (!devbuf__hazard_add(hazard, &slot->record, work->queue, &work->deps, &work->dep_count, &work->dep_capacity))
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to track a use");
  slot->hazard = hazard;
  for (size_t i = 0; i < storage->inherited_count; i++) {
    devbuf__work *earlier = devbuf__work_of(storage->inherited[i]);
    if (earlier->queue == work->queue || devbuf__fence_done(&earlier->fence)) continue; // its own queue orders it
    if (!devbuf__deps_push(&work->deps, &work->dep_count, &work->dep_capacity, &earlier->fence, true))
      return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to track a use");
  }
  return DEVBUF_OK;
}

// Records use `index` of `work`; HOST_ACCESS_OPEN if an open host access races with it.
static devbuf_status track_use(devbuf__work *work, size_t index, const devbuf_use_t *use) {
  devbuf_buffer_t *buffer = use->buffer;
  devbuf__storage *storage = buffer->storage;
  bool write = (use->access & DEVBUF_ACCESS_WRITE) != 0;
  devbuf__work_use *slot = &work->uses[index];
  slot->hazard = NULL;
  work_data(work)[index] = buffer->size && storage->memory.host ? (char *)storage->memory.host + buffer->offset : NULL;
  work_sizes(work)[index] = buffer->size;
  work->operands[index] = (devbuf__operand){storage->memory, buffer->offset, buffer->size};
  if (buffer->size == 0) return DEVBUF_OK; // touches no bytes: nothing to order
  slot->record = (devbuf__record){.work = &work->fence, .offset = buffer->offset,
                                  .size = buffer->size, .write = write};
  // Fast path: no host access is open (they are opened holding the tracker's lock).
  devbuf__hazard *hazard = atomic_load_explicit(&storage->hazard, memory_order_acquire);
  if (hazard) {
    devbuf__spin_lock(&hazard->lock);
    if (!atomic_load(&storage->open_accesses)) {
      devbuf_status status = add_record(work, slot, storage, hazard);
      devbuf__spin_unlock(&hazard->lock);
      return status;
    }
    devbuf__spin_unlock(&hazard->lock);
  }
  pthread_mutex_lock(&storage->lock);
  devbuf_status status = devbuf__check_host_conflicts(storage, buffer->offset, buffer->size, write, "submitting work");
  if (status == DEVBUF_OK) {
    hazard = devbuf__storage_hazard_locked(storage);
    if (!hazard) status = devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a hazard tracker");
  }
  if (status == DEVBUF_OK) {
    devbuf__spin_lock(&hazard->lock);
    status = add_record(work, slot, storage, hazard);
    devbuf__spin_unlock(&hazard->lock);
  }
  pthread_mutex_unlock(&storage->lock);
  return status;
}

// Validates and records every use, then queues the item (or refuses it whole).
static devbuf_status submit(devbuf_queue_t *queue, devbuf__work *work, const devbuf_use_t *uses) {
  // A failure is checked again under the lock before the item is queued.
  devbuf_status status = atomic_load_explicit(&queue->failed, memory_order_relaxed) ? devbuf_queue_status(queue)
                                                                                    : DEVBUF_OK;
  for (size_t i = 0; i < work->use_count && status == DEVBUF_OK; i++) status = check_use(queue, &uses[i], i);
  if (status != DEVBUF_OK) {
    abandon(work, 0);
    return status;
  }
  // One submission at a time per device, from the first record to the enqueue: then the
  // records of a queue are in queue order, and no two submissions can each find the other's
  // records and wait for each other.
  devbuf_device_t *device = queue->device;
  devbuf__spin_lock(&device->submit_lock);
  size_t tracked = 0;
  for (; tracked < work->use_count && status == DEVBUF_OK; tracked++)
    status = track_use(work, tracked, &uses[tracked]);
  if (status != DEVBUF_OK) {
    abandon(work, tracked);
    devbuf__spin_unlock(&device->submit_lock);
    return status;
  }
  if (atomic_load(&queue->failed)) { // failed while we were recording (after that, the worker fails the item)
    status = devbuf_queue_status(queue);
    abandon(work, tracked);
    devbuf__spin_unlock(&device->submit_lock);
    return status;
  }
  atomic_fetch_add(&queue->device->pending_work, 1);
  atomic_store_explicit(&queue->submitted, atomic_load_explicit(&queue->submitted, memory_order_relaxed) + 1,
                        memory_order_relaxed); // every submitter holds the submission lock
  devbuf__work *newest = atomic_load_explicit(&queue->incoming, memory_order_relaxed);
  do {
    work->next = newest;
  } while (!atomic_compare_exchange_weak(&queue->incoming, &newest, work)); // the worker may take them meanwhile
  devbuf__spin_unlock(&device->submit_lock);
  if (atomic_load(&queue->worker_idle)) {
    pthread_mutex_lock(&queue->lock);
    pthread_cond_signal(&queue->work_available);
    pthread_mutex_unlock(&queue->lock);
  }
  return DEVBUF_OK;
}

devbuf_status devbuf_queue_submit(devbuf_queue_t *queue, devbuf_cpu_kernel_fn kernel, const devbuf_use_t *uses,
                                  size_t use_count, const void *scalars, size_t scalars_size) {
  if (!queue || !kernel || (use_count && !uses) || (scalars_size && !scalars))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "submit: queue and kernel are required; uses and scalars must "
                                                  "be given when their counts are not zero");
  if (!queue->device->backend->runs_c_kernels)
    return devbuf__error(DEVBUF_UNSUPPORTED, "submit: C kernels run on the CPU; %s runs programs (devbuf_queue_launch)",
                         queue->device->spec);
  devbuf__work *work = work_new(queue, DEVBUF__WORK_KERNEL, use_count, scalars_size);
  if (!work) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a work item with %zu uses", use_count);
  work->kernel = kernel;
  if (scalars_size) memcpy(work->scalars, scalars, scalars_size);
  return submit(queue, work, uses);
}

devbuf_status devbuf_queue_fill(devbuf_queue_t *queue, devbuf_buffer_t *buffer, const void *pattern,
                                size_t pattern_size) {
  if (!queue || !buffer || !pattern || pattern_size == 0)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "fill: queue, buffer and a non-empty pattern are required");
  if (buffer->size % pattern_size)
    return devbuf__error(DEVBUF_SIZE_MISMATCH, "fill: a %zu-byte pattern does not divide a %zu-byte buffer",
                         pattern_size, buffer->size);
  devbuf__work *work = work_new(queue, DEVBUF__WORK_FILL, 1, pattern_size);
  if (!work) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a fill");
  memcpy(work->scalars, pattern, pattern_size);
  devbuf_use_t use = {buffer, DEVBUF_ACCESS_WRITE};
  return submit(queue, work, &use);
}

devbuf_status devbuf_queue_copy(devbuf_queue_t *queue, devbuf_buffer_t *dst, devbuf_buffer_t *src) {
  if (!queue || !dst || !src) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "copy: queue, dst and src are required");
  if (dst->size != src->size)
    return devbuf__error(DEVBUF_SIZE_MISMATCH, "copy of a %zu-byte buffer into a %zu-byte buffer", src->size, dst->size);
  devbuf__work *work = work_new(queue, DEVBUF__WORK_COPY, 2, 0);
  if (!work) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a copy");
  devbuf_use_t uses[2] = {{dst, DEVBUF_ACCESS_WRITE}, {src, DEVBUF_ACCESS_READ}};
  return submit(queue, work, uses);
}

devbuf_status devbuf_queue_launch(devbuf_queue_t *queue, devbuf_program_t *program, const char *name,
                                  const devbuf_launch_t *launch, const devbuf_use_t *uses, size_t use_count,
                                  const devbuf_arg_t *args, size_t arg_count) {
  if (!queue || !program || !name || !launch || (use_count && !uses) || (arg_count && !args))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "launch: queue, program, name and launch are required; uses and "
                                                  "args must be given when their counts are not zero");
  if (program->device != queue->device)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "launch: a program built for %s on a queue of %s",
                         program->device->spec, queue->device->spec);
  if (launch->dims < 1 || launch->dims > 3)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "launch: %u dimensions (1 to 3)", launch->dims);
  for (unsigned d = 0; d < launch->dims; d++)
    if (launch->global[d] == 0 || (launch->local[0] && (launch->local[d] == 0 || launch->global[d] % launch->local[d])))
      return devbuf__error(DEVBUF_INVALID_ARGUMENT, "launch: dimension %u: global size %zu, local size %zu (the local "
                           "size must divide the global size)", d, launch->global[d], launch->local[d]);
  for (size_t i = 0; i < use_count; i++)
    if (uses[i].buffer && uses[i].buffer->offset % queue->device->alignment)
      return devbuf__error(DEVBUF_INVALID_ARGUMENT, "launch: use %zu is a view at byte %zu; %s passes views to kernels at "
                           "multiples of %zu bytes", i, uses[i].buffer->offset, queue->device->spec,
                           queue->device->alignment);
  devbuf_status status = queue->device->backend->program_has_kernel(queue->device, program->backend_program, name);
  if (status != DEVBUF_OK) return status;
  size_t bytes = arg_count * sizeof(size_t), name_size = strlen(name) + 1;
  for (size_t i = 0; i < arg_count; i++) {
    if (!args[i].data || !args[i].size)
      return devbuf__error(DEVBUF_INVALID_ARGUMENT, "launch: argument %zu has no bytes", i);
    bytes += args[i].size;
  }
  devbuf__work *work = work_new(queue, DEVBUF__WORK_LAUNCH, use_count, bytes + name_size);
  if (!work) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a launch with %zu uses", use_count);
  size_t *sizes = work->scalars;
  char *bytes_at = (char *)(sizes + arg_count);
  for (size_t i = 0; i < arg_count; i++) {
    sizes[i] = args[i].size;
    memcpy(bytes_at, args[i].data, args[i].size);
    bytes_at += args[i].size;
  }
  memcpy(bytes_at, name, name_size);
  work->kernel_name = bytes_at;
  work->arg_count = arg_count;
  work->launch = *launch;
  work->program = devbuf_program_retain(program);
  return submit(queue, work, uses);
}

static devbuf_status submit_event_op(devbuf_queue_t *queue, devbuf__work_kind kind, devbuf_event_t *event,
                                     uint64_t value) {
  if (!queue || !event) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "queue and event are required");
  devbuf__work *work = work_new(queue, kind, 0, 0);
  if (!work) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an event operation");
  work->event = devbuf_event_retain(event);
  work->value = value;
  return submit(queue, work, NULL);
}

devbuf_status devbuf_queue_signal(devbuf_queue_t *queue, devbuf_event_t *event, uint64_t value) {
  return submit_event_op(queue, DEVBUF__WORK_SIGNAL, event, value);
}

devbuf_status devbuf_queue_wait(devbuf_queue_t *queue, devbuf_event_t *event, uint64_t value) {
  return submit_event_op(queue, DEVBUF__WORK_WAIT, event, value);
}
