// Thread caches of the caching allocator: each thread keeps a few recently released blocks
// per size (up to 16 pages) and its own counters, so that the common alloc/free pair takes
// no lock and writes no memory that another thread writes. Slow events (a thread's first
// call, its exit, flush requests, an allocator's destruction) take one global lock.
#include "tcache_hot.h"

#include <stdlib.h>

static pthread_mutex_t global_lock = DEVBUF__MUTEX_INITIALIZER; // nodes' owner/adopted fields
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;
_Thread_local devbuf__tcache_slot devbuf__tcache_slots[TCACHE_SLOTS]
    __attribute__((tls_model("initial-exec")));
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
  // The first power of two above the other bins: 64 KiB where pages of 64 KiB and more leave
  // the classes at 32 KiB (CUDA's 2 MiB), else past the page bins.
  unsigned shift = 16;
  while (shift <= TCACHE_POW2_TOP && ((size_t)1 << shift) <= self->classed_limit) shift++;
  self->pow2_first_shift = shift;
  for (; shift <= TCACHE_POW2_TOP && ((size_t)1 << shift) <= self->policy.small_max; shift++) {
    self->bin_size[count] = (size_t)1 << shift;
    self->bin_capacity[count++] = 1; // up to 1.9 MiB a thread in all
  }
  self->bin_count = count;
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

bool devbuf__tcache_unpark(caching_allocator *self, tcache *cache, bool may_give_back) {
  cblock *block = take_parked(cache);
  if (!block) return false; // none, or another thread took it first
  devbuf__caching_put(self, block, may_give_back);
  return true;
}

bool devbuf__tcache_unpark_all(caching_allocator *self, bool may_give_back) {
  bool any = false;
  for (tcache *c = atomic_load_explicit(&self->threads, memory_order_acquire); c; c = c->next)
    any |= devbuf__tcache_unpark(self, c, may_give_back);
  return any;
}

bool devbuf__tcache_flush(caching_allocator *self, tcache *cache, bool may_give_back) {
  bool unparked = devbuf__tcache_unpark(self, cache, may_give_back);
  size_t total = 0;
  for (size_t c = 0; c < self->bin_count; c++)
    total += atomic_load_explicit(&cache->bin_count[c], memory_order_relaxed);
  if (!total) return unparked;
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
static void release_slot(devbuf__tcache_slot *s) {
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
  // Another key's destructor that runs after this one may still free blocks into a cache
  // it adopts: the key is set again then, so this runs again (as record_cache.c does).
  exit_hook_set = false;
  pthread_mutex_lock(&global_lock);
  for (int i = 0; i < TCACHE_SLOTS; i++) release_slot(&devbuf__tcache_slots[i]);
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

// Finds or makes the thread's cache for `self` and moves it to the first slot.
static tcache *find_slow(caching_allocator *self) {
  devbuf__tcache_slot found = {0};
  int index = -1;
  for (int i = 1; i < TCACHE_SLOTS && index < 0; i++)
    if (devbuf__tcache_slots[i].allocator_id == self->id) index = i;
  if (index > 0) {
    found = devbuf__tcache_slots[index];
  } else {
    if (!exit_hook_set) {
      pthread_once(&exit_key_once, create_exit_key);
      pthread_setspecific(exit_key,
                          devbuf__tcache_slots); // any non-NULL value makes the destructor run
      exit_hook_set = true;
    }
    pthread_mutex_lock(&global_lock);
    for (int i = 0; i < TCACHE_SLOTS && index < 0; i++)
      if (!devbuf__tcache_slots[i].cache) index = i;
    if (index < 0) {
      index = (int)(1 + next_victim++ % (TCACHE_SLOTS - 1)); // keep [0]: it moves down below
      release_slot(&devbuf__tcache_slots[index]);
    }
    found.cache = adopt_or_create(self);
    found.allocator_id = found.cache ? self->id : 0;
    pthread_mutex_unlock(&global_lock);
    if (!found.cache) return NULL;
  }
  devbuf__tcache_slots[index] = devbuf__tcache_slots[0];
  devbuf__tcache_slots[0] = found;
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
  tcache *cache = DEVBUF_LIKELY(devbuf__tcache_slots[0].allocator_id == self->id)
                      ? devbuf__tcache_slots[0].cache
                      : find_slow(self);
  if (cache) obey_flush_requests(self, cache);
  return cache;
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
