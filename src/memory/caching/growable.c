// Growable segments: each pool of a shard is one segment in reserved address space. Blocks
// are carved from it like from any segment (best fit, split, coalesce); memory stands
// behind the stretches the segment maps as its blocks need them (`maps`, merged where they
// touch). Past the highest mapped byte a block maps at least a 32nd of what is mapped (up
// to 2 MiB), so that a segment that grows makes few calls; a block in an interior hole maps
// just the pages it lacks. Under a limit, and at clear_cache, the whole pages of every
// free block go back, interior holes too (the upstream unmaps any part of what it mapped;
// devbuf's CUDA backend maps page by page for that); and before a mapping would take the
// allocator over 1/50 above the most its blocks ever used, as many of the highest free
// pages as keep it under that. A loop that fits stays under its own first peak, so it
// makes no system call after its first pass.
#include "caching.h"
#include "treap.h"

// Addresses per growable segment: 1 TiB, or a quarter as much again and again where the
// address space is short (a sanitizer's layout, an address-space limit), down to 4 GiB.
#define RESERVATION_MOST  ((size_t)1 << 40)
#define RESERVATION_LEAST ((size_t)1 << 32)
// Mapped bytes stay within 1/GROWABLE_SLACK over the most the blocks ever used (below).
#define GROWABLE_SLACK    50

bool devbuf__growable_ensure(caching_allocator *self, shard *s, int pool) {
  pthread_mutex_lock(&s->lock);
  bool made = s->growing[pool] != NULL;
  pthread_mutex_unlock(&s->lock);
  if (made) return true;
  devbuf_memory_t reservation;
  devbuf_status reserved = DEVBUF_OUT_OF_MEMORY;
  // Smaller where addresses are short; no retry where the device cannot map at all.
  for (size_t size = RESERVATION_MOST;
       reserved != DEVBUF_OK && reserved != DEVBUF_UNSUPPORTED && size >= RESERVATION_LEAST;
       size /= 4)
    reserved = self->upstream->ops->reserve(self->upstream, size, &reservation);
  if (reserved != DEVBUF_OK) return false; // the pool takes plain segments instead
  pthread_mutex_lock(&s->lock);
  csegment *segment = s->growing[pool] ? NULL // another thread of this shard made it meanwhile
                                       : devbuf__segment_create(self, s, pool, &reservation,
                                                                reservation.size, true);
  if (segment) {
    s->growing[pool] = segment;
    atomic_fetch_add(&self->segments, 1);
  }
  bool ok = s->growing[pool] != NULL;
  pthread_mutex_unlock(&s->lock);
  if (!segment) self->upstream->ops->unreserve(self->upstream, &reservation);
  if (!ok) devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a segment record");
  return ok;
}

// Joins `range` with the stretches it touches.
static void merge_around(csegment *segment, devbuf__map_range *range) {
  devbuf__map_range *next = devbuf__ranges_next(segment, range);
  if (next && range->offset + range->size == next->offset) {
    range->size += next->size;
    devbuf__ranges_remove(segment, next);
  }
  devbuf__map_range *before = devbuf__ranges_before(segment, range);
  if (before && before->offset + before->size == range->offset) {
    before->size += range->size;
    devbuf__ranges_remove(segment, range);
  }
}

// Reserves `bytes` against the memory limit; false if they do not fit.
static bool reserve_bytes(caching_allocator *self, size_t bytes) {
  for (;;) {
    uint64_t limit = atomic_load_explicit(&self->memory_limit, memory_order_relaxed);
    uint64_t reserved = atomic_load_explicit(&self->reserved, memory_order_relaxed);
    if (limit && (reserved > limit || bytes > limit - reserved)) return false;
    if (atomic_compare_exchange_weak(&self->reserved, &reserved, reserved + bytes)) return true;
  }
}

// The first stretch of [from, to) that no range covers, as *gap_start and *gap_end, and
// whether no range lies past it; false when all of it is mapped.
static bool first_gap(const csegment *segment, size_t from, size_t to, size_t *gap_start,
                      size_t *gap_end, bool *past_every_range) {
  const devbuf__map_range *r = devbuf__ranges_ending_after(segment, from);
  size_t at = from;
  while (r && r->offset <= at && at < to) {
    at = r->offset + r->size;
    r = devbuf__ranges_next(segment, r);
  }
  if (at >= to) return false;
  *gap_start = at;
  *gap_end = r && r->offset < to ? r->offset : to;
  *past_every_range = r == NULL;
  return true;
}

static bool is_free(const cblock *block) {
  return atomic_load_explicit(&block->state, memory_order_relaxed) == BLOCK_FREE;
}

// Free blocks that [from, to), just mapped for `block`, reaches into: pages to unmap again.
static void mark_newly_mapped(csegment *segment, cblock *block, size_t from, size_t to) {
  for (cblock *b = block->before; b && b->offset + b->size > from; b = b->before)
    if (is_free(b)) devbuf__growable_mark_unmappable(segment, b);
  for (cblock *b = block->after; b && b->offset < to; b = b->after)
    if (is_free(b)) devbuf__growable_mark_unmappable(segment, b);
}

devbuf_status devbuf__growable_map_for(caching_allocator *self, cblock *block, bool *out_grew) {
  *out_grew = false;
  csegment *segment = block->segment;
  shard *s = segment->shard;
  size_t page = self->policy.page;
  size_t from = block->offset & ~(page - 1);
  bool shrunk = false;
  for (;;) {
    pthread_mutex_lock(&s->lock);
    size_t to = caching_round_up(block->offset + block->size, page);
    if (to > segment->size) to = segment->size;
    size_t start, end;
    bool past_every_range;
    if (!first_gap(segment, from, to, &start, &end, &past_every_range)) {
      pthread_mutex_unlock(&s->lock);
      return DEVBUF_OK;
    }
    // Memory counts for more than a system call, but a loop that fits should make none
    // after its first pass. So pages go back before mapping only where the mapping would
    // take the segment's allocator over 1/50 above the most its blocks ever used, and only
    // as many as keep it under that (the highest free pages first, once per request).
    if (!shrunk) {
      uint64_t reserved = atomic_load_explicit(&self->reserved, memory_order_relaxed);
      uint64_t most = atomic_load_explicit(&self->peak, memory_order_relaxed);
      uint64_t active = devbuf__caching_active(self);
      if (most < active) most = active;
      uint64_t ceiling = most + most / GROWABLE_SLACK;
      if (reserved + (end - start) > ceiling && reserved > active) {
        shrunk = true;
        pthread_mutex_unlock(&s->lock);
        devbuf__growable_shrink_by(self, (size_t)(reserved + (end - start) - ceiling), true);
        continue;
      }
    }
    size_t need = end - start;
    if (past_every_range) {
      // Past every range: at least a 32nd of what is mapped, up to a small segment's worth
      // (2 MiB). On a 4 KiB page one call per small step would be thousands of calls for
      // what 2 MiB steps do in hundreds, while a whole 2 MiB over a working set of a few
      // MiB would hold far more than the blocks reach. Steps grow with the segment: what is
      // mapped and never reached stays under a 32nd, and a segment reaches 64 MiB in at
      // most 32 ln(64 MiB / page) calls (some 300 on a 4 KiB page).
      size_t least = caching_round_up(segment->mapped / 32, page);
      if (least > self->policy.small_segment) least = self->policy.small_segment;
      if (need < least) need = start + least > segment->size ? segment->size - start : least;
      // The step beyond the block's own pages only as far as the limit leaves room: a
      // request that fits is not refused for the step (a 64 KiB block under 10 MiB was, at
      // 9.7 MiB mapped).
      uint64_t limit = atomic_load_explicit(&self->memory_limit, memory_order_relaxed);
      uint64_t reserved = atomic_load_explicit(&self->reserved, memory_order_relaxed);
      size_t gap = end - start;
      if (limit && need > gap) {
        uint64_t room = limit > reserved ? (limit - reserved) & ~(uint64_t)(page - 1) : 0;
        if (need > room) need = room > gap ? (size_t)room : gap;
      }
    }
    if (!reserve_bytes(self, need)) {
      pthread_mutex_unlock(&s->lock);
      if (devbuf__growable_shrink(self, false)) continue; // room made: again
      return devbuf__error(DEVBUF_OUT_OF_MEMORY,
                           "mapping %zu more bytes for a block of %zu is over the memory limit",
                           need, block->size);
    }
    devbuf__map_range *range = devbuf__ranges_add(segment, start, need);
    bool recorded = range != NULL;
    devbuf_status status =
        recorded ? self->upstream->ops->map(self->upstream, &segment->upstream, start, need)
                 : devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to record a mapping");
    if (status != DEVBUF_OK) {
      if (recorded) devbuf__ranges_remove(segment, range);
      atomic_fetch_sub(&self->reserved, need);
      pthread_mutex_unlock(&s->lock);
      // The system may refuse while growable segments hold free ranges: those first.
      if (status == DEVBUF_OUT_OF_MEMORY && recorded && devbuf__growable_shrink(self, false))
        continue;
      return status;
    }
    caching_held_add(self, need);
    *out_grew = true;
    merge_around(segment, range);
    mark_newly_mapped(segment, block, start, start + need);
    segment->mapped += need;
    atomic_fetch_add(&self->pool_reserved[segment->pool], need);
    atomic_fetch_add(&self->system_allocs, 1);
    pthread_mutex_unlock(&s->lock); // and on to the block's next gap, if any
  }
}

// Unmaps what is mapped of [from, to) (whole pages, no block uses them); the bytes.
// *kept: set when a stretch stayed mapped for want of host memory to record the rest.
static size_t unmap_stretch(caching_allocator *self, csegment *segment, size_t from, size_t to,
                            bool *kept) {
  size_t freed = 0;
  for (devbuf__map_range *r = devbuf__ranges_ending_after(segment, from), *next;
       r && r->offset < to; r = next) {
    size_t low = r->offset > from ? r->offset : from;
    size_t high = r->offset + r->size < to ? r->offset + r->size : to;
    size_t end = r->offset + r->size;
    next = NULL; // where the stretch goes on past `to`, the loop ends with it
    // What stays of the stretch: the part before `low`, and the part after `high`.
    if (low > r->offset && high < end) {
      if (!devbuf__ranges_add(segment, high, end - high)) { // no host memory: keep it
        *kept = true;
        break;
      }
      r->size = low - r->offset;
    } else if (low > r->offset) {
      r->size = low - r->offset;
      next = devbuf__ranges_next(segment, r);
    } else if (high < end) {
      r->offset = high; // still between its neighbours: the tree's order holds
      r->size = end - high;
    } else {
      next = devbuf__ranges_next(segment, r);
      devbuf__ranges_remove(segment, r);
    }
    self->upstream->ops->unmap(self->upstream, &segment->upstream, low, high - low);
    segment->mapped -= high - low;
    freed += high - low;
    atomic_fetch_add(&self->system_frees, 1);
  }
  return freed;
}

// Unmaps the whole pages of [from, to) that no work in flight may still use; *kept: set
// where some stayed mapped (work in flight, or no host memory).
static size_t unmap_free(caching_allocator *self, csegment *segment, size_t from, size_t to,
                         bool *kept) {
  size_t page = self->policy.page;
  from = caching_round_up(from, page);
  to &= ~(page - 1);
  if (from >= to) return 0;
  for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next)
    if (r->offset < to && from < r->offset + r->size) {
      *kept = true;
      return unmap_free(self, segment, from, r->offset, kept) +
             unmap_free(self, segment, r->offset + r->size, to, kept);
    }
  return unmap_stretch(self, segment, from, to, kept);
}

// ---- the free blocks to unmap: a treap by offset (the priorities of the free tree's)

static bool offset_less(const cblock *a, const cblock *b) { return a->offset < b->offset; }

DEVBUF__TREAP(listed, cblock, unmappable_left, unmappable_right, offset_less)

// The listed block of the highest offset below `offset`, or NULL.
static cblock *listed_below(cblock *tree, size_t offset) {
  cblock *found = NULL;
  while (tree)
    if (tree->offset < offset) {
      found = tree;
      tree = tree->unmappable_right;
    } else {
      tree = tree->unmappable_left;
    }
  return found;
}

void devbuf__growable_mark_unmappable(csegment *segment, cblock *block) {
  if (block->unmappable) return;
  block->unmappable = true;
  block->unmappable_left = block->unmappable_right = NULL;
  segment->unmappable = listed_insert(segment->unmappable, block);
}

void devbuf__growable_unmark(csegment *segment, cblock *block) {
  if (!block->unmappable) return;
  block->unmappable = false;
  segment->unmappable = listed_erase(segment->unmappable, block);
}

// Unmaps the whole pages of a listed free block; off the list once none is left to unmap.
static size_t unmap_block(caching_allocator *self, csegment *segment, cblock *block) {
  bool kept = false;
  size_t freed = unmap_free(self, segment, block->offset, block->offset + block->size, &kept);
  if (!kept) devbuf__growable_unmark(segment, block);
  return freed;
}

// Unmaps the whole pages of free blocks, the highest first, until `wanted` bytes went back
// (SIZE_MAX: all of them); the bytes given back. Caller holds the shard's lock. Only the
// listed blocks are looked at: a limit calls this for request after request, and a clear
// for every `# E` of a trace, so it must not cost the blocks in use.
static size_t shrink_segment(caching_allocator *self, csegment *segment, size_t wanted) {
  size_t freed = 0;
  for (cblock *block = listed_below(segment->unmappable, SIZE_MAX); block && freed < wanted;) {
    size_t offset = block->offset;
    freed += unmap_block(self, segment, block);
    block = listed_below(segment->unmappable, offset);
  }
  atomic_fetch_sub(&self->reserved, freed);
  caching_held_sub(self, freed);
  atomic_fetch_sub(&self->pool_reserved[segment->pool], freed);
  return freed;
}

bool devbuf__growable_shrink(caching_allocator *self, bool all) {
  return devbuf__growable_shrink_by(self, all ? SIZE_MAX : 1, all);
}

bool devbuf__growable_shrink_by(caching_allocator *self, size_t wanted, bool every_segment) {
  size_t freed = 0;
  for (int i = 0; i < SHARD_COUNT && freed < wanted; i++) {
    shard *s = &self->shards[i];
    pthread_mutex_lock(&s->lock);
    for (int p = 0; p < POOL_COUNT && freed < wanted; p++)
      if (s->growing[p]) {
        size_t got = shrink_segment(self, s->growing[p], every_segment ? wanted - freed : SIZE_MAX);
        freed += got;
        if (got && !every_segment) wanted = 0; // one segment's free pages, as far as they go
      }
    pthread_mutex_unlock(&s->lock);
  }
  return freed > 0;
}

size_t devbuf__growable_mapped_from(const csegment *segment, size_t at, size_t to) {
  const devbuf__map_range *r = devbuf__ranges_ending_after(segment, at);
  if (!r || r->offset > at) return 0;
  size_t end = r->offset + r->size;
  return (end < to ? end : to) - at;
}

bool devbuf__growable_maps_any(const csegment *segment, size_t from, size_t to) {
  const devbuf__map_range *r = devbuf__ranges_ending_after(segment, from);
  return r && r->offset < to;
}

void devbuf__growable_release(caching_allocator *self, csegment *segment) {
  for (devbuf__map_range *r; (r = devbuf__ranges_last(segment));) { // the highest first
    self->upstream->ops->unmap(self->upstream, &segment->upstream, r->offset, r->size);
    segment->mapped -= r->size;
    atomic_fetch_sub(&self->reserved, r->size);
    caching_held_sub(self, r->size);
    atomic_fetch_add(&self->system_frees, 1);
    devbuf__ranges_remove(segment, r);
  }
  atomic_fetch_sub(&self->segments, 1);
  self->upstream->ops->unreserve(self->upstream, &segment->upstream);
  devbuf__free(segment);
}
