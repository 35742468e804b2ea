// The memory picture: every segment and its blocks, free bytes split where in-flight
// ranges cover them. Each shard is read under its lock; shards one after another.
#include "caching.h"

#include <stdlib.h>

typedef struct picture {
  devbuf_allocator_snapshot_t public;
  devbuf_snapshot_segment_t *segments;
  size_t segment_capacity;
  devbuf_snapshot_block_t *blocks;
  size_t block_count, block_capacity;
} picture;

static bool add_block(picture *p, uint64_t offset, uint64_t size, devbuf_block_state state) {
  if (!size) return true;
  if (p->block_count && p->blocks[p->block_count - 1].state == state &&
      p->blocks[p->block_count - 1].offset + p->blocks[p->block_count - 1].size == offset &&
      state != DEVBUF_BLOCK_ACTIVE && state != DEVBUF_BLOCK_THREAD_CACHED) {
    p->blocks[p->block_count - 1].size += size; // pieces of one free block
    return true;
  }
  if (p->block_count == p->block_capacity) {
    size_t capacity = p->block_capacity ? 2 * p->block_capacity : 64;
    devbuf_snapshot_block_t *grown = devbuf__realloc(p->blocks, capacity * sizeof *grown);
    if (!grown) return false;
    p->blocks = grown;
    p->block_capacity = capacity;
  }
  p->blocks[p->block_count++] = (devbuf_snapshot_block_t){offset, size, state};
  return true;
}

// A free block, cut where in-flight ranges start and end.
static bool add_free(picture *p, const csegment *segment, const cblock *block) {
  size_t at = block->offset, end = block->offset + block->size;
  while (at < end) {
    // The in-flight state at `at`, and where it next changes.
    bool in_flight = false;
    size_t next = end;
    for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next) {
      size_t low = r->offset, high = r->offset + r->size;
      if (low <= at && at < high) {
        in_flight = true;
      } else if (low > at && low < next) {
        next = low;
      }
    }
    if (in_flight) { // runs to the end of the covering ranges
      next = at;
      for (bool grew = true; grew;) {
        grew = false;
        for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next)
          if (r->offset <= next && next < r->offset + r->size) {
            next = r->offset + r->size;
            grew = true;
          }
      }
      if (next > end) next = end;
    }
    if (!add_block(p, at, next - at, in_flight ? DEVBUF_BLOCK_IN_FLIGHT : DEVBUF_BLOCK_FREE))
      return false;
    at = next;
  }
  return true;
}

// A free block of any segment: of a growable one, cut where its mapped ranges start and
// end, the stretches between them unmapped.
static bool add_free_mapped(picture *p, const csegment *segment, const cblock *block) {
  if (!segment->growable) return add_free(p, segment, block);
  size_t at = block->offset, end = block->offset + block->size;
  for (const devbuf__map_range *r = devbuf__ranges_ending_after(segment, at); r && at < end;
       r = devbuf__ranges_next(segment, r)) {
    size_t low = r->offset, high = low + r->size;
    if (low >= end) break;
    if (low > at && !add_block(p, at, low - at, DEVBUF_BLOCK_UNMAPPED)) return false;
    cblock mapped = *block;
    mapped.offset = low > at ? low : at;
    mapped.size = (high < end ? high : end) - mapped.offset;
    if (!add_free(p, segment, &mapped)) return false;
    at = mapped.offset + mapped.size;
  }
  return at >= end || add_block(p, at, end - at, DEVBUF_BLOCK_UNMAPPED);
}

static bool add_segment(picture *p, const csegment *segment) {
  if (p->public.segment_count == p->segment_capacity) {
    size_t capacity = p->segment_capacity ? 2 * p->segment_capacity : 16;
    devbuf_snapshot_segment_t *grown = devbuf__realloc(p->segments, capacity * sizeof *grown);
    if (!grown) return false;
    p->segments = grown;
    p->segment_capacity = capacity;
  }
  size_t first = p->block_count;
  // A growable segment shows its addresses up to its highest mapped byte, and its free
  // bytes that have no memory behind them as unmapped.
  const devbuf__map_range *last = segment->growable ? devbuf__ranges_last(segment) : NULL;
  size_t size = !segment->growable ? segment->size : last ? last->offset + last->size : 0;
  for (const cblock *block = segment->first; block && block->offset < size; block = block->after) {
    block_state state = atomic_load_explicit(&block->state, memory_order_relaxed);
    cblock part = *block;
    if (part.offset + part.size > size) part.size = size - part.offset;
    bool ok = state == BLOCK_FREE ? add_free_mapped(p, segment, &part)
                                  : add_block(p, part.offset, part.size,
                                              state == BLOCK_BINNED ? DEVBUF_BLOCK_THREAD_CACHED
                                                                    : DEVBUF_BLOCK_ACTIVE);
    if (!ok) return false;
  }
  // Block pointers are set once every block is in place (the array may still move).
  p->segments[p->public.segment_count++] = (devbuf_snapshot_segment_t){
      .serial = segment->serial,
      .device = segment->upstream.device,
      .size = size,
      .pool = segment->pool == POOL_SMALL ? "small" : "large",
      .block_count = p->block_count - first,
      .blocks = (const devbuf_snapshot_block_t *)(uintptr_t)first,
  };
  return true;
}

static int by_serial(const void *a, const void *b) {
  uint64_t x = ((const devbuf_snapshot_segment_t *)a)->serial,
           y = ((const devbuf_snapshot_segment_t *)b)->serial;
  return (x > y) - (x < y);
}

devbuf_status devbuf__caching_snapshot(devbuf_allocator_t *allocator,
                                       devbuf_allocator_snapshot_t **out) {
  devbuf__caching_validate((caching_allocator *)allocator);
  caching_allocator *self = (caching_allocator *)allocator;
  picture *p = devbuf__calloc(1, sizeof *p);
  bool ok = p != NULL;
  for (int i = 0; i < SHARD_COUNT && ok; i++) {
    shard *s = &self->shards[i];
    pthread_mutex_lock(&s->lock);
    for (const csegment *segment = s->segments; segment && ok; segment = segment->next)
      ok = add_segment(p, segment);
    pthread_mutex_unlock(&s->lock);
  }
  if (!ok) {
    if (p) {
      devbuf__free(p->segments);
      devbuf__free(p->blocks);
    }
    devbuf__free(p);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a snapshot");
  }
  // Block indices become pointers (no block at all: a growable segment that maps nothing yet).
  for (size_t i = 0; i < p->public.segment_count; i++)
    p->segments[i].blocks = p->blocks ? p->blocks + (uintptr_t)p->segments[i].blocks : NULL;
  if (p->public.segment_count)
    qsort(p->segments, p->public.segment_count, sizeof *p->segments, by_serial);
  p->public.segments = p->segments;
  *out = &p->public;
  return DEVBUF_OK;
}

void devbuf__caching_snapshot_free(devbuf_allocator_snapshot_t *snapshot) {
  picture *p = (picture *)snapshot;
  devbuf__free(p->segments);
  devbuf__free(p->blocks);
  devbuf__free(p);
}
