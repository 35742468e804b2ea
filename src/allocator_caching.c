// The caching allocator: its shared pool, limits, statistics, lifetime.
//
// Sizes are rounded to 256-byte classes up to a page and to whole pages above. A request
// first tries the calling thread's cache (small blocks, no lock: allocator_tcache.c), then
// the best fitting block no larger than min(2 x size, size + 2 pages) in the thread's
// shard of the shared pool, then in the other shards, and only then asks the upstream
// allocator. Each shard has its own lock, so the shared path takes one short lock that
// other threads rarely want. Eviction (cache limit, memory limit, clear_cache) gives back
// the least recently released blocks first, across all shards.
#include "allocator_caching.h"

#include <string.h>

static atomic_uint next_shard_index;
static _Thread_local unsigned thread_shard __attribute__((tls_model("initial-exec"))) = ~0u;

static inline shard *my_shard(caching_allocator *self) {
  if (DEVBUF_UNLIKELY(thread_shard == ~0u)) thread_shard = atomic_fetch_add(&next_shard_index, 1) % SHARD_COUNT;
  return &self->shards[thread_shard];
}

bool devbuf__caching_round(const caching_allocator *self, size_t size, size_t *out) {
  size_t granule = size <= self->page ? SMALL_GRANULE : self->page;
  size_t padded;
  if (devbuf__add_overflows(size, granule - 1, &padded)) return false;
  *out = padded & ~(granule - 1);
  return true;
}

// ---- cache lists (caller holds the shard lock) ---------------------------------------

static void list_push(cblock **head, cblock *block) {
  block->prev = NULL;
  block->next = *head;
  if (*head) (*head)->prev = block;
  *head = block;
}

static void list_remove(cblock **head, cblock *block) {
  if (block->prev)
    block->prev->next = block->next;
  else
    *head = block->next;
  if (block->next) block->next->prev = block->prev;
}

static void lru_push(shard *s, cblock *block) {
  block->older = s->newest;
  block->newer = NULL;
  if (s->newest) s->newest->newer = block;
  s->newest = block;
  if (!s->oldest) s->oldest = block;
}

static void lru_remove(shard *s, cblock *block) {
  if (block->newer)
    block->newer->older = block->older;
  else
    s->newest = block->older;
  if (block->older)
    block->older->newer = block->newer;
  else
    s->oldest = block->newer;
}

// Index of the first bucket whose size is >= size.
static size_t bucket_search(const shard *s, size_t size) {
  size_t low = 0, high = s->bucket_count;
  while (low < high) {
    size_t middle = low + (high - low) / 2;
    if (s->buckets[middle].size < size)
      low = middle + 1;
    else
      high = middle;
  }
  return low;
}

static bool bucket_insert(shard *s, cblock *block) {
  size_t index = bucket_search(s, block->size);
  if (index < s->bucket_count && s->buckets[index].size == block->size) {
    list_push(&s->buckets[index].head, block);
    return true;
  }
  if (s->bucket_count == s->bucket_capacity) {
    size_t capacity = s->bucket_capacity ? 2 * s->bucket_capacity : 16;
    size_bucket *grown = devbuf__malloc(capacity * sizeof *grown);
    if (!grown) return false;
    if (s->bucket_count) memcpy(grown, s->buckets, s->bucket_count * sizeof *grown);
    devbuf__free(s->buckets);
    s->buckets = grown;
    s->bucket_capacity = capacity;
  }
  memmove(&s->buckets[index + 1], &s->buckets[index], (s->bucket_count - index) * sizeof *s->buckets);
  s->buckets[index].size = block->size;
  s->buckets[index].head = NULL;
  s->bucket_count++;
  list_push(&s->buckets[index].head, block);
  return true;
}

static bool is_small(const caching_allocator *self, size_t size) { return size <= self->small_limit; }

// Puts a block into a shard; false if bookkeeping memory ran out.
static bool shard_insert(caching_allocator *self, shard *s, cblock *block) {
  if (is_small(self, block->size)) {
    list_push(&s->small[block->size / SMALL_GRANULE - 1], block);
  } else if (!bucket_insert(s, block)) {
    return false;
  }
  lru_push(s, block);
  atomic_fetch_add_explicit(&s->cached_blocks, 1, memory_order_relaxed);
  return true;
}

static void shard_unlink(caching_allocator *self, shard *s, cblock *block) {
  if (is_small(self, block->size)) {
    list_remove(&s->small[block->size / SMALL_GRANULE - 1], block);
  } else {
    size_t index = bucket_search(s, block->size);
    list_remove(&s->buckets[index].head, block);
    if (!s->buckets[index].head) {
      memmove(&s->buckets[index], &s->buckets[index + 1], (s->bucket_count - index - 1) * sizeof *s->buckets);
      s->bucket_count--;
    }
  }
  lru_remove(s, block);
  atomic_fetch_sub_explicit(&s->cached_blocks, 1, memory_order_relaxed);
}

// Best fit in [size, limit] within one shard, removed from it; NULL if none.
static cblock *shard_take(caching_allocator *self, shard *s, size_t size, size_t limit) {
  cblock *block = NULL;
  if (is_small(self, size)) {
    size_t last = (limit < self->small_limit ? limit : self->small_limit) / SMALL_GRANULE;
    for (size_t c = size / SMALL_GRANULE; c <= last && !block; c++) block = s->small[c - 1];
  }
  if (!block && s->bucket_count) {
    size_t index = bucket_search(s, size);
    if (index < s->bucket_count && s->buckets[index].size <= limit) block = s->buckets[index].head;
  }
  if (block) shard_unlink(self, s, block);
  return block;
}

// ---- giving memory back ---------------------------------------------------------------

static void give_back(caching_allocator *self, cblock *block) {
  atomic_fetch_sub_explicit(&self->reserved, block->size, memory_order_relaxed);
  atomic_fetch_add_explicit(&self->system_frees, 1, memory_order_relaxed);
  devbuf_allocator_free(self->upstream, &block->upstream);
  devbuf__free(block);
}

// Evicts the least recently released block of all shards. False when the shards are empty.
static bool evict_oldest(caching_allocator *self) {
  for (;;) {
    shard *victim = NULL;
    uint64_t oldest_tick = UINT64_MAX;
    for (int i = 0; i < SHARD_COUNT; i++) {
      shard *s = &self->shards[i];
      if (!atomic_load_explicit(&s->cached_blocks, memory_order_relaxed)) continue;
      pthread_mutex_lock(&s->lock);
      if (s->oldest && s->oldest->released_at < oldest_tick) {
        oldest_tick = s->oldest->released_at;
        victim = s;
      }
      pthread_mutex_unlock(&s->lock);
    }
    if (!victim) return false;
    pthread_mutex_lock(&victim->lock);
    cblock *block = victim->oldest;
    if (!block || block->released_at != oldest_tick) { // another thread got there first
      pthread_mutex_unlock(&victim->lock);
      continue;
    }
    shard_unlink(self, victim, block);
    pthread_mutex_unlock(&victim->lock);
    atomic_fetch_sub_explicit(&self->shard_cached, block->size, memory_order_relaxed);
    give_back(self, block);
    return true;
  }
}

// Gives back cached blocks, oldest first, while the cache is over its limit or the reserved
// bytes are over the memory limit (either may have been lowered while memory was in use).
static void enforce_limits(caching_allocator *self) {
  for (;;) {
    uint64_t cache_limit = atomic_load_explicit(&self->cache_limit, memory_order_relaxed);
    uint64_t memory_limit = atomic_load_explicit(&self->memory_limit, memory_order_relaxed);
    bool over = (cache_limit && atomic_load_explicit(&self->shard_cached, memory_order_relaxed) > cache_limit) ||
                (memory_limit && atomic_load_explicit(&self->reserved, memory_order_relaxed) > memory_limit);
    if (DEVBUF_LIKELY(!over) || !evict_oldest(self)) return;
  }
}

void devbuf__caching_shard_insert(caching_allocator *self, cblock *block, bool may_give_back) {
  block->released_at = atomic_fetch_add_explicit(&self->tick, 1, memory_order_relaxed);
  // Once the shard's lock is given back the block is the shard's: another thread may evict
  // and free it at once, so nothing below reads it.
  size_t size = block->size;
  shard *home = my_shard(self);
  pthread_mutex_lock(&home->lock);
  bool cached = shard_insert(self, home, block);
  if (cached) atomic_fetch_add_explicit(&self->shard_cached, size, memory_order_relaxed);
  pthread_mutex_unlock(&home->lock);
  if (DEVBUF_UNLIKELY(!cached)) {
    give_back(self, block);
    return;
  }
  if (may_give_back) enforce_limits(self);
}

// ---- statistics helpers ---------------------------------------------------------------

static void raise_peak(atomic_uint_least64_t *peak, uint64_t value) {
  uint64_t seen = atomic_load_explicit(peak, memory_order_relaxed);
  while (seen < value &&
         !atomic_compare_exchange_weak_explicit(peak, &seen, value, memory_order_relaxed, memory_order_relaxed)) {
  }
}

// Sums of the threads' counters.
typedef struct thread_sums {
  uint64_t active, live, binned, hits, calls;
} thread_sums;

static thread_sums sum_threads(caching_allocator *self) {
  thread_sums sums = {.active = atomic_load(&self->homeless_active), .live = atomic_load(&self->homeless_live)};
  for (tcache *c = atomic_load_explicit(&self->threads, memory_order_acquire); c; c = c->next) {
    uint64_t bin_hits = atomic_load_explicit(&c->bin_hits, memory_order_relaxed);
    sums.active += atomic_load_explicit(&c->active, memory_order_relaxed);
    sums.live += atomic_load_explicit(&c->live, memory_order_relaxed);
    sums.hits += bin_hits + atomic_load_explicit(&c->shared_hits, memory_order_relaxed);
    sums.calls += bin_hits + atomic_load_explicit(&c->shared_calls, memory_order_relaxed);
    for (size_t i = 0; i < self->bin_count; i++)
      sums.binned += atomic_load_explicit(&c->bin_count[i], memory_order_relaxed) * self->bin_size[i];
  }
  return sums;
}

// Called when a thread's active figure passes its own last observation: while one thread
// allocates at a time this keeps peak exact; when several race, a sum may miss a moment.
void devbuf__caching_observe_peak(caching_allocator *self) {
  raise_peak(&self->peak, sum_threads(self).active);
}

// ---- allocation ----------------------------------------------------------------------

static devbuf_status fail(caching_allocator *self, devbuf_status status) {
  atomic_fetch_add_explicit(&self->failed, 1, memory_order_relaxed);
  return status;
}

// Memory from upstream, within the memory limit (evicting cache first).
static devbuf_status alloc_from_upstream(caching_allocator *self, size_t requested, size_t size, cblock **out) {
  for (;;) {
    uint64_t limit = atomic_load_explicit(&self->memory_limit, memory_order_relaxed);
    uint64_t reserved = atomic_fetch_add_explicit(&self->reserved, size, memory_order_relaxed) + size;
    if (!limit || reserved <= limit) break;
    atomic_fetch_sub_explicit(&self->reserved, size, memory_order_relaxed);
    if (!evict_oldest(self))
      return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY,
                                      "requested %zu bytes (%zu rounded) with %llu bytes active and a "
                                      "memory limit of %llu bytes",
                                      requested, size, (unsigned long long)sum_threads(self).active,
                                      (unsigned long long)limit));
  }
  cblock *block = devbuf__malloc(sizeof *block);
  devbuf_status status = block ? devbuf_allocator_alloc(self->upstream, size, &block->upstream)
                               : devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a block record");
  // The system may refuse while the cache still holds memory: give the cache back, retry.
  while (status == DEVBUF_OUT_OF_MEMORY && block && evict_oldest(self)) {
    status = devbuf_allocator_alloc(self->upstream, size, &block->upstream);
  }
  if (status != DEVBUF_OK) {
    atomic_fetch_sub_explicit(&self->reserved, size, memory_order_relaxed);
    devbuf__free(block);
    return fail(self, status);
  }
  atomic_fetch_add_explicit(&self->system_allocs, 1, memory_order_relaxed);
  block->size = size;
  block->bin = devbuf__tcache_bin_of(self, size);
  *out = block;
  return DEVBUF_OK;
}

// The shared path: the thread's shard, then the others, then upstream.
static devbuf_status alloc_shared(caching_allocator *self, tcache *cache, size_t requested, size_t size,
                                  size_t limit, cblock **out) {
  shard *home = my_shard(self);
  for (int i = -1; i < SHARD_COUNT; i++) {
    shard *s = i < 0 ? home : &self->shards[i];
    if ((i >= 0 && s == home) || !atomic_load_explicit(&s->cached_blocks, memory_order_relaxed)) continue;
    pthread_mutex_lock(&s->lock);
    cblock *block = shard_take(self, s, size, limit);
    pthread_mutex_unlock(&s->lock);
    if (block) {
      atomic_fetch_sub_explicit(&self->shard_cached, block->size, memory_order_relaxed);
      tcache_add(&cache->shared_hits, 1);
      *out = block;
      return DEVBUF_OK;
    }
  }
  return alloc_from_upstream(self, requested, size, out);
}

// Everything the thread's bins could not serve at once.
static devbuf_status alloc_slow(caching_allocator *self, size_t requested, devbuf_memory_t *out) {
  tcache *cache = devbuf__tcache_get(self);
  if (DEVBUF_UNLIKELY(!cache)) return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a thread cache"));
  tcache_add(&cache->shared_calls, 1);
  size_t size;
  if (DEVBUF_UNLIKELY(!devbuf__caching_round(self, requested, &size)))
    return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY, "requested %zu bytes: too large to round to a page",
                                    requested));
  size_t limit = devbuf__fit_limit(size, self->page);
  cblock *block = devbuf__tcache_take(self, cache, size, limit); // a larger block in the bins
  if (block) {
    tcache_add(&cache->shared_hits, 1);
    caching_hand_out(self, cache, block, out);
    return DEVBUF_OK;
  }
  uint64_t max_buffers = atomic_load_explicit(&self->max_buffers, memory_order_relaxed);
  if (max_buffers) {
    // Every live block counts, also those handed out before the limit was set: the threads'
    // figures, plus the allocations admitted but not yet handed out (each counted before it
    // leaves `admitting`, so a racing check sees it in one or the other).
    uint64_t admitted = atomic_fetch_add(&self->admitting, 1);
    uint64_t live = sum_threads(self).live + admitted;
    if (live >= max_buffers) {
      atomic_fetch_sub(&self->admitting, 1);
      return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY,
                                      "requested %zu bytes with %llu buffers live and a buffer-count limit of %llu",
                                      requested, (unsigned long long)live, (unsigned long long)max_buffers));
    }
  }
  devbuf_status status = alloc_shared(self, cache, requested, size, limit, &block);
  if (status == DEVBUF_OK) caching_hand_out(self, cache, block, out);
  if (max_buffers) atomic_fetch_sub(&self->admitting, 1);
  return status;
}

static devbuf_status caching_alloc(devbuf_allocator_t *base, size_t requested, devbuf_memory_t *out) {
  caching_allocator *self = (caching_allocator *)base;
  if (DEVBUF_LIKELY(devbuf__tcache_alloc(self, requested, out))) return DEVBUF_OK;
  return alloc_slow(self, requested, out);
}

static void caching_free(devbuf_allocator_t *base, const devbuf_memory_t *memory) {
  caching_allocator *self = (caching_allocator *)base;
  cblock *block = memory->token;
  if (DEVBUF_LIKELY(devbuf__tcache_free(self, block))) return;
  tcache *cache = devbuf__tcache_get(self);
  if (DEVBUF_LIKELY(cache != NULL)) {
    tcache_add(&cache->live, (uint64_t)-1);
    tcache_add(&cache->active, (uint64_t)0 - block->size);
  } else { // no host memory for a thread cache: count the release in the shared figures
    atomic_fetch_sub(&self->homeless_live, 1);
    atomic_fetch_sub(&self->homeless_active, block->size);
  }
  devbuf__caching_shard_insert(self, block, true);
}

// ---- statistics, options, lifetime ---------------------------------------------------

static void caching_stats(devbuf_allocator_t *base, devbuf_allocator_stats_t *out) {
  caching_allocator *self = (caching_allocator *)base;
  thread_sums sums = sum_threads(self);
  raise_peak(&self->peak, sums.active);
  out->active = sums.active;
  out->peak = atomic_load(&self->peak);
  out->cached = atomic_load(&self->shard_cached) + sums.binned;
  out->live_buffers = sums.live;
  out->system_allocs = atomic_load(&self->system_allocs);
  out->system_frees = atomic_load(&self->system_frees);
  out->failed_allocs = atomic_load(&self->failed);
  out->cache_hits = sums.hits;
  out->alloc_calls = sums.calls;
}

static void caching_reset_peak(devbuf_allocator_t *base) {
  caching_allocator *self = (caching_allocator *)base;
  for (tcache *c = atomic_load_explicit(&self->threads, memory_order_acquire); c; c = c->next)
    atomic_store_explicit(&c->local_peak, atomic_load_explicit(&c->active, memory_order_relaxed), memory_order_relaxed);
  atomic_store(&self->peak, sum_threads(self).active);
}

// Other threads empty their bins into the shards at their next call.
static void request_flush(caching_allocator *self) { atomic_fetch_add(&self->flush_epoch, 1); }

static void caching_clear_cache(devbuf_allocator_t *base) {
  caching_allocator *self = (caching_allocator *)base;
  request_flush(self);
  tcache *mine = devbuf__tcache_get(self);
  if (mine) devbuf__tcache_flush(self, mine, true);
  while (evict_oldest(self)) {
  }
}

static void caching_destroy(devbuf_allocator_t *base) {
  caching_allocator *self = (caching_allocator *)base;
  devbuf__tcache_detach_all(self); // the bins go to the shards ...
  while (evict_oldest(self)) {     // ... and everything back upstream
  }
  for (int i = 0; i < SHARD_COUNT; i++) {
    pthread_mutex_destroy(&self->shards[i].lock);
    devbuf__free(self->shards[i].buckets);
  }
  devbuf_allocator_release(self->upstream);
  devbuf__free(self);
}

static const devbuf__allocator_ops caching_ops = {
    .kind = "caching",
    .alloc = caching_alloc,
    .free = caching_free,
    .destroy = caching_destroy,
    .stats = caching_stats,
    .reset_peak = caching_reset_peak,
    .clear_cache = caching_clear_cache,
};

static void apply_options(caching_allocator *self, const devbuf_caching_options_t *options) {
  atomic_store(&self->memory_limit, options->memory_limit);
  atomic_store(&self->cache_limit, options->cache_limit);
  atomic_store(&self->max_buffers, options->max_buffers);
  // Limits need every free block where eviction can reach it: thread bins only without them.
  atomic_store(&self->bins_allowed, !options->memory_limit && !options->cache_limit && !options->max_buffers);
  request_flush(self);
}

devbuf_status devbuf__caching_allocator_create(devbuf_allocator_t *upstream, const devbuf_caching_options_t *options,
                                               devbuf__device_link link, devbuf_allocator_t **out) {
  caching_allocator *self = devbuf__calloc(1, sizeof *self);
  if (!self) {
    devbuf_allocator_release(upstream);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a caching allocator");
  }
  devbuf__allocator_init(&self->base, &caching_ops, upstream->device, link);
  self->base.memory_kind = upstream->memory_kind;
  self->id = devbuf__next_id();
  self->upstream = upstream;
  self->page = options->page_size ? options->page_size : upstream->device->page_size;
  self->page_shift = (unsigned)__builtin_ctzll(self->page);
  self->small_classes = self->page / SMALL_GRANULE;
  if (self->small_classes > MAX_SMALL_CLASSES) self->small_classes = MAX_SMALL_CLASSES;
  self->small_limit = self->small_classes * SMALL_GRANULE;
  for (int i = 0; i < SHARD_COUNT; i++) devbuf__mutex_init(&self->shards[i].lock);
  devbuf__tcache_init_bins(self);
  apply_options(self, options);
  *out = &self->base;
  return DEVBUF_OK;
}

devbuf_status devbuf_caching_allocator_create(devbuf_allocator_t *upstream, const devbuf_caching_options_t *options,
                                              devbuf_allocator_t **out_allocator) {
  if (!upstream || !out_allocator) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "upstream or out_allocator is NULL");
  uint64_t page = options ? options->page_size : 0;
  if (page && (page < 4096 || page > ((uint64_t)1 << 30) || (page & (page - 1))))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "page_size %llu: a power of two from 4096 to 2^30, or 0",
                         (unsigned long long)page);
  devbuf_caching_options_t none = {0};
  return devbuf__caching_allocator_create(devbuf_allocator_retain(upstream), options ? options : &none,
                                          DEVBUF__HOLDS_DEVICE, out_allocator);
}

devbuf_status devbuf_caching_allocator_set_options(devbuf_allocator_t *allocator,
                                                   const devbuf_caching_options_t *options) {
  if (!allocator || !options || allocator->ops != &caching_ops)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "set_options needs a caching allocator and options");
  caching_allocator *self = (caching_allocator *)allocator;
  apply_options(self, options);
  tcache *mine = devbuf__tcache_get(self);
  if (mine) devbuf__tcache_flush(self, mine, true); // the caller's own bins obey at once
  enforce_limits(self);
  return DEVBUF_OK;
}
