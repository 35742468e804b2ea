// The thread bins' hot path (tcache.c has the rest): inline, so that the caching
// allocator's alloc and free serve a binned block without another call.
#ifndef DEVBUF_TCACHE_HOT_H
#define DEVBUF_TCACHE_HOT_H

#include "caching.h"

#define TCACHE_SLOTS 4 // allocators a thread keeps a cache for at once; [0] is the latest

typedef struct devbuf__tcache_slot {
  uint64_t allocator_id; // caching_allocator.id; 0: free
  tcache *cache;
} devbuf__tcache_slot;

// initial-exec: the hot path reads these with one instruction, not a __tls_get_addr call.
extern _Thread_local devbuf__tcache_slot devbuf__tcache_slots[TCACHE_SLOTS]
    __attribute__((tls_model("initial-exec")));

// The power-of-two bin of a block of `size` bytes (above classed_limit), or bin_count.
static inline uint32_t pow2_bin_of(const caching_allocator *self, size_t size) {
  unsigned shift = (unsigned)__builtin_ctzll(size);
  if ((size & (size - 1)) || shift < self->pow2_first_shift) return (uint32_t)self->bin_count;
  size_t bin = self->pow2_base + shift - self->pow2_first_shift;
  return bin < self->bin_count ? (uint32_t)bin : (uint32_t)self->bin_count;
}

// The calling thread's latest cache for `self` with no flush request waiting, with no call;
// NULL when devbuf__tcache_get must find it or obey one.
static inline tcache *current_cache(caching_allocator *self) {
  if (DEVBUF_UNLIKELY(devbuf__tcache_slots[0].allocator_id != self->id)) return NULL;
  tcache *cache = devbuf__tcache_slots[0].cache;
  return DEVBUF_LIKELY(atomic_load_explicit(&self->flush_epoch, memory_order_relaxed) ==
                       cache->seen_epoch)
             ? cache
             : NULL;
}

// The calling thread's cache when the hot path may use its bins; NULL sends it the slow way.
static inline tcache *hot_cache(caching_allocator *self) {
  tcache *cache = current_cache(self);
  return DEVBUF_LIKELY(cache && cache->bins_on) ? cache : NULL;
}

static inline void bin_count_add(tcache *cache, size_t bin, uint32_t delta) {
  atomic_store_explicit(&cache->bin_count[bin],
                        atomic_load_explicit(&cache->bin_count[bin], memory_order_relaxed) + delta,
                        memory_order_relaxed);
}

static inline bool devbuf__tcache_alloc(caching_allocator *self, size_t requested,
                                        devbuf_memory_t *out) {
  tcache *cache = hot_cache(self);
  if (!cache) return false;
  size_t bin;
  if (requested <= self->small_limit) // within every bin's reach: no test against the last
    bin = (requested + GRANULE - 1) / GRANULE - 1;
  else if (requested > self->bin_size[self->bin_count - 1])
    return false;
  else if (DEVBUF_LIKELY(requested <= self->classed_limit))
    bin = self->small_classes + ((requested + self->policy.page - 1) >> self->page_shift) - 2;
  else if ((bin = pow2_bin_of(self, (requested + GRANULE - 1) & ~(size_t)(GRANULE - 1))) ==
           self->bin_count)
    return false;
  cblock *block = cache->bins[bin];
  if (!block) return false;
  cache->bins[bin] = block->bin_next;
  atomic_store_explicit(&block->state, BLOCK_ACTIVE, memory_order_relaxed);
  bin_count_add(cache, bin, (uint32_t)-1);
  devbuf__caching_poison(block, POISON_HANDED_OUT); // binned blocks are never in flight
  caching_hand_out(self, cache, block, out);
  return true;
}

// The calling thread's cache when its `bin` (a block's) has room; NULL sends the block the
// slow way.
static inline tcache *devbuf__tcache_room_for(caching_allocator *self, uint32_t bin) {
  tcache *cache = hot_cache(self);
  if (!cache || bin >= self->bin_count ||
      atomic_load_explicit(&cache->bin_count[bin], memory_order_relaxed) >= self->bin_capacity[bin])
    return NULL;
  return cache;
}

// Puts `block` in its `bin` of `cache`, which devbuf__tcache_room_for returned.
static inline void devbuf__tcache_bin(tcache *cache, cblock *block, uint32_t bin) {
  owner_add(&cache->released, 1);
  owner_add(&cache->active, (uint64_t)0 - block->size);
  block->released_at = cache->release_seq++;
  atomic_store_explicit(&block->state, BLOCK_BINNED, memory_order_relaxed);
  block->bin_next = cache->bins[bin];
  cache->bins[bin] = block;
  bin_count_add(cache, bin, 1);
}

static inline bool devbuf__tcache_free(caching_allocator *self, cblock *block) {
  uint32_t bin = block->bin;
  tcache *cache = devbuf__tcache_room_for(self, bin);
  if (!cache) return false;
  devbuf__tcache_bin(cache, block, bin);
  return true;
}

#endif // DEVBUF_TCACHE_HOT_H
