// Queues, work items and events. A work item carries everything it needs to run
// (addresses computed at submission, scalars copied), the hazard records of its uses and
// the work of other queues it must wait for.
#ifndef DEVBUF_QUEUE_H
#define DEVBUF_QUEUE_H

#include "../core/hazard.h"
#include "work_fifo.h"

typedef struct devbuf__work devbuf__work;

// Why a queue failed, shared by its failed items, so that work of other queues that waited
// for one of them tells the cause (the queue itself may be gone by then).
typedef struct devbuf__failure {
  devbuf__refcount refs;
  char message[480]; // "queue N on SPEC failed: STATUS: ..."
} devbuf__failure;

// A program built for a device (devbuf_program_build): the backend's object, shared.
struct devbuf_program {
  devbuf__refcount refs;
  devbuf_device_t *device; // retained
  void *backend_program;   // the backend's cached build
};

typedef enum devbuf__work_kind {
  DEVBUF__WORK_KERNEL,
  DEVBUF__WORK_FILL,
  DEVBUF__WORK_COPY,
  DEVBUF__WORK_SIGNAL,
  DEVBUF__WORK_WAIT,
  DEVBUF__WORK_LAUNCH, // a device program's kernel
  DEVBUF__WORK_HOST,   // host work on any queue: a C function on the worker, in queue order
} devbuf__work_kind;

// One use of a work item: its record in the memory's tracker (in one while its segment is
// set). Its bytes are the item's operand of the same index.
typedef struct devbuf__work_use {
  devbuf__record record;
} devbuf__work_use;

// The tracker a use's record is in, or NULL.
static inline devbuf__hazard *devbuf__work_use_hazard(const devbuf__work_use *use) {
  return use->record.segment ? use->record.segment->hazard : NULL;
}

// An item is one allocation, laid out as: this header, its uses, their operands, a C
// kernel's arrays (KERNEL and HOST), then its scalars. Only what every item needs has a
// field; the rest is found by its place, as 500,000 queued items are held at once when a
// producer runs ahead (a fill: 232 bytes).
struct devbuf__work {
  devbuf__fence fence;       // first: what trackers hold; refs: the queue's, plus one per dependent
  struct devbuf__work *next; // lists: the pool's, what a failure or cancel detaches
  devbuf__work_kind kind;
  devbuf_status status; // fence.done: set (release) once retired; status is final then
  atomic_uint waiters;  // threads blocked on its parking place (devbuf__work_parking)
  uint32_t use_count;
  uint32_t scalars_size;
  uint32_t dep_count, dep_capacity;
  atomic_bool cancel;            // a WAIT item is asked to stop waiting
  uint8_t pool;                  // the pool it returns to (work.c), or none
  devbuf__dep *deps;             // released once waited for
  void *_Atomic device_event;    // device queues: the driver's event once enqueued
  devbuf_device_t *event_device; // ... and its device (retained), which releases it
  union {                        // what its kind needs
    devbuf_cpu_kernel_fn kernel; // KERNEL, HOST
    struct {                     // SIGNAL, WAIT
      devbuf_event_t *event;     // retained
      uint64_t value;
      struct devbuf__wait_gate *gate; // a WAIT item's while it waits on a device (under the
                                      // lock of its parking place)
    };
    struct { // LAUNCH: the devbuf_launch_t is at the scalars, then the arguments' sizes,
             // their bytes, and the name
      devbuf_program_t *program; // retained
      const char *kernel_name;   // the name, at the end of the scalars
      size_t arg_count;
    };
    unsigned char pattern[24]; // FILL: a pattern this size or smaller is its scalars
    struct { // any kind, once retired failed (not cancelled): a gate, an argument count or a
             // pattern's end sat here, which nothing reads any more; the rest stays
      void *kept_[2];
      devbuf__failure *failure; // retained, or NULL: its queue's failure, for dependents
    };
  };
  devbuf__work_use uses[];
};

_Static_assert(offsetof(devbuf__work, failure) == offsetof(devbuf__work, gate) &&
                   offsetof(devbuf__work, failure) == offsetof(devbuf__work, arg_count),
               "a failed item's cause takes the place of what only running needs");

// Whether the item was retired failed, so that it holds `failure` (every status is final
// once retired; none but OK before).
static inline bool devbuf__work_failed(const devbuf__work *work) {
  return work->status != DEVBUF_OK && work->status != DEVBUF_CANCELLED;
}

// The most uses and scalar bytes of one item (its counts are 32-bit).
#define DEVBUF__WORK_MAX_USES    ((size_t)1 << 24)
#define DEVBUF__WORK_MAX_SCALARS ((size_t)UINT32_MAX)

static inline bool devbuf__work_has_arrays(devbuf__work_kind kind) {
  return kind == DEVBUF__WORK_KERNEL || kind == DEVBUF__WORK_HOST;
}
static inline bool devbuf__work_scalars_inline(devbuf__work_kind kind, size_t scalars_size) {
  return kind == DEVBUF__WORK_FILL && scalars_size <= sizeof(((devbuf__work *)0)->pattern);
}
// The bytes of an item of `kind` with `use_count` uses, before any scalars.
static inline size_t devbuf__work_head_bytes(devbuf__work_kind kind, size_t use_count) {
  size_t per_use = sizeof(devbuf__work_use) + sizeof(devbuf__operand) +
                   (devbuf__work_has_arrays(kind) ? sizeof(void *) + sizeof(size_t) : 0);
  return sizeof(devbuf__work) + use_count * per_use;
}
// Where an item's copied scalars start when they are not inline: aligned as malloc aligns,
// since a kernel reads them as its parameters' struct (a __m128 or long double member
// faulted at an address 8 past a multiple of 16).
static inline size_t devbuf__work_scalars_offset(devbuf__work_kind kind, size_t use_count) {
  size_t align = _Alignof(max_align_t);
  return (devbuf__work_head_bytes(kind, use_count) + align - 1) & ~(align - 1);
}
// The bytes of an item of `kind` with `use_count` uses and `scalars_size` bytes of scalars.
static inline size_t devbuf__work_bytes(devbuf__work_kind kind, size_t use_count,
                                        size_t scalars_size) {
  if (devbuf__work_scalars_inline(kind, scalars_size))
    return devbuf__work_head_bytes(kind, use_count);
  return devbuf__work_scalars_offset(kind, use_count) + scalars_size;
}
// The bytes of each use, in this allocation: a copy, as the storage may hand its memory on
// while the item waits.
static inline devbuf__operand *devbuf__work_operands(const devbuf__work *work) {
  return (devbuf__operand *)(uintptr_t)(work->uses + work->use_count);
}
// The copied scalars (kernel scalars, fill pattern, launch and its arguments).
static inline void *devbuf__work_scalars(devbuf__work *work) {
  if (devbuf__work_scalars_inline(work->kind, work->scalars_size)) return work->pattern;
  return (char *)work + devbuf__work_scalars_offset(work->kind, work->use_count);
}
// A LAUNCH item's launch, at its scalars.
static inline devbuf_launch_t *devbuf__work_launch(devbuf__work *work) {
  return (devbuf_launch_t *)devbuf__work_scalars(work);
}

// A queue: its worker thread runs work items in submission order while the caller goes on.
// The fields are grouped by who writes them and how often, a cache line apart, so that a
// submission (which writes the FIFO under the lock) and the worker (which reads the flags
// for every item and bumps `completed` for every group it retires) do not take each
// other's cache lines away on every item.
struct devbuf_queue {
  // Set at creation.
  devbuf_device_t *device; // retained
  void *device_queue;      // the backend's queue, for devices with their own
  pthread_t worker;
  unsigned epoch;  // the process's at creation: a forked child has no worker for it
  unsigned number; // of the queues made on its device, from 1: what messages call it
  // Read for every item; written when the queue fails or is cancelled, or someone waits.
  atomic_bool cancel_requested; // drop taken items that have not started
  atomic_bool failed;           // failure != OK, readable without the lock
  atomic_size_t drain_waiters;  // threads waiting on `drained`
  atomic_uint_least64_t depth;  // most items submitted and not retired (0: no bound)
  atomic_bool full_refuses;     // a submission to a full queue refuses instead of waiting
  char apart_from_flags[DEVBUF__CACHE_LINE];
  // Written by every submission, under the device's submission lock: the FIFO's end that
  // submissions fill (work_fifo.h), so that submitting and taking never wait for each other.
  devbuf__fifo_in fifo_in;
  atomic_uint_least64_t submitted; // counted before the item is published
  // What submitters last read of `completed`: while submitted - this is under the depth the
  // queue has room, and no submission reads the worker's line.
  atomic_uint_least64_t completed_seen;
  char apart_from_fifo_in[DEVBUF__CACHE_LINE];
  // The worker's state as submissions see it: read by every submission, written when the
  // worker runs dry, sleeps or wakes. Off the line that every submission writes, which the
  // worker would otherwise take away each time it runs dry.
  atomic_bool worker_idle;     // the worker waits (or is about to) on work_available
  atomic_bool worker_spinning; // the worker looks for work before it sleeps (spin_for_work)
  // A submission has woken the idle worker: the others of the burst need not (the worker
  // takes everything queued when it wakes). Cleared by the worker as it goes idle.
  atomic_bool wake_sent;
  atomic_bool dozing; // the idle worker sleeps on its timer: submissions do not wake it
  // When a submission first found the worker without work (asleep or spinning) since the
  // last finish; 0: none did.
  atomic_uint_least64_t submitted_to_idle_at;
  char apart_from_worker_state[DEVBUF__CACHE_LINE];
  // The thread that takes and runs items holds `runner`: the worker, but while it sleeps a
  // thread in devbuf_queue_finish of a queue with no device queue of its own, which runs
  // what is queued itself instead of waking the worker and sleeping until it is done.
  atomic_bool runner;
  devbuf__fifo_out fifo_out; // the FIFO's end that the runner takes from
  // Whether finishing threads run the work themselves (queue.c, wait_for_work): finishes in
  // a row that came soon after a submission to a worker without work (note_finish).
  atomic_uint finish_streak;
  atomic_bool worker_woken;      // the worker runs what it was woken for (not what it found)
  atomic_bool run_now;           // a thread blocks on the work: the dozing worker takes it
  uint64_t doze_ns;              // how long the worker dozes at a time (DEVBUF_QUEUE_DOZE_US)
  devbuf__dozer dozer;           // in base's list while the queue lives (CPU queues)
  pthread_mutex_t lock;          // the fields below, unless marked atomic
  atomic_bool released;          // no references left: the worker exits once drained
  bool worker_frees;             // ... and frees the queue itself (release did not join)
  pthread_cond_t work_available; // the worker waits here
  pthread_cond_t drained;        // finish and cancel wait here
  devbuf__work *waiting;         // the WAIT item the worker blocks in, for cancel
  uint64_t cancel_held;          // items cancels took from the FIFO and have not yet retired
  devbuf_status failure;         // OK until a work item fails
  char apart_from_submissions[DEVBUF__CACHE_LINE];
  // Written by the worker for every group of items it retires.
  atomic_uint_least64_t completed; // retired items
  char apart_from_completed[DEVBUF__CACHE_LINE];
  devbuf__refcount refs;
  char failure_message[480]; // with "STATUS: " in front, within devbuf_last_error's 512 bytes
  _Atomic(devbuf__failure *) failure_cause; // the same, for its failed items (NULL: none yet)
};

static inline void devbuf__failure_release(devbuf__failure *failure) {
  if (failure && devbuf__ref_drop(&failure->refs)) devbuf__free(failure);
}

// Waits until the queue holds fewer items than its depth (or refuses, as the queue is set
// to). Called before an item is recorded, when devbuf__queue_may_be_full says so.
devbuf_status devbuf__queue_wait_room(devbuf_queue_t *queue);
// Whether the queue may hold its depth of items: false is certain (`completed` only grows,
// so what submitters last saw of it counts too many items as held).
static inline bool devbuf__queue_may_be_full(const devbuf_queue_t *queue) {
  uint64_t depth = atomic_load_explicit(&queue->depth, memory_order_relaxed);
  return depth && atomic_load_explicit(&queue->submitted, memory_order_relaxed) -
                          atomic_load_explicit(&queue->completed_seen, memory_order_relaxed) >=
                      depth;
}

// ---- work items (work.c) ----

// Where threads block until a work item completes, and where a WAIT item's gate is handed
// to cancel: a few lock and condition pairs that every item shares, by its address. A
// pair of its own would add 88 bytes to every item for waits that few items see.
typedef struct devbuf__parking {
  pthread_mutex_t lock;
  pthread_cond_t completed; // broadcast when an item with waiters here completes
} devbuf__parking;
devbuf__parking *devbuf__work_parking(const devbuf__work *work);

// The work item whose fence a tracker or storage holds (every fence is a work item's).
static inline devbuf__work *devbuf__work_of(devbuf__fence *fence) {
  return (devbuf__work *)(void *)fence;
}
// A new item of `kind` for `queue` with room for `use_count` uses and `scalars_size` bytes
// of scalars (taken from a pool of small items); NULL without host memory.
devbuf__work *devbuf__work_new(devbuf_queue_t *queue, devbuf__work_kind kind, size_t use_count,
                               size_t scalars_size);
devbuf__work *devbuf__work_retain(devbuf__work *work);
void devbuf__work_release(devbuf__work *work);
// Drops a reference; an item whose last reference goes is cleaned and, if it is a pooled
// one, appended to *recycled, for one devbuf__work_pool_return of a whole group.
void devbuf__work_cleanup(devbuf__work *work, devbuf__work **recycled); // the last reference went
static inline void devbuf__work_unref(devbuf__work *work, devbuf__work **recycled) {
  if (devbuf__ref_drop(&work->fence.refs)) devbuf__work_cleanup(work, recycled);
}
void devbuf__work_pool_return(devbuf__work *recycled);
// Waits on the host until `work` has retired; its status.
devbuf_status devbuf__work_wait_done(devbuf__work *work);
// A C kernel's arrays (KERNEL and HOST items only): the host address and the size of each
// use.
static inline void **devbuf__work_data(devbuf__work *work) {
  return (void **)(void *)(devbuf__work_operands(work) + work->use_count);
}
static inline size_t *devbuf__work_sizes(devbuf__work *work) {
  return (size_t *)(devbuf__work_data(work) + work->use_count);
}
// Debug validators (queue_validate.c; no-ops without DEVBUF_DEBUG_CHECKS): of a batch the
// worker is about to run, and of items about to be marked done. They abort on a broken
// invariant, naming it.
#if DEVBUF_DEBUG_CHECKS
void devbuf__queue_validate_taken(const devbuf_queue_t *queue, devbuf__work *const *batch,
                                  size_t count);
void devbuf__queue_validate_retiring(const devbuf_queue_t *queue, devbuf__work *const *items,
                                     size_t count);
#else
static inline void devbuf__queue_validate_taken(const devbuf_queue_t *queue,
                                                devbuf__work *const *batch, size_t count) {
  (void)queue, (void)batch, (void)count;
}
static inline void devbuf__queue_validate_retiring(const devbuf_queue_t *queue,
                                                   devbuf__work *const *items, size_t count) {
  (void)queue, (void)items, (void)count;
}
#endif

// INVALID_ARGUMENT naming `what` for a queue an ancestor process made (a forked child's copy).
devbuf_status devbuf__queue_check_process(const devbuf_queue_t *queue, const char *what);
// The backend's queue under a devbuf queue (NULL on the CPU).
void *devbuf__queue_device_queue(const devbuf_queue_t *queue);
// Frees the work items kept for reuse (and their dependency lists): for tests that count
// every host allocation.
void devbuf__work_pool_trim(void);

// A callback for when an event reaches a value: OK then, or the event's failure (or
// CANCELLED when the event goes first). Opens the gates of waits on the device
// (wait_item.c), so that no thread blocks for them.
typedef struct devbuf__event_watch {
  uint64_t value;
  void (*reached)(void *context, devbuf_status status);
  void *context;
  struct devbuf__event_watch *next;
} devbuf__event_watch;

struct devbuf_event {
  devbuf__refcount refs;
  pthread_mutex_t lock;
  pthread_cond_t reached;
  atomic_uint_least64_t value;
  size_t waiters; // under lock
  // Waits between their first look at the value and their last, and watches not yet called:
  // each counts itself here before it looks at the value, so a raise that reads 0 after
  // raising the value knows nobody needs the lock's wake-up (seq_cst on both sides).
  _Atomic uint32_t interest;
  devbuf_status failure; // under lock; OK while healthy
  // The value when the event failed (UINT64_MAX while healthy): raises after a failure no
  // longer count, so a later signaller cannot make a failed producer's wait succeed.
  atomic_uint_least64_t failed_at;
  atomic_bool failed;           // set once with failed_at, which may be UINT64_MAX itself
  char message[400];            // with "STATUS: " in front, within devbuf_last_error's 512 bytes
  devbuf__event_watch *watches; // under lock
  // Shared with other processes (event_share.c): the exporter publishes to it, an
  // importer's watcher mirrors it. Set once: by an export under the lock, by an import before
  // the event is handed out. NULL for most events.
  struct devbuf__event_share *_Atomic share;
  bool imported; // follows another process's event: set before an import hands it out
};

// Whether a wait for `wanted` is over and succeeded: the value reached it before any failure.
static inline bool devbuf__event_reached(const devbuf_event_t *event, uint64_t wanted) {
  return atomic_load_explicit(&event->value, memory_order_acquire) >= wanted &&
         wanted <= atomic_load_explicit(&event->failed_at, memory_order_acquire);
}

// ---- events shared with other processes (event_share.c) ----
// An exported event's change (value or failure) reaches its importers; caller holds the lock.
void devbuf__event_share_publish(devbuf_event_t *event);
// An exported event is raised to `value`: its page follows, without the event's lock.
void devbuf__event_share_raised(struct devbuf__event_share *share, uint64_t value);
// The event goes: importers learn the exporter's end, or this importer's watcher stops.
void devbuf__event_share_end(devbuf_event_t *event);
// Whether the event follows another process's, and so may not be signalled here.
static inline bool devbuf__event_is_imported(const devbuf_event_t *event) {
  return event->imported;
}
// INVALID_ARGUMENT for an imported event (its exporter signals it), OK otherwise.
devbuf_status devbuf__event_signallable(const devbuf_event_t *event);
// devbuf_event_wait on an imported event.
devbuf_status devbuf__event_share_wait(devbuf_event_t *event, uint64_t value, uint64_t timeout_ns);
// Something begins to wait on an imported event here: its watcher follows it closely again.
void devbuf__event_share_follow(devbuf_event_t *event);
// Brings an imported event up to its exporter's now.
void devbuf__event_share_sync(devbuf_event_t *event);

// Calls `reached` once the event reaches `value` (at once if it has), or fails.
devbuf_status devbuf__event_watch_value(devbuf_event_t *event, uint64_t value,
                                        void (*reached)(void *context, devbuf_status status),
                                        void *context);

// Raises the value (never lowers it) and wakes waiters.
void devbuf__event_raise(devbuf_event_t *event, uint64_t value);
// Marks the event failed with a status and message; every wait returns them from now on.
void devbuf__event_fail(devbuf_event_t *event, devbuf_status status, const char *message);
// Wakes the threads waiting for the event, so that they check their cancel flags.
void devbuf__event_interrupt(devbuf_event_t *event);
// Waits for `value` while `*cancel` stays false (NULL: never cancelled).
devbuf_status devbuf__event_wait(devbuf_event_t *event, uint64_t value, uint64_t timeout_ns,
                                 const atomic_bool *cancel);

// Runs a queue's WAIT item (wait_item.c): on the host, or where the device has gates
// (`device_queue` given), as a barrier on the device queue that the event value, its
// failure or cancel opens. Returns once the wait is over: OK when the value was reached,
// CANCELLED when cancel ended it, else the event's failure. *out_event: the driver event
// behind the barrier (NULL when none); the item keeps it, and retiring waits for it.
devbuf_status devbuf__wait_item_run(devbuf__work *work, devbuf_device_t *device, void *device_queue,
                                    void **out_event);
// Ends a running WAIT item's wait early (devbuf_queue_cancel, which has set work->cancel).
void devbuf__wait_item_cancel(devbuf__work *work);

#endif // DEVBUF_QUEUE_H
