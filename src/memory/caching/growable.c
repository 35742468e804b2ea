// Growable segments: each pool of a shard is one segment in reserved address space. Blocks
// are carved from it like from any segment (best fit, split, coalesce); memory stands
// behind its first `mapped` bytes only, mapped as the highest block needs it, in ranges
// as large as that need (rounded to the page) and at least a 32nd of what is mapped (up to
// 2 MiB), so that what is reserved follows what the program's blocks reach. Under a limit, and at
// clear_cache, the free end goes back range by range, last first. Nothing is unmapped
// otherwise: a loop that fits makes no system call after its first pass.
#include "caching.h"

// Addresses per growable segment: 1 TiB, or a quarter as much again and again where the
// address space is short (a sanitizer's layout, an address-space limit), down to 4 GiB.
#define RESERVATION_MOST  ((size_t)1 << 40)
#define RESERVATION_LEAST ((size_t)1 << 32)

bool devbuf__growable_ensure(caching_allocator *self, shard *s, int pool) {
  pthread_mutex_lock(&s->lock);
  bool made = s->growing[pool] != NULL;
  pthread_mutex_unlock(&s->lock);
  if (made) return true;
  devbuf_memory_t reservation;
  devbuf_status reserved = DEVBUF_OUT_OF_MEMORY;
  for (size_t size = RESERVATION_MOST; reserved != DEVBUF_OK && size >= RESERVATION_LEAST;
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

static bool push_chunk(csegment *segment, size_t size) {
  if (segment->chunk_count == segment->chunk_capacity) {
    size_t capacity = segment->chunk_capacity ? 2 * segment->chunk_capacity : 16;
    size_t *grown = devbuf__realloc(segment->chunks, capacity * sizeof *grown);
    if (!grown) return false;
    segment->chunks = grown;
    segment->chunk_capacity = capacity;
  }
  segment->chunks[segment->chunk_count++] = size;
  return true;
}

// Reserves `bytes` against the memory limit; false if they do not fit.
static bool reserve_bytes(caching_allocator *self, size_t bytes) {
  for (;;) {
    uint64_t limit = atomic_load_explicit(&self->memory_limit, memory_order_relaxed);
    uint64_t reserved = atomic_load_explicit(&self->reserved, memory_order_relaxed);
    if (limit && (reserved > limit || bytes > limit - reserved)) return false;
    if (atomic_compare_exchange_weak(&self->reserved, &reserved, reserved + bytes)) {
      devbuf__raise_peak(&self->peak_reserved, reserved + bytes);
      return true;
    }
  }
}

devbuf_status devbuf__growable_map_for(caching_allocator *self, cblock *block, bool *out_grew) {
  *out_grew = false;
  csegment *segment = block->segment;
  shard *s = segment->shard;
  size_t end = block->offset + block->size;
  for (;;) {
    pthread_mutex_lock(&s->lock);
    size_t target = caching_round_up(end, self->policy.page);
    if (target > segment->size) target = segment->size;
    if (target <= segment->mapped) {
      pthread_mutex_unlock(&s->lock);
      return DEVBUF_OK;
    }
    // At least a 32nd of what is mapped, up to a small segment's worth (2 MiB): on a 4 KiB
    // page one map call per small step would be thousands of calls for what 2 MiB steps do
    // in hundreds, while a whole 2 MiB over a working set of a few MiB would hold far more
    // than the blocks reach. Steps grow with the segment: what is mapped and never reached
    // stays under a 32nd, and a segment reaches 64 MiB in at most 32 ln(64 MiB / page)
    // calls (some 300 on a 4 KiB page), then grows 2 MiB or more a call.
    size_t need = target - segment->mapped;
    size_t least = caching_round_up(segment->mapped / 32, self->policy.page);
    if (least > self->policy.small_segment) least = self->policy.small_segment;
    if (need < least)
      need = segment->mapped + least > segment->size ? segment->size - segment->mapped : least;
    if (!reserve_bytes(self, need)) {
      pthread_mutex_unlock(&s->lock);
      if (devbuf__growable_shrink(self, false)) continue; // room made elsewhere: again
      return devbuf__error(DEVBUF_OUT_OF_MEMORY,
                           "mapping %zu more bytes for a block of %zu is over the memory limit",
                           need, block->size);
    }
    bool pushed = push_chunk(segment, need);
    devbuf_status status =
        pushed ? self->upstream->ops->map(self->upstream, &segment->upstream, segment->mapped, need)
               : devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to record a mapping");
    if (status != DEVBUF_OK) {
      if (pushed) segment->chunk_count--;
      atomic_fetch_sub(&self->reserved, need);
      pthread_mutex_unlock(&s->lock);
      // The system may refuse while other growable segments hold free ends: those first.
      if (status == DEVBUF_OUT_OF_MEMORY && pushed && devbuf__growable_shrink(self, false))
        continue;
      return status;
    }
    *out_grew = true;
    segment->mapped += need;
    atomic_fetch_add(&self->pool_reserved[segment->pool], need);
    atomic_fetch_add(&self->system_allocs, 1);
    pthread_mutex_unlock(&s->lock);
    return DEVBUF_OK;
  }
}

// Unmaps the segment's free end, whole ranges only; the bytes given back. Caller holds the
// shard's lock.
static size_t shrink_segment(caching_allocator *self, csegment *segment) {
  const cblock *last = segment->first;
  while (last->after) last = last->after;
  size_t keep = atomic_load_explicit(&last->state, memory_order_relaxed) == BLOCK_FREE
                    ? last->offset
                    : segment->size;
  for (const devbuf__in_flight *r = segment->in_flight; r; r = r->next) // work may still use those
    if (r->offset + r->size > keep) keep = r->offset + r->size;
  size_t freed = 0;
  while (segment->chunk_count &&
         segment->mapped - segment->chunks[segment->chunk_count - 1] >= keep) {
    size_t size = segment->chunks[--segment->chunk_count];
    segment->mapped -= size;
    self->upstream->ops->unmap(self->upstream, &segment->upstream, segment->mapped, size);
    freed += size;
    atomic_fetch_add(&self->system_frees, 1);
  }
  atomic_fetch_sub(&self->reserved, freed);
  atomic_fetch_sub(&self->pool_reserved[segment->pool], freed);
  return freed;
}

bool devbuf__growable_shrink(caching_allocator *self, bool all) {
  bool any = false;
  for (int i = 0; i < SHARD_COUNT && (all || !any); i++) {
    shard *s = &self->shards[i];
    pthread_mutex_lock(&s->lock);
    for (int p = 0; p < POOL_COUNT && (all || !any); p++)
      if (s->growing[p] && shrink_segment(self, s->growing[p])) any = true;
    pthread_mutex_unlock(&s->lock);
  }
  return any;
}

size_t devbuf__growable_mapped_part(const cblock *block) {
  size_t mapped = block->segment->mapped;
  return block->offset >= mapped                ? 0
         : block->offset + block->size > mapped ? mapped - block->offset
                                                : block->size;
}

void devbuf__growable_release(caching_allocator *self, csegment *segment) {
  while (segment->chunk_count) {
    size_t size = segment->chunks[--segment->chunk_count];
    segment->mapped -= size;
    self->upstream->ops->unmap(self->upstream, &segment->upstream, segment->mapped, size);
    atomic_fetch_sub(&self->reserved, size);
    atomic_fetch_add(&self->system_frees, 1);
  }
  atomic_fetch_sub(&self->segments, 1);
  self->upstream->ops->unreserve(self->upstream, &segment->upstream);
  devbuf__free(segment->chunks);
  devbuf__free(segment);
}
