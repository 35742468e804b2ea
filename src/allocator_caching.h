// The caching allocator's layout, shared by its shared pool (allocator_caching.c) and its
// per-thread caches (allocator_tcache.c).
//
// Where a free block can be:
//   thread cache  small blocks (<= a page) of one thread, exact size classes, no locks;
//                 only while the allocator has no limits (limits need a global view)
//   shard         the shared pool: 16 shards with a lock each, best fit, LRU order
//   upstream      given back (system free)
#ifndef DEVBUF_ALLOCATOR_CACHING_H
#define DEVBUF_ALLOCATOR_CACHING_H

#include "internal.h"

#define SHARD_COUNT 16
#define SMALL_GRANULE 256
#define MAX_SMALL_CLASSES 64 // pages up to 16 KiB get direct small classes
#define TCACHE_MAX_PAGES 16                     // thread bins hold blocks up to 16 pages
#define TCACHE_BINS (MAX_SMALL_CLASSES + TCACHE_MAX_PAGES - 1)
#define TCACHE_CLASS_BYTES ((size_t)32 << 10)   // a thread keeps about this much per class ...
#define TCACHE_MIN_BLOCKS 2                     // ... but at least this many blocks

typedef struct cblock {
  devbuf_memory_t upstream;     // what the upstream allocator handed out
  size_t size;                  // rounded size: what the statistics count
  struct cblock *next, *prev;   // same-size list while cached (most recent first)
  struct cblock *newer, *older; // the shard's LRU list while in a shard
  uint64_t released_at;         // release tick; orders eviction across shards
  uint32_t bin;                 // the thread-cache bin of this size; >= bin_count: none
} cblock;

typedef struct size_bucket {
  size_t size;
  cblock *head;
} size_bucket;

typedef struct shard {
  pthread_mutex_t lock;
  cblock *small[MAX_SMALL_CLASSES]; // small[i]: cached blocks of (i + 1) * 256 bytes
  size_bucket *buckets;             // larger cached blocks, sorted by size
  size_t bucket_count, bucket_capacity;
  cblock *newest, *oldest;          // LRU list of every block in the shard
  atomic_size_t cached_blocks;      // read without the lock to skip empty shards
  char pad[64];
} shard;

// Per-thread figures and small-block bins. Counters are written only by the owning thread
// (plain load + store, no atomic read-modify-write) and summed by readers; a block freed by
// another thread than the one that allocated it makes one counter go below zero and another
// above, so only the sums mean anything. Nodes live until the allocator is destroyed: a
// thread that exits leaves its node (counters intact) for the next thread to adopt.
typedef struct tcache {
  struct caching_allocator *owner;  // NULL once the allocator is gone (under the global lock)
  struct tcache *next;              // the allocator's list; push-only until destroy
  bool adopted;                     // a live thread uses it (under the global lock)
  bool bins_on;                     // the bins may hold blocks (owner thread only)
  uint64_t seen_epoch;              // the allocator's flush epoch this cache last obeyed
  uint64_t release_seq;             // orders the bins' blocks by release (owner thread only)
  cblock *bins[TCACHE_BINS];        // one stack per size (owner thread only)
  atomic_uint_least32_t bin_count[TCACHE_BINS];
  atomic_uint_least64_t local_peak; // active at the last peak observation (reset_peak writes it too)
  atomic_uint_least64_t active;     // bytes (two's complement: may be "negative")
  atomic_uint_least64_t live;       // blocks (likewise)
  atomic_uint_least64_t bin_hits;   // allocations served from the bins
  atomic_uint_least64_t shared_calls, shared_hits; // allocations that took the shared path
} tcache;

typedef struct caching_allocator {
  devbuf_allocator_t base;
  uint64_t id;                      // unique, never reused: keys the threads' cache slots
  devbuf_allocator_t *upstream;     // owned reference
  size_t page;                      // rounding granularity above the small classes
  size_t small_limit;               // largest size served by small classes
  size_t small_classes;
  unsigned page_shift;              // log2(page)
  size_t bin_count;                 // thread bins in use: small classes, then 2..16 pages
  size_t bin_size[TCACHE_BINS];     // block size of each bin, ascending
  uint32_t bin_capacity[TCACHE_BINS];
  // Read on every call; written only when options change.
  atomic_uint_least64_t flush_epoch; // bumped to make every thread empty its bins
  atomic_bool bins_allowed;          // no limits: thread bins may hold blocks
  atomic_uint_least64_t memory_limit, cache_limit, max_buffers; // 0: none
  char pad0[64];
  atomic_uint_least64_t peak;
  atomic_uint_least64_t shard_cached; // bytes in shards
  atomic_uint_least64_t reserved;     // bytes upstream holds for us (active + cached)
  atomic_uint_least64_t admitting;    // allocations past the buffer-count check, not handed out
  atomic_uint_least64_t tick;         // release clock for LRU order
  atomic_uint_least64_t system_allocs, system_frees, failed;
  atomic_uint_least64_t homeless_active, homeless_live; // releases by threads without a cache
  _Atomic(tcache *) threads;          // every thread cache of this allocator
  shard shards[SHARD_COUNT];
} caching_allocator;

// allocator_caching.c
bool devbuf__caching_round(const caching_allocator *self, size_t size, size_t *out);
// Into the caller's shard; then, with `may_give_back`, the oldest cached blocks go back
// upstream while the cache or memory limit is exceeded. With it false no block is given
// back (no upstream call), for callers that hold the thread caches' global lock.
void devbuf__caching_shard_insert(caching_allocator *self, cblock *block, bool may_give_back);
void devbuf__caching_observe_peak(caching_allocator *self);

// allocator_tcache.c
// Fills the bin tables of a new allocator.
void devbuf__tcache_init_bins(caching_allocator *self);
// The bin of blocks of `size` rounded bytes (bin_count when none).
uint32_t devbuf__tcache_bin_of(const caching_allocator *self, size_t size);
// The hot path: an allocation served from the calling thread's bins, counted; false when
// the shared path must serve it.
bool devbuf__tcache_alloc(caching_allocator *self, size_t requested, devbuf_memory_t *out);
// The hot path: a release kept in the calling thread's bins, counted; false otherwise.
bool devbuf__tcache_free(caching_allocator *self, cblock *block);
// The calling thread's cache for `self` with pending flush requests obeyed, created or
// adopted on first use; NULL only when no host memory is left for one.
tcache *devbuf__tcache_get(caching_allocator *self);
// The smallest block of [size, limit] bytes in the thread's bins, or NULL.
cblock *devbuf__tcache_take(caching_allocator *self, tcache *cache, size_t size, size_t limit);
// Moves every block in the bins into the shared pool, least recently released first.
// Owner thread only, or under the global lock once the owner thread is gone (then
// `may_give_back` is false, so that nothing calls upstream while the lock is held).
void devbuf__tcache_flush(caching_allocator *self, tcache *cache, bool may_give_back);
// Called when the allocator is destroyed: detaches every thread cache.
void devbuf__tcache_detach_all(caching_allocator *self);

static inline void tcache_add(atomic_uint_least64_t *counter, uint64_t delta) {
  atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + delta, memory_order_relaxed);
}

// Counts a block as the calling thread's and describes it in `out`.
static inline void caching_hand_out(caching_allocator *self, tcache *cache, cblock *block, devbuf_memory_t *out) {
  tcache_add(&cache->live, 1);
  tcache_add(&cache->active, block->size);
  uint64_t active = atomic_load_explicit(&cache->active, memory_order_relaxed);
  if (DEVBUF_UNLIKELY((int64_t)active > (int64_t)atomic_load_explicit(&cache->local_peak, memory_order_relaxed))) {
    atomic_store_explicit(&cache->local_peak, active, memory_order_relaxed);
    devbuf__caching_observe_peak(self);
  }
  out->host = block->upstream.host;
  out->device = block->upstream.device;
  out->size = block->size;
  out->token = block;
}

#endif // DEVBUF_ALLOCATOR_CACHING_H
