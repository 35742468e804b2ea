// The base layer's interface, shared by every file of the library: errors, host memory, ids,
// files, byte copies, locks, checked arithmetic and reference counts (refcount.h). Not
// installed.
#ifndef DEVBUF_BASE_H
#define DEVBUF_BASE_H

#include "devbuf.h"
#include "refcount.h"

// Debug validators (CMake option DEVBUF_DEBUG_CHECKS): invariant checks and poison bytes.
#ifndef DEVBUF_DEBUG_CHECKS
#define DEVBUF_DEBUG_CHECKS 0
#endif

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#define DEVBUF_LIKELY(x)   __builtin_expect(!!(x), 1)
#define DEVBUF_UNLIKELY(x) __builtin_expect(!!(x), 0)

// ---- errors (status.c) ------------------------------------------------------------------
// Sets the thread's message (prefixed with the status name) and returns `status`. Never
// allocates. The library's own name for devbuf_set_error.
#define devbuf__error devbuf_set_error
// Empties the thread's message (before calling user code whose message we may report).
void devbuf__clear_error(void);
// A failure caused by the one the thread's message describes: the message becomes
// "STATUS: <what was being done>: <the cause's message>", so that it names both
// ("DEVICE_FAILURE: queue 3 on opencl:0 failed: allocating 64 MiB on opencl:0:
// OUT_OF_MEMORY: ..."). Returns `status`. Never allocates.
devbuf_status devbuf__error_cause(devbuf_status status, const char *format, ...)
    __attribute__((format(printf, 2, 3)));
// INVALID_ARGUMENT naming the first of `names` (", "-separated, one for each of `pointers`)
// whose pointer is NULL: "CALL: NAME is NULL" (without "CALL: " where `call` is "").
devbuf_status devbuf__null_argument(const char *call, const char *names,
                                    const void *const *pointers);
// Writes `head` then `cause` into `out` (of `size` bytes, terminated). Where both do not fit,
// the middle goes ("head...end of the cause"): a failure passed along a chain of queues and
// events gains a head at each hop, and its root cause, at the end, must survive them all.
// `out` overlaps neither.
void devbuf__join_message(char *out, size_t size, const char *head, const char *cause);
// `bytes` for a message: "100 bytes", "4 KiB", "1.5 MiB", "64 MiB".
const char *devbuf__bytes_text(uint64_t bytes, char text[32]);

// ---- host memory seam (host_alloc.c) ----------------------------------------------------
// Every host allocation the library makes for its own bookkeeping goes through here.
void *devbuf__malloc(size_t size);
void *devbuf__calloc(size_t count, size_t size);
void *devbuf__realloc(void *pointer, size_t size);
void devbuf__free(void *pointer);
#define DEVBUF__CACHE_LINE 64
// `size` bytes, zeroed, that start on a cache line and end on one, for records that two threads
// write: malloc packs records 16 bytes apart, and one thread's writes to a record then take the
// line of its neighbour's from the other thread's core. Freed with devbuf__free_lines.
void *devbuf__calloc_lines(size_t size);
void devbuf__free_lines(void *pointer);
// A new id, never 0 and never handed out before in this process (ids.c).
uint64_t devbuf__next_id(void);

// ---- sleepers that submissions do not wake (doze.c) -------------------------------------
// A worker whose submitters usually run its work themselves (a queue's, while threads in
// devbuf_queue_finish keep doing so) sleeps on a timer instead of being woken by each
// submission, which would make it race the finishing thread for the work. A thread about to
// block on the library's work calls devbuf__wait_begins first, so that work it waits for
// never waits out a timer: each dozer's `nudge` wakes it if it sleeps with work waiting.
typedef struct devbuf__dozer {
  void (*nudge)(struct devbuf__dozer *dozer); // called with the list's lock held
  struct devbuf__dozer *previous, *next;
} devbuf__dozer;
// A dozer about to sleep with work waiting reads devbuf__blocked_waiters after it raised
// devbuf__dozers_asleep and its own flag, a waiter reads devbuf__dozers_asleep after it
// raised devbuf__blocked_waiters (all sequentially consistent): the dozer takes its work at
// once, or the waiter nudges it.
extern atomic_uint devbuf__dozers_asleep;   // raised by each dozer as it sleeps on its timer
extern atomic_uint devbuf__blocked_waiters; // threads between devbuf__wait_begins and _ends
void devbuf__dozer_add(devbuf__dozer *dozer);
void devbuf__dozer_remove(devbuf__dozer *dozer); // once removed, no nudge runs on it
void devbuf__nudge_dozers_slow(void);
// Brackets a wait on the library's work (a work item, an event, a tracker, a device, room
// in a queue) that may sleep: from before it sleeps, or before a spin of more than a few
// checks.
static inline void devbuf__wait_begins(void) {
  atomic_fetch_add(&devbuf__blocked_waiters, 1);
  if (DEVBUF_UNLIKELY(atomic_load(&devbuf__dozers_asleep))) devbuf__nudge_dozers_slow();
}
static inline void devbuf__wait_ends(void) {
  atomic_fetch_sub_explicit(&devbuf__blocked_waiters, 1, memory_order_relaxed);
}

// ---- counters every thread writes (thread_line.c, barrier.c) ----------------------------
// A counter that all threads add to (a device's holds) is split over lines: each of the
// first DEVBUF__THREAD_LINES threads to ask owns a line for as long as it lives and adds to
// it with a plain load and store, no locked instruction and no cache line another thread
// writes. Threads beyond them, and a thread whose exit has begun, share one more line,
// DEVBUF__SHARED_LINE, with atomic additions. An exited thread's line passes to the next
// thread to ask (released, then acquired), its counts carrying on.
#define DEVBUF__THREAD_LINES 16
#define DEVBUF__SHARED_LINE  DEVBUF__THREAD_LINES
extern _Thread_local unsigned devbuf__thread_line_plus_one // 0: the thread has not asked
    __attribute__((tls_model("initial-exec")));
unsigned devbuf__thread_line_slow(void);
static inline unsigned devbuf__thread_line(void) {
  unsigned line = devbuf__thread_line_plus_one;
  return DEVBUF_LIKELY(line) ? line - 1 : devbuf__thread_line_slow();
}
static inline void devbuf__line_add(atomic_uint_least64_t *counter, unsigned line,
                                    memory_order order) {
  if (DEVBUF_LIKELY(line < DEVBUF__THREAD_LINES))
    atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + 1, order);
  else
    atomic_fetch_add_explicit(counter, 1, order);
}

// An asymmetric barrier, for a race between a store and a later load on each side (a
// Dekker pair) where one side runs for every buffer and the other seldom: the frequent
// side's store, devbuf__light_barrier, its load; the seldom side's store,
// devbuf__heavy_barrier, its load. Either side's load sees the other's store, or both do.
// The heavy barrier is a membarrier system call, which runs a full barrier on every thread
// of the process, so the light one need only keep the compiler from reordering. Where the
// kernel has no such call, devbuf__light_barrier_suffices is false, and the frequent side
// makes its store a sequentially consistent read-modify-write instead (its callers do).
extern bool devbuf__light_barrier_suffices;
static inline void devbuf__light_barrier(void) { atomic_signal_fence(memory_order_seq_cst); }
void devbuf__heavy_barrier(void);

// Records the library makes and drops for every buffer (storage records, buffer handles):
// each thread keeps up to DEVBUF__RECORD_CACHE_DEPTH freed ones of each kind for its next, so
// that the allocate/release path calls no malloc and no free. Not while host memory hooks are
// set (their allocations stay theirs), and not under AddressSanitizer (freed records stay
// poisoned). Contents uninitialised.
typedef enum devbuf__record_kind {
  DEVBUF__RECORD_STORAGE,
  DEVBUF__RECORD_BUFFER,
  DEVBUF__RECORD_KINDS,
} devbuf__record_kind;
#if defined(__SANITIZE_ADDRESS__)
#define DEVBUF__RECORD_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DEVBUF__RECORD_CACHE 0
#endif
#endif
#ifndef DEVBUF__RECORD_CACHE
#define DEVBUF__RECORD_CACHE 1
#endif
#define DEVBUF__RECORD_CACHE_DEPTH 32
typedef struct devbuf__record_cache {
  void *head[DEVBUF__RECORD_KINDS]; // each record's first word links to the next
  unsigned count[DEVBUF__RECORD_KINDS];
  bool registered; // with the key whose destructor empties the cache at thread exit
} devbuf__record_cache;
extern _Thread_local devbuf__record_cache devbuf__records
    __attribute__((tls_model("initial-exec")));
// Whether the program set host memory hooks (devbuf_set_host_memory_hooks; host_alloc.c).
extern atomic_bool devbuf__host_hooks_set;
void *devbuf__record_alloc_slow(devbuf__record_kind kind, size_t size);
void devbuf__record_free_slow(devbuf__record_kind kind, void *record);

// A record of the thread's cache, or NULL when it has none at hand (with no call, for paths
// that must stay free of calls).
static inline void *devbuf__record_take_cached(devbuf__record_kind kind) {
  void *record = DEVBUF__RECORD_CACHE ? devbuf__records.head[kind] : NULL;
  if (DEVBUF_LIKELY(record) &&
      !atomic_load_explicit(&devbuf__host_hooks_set, memory_order_relaxed)) {
    devbuf__records.head[kind] = *(void **)record;
    devbuf__records.count[kind]--;
    return record;
  }
  return NULL;
}

static inline void *devbuf__record_alloc(devbuf__record_kind kind, size_t size) {
  void *record = devbuf__record_take_cached(kind);
  return DEVBUF_LIKELY(record) ? record : devbuf__record_alloc_slow(kind, size);
}

// Whether the thread's cache takes a record back with no call.
static inline bool devbuf__record_cache_has_room(devbuf__record_kind kind) {
  return DEVBUF__RECORD_CACHE && DEVBUF_LIKELY(devbuf__records.registered) &&
         devbuf__records.count[kind] < DEVBUF__RECORD_CACHE_DEPTH &&
         !atomic_load_explicit(&devbuf__host_hooks_set, memory_order_relaxed);
}
// Puts a record in the thread's cache, which devbuf__record_cache_has_room said had room.
static inline void devbuf__record_put_cached(devbuf__record_kind kind, void *record) {
  *(void **)record = devbuf__records.head[kind];
  devbuf__records.head[kind] = record;
  devbuf__records.count[kind]++;
}

static inline void devbuf__record_free(devbuf__record_kind kind, void *record) {
  if (DEVBUF_LIKELY(record) && devbuf__record_cache_has_room(kind))
    devbuf__record_put_cached(kind, record);
  else
    devbuf__record_free_slow(kind, record);
}

// ---- fork (fork.c) ----------------------------------------------------------------------
// A layer's part in a fork: `prepare` takes the locks a child could meet (hooks run by
// ascending rank, so a lower rank's locks are the outer ones), `parent` gives them back,
// `child` gives them back in the child and resets what only the parent's threads use.
// Registered from constructors, before any thread of the library exists.
typedef struct devbuf__fork_hook {
  int rank;
  void (*prepare)(void);
  void (*parent)(void);
  void (*child)(void);
} devbuf__fork_hook;
void devbuf__fork_hook_add(const devbuf__fork_hook *hook);
// Registers a file's hook from a constructor (before any thread of the library exists).
#define DEVBUF__FORK_HOOK(rank_, prepare_, parent_, child_)                            \
  static const devbuf__fork_hook fork_hook = {                                         \
      .rank = (rank_), .prepare = (prepare_), .parent = (parent_), .child = (child_)}; \
  __attribute__((constructor)) static void fork_hook_init(void) {                      \
    devbuf__fork_hook_add(&fork_hook);                                                 \
  }
// Bumped in every forked child: work stamped with an older epoch is an ancestor's.
extern atomic_uint devbuf__process_epoch;
static inline unsigned devbuf__epoch(void) {
  return atomic_load_explicit(&devbuf__process_epoch, memory_order_relaxed);
}

// Two new ids at once: the returned one and the one after it. Each thread takes ids in
// blocks (of the epoch it took them in), so that making objects on many threads does not
// pass one counter's cache line between them.
typedef struct devbuf__id_block {
  uint64_t next, end;
  unsigned epoch;
} devbuf__id_block;
extern _Thread_local devbuf__id_block devbuf__ids __attribute__((tls_model("initial-exec")));
uint64_t devbuf__next_ids_slow(uint64_t count);
// Whether the thread's block has two ids at hand (of this process: a forked child's are
// its parent's).
static inline bool devbuf__id_pair_at_hand(void) {
  return DEVBUF_LIKELY(devbuf__ids.end - devbuf__ids.next >= 2 &&
                       devbuf__ids.epoch == devbuf__epoch());
}
// Takes them, with no call; only after devbuf__id_pair_at_hand said so.
static inline uint64_t devbuf__take_id_pair_at_hand(void) {
  uint64_t first = devbuf__ids.next;
  devbuf__ids.next = first + 2;
  return first;
}
static inline uint64_t devbuf__next_id_pair(void) {
  return devbuf__id_pair_at_hand() ? devbuf__take_id_pair_at_hand() : devbuf__next_ids_slow(2);
}

// ---- files (file_open.c) ----------------------------------------------------------------
// Opens a regular file for reading (IO_ERROR naming what it is otherwise, without blocking
// on a FIFO); its size at opening.
devbuf_status devbuf__open_regular_file(const char *path, int *out_fd, uint64_t *out_size);
// Reads exactly `size` bytes at `offset`: IO_ERROR if the file ends first (it shrank).
devbuf_status devbuf__read_at(int fd, void *out, size_t size, uint64_t offset, const char *path);

// Copies `size` bytes of host memory at the machine's bandwidth whatever the alignment of
// either side (copy_bytes.c); overlapping ranges behave like memmove.
void devbuf__copy_bytes(void *dst, const void *src, size_t size);
// Copies `size` bytes from file-mapped memory: IO_ERROR naming `what` when the source faults
// (its file was truncated while mapped) instead of a SIGBUS (fault_guard.c).
devbuf_status devbuf__guarded_copy(void *dst, const void *src, size_t size, const char *what);
// The same from bytes [offset, offset + size) of a mapped file's memory, whose token holds
// the file's descriptor + 1: a file cut inside a page faults nowhere (the rest of that page
// reads as zeros), so its size is asked too once the bytes are copied.
devbuf_status devbuf__guarded_file_copy(void *dst, const devbuf_memory_t *file, size_t offset,
                                        size_t size, const char *what);

// ---- other processes (process_share.c) ---------------------------------------------------
// A memory file of `size` bytes (memfd, close-on-exec), sealed against shrinking and growing:
// memory another process maps from its descriptor. OUT_OF_MEMORY or IO_ERROR with the reason.
devbuf_status devbuf__memory_file_create(const char *name, size_t size, int *out_fd);
// Seals it for good; with `read_only_elsewhere` no new writable mapping can be made of it
// (the caller's own, made before, stays writable).
devbuf_status devbuf__memory_file_seal(int fd, bool read_only_elsewhere);
// A memory file another process handed over: a regular file sealed against shrinking, of at
// least `size` bytes, or FORMAT_ERROR naming what it is.
devbuf_status devbuf__memory_file_check(int fd, size_t size, const char *what);
void devbuf__close_fds(const int *fds, size_t count); // skipping negative ones
// A lease: a lock on a small file that lives as long as the holder's descriptor of it (or a
// child's copy) does, and so ends when the holder closes it or dies, which the kernel sees to.
// *out_hold holds the lock: give it to the process that uses something; keep *out_watch, a
// descriptor of your own, to ask whether anyone still holds it.
devbuf_status devbuf__lease_create(int *out_hold, int *out_watch);
bool devbuf__lease_held(int watch);
// The same lock on an open of its own (close-on-exec) of `file`: held while this process
// keeps the descriptor, so that others holding `file` see it end with the process, or with
// its exec. Any other open of the file asks with devbuf__lease_held.
devbuf_status devbuf__lock_reopened(int file, int *out_locked);
// One message of `size` bytes (at least one when descriptors go) with `fd_count` descriptors
// on a Unix socket (SCM_RIGHTS). *out_fds_sent (optional): whether the descriptors went,
// also when a later part of the bytes failed.
devbuf_status devbuf__send_with_fds(int socket, const void *bytes, size_t size, const int *fds,
                                    size_t fd_count, bool *out_fds_sent);
// Exactly `size` bytes and the descriptors that came with them (close-on-exec, at most
// `max_fds`; more, or a cut message, is FORMAT_ERROR with every descriptor closed). IO_ERROR
// when the peer closed the socket or the call failed (a timeout the socket has set included).
devbuf_status devbuf__receive_with_fds(int socket, void *bytes, size_t size, int *fds,
                                       size_t max_fds, size_t *out_fd_count);
// Futex waits on words in memory shared between processes. A wait returns when a word is no
// longer as expected, on a wake, or after `timeout_ns` (spuriously too).
void devbuf__shared_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns);
void devbuf__shared_wait_either(_Atomic uint32_t *first, uint32_t first_expected,
                                _Atomic uint32_t *second, uint32_t second_expected,
                                uint64_t timeout_ns);
void devbuf__shared_wake(_Atomic uint32_t *word);
// A descriptor that watches process `pid` end (a pidfd, close-on-exec; -1 with errno where
// the kernel has none), whether the process still runs (a zombie does not), and whether a
// descriptor is such a watch (*out_pid: its process; -1 once reaped, 0 where not shown).
int devbuf__process_watch(int pid);
bool devbuf__process_alive(int watch);
bool devbuf__is_process_watch(int fd, int *out_pid);

// ---- locks ------------------------------------------------------------------------------
// Every lock of the library is held for a few instructions: an adaptive mutex spins a little
// before it sleeps, so a short wait never costs two system calls.
void devbuf__mutex_init(pthread_mutex_t *mutex);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
#define DEVBUF__MUTEX_INITIALIZER PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
#else
#define DEVBUF__MUTEX_INITIALIZER PTHREAD_MUTEX_INITIALIZER
#endif

// A lock for the few instructions of the hot paths (a submission's bookkeeping, the item
// pool): taking it is one atomic exchange and giving it back a plain store, where a mutex
// takes two atomic instructions and a call each way. A waiter spins a little, then yields
// the core (the holder may have been preempted).
typedef struct devbuf__spinlock {
  atomic_bool held;
} devbuf__spinlock;
#define DEVBUF__SPINLOCK_INITIALIZER \
  { false }

// One step of a busy wait: tells the core that this thread spins.
static inline void devbuf__cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

// Fetches the cache line at `address` for writing, without waiting for it: a line that
// another core holds moves here once, where a read prefetch would share it and the write
// then take it again. (x86's prefetchw is a no-op on processors without it.)
static inline void devbuf__prefetch_for_write(const void *address) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ __volatile__("prefetchw %0" : : "m"(*(const char *)address));
#else
  __builtin_prefetch(address, 1);
#endif
}

// Fetches the lines of `bytes` from `address` for writing (devbuf__prefetch_for_write).
static inline void devbuf__prefetch_bytes_for_write(const void *address, size_t bytes) {
  const char *first = address;
  for (size_t at = 0; at < bytes; at += 64) devbuf__prefetch_for_write(first + at);
  devbuf__prefetch_for_write(first + bytes - 1); // the last line, where `address` is unaligned
}

static inline void devbuf__spin_lock(devbuf__spinlock *lock) {
  while (atomic_exchange_explicit(&lock->held, true, memory_order_acquire)) {
    for (unsigned spins = 0; atomic_load_explicit(&lock->held, memory_order_relaxed); spins++) {
      if (spins < 64) {
        devbuf__cpu_pause();
      } else {
        sched_yield();
      }
    }
  }
}

static inline void devbuf__spin_unlock(devbuf__spinlock *lock) {
  atomic_store_explicit(&lock->held, false, memory_order_release);
}

// Nanoseconds of the monotonic clock.
static inline uint64_t devbuf__now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

// A condition variable whose timed waits count on the monotonic clock, and such a wait's
// deadline `timeout_ns` from now.
void devbuf__cond_init_monotonic(pthread_cond_t *cond);
static inline struct timespec devbuf__deadline_after(uint64_t timeout_ns) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  uint64_t total = (uint64_t)now.tv_nsec + timeout_ns % 1000000000u;
  now.tv_sec += (time_t)(timeout_ns / 1000000000u + total / 1000000000u);
  now.tv_nsec = (long)(total % 1000000000u);
  return now;
}

// ---- checked arithmetic -----------------------------------------------------------------
static inline bool devbuf__mul_overflows(size_t a, size_t b, size_t *out) {
  return __builtin_mul_overflow(a, b, out);
}

static inline bool devbuf__add_overflows(size_t a, size_t b, size_t *out) {
  return __builtin_add_overflow(a, b, out);
}

// Bytes per element of each dtype; 0 for those of fewer bits than a byte (dtype.c).
extern const uint8_t devbuf__dtype_whole_bytes[DEVBUF_DTYPE_COUNT];
// The bytes of one dimension of `extent` elements of a whole-byte dtype that stay within
// INT64_MAX (as every buffer's must); false for anything else, which the general
// devbuf__shape_bytes decides (core.h).
static inline bool devbuf__one_dimension_bytes(devbuf_dtype dtype, size_t extent, size_t *out) {
  size_t element = (unsigned)dtype < DEVBUF_DTYPE_COUNT ? devbuf__dtype_whole_bytes[dtype] : 0;
  return element && !devbuf__mul_overflows(extent, element, out) && *out <= (uint64_t)INT64_MAX;
}

// The alignment a typed pointer to elements of `dtype` needs, as C and numpy have it: the
// element's bytes (at most 16), a complex number's part's (C's float _Complex is 4-aligned);
// 1 for sub-byte elements, which are addressed as bytes.
static inline size_t devbuf__dtype_alignment(devbuf_dtype dtype) {
  if (dtype == DEVBUF_COMPLEX64) return 4;
  size_t element = (unsigned)dtype < DEVBUF_DTYPE_COUNT ? devbuf__dtype_whole_bytes[dtype] : 0;
  return element > 16 ? 16 : element ? element : 1;
}

// Raises an atomic maximum to `value` (statistics' peaks).
static inline void devbuf__raise_peak(atomic_uint_least64_t *peak, uint64_t value) {
  uint64_t seen = atomic_load_explicit(peak, memory_order_relaxed);
  while (seen < value && !atomic_compare_exchange_weak_explicit(
                             peak, &seen, value, memory_order_relaxed, memory_order_relaxed)) {
  }
}

#endif // DEVBUF_BASE_H
