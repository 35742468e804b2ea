// Thread caches of the caching allocator: each thread keeps a few recently released blocks
// per size (up to 16 pages) and its own counters, so that the common alloc/free pair takes
// no lock and writes no memory that another thread writes. Slow events (a thread's first
// call, its exit, flush requests, an allocator's destruction) take one global lock.
#include "caching.h"

#include <stdlib.h>

#define SLOTS 4 // allocators a thread keeps a cache for at once; slots[0] is the latest

typedef struct slot {
  uint64_t allocator_id; // caching_allocator.id; 0: free
  tcache *cache;
} slot;

static pthread_mutex_t global_lock = DEVBUF__MUTEX_INITIALIZER; // nodes' owner/adopted fields
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;
// initial-exec: the hot path reads these with one instruction, not a __tls_get_addr call.
static _Thread_local slot slots[SLOTS] __attribute__((tls_model("initial-exec")));
static _Thread_local bool exit_hook_set;
static _Thread_local unsigned next_victim;

void devbuf__tcache_init_bins(caching_allocator *self) {
  size_t count = 0;
  size_t page = self->policy.page;
  for (size_t c = 1; c <= self->small_classes; c++) self->bin_size[count++] = c * GRANULE;
  if (self->small_limit == page)
    for (size_t pages = 2; pages <= TCACHE_MAX_PAGES; pages++)
      self->bin_size[count++] = pages * page;
  for (size_t i = 0; i < count; i++) {
    size_t capacity = TCACHE_CLASS_BYTES / self->bin_size[i];
    self->bin_capacity[i] = capacity < TCACHE_MIN_BLOCKS ? TCACHE_MIN_BLOCKS : (uint32_t)capacity;
  }
  self->classed_limit = self->bin_size[count - 1];
  self->pow2_base = count;
  unsigned shift = 17;
  while (shift <= TCACHE_POW2_TOP && ((size_t)1 << shift) <= self->classed_limit) shift++;
  self->pow2_first_shift = shift;
  for (; shift <= TCACHE_POW2_TOP && ((size_t)1 << shift) <= self->policy.small_max; shift++) {
    self->bin_size[count] = (size_t)1 << shift;
    self->bin_capacity[count++] = 1; // up to 1.9 MiB a thread in all
  }
  self->bin_count = count;
}

// The power-of-two bin of a block of `size` bytes (above classed_limit), or bin_count.
static inline uint32_t pow2_bin_of(const caching_allocator *self, size_t size) {
  if (size & (size - 1)) return (uint32_t)self->bin_count;
  size_t bin = self->pow2_base + (unsigned)__builtin_ctzll(size) - self->pow2_first_shift;
  return bin < self->bin_count ? (uint32_t)bin : (uint32_t)self->bin_count;
}

uint32_t devbuf__tcache_bin_of(const caching_allocator *self, size_t size) {
  if (size <= self->small_limit) return (uint32_t)(size / GRANULE - 1);
  if (size > self->classed_limit) return pow2_bin_of(self, size);
  size_t index = self->small_classes + (size >> self->page_shift) - 2;
  return index < self->bin_count && self->bin_size[index] == size ? (uint32_t)index
                                                                  : (uint32_t)self->bin_count;
}

static int by_release(const void *a, const void *b) {
  uint64_t x = (*(cblock *const *)a)->released_at, y = (*(cblock *const *)b)->released_at;
  return (x > y) - (x < y);
}

bool devbuf__tcache_flush(caching_allocator *self, tcache *cache, bool may_give_back) {
  size_t total = 0;
  for (size_t c = 0; c < self->bin_count; c++)
    total += atomic_load_explicit(&cache->bin_count[c], memory_order_relaxed);
  if (!total) return false;
  // Into the shared pools in release order: segments then become idle in the true order.
  cblock **blocks = devbuf__malloc(total * sizeof *blocks);
  size_t n = 0;
  for (size_t c = 0; c < self->bin_count; c++) {
    while (cache->bins[c]) {
      cblock *block = cache->bins[c];
      cache->bins[c] = block->bin_next;
      atomic_store_explicit(&cache->bin_count[c],
                            atomic_load_explicit(&cache->bin_count[c], memory_order_relaxed) - 1,
                            memory_order_relaxed);
      if (blocks)
        blocks[n++] = block;
      else
        devbuf__caching_put(self, block, may_give_back); // no memory to sort: any order
    }
  }
  if (!blocks) return true;
  qsort(blocks, n, sizeof *blocks, by_release);
  for (size_t i = 0; i < n; i++) devbuf__caching_put(self, blocks[i], may_give_back);
  devbuf__free(blocks);
  return true;
}

// A slot's cache goes back to its allocator (or is freed if the allocator is gone).
// Caller holds global_lock.
static void release_slot(slot *s) {
  tcache *cache = s->cache;
  if (cache) {
    if (cache->owner) {
      devbuf__tcache_flush(cache->owner, cache, false); // under the global lock
      cache->adopted = false; // counters stay: the next thread adopts them
    } else {
      devbuf__free(cache);
    }
  }
  s->cache = NULL;
  s->allocator_id = 0;
}

static void on_thread_exit(void *unused) {
  (void)unused;
  pthread_mutex_lock(&global_lock);
  for (int i = 0; i < SLOTS; i++) release_slot(&slots[i]);
  pthread_mutex_unlock(&global_lock);
}

static void create_exit_key(void) { pthread_key_create(&exit_key, on_thread_exit); }

// Adopts a cache left by an exited thread, or makes one. Caller holds global_lock.
static tcache *adopt_or_create(caching_allocator *self) {
  tcache *cache = NULL;
  for (tcache *c = atomic_load_explicit(&self->threads, memory_order_relaxed); c && !cache;
       c = c->next)
    if (!c->adopted) cache = c;
  if (!cache) {
    cache = devbuf__calloc(1, sizeof *cache);
    if (!cache) return NULL;
    cache->owner = self;
    cache->next = atomic_load_explicit(&self->threads, memory_order_relaxed);
    atomic_store_explicit(&self->threads, cache, memory_order_release);
  }
  cache->adopted = true;
  cache->seen_epoch = atomic_load_explicit(&self->flush_epoch, memory_order_acquire);
  cache->bins_on = atomic_load(&self->bins_allowed);
  atomic_store_explicit(&cache->local_peak,
                        atomic_load_explicit(&cache->active, memory_order_relaxed),
                        memory_order_relaxed);
  return cache;
}

// Finds or makes the thread's cache for `self` and moves it to slots[0].
static tcache *find_slow(caching_allocator *self) {
  slot found = {0};
  int index = -1;
  for (int i = 1; i < SLOTS && index < 0; i++)
    if (slots[i].allocator_id == self->id) index = i;
  if (index > 0) {
    found = slots[index];
  } else {
    if (!exit_hook_set) {
      pthread_once(&exit_key_once, create_exit_key);
      pthread_setspecific(exit_key, slots); // any non-NULL value makes the destructor run
      exit_hook_set = true;
    }
    pthread_mutex_lock(&global_lock);
    for (int i = 0; i < SLOTS && index < 0; i++)
      if (!slots[i].cache) index = i;
    if (index < 0) {
      index = (int)(1 + next_victim++ % (SLOTS - 1)); // keep slots[0]: it moves down below
      release_slot(&slots[index]);
    }
    found.cache = adopt_or_create(self);
    found.allocator_id = found.cache ? self->id : 0;
    pthread_mutex_unlock(&global_lock);
    if (!found.cache) return NULL;
  }
  slots[index] = slots[0];
  slots[0] = found;
  return found.cache;
}

// Empties the bins when another thread asked for it (clear_cache, new options).
static void obey_flush_requests(caching_allocator *self, tcache *cache) {
  uint64_t epoch = atomic_load_explicit(&self->flush_epoch, memory_order_acquire);
  if (epoch == cache->seen_epoch) return;
  cache->seen_epoch = epoch;
  devbuf__tcache_flush(self, cache, true);
  cache->bins_on = atomic_load(&self->bins_allowed);
}

tcache *devbuf__tcache_get(caching_allocator *self) {
  tcache *cache =
      DEVBUF_LIKELY(slots[0].allocator_id == self->id) ? slots[0].cache : find_slow(self);
  if (cache) obey_flush_requests(self, cache);
  return cache;
}

// The calling thread's cache when the hot path may use its bins; NULL sends it the slow way.
static inline tcache *hot_cache(caching_allocator *self) {
  if (DEVBUF_UNLIKELY(slots[0].allocator_id != self->id)) return NULL;
  tcache *cache = slots[0].cache;
  if (DEVBUF_UNLIKELY(!cache->bins_on ||
                      atomic_load_explicit(&self->flush_epoch, memory_order_relaxed) !=
                          cache->seen_epoch))
    return NULL;
  return cache;
}

static inline void bin_count_add(tcache *cache, size_t bin, uint32_t delta) {
  atomic_store_explicit(&cache->bin_count[bin],
                        atomic_load_explicit(&cache->bin_count[bin], memory_order_relaxed) + delta,
                        memory_order_relaxed);
}

bool devbuf__tcache_alloc(caching_allocator *self, size_t requested, devbuf_memory_t *out) {
  tcache *cache = hot_cache(self);
  if (!cache || requested > self->bin_size[self->bin_count - 1]) return false;
  size_t bin;
  if (requested <= self->small_limit)
    bin = (requested + GRANULE - 1) / GRANULE - 1;
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
  tcache_add(&cache->bin_hits, 1);
  devbuf__caching_poison(block, POISON_HANDED_OUT); // binned blocks are never in flight
  caching_hand_out(self, cache, block, out);
  return true;
}

bool devbuf__tcache_free(caching_allocator *self, cblock *block) {
  tcache *cache = hot_cache(self);
  uint32_t bin = block->bin;
  if (!cache || bin >= self->bin_count ||
      atomic_load_explicit(&cache->bin_count[bin], memory_order_relaxed) >= self->bin_capacity[bin])
    return false;
  tcache_add(&cache->live, (uint64_t)-1);
  tcache_add(&cache->active, (uint64_t)0 - block->size);
  block->released_at = cache->release_seq++;
  atomic_store_explicit(&block->state, BLOCK_BINNED, memory_order_relaxed);
  block->bin_next = cache->bins[bin];
  cache->bins[bin] = block;
  bin_count_add(cache, bin, 1);
  return true;
}

void devbuf__caching_fork_lock_threads(void) { pthread_mutex_lock(&global_lock); }
void devbuf__caching_fork_unlock_threads(void) { pthread_mutex_unlock(&global_lock); }

void devbuf__tcache_detach_all(caching_allocator *self) {
  pthread_mutex_lock(&global_lock);
  tcache *cache = atomic_load_explicit(&self->threads, memory_order_acquire);
  atomic_store_explicit(&self->threads, NULL, memory_order_release);
  while (cache) {
    tcache *next = cache->next;
    devbuf__tcache_flush(self, cache, false); // no thread uses the allocator any more
    if (cache->adopted)
      cache->owner = NULL; // the thread frees it when it exits or needs the slot
    else
      devbuf__free(cache);
    cache = next;
  }
  pthread_mutex_unlock(&global_lock);
}
