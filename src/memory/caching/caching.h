// The caching allocator's layout, private to the memory layer (its thread bins' hot path,
// tcache_hot.h, is inline in callers through ../allocator_hot.h): segments and their blocks
// (pool.c), the allocator itself with memory released in flight (caching_allocator.c),
// growable segments (growable.c), per-thread caches (tcache.c), the segment policy
// (policy.c) and the snapshot (snapshot.c). Nothing here knows storages, buffers or
// queues: memory released while work still runs is an opaque fence with a byte range.
//
// Where a free block can be:
//   thread bin    small blocks of one thread, exact size classes, no locks; only while the
//                 allocator has no limits (limits need every free byte where eviction sees it)
//   parked        one per thread: the last block above the bins it released that is a whole
//                 segment, on the bins' terms
//   free tree     free (and released-in-flight) bytes of a pool, best fit by (size, address)
//   upstream      whole idle segments given back (system free); growable ones: free ends
#ifndef DEVBUF_CACHING_H
#define DEVBUF_CACHING_H

#include "../memory.h"

#define SHARD_COUNT        16
#define GRANULE            512 // sizes round to this up to the thread bins' top
#define MAX_SMALL_CLASSES  64  // thread bins of 512 B .. 32 KiB
#define TCACHE_MAX_PAGES   16  // and of 2 .. 16 pages where pages are that small
// and of one block each of exactly 2^16 or 2^17 .. 2^20 bytes (64 or 128 KiB .. 1 MiB, the
// small pool's top) above the other bins: the powers of two programs ask for most, which
// otherwise split a free block and merge it back under their shard's lock on every pair.
#define TCACHE_POW2_BINS   5
#define TCACHE_POW2_TOP    20
#define TCACHE_BINS        (MAX_SMALL_CLASSES + TCACHE_MAX_PAGES - 1 + TCACHE_POW2_BINS)
#define TCACHE_CLASS_BYTES ((size_t)32 << 10) // a thread keeps about this much per class ...
#define TCACHE_MIN_BLOCKS  2                  // ... but at least this many blocks

enum { POOL_SMALL, POOL_LARGE, POOL_COUNT };

typedef enum block_state {
  BLOCK_FREE = 0,    // in its pool's free tree
  BLOCK_ACTIVE = 1,  // handed out
  BLOCK_BINNED = 2,  // in a thread bin: free to the owner thread, in use to the segment
  BLOCK_RETIRED = 3, // a record no block uses (merged away, its segment given back): spare
} block_state;

struct csegment;

typedef struct cblock {
  // What the thread bins' hot path touches, in the first cache line.
  struct cblock *bin_next; // thread bin stack (while binned)
  size_t size;             // what statistics count
  void *host;              // what a hand-out reports, set when it is carved:
  uint64_t device;         //   addresses (or the segment's handle) ...
  size_t device_offset;    //   ... and the offset within a handle
  uint32_t bin;            // thread bin of this size; >= bin_count: none
  _Atomic uint8_t state;   // block_state; read by snapshots of other threads' bins
  uint64_t released_at;    // thread-bin release order (for flushes)
  // The segment's bookkeeping.
  struct csegment *segment;
  size_t offset;                 // within the segment
  struct cblock *before, *after; // neighbours in the segment, in address order
  struct cblock *left, *right;   // free tree (while free)
  uint32_t priority;             // free tree heap order
  // A growable segment's free blocks that may hold whole pages to unmap (csegment.unmappable).
  struct cblock *unmappable_left, *unmappable_right;
  bool unmappable;
} cblock;

// Bytes of a segment released while submitted work may still use them.
typedef struct devbuf__in_flight {
  struct csegment *segment;
  void *fence;         // the releaser's: told back to it in visits
  size_t offset, size; // within the segment
  struct devbuf__in_flight *next, *prev;
} devbuf__in_flight;

typedef struct devbuf__map_range {
  size_t offset, size;
  struct devbuf__map_range *left, *right; // the segment's treap by offset (map_ranges.c)
  uint32_t priority;
} devbuf__map_range;

typedef struct csegment {
  devbuf_memory_t upstream; // what the upstream allocator handed out
  size_t size;
  struct shard *shard;
  int pool;                     // POOL_SMALL or POOL_LARGE
  uint64_t serial;              // creation order: the address order of the free tree
  cblock *first, *last;         // blocks in address order: the lowest, the highest
  size_t used_blocks;           // active or binned
  devbuf__in_flight *in_flight; // released ranges whose work may still run
  uint64_t idle_since;          // tick when it last became idle (no blocks used, none in flight)
  struct csegment *next, *prev; // the shard's segments, newest first
  struct csegment *idle_newer, *idle_older; // the shard's idle segments
  bool idle;
  // Growable segments (growable.c): reserved addresses with memory behind the stretches
  // `maps` holds (map_ranges.c: by address, disjoint, merged where they touch; any whole
  // pages of them may go back).
  bool growable;
  size_t mapped;           // bytes mapped in all
  devbuf__map_range *maps; // the treap's root
  // Its free blocks that may have whole pages mapped (those not listed have none), in a
  // treap by offset: a clear or a limit unmaps these, the highest first, never walking the
  // blocks in use. A walk over every block made each clear or refused request cost the live
  // blocks: a trace freeing beneath 100,000 of them before 20,000 refusals took 35 s.
  cblock *unmappable;
} csegment;

typedef struct cpool {
  cblock *free_root; // treap keyed by (size, segment serial, offset)
} cpool;

typedef struct shard {
  pthread_mutex_t lock;
  cpool pools[POOL_COUNT];
  csegment *segments; // every segment, newest first
  csegment *idle_oldest, *idle_newest;
  csegment *growing[POOL_COUNT]; // growable mode: each pool's one segment, once made
  // Records of blocks that went (merged into a neighbour, or with their segment), linked by
  // bin_next and reused before new ones: they go back to the system only with the allocator,
  // so that the token of a block freed twice still reads a record, never freed memory.
  struct cblock *spare_records;
  // Written only under the lock (a load and a store: no locked instruction), read without
  // it: to skip empty shards, and summed over shards by limits and validators.
  atomic_uint_least64_t free_blocks;
  atomic_uint_least64_t free_bytes; // in the pools' free trees (growable segments not counted)
  atomic_uint_least64_t idle_bytes; // of idle segments (what a limit could give back)
  unsigned debug_steps;             // DEVBUF_DEBUG_CHECKS: changes since the last validation
  char pad[64];
} shard;

// How a caching allocator carves segments, from its page (the upstream's granularity).
typedef struct segment_policy {
  size_t page;
  size_t small_max;      // requests up to this share small segments ...
  size_t small_segment;  // ... of this size
  size_t medium_max;     // requests below this come from medium segments ...
  size_t medium_segment; // ... of this size; the others round to large_round
  size_t large_round;    // 2 MiB, or the page where larger
  unsigned burst_shift;  // until the first free, a medium segment holds at least
                         // the pool's reserved bytes >> this (0: off) ...
  size_t burst_blocks;   // ... but at most this many of the largest request so far
} segment_policy;

// Per-thread figures and small-block bins. Counters are written only by the owning thread
// (plain load + store, no atomic read-modify-write) and summed by readers; a block freed by
// another thread than the one that allocated it makes one counter go below zero and another
// above, so only the sums mean anything. Nodes live until the allocator is destroyed: a
// thread that exits leaves its node (counters intact) for the next thread to adopt.
typedef struct tcache {
  struct caching_allocator *owner; // NULL once the allocator is gone (under the global lock)
  struct tcache *next;             // the allocator's list; push-only until destroy
  bool adopted;                    // a live thread uses it (under the global lock)
  bool bins_on;                    // the bins may hold blocks (owner thread only)
  uint64_t seen_epoch;             // the allocator's flush epoch this cache last obeyed
  uint64_t release_seq;            // orders the bins' blocks by release (owner thread only)
  cblock *bins[TCACHE_BINS];       // one stack per size (owner thread only)
  atomic_uint_least32_t bin_count[TCACHE_BINS];
  atomic_uint_least64_t
      local_peak;               // active at the last peak observation (reset_peak writes it too)
  atomic_uint_least64_t active; // bytes (two's complement: may be "negative")
  // Blocks handed out and released: their difference is the live count, and hand-outs less
  // the shared path's are the bins' hits (one counter on the bins' way, not three).
  atomic_uint_least64_t handed_out, released;
  atomic_uint_least64_t shared_calls, shared_hits; // allocations that took the shared path
  atomic_uint_least64_t shared_handed_out;         // ... and were served
  // Under a buffer-count limit, while an allocation past its check is not handed out yet:
  // `handed_out` + 1 as it was then (0 otherwise). Once `handed_out` reaches it, the block
  // counts there, and a reader that still sees this counts it once, not twice.
  atomic_uint_least64_t admitting;
  // The last block above every bin and a whole segment that the thread released (binned):
  // a request of its size takes it back with no lock. Any thread may take it (an atomic
  // exchange) into its pool: before new memory is reserved, on a clear, on new options.
  // Last, off the bins' lines: placed among them it moved the hot fields' cache lines, and a
  // 64 KiB alloc + touch + free took 82 ns in `devbuf bench --only alloc` instead of 60-68.
  _Atomic(cblock *) parked;
  // The largest request the block parked last serves, for statistics (largest_free_block):
  // the owner writes it before it parks, and it means something while `parked` is set.
  atomic_size_t parked_serves;
} tcache;

typedef struct caching_allocator {
  devbuf_allocator_t base;
  uint64_t id;                  // unique, never reused: keys the threads' cache slots
  devbuf_allocator_t *upstream; // owned reference
  bool handles;                 // upstream memory is a handle plus offset (OpenCL)
  atomic_bool growable;         // each pool is one growable segment per shard (set while empty)
  segment_policy policy;
  size_t small_classes;         // thread bins of GRANULE multiples
  size_t small_limit;           // small_classes * GRANULE
  unsigned page_shift;          // log2(page)
  size_t bin_count;             // thread bins in use: small classes, 2..16 pages, powers of 2
  size_t classed_limit;         // the top of the small-class and page bins
  size_t pow2_base;             // the first power-of-two bin ...
  unsigned pow2_first_shift;    // ... holds blocks of 2^this bytes
  size_t bin_size[TCACHE_BINS]; // block size of each bin, ascending
  uint32_t bin_capacity[TCACHE_BINS];
  // Read on every call; written only when options change.
  atomic_uint_least64_t flush_epoch; // bumped to make every thread empty its bins
  atomic_bool bins_allowed;          // no limits: thread bins may hold blocks
  atomic_uint_least64_t memory_limit, cache_limit, max_buffers; // 0: none
  char pad0[64];
  atomic_uint_least64_t peak;
  atomic_uint_least64_t peak_reserved; // raised wherever `reserved` grows
  atomic_uint_least64_t reserved;      // bytes upstream holds for us
  // Reserved less what the upstream has not given yet (a reservation it may still refuse):
  // what peak_reserved follows.
  atomic_uint_least64_t held;
  atomic_uint_least64_t pool_reserved[POOL_COUNT];
  atomic_bool freed_any;          // a block went back through the shared path
  atomic_size_t largest_request;  // of the large pool, rounded
  atomic_uint_least64_t segments; // segments held
  atomic_uint_least64_t tick;     // idle clock: orders giving back, oldest idle first
  atomic_uint_least64_t serial;   // segment creation order
  atomic_uint_least64_t system_allocs, system_frees, failed;
  atomic_uint_least64_t homeless_active, homeless_live; // releases by threads without a cache
  _Atomic(tcache *) threads;                            // every thread cache of this allocator
  shard shards[SHARD_COUNT];
} caching_allocator;

// ---- policy.c
void devbuf__policy_init(segment_policy *policy, size_t page);
// The pool of a request of `size` rounded bytes.
int devbuf__policy_pool(const segment_policy *policy, size_t size);
// Bytes of a new segment for a `size`-byte block of `pool` while the pool holds
// `pool_reserved` bytes, `burst` while nothing was freed yet, the large pool's largest
// request so far `largest_request`, at most `room` (a memory limit's headroom; UINT64_MAX
// without one); 0 if no segment fits.
size_t devbuf__policy_segment_size(const segment_policy *policy, int pool, size_t size,
                                   uint64_t pool_reserved, bool burst, size_t largest_request,
                                   uint64_t room);

// ---- pool.c (caller holds the shard's lock unless said otherwise)
// A new segment over `upstream` memory, one free block; false without host memory.
csegment *devbuf__segment_create(caching_allocator *self, shard *s, int pool,
                                 const devbuf_memory_t *upstream, size_t size, bool growable);
// Best fit of `size` bytes in the pool, split and marked active; NULL if nothing fits.
// Without `ordered` it skips bytes released in flight; with it, those count as free and
// `visit` is told of each in-flight range the block overlaps (see devbuf__allocator_alloc_ordered),
// and a false answer undoes the allocation (NULL, *out_refused set).
cblock *devbuf__pool_take(caching_allocator *self, shard *s, int pool, size_t size, bool ordered,
                          bool (*visit)(void *context, void *fence, size_t offset, size_t size),
                          void *context, bool *out_refused);
// Frees an active or binned block into its pool, coalescing with free neighbours.
void devbuf__pool_put(caching_allocator *self, shard *s, cblock *block);
// Unlinks the oldest idle segment of the shard (NULL if none); the caller gives it back
// with devbuf__segment_give_back after unlocking.
csegment *devbuf__shard_take_idle(caching_allocator *self, shard *s);
// The shard's spare block records, freed when the allocator goes.
void devbuf__shard_free_spare_records(shard *s);
void devbuf__segment_give_back(caching_allocator *self, csegment *segment);
// Marks a segment idle if nothing uses it any more.
void devbuf__segment_check_idle(caching_allocator *self, csegment *segment);
// The largest free block of a pool, counting only bytes with memory behind them (0 when none).
size_t devbuf__pool_largest(const cpool *pool);
// The largest request of (floor, cap] that the pool's free blocks serve without the upstream
// where requests go (best fit; pages mapped on demand in growable segments), 0 when none.
// Every free block is measured.
size_t devbuf__pool_largest_served(const cpool *pool, size_t floor, size_t cap);
// The shard's cached bytes (free, or in a thread's bin) that in-flight ranges hold: each
// byte once, however many releases in flight overlap on it.
uint64_t devbuf__shard_in_flight_cached(const shard *s);

// ---- map_ranges.c: a growable segment's mapped stretches. Caller holds the shard's lock.
// A new stretch (it may touch others, never overlap them), or NULL without host memory.
devbuf__map_range *devbuf__ranges_add(csegment *segment, size_t offset, size_t size);
// Takes `range` out and frees it.
void devbuf__ranges_remove(csegment *segment, devbuf__map_range *range);
// The first stretch that ends after `offset` (it may start after it too), or NULL.
devbuf__map_range *devbuf__ranges_ending_after(const csegment *segment, size_t offset);
// The stretch after `range`, the one before it, and the last one; NULL where none is.
devbuf__map_range *devbuf__ranges_next(const csegment *segment, const devbuf__map_range *range);
devbuf__map_range *devbuf__ranges_before(const csegment *segment, const devbuf__map_range *range);
devbuf__map_range *devbuf__ranges_last(const csegment *segment);

// ---- growable.c
// Lists a free block of a growable segment as one whose pages a clear or a limit must look
// at, or takes it off that list. Caller holds the shard's lock.
void devbuf__growable_mark_unmappable(csegment *segment, cblock *block);
void devbuf__growable_unmark(csegment *segment, cblock *block);
// The caller's shard's growable segment of `pool`, made if needed (false without memory or
// host memory for it; a message is set).
bool devbuf__growable_ensure(caching_allocator *self, shard *s, int pool);
// Maps what a block just carved from a growable segment needs, within the memory limit
// (unmapping free ranges of growable segments to make room); the block stays the caller's
// either way; *out_grew: whether it mapped (a system allocation). Takes the shard's lock.
devbuf_status devbuf__growable_map_for(caching_allocator *self, cblock *block, bool *out_grew);
// Unmaps the free ranges (each within one free block) of one growable segment that has
// some (of any shard); false if none has. With `all`, of every one.
bool devbuf__growable_shrink(caching_allocator *self, bool all);
// Unmaps free pages of growable segments, the highest of each segment first, until `wanted`
// bytes went back (or, without `every_segment`, one segment's as far as they go); false if
// nothing went back.
bool devbuf__growable_shrink_by(caching_allocator *self, size_t wanted, bool every_segment);
// The bytes from `at` (before `to`) of a growable segment that have memory behind them
// without a break: 0 where `at` has none. Caller holds the shard's lock.
size_t devbuf__growable_mapped_from(const csegment *segment, size_t at, size_t to);
// Whether any byte of [from, to) of a growable segment has memory behind it.
bool devbuf__growable_maps_any(const csegment *segment, size_t from, size_t to);
// Unmaps everything and gives the addresses back (the allocator's end).
void devbuf__growable_release(caching_allocator *self, csegment *segment);

// ---- caching_allocator.c
bool devbuf__caching_round(const caching_allocator *self, size_t size, size_t *out);
// The bytes handed out, summed over threads.
uint64_t devbuf__caching_active(caching_allocator *self);
// The caching allocator's operations: the allocator front end (allocator.c) takes the thread
// bins' way itself for an allocator that has them. Hidden in the declaration too, so that
// the shared library compares with its address at once rather than one read from the GOT.
extern const devbuf__allocator_ops devbuf__caching_ops __attribute__((visibility("hidden")));
// A released (and poisoned) block the thread bins did not take: back to its shard.
void devbuf__caching_free_shared(caching_allocator *self, cblock *block);

// Frees a block into its segment's shard; then, with `may_give_back`, idle segments go back
// upstream while a limit is exceeded. With it false nothing calls upstream, for callers
// that hold the thread caches' global lock.
void devbuf__caching_put(caching_allocator *self, cblock *block, bool may_give_back);
// The calling thread's active bytes passed its last observation: off the hot path (cold, so
// that the hand-out's callers keep no frame for it).
__attribute__((cold, noinline)) void
devbuf__caching_observe_peak(caching_allocator *self, struct tcache *cache, uint64_t active);
void devbuf__caching_enforce_limits_slow(caching_allocator *self);
// Gives back idle segments while the allocator is over a limit: no call without limits.
static inline void devbuf__caching_enforce_limits(caching_allocator *self) {
  if (DEVBUF_UNLIKELY(atomic_load_explicit(&self->cache_limit, memory_order_relaxed) ||
                      atomic_load_explicit(&self->memory_limit, memory_order_relaxed)))
    devbuf__caching_enforce_limits_slow(self);
}

// ---- tcache.c
// Fills the bin tables of a new allocator.
void devbuf__tcache_init_bins(caching_allocator *self);
// The bin of blocks of `size` rounded bytes (bin_count when none).
uint32_t devbuf__tcache_bin_of(const caching_allocator *self, size_t size);
// The hot path, devbuf__tcache_alloc and devbuf__tcache_free, is inline: tcache_hot.h.
// The calling thread's cache for `self` with pending flush requests obeyed, created or
// adopted on first use; NULL only when no host memory is left for one.
tcache *devbuf__tcache_get(caching_allocator *self);
// Moves every block in the bins into the shared pool. Owner thread only, or under the
// global lock once the owner thread is gone (then `may_give_back` is false, so that
// nothing calls upstream while the lock is held).
bool devbuf__tcache_flush(caching_allocator *self, tcache *cache, bool may_give_back);
// Takes the block `cache` parked, if any (a plain load first: no locked write when none).
static inline cblock *take_parked(tcache *cache) {
  return atomic_load_explicit(&cache->parked, memory_order_relaxed)
             ? atomic_exchange_explicit(&cache->parked, NULL, memory_order_acq_rel)
             : NULL;
}
// Puts the block `cache` parked, if any, in its pool; whether there was one. Any thread.
bool devbuf__tcache_unpark(caching_allocator *self, tcache *cache, bool may_give_back);
// The same for every thread's cache; whether any had a block parked.
bool devbuf__tcache_unpark_all(caching_allocator *self, bool may_give_back);
// Called when the allocator is destroyed: detaches every thread cache.
void devbuf__tcache_detach_all(caching_allocator *self);

// `size` rounded up to a multiple of `page` (a power of two); 0 if that overflows.
static inline size_t caching_round_up(size_t size, size_t page) {
  return size > SIZE_MAX - (page - 1) ? 0 : (size + page - 1) & ~(page - 1);
}

// The upstream gave `bytes` (a segment, or pages mapped): held, and so the peak, grow.
static inline void caching_held_add(caching_allocator *self, uint64_t bytes) {
  devbuf__raise_peak(&self->peak_reserved, atomic_fetch_add(&self->held, bytes) + bytes);
}
static inline void caching_held_sub(caching_allocator *self, uint64_t bytes) {
  atomic_fetch_sub(&self->held, bytes);
}

// Adds to a counter that one writer changes (its thread's, or its shard's under the lock) and
// others read: a load and a store, no locked instruction.
static inline void owner_add(atomic_uint_least64_t *counter, uint64_t delta) {
  // Released: a reader that sees this sees the owner's earlier counts (sum_threads pairs
  // hand-outs with releases by reading the releases around them).
  atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + delta,
                        memory_order_release);
}

// Bytes of idle segments (`idle`) or in the free trees, summed over shards (each read
// without its lock: a moment's figure).
static inline uint64_t shards_bytes(caching_allocator *self, bool idle) {
  uint64_t sum = 0;
  for (int i = 0; i < SHARD_COUNT; i++)
    sum += atomic_load_explicit(idle ? &self->shards[i].idle_bytes : &self->shards[i].free_bytes,
                                memory_order_relaxed);
  return sum;
}

// ---- validate.c: debug validators and poison (DEVBUF_DEBUG_CHECKS builds; no-ops otherwise)
#define POISON_HANDED_OUT \
  0xA5                       // over blocks handed out (BUFFER_ZERO clears it after), but
                             // not over bytes earlier work may still read (ordered ones)
#define POISON_RELEASED 0xDD // over every block taken back (not memory released in flight)
#if DEVBUF_DEBUG_CHECKS
// Checks one shard's trees, segments and blocks against each other; aborts on a mismatch.
// Caller holds the shard's lock.
void devbuf__caching_validate_shard(caching_allocator *self, shard *s);
// Counts a change to the shard, validating it every 64th. Caller holds the shard's lock.
void devbuf__caching_debug_step(caching_allocator *self, shard *s);
// Every shard, each under its lock.
void devbuf__caching_validate(caching_allocator *self);
void devbuf__caching_poison(const cblock *block, uint8_t byte);
// A block about to park: no bytes of its segment in flight (a released block's inherited work
// is done, and with it the ranges it overlapped), so that a host request may take it as is.
void devbuf__caching_validate_parking(const cblock *block);
#else
static inline void devbuf__caching_validate_parking(const cblock *block) { (void)block; }
static inline void devbuf__caching_debug_step(caching_allocator *self, shard *s) {
  (void)self, (void)s;
}
static inline void devbuf__caching_validate(caching_allocator *self) { (void)self; }
static inline void devbuf__caching_poison(const cblock *block, uint8_t byte) {
  (void)block, (void)byte;
}
#endif

// Counts a block as the calling thread's and describes it in `out`.
static inline void caching_hand_out(caching_allocator *self, tcache *cache, cblock *block,
                                    devbuf_memory_t *out) {
  owner_add(&cache->handed_out, 1);
  uint64_t active = atomic_load_explicit(&cache->active, memory_order_relaxed) + block->size;
  atomic_store_explicit(&cache->active, active, memory_order_relaxed);
  if (DEVBUF_UNLIKELY((int64_t)active >
                      (int64_t)atomic_load_explicit(&cache->local_peak, memory_order_relaxed)))
    devbuf__caching_observe_peak(self, cache, active);
  out->host = block->host;
  out->device = block->device;
  out->offset = block->device_offset;
  out->size = block->size;
  out->token = block;
}

// The snapshot operation of the caching allocator (snapshot.c): its segments and blocks.
devbuf_status devbuf__caching_snapshot(devbuf_allocator_t *allocator,
                                       devbuf_allocator_snapshot_t **out);

#endif // DEVBUF_CACHING_H
