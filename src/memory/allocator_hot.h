// devbuf_allocator_alloc and devbuf_allocator_free for callers whose arguments are known
// good (a size above 0), inline in each caller: the caching allocator's thread bins with no
// call at all, so that a buffer's allocate + release makes no call its allocator's pair does
// not. Everything else goes through allocator.c. Not installed.
#ifndef DEVBUF_ALLOCATOR_HOT_H
#define DEVBUF_ALLOCATOR_HOT_H

#include "caching/tcache_hot.h"

// Allocators other than the caching one, and its own misses of the bins (allocator.c).
devbuf_status devbuf__allocator_alloc_unbinned(devbuf_allocator_t *allocator, size_t size,
                                               devbuf_memory_t *out);
// Allocators other than the caching one (allocator.c).
void devbuf__allocator_free_uncached(devbuf_allocator_t *allocator, const devbuf_memory_t *memory);

// A block of the caching allocator's thread bins, with no call; false (nothing taken) for
// other allocators or when the calling thread's bins have none.
static inline bool devbuf__allocator_alloc_binned(devbuf_allocator_t *allocator, size_t size,
                                                  devbuf_memory_t *out) {
  return DEVBUF_LIKELY(allocator->ops == &devbuf__caching_ops) &&
         devbuf__tcache_alloc((caching_allocator *)allocator, size, out);
}

static inline devbuf_status devbuf__allocator_alloc_known(devbuf_allocator_t *allocator,
                                                          size_t size, devbuf_memory_t *out) {
  if (devbuf__allocator_alloc_binned(allocator, size, out)) return DEVBUF_OK;
  return devbuf__allocator_alloc_unbinned(allocator, size, out);
}

// The cache whose bin takes `memory` back, with no call: the calling thread's cache of the
// caching allocator when the block's bin has room; NULL for other allocators or a full bin.
static inline tcache *devbuf__allocator_bin_for(devbuf_allocator_t *allocator,
                                                const devbuf_memory_t *memory) {
  return DEVBUF_LIKELY(allocator->ops == &devbuf__caching_ops)
             ? devbuf__tcache_room_for((caching_allocator *)allocator,
                                       ((const cblock *)memory->token)->bin)
             : NULL;
}
// Gives `memory` back to its bin of the cache devbuf__allocator_bin_for returned.
static inline void devbuf__allocator_free_to_bin(tcache *cache, const devbuf_memory_t *memory) {
  cblock *block = memory->token;
  devbuf__caching_poison(block, POISON_RELEASED);
  devbuf__tcache_bin(cache, block, block->bin);
}

static inline void devbuf__allocator_free_known(devbuf_allocator_t *allocator,
                                                const devbuf_memory_t *memory) {
  if (DEVBUF_LIKELY(allocator->ops == &devbuf__caching_ops)) {
    cblock *block = memory->token;
    devbuf__caching_poison(block, POISON_RELEASED);
    if (!devbuf__tcache_free((caching_allocator *)allocator, block))
      devbuf__caching_free_shared((caching_allocator *)allocator, block);
    return;
  }
  devbuf__allocator_free_uncached(allocator, memory);
}

#endif // DEVBUF_ALLOCATOR_HOT_H
