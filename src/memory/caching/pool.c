// Segments and their blocks. Every byte of a segment belongs to exactly one block; blocks
// are linked in address order; free neighbours are always merged, so a free block is as
// large as the free bytes around it. A pool's free blocks sit in a treap keyed by (size,
// segment, offset): the smallest block that fits, lowest address first, in O(log n).
// Bytes released while work may still use them are free blocks too, overlaid by in-flight
// ranges of their segment: ordered (work) allocations may take them, others step around.
#include "caching.h"
#include "treap.h"

#include <stdlib.h>
#include <string.h>

// ---- the free tree ------------------------------------------------------------------------

static bool key_less(size_t size, uint64_t serial, size_t offset, const cblock *b) {
  if (size != b->size) return size < b->size;
  if (serial != b->segment->serial) return serial < b->segment->serial;
  return offset < b->offset;
}

static bool block_less(const cblock *a, const cblock *b) {
  return key_less(a->size, a->segment->serial, a->offset, b);
}

// Whether block `b` is ordered before the key (size, serial, offset).
static bool block_before_key(const cblock *b, size_t size, uint64_t serial, size_t offset) {
  if (size != b->size) return b->size < size;
  if (serial != b->segment->serial) return b->segment->serial < serial;
  return b->offset < offset;
}

DEVBUF__TREAP(tree, cblock, left, right, block_less)

// The first block whose key is not below (size, serial, offset).
static cblock *tree_lower_bound(cblock *tree, size_t size, uint64_t serial, size_t offset) {
  cblock *found = NULL;
  while (tree) {
    if (block_before_key(tree, size, serial, offset)) {
      tree = tree->right;
    } else {
      found = tree;
      tree = tree->left;
    }
  }
  return found;
}

// Largest first: a growable segment's free end counts only as far as it is mapped, so the
// search goes on past it.
// The in-flight ranges a free block's usable bytes are measured around: at most this many
// in one block are sorted; past them it counts as unusable (a figure that errs low).
#define RANGES_MEASURED 64

// What one host request takes of [from, to) of `segment` (a free block) with no system
// call. Requests go where find_clear_start puts them: at the first start (the block's, or a
// granule past an in-flight range) whose run of bytes clear of in-flight ranges holds them;
// in a growable segment, one is served there only if pages are mapped behind all of it.
// *out_clear: the longest such run, the largest request the block takes at all (the whole
// block where its ranges are too many to measure: it may take anything, serving nothing).
static size_t served_without_upstream(const csegment *segment, size_t from, size_t to,
                                      size_t *out_clear) {
  size_t low[RANGES_MEASURED], high[RANGES_MEASURED], count = 0;
  *out_clear = to - from;
  for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next) {
    if (r->offset >= to || r->offset + r->size <= from) continue;
    if (count == RANGES_MEASURED) return 0;
    size_t i = count++; // insertion by start
    for (; i > 0 && low[i - 1] > r->offset; i--) low[i] = low[i - 1], high[i] = high[i - 1];
    low[i] = r->offset, high[i] = r->offset + r->size;
  }
  size_t served = 0, longest_run = 0, at = from;
  for (size_t i = 0; i <= count; i++) {
    size_t next = i < count && low[i] < to ? low[i] : to;
    if (next > at && next - at > longest_run) { // requests longer than every earlier run
      size_t here = next - at;
      if (segment->growable) {
        size_t mapped = devbuf__growable_mapped_from(segment, at, next);
        if (mapped < here) here = mapped;
      }
      if (here > longest_run && here > served) served = here;
      longest_run = next - at;
    }
    if (i < count && high[i] > at) at = (high[i] + GRANULE - 1) & ~(size_t)(GRANULE - 1);
  }
  *out_clear = longest_run;
  return served;
}

static size_t usable_bytes(const cblock *block) {
  size_t clear;
  return served_without_upstream(block->segment, block->offset, block->offset + block->size,
                                 &clear);
}

// The most usable bytes of a block of `tree`, or `best` if none has more. Blocks are ordered
// by size: those at the left of a block are no larger, those at its right no smaller and no
// larger than `upper`; a subtree whose blocks cannot beat `best` is passed over.
static size_t largest_in(const cblock *tree, size_t upper, size_t best) {
  for (; tree && upper > best; upper = tree->size, tree = tree->left) {
    best = largest_in(tree->right, upper, best);
    size_t usable = usable_bytes(tree);
    if (usable > best) best = usable;
  }
  return best;
}

size_t devbuf__pool_largest(const cpool *pool) { return largest_in(pool->free_root, SIZE_MAX, 0); }

// A request goes to the first block in the tree's order (smallest first) with a run of
// bytes clear of in-flight ones that holds it, where in a growable segment it maps whatever
// pages its place lacks. So a block serves without the upstream only requests longer than
// every earlier block's longest clear run, and only up to what it serves at their place.
typedef struct in_order_walk {
  size_t floor, cap;   // the requests the pool takes: above floor, up to cap
  size_t clear_before; // the longest clear run of the blocks walked so far
  size_t best;
} in_order_walk;

static void largest_in_order(const cblock *tree, in_order_walk *walk) {
  for (; tree; tree = tree->right) {
    largest_in_order(tree->left, walk);
    size_t clear;
    size_t served =
        served_without_upstream(tree->segment, tree->offset, tree->offset + tree->size, &clear);
    if (served > walk->cap) served = walk->cap;
    size_t above = walk->clear_before > walk->floor ? walk->clear_before : walk->floor;
    if (served > above && served > walk->best) walk->best = served;
    if (clear > walk->clear_before) walk->clear_before = clear;
  }
}

size_t devbuf__pool_largest_served(const cpool *pool, size_t floor, size_t cap) {
  in_order_walk walk = {floor, cap, 0, 0};
  largest_in_order(pool->free_root, &walk);
  return walk.best;
}

static void free_insert(caching_allocator *self, shard *s, cblock *block) {
  cpool *pool = &s->pools[block->segment->pool];
  block->left = block->right = NULL;
  atomic_store_explicit(&block->state, BLOCK_FREE, memory_order_relaxed);
  pool->free_root = tree_insert(pool->free_root, block);
  owner_add(&s->free_blocks, 1);
  if (block->segment->growable)
    devbuf__growable_mark_unmappable(block->segment, block); // freed or merged: pages mapped
  else
    owner_add(&s->free_bytes, block->size);
}

static void free_remove(caching_allocator *self, shard *s, cblock *block) {
  cpool *pool = &s->pools[block->segment->pool];
  pool->free_root = tree_erase(pool->free_root, block);
  owner_add(&s->free_blocks, (uint64_t)-1);
  if (block->segment->growable)
    devbuf__growable_unmark(block->segment, block);
  else
    owner_add(&s->free_bytes, (uint64_t)0 - block->size);
}

// ---- block records --------------------------------------------------------------------------

static cblock *record_new(csegment *segment, size_t offset, size_t size) {
  shard *s = segment->shard;
  cblock *block = s->spare_records;
  if (block)
    s->spare_records = block->bin_next;
  else if (!(block = devbuf__malloc(sizeof *block)))
    return NULL;
  *block = (cblock){.segment = segment, .offset = offset, .size = size, .bin = UINT32_MAX};
  block->priority = devbuf__treap_priority(block);
  return block;
}

// A record no block uses any more. Retired, never freed: a stale token (a block freed
// twice) then reads a record that is not handed out, or one handed out again for other
// bytes, which devbuf_allocator_free tells apart by the block's address.
static void record_retire(shard *s, cblock *block) {
  atomic_store_explicit(&block->state, BLOCK_RETIRED, memory_order_relaxed);
  block->bin_next = s->spare_records;
  s->spare_records = block;
}

void devbuf__shard_free_spare_records(shard *s) {
  while (s->spare_records) {
    cblock *next = s->spare_records->bin_next;
    devbuf__free(s->spare_records);
    s->spare_records = next;
  }
}

// ---- idle segments --------------------------------------------------------------------------

static void idle_unlink(caching_allocator *self, shard *s, csegment *segment) {
  if (!segment->idle) return;
  owner_add(&s->idle_bytes, (uint64_t)0 - segment->size);
  if (segment->idle_newer)
    segment->idle_newer->idle_older = segment->idle_older;
  else
    s->idle_newest = segment->idle_older;
  if (segment->idle_older)
    segment->idle_older->idle_newer = segment->idle_newer;
  else
    s->idle_oldest = segment->idle_newer;
  segment->idle = false;
}

void devbuf__segment_check_idle(caching_allocator *self, csegment *segment) {
  if (segment->idle || segment->growable || segment->used_blocks || segment->in_flight) return;
  shard *s = segment->shard;
  segment->idle = true;
  owner_add(&s->idle_bytes, segment->size);
  segment->idle_since = atomic_fetch_add_explicit(&self->tick, 1, memory_order_relaxed);
  segment->idle_newer = NULL;
  segment->idle_older = s->idle_newest;
  if (s->idle_newest) s->idle_newest->idle_newer = segment;
  s->idle_newest = segment;
  if (!s->idle_oldest) s->idle_oldest = segment;
}

csegment *devbuf__segment_create(caching_allocator *self, shard *s, int pool,
                                 const devbuf_memory_t *upstream, size_t size, bool growable) {
  csegment *segment = devbuf__calloc(1, sizeof *segment);
  if (segment) segment->shard = s;
  cblock *block = segment ? record_new(segment, 0, size) : NULL;
  if (!block) {
    devbuf__free(segment);
    return NULL;
  }
  segment->upstream = *upstream;
  segment->size = size;
  segment->pool = pool;
  segment->growable = growable;
  segment->serial = atomic_fetch_add_explicit(&self->serial, 1, memory_order_relaxed);
  segment->first = segment->last = block;
  segment->next = s->segments;
  if (s->segments) s->segments->prev = segment;
  s->segments = segment;
  free_insert(self, s, block);
  devbuf__segment_check_idle(self, segment);
  return segment;
}

typedef struct byte_span {
  size_t low, high;
} byte_span;

static int by_low(const void *a, const void *b) {
  size_t x = ((const byte_span *)a)->low, y = ((const byte_span *)b)->low;
  return (x > y) - (x < y);
}

// The segment's in-flight ranges as disjoint spans in address order (merged where they
// overlap or touch), in `spans` (host memory the caller frees); how many, or SIZE_MAX
// without host memory.
static size_t in_flight_spans(const csegment *segment, byte_span **out_spans) {
  size_t count = 0;
  for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next) count++;
  byte_span *spans = devbuf__malloc(count * sizeof *spans);
  if (!spans) return SIZE_MAX;
  count = 0;
  for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next)
    spans[count++] = (byte_span){r->offset, r->offset + r->size};
  qsort(spans, count, sizeof *spans, by_low);
  size_t merged = 0;
  for (size_t i = 0; i < count; i++) {
    if (merged && spans[i].low <= spans[merged - 1].high) {
      if (spans[i].high > spans[merged - 1].high) spans[merged - 1].high = spans[i].high;
    } else {
      spans[merged++] = spans[i];
    }
  }
  *out_spans = spans;
  return merged;
}

uint64_t devbuf__shard_in_flight_cached(const shard *s) {
  uint64_t held = 0;
  for (const csegment *segment = s->segments; segment; segment = segment->next) {
    if (!segment->in_flight) continue;
    byte_span *spans = NULL;
    size_t count = in_flight_spans(segment, &spans);
    if (count == SIZE_MAX) { // no host memory to sort them: what is cached of each, whole
      for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next) held += r->size;
      continue;
    }
    size_t first = 0; // the first span that ends past the block before
    for (const cblock *block = segment->first; block && first < count; block = block->after) {
      size_t low = block->offset, high = block->offset + block->size;
      while (first < count && spans[first].high <= low) first++;
      if (atomic_load_explicit(&block->state, memory_order_relaxed) == BLOCK_ACTIVE) continue;
      for (size_t i = first; i < count && spans[i].low < high; i++)
        held += (spans[i].high < high ? spans[i].high : high) -
                (spans[i].low > low ? spans[i].low : low);
    }
    devbuf__free(spans);
  }
  return held;
}

csegment *devbuf__shard_take_idle(caching_allocator *self, shard *s) {
  csegment *segment = s->idle_oldest;
  if (!segment) return NULL;
  idle_unlink(self, s, segment);
  free_remove(self, s, segment->first); // idle: one free block covers it
  record_retire(s, segment->first);
  segment->first = segment->last = NULL;
  if (segment->prev)
    segment->prev->next = segment->next;
  else
    s->segments = segment->next;
  if (segment->next) segment->next->prev = segment->prev;
  return segment;
}

void devbuf__segment_give_back(caching_allocator *self, csegment *segment) {
  atomic_fetch_sub_explicit(&self->reserved, segment->size, memory_order_relaxed);
  caching_held_sub(self, segment->size);
  atomic_fetch_sub_explicit(&self->pool_reserved[segment->pool], segment->size,
                            memory_order_relaxed);
  atomic_fetch_sub_explicit(&self->segments, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&self->system_frees, 1, memory_order_relaxed);
  devbuf_allocator_free(self->upstream, &segment->upstream);
  devbuf__free(segment);
}

// ---- taking and putting blocks ----------------------------------------------------------------

// The end of the in-flight range that overlaps [offset, offset + size) and ends last, or 0.
static size_t in_flight_end(const csegment *segment, size_t offset, size_t size) {
  size_t end = 0;
  for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next)
    if (r->offset < offset + size && offset < r->offset + r->size && r->offset + r->size > end)
      end = r->offset + r->size;
  return end;
}

// Where `size` bytes of a free block avoid every in-flight range; false if nowhere.
static bool find_clear_start(const cblock *block, size_t size, size_t *out_start) {
  size_t start = block->offset, end = block->offset + block->size;
  if (!block->segment->in_flight) {
    *out_start = start;
    return true;
  }
  while (start + size <= end) {
    size_t blocked_until = in_flight_end(block->segment, start, size);
    if (!blocked_until) {
      *out_start = start;
      return true;
    }
    start = (blocked_until + GRANULE - 1) & ~(size_t)(GRANULE - 1);
  }
  return false;
}

// Cuts the free block `block` (out of the tree) so that [start, start + size) is a block of
// its own, returned; the bytes before and after go back to the tree. Without a record for
// the bytes after, they stay part of the returned block (larger than asked: still correct);
// without one for the bytes before (which in-flight bytes may be), NULL.
static cblock *carve(caching_allocator *self, shard *s, cblock *block, size_t start, size_t size) {
  csegment *segment = block->segment;
  if (start > block->offset) {
    cblock *piece = record_new(segment, start, block->offset + block->size - start);
    if (!piece) return NULL;
    piece->before = block;
    piece->after = block->after;
    if (block->after)
      block->after->before = piece;
    else
      segment->last = piece;
    block->after = piece;
    block->size = start - block->offset;
    free_insert(self, s, block);
    block = piece;
  }
  if (block->size > size) {
    cblock *rest = record_new(segment, block->offset + size, block->size - size);
    if (rest) {
      rest->before = block;
      rest->after = block->after;
      if (block->after)
        block->after->before = rest;
      else
        segment->last = rest;
      block->after = rest;
      block->size = size;
      free_insert(self, s, rest);
    }
  }
  return block;
}

// Byte intervals of a block already covered by newer in-flight ranges: sorted, disjoint,
// merged where they touch. Full, it stops recording (and so stops skipping).
#define COVERED_MAX 8
typedef struct covered {
  size_t count;
  size_t low[COVERED_MAX], high[COVERED_MAX];
} covered;

static bool is_covered(const covered *c, size_t low, size_t high) {
  for (size_t i = 0; i < c->count; i++)
    if (c->low[i] <= low && high <= c->high[i]) return true;
  return false;
}

static void cover(covered *c, size_t low, size_t high) {
  size_t i = 0;
  while (i < c->count && c->high[i] < low) i++; // the first that ends at or after `low`
  size_t j = i;
  while (j < c->count && c->low[j] <= high) { // those it touches merge into one
    if (c->low[j] < low) low = c->low[j];
    if (c->high[j] > high) high = c->high[j];
    j++;
  }
  if (i == j && c->count == COVERED_MAX) return;
  size_t kept = c->count - j;
  memmove(&c->low[i + 1], &c->low[j], kept * sizeof *c->low);
  memmove(&c->high[i + 1], &c->high[j], kept * sizeof *c->high);
  c->low[i] = low, c->high[i] = high;
  c->count = i + 1 + kept;
}

// Calls `visit` for each in-flight range that [offset, offset + size) of the segment
// overlaps, in that range's own offsets; false as soon as one answers false. Ranges come
// newest first, and a range whose overlap newer ones cover already is passed over: bytes
// released in flight and taken again for work carry their earlier owners' work as work
// to order after (the new owner inherited it at allocation, and every item of its own
// waited for it), so waiting for the newer owner's work waits for theirs too. Without it
// a block that went round a loop of kernels visits one range per round still in flight.
static bool visit_in_flight(const csegment *segment, size_t offset, size_t size,
                            bool (*visit)(void *context, void *fence, size_t offset, size_t size),
                            void *context) {
  covered done = {0};
  for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next) {
    size_t low = r->offset > offset ? r->offset : offset;
    size_t high = r->offset + r->size < offset + size ? r->offset + r->size : offset + size;
    if (low >= high || is_covered(&done, low, high)) continue;
    if (!visit(context, r->fence, low - r->offset, high - low)) return false;
    cover(&done, low, high);
  }
  return true;
}

cblock *devbuf__pool_take(caching_allocator *self, shard *s, int pool, size_t size, bool ordered,
                          bool (*visit)(void *context, void *fence, size_t offset, size_t size),
                          void *context, bool *out_refused) {
  *out_refused = false;
  cpool *p = &s->pools[pool];
  size_t start = 0;
  cblock *block = tree_lower_bound(p->free_root, size, 0, 0);
  if (!ordered)
    while (block && !find_clear_start(block, size, &start))
      block =
          tree_lower_bound(p->free_root, block->size, block->segment->serial, block->offset + 1);
  if (!block) return NULL;
  if (ordered) start = block->offset;
  free_remove(self, s, block);
  cblock *carved = carve(self, s, block, start, size);
  if (!carved) { // no host memory for a block record
    free_insert(self, s, block);
    return NULL;
  }
  block = carved;
  csegment *segment = block->segment;
  if (segment->used_blocks++ == 0) idle_unlink(self, s, segment);
  atomic_store_explicit(&block->state, BLOCK_ACTIVE, memory_order_relaxed);
  block->bin = devbuf__tcache_bin_of(self, block->size);
  const devbuf_memory_t *memory = &segment->upstream;
  block->host = memory->host ? (char *)memory->host + block->offset : NULL;
  block->device = self->handles ? memory->device : memory->device + block->offset;
  block->device_offset = self->handles ? memory->offset + block->offset : 0;
  if (ordered && segment->in_flight &&
      !visit_in_flight(segment, block->offset, block->size, visit, context)) {
    devbuf__pool_put(self, s, block);
    *out_refused = true;
    return NULL;
  }
  devbuf__caching_debug_step(self, s);
  return block;
}

static void merge_into(cblock *into, cblock *next) {
  into->size += next->size;
  into->after = next->after;
  if (next->after)
    next->after->before = into;
  else
    into->segment->last = into;
  record_retire(into->segment->shard, next);
}

void devbuf__pool_put(caching_allocator *self, shard *s, cblock *block) {
  csegment *segment = block->segment;
  segment->used_blocks--;
  cblock *before = block->before, *after = block->after;
  if (before && atomic_load_explicit(&before->state, memory_order_relaxed) == BLOCK_FREE) {
    free_remove(self, s, before);
    merge_into(before, block);
    block = before;
  }
  if (after && atomic_load_explicit(&after->state, memory_order_relaxed) == BLOCK_FREE) {
    free_remove(self, s, after);
    merge_into(block, after);
  }
  free_insert(self, s, block);
  devbuf__segment_check_idle(self, segment);
  devbuf__caching_debug_step(self, s);
}
