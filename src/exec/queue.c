// Queues: one worker thread per queue takes submitted items in order, runs them (on the
// worker, or enqueued on the device queue), and retires them: their records leave the
// hazard trackers, and whoever waits for them wakes. A failure stops the queue; cancel drops
// what has not started.
#include "queue.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH 64 // items the worker takes from the FIFO at once

// ---- completion ------------------------------------------------------------------------

static devbuf__work *fail_queue(devbuf_queue_t *queue, devbuf_status status, const char *message);
static void retire_unrun(devbuf_queue_t *queue, devbuf__work *list, devbuf_status status);

// Devices whose operations run on after they are enqueued: waits for the items to complete
// there; a failure found there fails the queue as a failing run would (*out_pending: its
// FIFO).
static void complete_on_device(devbuf_queue_t *queue, devbuf__work **items, size_t count,
                               devbuf__work **out_pending) {
  const devbuf__backend *backend = queue->device->backend;
  *out_pending = NULL;
  if (!backend->complete) return;
  // What left no event before the first that did ran on the host (host work, signals) and
  // is over: a fault the device reports later is not its failure.
  size_t skipped = 0;
  while (skipped < count &&
         !atomic_load_explicit(&items[skipped]->device_event, memory_order_acquire))
    skipped++;
  items += skipped;
  count -= skipped;
  devbuf_status failed = DEVBUF_OK;
  char message[512];
  devbuf__device_done done[BATCH]; // retire takes at most a batch, but need not
  for (size_t first = 0; first < count; first += BATCH) {
    size_t chunk = count - first < BATCH ? count - first : BATCH;
    for (size_t i = 0; i < chunk; i++) {
      const devbuf__work *work = items[first + i];
      done[i] = (devbuf__device_done){
          atomic_load_explicit(&work->device_event, memory_order_acquire),
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

// After a tracker's records of a run are out: its waiters wake, its lock goes, and a
// tracker left idle is told (which may destroy it).
static void end_removal(devbuf__hazard *hazard, void (*on_idle)(void *), void *idle_ctx) {
  devbuf__hazard_wake_locked(hazard);
  devbuf__spin_unlock(&hazard->lock);
  if (on_idle) on_idle(idle_ctx);
}

// Trackers whose records of a batch are removed under one taking of their lock each; the
// records of any further trackers go run by run, so that a batch over many buffers costs at
// most this many passes over its uses.
#define GROUPED_TRACKERS 8

// Removes from `hazard`, under one taking of its lock, the records of the items' uses from
// use `first_use` of item 0 on: all of the batch's (`whole_batch`), or the run of them that
// ends at the first use of another tracker.
static void remove_tracker_records(devbuf__hazard *hazard, devbuf__work **items, size_t count,
                                   size_t first_use, bool whole_batch) {
  void (*on_idle)(void *) = NULL;
  void *idle_ctx = NULL;
  bool going_on = true;
  devbuf__spin_lock(&hazard->lock);
  for (size_t i = 0; i < count && going_on; i++) {
    for (size_t u = i == 0 ? first_use : 0; u < items[i]->use_count && going_on; u++) {
      devbuf__work_use *use = &items[i]->uses[u];
      devbuf__hazard *own = devbuf__work_use_hazard(use);
      if (own == hazard)
        devbuf__hazard_remove_locked(hazard, &use->record, &on_idle, &idle_ctx); // now untracked
      else
        going_on = whole_batch || !own;
    }
  }
  end_removal(hazard, on_idle, idle_ctx);
}

// Removes the records of the items' uses from their trackers. The submitter takes the same
// locks for every item it records: a worker that took a tracker's lock item by item would
// move the lock's cache line between the two cores as often, so each tracker's records of
// the batch go under one taking of its lock (a batch of kernels over a few buffers takes
// each lock once). Past GROUPED_TRACKERS trackers the rest goes run by run. Each tracker's
// records reach zero with its last removal here, so no later removal meets a tracker that
// its idle call destroyed.
static void remove_records(devbuf__work **items, size_t count) {
  size_t grouped = 0;
  for (size_t i = 0; i < count; i++) {
    for (size_t u = 0; u < items[i]->use_count; u++) {
      devbuf__hazard *hazard = devbuf__work_use_hazard(&items[i]->uses[u]);
      if (!hazard) continue; // removed already, or never recorded
      bool whole_batch = grouped < GROUPED_TRACKERS;
      grouped += whole_batch;
      remove_tracker_records(hazard, items + i, count - i, u, whole_batch);
    }
  }
}

// The event of a signal that will not run learns why: the queue's failure, or cancel.
static void fail_signal(devbuf_queue_t *queue, devbuf__work *work) {
  char message[512];
  snprintf(message, sizeof message,
           "CANCELLED: queue %u on %.100s was cancelled before this signal ran", queue->number,
           queue->device->spec);
  pthread_mutex_lock(&queue->lock);
  if (work->status != DEVBUF_CANCELLED)
    snprintf(message, sizeof message, "%s", queue->failure_message);
  pthread_mutex_unlock(&queue->lock);
  devbuf__event_fail(work->event, work->status, message);
}

// Marks the items done, wakes whoever waits for one, and lets go of the queue's references.
static void mark_done(devbuf_queue_t *queue, devbuf__work **items, size_t count) {
  devbuf__work *recycled = NULL;
  for (size_t i = 0; i < count; i++) {
    devbuf__work *work = items[i];
    if (DEVBUF_UNLIKELY(work->status != DEVBUF_OK)) {
      if (work->kind == DEVBUF__WORK_SIGNAL) fail_signal(queue, work);
      if (devbuf__work_failed(work)) { // after the signal's failure, which reads its event
        devbuf__failure *cause = atomic_load(&queue->failure_cause);
        if (cause) devbuf__ref_retain(&cause->refs);
        work->failure = cause;
      }
    }
    atomic_store(&work->fence.done, true); // seq_cst: ordered before the load of waiters below
    if (atomic_load(&work->waiters)) {
      devbuf__parking *place = devbuf__work_parking(work);
      pthread_mutex_lock(&place->lock);
      pthread_cond_broadcast(&place->completed);
      pthread_mutex_unlock(&place->lock);
    }
    devbuf__work_unref(work, &recycled);
  }
  devbuf__work_pool_return(recycled);
}

// Counts `count` items retired, for the queue's and the device's waiters.
static void count_retired(devbuf_queue_t *queue, size_t count) {
  devbuf_device_t *device = queue->device;
  atomic_fetch_add(&queue->completed, count);
  if (atomic_load(&queue->drain_waiters)) {
    pthread_mutex_lock(&queue->lock);
    pthread_cond_broadcast(&queue->drained);
    pthread_mutex_unlock(&queue->lock); // a released, drained queue may be gone from here on
  }
  uint64_t retired = atomic_fetch_add(&device->work_retired, count) + count;
  if (atomic_load(&device->sync_waiters) && retired == atomic_load(&device->work_submitted)) {
    pthread_mutex_lock(&device->work_lock);
    pthread_cond_broadcast(&device->work_idle);
    pthread_mutex_unlock(&device->work_lock);
  }
}

// Retires finished (or never run) items of one queue, in order: their records leave the
// trackers, the events of signals that did not run learn why, dependents and host waiters
// wake, and the counters move. Each item's status is set.
static void retire(devbuf_queue_t *queue, devbuf__work **items, size_t count) {
  if (!count) return;
  devbuf__work *pending;
  complete_on_device(queue, items, count, &pending);
  remove_records(items, count);
  devbuf__queue_validate_retiring(queue, items, count);
  mark_done(queue, items, count);
  count_retired(queue, count);
  if (pending)
    retire_unrun(queue, pending,
                 atomic_load(&queue->failed) ? queue->failure : DEVBUF_DEVICE_FAILURE);
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

// Whether items were submitted that the runner has not taken.
static bool has_incoming(const devbuf_queue_t *queue) {
  return devbuf__fifo_waiting(&queue->fifo_in, &queue->fifo_out);
}

// Detaches every item submitted and not taken, as a list linked oldest first (a failure's
// and cancel's: the runner may take others meanwhile, which the failure or cancel stops).
static devbuf__work *take_incoming(devbuf_queue_t *queue) {
  devbuf__work *items[BATCH], *oldest = NULL, **link = &oldest;
  size_t count;
  while ((count = devbuf__fifo_take(&queue->fifo_in, &queue->fifo_out, items, BATCH)))
    for (size_t i = 0; i < count; i++) {
      *link = items[i];
      link = &items[i]->next;
    }
  *link = NULL;
  return oldest;
}

// The first failure stops the queue: what was queued behind it does not run, and its
// events fail with the same cause. Called by the worker; returns the detached FIFO (what
// the worker took already is retired as failed when it comes to run).
static devbuf__work *fail_queue(devbuf_queue_t *queue, devbuf_status status, const char *message) {
  pthread_mutex_lock(&queue->lock);
  if (queue->failure == DEVBUF_OK) { // the cause's message goes on, after what failed
    queue->failure = status;
    char head[160];
    snprintf(head, sizeof head, "queue %u on %.100s failed: ", queue->number, queue->device->spec);
    devbuf__join_message(queue->failure_message, sizeof queue->failure_message, head, message);
    devbuf__failure *cause = devbuf__malloc(sizeof *cause); // without it, no cause is told
    if (cause) {
      devbuf__ref_init(&cause->refs, 1);
      snprintf(cause->message, sizeof cause->message, "%s", queue->failure_message);
      atomic_store(&queue->failure_cause, cause);
    }
    atomic_store(&queue->failed, true);
  }
  pthread_mutex_unlock(&queue->lock);
  return take_incoming(queue);
}

// ---- execution (the worker thread) -----------------------------------------------------

static void release_deps(devbuf__work *work) {
  for (uint32_t i = 0; i < work->dep_count; i++) devbuf__fence_release(work->deps[i].work);
  work->dep_count = 0;
}

// Waits for the work of other queues that `work` depends on, except what this device can
// wait for itself: work already enqueued on `device` (NULL: none) joins `waits` (room for
// every dependency), unless only its reuse of memory orders it and the device would pass
// its failure on. DEVICE_FAILURE if a data dependency failed (one that only orders reused
// memory after its previous owner's work does not pass its failure on).
static devbuf_status wait_deps(devbuf__work *work, devbuf_device_t *device, void **waits,
                               size_t *wait_count) {
  devbuf_status failed = DEVBUF_OK;
  const devbuf__failure *cause = NULL;
  bool skip_order_only = device && device->backend->waits_pass_failure;
  for (uint32_t i = 0; i < work->dep_count; i++) {
    devbuf__work *dep = devbuf__work_of(work->deps[i].work);
    devbuf_status dep_status;
    void *event = atomic_load_explicit(&dep->device_event, memory_order_acquire);
    if (atomic_load_explicit(&dep->fence.done, memory_order_acquire)) {
      dep_status = dep->status;
    } else if (event && dep->event_device == device &&
               !(skip_order_only && work->deps[i].order_only)) {
      waits[(*wait_count)++] = event; // alive while the item holds `dep`
      dep_status = DEVBUF_OK;
    } else {
      dep_status = devbuf__work_wait_done(dep);
    }
    if (dep_status != DEVBUF_OK && !work->deps[i].order_only && failed == DEVBUF_OK) {
      failed = dep_status;
      // Set before the item was marked done; kept while `dep` is held.
      if (devbuf__work_failed(dep)) cause = dep->failure;
    }
  }
  if (failed == DEVBUF_OK) return DEVBUF_OK;
  if (failed == DEVBUF_CANCELLED) // its bytes were never written: nor is anything from them
    return devbuf__error(DEVBUF_CANCELLED,
                         "work on another queue that this item waits for was cancelled before "
                         "it ran");
  if (!cause)
    return devbuf__error(DEVBUF_DEVICE_FAILURE,
                         "work on another queue that this item waits for failed (%s)",
                         devbuf_status_name(failed));
  char message[512];
  devbuf__join_message(message, sizeof message,
                       "work on another queue that this item waits for failed: ", cause->message);
  return devbuf__error(DEVBUF_DEVICE_FAILURE, "%s", message);
}

// What the device does for a fill, copy, launch or C kernel, as data.
static devbuf_status enqueue(devbuf__work *work, void *const *waits, size_t wait_count,
                             void **out_event) {
  devbuf_queue_t *queue = work->fence.queue;
  devbuf__op op; // only what its kind reads is set (a whole initialiser costs every item)
  op.operands = devbuf__work_operands(work);
  op.operand_count = work->use_count;
  op.waits = waits;
  op.wait_count = wait_count;
  devbuf_kernel_args_t args;
  const devbuf__backend *backend = queue->device->backend;
  switch (work->kind) {
  case DEVBUF__WORK_HOST: // host work runs on the CPU, whatever the queue's device
    backend = &devbuf__backend_cpu;
    // fall through
  case DEVBUF__WORK_KERNEL:
    args = (devbuf_kernel_args_t){devbuf__work_data(work), devbuf__work_sizes(work),
                                  work->use_count, devbuf__work_scalars(work), work->scalars_size};
    op.kind = DEVBUF__OP_CALL;
    op.kernel = work->kernel;
    op.kernel_args = &args;
    break;
  case DEVBUF__WORK_FILL:
    op.kind = DEVBUF__OP_FILL;
    op.pattern = devbuf__work_scalars(work);
    op.pattern_size = work->scalars_size;
    break;
  case DEVBUF__WORK_COPY:
    op.kind = DEVBUF__OP_COPY;
    break;
  case DEVBUF__WORK_LAUNCH:
    op.kind = DEVBUF__OP_LAUNCH;
    op.program = work->program->backend_program;
    op.kernel_name = work->kernel_name;
    op.launch = devbuf__work_launch(work);
    op.arg_count = work->arg_count;
    op.arg_sizes = (const size_t *)(op.launch + 1);
    op.arg_bytes = op.arg_sizes + work->arg_count;
    break;
  default:
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "work item of kind %d is no device operation",
                         (int)work->kind);
  }
  return backend->enqueue(
      queue->device, backend == &devbuf__backend_cpu ? NULL : queue->device_queue, &op, out_event);
}

// Runs an item once what it depends on allows: on the worker (signals, host waits, the
// CPU's operations), or enqueued on the device queue, leaving the driver's event for
// items that depend on it.
static devbuf_status run(devbuf__work *work) {
  devbuf_queue_t *queue = work->fence.queue;
  devbuf_device_t *device = queue->device;
  void *stack_waits[16], **waits = stack_waits;
  if (queue->device_queue && work->dep_count > 16 &&
      !(waits = devbuf__malloc(work->dep_count * sizeof *waits)))
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %u dependencies",
                         (unsigned)work->dep_count);
  size_t wait_count = 0;
  // Host work waits for what it depends on on the host; device work on the device where it can.
  bool on_device = queue->device_queue && work->kind != DEVBUF__WORK_HOST;
  devbuf_status status = wait_deps(work, on_device ? device : NULL, waits, &wait_count);
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
  devbuf__failure_release(atomic_load(&queue->failure_cause));
  if (queue->dozer.nudge) devbuf__dozer_remove(&queue->dozer);
  if (queue->device_queue)
    queue->device->backend->queue_destroy(queue->device, queue->device_queue);
  pthread_cond_destroy(&queue->work_available);
  pthread_cond_destroy(&queue->drained);
  pthread_mutex_destroy(&queue->lock);
  devbuf__fifo_destroy(&queue->fifo_in, &queue->fifo_out);
  devbuf_device_release(queue->device);
  devbuf__free(queue);
}

static bool deps_done(const devbuf__work *work) {
  for (uint32_t i = 0; i < work->dep_count; i++)
    if (!devbuf__fence_done(work->deps[i].work)) return false;
  return true;
}

// The end of a batch that stops at `stop`: retires what ran, [retired, stop), as it ended,
// and what did not, [stop, count), with `status`.
static void retire_stopped(devbuf_queue_t *queue, devbuf__work **batch, size_t retired, size_t stop,
                           size_t count, devbuf_status status) {
  retire(queue, batch + retired, stop - retired);
  for (size_t j = stop; j < count; j++) batch[j]->status = status;
  retire(queue, batch + stop, count - stop);
}

// Runs one item, where cancel can find it if it is a wait.
static devbuf_status run_cancellable(devbuf_queue_t *queue, devbuf__work *work) {
  bool wait = work->kind == DEVBUF__WORK_WAIT;
  if (wait) {
    pthread_mutex_lock(&queue->lock);
    queue->waiting = work;
    if (atomic_load(&queue->cancel_requested))
      atomic_store(&work->cancel, true); // cancel came first
    pthread_mutex_unlock(&queue->lock);
  }
  devbuf_status status = run(work);
  if (wait) {
    pthread_mutex_lock(&queue->lock);
    queue->waiting = NULL;
    pthread_mutex_unlock(&queue->lock);
  }
  return status;
}

// Items came from the submitter's core: the lines of each are fetched a few items ahead, for
// the item and its retiring write to them, while the worker runs those before it.
#define PREFETCH_AHEAD 3
#define PREFETCH_BYTES 256 // a small item whole: a fill, a kernel over one buffer

static inline void prefetch_item(const devbuf__work *work) {
  devbuf__prefetch_bytes_for_write(work, PREFETCH_BYTES);
}

// The batch a worker runs: items before `retired` are retired, those from there to `running`
// have run (a worker retires in groups).
typedef struct ran_items {
  devbuf_queue_t *queue;
  devbuf__work **batch;
  size_t retired, running;
} ran_items;

static _Thread_local ran_items *running_batch;

// devbuf__worker_settle: a host wait made by a kernel retires what ran before it, so that
// bytes an earlier item of its own queue wrote are not taken for the queue's pending work.
// Host code runs on a worker only in CPU kernels (items run on this thread, complete when they
// return) and in visible items (which retire what came before them first); retire waits
// for the device where anything was enqueued there all the same.
static bool settle_ran_items(void) {
  ran_items *ran = running_batch;
  if (!ran || ran->running == ran->retired) return false;
  retire(ran->queue, ran->batch + ran->retired, ran->running - ran->retired);
  ran->retired = ran->running;
  return true;
}

// Runs a batch in order. Finished items are retired together, and always before anything
// that may block or be observed from outside (an event operation, a wait for another
// queue), so that nobody waits for an item that has finished but is not retired.
static void run_items(ran_items *ran, size_t count) {
  devbuf_queue_t *queue = ran->queue;
  devbuf__work **batch = ran->batch;
  for (size_t i = 0; i < count; i++) {
    devbuf__work *work = batch[i];
    if (i + PREFETCH_AHEAD < count) prefetch_item(batch[i + PREFETCH_AHEAD]);
    bool failed = atomic_load(&queue->failed); // found on the device while retiring earlier items
    if (failed || atomic_load(&queue->cancel_requested)) {
      retire_stopped(queue, batch, ran->retired, i, count,
                     failed ? queue->failure : DEVBUF_CANCELLED);
      return;
    }
    // Host work may block (an MPI call) and, on a device whose work runs on after it is
    // enqueued, sees the memory only once what came before has completed there: what ran
    // before it retires first, which waits for the device.
    bool visible = work->kind == DEVBUF__WORK_SIGNAL || work->kind == DEVBUF__WORK_WAIT ||
                   work->kind == DEVBUF__WORK_HOST || !deps_done(work);
    if (visible) {
      retire(queue, batch + ran->retired, i - ran->retired);
      ran->retired = i;
      if (atomic_load(&queue->failed)) { // the device reported a failure of what ran before
        retire_stopped(queue, batch, i, i, count, queue->failure);
        return;
      }
    }
    ran->running = i;
    work->status = run_cancellable(queue, work);
    if (work->status == DEVBUF_CANCELLED && atomic_load(&work->cancel))
      continue; // cancel: not a failure
    if (work->status != DEVBUF_OK) {
      char message[512];
      snprintf(message, sizeof message, "%s", devbuf_last_error());
      devbuf__work *pending = fail_queue(queue, work->status, message);
      retire_stopped(queue, batch, ran->retired, i + 1, count, queue->failure);
      retire_unrun(queue, pending, queue->failure);
      return;
    }
  }
  retire(queue, batch + ran->retired, count - ran->retired);
}

static void run_batch(devbuf_queue_t *queue, devbuf__work **batch, size_t count) {
  devbuf__queue_validate_taken(queue, batch, count);
  ran_items ran = {queue, batch, 0, 0}, *outer = running_batch; // finish may run a queue here
  bool (*outer_settle)(void) = devbuf__worker_settle;
  running_batch = &ran;
  devbuf__worker_settle = settle_ran_items;
  run_items(&ran, count);
  running_batch = outer;
  devbuf__worker_settle = outer_settle;
}

// Takes up to BATCH submitted items, oldest first, into `batch`; their count.
static size_t take_batch(devbuf_queue_t *queue, devbuf__work **batch) {
  return devbuf__fifo_take(&queue->fifo_in, &queue->fifo_out, batch, BATCH);
}

static bool claim_runner(devbuf_queue_t *queue) {
  bool free = false;
  return atomic_compare_exchange_strong(&queue->runner, &free, true);
}

// How long a dozing worker's first doze lasts, unless DEVBUF_QUEUE_DOZE_US says otherwise:
// while the queue is used, how often it wakes. Each doze in a row that saw no submission
// lasts twice the one before (1, 2, 4, 8, 16 ms), so work that no finish and no blocked
// thread comes for waits 17 times this at most (EMPTY_DOZES below).
#define DOZE_NS         1000000
// Finishes in a row that came soon for work submitted to a worker without work
// (note_finish) before the worker dozes.
#define FINISHER_STREAK 2
// Dozes in a row that saw no submission before the worker sleeps until woken. A submission
// that wakes the worker from that sleep cost a loop of collectives that came just after
// the row ended 3 to 9% of their time (bench/mpi, 16 MiB, where four dozes of 1 ms ended
// the row): a doze's timer costs nothing there, that wake does. Dozes that double make the
// row 31 times the first (31 ms) for five timer wakes; work that no finish comes for waits
// for the rest of the doze it came in and one more of the first length, 17 ms at most.
#define EMPTY_DOZES     5

static void set_dozing(devbuf_queue_t *queue, bool dozing) {
  if (atomic_load_explicit(&queue->dozing, memory_order_relaxed) == dozing) return;
  if (dozing) atomic_fetch_add(&devbuf__dozers_asleep, 1); // before a submitter can skip a wake
  atomic_store(&queue->dozing, dozing);
  if (!dozing) atomic_fetch_sub(&devbuf__dozers_asleep, 1);
}

static bool finishers_run_the_work(const devbuf_queue_t *queue) {
  return atomic_load_explicit(&queue->finish_streak, memory_order_relaxed) >= FINISHER_STREAK;
}

// Sleeps until something is submitted or the queue is released, letting a thread in
// devbuf_queue_finish run the queue's items meanwhile; false when released and drained.
// The submitter reads worker_idle after publishing, the worker reads what was published
// after raising it (both sequentially consistent), so one of them sees the other. The worker runs
// again only once it holds `runner`: a finishing thread that holds it signals when it lets go.
//
// Where finishing threads run the work themselves (a loop that submits a collective and
// finishes it), a wake for each submission only makes the worker race the finishing thread
// for the work: where the cores are all busy, the woken worker takes the core of the thread
// that woke it and then the work, and that thread sleeps in devbuf_queue_finish until the
// worker is done (bench/mpi: 256 KiB to 16 MiB took up to 1.28x raw MPI's time). Such a
// worker dozes instead: it sleeps on a timer, and submissions do not wake it. It takes the
// work when a thread blocks on it (devbuf__wait_begins), when the queue is released, and
// when a doze ends with work that waited all through it (no finish came: the queue then
// goes back to waking its worker). EMPTY_DOZES in a row that saw no submission, each twice
// as long as the one before, end in an ordinary sleep, which a submission wakes; the worker
// so woken dozes before it takes the work, giving the finishing thread its turn.
static bool wait_for_work(devbuf_queue_t *queue) {
  pthread_mutex_lock(&queue->lock);
  atomic_store(&queue->worker_idle, true);
  atomic_store(&queue->runner, false);
  bool doze = finishers_run_the_work(queue); // sleep on the timer, not until woken
  bool overslept = false;                    // a doze ended with work that waited all through it
  uint64_t submitted_before = atomic_load(&queue->submitted);
  unsigned empty_dozes = 0; // in a row, that saw no submission
  for (;;) {
    // Before the FIFO is read, and again after every wake that finds nothing it may take
    // (a finishing thread runs the queue): a submission after this finds it clear and wakes
    // the worker, and one before it is seen below (see `submit`). The same holds of
    // `dozing`: a submission that saw it raised is seen below, or by the doze's end.
    atomic_store(&queue->wake_sent, false);
    set_dozing(queue, doze);
    bool waiting = has_incoming(queue);
    bool finishers_turn = waiting && finishers_run_the_work(queue) && !overslept &&
                          !atomic_load(&queue->run_now) && !atomic_load(&devbuf__blocked_waiters);
    if ((atomic_load(&queue->released) || (waiting && !finishers_turn)) && claim_runner(queue))
      break;
    if (!doze) {
      if (waiting) { // the finishing thread's turn (or it runs the queue): doze meanwhile
        doze = true;
        submitted_before = atomic_load(&queue->submitted);
        empty_dozes = 0; // a new row: its dozes start at the first length
        continue;
      }
      pthread_cond_wait(&queue->work_available, &queue->lock);
      doze = finishers_run_the_work(queue); // a submission woke it: doze until its finish
      submitted_before = atomic_load(&queue->submitted);
      empty_dozes = 0;
      continue;
    }
    // A doze that finds work waiting is the finishing thread's turn: the first length.
    uint64_t length = waiting ? queue->doze_ns : queue->doze_ns << empty_dozes;
    struct timespec until = devbuf__deadline_after(length);
    bool ended = pthread_cond_timedwait(&queue->work_available, &queue->lock, &until) == ETIMEDOUT;
    overslept = ended && waiting && has_incoming(queue);
    if (ended && !has_incoming(queue)) { // doze on while finishers ran submissions
      uint64_t submitted = atomic_load(&queue->submitted);
      empty_dozes = submitted == submitted_before ? empty_dozes + 1 : 0;
      doze = empty_dozes < EMPTY_DOZES;
      submitted_before = submitted;
    }
  }
  if (overslept) atomic_store(&queue->finish_streak, 0);
  set_dozing(queue, false);
  atomic_store(&queue->run_now, false);
  atomic_store(&queue->worker_woken, true);
  atomic_store(&queue->worker_idle, false);
  // Only a released, drained queue ends its worker: whatever the FIFO's counts say meanwhile,
  // an unreleased queue's worker goes back to look.
  bool more = !atomic_load(&queue->released) || has_incoming(queue);
  pthread_mutex_unlock(&queue->lock);
  return more;
}

// A thread blocks on the library's work: a dozing worker with work waiting takes it now.
static void nudge_worker(devbuf__dozer *dozer) {
  devbuf_queue_t *queue = (devbuf_queue_t *)((char *)dozer - offsetof(devbuf_queue_t, dozer));
  if (!atomic_load(&queue->dozing) || !has_incoming(queue)) return;
  pthread_mutex_lock(&queue->lock);
  atomic_store(&queue->run_now, true);
  pthread_cond_signal(&queue->work_available);
  pthread_mutex_unlock(&queue->lock);
}

// devbuf_queue_finish on a queue whose worker sleeps: this thread runs what is queued, as
// the worker would (waits refused alike), and lets the worker go on with what comes after.
static void run_here(devbuf_queue_t *queue) {
  devbuf_queue_t *outer_queue = devbuf__worker_queue;
  devbuf_device_t *outer_device = devbuf__worker_device;
  devbuf__worker_queue = queue;
  devbuf__worker_device = queue->device;
  devbuf__work *batch[BATCH];
  for (size_t count; (count = take_batch(queue, batch));) run_batch(queue, batch, count);
  devbuf__worker_queue = outer_queue;
  devbuf__worker_device = outer_device;
  // The lock only to signal: a worker that failed to claim the runner before this store
  // holds the lock until it waits, so the signal reaches it; one that looks after it claims.
  atomic_store(&queue->runner, false);
  if (has_incoming(queue) || atomic_load(&queue->released)) {
    pthread_mutex_lock(&queue->lock);
    pthread_cond_signal(&queue->work_available);
    pthread_mutex_unlock(&queue->lock);
  }
}

// How long a worker that ran dry looks for more before it sleeps: about what a sleep and a
// wake cost here (some tens of microseconds), so that a spin never wastes more than twice what
// the best choice would. Bounded by the clock, as a pause instruction takes 10 to 140 cycles
// from one processor to the next.
#define WORKER_SPIN_NS 50000

// Looks for a submission until WORKER_SPIN_NS after `dry_at`: one that comes soon after the
// worker ran dry is taken without a sleep and a wake (a system call for the submitter, a
// wake-up for the worker, and a finish that waits behind both), as in a loop that submits,
// finishes and submits again after a collective or some host work.
static bool spin_for_work(devbuf_queue_t *queue, uint64_t dry_at) {
  atomic_store_explicit(&queue->worker_spinning, true, memory_order_relaxed);
  bool found;
  for (unsigned spin = 1;; spin++) {
    if ((found = has_incoming(queue))) break;
    devbuf__cpu_pause();
    if (spin % 32 == 0 && devbuf__now_ns() - dry_at >= WORKER_SPIN_NS) break;
  }
  atomic_store_explicit(&queue->worker_spinning, false, memory_order_relaxed);
  return found;
}

// Whether the worker spins the next time it runs dry: when the work came back soon this time
// (within the spin, or within twice it when it slept, as the wake-up adds to what it measures).
// Work that comes rarely, or after long work elsewhere, gets a worker that sleeps at once: it
// costs an idle CPU nothing, and where the cores are all taken (MPI ranks polling beside the
// queue) a spinning worker would take the time of the threads it waits for.
static bool spin_next_time(uint64_t dry_at, bool found_spinning) {
  return found_spinning || devbuf__now_ns() - dry_at < 2 * (uint64_t)WORKER_SPIN_NS;
}

// A worker that keeps up with its submitter item by item pays, for every item, what moving
// the submission's cache lines between two cores costs: the item, the FIFO, the trackers'
// lists and the item pool go to the worker's core and back, some hundreds of nanoseconds
// on a shared machine where the item's own work takes tens. After a batch of fewer than
// GATHER_ITEMS that ran in less than the gather time while more was submitted, the worker
// lets the submitter get ahead until the gather time after the batch began, touching none
// of those lines, and then takes what came in one batch. The gather time follows the
// submitter's pace, so that a gather brings about GATHER_ITEMS, a whole batch (what moves
// between the cores costs per batch: with 16, a 256-byte fill took about 1.25 times a
// ring's time where the cores are far apart, with 64 about 1.05; docs/hazards.md): from
// GATHER_MIN_NS (some ten submissions of 100 ns) to GATHER_MAX_NS, for submissions over
// several tracked buffers, whose lines all move between the cores, which come several times
// slower (docs/hazards.md). An item waits at most GATHER_MAX_NS longer, and only while its
// submitter keeps ahead and nobody waits for the queue: a finish, a cancel or a submitter
// waiting for room ends the wait at once, work that takes the gather time or more is never
// held, and a worker that ran dry takes what comes at once. `devbuf bench --only queue`
// prices it (docs/hazards.md).
#define GATHER_ITEMS  BATCH
#define GATHER_MIN_NS 1000
#define GATHER_MAX_NS 8000

// Whether the worker waited the gather time out (not ended by a dry queue or a waiter).
static bool let_submitter_get_ahead(devbuf_queue_t *queue, uint64_t batch_began,
                                    uint64_t gather_ns) {
  if (!has_incoming(queue)) return false; // ran dry
  for (unsigned spin = 0;; spin++) {
    if (atomic_load_explicit(&queue->drain_waiters, memory_order_relaxed) ||
        atomic_load_explicit(&queue->cancel_requested, memory_order_relaxed))
      return false;
    if (spin % 8 == 0 && devbuf__now_ns() - batch_began >= gather_ns) return true;
    devbuf__cpu_pause();
  }
}

// The next gather time, from the `count` items the last one brought in `gather_ns`.
static uint64_t next_gather_ns(uint64_t gather_ns, size_t count) {
  uint64_t wanted = count ? gather_ns * GATHER_ITEMS / count : GATHER_MAX_NS;
  return wanted < GATHER_MIN_NS ? GATHER_MIN_NS : wanted > GATHER_MAX_NS ? GATHER_MAX_NS : wanted;
}

static void *worker_main(void *arg) {
  devbuf_queue_t *queue = arg;
  devbuf__worker_queue = queue;
  devbuf__worker_device = queue->device;
  devbuf__work *batch[BATCH];
  bool spins = false; // until work is seen to come back soon after the worker ran dry
  bool woke = false;  // the next batch is what the worker slept until (worker_woken)
  uint64_t gather_ns = GATHER_MIN_NS;
  bool gathered = false; // the batch about to be taken came in a gather of gather_ns
  for (;;) {
    size_t count = take_batch(queue, batch);
    if (count) {
      if (!woke && atomic_load_explicit(&queue->worker_woken, memory_order_relaxed))
        atomic_store_explicit(&queue->worker_woken, false, memory_order_relaxed);
      woke = false;
    } else {
      uint64_t dry_at = devbuf__now_ns();
      // Not while finishing threads run the work: a spinning worker would take it from them.
      bool found = spins && !finishers_run_the_work(queue) && spin_for_work(queue, dry_at);
      if (!found && !wait_for_work(queue)) break; // released and drained
      woke = !found;
      spins = spin_next_time(dry_at, found);
      continue;
    }
    // No yield to let the submitter add more first: where other threads busy-poll (an MPI
    // collective in a host task, the other rank's) and the cores are all taken, a yielding
    // worker waited behind them for a time slice. With a build running beside the MPI
    // benchmark an all-reduce of 1 MiB took 3.3 ms instead of 0.25; on an idle machine 4 KiB
    // took 3.4x raw MPI's time with the yield, 2.6x without (bench/mpi). The gather after a
    // small batch (above) spins for at most GATHER_MAX_NS, never while a finish waits.
    if (gathered) gather_ns = next_gather_ns(gather_ns, count);
    uint64_t began = count < GATHER_ITEMS ? devbuf__now_ns() : 0;
    run_batch(queue, batch, count);
    gathered = began && let_submitter_get_ahead(queue, began, gather_ns);
  }
  pthread_mutex_lock(&queue->lock);
  bool frees = queue->worker_frees;
  pthread_mutex_unlock(&queue->lock);
  if (frees) queue_destroy(queue);
  return NULL;
}

// ---- the public queue API --------------------------------------------------------------

static uint64_t doze_ns(void) {
  const char *text = getenv("DEVBUF_QUEUE_DOZE_US");
  char *end = NULL;
  unsigned long long micros = text ? strtoull(text, &end, 10) : 0;
  if (!text || end == text || *end || micros == 0 || micros > 60000000) return DOZE_NS;
  return micros * 1000;
}

devbuf_status devbuf_queue_create(devbuf_device_t *device, devbuf_queue_t **out_queue) {
  if (!device || !out_queue)
    return devbuf__null_argument("", "device, out_queue", (const void *[]){device, out_queue});
  if (!device->backend->enqueue)
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s has no queues in this build", device->spec);
  void *device_queue = NULL;
  if (device->backend->queue_create) {
    devbuf_status status = device->backend->queue_create(device, &device_queue);
    if (status != DEVBUF_OK) return status;
  }
  devbuf_queue_t *queue = devbuf__calloc(1, sizeof *queue);
  if (queue && !devbuf__fifo_init(&queue->fifo_in, &queue->fifo_out)) {
    devbuf__free(queue);
    queue = NULL;
  }
  if (!queue && device_queue) device->backend->queue_destroy(device, device_queue);
  if (!queue) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a queue");
  devbuf__ref_init(&queue->refs, 1);
  atomic_init(&queue->submitted, 0);
  atomic_init(&queue->worker_idle, false);
  atomic_init(&queue->wake_sent, false);
  atomic_init(&queue->dozing, false);
  atomic_init(&queue->submitted_to_idle_at, 0);
  atomic_init(&queue->worker_spinning, false);
  atomic_init(&queue->finish_streak, 0);
  atomic_init(&queue->worker_woken, false);
  atomic_init(&queue->run_now, false);
  queue->doze_ns = doze_ns();
  atomic_init(&queue->runner, true); // the worker's until it first sleeps
  atomic_init(&queue->completed, 0);
  atomic_init(&queue->drain_waiters, 0);
  atomic_init(&queue->depth, DEVBUF_QUEUE_DEFAULT_DEPTH);
  atomic_init(&queue->full_refuses, false);
  atomic_init(&queue->completed_seen, 0);
  atomic_init(&queue->cancel_requested, false);
  atomic_init(&queue->failed, false);
  queue->device = devbuf_device_retain(device);
  queue->device_queue = device_queue;
  queue->epoch = devbuf__epoch();
  queue->number = atomic_fetch_add(&device->queues_made, 1) + 1;
  devbuf__mutex_init(&queue->lock);
  devbuf__cond_init_monotonic(&queue->work_available);
  pthread_cond_init(&queue->drained, NULL);
  if (!device_queue) { // only these let a finishing thread run the work, and so doze
    queue->dozer.nudge = nudge_worker;
    devbuf__dozer_add(&queue->dozer);
  }
  if (pthread_create(&queue->worker, NULL, worker_main, queue) != 0) {
    queue_destroy(queue);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "cannot start a worker thread for a queue on %s",
                         device->spec);
  }
  *out_queue = queue;
  return DEVBUF_OK;
}

devbuf_queue_t *devbuf_queue_retain(devbuf_queue_t *queue) {
  if (queue) devbuf__ref_retain(&queue->refs);
  return queue;
}

devbuf_status devbuf__queue_check_process(const devbuf_queue_t *queue, const char *what) {
  if (DEVBUF_LIKELY(queue->epoch == devbuf__epoch())) return DEVBUF_OK;
  return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                       "%s: the queue on %s was created before this process was forked from its "
                       "creator, and has no worker here; create a queue in this process",
                       what, queue->device->spec);
}

void devbuf_queue_release(devbuf_queue_t *queue) {
  if (!queue || !devbuf__ref_drop(&queue->refs)) return;
  if (queue->epoch != devbuf__epoch()) return; // an ancestor's: no worker to stop or join here
  pthread_mutex_lock(&queue->lock);
  atomic_store(&queue->released, true);
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

devbuf_device_t *devbuf_queue_device(const devbuf_queue_t *queue) {
  return queue ? queue->device : NULL;
}

void *devbuf__queue_device_queue(const devbuf_queue_t *queue) { return queue->device_queue; }

static devbuf_status failure_locked(const devbuf_queue_t *queue) {
  return devbuf__error(queue->failure, "%s", queue->failure_message);
}

devbuf_status devbuf_queue_status(const devbuf_queue_t *queue) {
  if (!queue) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "queue is NULL");
  // An ancestor's lock may have been held at the fork, by a thread this process lacks.
  devbuf_status usable = devbuf__queue_check_process(queue, "queue_status");
  if (usable != DEVBUF_OK) return usable;
  devbuf_queue_t *mutable_queue = (devbuf_queue_t *)queue; // the lock is not part of the value
  pthread_mutex_lock(&mutable_queue->lock);
  devbuf_status status = queue->failure == DEVBUF_OK ? DEVBUF_OK : failure_locked(queue);
  pthread_mutex_unlock(&mutable_queue->lock);
  return status;
}

// Items submitted and not yet retired (completed first: it never passes submitted); what
// submitters see of `completed` moves up with it.
static uint64_t held_items(devbuf_queue_t *queue) {
  uint64_t completed = atomic_load(&queue->completed);
  atomic_store_explicit(&queue->completed_seen, completed, memory_order_relaxed);
  return atomic_load(&queue->submitted) - completed;
}

#define ROOM_SPINS 4000 // checks before a submission to a full queue sleeps

static devbuf_status full_refusal(devbuf_queue_t *queue, uint64_t held, uint64_t depth) {
  return devbuf__error(DEVBUF_TIMEOUT,
                       "submit: the queue on %s is full (%llu items submitted and not retired, "
                       "its depth %llu) and set to refuse rather than wait",
                       queue->device->spec, (unsigned long long)held, (unsigned long long)depth);
}

// Waits for room under the depth as it is each time it looks: devbuf_queue_set_depth may
// raise or remove it, or make the queue refuse, while a submitter waits (and wakes it).
static devbuf_status wait_for_room(devbuf_queue_t *queue) {
  for (int spin = 0; spin < ROOM_SPINS; spin++) {
    uint64_t depth = atomic_load_explicit(&queue->depth, memory_order_relaxed);
    if (!depth || held_items(queue) < depth) return DEVBUF_OK;
    devbuf__cpu_pause();
  }
  // The worker broadcasts `drained` for every group it retires while someone waits.
  devbuf_status status = DEVBUF_OK;
  pthread_mutex_lock(&queue->lock);
  atomic_fetch_add(&queue->drain_waiters, 1);
  for (;;) {
    uint64_t depth = atomic_load(&queue->depth), held = 0;
    if (!depth || (held = held_items(queue)) < depth || atomic_load(&queue->failed)) break;
    if (atomic_load(&queue->full_refuses)) {
      status = full_refusal(queue, held, depth);
      break;
    }
    pthread_cond_wait(&queue->drained, &queue->lock);
  }
  atomic_fetch_sub(&queue->drain_waiters, 1);
  pthread_mutex_unlock(&queue->lock);
  return status;
}

devbuf_status devbuf__queue_wait_room(devbuf_queue_t *queue) {
  uint64_t depth = atomic_load_explicit(&queue->depth, memory_order_relaxed), held;
  if (!depth || (held = held_items(queue)) < depth) return DEVBUF_OK;
  if (atomic_load(&queue->full_refuses)) return full_refusal(queue, held, depth);
  if (DEVBUF_UNLIKELY(devbuf__worker_queue == queue))
    return devbuf__refuse_self_wait("a submission to its own full queue");
  devbuf__settle_before_blocking(); // what holds the queue full may wait for this worker's items
  devbuf__wait_begins();
  devbuf_status status = wait_for_room(queue);
  devbuf__wait_ends();
  return status; // OK with a failure found meanwhile: the submission's to report
}

devbuf_status devbuf_queue_set_depth(devbuf_queue_t *queue, uint64_t max_items, uint32_t flags) {
  if (!queue) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "queue is NULL");
  if (flags & ~(uint32_t)DEVBUF_QUEUE_FULL_REFUSES)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "queue_set_depth: unknown flags 0x%x",
                         flags & ~(unsigned)DEVBUF_QUEUE_FULL_REFUSES);
  devbuf_status usable = devbuf__queue_check_process(queue, "queue_set_depth"); // as status
  if (usable != DEVBUF_OK) return usable;
  atomic_store(&queue->full_refuses, (flags & DEVBUF_QUEUE_FULL_REFUSES) != 0);
  atomic_store(&queue->depth, max_items);
  pthread_mutex_lock(&queue->lock); // submitters waiting for room under the old depth look again
  pthread_cond_broadcast(&queue->drained);
  pthread_mutex_unlock(&queue->lock);
  return DEVBUF_OK;
}

// Waits until every submitted item is retired. Caller holds queue->lock.
static void wait_drained_locked(devbuf_queue_t *queue) {
  atomic_fetch_add(&queue->drain_waiters, 1);
  while (atomic_load(&queue->completed) != atomic_load(&queue->submitted))
    pthread_cond_wait(&queue->drained, &queue->lock);
  atomic_fetch_sub(&queue->drain_waiters, 1);
}

// Waits until every submitted item is retired but those that cancels hold (taken from the
// FIFO, to retire once this wait ends). Caller holds queue->lock.
static void wait_for_the_runner_locked(devbuf_queue_t *queue) {
  atomic_fetch_add(&queue->drain_waiters, 1);
  while (atomic_load(&queue->completed) + queue->cancel_held < atomic_load(&queue->submitted))
    pthread_cond_wait(&queue->drained, &queue->lock);
  atomic_fetch_sub(&queue->drain_waiters, 1);
}

// Counts the finishes in a row that came soon for work submitted to a worker without work
// (asleep, dozing or spinning for more): within FINISH_SOON_NS of the submission, or while
// the worker still runs what it was woken for. One that comes later, or for work the worker
// found busy (a producer that runs ahead of it), ends the row. A worker that spins for work
// takes it from the finishing thread, which then sleeps until the worker is done: once the
// row is long enough, it neither spins nor is woken.
#define FINISH_SOON_NS 100000

static void note_finish(devbuf_queue_t *queue) {
  uint64_t submitted_at = atomic_load_explicit(&queue->submitted_to_idle_at, memory_order_relaxed);
  bool pending = atomic_load(&queue->completed) != atomic_load(&queue->submitted);
  if (!submitted_at && !pending) return;
  if (submitted_at) atomic_store_explicit(&queue->submitted_to_idle_at, 0, memory_order_relaxed);
  bool soon = submitted_at &&
              (devbuf__now_ns() - submitted_at < FINISH_SOON_NS ||
               (pending && !atomic_load(&queue->worker_idle) && atomic_load(&queue->worker_woken)));
  unsigned streak = atomic_load_explicit(&queue->finish_streak, memory_order_relaxed);
  if (soon && streak < FINISHER_STREAK)
    atomic_store_explicit(&queue->finish_streak, streak + 1, memory_order_relaxed);
  else if (!soon && streak)
    atomic_store_explicit(&queue->finish_streak, 0, memory_order_relaxed);
}

devbuf_status devbuf_queue_finish(devbuf_queue_t *queue) {
  if (!queue) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "queue is NULL");
  devbuf_status usable = devbuf__queue_check_process(queue, "queue_finish");
  if (usable != DEVBUF_OK) return usable;
  if (DEVBUF_UNLIKELY(devbuf__worker_queue == queue))
    return devbuf__refuse_self_wait("queue_finish");
  devbuf__settle_before_blocking();
  // A sleeping worker would have to be woken and then wake this thread: two sleeps and wakes
  // of some microseconds each, where the work itself may take less (an MPI call on a few
  // KiB). Device queues are left to their worker, which feeds the driver.
  if (!queue->device_queue) {
    note_finish(queue);
    if (atomic_load(&queue->worker_idle) && has_incoming(queue) && claim_runner(queue))
      run_here(queue);
  }
  // Drained and healthy (what a loop of collectives finds once it ran them here): no lock.
  // `failed` is raised before a failing item retires, so it shows once `completed` does.
  if (atomic_load(&queue->completed) == atomic_load(&queue->submitted) &&
      !atomic_load(&queue->failed))
    return DEVBUF_OK;
  pthread_mutex_lock(&queue->lock);
  wait_drained_locked(queue);
  devbuf_status status = queue->failure == DEVBUF_OK ? DEVBUF_OK : failure_locked(queue);
  pthread_mutex_unlock(&queue->lock);
  return status;
}

devbuf_status devbuf_queue_cancel(devbuf_queue_t *queue) {
  if (!queue) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "queue is NULL");
  devbuf_status usable = devbuf__queue_check_process(queue, "queue_cancel");
  if (usable != DEVBUF_OK) return usable;
  if (DEVBUF_UNLIKELY(devbuf__worker_queue == queue))
    return devbuf__refuse_self_wait("queue_cancel");
  devbuf__settle_before_blocking(); // it waits for the item the queue runs now
  pthread_mutex_lock(&queue->lock);
  atomic_store(&queue->cancel_requested, true); // the worker drops what it took but has not started
  devbuf__work *pending = take_incoming(queue);
  uint64_t held = 0;
  for (devbuf__work *work = pending; work; work = work->next) held++;
  queue->cancel_held += held;
  devbuf__work *waiting = queue->waiting;
  if (waiting) {
    atomic_store(&waiting->cancel, true);
    devbuf__wait_item_cancel(waiting);
  }
  pthread_mutex_unlock(&queue->lock);
  // The dropped signals' events fail at once: a running item may wait for one of them.
  for (devbuf__work *work = pending; work; work = work->next) {
    work->status = DEVBUF_CANCELLED;
    if (work->kind == DEVBUF__WORK_SIGNAL) fail_signal(queue, work);
  }
  // The dropped items retire once the runner has retired the running item and the rest of
  // its batch. Retired first, one would let what is ordered after it start while an older
  // item still writes the same bytes: work of another queue on memory reused after it
  // waits only for the newest item of each queue. Cancels at once wait for the runner
  // alike, not for each other (what they hold is counted out of the wait).
  pthread_mutex_lock(&queue->lock);
  wait_for_the_runner_locked(queue);
  queue->cancel_held -= held; // before they count as retired: no other wait passes early
  pthread_mutex_unlock(&queue->lock);
  retire_unrun(queue, pending, DEVBUF_CANCELLED);
  pthread_mutex_lock(&queue->lock);
  wait_drained_locked(queue);
  atomic_store(&queue->cancel_requested, false);
  pthread_mutex_unlock(&queue->lock);
  return DEVBUF_OK;
}
