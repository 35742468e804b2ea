// The caching allocator: requests, limits, statistics, lifetime.
//
// Sizes round to 512 bytes (to the page between one and 16 pages where pages are at most
// 32 KiB and thread bins are on, so that they serve them). A request first tries the calling
// thread's bins (small blocks, no lock: tcache.c), then the best fit in its pool in the thread's
// shard, then in the other shards, and only then takes a new segment from upstream (its size from
// policy.c). Blocks split on allocation and coalesce on release (pool.c). Under a limit,
// whole idle segments go back upstream, the longest idle first.
#include "tcache_hot.h"

#include <stdio.h>
#include <string.h>

static atomic_uint next_shard_index;
static _Thread_local unsigned thread_shard __attribute__((tls_model("initial-exec"))) = ~0u;

static inline shard *my_shard(caching_allocator *self) {
  if (DEVBUF_UNLIKELY(thread_shard == ~0u))
    thread_shard = atomic_fetch_add(&next_shard_index, 1) % SHARD_COUNT;
  return &self->shards[thread_shard];
}

bool devbuf__caching_round(const caching_allocator *self, size_t size, size_t *out) {
  size_t page = self->policy.page;
  // Whole pages only where thread bins take them: under a limit and in growable segments
  // the bins hold nothing, and a page per block of a few KiB is memory for nothing.
  size_t granule = size > self->small_limit && self->small_limit == page &&
                           size <= TCACHE_MAX_PAGES * page &&
                           atomic_load_explicit(&self->bins_allowed, memory_order_relaxed)
                       ? page
                       : GRANULE;
  size_t padded;
  if (devbuf__add_overflows(size, granule - 1, &padded)) return false;
  *out = padded & ~(granule - 1);
  return true;
}

// ---- statistics helpers ---------------------------------------------------------------

// Sums of the threads' counters.
typedef struct thread_sums {
  uint64_t active, live, hits, calls;
} thread_sums;

static thread_sums sum_threads(caching_allocator *self) {
  thread_sums sums = {.active = atomic_load(&self->homeless_active),
                      .live = atomic_load(&self->homeless_live)};
  for (tcache *c = atomic_load_explicit(&self->threads, memory_order_acquire); c; c = c->next) {
    // The shared path's count first (the owner raises it after the hand-out, releasing):
    // hand-outs read after it are never fewer, so the bins' hits never go below zero.
    uint64_t admitting = atomic_load(&c->admitting); // before its hand-out's count, as written
    uint64_t shared_handed_out = atomic_load_explicit(&c->shared_handed_out, memory_order_acquire);
    // Hand-outs and releases as they stood at one moment: the releases read before and after
    // the hand-outs agree (else a release read after hand-outs read earlier made the thread's
    // live count negative, and one read before them made it too high). A few tries, then
    // the count that errs high (a limit then refuses rather than lets one too many through).
    uint64_t released = atomic_load_explicit(&c->released, memory_order_acquire), handed_out;
    for (int tries = 0;; tries++) {
      handed_out = atomic_load_explicit(&c->handed_out, memory_order_acquire);
      uint64_t again = atomic_load_explicit(&c->released, memory_order_acquire);
      if (again == released || tries == 3) break;
      released = again;
    }
    uint64_t bin_hits = handed_out - shared_handed_out;
    sums.active += atomic_load_explicit(&c->active, memory_order_relaxed);
    sums.live += handed_out - released + (admitting > handed_out); // 0 for none
    sums.hits += bin_hits + atomic_load_explicit(&c->shared_hits, memory_order_relaxed);
    sums.calls += bin_hits + atomic_load_explicit(&c->shared_calls, memory_order_relaxed);
  }
  return sums;
}

uint64_t devbuf__caching_active(caching_allocator *self) { return sum_threads(self).active; }

// Called when a thread's active figure passes its own last observation: while one thread
// allocates at a time this keeps peak exact; when several race, a sum may miss a moment.
void devbuf__caching_observe_peak(caching_allocator *self, tcache *cache, uint64_t active) {
  atomic_store_explicit(&cache->local_peak, active, memory_order_relaxed);
  devbuf__raise_peak(&self->peak, sum_threads(self).active);
}

// ---- giving memory back ---------------------------------------------------------------

// Gives back the idle segment that has been idle longest, of all shards. False if none is.
static bool give_back_oldest(caching_allocator *self) {
  for (;;) {
    shard *victim = NULL;
    uint64_t oldest = UINT64_MAX;
    for (int i = 0; i < SHARD_COUNT; i++) {
      shard *s = &self->shards[i];
      if (!atomic_load_explicit(&s->free_blocks, memory_order_relaxed)) continue;
      pthread_mutex_lock(&s->lock);
      if (s->idle_oldest && s->idle_oldest->idle_since < oldest) {
        oldest = s->idle_oldest->idle_since;
        victim = s;
      }
      pthread_mutex_unlock(&s->lock);
    }
    if (!victim) return false;
    pthread_mutex_lock(&victim->lock);
    csegment *segment = victim->idle_oldest && victim->idle_oldest->idle_since == oldest
                            ? devbuf__shard_take_idle(self, victim)
                            : NULL; // another thread took or used it first: look again
    pthread_mutex_unlock(&victim->lock);
    if (segment) {
      devbuf__segment_give_back(self, segment);
      return true;
    }
  }
}

static bool over_limits(caching_allocator *self) {
  uint64_t cache_limit = atomic_load_explicit(&self->cache_limit, memory_order_relaxed);
  uint64_t memory_limit = atomic_load_explicit(&self->memory_limit, memory_order_relaxed);
  if (DEVBUF_LIKELY(!cache_limit && !memory_limit)) return false;
  uint64_t reserved = atomic_load_explicit(&self->reserved, memory_order_relaxed);
  // Growable segments' free ends are mostly addresses: what is cached there is reserved - active.
  uint64_t cached = atomic_load_explicit(&self->growable, memory_order_relaxed)
                        ? reserved - sum_threads(self).active
                        : shards_bytes(self, false);
  return (cache_limit && cached > cache_limit) || (memory_limit && reserved > memory_limit);
}

// Gives back idle segments, longest idle first (growable ones: their free ends), while the
// cache is over its limit or the reserved bytes over the memory limit (either may have been
// lowered while memory was in use). Bytes of segments still partly used stay.
void devbuf__caching_enforce_limits_slow(caching_allocator *self) {
  while (DEVBUF_UNLIKELY(over_limits(self)) &&
         (give_back_oldest(self) || devbuf__growable_shrink(self, false))) {
  }
}

void devbuf__caching_put(caching_allocator *self, cblock *block, bool may_give_back) {
  shard *home = block->segment->shard;
  pthread_mutex_lock(&home->lock);
  devbuf__pool_put(self, home, block);
  pthread_mutex_unlock(&home->lock);
  if (may_give_back) devbuf__caching_enforce_limits(self);
}

// Cached bytes released in flight, each once (see devbuf__shard_in_flight_cached).
static uint64_t in_flight_cached(caching_allocator *self) {
  uint64_t held = 0;
  for (int i = 0; i < SHARD_COUNT; i++) {
    shard *s = &self->shards[i];
    pthread_mutex_lock(&s->lock);
    held += devbuf__shard_in_flight_cached(s);
    pthread_mutex_unlock(&s->lock);
  }
  return held;
}

static size_t largest_free(caching_allocator *self) {
  size_t largest = 0, small_max = self->policy.small_max;
  uint64_t limit = atomic_load_explicit(&self->memory_limit, memory_order_relaxed);
  uint64_t reserved = atomic_load_explicit(&self->reserved, memory_order_relaxed);
  bool growable = atomic_load_explicit(&self->growable, memory_order_relaxed);
  for (int i = 0; i < SHARD_COUNT; i++) {
    shard *s = &self->shards[i];
    if (!atomic_load_explicit(&s->free_blocks, memory_order_relaxed)) continue;
    pthread_mutex_lock(&s->lock);
    for (int p = 0; p < POOL_COUNT; p++) {
      size_t size;
      if (growable) { // where a request lands decides whether it maps pages (a growable pool
                      // always has a block for it: its segment's free end)
        size = devbuf__pool_largest_served(&s->pools[p], p == POOL_SMALL ? 0 : small_max,
                                           p == POOL_SMALL ? small_max : SIZE_MAX);
      } else {
        size = devbuf__pool_largest(&s->pools[p]);
        // A larger request goes to the large pool, whose free blocks alone serve it, unless
        // a new segment for it would not fit under the memory limit (alloc_shared); likewise
        // a request the small pool takes is served by a large block only then.
        bool other_pool_serves =
            limit && reserved + caching_round_up(size, self->policy.page) > limit;
        if (p == POOL_SMALL && size > small_max && !other_pool_serves) size = small_max;
        if (p == POOL_LARGE && size <= small_max && !other_pool_serves) size = 0;
      }
      if (size > largest) largest = size;
    }
    pthread_mutex_unlock(&s->lock);
  }
  // Blocks parked in threads (whole segments, above the bins) serve any thread's request:
  // it sends them to their pools before it asks upstream.
  for (tcache *c = atomic_load_explicit(&self->threads, memory_order_acquire); c; c = c->next) {
    if (!atomic_load_explicit(&c->parked, memory_order_acquire)) continue;
    size_t serves = atomic_load_explicit(&c->parked_serves, memory_order_relaxed);
    if (serves > largest) largest = serves;
  }
  return largest;
}

// ---- allocation ----------------------------------------------------------------------

static devbuf_status fail(caching_allocator *self, devbuf_status status) {
  atomic_fetch_add_explicit(&self->failed, 1, memory_order_relaxed);
  return status;
}

// OUT_OF_MEMORY naming the request and the figures, then the limit (`limit_text`).
static devbuf_status refuse(caching_allocator *self, size_t requested, size_t size,
                            const char *limit_text) {
  uint64_t active = sum_threads(self).active, reserved = atomic_load(&self->reserved);
  return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY,
                                  "requested %zu bytes (%zu rounded) with %llu bytes active, %llu "
                                  "cached, %llu released in flight, a largest free block of %zu "
                                  "bytes and %s",
                                  requested, size, (unsigned long long)active,
                                  (unsigned long long)(reserved > active ? reserved - active : 0),
                                  (unsigned long long)in_flight_cached(self), largest_free(self),
                                  limit_text));
}

static devbuf_status out_of_memory(caching_allocator *self, size_t requested, size_t size,
                                   uint64_t limit) {
  char limit_text[64] = "no memory limit";
  if (limit)
    snprintf(limit_text, sizeof limit_text, "a memory limit of %llu bytes",
             (unsigned long long)limit);
  return refuse(self, requested, size, limit_text);
}

// Reserves the bytes of a new segment against the memory limit (giving idle segments back
// to make room); 0 when even the smallest segment for the request does not fit.
static size_t reserve_segment(caching_allocator *self, int pool, size_t size) {
  for (;;) {
    uint64_t limit = atomic_load_explicit(&self->memory_limit, memory_order_relaxed);
    uint64_t reserved = atomic_load_explicit(&self->reserved, memory_order_relaxed);
    uint64_t room = !limit ? UINT64_MAX : limit > reserved ? limit - reserved : 0;
    uint64_t pool_reserved = atomic_load_explicit(&self->pool_reserved[pool], memory_order_relaxed);
    // Segments grow with the pool until the first free, and never under a limit (policy.c).
    bool burst = !limit && !atomic_load_explicit(&self->freed_any, memory_order_relaxed);
    size_t largest = atomic_load_explicit(&self->largest_request, memory_order_relaxed);
    size_t bytes =
        devbuf__policy_segment_size(&self->policy, pool, size, pool_reserved, burst, largest, room);
    if (!bytes) {
      // Idle segments go back only where that makes the room: never for a refusal.
      size_t least = caching_round_up(size, self->policy.page);
      bool enough = limit && least && room + shards_bytes(self, true) >= least;
      if (enough && give_back_oldest(self)) continue;
      return 0;
    }
    if (atomic_compare_exchange_weak(&self->reserved, &reserved, reserved + bytes)) return bytes;
  }
}

// A new segment for a block of `size` bytes, and the block, in the caller's shard.
// *out stays NULL (and the status OK) when the memory limit leaves no room for it.
static devbuf_status grow(caching_allocator *self, size_t size, int pool, cblock **out) {
  *out = NULL;
  size_t bytes = reserve_segment(self, pool, size);
  if (!bytes) return DEVBUF_OK;
  devbuf_memory_t memory;
  devbuf_status status = devbuf_allocator_alloc(self->upstream, bytes, &memory);
  // The system may refuse while idle segments are still held: give those back, retry.
  while (status == DEVBUF_OUT_OF_MEMORY && give_back_oldest(self))
    status = devbuf_allocator_alloc(self->upstream, bytes, &memory);
  if (status != DEVBUF_OK) {
    atomic_fetch_sub(&self->reserved, bytes);
    return fail(self, status);
  }
  caching_held_add(self, bytes); // not for a request the upstream refused
  atomic_fetch_add_explicit(&self->system_allocs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&self->segments, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&self->pool_reserved[pool], bytes, memory_order_relaxed);
  shard *home = my_shard(self);
  pthread_mutex_lock(&home->lock);
  csegment *segment = devbuf__segment_create(self, home, pool, &memory, bytes, false);
  bool refused;
  cblock *block =
      segment ? devbuf__pool_take(self, home, pool, size, false, NULL, NULL, &refused) : NULL;
  pthread_mutex_unlock(&home->lock);
  if (!segment) {
    atomic_fetch_sub(&self->reserved, bytes);
    caching_held_sub(self, bytes);
    atomic_fetch_sub(&self->segments, 1);
    atomic_fetch_sub(&self->pool_reserved[pool], bytes);
    atomic_fetch_add(&self->system_frees, 1);
    devbuf_allocator_free(self->upstream, &memory);
    return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a segment record"));
  }
  *out = block; // the new segment fits it, and its lock was held from creation on
  return DEVBUF_OK;
}

typedef struct visitor {
  bool (*visit)(void *context, void *fence, size_t offset, size_t size); // NULL: a host allocation
  void *context;
} visitor;

// Best fit in `pool`: the thread's shard first, then the others. An ordered allocation whose
// visitor refused is served like a host one.
static cblock *take_free(caching_allocator *self, int pool, size_t size, const visitor *ordered) {
  shard *home = my_shard(self);
  bool use_in_flight = ordered && ordered->visit;
  for (int i = -1; i < SHARD_COUNT; i++) {
    shard *s = i < 0 ? home : &self->shards[i];
    if ((i >= 0 && s == home) || !atomic_load_explicit(&s->free_blocks, memory_order_relaxed))
      continue;
    pthread_mutex_lock(&s->lock);
    bool refused;
    cblock *block =
        devbuf__pool_take(self, s, pool, size, use_in_flight, use_in_flight ? ordered->visit : NULL,
                          use_in_flight ? ordered->context : NULL, &refused);
    if (refused) block = devbuf__pool_take(self, s, pool, size, false, NULL, NULL, &refused);
    pthread_mutex_unlock(&s->lock);
    if (block) return block;
  }
  return NULL;
}

// Hands out a block taken from a free tree (either pool's): one of a growable segment gets
// its pages mapped first, whichever pool it came from.
static devbuf_status hand_out_free(caching_allocator *self, tcache *cache, cblock *block,
                                   size_t requested, size_t size, cblock **out) {
  bool grew = false;
  if (block->segment->growable) {
    devbuf_status mapped = devbuf__growable_map_for(self, block, &grew);
    if (mapped != DEVBUF_OK) {
      devbuf__caching_put(self, block, false);
      uint64_t limit = atomic_load(&self->memory_limit);
      return mapped == DEVBUF_OUT_OF_MEMORY && limit
                 ? out_of_memory(self, requested, size, limit)
                 : fail(self, mapped); // the system's own refusal
    }
  }
  if (!grew) owner_add(&cache->shared_hits, 1); // a hit unless its segment had to grow
  *out = block;
  return DEVBUF_OK;
}

// The shared path: a free block of the request's pool, else a new segment; at the memory
// limit, a free block of the other pool rather than churn or a refusal.
static devbuf_status alloc_shared(caching_allocator *self, tcache *cache, size_t requested,
                                  size_t size, const visitor *ordered, cblock **out) {
  int pool = devbuf__policy_pool(&self->policy, size);
  if (pool == POOL_LARGE) { // the largest request so far (a race may lose a raise: a hint only)
    size_t largest = atomic_load_explicit(&self->largest_request, memory_order_relaxed);
    if (size > largest) atomic_store_explicit(&self->largest_request, size, memory_order_relaxed);
  }
  // The block the thread parked last: a request of its size takes it with no lock; any other
  // size sends it to its pool first, so that the best fit there sees it.
  cblock *block = take_parked(cache);
  if (block && block->size == size) {
    atomic_store_explicit(&block->state, BLOCK_ACTIVE, memory_order_relaxed);
    owner_add(&cache->shared_hits, 1);
    *out = block;
    return DEVBUF_OK;
  }
  if (block) devbuf__caching_put(self, block, false);
  block = take_free(self, pool, size, ordered);
  // Before any new memory, the thread's bins and every thread's parked block go back to the
  // pools: binned blocks merge with their free neighbours there and may serve this request
  // (a system allocation or a refusal costs far more than refilling the bins later).
  if (!block) {
    bool flushed = devbuf__tcache_flush(self, cache, false);
    if (devbuf__tcache_unpark_all(self, false) || flushed)
      block = take_free(self, pool, size, ordered);
  }
  // Growable: the pool's segment, made on first need (where no addresses can be reserved,
  // or the request is larger than them, plain segments serve it).
  if (atomic_load_explicit(&self->growable, memory_order_relaxed) && !block &&
      devbuf__growable_ensure(self, my_shard(self), pool))
    block = take_free(self, pool, size, ordered); // the new segment's free end
  if (block) return hand_out_free(self, cache, block, requested, size, out);
  // Where a new segment would not fit under the memory limit without giving idle ones
  // back, the other pool's free bytes come first: giving back to allocate again is churn.
  // The smallest segment is whole pages (reserve_segment), not the request's bytes.
  uint64_t limit = atomic_load_explicit(&self->memory_limit, memory_order_relaxed);
  if (limit &&
      atomic_load_explicit(&self->reserved, memory_order_relaxed) +
              caching_round_up(size, self->policy.page) >
          limit &&
      (block = take_free(self, POOL_COUNT - 1 - pool, size, ordered)))
    return hand_out_free(self, cache, block, requested, size, out);
  devbuf_status status = grow(self, size, pool, &block);
  if (status == DEVBUF_OK && !block &&
      (block = take_free(self, POOL_COUNT - 1 - pool, size, ordered)))
    return hand_out_free(self, cache, block, requested, size, out);
  if (status != DEVBUF_OK || block) {
    *out = block;
    return status;
  }
  return out_of_memory(self, requested, size, atomic_load(&self->memory_limit));
}

// Everything the thread's bins could not serve at once.
static devbuf_status alloc_slow(caching_allocator *self, size_t requested, const visitor *ordered,
                                devbuf_memory_t *out) {
  tcache *cache = devbuf__tcache_get(self);
  if (DEVBUF_UNLIKELY(!cache))
    return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a thread cache"));
  owner_add(&cache->shared_calls, 1);
  size_t size;
  if (DEVBUF_UNLIKELY(!devbuf__caching_round(self, requested, &size) ||
                      !caching_round_up(size, self->policy.page)))
    return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY,
                                    "requested %zu bytes: too large to round to whole %zu-byte "
                                    "pages",
                                    requested, self->policy.page));
  uint64_t max_buffers = atomic_load_explicit(&self->max_buffers, memory_order_relaxed);
  if (max_buffers) {
    // Every live block counts, also those handed out before the limit was set, and those of
    // allocations admitted and not yet handed out, this one's included: of two racing
    // checks, each marks itself before it sums, so one sees the other at least.
    atomic_store(&cache->admitting,
                 atomic_load_explicit(&cache->handed_out, memory_order_relaxed) + 1);
    uint64_t live = sum_threads(self).live;
    if (live > max_buffers) {
      atomic_store_explicit(&cache->admitting, 0, memory_order_release);
      char limit_text[96];
      snprintf(limit_text, sizeof limit_text, "%llu buffers live and a buffer-count limit of %llu",
               (unsigned long long)(live - 1), (unsigned long long)max_buffers);
      return refuse(self, requested, size, limit_text);
    }
  }
  cblock *block = NULL;
  devbuf_status status = alloc_shared(self, cache, requested, size, ordered, &block);
  if (status == DEVBUF_OK) {
    // Host allocations step around bytes released in flight; ordered ones may take them
    // while earlier work still reads them: only the former are poisoned.
    if (!ordered || !ordered->visit) devbuf__caching_poison(block, POISON_HANDED_OUT);
    caching_hand_out(self, cache, block, out);
    atomic_store_explicit(&cache->shared_handed_out,
                          atomic_load_explicit(&cache->shared_handed_out, memory_order_relaxed) + 1,
                          memory_order_release); // after the hand-out's count: see sum_threads
  }
  if (max_buffers) atomic_store_explicit(&cache->admitting, 0, memory_order_release);
  return status;
}

static devbuf_status caching_alloc(devbuf_allocator_t *base, size_t requested,
                                   devbuf_memory_t *out) {
  caching_allocator *self = (caching_allocator *)base;
  if (DEVBUF_LIKELY(devbuf__tcache_alloc(self, requested, out))) return DEVBUF_OK;
  return alloc_slow(self, requested, NULL, out);
}

// Counts a release in the calling thread's figures; the thread's cache (NULL without one).
static tcache *count_release(caching_allocator *self, const cblock *block) {
  tcache *cache = current_cache(self);
  if (DEVBUF_UNLIKELY(!cache)) cache = devbuf__tcache_get(self);
  if (DEVBUF_LIKELY(cache != NULL)) {
    owner_add(&cache->released, 1);
    owner_add(&cache->active, (uint64_t)0 - block->size);
  } else { // no host memory for a thread cache: count the release in the shared figures
    atomic_fetch_sub(&self->homeless_live, 1);
    atomic_fetch_sub(&self->homeless_active, block->size);
  }
  return cache;
}

static void caching_free(devbuf_allocator_t *base, const devbuf_memory_t *memory) {
  caching_allocator *self = (caching_allocator *)base;
  cblock *block = memory->token;
  devbuf__caching_poison(block, POISON_RELEASED);
  if (DEVBUF_LIKELY(devbuf__tcache_free(self, block))) return;
  devbuf__caching_free_shared(self, block);
}

void devbuf__caching_free_shared(caching_allocator *self, cblock *block) {
  tcache *cache = count_release(self, block);
  if (DEVBUF_UNLIKELY(!atomic_load_explicit(&self->freed_any, memory_order_relaxed)))
    atomic_store_explicit(&self->freed_any, true, memory_order_relaxed);
  // A block above every bin that is its whole segment waits parked, where bins may hold
  // blocks; the one parked before goes to its pool. Only whole segments: a parked block
  // merges with no neighbour, so the pools' best fit leaves memory as it would without
  // parking. (Sizes, not the neighbour links, which other threads change under the lock.)
  if (cache && cache->bins_on && block->bin >= self->bin_count &&
      block->size == block->segment->size && !block->segment->growable) {
    devbuf__caching_validate_parking(block);
    atomic_store_explicit(&block->state, BLOCK_BINNED, memory_order_relaxed);
    size_t small_max = self->policy.small_max;
    atomic_store_explicit(
        &cache->parked_serves,
        block->segment->pool == POOL_SMALL && block->size > small_max ? small_max : block->size,
        memory_order_relaxed);
    block = atomic_exchange_explicit(&cache->parked, block, memory_order_acq_rel);
    if (!block) return;
  }
  devbuf__caching_put(self, block, true);
}

// ---- memory released in flight -------------------------------------------------------

static bool is_caching(const devbuf_allocator_t *allocator) {
  return allocator && allocator->ops == &devbuf__caching_ops;
}

void devbuf__caching_fork_lock(devbuf_allocator_t *allocator) {
  if (!is_caching(allocator)) return;
  caching_allocator *self = (caching_allocator *)allocator;
  for (int i = 0; i < SHARD_COUNT; i++) pthread_mutex_lock(&self->shards[i].lock);
}

void devbuf__caching_fork_unlock(devbuf_allocator_t *allocator) {
  if (!is_caching(allocator)) return;
  caching_allocator *self = (caching_allocator *)allocator;
  for (int i = SHARD_COUNT - 1; i >= 0; i--) pthread_mutex_unlock(&self->shards[i].lock);
}

void devbuf__caching_segment_of(const devbuf_memory_t *memory, devbuf_memory_t *out_segment,
                                size_t *out_offset) {
  const cblock *block = memory->token;
  *out_segment = block->segment->upstream;
  *out_offset = block->offset;
}

static devbuf_status caching_free_in_flight(devbuf_allocator_t *allocator,
                                            const devbuf_memory_t *memory, void *fence,
                                            devbuf__in_flight **out_range) {
  caching_allocator *self = (caching_allocator *)allocator;
  cblock *block = memory->token;
  devbuf__in_flight *range = devbuf__malloc(sizeof *range);
  if (!range)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY,
                         "no host memory to record memory released in flight");
  count_release(self, block);
  csegment *segment = block->segment;
  *range = (devbuf__in_flight){
      .segment = segment, .fence = fence, .offset = block->offset, .size = block->size};
  pthread_mutex_lock(&segment->shard->lock);
  range->next = segment->in_flight;
  if (segment->in_flight) segment->in_flight->prev = range;
  segment->in_flight = range;
  devbuf__pool_put(self, segment->shard, block);
  pthread_mutex_unlock(&segment->shard->lock);
  *out_range = range;
  return DEVBUF_OK;
}

static void caching_fence_done(devbuf_allocator_t *allocator, devbuf__in_flight *range) {
  caching_allocator *self = (caching_allocator *)allocator;
  csegment *segment = range->segment;
  pthread_mutex_lock(&segment->shard->lock);
  if (range->prev)
    range->prev->next = range->next;
  else
    segment->in_flight = range->next;
  if (range->next) range->next->prev = range->prev;
  devbuf__segment_check_idle(self, segment);
  pthread_mutex_unlock(&segment->shard->lock);
  devbuf__free(range);
  devbuf__caching_enforce_limits(self);
}

static devbuf_status caching_alloc_ordered(devbuf_allocator_t *allocator, size_t size,
                                           devbuf__in_flight_visit visit, void *context,
                                           devbuf_memory_t *out) {
  visitor ordered = {visit, context};
  return alloc_slow((caching_allocator *)allocator, size, &ordered, out);
}

// ---- statistics, options, lifetime ---------------------------------------------------

static void caching_stats(devbuf_allocator_t *base, devbuf_allocator_stats_t *out) {
  caching_allocator *self = (caching_allocator *)base;
  thread_sums sums = sum_threads(self);
  devbuf__raise_peak(&self->peak, sums.active);
  uint64_t reserved = atomic_load(&self->reserved);
  out->active = sums.active;
  out->peak = atomic_load(&self->peak);
  out->reserved = reserved;
  out->cached = reserved > sums.active ? reserved - sums.active : 0;
  out->released_in_flight = in_flight_cached(self); // "of those": no more than cached
  if (out->released_in_flight > out->cached) out->released_in_flight = out->cached;
  out->segments = atomic_load(&self->segments);
  out->largest_free_block = largest_free(self);
  out->fragmentation = reserved ? 1.0 - (double)sums.active / (double)reserved : 0.0;
  out->live_buffers = sums.live;
  out->system_allocs = atomic_load(&self->system_allocs);
  out->system_frees = atomic_load(&self->system_frees);
  out->failed_allocs = atomic_load(&self->failed);
  out->cache_hits = sums.hits;
  out->alloc_calls = sums.calls;
  out->peak_reserved = atomic_load(&self->peak_reserved);
}

static void caching_reset_peak(devbuf_allocator_t *base) {
  caching_allocator *self = (caching_allocator *)base;
  for (tcache *c = atomic_load_explicit(&self->threads, memory_order_acquire); c; c = c->next)
    atomic_store_explicit(&c->local_peak, atomic_load_explicit(&c->active, memory_order_relaxed),
                          memory_order_relaxed);
  atomic_store(&self->peak, sum_threads(self).active);
  atomic_store(&self->peak_reserved, atomic_load(&self->held));
}

// Other threads empty their bins into the shards at their next call.
static void request_flush(caching_allocator *self) { atomic_fetch_add(&self->flush_epoch, 1); }

static void caching_clear_cache(devbuf_allocator_t *base) {
  caching_allocator *self = (caching_allocator *)base;
  request_flush(self);
  tcache *mine = devbuf__tcache_get(self);
  if (mine) devbuf__tcache_flush(self, mine, true);
  devbuf__tcache_unpark_all(self, false); // other threads' bins empty at their next call
  while (give_back_oldest(self)) {
  }
  devbuf__growable_shrink(self, true);
  devbuf__caching_validate(self);
}

static void caching_destroy(devbuf_allocator_t *base) {
  caching_allocator *self = (caching_allocator *)base;
  devbuf__tcache_detach_all(self); // the bins go to the pools ...
  for (int i = 0; i < SHARD_COUNT; i++) {
    shard *s = &self->shards[i];
    while (s->segments) { // ... and every segment back upstream (blocks never freed go too)
      csegment *segment = s->segments;
      s->segments = segment->next;
      for (cblock *block = segment->first; block;) {
        cblock *after = block->after;
        devbuf__free(block);
        block = after;
      }
      while (segment->in_flight) { // none while storages live: each holds a reference
        devbuf__in_flight *range = segment->in_flight;
        segment->in_flight = range->next;
        devbuf__free(range);
      }
      if (segment->growable)
        devbuf__growable_release(self, segment);
      else
        devbuf__segment_give_back(self, segment);
    }
    devbuf__shard_free_spare_records(s);
    pthread_mutex_destroy(&s->lock);
  }
  devbuf_allocator_release(self->upstream);
  devbuf__free(self);
}

const devbuf__allocator_ops devbuf__caching_ops = {
    .kind = "caching",
    .alloc = caching_alloc,
    .free = caching_free,
    .destroy = caching_destroy,
    .stats = caching_stats,
    .reset_peak = caching_reset_peak,
    .clear_cache = caching_clear_cache,
    .free_in_flight = caching_free_in_flight,
    .fence_done = caching_fence_done,
    .alloc_ordered = caching_alloc_ordered,
    .snapshot = devbuf__caching_snapshot,
};

static bool bins_may_hold(caching_allocator *self) {
  return !atomic_load(&self->memory_limit) && !atomic_load(&self->cache_limit) &&
         !atomic_load(&self->max_buffers) && !atomic_load(&self->growable);
}

static void apply_options(caching_allocator *self, const devbuf_caching_options_t *options) {
  atomic_store(&self->memory_limit, options->memory_limit);
  atomic_store(&self->cache_limit, options->cache_limit);
  atomic_store(&self->max_buffers, options->max_buffers);
  // Limits need every free block where eviction can reach it: thread bins only without them.
  // Growable segments hold what their blocks reach, and a block waiting in one thread's bin
  // made another thread map more memory for the same size (as often as the threads that
  // release and allocate differ, such as a queue's worker and its submitter): no bins there.
  // Read back from the allocator, not from `options`, and again after the store: of two
  // threads setting options at once, the one that stores last may have looked first, and
  // bins left on under the other's limits would bypass them.
  for (;;) {
    bool allowed = bins_may_hold(self);
    atomic_store(&self->bins_allowed, allowed);
    if (bins_may_hold(self) == allowed) break;
  }
  request_flush(self);
}

devbuf_status devbuf__caching_allocator_create(devbuf_allocator_t *upstream,
                                               const devbuf_caching_options_t *options,
                                               devbuf__device_link link, devbuf_allocator_t **out) {
  caching_allocator *self = devbuf__calloc(1, sizeof *self);
  if (!self) {
    devbuf_allocator_release(upstream);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a caching allocator");
  }
  devbuf__allocator_init(&self->base, &devbuf__caching_ops, upstream->device, link);
  self->base.memory_kind = upstream->memory_kind;
  self->id = devbuf__next_id();
  self->upstream = upstream;
  self->handles = upstream->device->memory_handles;
  atomic_init(&self->growable, options->growable != 0);
  devbuf__policy_init(&self->policy,
                      options->page_size ? options->page_size : upstream->device->page_size);
  self->page_shift = (unsigned)__builtin_ctzll(self->policy.page);
  self->small_classes = self->policy.page / GRANULE;
  if (self->small_classes > MAX_SMALL_CLASSES) self->small_classes = MAX_SMALL_CLASSES;
  self->small_limit = self->small_classes * GRANULE;
  for (int i = 0; i < SHARD_COUNT; i++) devbuf__mutex_init(&self->shards[i].lock);
  devbuf__tcache_init_bins(self);
  apply_options(self, options);
  *out = &self->base;
  return DEVBUF_OK;
}

static devbuf_status growable_refused(const devbuf_allocator_t *upstream) {
  return devbuf__error(DEVBUF_UNSUPPORTED,
                       "growable segments need an upstream that maps memory into reserved "
                       "addresses; a %s allocator on %s cannot",
                       upstream->ops->kind, upstream->device->spec);
}

// Growable segments map and unmap whole pages of the allocator's size, which a device can
// do only in multiples of its own (CUDA: 2 MiB); a smaller page would fail every map. A
// user's allocator that maps (the trace tool's counter, say) keeps to pages of its own.
static devbuf_status growable_page_refused(const devbuf_allocator_t *upstream, uint64_t page) {
  size_t device_page = devbuf__allocator_map_page(upstream);
  if (!page || !device_page || page % device_page == 0) return DEVBUF_OK;
  return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                       "growable segments map whole %llu-byte pages, and %s maps memory in "
                       "multiples of %zu bytes: page_size must be 0 or such a multiple",
                       (unsigned long long)page, upstream->device->spec, device_page);
}

devbuf_status devbuf_caching_allocator_create(devbuf_allocator_t *upstream,
                                              const devbuf_caching_options_t *options,
                                              devbuf_allocator_t **out_allocator) {
  if (!upstream || !out_allocator)
    return devbuf__null_argument("", "upstream, out_allocator",
                                 (const void *[]){upstream, out_allocator});
  uint64_t page = options ? options->page_size : 0;
  if (page && (page < 4096 || page > ((uint64_t)1 << 30) || (page & (page - 1))))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "page_size %llu: a power of two from 4096 to 2^30, or 0",
                         (unsigned long long)page);
  if (options && options->growable && !upstream->ops->reserve) return growable_refused(upstream);
  devbuf_status refused =
      options && options->growable ? growable_page_refused(upstream, page) : DEVBUF_OK;
  if (refused != DEVBUF_OK) return refused;
  devbuf_caching_options_t none = {0};
  return devbuf__caching_allocator_create(devbuf_allocator_retain(upstream),
                                          options ? options : &none, DEVBUF__HOLDS_DEVICE,
                                          out_allocator);
}

// The caching allocator behind `allocator` for `what`, or NULL with INVALID_ARGUMENT set.
static caching_allocator *caching_of(devbuf_allocator_t *allocator,
                                     const devbuf_caching_options_t *options, const char *what) {
  if (!allocator || !options || allocator->ops != &devbuf__caching_ops) {
    devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s needs a caching allocator and options", what);
    return NULL;
  }
  return (caching_allocator *)allocator;
}

devbuf_status devbuf_caching_allocator_set_options(devbuf_allocator_t *allocator,
                                                   const devbuf_caching_options_t *options) {
  caching_allocator *self = caching_of(allocator, options, "set_options");
  if (!self) return DEVBUF_INVALID_ARGUMENT;
  apply_options(self, options);
  tcache *mine = devbuf__tcache_get(self);
  if (mine) devbuf__tcache_flush(self, mine, true); // the caller's own bins obey at once
  devbuf__tcache_unpark_all(self, false);           // and every thread's parked block
  devbuf__caching_enforce_limits(self);
  return DEVBUF_OK;
}

devbuf_status devbuf_caching_allocator_configure(devbuf_allocator_t *allocator,
                                                 const devbuf_caching_options_t *options) {
  caching_allocator *self = caching_of(allocator, options, "configure");
  if (!self) return DEVBUF_INVALID_ARGUMENT;
  if (options->page_size && options->page_size != self->policy.page)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "page_size %llu: this allocator's page is %zu, fixed at creation",
                         (unsigned long long)options->page_size, self->policy.page);
  if (options->growable && !self->upstream->ops->reserve) return growable_refused(self->upstream);
  devbuf_status refused =
      options->growable ? growable_page_refused(self->upstream, self->policy.page) : DEVBUF_OK;
  if (refused != DEVBUF_OK) return refused;
  uint64_t segments = atomic_load(&self->segments);
  uint64_t live = sum_threads(self).live;
  if (segments || live)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "the allocator already holds %llu segments and %llu live allocations: "
                         "configure it before its first allocation",
                         (unsigned long long)segments, (unsigned long long)live);
  atomic_store(&self->growable, options->growable != 0);
  return devbuf_caching_allocator_set_options(allocator, options);
}
