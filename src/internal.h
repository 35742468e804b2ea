// Internal layouts and interfaces shared by devbuf's source files. Not installed.
//
// Layers, each in its own files, each talking only to the one below:
//   buffer*.c           handles, views, host access, copies, mapped files
//   storage.c           shared, refcounted memory of a buffer; lazy allocation
//   allocator*.c        the allocator object, caching allocator, adaptors
//   device.c            device registry and spec parsing
//   backend_*.c         one vtable per device kind: raw memory, copies
#ifndef DEVBUF_INTERNAL_H
#define DEVBUF_INTERNAL_H

#include "devbuf.h"
#include "base/refcount.h"

// Debug validators (CMake option DEVBUF_DEBUG_CHECKS): invariant checks and poison bytes.
#ifndef DEVBUF_DEBUG_CHECKS
#define DEVBUF_DEBUG_CHECKS 0
#endif

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#define DEVBUF_LIKELY(x) __builtin_expect(!!(x), 1)
#define DEVBUF_UNLIKELY(x) __builtin_expect(!!(x), 0)

// ---- errors (status.c) ------------------------------------------------------------------
// Sets the thread's message (prefixed with the status name) and returns `status`. Never
// allocates. The library's own name for devbuf_set_error.
#define devbuf__error devbuf_set_error
// Empties the thread's message (before calling user code whose message we may report).
void devbuf__clear_error(void);

// ---- host memory seam (host_alloc.c) ----------------------------------------------------
// Every host allocation the library makes for its own bookkeeping goes through here.
void *devbuf__malloc(size_t size);
void *devbuf__calloc(size_t count, size_t size);
void *devbuf__realloc(void *pointer, size_t size);
void devbuf__free(void *pointer);
// A new id, never 0 and never handed out before in this process (ids.c).
uint64_t devbuf__next_id(void);

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
#define DEVBUF__SPINLOCK_INITIALIZER {false}

static inline void devbuf__spin_lock(devbuf__spinlock *lock) {
  while (atomic_exchange_explicit(&lock->held, true, memory_order_acquire)) {
    for (unsigned spins = 0; atomic_load_explicit(&lock->held, memory_order_relaxed); spins++) {
      if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        sched_yield();
      }
    }
  }
}

static inline void devbuf__spin_unlock(devbuf__spinlock *lock) {
  atomic_store_explicit(&lock->held, false, memory_order_release);
}

// ---- checked arithmetic -----------------------------------------------------------------
static inline bool devbuf__mul_overflows(size_t a, size_t b, size_t *out) {
  return __builtin_mul_overflow(a, b, out);
}
static inline bool devbuf__add_overflows(size_t a, size_t b, size_t *out) {
  return __builtin_add_overflow(a, b, out);
}

// Raises an atomic maximum to `value` (statistics' peaks).
static inline void devbuf__raise_peak(atomic_uint_least64_t *peak, uint64_t value) {
  uint64_t seen = atomic_load_explicit(peak, memory_order_relaxed);
  while (seen < value &&
         !atomic_compare_exchange_weak_explicit(peak, &seen, value, memory_order_relaxed, memory_order_relaxed)) {
  }
}

// ---- backends (backend_*.c) -------------------------------------------------------------
typedef struct devbuf__work devbuf__work;

// A program built for a device (devbuf_program_build): the backend's object, shared.
struct devbuf_program {
  devbuf__refcount refs;
  devbuf_device_t *device; // retained
  void *backend_program;   // the backend's cached build
};

// A backend never sees buffers: only raw memory. Optional entries may be NULL.
typedef struct devbuf__backend {
  const char *name;        // "cpu", "opencl", "cuda"
  devbuf_device_kind kind;
  // Fills device->name, page_size, host_accessible, backend_state for device `index`.
  // UNAVAILABLE with the reason when the driver or device is missing.
  devbuf_status (*open)(devbuf_device_t *device, int index);
  void (*close)(devbuf_device_t *device); // (optional)
  devbuf_status (*raw_alloc)(devbuf_device_t *device, devbuf_memory_kind kind, size_t size, devbuf_memory_t *out);
  void (*raw_free)(devbuf_device_t *device, const devbuf_memory_t *memory);
  // (optional, all four or none) Address space for growable segments: reserve `size`
  // bytes of addresses with no memory behind them (out->size may come back smaller), put
  // memory behind [offset, offset + size) of a reservation, take back exactly such a range,
  // give the reservation back once nothing is mapped in it.
  devbuf_status (*raw_reserve)(devbuf_device_t *device, size_t size, devbuf_memory_t *out);
  devbuf_status (*raw_map)(devbuf_device_t *device, const devbuf_memory_t *reservation, size_t offset, size_t size);
  void (*raw_unmap)(devbuf_device_t *device, const devbuf_memory_t *reservation, size_t offset, size_t size);
  void (*raw_unreserve)(devbuf_device_t *device, const devbuf_memory_t *reservation);
  // Copies between host memory and device memory, and within the device. `offset` is
  // in bytes from the start of the memory. Ranges of one memory may overlap (memmove).
  devbuf_status (*write)(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                         const void *src, size_t size);
  devbuf_status (*read)(devbuf_device_t *device, const devbuf_memory_t *src, size_t offset,
                        void *dst, size_t size);
  devbuf_status (*copy)(devbuf_device_t *device, const devbuf_memory_t *dst, size_t dst_offset,
                        const devbuf_memory_t *src, size_t src_offset, size_t size);
  // Fills `size` bytes at `offset` with zero.
  devbuf_status (*zero)(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                        size_t size);
  devbuf_status (*synchronize)(devbuf_device_t *device); // (optional)
  // Queues of devices whose work is not run by the CPU (optional, all or none): a device
  // queue made with the devbuf queue; the execution of an item (fill, copy, launch, wait
  // for an event) on it, which waits for the item's dependencies (on the device where it
  // can, leaving the driver's event in work->device_event for items that depend on it) and
  // returns once the item has completed; the release of such an event; and waking a wait
  // item that devbuf_queue_cancel cancels.
  devbuf_status (*queue_create)(devbuf_device_t *device, void **out_queue);
  void (*queue_destroy)(devbuf_device_t *device, void *queue);
  devbuf_status (*run)(devbuf_device_t *device, void *queue, devbuf__work *work);
  // (optional) With it, run may return once an item is enqueued: before items retire, this
  // waits until they have completed and sets the status of those that failed on the device
  // (returning the first such failure, its message set).
  devbuf_status (*complete)(devbuf_device_t *device, void *queue, devbuf__work **items, size_t count);
  void (*event_release)(devbuf_device_t *device, void *event);
  void (*cancel_wait)(devbuf_device_t *device, void *queue);
  // Programs (optional): build (cached by source and options), release, and whether a
  // kernel of that name exists.
  devbuf_status (*program_build)(devbuf_device_t *device, const char *source, const char *options,
                                 void **out_program);
  void (*program_release)(devbuf_device_t *device, void *program);
  devbuf_status (*program_has_kernel)(devbuf_device_t *device, void *program, const char *name);
} devbuf__backend;

extern const devbuf__backend devbuf__backend_cpu;
extern const devbuf__backend devbuf__backend_opencl;
extern const devbuf__backend devbuf__backend_cuda;

// ---- devices (device.c) -----------------------------------------------------------------
struct devbuf_device {
  devbuf__refcount refs;               // external references; 0 destroys (under registry lock)
  // devbuf_device_release, given as data by core/device.c: layers below the devices (the
  // allocators) keep a device alive without calling into the core layer.
  void (*release)(devbuf_device_t *device);
  const devbuf__backend *backend;
  int index;                           // N of "kind:N"
  char spec[32];                       // canonical spec, e.g. "cpu"
  char name[128];                      // filled by the backend
  size_t page_size;                    // granularity of large blocks, a power of two
  bool host_accessible;                // device memory has a CPU address
  char version[96];                    // the driver's version text ("OpenCL 3.0 PoCL ...")
  uint64_t global_memory, max_allocation;
  size_t alignment;                    // of allocations and of views passed to kernels
  bool unified_memory;                 // device and host share physical memory
  bool managed_memory;                 // the device has CUDA managed memory
  uint64_t svm_capabilities;           // OpenCL SVM bits; 0 where there is no SVM
  devbuf_allocator_t *allocator;       // the device's caching allocator (embedded)
  devbuf_allocator_t *host_allocator;  // host-visible memory (the same as `allocator` when
                                       // device memory is host-accessible)
  devbuf_allocator_t *managed_allocator; // managed memory; NULL without it
  bool memory_handles;                 // memory.device is a handle and memory.offset applies
                                       // (OpenCL cl_mem); elsewhere an address
  atomic_uint_least64_t mapped_bytes;  // bytes of live file mappings on this device
  void *backend_state;                 // owned by the backend
  struct devbuf_device *next_open;     // registry list
  atomic_uint_least64_t pending_work;  // submitted work items not completed, all queues
  atomic_size_t sync_waiters;          // threads in devbuf_device_synchronize
  pthread_mutex_t work_lock;           // with work_idle: synchronize's wait
  pthread_cond_t work_idle;
  devbuf__spinlock submit_lock;        // one submission at a time records its uses (queue.c)
};

// A reference to a device for the layers below it (see `release` above).
static inline devbuf_device_t *devbuf__device_keep(devbuf_device_t *device) {
  devbuf__ref_retain(&device->refs);
  return device;
}
static inline void devbuf__device_drop(devbuf_device_t *device) { device->release(device); }

// ---- allocators (allocator.c and friends) -----------------------------------------------
typedef struct devbuf__allocator_ops {
  const char *kind;
  devbuf_status (*alloc)(devbuf_allocator_t *self, size_t size, devbuf_memory_t *out);
  void (*free)(devbuf_allocator_t *self, const devbuf_memory_t *memory);
  void (*destroy)(devbuf_allocator_t *self);
  // (optional) A kind that keeps its own statistics; otherwise the front end counts.
  void (*stats)(devbuf_allocator_t *self, devbuf_allocator_stats_t *out);
  void (*reset_peak)(devbuf_allocator_t *self); // (optional, with stats)
  void (*clear_cache)(devbuf_allocator_t *self); // (optional)
  // (optional, all four or none) Address space for growable segments, as the backend's
  // raw_reserve, raw_map, raw_unmap and raw_unreserve.
  devbuf_status (*reserve)(devbuf_allocator_t *self, size_t size, devbuf_memory_t *out);
  devbuf_status (*map)(devbuf_allocator_t *self, const devbuf_memory_t *reservation, size_t offset, size_t size);
  void (*unmap)(devbuf_allocator_t *self, const devbuf_memory_t *reservation, size_t offset, size_t size);
  void (*unreserve)(devbuf_allocator_t *self, const devbuf_memory_t *reservation);
} devbuf__allocator_ops;

// Counters the front end keeps for allocators without their own statistics.
typedef struct devbuf__counters {
  atomic_uint_least64_t active, peak, live, allocs, frees, failed, calls;
} devbuf__counters;

// How an allocator relates to its device's lifetime.
typedef enum devbuf__device_link {
  // Holds a reference to the device (allocators users create).
  DEVBUF__HOLDS_DEVICE,
  // Part of the device: retain/release go to the device, so a reference to the device's
  // allocator keeps the device, and so the allocator, alive. The device destroys it.
  DEVBUF__EMBEDDED,
  // Owned by an embedded allocator; the device outlives it.
  DEVBUF__BORROWS_DEVICE,
} devbuf__device_link;

struct devbuf_allocator {
  devbuf__refcount refs;
  const devbuf__allocator_ops *ops;
  devbuf_device_t *device;
  devbuf__device_link link;
  devbuf_memory_kind memory_kind;      // what its memory is (raw allocators decide; others inherit)
  devbuf__counters counters;
};

// Initialises the common part; retains `device` for DEVBUF__HOLDS_DEVICE.
void devbuf__allocator_init(devbuf_allocator_t *allocator, const devbuf__allocator_ops *ops,
                            devbuf_device_t *device, devbuf__device_link link);
// Destroys an allocator regardless of its count (devices destroying their own).
void devbuf__allocator_destroy(devbuf_allocator_t *allocator);
// The raw allocator of a device's backend. With `borrow_device` it holds no reference to
// the device (for the device's own caching allocator).
devbuf_status devbuf__raw_allocator_create(devbuf_device_t *device, devbuf_memory_kind kind, bool borrow_device,
                                           devbuf_allocator_t **out);
// Whether the CPU can address the memory of `allocator`.
static inline bool devbuf__allocator_host_accessible(const devbuf_allocator_t *allocator) {
  return allocator->device->host_accessible || allocator->memory_kind != DEVBUF_MEMORY_DEVICE;
}
// A caching allocator that takes over the caller's reference to `upstream`.
devbuf_status devbuf__caching_allocator_create(devbuf_allocator_t *upstream,
                                               const devbuf_caching_options_t *options,
                                               devbuf__device_link link, devbuf_allocator_t **out);

// Memory released while submitted work may still use it (B10), in the caching allocator
// (src/caching/). Its bytes go back to the cache at once, marked in flight under an opaque
// `fence` of the releaser's: host allocations never get them, allocations for work may.
typedef struct devbuf__in_flight devbuf__in_flight;
bool devbuf__is_caching(const devbuf_allocator_t *allocator);
// Frees `memory` (from this caching allocator) in flight; *out_range names the range until
// devbuf__caching_fence_done. OUT_OF_MEMORY without host memory for the record: the
// caller then keeps the memory until its work is done.
devbuf_status devbuf__caching_free_in_flight(devbuf_allocator_t *allocator, const devbuf_memory_t *memory,
                                             void *fence, devbuf__in_flight **out_range);
// The fence's work completed: its bytes are free for everyone.
void devbuf__caching_fence_done(devbuf_allocator_t *allocator, devbuf__in_flight *range);
// An allocation for work that will be ordered after the work using what it reuses: it may
// take bytes released in flight. For each in-flight range it overlaps, `visit` is called
// (under the allocator's lock, so the fence is alive) with the fence and the overlap in the
// fence's own byte offsets; a false answer makes it allocate bytes no work uses instead.
devbuf_status devbuf__caching_snapshot(devbuf_allocator_t *allocator, devbuf_allocator_snapshot_t **out);
void devbuf__caching_snapshot_free(devbuf_allocator_snapshot_t *snapshot);
devbuf_status devbuf__caching_alloc_ordered(devbuf_allocator_t *allocator, size_t size,
                                            bool (*visit)(void *context, void *fence, size_t offset, size_t size),
                                            void *context, devbuf_memory_t *out);

// ---- storage and buffers (storage.c, buffer*.c) -----------------------------------------
typedef enum devbuf__storage_state {
  DEVBUF__UNALLOCATED = 0,
  DEVBUF__ALLOCATED = 1,
} devbuf__storage_state;

// One open host access: which handle opened it, on which bytes, for what.
typedef struct devbuf__host_access {
  const devbuf_buffer_t *handle;
  const void *data;
  size_t offset, size;     // bytes within the storage
  bool write;
  struct devbuf__host_access *next;
} devbuf__host_access;

typedef struct devbuf__storage {
  devbuf__refcount refs;               // handles that use it
  uint64_t id;                         // the storage id shared by all views
  devbuf_allocator_t *allocator;       // NULL for mapped files
  devbuf_device_t *device;             // retained
  size_t size;                         // bytes
  uint32_t flags;                      // DEVBUF_BUFFER_* given at creation
  bool read_only, mapped;
  // Memory that no allocator owns (mapped files, DLPack imports) is given back by this,
  // with `external`, when the storage goes.
  void (*release_external)(struct devbuf__storage *storage);
  void *external;
  atomic_int state;                    // devbuf__storage_state; ALLOCATED is final
  devbuf_memory_t memory;              // valid once state is ALLOCATED
  pthread_mutex_t lock;                // lazy allocation, host-access list, hazard creation
  struct devbuf__hazard *_Atomic hazard; // in-flight work on the memory; made on first submission
  devbuf__in_flight *in_flight;        // once released in flight to a caching allocator
  // Work of earlier owners of reused bytes (retained, ordering only): every submission
  // waits for what of it has not completed, host access waits for all of it. Read and
  // written under the tracker's lock, which exists whenever this is non-empty.
  struct devbuf__fence **inherited;
  size_t inherited_count, inherited_capacity;
  devbuf__host_access *accesses;       // open host accesses
  atomic_size_t open_accesses;         // length of `accesses` (read without the lock)
} devbuf__storage;

// Whether the CPU can address the storage's memory.
static inline bool devbuf__storage_host_accessible(const devbuf__storage *storage) {
  return storage->allocator ? devbuf__allocator_host_accessible(storage->allocator) : storage->device->host_accessible;
}

struct devbuf_buffer {
  devbuf__refcount refs;
  uint64_t handle_id;
  devbuf__storage *storage;            // one reference held per handle
  size_t offset, size;                 // bytes within the storage
  devbuf_dtype dtype;
  size_t ndim;
  size_t shape[DEVBUF_MAX_NDIM];
};

devbuf_status devbuf__storage_create(devbuf_allocator_t *allocator, devbuf_device_t *device,
                                     size_t size, uint32_t flags, devbuf__storage **out);
void devbuf__storage_release(devbuf__storage *storage);
devbuf_status devbuf__storage_ensure_allocated(devbuf__storage *storage);
// For submitted work: may reuse memory whose earlier work is still pending (ordered after it).
devbuf_status devbuf__storage_ensure_allocated_for_work(devbuf__storage *storage);
// The storage's hazard tracker, made if needed; NULL when out of memory. Caller holds storage->lock.
struct devbuf__hazard *devbuf__storage_hazard_locked(devbuf__storage *storage);
// What a host operation does about submitted work on its bytes that was submitted through
// this storage. (Work of a previous owner of reused memory is always waited for.)
typedef enum devbuf__own_work {
  DEVBUF__OWN_REFUSE, // answer IN_USE
  DEVBUF__OWN_WAIT,   // wait for it to complete
  DEVBUF__OWN_IGNORE, // the caller orders itself (unsynchronized_ptr)
} devbuf__own_work;

// Bytes [offset, offset + size) of a storage that a host operation reads or writes.
typedef struct devbuf__byte_range {
  size_t offset, size;
  bool write;
} devbuf__byte_range;

// Waits until no submitted work conflicts with host access to any of `count` ranges of the
// storage (any work for a written range, writing work for a read one), treating the
// storage's own work as `own` says. On success it returns holding storage->lock and, when
// the storage has a tracker, its lock too (*out_hazard; NULL otherwise): submissions that
// find no open host access take only the tracker's lock, so opening an access must hold
// it. Release both with devbuf__storage_unlock.
devbuf_status devbuf__storage_lock_idle(devbuf__storage *storage, const devbuf__byte_range *ranges, size_t count,
                                        devbuf__own_work own, const char *what, struct devbuf__hazard **out_hazard);
void devbuf__storage_unlock(devbuf__storage *storage, struct devbuf__hazard *hazard);
// A host operation on `count` ranges of one storage (a copy between two of its views reads
// one and writes the other) that runs while no submitted work conflicts and no other host
// access does, and that submissions must not race with while it runs: opens one access
// record per range at once, waiting for work first. The ranges may overlap each other.
// Close each with devbuf__host_operation_end.
devbuf_status devbuf__host_operation_begin(devbuf__storage *storage, const devbuf__byte_range *ranges, size_t count,
                                           const char *what, devbuf__host_access **out_accesses);
void devbuf__host_operation_end(devbuf__storage *storage, devbuf__host_access *access);
// Whether submitted work uses any of storage bytes [offset, offset + size).
bool devbuf__storage_in_use(devbuf__storage *storage, size_t offset, size_t size);
// Waits until no submitted work uses storage bytes [offset, offset + size).
void devbuf__storage_wait_unused(devbuf__storage *storage, size_t offset, size_t size);
// A new handle on `storage` (taking over one storage reference).
devbuf_status devbuf__buffer_wrap(devbuf__storage *storage, size_t offset, size_t size,
                                  devbuf_dtype dtype, const size_t *shape, size_t ndim,
                                  devbuf_buffer_t **out);
// Byte size of `ndim` dims of `dtype`; OVERFLOW / INVALID_ARGUMENT with a message.
devbuf_status devbuf__shape_bytes(devbuf_dtype dtype, const size_t *shape, size_t ndim,
                                  size_t *out_bytes, size_t *out_count);

// HOST_ACCESS_OPEN if a host access conflicts with an operation on storage bytes
// [offset, offset + size) (a write conflicts with any access, a read with write access).
// Caller holds storage->lock.
devbuf_status devbuf__check_host_conflicts(devbuf__storage *storage, size_t offset, size_t size, bool write,
                                           const char *what);

#endif // DEVBUF_INTERNAL_H
