// Debug validators of the caching allocator (a build with DEVBUF_DEBUG_CHECKS): what its
// structures must agree on, checked while it runs, and poison bytes written over memory it
// hands out and takes back, so that a read of released memory sees garbage, not the old
// values. A broken invariant is a bug in devbuf, not the caller's: it aborts, naming it.
#include "caching.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if DEVBUF_DEBUG_CHECKS

__attribute__((format(printf, 1, 2), noreturn)) static void broken(const char *format, ...) {
  va_list args;
  va_start(args, format);
  fputs("devbuf: caching allocator invariant broken: ", stderr);
  vfprintf(stderr, format, args);
  fputc('\n', stderr);
  va_end(args);
  abort();
}

static bool key_before(const cblock *a, const cblock *b) {
  if (a->size != b->size) return a->size < b->size;
  if (a->segment->serial != b->segment->serial) return a->segment->serial < b->segment->serial;
  return a->offset < b->offset;
}

typedef struct tree_walk {
  const shard *shard;
  int pool;
  const cblock *previous; // in key order
  size_t count;
} tree_walk;

static void walk(tree_walk *w, const cblock *node, uint32_t parent_priority, int depth) {
  if (!node) return;
  if (depth > 4096) broken("free tree deeper than 4096: a cycle?");
  if (node->priority > parent_priority)
    broken("free tree: heap order broken at offset %zu", node->offset);
  walk(w, node->left, node->priority, depth + 1);
  if (atomic_load_explicit(&node->state, memory_order_relaxed) != BLOCK_FREE)
    broken("a block in the free tree is not free (offset %zu, size %zu)", node->offset, node->size);
  if (node->segment->shard != w->shard || node->segment->pool != w->pool)
    broken("a free block sits in another shard's or pool's tree (offset %zu)", node->offset);
  if (w->previous && !key_before(w->previous, node))
    broken("free tree out of (size, segment, offset) order");
  w->previous = node;
  w->count++;
  walk(w, node->right, node->priority, depth + 1);
}

typedef struct listed_walk {
  const csegment *segment;
  const cblock *previous; // in offset order
  size_t count;
} listed_walk;

static void walk_listed(listed_walk *w, const cblock *node, uint32_t parent_priority, int depth) {
  if (!node) return;
  if (depth > 4096) broken("the blocks to unmap: a tree deeper than 4096, a cycle?");
  if (node->priority > parent_priority)
    broken("the blocks to unmap: heap order broken at offset %zu", node->offset);
  walk_listed(w, node->unmappable_left, node->priority, depth + 1);
  if (node->segment != w->segment || !node->unmappable ||
      atomic_load_explicit(&node->state, memory_order_relaxed) != BLOCK_FREE)
    broken("segment %llu lists a block to unmap that is not one of its free ones (offset %zu)",
           (unsigned long long)w->segment->serial, node->offset);
  if (w->previous && w->previous->offset >= node->offset)
    broken("segment %llu: the blocks to unmap are out of offset order at %zu",
           (unsigned long long)w->segment->serial, node->offset);
  w->previous = node;
  w->count++;
  walk_listed(w, node->unmappable_right, node->priority, depth + 1);
}

typedef struct range_walk {
  const csegment *segment;
  size_t end, count, bytes; // of the ranges walked so far, in offset order
} range_walk;

static void walk_ranges(range_walk *w, const devbuf__map_range *node, uint32_t parent_priority,
                        int depth) {
  if (!node) return;
  if (depth > 4096) broken("mapped ranges: a tree deeper than 4096, a cycle?");
  if (node->priority > parent_priority)
    broken("mapped ranges: heap order broken at offset %zu", node->offset);
  walk_ranges(w, node->left, node->priority, depth + 1);
  if ((w->count && node->offset < w->end) || !node->size ||
      node->size > w->segment->size - node->offset)
    broken("segment %llu: the mapped range at %zu (%zu bytes) overlaps another, is empty or "
           "lies outside it",
           (unsigned long long)w->segment->serial, node->offset, node->size);
  w->end = node->offset + node->size;
  w->count++;
  w->bytes += node->size;
  walk_ranges(w, node->right, node->priority, depth + 1);
}

// A growable segment's mapped ranges are disjoint and add up to what it counts mapped; its
// blocks to unmap are the free blocks marked so, and a free block off that list has no whole
// page mapped: a clear gives back all there is.
static void validate_growable(const caching_allocator *self, const csegment *segment) {
  range_walk ranges = {.segment = segment};
  walk_ranges(&ranges, segment->maps, UINT32_MAX, 0);
  if (ranges.bytes != segment->mapped)
    broken("segment %llu counts %zu bytes mapped, its ranges hold %zu",
           (unsigned long long)segment->serial, segment->mapped, ranges.bytes);
  listed_walk w = {.segment = segment};
  walk_listed(&w, segment->unmappable, UINT32_MAX, 0);
  size_t page = self->policy.page, flagged = 0;
  for (const cblock *b = segment->first; b; b = b->after) {
    flagged += b->unmappable;
    if (b->unmappable || atomic_load_explicit(&b->state, memory_order_relaxed) != BLOCK_FREE)
      continue;
    size_t from = caching_round_up(b->offset, page), to = (b->offset + b->size) & ~(page - 1);
    if (from < to && devbuf__growable_maps_any(segment, from, to))
      broken("segment %llu: the free block at offset %zu has pages mapped and is not listed to "
             "unmap",
             (unsigned long long)segment->serial, b->offset);
  }
  if (w.count != flagged)
    broken("segment %llu marks %zu blocks to unmap, lists %zu", (unsigned long long)segment->serial,
           flagged, w.count);
}

void devbuf__caching_validate_shard(caching_allocator *self, shard *s) {
  size_t tree_blocks = 0, listed_free = 0;
  for (int p = 0; p < POOL_COUNT; p++) {
    tree_walk w = {.shard = s, .pool = p};
    walk(&w, s->pools[p].free_root, UINT32_MAX, 0);
    tree_blocks += w.count;
  }
  if (tree_blocks != atomic_load_explicit(&s->free_blocks, memory_order_relaxed))
    broken("shard counts %zu free blocks, its trees hold %zu",
           (size_t)atomic_load_explicit(&s->free_blocks, memory_order_relaxed), tree_blocks);
  uint64_t free_bytes = 0, idle_bytes = 0;
  for (const csegment *segment = s->segments; segment; segment = segment->next) {
    if (segment->shard != s)
      broken("segment %llu listed in another shard", (unsigned long long)segment->serial);
    if (segment->idle) idle_bytes += segment->size;
    size_t offset = 0, used = 0;
    const cblock *before = NULL;
    for (const cblock *block = segment->first; block; before = block, block = block->after) {
      if (block->segment != segment || block->before != before || block->offset != offset ||
          !block->size)
        broken("segment %llu: blocks do not tile it at offset %zu",
               (unsigned long long)segment->serial, offset);
      uint8_t state = atomic_load_explicit(&block->state, memory_order_relaxed);
      if (state == BLOCK_FREE) {
        listed_free++;
        if (!segment->growable) free_bytes += block->size;
        if (before && atomic_load_explicit(&before->state, memory_order_relaxed) == BLOCK_FREE)
          broken("segment %llu: free neighbours at offset %zu were not merged",
                 (unsigned long long)segment->serial, offset);
      } else {
        used++;
      }
      offset += block->size;
    }
    if (segment->first && offset != segment->size)
      broken("segment %llu: blocks cover %zu of its %zu bytes", (unsigned long long)segment->serial,
             offset, segment->size);
    if (segment->last != before)
      broken("segment %llu: its last block is wrong", (unsigned long long)segment->serial);
    if (used != segment->used_blocks)
      broken("segment %llu counts %zu used blocks, holds %zu", (unsigned long long)segment->serial,
             segment->used_blocks, used);
    if (segment->growable) validate_growable(self, segment);
    if (segment->idle && (used || segment->in_flight))
      broken("segment %llu is idle with blocks in use or in flight",
             (unsigned long long)segment->serial);
    for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next)
      if (r->segment != segment || r->offset > segment->size || r->size > segment->size - r->offset)
        broken("segment %llu: an in-flight range lies outside it",
               (unsigned long long)segment->serial);
  }
  if (listed_free != tree_blocks)
    broken("segments hold %zu free blocks, the trees %zu", listed_free, tree_blocks);
  uint64_t counted_free = atomic_load_explicit(&s->free_bytes, memory_order_relaxed),
           counted_idle = atomic_load_explicit(&s->idle_bytes, memory_order_relaxed);
  if (free_bytes != counted_free)
    broken("a shard's free trees hold %llu bytes, its figure says %llu",
           (unsigned long long)free_bytes, (unsigned long long)counted_free);
  if (idle_bytes != counted_idle)
    broken("a shard's idle segments hold %llu bytes, its figure says %llu",
           (unsigned long long)idle_bytes, (unsigned long long)counted_idle);
}

void devbuf__caching_debug_step(caching_allocator *self, shard *s) {
  if ((++s->debug_steps & 63) == 0) devbuf__caching_validate_shard(self, s);
}

void devbuf__caching_validate_parking(const cblock *block) {
  csegment *segment = block->segment;
  pthread_mutex_lock(&segment->shard->lock);
  bool in_flight = segment->in_flight != NULL;
  pthread_mutex_unlock(&segment->shard->lock);
  if (in_flight)
    broken("a block parks over bytes in flight (segment %llu)",
           (unsigned long long)segment->serial);
}

void devbuf__caching_validate(caching_allocator *self) {
  for (int i = 0; i < SHARD_COUNT; i++) {
    pthread_mutex_lock(&self->shards[i].lock);
    devbuf__caching_validate_shard(self, &self->shards[i]);
    pthread_mutex_unlock(&self->shards[i].lock);
  }
}

void devbuf__caching_poison(const cblock *block, uint8_t byte) {
  if (!block->host) return; // memory the CPU cannot write
  // Whole blocks up to 64 MiB; of larger ones the first and last MiB, to keep tests quick.
  const size_t whole = (size_t)64 << 20, edge = (size_t)1 << 20;
  if (block->size <= whole) {
    memset(block->host, byte, block->size);
  } else {
    memset(block->host, byte, edge);
    memset((char *)block->host + block->size - edge, byte, edge);
  }
}

#endif
