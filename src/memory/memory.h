// The memory layer's interface: allocator objects, the caching allocator's entry points for
// the layers above (memory released in flight, ordered allocations, snapshots). Not
// installed.
#ifndef DEVBUF_MEMORY_H
#define DEVBUF_MEMORY_H

#include "../backend/backend.h"

// A range of memory released in flight, the allocator's own record (opaque above it).
typedef struct devbuf__in_flight devbuf__in_flight;
// Told of each in-flight range an ordered allocation overlaps: the range's fence and the
// overlap in the fence's own byte offsets; false makes it take bytes no work uses instead.
typedef bool (*devbuf__in_flight_visit)(void *context, void *fence, size_t offset, size_t size);

typedef struct devbuf__allocator_ops {
  const char *kind;
  // An adaptor that hands out its upstream's memory as it is (statistics, faults): a free
  // through it is checked where the memory came from.
  bool passes_memory;
  devbuf_status (*alloc)(devbuf_allocator_t *self, size_t size, devbuf_memory_t *out);
  void (*free)(devbuf_allocator_t *self, const devbuf_memory_t *memory);
  void (*destroy)(devbuf_allocator_t *self);
  // (optional) A kind that keeps its own statistics; otherwise the front end counts.
  void (*stats)(devbuf_allocator_t *self, devbuf_allocator_stats_t *out);
  void (*reset_peak)(devbuf_allocator_t *self);  // (optional, with stats)
  void (*clear_cache)(devbuf_allocator_t *self); // (optional)
  // (optional, all four or none) Address space for growable segments, as the backend's
  // raw_reserve, raw_map, raw_unmap and raw_unreserve.
  devbuf_status (*reserve)(devbuf_allocator_t *self, size_t size, devbuf_memory_t *out);
  devbuf_status (*map)(devbuf_allocator_t *self, const devbuf_memory_t *reservation, size_t offset,
                       size_t size);
  void (*unmap)(devbuf_allocator_t *self, const devbuf_memory_t *reservation, size_t offset,
                size_t size);
  void (*unreserve)(devbuf_allocator_t *self, const devbuf_memory_t *reservation);
  // (optional, all three or none) Memory released while submitted work may still use it
  // (docs/allocator.md, "Memory released while work uses it"): the caching allocator has
  // them, and adaptors forward them to an upstream that has them, so that wrapping a cache
  // keeps the reuse. Called through devbuf__allocator_free_in_flight and its siblings below.
  devbuf_status (*free_in_flight)(devbuf_allocator_t *self, const devbuf_memory_t *memory,
                                  void *fence, devbuf__in_flight **out_range);
  void (*fence_done)(devbuf_allocator_t *self, devbuf__in_flight *range);
  devbuf_status (*alloc_ordered)(devbuf_allocator_t *self, size_t size,
                                 devbuf__in_flight_visit visit, void *context,
                                 devbuf_memory_t *out);
  // (optional) The picture of its segments and blocks (devbuf_allocator_snapshot): the
  // caching allocator's, forwarded by adaptors.
  devbuf_status (*snapshot)(devbuf_allocator_t *self, devbuf_allocator_snapshot_t **out);
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
  devbuf_memory_kind memory_kind; // what its memory is (raw allocators decide; others inherit)
  devbuf__counters counters;
};

// devbuf__allocator_alloc_known and devbuf__allocator_free_known, for callers whose
// arguments are known good, are inline: allocator_hot.h.

// Initialises the common part; retains `device` for DEVBUF__HOLDS_DEVICE.
void devbuf__allocator_init(devbuf_allocator_t *allocator, const devbuf__allocator_ops *ops,
                            devbuf_device_t *device, devbuf__device_link link);
// Destroys an allocator regardless of its count (devices destroying their own).
void devbuf__allocator_destroy(devbuf_allocator_t *allocator);
// The raw allocator of a device's backend. With `borrow_device` it holds no reference to
// the device (for the device's own caching allocator).
devbuf_status devbuf__raw_allocator_create(devbuf_device_t *device, devbuf_memory_kind kind,
                                           bool borrow_device, devbuf_allocator_t **out);
// Whether the CPU can address the memory of `allocator`.
static inline bool devbuf__allocator_host_accessible(const devbuf_allocator_t *allocator) {
  return allocator->device->host_accessible ||
         allocator->memory_kind == DEVBUF_MEMORY_HOST_VISIBLE ||
         allocator->memory_kind == DEVBUF_MEMORY_MANAGED;
}
// A caching allocator that takes over the caller's reference to `upstream`.
devbuf_status devbuf__caching_allocator_create(devbuf_allocator_t *upstream,
                                               const devbuf_caching_options_t *options,
                                               devbuf__device_link link, devbuf_allocator_t **out);

// Memory released while submitted work may still use it: its bytes go back at once, marked
// in flight under an opaque `fence` of the releaser's; host allocations never get them,
// allocations for work may (docs/allocator.md, "Memory released while work uses it").
// Whether `allocator` (or the allocator it wraps) can.
static inline bool devbuf__allocator_reuses_in_flight(const devbuf_allocator_t *allocator) {
  return allocator->ops->free_in_flight != NULL;
}
// Frees `memory` in flight (counted as a free); *out_range names the range until
// devbuf__allocator_fence_done. OUT_OF_MEMORY without host memory for the record: the
// caller then keeps the memory until its work is done.
devbuf_status devbuf__allocator_free_in_flight(devbuf_allocator_t *allocator,
                                               const devbuf_memory_t *memory, void *fence,
                                               devbuf__in_flight **out_range);
// The fence's work completed: its bytes are free for everyone.
void devbuf__allocator_fence_done(devbuf_allocator_t *allocator, devbuf__in_flight *range);
// An allocation for work that will be ordered after the work using what it reuses: it may
// take bytes released in flight, and `visit` is told of each in-flight range it overlaps
// (under the allocator's lock, so the fence is alive).
devbuf_status devbuf__allocator_alloc_ordered(devbuf_allocator_t *allocator, size_t size,
                                              devbuf__in_flight_visit visit, void *context,
                                              devbuf_memory_t *out);
// The page the backend maps growable segments in, where `allocator`'s maps reach it (a
// device's raw allocator, through adaptors that pass memory as it is); 0 where a user's
// allocator maps them, in pages of its own.
size_t devbuf__allocator_map_page(const devbuf_allocator_t *allocator);
// The common part of every adaptor (allocator_adaptors.c, allocator_trace.c): an allocator
// over an upstream it holds a reference to, with its kind's operations as devbuf__adaptor_ops
// made them.
typedef struct devbuf__adaptor {
  devbuf_allocator_t base;
  devbuf_allocator_t *upstream;
  devbuf__allocator_ops ops;
} devbuf__adaptor;

// An adaptor's operations over `upstream`: its kind's, less each optional group the upstream
// lacks (an adaptor forwards what it can, and only that), and with the upstream's snapshot
// and end of in-flight ranges (a kind sets free_in_flight and alloc_ordered, not fence_done),
// and clear_cache passed to the upstream unless the kind has its own.
void devbuf__adaptor_ops(const devbuf__allocator_ops *kind, const devbuf_allocator_t *upstream,
                         devbuf__allocator_ops *out);
// The upstream allocation (segment) that holds memory from a caching allocator, and the
// memory's offset in it: what another process maps to share it.
void devbuf__caching_segment_of(const devbuf_memory_t *memory, devbuf_memory_t *out_segment,
                                size_t *out_offset);
void devbuf__caching_snapshot_free(devbuf_allocator_snapshot_t *snapshot);
// Fork (base/fork.c): the locks of the thread caches, then of one caching allocator's
// shards (a no-op for other allocators), taken before a fork in that order and given back
// after it, in both processes.
void devbuf__caching_fork_lock_threads(void);
void devbuf__caching_fork_unlock_threads(void);
void devbuf__caching_fork_lock(devbuf_allocator_t *allocator);
void devbuf__caching_fork_unlock(devbuf_allocator_t *allocator);

#endif // DEVBUF_MEMORY_H
