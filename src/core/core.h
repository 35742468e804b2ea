// The core layer's interface: storage (a buffer's shared memory, allocated lazily), buffer
// handles and views, host access, and the hazard tracker (hazard.h). Not installed.
#ifndef DEVBUF_CORE_H
#define DEVBUF_CORE_H

#include "../memory/allocator_hot.h"

#include <string.h>

struct devbuf__hazard; // hazard.h: a storage's tracker of in-flight uses, its records and deps
struct devbuf__record;
struct devbuf__dep;

typedef enum devbuf__storage_state {
  DEVBUF__UNALLOCATED = 0,
  DEVBUF__ALLOCATED = 1,
} devbuf__storage_state;

// One open host access: which handle opened it, on which bytes, for what.
typedef struct devbuf__host_access {
  const devbuf_buffer_t *handle;
  const void *data;
  size_t offset, size; // bytes within the storage
  bool write;
  struct devbuf__host_access *next;
} devbuf__host_access;

struct devbuf_buffer {
  devbuf__refcount refs;
  uint64_t handle_id;
  struct devbuf__storage *storage; // one reference held per handle
  size_t offset, size;             // bytes within the storage
  devbuf_dtype dtype;
  size_t ndim;
  size_t shape[DEVBUF_MAX_NDIM];
};

struct devbuf__storage;

// What a storage's memory is, and what differs with it: how it is given back, whether it may
// go back in flight. Each kind lives with the code that makes it: an allocation (storage.c),
// a mapped file (mapped_file.c), an import from another process (buffer_share.c), a DLPack
// import (interop/dlpack.c).
typedef struct devbuf__storage_kind {
  const char *name; // for messages: "buffer", "mapped file", ...
  bool file_backed; // a file's pages: reading them is guarded (the file may shrink under it)
  // Whether its memory may go back to its allocator while work still uses it, to be reused
  // by work ordered after that (the allocator must be able to as well).
  bool releases_in_flight;
  // Gives the memory back, once no submitted work uses it (the record goes after); reads
  // `external`, the kind's own data.
  void (*give_back)(struct devbuf__storage *storage);
} devbuf__storage_kind;

// Memory of an allocator, allocated at first use.
extern const devbuf__storage_kind devbuf__storage_allocation;

typedef struct devbuf__storage {
  devbuf__refcount refs;         // handles that use it
  uint64_t id;                   // the storage id shared by all views
  devbuf_allocator_t *allocator; // NULL for memory no allocator owns (files, imports)
  devbuf_device_t *device;       // retained
  size_t size;                   // bytes
  uint32_t flags;                // DEVBUF_BUFFER_* given at creation
  bool read_only;
  unsigned epoch; // the process's at creation (a forked child inherits nothing from its work)
  const devbuf__storage_kind *kind;      // an allocation unless its maker says otherwise
  void *external;                        // the kind's own data (a mapping, the producer's tensor)
  atomic_int state;                      // devbuf__storage_state; ALLOCATED is final
  devbuf_memory_t memory;                // valid once state is ALLOCATED
  pthread_mutex_t lock;                  // lazy allocation, host-access list, hazard creation
  struct devbuf__hazard *_Atomic hazard; // in-flight work on the memory; made on first submission
  devbuf__in_flight *in_flight;          // once released in flight to a caching allocator
  // Work of earlier owners of reused bytes (retained, ordering only): every submission
  // waits for what of it has not completed, host access waits for all of it. Read and
  // written under the tracker's lock, which exists whenever this is non-empty.
  struct devbuf__fence **inherited;
  size_t inherited_count, inherited_capacity;
  // Exports to other processes (buffer_share.c): each lease's watch descriptor, under the
  // storage's lock. Memory with leases never goes back in flight; it waits for the leases.
  int *lease_watches;
  size_t lease_count, lease_capacity;
  devbuf__host_access *accesses; // open host accesses
  atomic_size_t open_accesses;   // length of `accesses` (read without the lock)
  // The handle a new buffer is made with lives in its storage's record: one record to take
  // and give back per buffer, not two. Its bytes outlive the handle until the record goes.
  struct devbuf_buffer first_handle;
} devbuf__storage;

// A hold on the device for a storage of one of its own allocators (backend.h): counted on
// the thread's own line, with no locked instruction where the thread owns one.
static inline void devbuf__device_hold_on_line(devbuf_device_t *device, unsigned line) {
  devbuf__line_add(&device->holds[line].taken, line, memory_order_relaxed);
}
static inline void devbuf__device_hold(devbuf_device_t *device) {
  devbuf__device_hold_on_line(device, devbuf__thread_line());
}
// The device's last reference went while holds were left: whoever drops the last hold
// destroys it (core/device.c).
void devbuf__device_drop_unreferenced(devbuf_device_t *device);
// Drops a hold on the thread's `line` of the device's holds.
static inline void devbuf__device_unhold_on_line(devbuf_device_t *device, unsigned line) {
  // The drop, then the load of `unreferenced`, against core/device.c's store of it, then
  // its sum of the holds: either this load sees the flag or that sum sees the drop. The
  // drop is a release, so that the sum, having seen it, also sees the hold's take.
  if (DEVBUF_LIKELY(devbuf__light_barrier_suffices)) {
    devbuf__line_add(&device->holds[line].dropped, line, memory_order_release);
    devbuf__light_barrier();
  } else {
    atomic_fetch_add_explicit(&device->holds[line].dropped, 1, memory_order_seq_cst);
  }
  if (DEVBUF_UNLIKELY(atomic_load_explicit(&device->unreferenced, memory_order_seq_cst)))
    devbuf__device_drop_unreferenced(device);
}
static inline void devbuf__device_unhold(devbuf_device_t *device) {
  devbuf__device_unhold_on_line(device, devbuf__thread_line());
}

// Whether views at these offsets of two storages share bytes that their addresses do not
// show: an import and its exporter in one process (one storage id, two storages) are one
// memory at two addresses, and their offsets are places in that memory.
static inline bool devbuf__storages_alias(const devbuf__storage *a, size_t a_offset,
                                          const devbuf__storage *b, size_t b_offset, size_t size) {
  return a != b && a->id == b->id && a_offset < b_offset + size && b_offset < a_offset + size;
}
static inline const devbuf__storage_kind *devbuf__storage_kind_of(const devbuf__storage *storage) {
  return storage->kind ? storage->kind : &devbuf__storage_allocation;
}

// Whether the CPU can address the storage's memory.
static inline bool devbuf__storage_host_accessible(const devbuf__storage *storage) {
  return storage->allocator ? devbuf__allocator_host_accessible(storage->allocator)
                            : storage->device->host_accessible;
}

// Sets every field but the first handle's (its maker sets those) and the device's.
static inline void devbuf__storage_init(devbuf__storage *storage, devbuf_allocator_t *allocator,
                                        size_t size, uint32_t flags, uint64_t ids) {
  // Each field is set one by one: clearing the record with memset took a string instruction
  // that cost over a quarter of a buffer's allocate + release. The debug validators scribble
  // over the record first, so that a field added and not set here shows in the sanitizer
  // suites. The lock comes from the initializer, with no call (a mutex made by
  // pthread_mutex_init is the same bytes).
  if (DEVBUF_DEBUG_CHECKS) memset(storage, 0xa5, sizeof *storage);
  storage->read_only = false;
  storage->kind = NULL; // an allocation
  storage->external = NULL;
  storage->memory = (devbuf_memory_t){0};
  storage->lock = (pthread_mutex_t)DEVBUF__MUTEX_INITIALIZER;
  storage->in_flight = NULL;
  storage->inherited = NULL;
  storage->inherited_count = storage->inherited_capacity = 0;
  storage->lease_watches = NULL;
  storage->lease_count = storage->lease_capacity = 0;
  storage->accesses = NULL;
  devbuf__ref_init(&storage->refs, 1);
  atomic_init(&storage->state, DEVBUF__UNALLOCATED);
  atomic_init(&storage->hazard, NULL);
  atomic_init(&storage->open_accesses, 0);
  storage->id = ids;
  storage->first_handle.handle_id = ids + 1; // its maker may use it or wrap other handles
  storage->epoch = devbuf__epoch();
  storage->allocator = allocator;
  storage->size = size;
  storage->flags = flags;
}

// A new storage of `size` bytes of a device's own allocator, its memory not allocated yet,
// made with no call at all: when the thread has a storage record, two ids and its line of
// the device's holds at hand. NULL, having taken nothing, otherwise.
static inline devbuf__storage *devbuf__storage_make_at_hand(devbuf_allocator_t *allocator,
                                                            size_t size, uint32_t flags) {
  unsigned line = devbuf__thread_line_plus_one - 1; // the thread's line, if it has asked
  if (DEVBUF_UNLIKELY(allocator->link != DEVBUF__EMBEDDED || line == (unsigned)-1 ||
                      !devbuf__id_pair_at_hand()))
    return NULL;
  devbuf__storage *storage = devbuf__record_take_cached(DEVBUF__RECORD_STORAGE);
  if (DEVBUF_UNLIKELY(!storage)) return NULL;
  devbuf__storage_init(storage, allocator, size, flags, devbuf__take_id_pair_at_hand());
  storage->device = allocator->device;
  devbuf__device_hold_on_line(allocator->device, line); // the allocator goes with the device
  return storage;
}
// A new storage of `size` bytes, its memory not allocated yet: of `allocator`, or (NULL) of
// no allocator on `device`. The way that may call (storage.c) makes the others.
devbuf_status devbuf__storage_create_slow(devbuf_allocator_t *allocator, devbuf_device_t *device,
                                          size_t size, uint32_t flags, devbuf__storage **out);
static inline devbuf_status devbuf__storage_create(devbuf_allocator_t *allocator,
                                                   devbuf_device_t *device, size_t size,
                                                   uint32_t flags, devbuf__storage **out) {
  devbuf__storage *storage =
      allocator ? devbuf__storage_make_at_hand(allocator, size, flags) : NULL;
  if (DEVBUF_UNLIKELY(!storage))
    return devbuf__storage_create_slow(allocator, device, size, flags, out);
  *out = storage;
  return DEVBUF_OK;
}
// An allocation goes back to its allocator, if it was made.
static inline void devbuf__storage_give_back_allocation(devbuf__storage *storage) {
  if (storage->allocator && storage->size &&
      atomic_load_explicit(&storage->state, memory_order_acquire) == DEVBUF__ALLOCATED)
    devbuf__allocator_free_known(storage->allocator, &storage->memory);
}
// The record goes back to the thread's cache, then what kept the device: the hold of a
// device's own allocator's storage (which may destroy the device, and with it the
// allocator), or the reference to another allocator or, with none, the device. The
// record's lock is not destroyed: it is free here, and a reused record makes it again from
// the initializer (on glibc, destroying a free mutex only marks its bytes).
static inline void devbuf__storage_free_plain_record(devbuf__storage *storage) {
  devbuf_allocator_t *allocator = storage->allocator;
  devbuf_device_t *device = storage->device;
  devbuf__record_free(DEVBUF__RECORD_STORAGE, storage);
  if (DEVBUF_LIKELY(allocator && allocator->link == DEVBUF__EMBEDDED))
    devbuf__device_unhold(device);
  else if (!allocator)
    devbuf_device_release(device);
  else
    devbuf_allocator_release(allocator);
}
// Drops a reference; the last one gives the memory back (or in flight) and the record.
// Nearly every storage is an allocation that nothing but its handles touched: no open host
// access, lease, export, tracker or inherited work. It goes inline, with no call but the
// allocator's; the others through storage.c.
void devbuf__storage_last_release_slow(devbuf__storage *storage);
// Whether the storage is an allocation that nothing but its handles touched (one test of
// seven fields or-ed together).
static inline bool devbuf__storage_untouched(const devbuf__storage *storage) {
  return !((uintptr_t)storage->accesses | storage->lease_count |
           (uintptr_t)atomic_load_explicit(&storage->hazard, memory_order_acquire) |
           (uintptr_t)storage->in_flight | (uintptr_t)storage->kind |
           (uintptr_t)storage->inherited | (uintptr_t)storage->lease_watches);
}
static inline void devbuf__storage_last_release(devbuf__storage *storage) {
  if (DEVBUF_UNLIKELY(!devbuf__storage_untouched(storage))) {
    devbuf__storage_last_release_slow(storage);
    return;
  }
  devbuf__storage_give_back_allocation(storage);
  devbuf__storage_free_plain_record(storage);
}
static inline void devbuf__storage_release(devbuf__storage *storage) {
  if (storage && devbuf__ref_drop_held(&storage->refs)) devbuf__storage_last_release(storage);
}
devbuf_status devbuf__storage_allocate_now(devbuf__storage *storage);
static inline devbuf_status devbuf__storage_ensure_allocated(devbuf__storage *storage) {
  if (DEVBUF_LIKELY(atomic_load_explicit(&storage->state, memory_order_acquire) ==
                    DEVBUF__ALLOCATED))
    return DEVBUF_OK;
  return devbuf__storage_allocate_now(storage);
}
// Allocates the memory of a storage no other thread can reach yet (just made), without
// taking its lock.
devbuf_status devbuf__storage_allocate_private_slow(devbuf__storage *storage);
// Memory without a host address where the CPU reads and writes buffers (a user allocator
// that hands out addresses only, as a replay's does): given back, INVALID_ARGUMENT.
devbuf_status devbuf__storage_no_host_address(devbuf__storage *storage);
// The allocator refused the storage's memory: the message names the size and the device,
// then the refusal. Returns `status`.
devbuf_status devbuf__storage_allocation_failed(const devbuf__storage *storage,
                                                devbuf_status status);
static inline devbuf_status devbuf__storage_allocate_private(devbuf__storage *storage) {
  devbuf_allocator_t *allocator = storage->allocator;
  // Plain memory (no zeroing, not shareable) first, in as few steps as can be.
  if (DEVBUF_UNLIKELY(!storage->size || storage->flags ||
                      allocator->memory_kind == DEVBUF_MEMORY_SHAREABLE))
    return devbuf__storage_allocate_private_slow(storage);
  devbuf_status status = devbuf__allocator_alloc_known(allocator, storage->size, &storage->memory);
  if (DEVBUF_UNLIKELY(status != DEVBUF_OK))
    return devbuf__storage_allocation_failed(storage, status);
  if (DEVBUF_UNLIKELY(!storage->memory.host) && devbuf__storage_host_accessible(storage))
    return devbuf__storage_no_host_address(storage);
  atomic_store_explicit(&storage->state, DEVBUF__ALLOCATED, memory_order_release);
  return DEVBUF_OK;
}
// For submitted work: may reuse memory whose earlier work is still pending (ordered after it).
devbuf_status devbuf__storage_ensure_allocated_for_work(devbuf__storage *storage);
// The storage's hazard tracker, made if needed; NULL when out of memory. Caller holds
// storage->lock.
struct devbuf__hazard *devbuf__storage_hazard_locked(devbuf__storage *storage);
// Records a use of the storage's bytes by submitted work, `record` (its work's fence names
// the queue), in the storage's tracker (made if needed; the record's segment names it): the
// conflicting work of other queues and the unfinished work of the bytes' earlier owners join
// the dependency list. HOST_ACCESS_OPEN if an open host access races with it. On failure the
// record's segment is set if it went in nonetheless (the caller removes it).
devbuf_status devbuf__storage_track_use(devbuf__storage *storage, struct devbuf__record *record,
                                        struct devbuf__dep **deps, uint32_t *dep_count,
                                        uint32_t *dep_capacity);
// The queue whose worker thread this is, and its device (the exec layer sets them as the
// worker starts; NULL on other threads). Work running here is that queue's, so a wait on
// this thread for that queue's work (its own, or what the queue runs after it) would never
// end: such waits are refused instead.
extern _Thread_local devbuf_queue_t *devbuf__worker_queue;
extern _Thread_local devbuf_device_t *devbuf__worker_device;
// Set by the exec layer while a worker runs an item: retires the items it ran before this one
// and has not retired yet (a worker retires in groups), whose records a host wait the item
// makes would otherwise take for the queue's own pending work; false when there were none.
extern _Thread_local bool (*devbuf__worker_settle)(void);
// Before a kernel blocks on other work (an event, another queue, bytes in use): the items
// its worker ran before it are retired first, as that work may wait for one of them. False
// when there were none (or off a worker thread). No lock may be held.
static inline bool devbuf__settle_before_blocking(void) {
  return DEVBUF_UNLIKELY(devbuf__worker_settle != NULL) && devbuf__worker_settle();
}
// INVALID_ARGUMENT naming `what`, for a wait that work running on this thread's queue
// would have to end.
devbuf_status devbuf__refuse_self_wait(const char *what);

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
devbuf_status devbuf__storage_lock_idle(devbuf__storage *storage, const devbuf__byte_range *ranges,
                                        size_t count, devbuf__own_work own, const char *what,
                                        struct devbuf__hazard **out_hazard);
void devbuf__storage_unlock(devbuf__storage *storage, struct devbuf__hazard *hazard);
// A host operation on `count` ranges of one storage (a copy between two of its views reads
// one and writes the other) that runs while no submitted work conflicts and no other host
// access does, and that submissions must not race with while it runs: opens one access
// record per range at once, waiting for work first. The ranges may overlap each other.
// Close each with devbuf__host_operation_end.
devbuf_status devbuf__host_operation_begin(devbuf__storage *storage,
                                           const devbuf__byte_range *ranges, size_t count,
                                           const char *what, devbuf__host_access **out_accesses);
void devbuf__host_operation_end(devbuf__storage *storage, devbuf__host_access *access);
// Reads all of `buffer` as one copyout would (one host operation over its bytes from first
// to last, so no work changes them meanwhile), handing it to `sink` in pieces of at most
// `staging_size` bytes: straight from host memory, or through `staging` (a mapped file's
// pages, under their guard; device memory). `staging_size` keeps whole elements of every
// dtype. What `sink` or a read answers first ends it.
devbuf_status
devbuf__buffer_read_pieces(devbuf_buffer_t *buffer, void *staging, size_t staging_size,
                           devbuf_status (*sink)(void *context, const void *data, size_t size),
                           void *context, const char *what);
// Whether submitted work uses any of storage bytes [offset, offset + size).
bool devbuf__storage_in_use(devbuf__storage *storage, size_t offset, size_t size);
// Waits until no submitted work uses storage bytes [offset, offset + size).
devbuf_status devbuf__storage_wait_unused(devbuf__storage *storage, size_t offset, size_t size);
// A new handle on `storage` (taking over one storage reference).
devbuf_status devbuf__buffer_wrap(devbuf__storage *storage, size_t offset, size_t size,
                                  devbuf_dtype dtype, const size_t *shape, size_t ndim,
                                  devbuf_buffer_t **out);
// Byte size of `ndim` dims of `dtype`; OVERFLOW / INVALID_ARGUMENT with a message.
devbuf_status devbuf__shape_bytes(devbuf_dtype dtype, const size_t *shape, size_t ndim,
                                  size_t *out_bytes, size_t *out_count);

// ---- host-access records (host_access.c, their one owner) ----

// HOST_ACCESS_OPEN if a host access conflicts with an operation on storage bytes
// [offset, offset + size) (a write conflicts with any access, a read with write access).
// Caller holds storage->lock.
devbuf_status devbuf__check_host_conflicts(devbuf__storage *storage, size_t offset, size_t size,
                                           bool write, const char *what);
#define DEVBUF__HOST_ACCESS_RANGES 2 // a copy within one storage: its source and its destination
// Opens `count` host accesses like `wanted` at once, when no submitted work conflicts
// (treating the storage's own work as `own` says). With `exclusive`, other open accesses
// that conflict refuse them (HOST_ACCESS_OPEN): copies need that; host pointers from
// several threads may overlap, as the CPU orders its own threads. The new accesses never
// conflict with each other. Open accesses make racing submissions refuse. *out_accesses
// (optional): the records, to close.
devbuf_status devbuf__host_access_open(devbuf__storage *storage, const devbuf__host_access *wanted,
                                       size_t count, devbuf__own_work own, bool exclusive,
                                       const char *what, devbuf__host_access **out_accesses);
// Closes one record; the access a handle opened at `data` (false: none is open); every
// access a handle left open (when it goes); every access of a storage that goes.
void devbuf__host_access_close(devbuf__storage *storage, devbuf__host_access *access);
bool devbuf__host_access_close_at(devbuf__storage *storage, const devbuf_buffer_t *handle,
                                  const void *data);
void devbuf__host_access_close_all_of(devbuf__storage *storage, const devbuf_buffer_t *handle);
static inline void devbuf__host_access_close_handle(devbuf__storage *storage,
                                                    const devbuf_buffer_t *handle) {
  if (atomic_load_explicit(&storage->open_accesses, memory_order_acquire)) // rarely
    devbuf__host_access_close_all_of(storage, handle);
}
void devbuf__host_access_close_all(devbuf__storage *storage);
// Open accesses that overlap the view's bytes (or that an empty view opened).
size_t devbuf__host_access_count(devbuf__storage *storage, const devbuf_buffer_t *buffer);

// ---- other processes (export.c, buffer_share.c) ----

#define DEVBUF__EXPORT_MAGIC "devbufX2" // eight bytes: the wire format's name and version

// What an export says, as it travels (host byte order: the processes share a machine).
typedef struct devbuf__export_header {
  char magic[8];
  uint32_t kind;        // devbuf_export_kind
  uint32_t device_kind; // buffers: the memory's devbuf_device_kind
  int32_t pid;          // the exporting process
  uint32_t dtype, ndim, read_only;
  uint64_t storage_id;
  uint64_t segment_size;                 // bytes behind the memory descriptor
  uint64_t storage_offset, storage_size; // the storage within them
  uint64_t view_offset, view_size;       // the exported handle within the storage
  uint64_t shape[DEVBUF_MAX_NDIM];
  unsigned char device_uuid[16]; // buffers: the device that holds the memory (0s: any of its kind)
} devbuf__export_header;

// The descriptors of an export: a buffer's memory and its lease; an event's shared page, a
// pidfd of the exporting process and the word where importers say they sleep.
enum { DEVBUF__EXPORT_MEMORY, DEVBUF__EXPORT_LEASE, DEVBUF__EXPORT_SLEEPERS, DEVBUF__EXPORT_FDS };
#define DEVBUF__EXPORT_PROCESS DEVBUF__EXPORT_LEASE
// How many descriptors an export of `kind` carries: 2 for a buffer, 3 for an event.
static inline size_t devbuf__export_fd_count(uint32_t kind) {
  return kind == DEVBUF_EXPORT_EVENT ? 3 : 2;
}

struct devbuf_export {
  devbuf__export_header header;
  int fds[DEVBUF__EXPORT_FDS]; // -1 once gone (sent or imported)
  atomic_bool claimed;         // a send or an import is using the descriptors
};

// A new export of `header` holding its kind's descriptors (devbuf__export_fd_count), which it
// closes when freed; on failure they are closed here.
devbuf_status devbuf__export_new(const devbuf__export_header *header, const int *fds,
                                 devbuf_export_t **out);
// Takes descriptor `which` out of the export (-1 once taken: an export is imported once).
int devbuf__export_take_fd(devbuf_export_t *shared, int which);
// Claims the export's descriptors for one send or import, so that two threads never both take
// them (two imports of one lease): refused while another call holds them or once they are
// gone. devbuf__export_unclaim ends the claim, whether the descriptors went or stayed.
devbuf_status devbuf__export_claim(devbuf_export_t *shared, const char *what);
void devbuf__export_unclaim(devbuf_export_t *shared);
// The memory of a storage released with leases still held waits for them (buffer_share.c);
// the storage's leases and memory go with it (its record frees the rest).
void devbuf__storage_park(devbuf__storage *storage);
// Lets go of the leases of a storage that no importer holds any more (buffer_share.c).
size_t devbuf__storage_prune_leases(devbuf__storage *storage);
// An allocation from a shareable allocator is coming: memory importers let go of returns first
// (checked at most once a millisecond, and only while some is parked).
void devbuf__shareable_allocating(void);

#endif // DEVBUF_CORE_H
