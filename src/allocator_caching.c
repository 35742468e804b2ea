// The caching allocator (DESIGN.md A1-A4).
//
// Sizes are rounded to 256-byte classes up to a page and to whole pages above. A released
// block goes into the cache of the releasing thread's shard; an allocation takes the best
// fitting cached block no larger than min(2 x size, size + 2 pages), first from its own
// shard, then from the others, and only then asks the upstream allocator. Each shard has
// its own lock, so the hot path takes one short lock that other threads rarely want.
// Eviction (cache limit, memory limit, clear_cache) gives back the least recently
// released blocks first, across all shards.
#include "internal.h"

#include <stdio.h>
#include <string.h>

#define SHARD_COUNT 16
#define SMALL_GRANULE 256
#define MAX_SMALL_CLASSES 64 // pages up to 16 KiB get direct small classes

typedef struct cblock {
  devbuf_memory_t upstream;          // what the upstream allocator handed out
  size_t size;                       // rounded size: what the statistics count
  struct cblock *next, *prev;        // same-size list while cached (most recent first)
  struct cblock *newer, *older;      // the shard's LRU list while cached
  uint64_t released_at;              // release tick; orders eviction across shards
} cblock;

typedef struct size_bucket {
  size_t size;
  cblock *head;
} size_bucket;

typedef struct shard {
  pthread_mutex_t lock;
  cblock *small[MAX_SMALL_CLASSES];  // small[i]: cached blocks of (i + 1) * 256 bytes
  size_bucket *buckets;              // larger cached blocks, sorted by size
  size_t bucket_count, bucket_capacity;
  cblock *newest, *oldest;           // LRU list of every cached block of the shard
  atomic_size_t cached_blocks;       // read without the lock to skip empty shards
  uint64_t cache_hits, alloc_calls;  // under the lock
  char pad[64];
} shard;

typedef struct caching_allocator {
  devbuf_allocator_t base;
  devbuf_allocator_t *upstream;      // owned reference
  size_t page;                       // rounding granularity above the small classes
  size_t small_limit;                // largest size served by small classes
  atomic_uint_least64_t memory_limit, cache_limit, max_buffers; // 0: none
  atomic_uint_least64_t active;      // bytes in live blocks
  atomic_uint_least64_t peak;
  atomic_uint_least64_t cached;      // bytes in cached blocks
  atomic_uint_least64_t reserved;    // active + cached: what upstream holds for us
  atomic_uint_least64_t live;        // live blocks
  atomic_uint_least64_t tick;        // release clock for LRU order
  atomic_uint_least64_t system_allocs, system_frees, failed;
  shard shards[SHARD_COUNT];
} caching_allocator;

static atomic_uint next_shard_index;
static _Thread_local unsigned thread_shard = ~0u;

static inline shard *my_shard(caching_allocator *self) {
  if (DEVBUF_UNLIKELY(thread_shard == ~0u)) thread_shard = atomic_fetch_add(&next_shard_index, 1) % SHARD_COUNT;
  return &self->shards[thread_shard];
}

static bool round_size(const caching_allocator *self, size_t size, size_t *out) {
  size_t granule = size <= self->page ? SMALL_GRANULE : self->page;
  size_t padded;
  if (devbuf__add_overflows(size, granule - 1, &padded)) return false;
  *out = padded & ~(granule - 1);
  return true;
}

// Largest cached size acceptable for a request of `size` (A1): min(2 x size, size + 2 pages).
static size_t fit_limit(const caching_allocator *self, size_t size) {
  size_t twice = size > SIZE_MAX / 2 ? SIZE_MAX : 2 * size;
  size_t plus = size > SIZE_MAX - 2 * self->page ? SIZE_MAX : size + 2 * self->page;
  return twice < plus ? twice : plus;
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

static void bucket_remove(shard *s, size_t index, cblock *block) {
  list_remove(&s->buckets[index].head, block);
  if (s->buckets[index].head) return;
  memmove(&s->buckets[index], &s->buckets[index + 1], (s->bucket_count - index - 1) * sizeof *s->buckets);
  s->bucket_count--;
}

static bool is_small(const caching_allocator *self, size_t size) { return size <= self->small_limit; }

// Puts a block into the shard's cache; false if bookkeeping memory ran out.
static bool cache_insert(caching_allocator *self, shard *s, cblock *block) {
  if (is_small(self, block->size)) {
    list_push(&s->small[block->size / SMALL_GRANULE - 1], block);
  } else if (!bucket_insert(s, block)) {
    return false;
  }
  lru_push(s, block);
  atomic_fetch_add_explicit(&s->cached_blocks, 1, memory_order_relaxed);
  return true;
}

// Takes a specific cached block out of the shard.
static void cache_unlink(caching_allocator *self, shard *s, cblock *block) {
  if (is_small(self, block->size)) {
    list_remove(&s->small[block->size / SMALL_GRANULE - 1], block);
  } else {
    size_t index = bucket_search(s, block->size);
    bucket_remove(s, index, block);
  }
  lru_remove(s, block);
  atomic_fetch_sub_explicit(&s->cached_blocks, 1, memory_order_relaxed);
}

// Best fit in [size, limit] within one shard, removed from the cache; NULL if none.
static cblock *cache_take(caching_allocator *self, shard *s, size_t size, size_t limit) {
  cblock *block = NULL;
  if (is_small(self, size)) {
    size_t last = (limit < self->small_limit ? limit : self->small_limit) / SMALL_GRANULE;
    for (size_t c = size / SMALL_GRANULE; c <= last && !block; c++) block = s->small[c - 1];
  }
  if (!block && s->bucket_count) {
    size_t index = bucket_search(s, size);
    if (index < s->bucket_count && s->buckets[index].size <= limit) block = s->buckets[index].head;
  }
  if (block) cache_unlink(self, s, block);
  return block;
}

// ---- statistics helpers ---------------------------------------------------------------

static void raise_peak(atomic_uint_least64_t *peak, uint64_t value) {
  uint64_t seen = atomic_load_explicit(peak, memory_order_relaxed);
  while (seen < value &&
         !atomic_compare_exchange_weak_explicit(peak, &seen, value, memory_order_relaxed, memory_order_relaxed)) {
  }
}

static void give_back(caching_allocator *self, cblock *block) {
  atomic_fetch_sub_explicit(&self->reserved, block->size, memory_order_relaxed);
  atomic_fetch_add_explicit(&self->system_frees, 1, memory_order_relaxed);
  devbuf_allocator_free(self->upstream, &block->upstream);
  devbuf__free(block);
}

// Evicts the least recently released block of all shards. False when nothing is cached.
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
    cache_unlink(self, victim, block);
    pthread_mutex_unlock(&victim->lock);
    atomic_fetch_sub_explicit(&self->cached, block->size, memory_order_relaxed);
    give_back(self, block);
    return true;
  }
}

// ---- allocation ----------------------------------------------------------------------

static devbuf_status fail(caching_allocator *self, devbuf_status status) {
  atomic_fetch_add_explicit(&self->failed, 1, memory_order_relaxed);
  return status;
}

// Memory from upstream, within the memory limit (evicting cache first).
static devbuf_status alloc_from_upstream(caching_allocator *self, size_t requested, size_t size,
                                         cblock **out) {
  for (;;) {
    uint64_t limit = atomic_load_explicit(&self->memory_limit, memory_order_relaxed);
    uint64_t reserved = atomic_fetch_add_explicit(&self->reserved, size, memory_order_relaxed) + size;
    if (!limit || reserved <= limit) break;
    atomic_fetch_sub_explicit(&self->reserved, size, memory_order_relaxed);
    if (!evict_oldest(self))
      return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY,
                                      "requested %zu bytes (%zu rounded) with %llu bytes active and a "
                                      "memory limit of %llu bytes",
                                      requested, size, (unsigned long long)atomic_load(&self->active),
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
  *out = block;
  return DEVBUF_OK;
}

// A miss in the thread's own shard: look in the others, then go upstream.
static devbuf_status alloc_slow(caching_allocator *self, shard *home, size_t requested, size_t size,
                                cblock **out) {
  size_t limit = fit_limit(self, size);
  for (int i = 0; i < SHARD_COUNT; i++) {
    shard *s = &self->shards[i];
    if (s == home || !atomic_load_explicit(&s->cached_blocks, memory_order_relaxed)) continue;
    pthread_mutex_lock(&s->lock);
    cblock *block = cache_take(self, s, size, limit);
    if (block) s->cache_hits++;
    pthread_mutex_unlock(&s->lock);
    if (block) {
      atomic_fetch_sub_explicit(&self->cached, block->size, memory_order_relaxed);
      *out = block;
      return DEVBUF_OK;
    }
  }
  return alloc_from_upstream(self, requested, size, out);
}

static devbuf_status caching_alloc(devbuf_allocator_t *base, size_t requested, devbuf_memory_t *out) {
  caching_allocator *self = (caching_allocator *)base;
  size_t size;
  if (DEVBUF_UNLIKELY(!round_size(self, requested, &size)))
    return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY, "requested %zu bytes: too large to round to a page",
                                    requested));
  uint64_t max_buffers = atomic_load_explicit(&self->max_buffers, memory_order_relaxed);
  uint64_t live = atomic_fetch_add_explicit(&self->live, 1, memory_order_relaxed) + 1;
  if (DEVBUF_UNLIKELY(max_buffers && live > max_buffers)) {
    atomic_fetch_sub_explicit(&self->live, 1, memory_order_relaxed);
    return fail(self, devbuf__error(DEVBUF_OUT_OF_MEMORY,
                                    "requested %zu bytes with %llu buffers live and a buffer-count limit of %llu",
                                    requested, (unsigned long long)(live - 1), (unsigned long long)max_buffers));
  }
  shard *home = my_shard(self);
  pthread_mutex_lock(&home->lock);
  home->alloc_calls++;
  cblock *block = cache_take(self, home, size, fit_limit(self, size));
  if (DEVBUF_LIKELY(block != NULL)) home->cache_hits++;
  pthread_mutex_unlock(&home->lock);
  if (DEVBUF_LIKELY(block != NULL)) {
    atomic_fetch_sub_explicit(&self->cached, block->size, memory_order_relaxed);
  } else {
    devbuf_status status = alloc_slow(self, home, requested, size, &block);
    if (status != DEVBUF_OK) {
      atomic_fetch_sub_explicit(&self->live, 1, memory_order_relaxed);
      return status;
    }
  }
  uint64_t active = atomic_fetch_add_explicit(&self->active, block->size, memory_order_relaxed) + block->size;
  raise_peak(&self->peak, active);
  out->host = block->upstream.host;
  out->device = block->upstream.device;
  out->size = block->size;
  out->token = block;
  return DEVBUF_OK;
}

static void caching_free(devbuf_allocator_t *base, const devbuf_memory_t *memory) {
  caching_allocator *self = (caching_allocator *)base;
  cblock *block = memory->token;
  atomic_fetch_sub_explicit(&self->active, block->size, memory_order_relaxed);
  atomic_fetch_sub_explicit(&self->live, 1, memory_order_relaxed);
  block->released_at = atomic_fetch_add_explicit(&self->tick, 1, memory_order_relaxed);
  shard *home = my_shard(self);
  pthread_mutex_lock(&home->lock);
  bool cached = cache_insert(self, home, block);
  pthread_mutex_unlock(&home->lock);
  if (DEVBUF_UNLIKELY(!cached)) {
    give_back(self, block);
    return;
  }
  uint64_t total = atomic_fetch_add_explicit(&self->cached, block->size, memory_order_relaxed) + block->size;
  uint64_t cache_limit = atomic_load_explicit(&self->cache_limit, memory_order_relaxed);
  while (DEVBUF_UNLIKELY(cache_limit && total > cache_limit)) {
    if (!evict_oldest(self)) break;
    total = atomic_load_explicit(&self->cached, memory_order_relaxed);
  }
}

// ---- statistics, options, lifetime ---------------------------------------------------

static void caching_stats(devbuf_allocator_t *base, devbuf_allocator_stats_t *out) {
  caching_allocator *self = (caching_allocator *)base;
  out->active = atomic_load(&self->active);
  out->peak = atomic_load(&self->peak);
  out->cached = atomic_load(&self->cached);
  out->live_buffers = atomic_load(&self->live);
  out->system_allocs = atomic_load(&self->system_allocs);
  out->system_frees = atomic_load(&self->system_frees);
  out->failed_allocs = atomic_load(&self->failed);
  for (int i = 0; i < SHARD_COUNT; i++) {
    shard *s = &self->shards[i];
    pthread_mutex_lock(&s->lock);
    out->cache_hits += s->cache_hits;
    out->alloc_calls += s->alloc_calls;
    pthread_mutex_unlock(&s->lock);
  }
}

static void caching_reset_peak(devbuf_allocator_t *base) {
  caching_allocator *self = (caching_allocator *)base;
  atomic_store(&self->peak, atomic_load(&self->active));
}

static void caching_clear_cache(devbuf_allocator_t *base) {
  caching_allocator *self = (caching_allocator *)base;
  while (evict_oldest(self)) {
  }
}

static void caching_destroy(devbuf_allocator_t *base) {
  caching_allocator *self = (caching_allocator *)base;
  caching_clear_cache(base);
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
}

devbuf_status devbuf__caching_allocator_create(devbuf_allocator_t *upstream,
                                               const devbuf_caching_options_t *options,
                                               devbuf__device_link link, devbuf_allocator_t **out) {
  caching_allocator *self = devbuf__calloc(1, sizeof *self);
  if (!self) {
    devbuf_allocator_release(upstream);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a caching allocator");
  }
  devbuf__allocator_init(&self->base, &caching_ops, upstream->device, link);
  self->upstream = upstream;
  self->page = upstream->device->page_size;
  size_t small_classes = self->page / SMALL_GRANULE;
  if (small_classes > MAX_SMALL_CLASSES) small_classes = MAX_SMALL_CLASSES;
  self->small_limit = small_classes * SMALL_GRANULE;
  for (int i = 0; i < SHARD_COUNT; i++) pthread_mutex_init(&self->shards[i].lock, NULL);
  apply_options(self, options);
  *out = &self->base;
  return DEVBUF_OK;
}

devbuf_status devbuf_caching_allocator_create(devbuf_allocator_t *upstream, const devbuf_caching_options_t *options,
                                              devbuf_allocator_t **out_allocator) {
  if (!upstream || !out_allocator) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "upstream or out_allocator is NULL");
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
  while (options->cache_limit && atomic_load(&self->cached) > options->cache_limit && evict_oldest(self)) {
  }
  while (options->memory_limit && atomic_load(&self->reserved) > options->memory_limit && evict_oldest(self)) {
  }
  return DEVBUF_OK;
}
