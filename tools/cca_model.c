// The CCA reference model of cca_model.h. Each pool keeps its free blocks in a treap by
// (size, address): a request's best fit, an insertion and a removal cost O(log n). They were
// a sorted array, whose every insertion moved the blocks after it: a trace that left
// 200,000 holes took 9 s a replay, and least-limit replays the model twenty times and more.
// (The library's own treap template, src/memory/caching/treap.h, is internal to it.)
// Segments that are one free block are kept in a set of their own, so that a request near
// the limit does not look at every segment to find none.
#include "cca_model.h"

#include <stdlib.h>

#define ROUND           512u
#define SMALL_SIZE      ((uint64_t)1 << 20)  // requests up to this go to the small pool
#define SMALL_BUFFER    ((uint64_t)2 << 20)  // the small pool's segments
#define LARGE_BUFFER    ((uint64_t)20 << 20) // segments for requests below MIN_LARGE_ALLOC
#define MIN_LARGE_ALLOC ((uint64_t)10 << 20)
#define ROUND_LARGE     ((uint64_t)2 << 20)

typedef struct block block;
typedef struct segment segment;

struct block {
  uint64_t address, size;
  int allocated;
  block *prev, *next; // neighbours in the same segment, in address order
  segment *segment;
  block *left, *right; // its pool's treap, while free
  uint32_t priority;
};

struct segment {
  devbuf_memory_t memory;
  block *first; // the block at the lowest address
  int small;
  size_t index;      // in model.segments
  size_t whole_slot; // in model.whole_free, while the segment is one free block in its pool
};

typedef struct pool {
  block *free; // the treap's root, by (size, address)
} pool;

typedef struct model {
  devbuf_allocator_t *upstream;
  uint64_t memory_limit, reserved;
  pool pools[2]; // [1]: small
  segment **segments;
  size_t segment_count, segment_capacity;
  // The segments that are one free block, in no order; as large as `segments`, so that
  // adding one never needs memory.
  segment **whole_free;
  size_t whole_free_count;
} model;

static int before(const block *a, const block *b) {
  return a->size < b->size || (a->size == b->size && a->address < b->address);
}

// Splits `tree` into the blocks before `key` and the others.
static void split(block *tree, const block *key, block **below, block **rest) {
  if (!tree) {
    *below = *rest = NULL;
  } else if (before(tree, key)) {
    split(tree->right, key, &tree->right, rest);
    *below = tree;
  } else {
    split(tree->left, key, below, &tree->left);
    *rest = tree;
  }
}

static block *merge(block *below, block *above) {
  if (!below) return above;
  if (!above) return below;
  if (below->priority > above->priority) {
    below->right = merge(below->right, above);
    return below;
  }
  above->left = merge(below, above->left);
  return above;
}

static block *insert(block *tree, block *node) {
  if (!tree) return node;
  if (node->priority > tree->priority) {
    split(tree, node, &node->left, &node->right);
    return node;
  }
  if (before(node, tree))
    tree->left = insert(tree->left, node);
  else
    tree->right = insert(tree->right, node);
  return tree;
}

static block *erase(block *tree, const block *node) {
  if (!tree) return NULL;
  if (tree == node) return merge(node->left, node->right);
  if (before(node, tree))
    tree->left = erase(tree->left, node);
  else
    tree->right = erase(tree->right, node);
  return tree;
}

// The first block (in (size, address) order) that is not before `key`, or NULL.
static block *lower_bound(const pool *p, const block *key) {
  block *found = NULL;
  for (block *b = p->free; b;)
    if (before(b, key)) {
      b = b->right;
    } else {
      found = b;
      b = b->left;
    }
  return found;
}

static void pool_insert(pool *p, block *b) {
  uint64_t x = (uint64_t)(uintptr_t)b;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  b->priority = (uint32_t)(x ^ x >> 33);
  b->left = b->right = NULL;
  p->free = insert(p->free, b);
}

static void pool_remove(pool *p, const block *b) { p->free = erase(p->free, b); }

static uint64_t segment_size_for(uint64_t rounded) {
  if (rounded <= SMALL_SIZE) return SMALL_BUFFER;
  if (rounded < MIN_LARGE_ALLOC) return LARGE_BUFFER;
  return (rounded + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

static void give_back(model *m, size_t index) {
  segment *s = m->segments[index];
  for (block *b = s->first, *next; b; b = next) next = b->next, free(b);
  devbuf_allocator_free(m->upstream, &s->memory);
  m->reserved -= s->memory.size;
  m->segments[index] = m->segments[--m->segment_count];
  m->segments[index]->index = index;
  free(s);
}

static void add_whole_free(model *m, segment *s) {
  s->whole_slot = m->whole_free_count;
  m->whole_free[m->whole_free_count++] = s;
}

static void remove_whole_free(model *m, segment *s) {
  segment *last = m->whole_free[--m->whole_free_count];
  m->whole_free[s->whole_slot] = last;
  last->whole_slot = s->whole_slot;
}

static int by_index_descending(const void *a, const void *b) {
  size_t x = (*(segment *const *)a)->index, y = (*(segment *const *)b)->index;
  return x < y ? 1 : x > y ? -1 : 0;
}

// CCA's release_cached_blocks: every segment that is one free block goes back. They go in
// the order a scan of `segments` from its end would give them back (each leaving its slot
// to the last segment), so that the upstream (and a view's observer) sees the same frees in
// the same order, and `segments` keeps the layout, as with that scan.
static void release_free_segments(model *m) {
  if (!m->whole_free_count) return; // a model that never made a segment has no array to sort
  qsort(m->whole_free, m->whole_free_count, sizeof *m->whole_free, by_index_descending);
  for (size_t i = 0; i < m->whole_free_count; i++) {
    segment *s = m->whole_free[i];
    pool_remove(&m->pools[s->small], s->first);
    give_back(m, s->index);
  }
  m->whole_free_count = 0;
}

static block *new_segment(model *m, uint64_t size, int small) {
  if (m->segment_count == m->segment_capacity) {
    size_t bigger = m->segment_capacity ? 2 * m->segment_capacity : 64;
    segment **grown = realloc(m->segments, bigger * sizeof *grown);
    if (!grown) return NULL;
    m->segments = grown;
    grown = realloc(m->whole_free, bigger * sizeof *grown);
    if (!grown) return NULL;
    m->whole_free = grown, m->segment_capacity = bigger;
  }
  segment *s = calloc(1, sizeof *s);
  block *b = calloc(1, sizeof *b);
  if (!s || !b || devbuf_allocator_alloc(m->upstream, (size_t)size, &s->memory) != DEVBUF_OK) {
    free(s);
    free(b);
    return NULL;
  }
  s->small = small;
  s->first = b;
  s->index = m->segment_count;
  m->segments[m->segment_count++] = s;
  m->reserved += s->memory.size;
  *b = (block){.address = s->memory.device, .size = size, .segment = s};
  return b;
}

static devbuf_status model_alloc(void *context, size_t size, devbuf_memory_t *out) {
  model *m = context;
  uint64_t rounded = size < ROUND ? ROUND : ((uint64_t)size + ROUND - 1) / ROUND * ROUND;
  int small = rounded <= SMALL_SIZE;
  pool *p = &m->pools[small];
  block key = {.size = rounded};
  block *b = lower_bound(p, &key);
  if (b) {
    pool_remove(p, b);
    if (!b->prev && !b->next) remove_whole_free(m, b->segment);
  } else {
    uint64_t segment_size = segment_size_for(rounded);
    if (m->memory_limit && m->reserved + segment_size > m->memory_limit && m->whole_free_count)
      release_free_segments(m);
    if (m->memory_limit && m->reserved + segment_size > m->memory_limit)
      return devbuf_set_error(DEVBUF_OUT_OF_MEMORY,
                              "CCA model: a %llu-byte segment for %zu bytes would pass the limit "
                              "of %llu bytes (%llu reserved)",
                              (unsigned long long)segment_size, size,
                              (unsigned long long)m->memory_limit, (unsigned long long)m->reserved);
    b = new_segment(m, segment_size, small);
    if (!b)
      return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "CCA model: no segment of %llu bytes",
                              (unsigned long long)segment_size);
  }
  uint64_t rest = b->size - rounded;
  if (small ? rest >= ROUND : rest > SMALL_SIZE) {
    block *tail = malloc(sizeof *tail);
    if (tail) {
      *tail = (block){.address = b->address + rounded,
                      .size = rest,
                      .prev = b,
                      .next = b->next,
                      .segment = b->segment};
      if (b->next) b->next->prev = tail;
      b->next = tail;
      b->size = rounded;
      pool_insert(p, tail);
    }
  }
  b->allocated = 1;
  *out = (devbuf_memory_t){.device = b->address, .size = (size_t)b->size, .token = b};
  return DEVBUF_OK;
}

// Merges `b` (free, out of the pool) with a free neighbour, which leaves the pool.
static void absorb(pool *p, block *b, block *neighbour) {
  if (!neighbour || neighbour->allocated) return;
  pool_remove(p, neighbour);
  if (neighbour == b->prev) {
    if (b->segment->first == neighbour) b->segment->first = b;
    b->address = neighbour->address;
    b->prev = neighbour->prev;
    if (b->prev) b->prev->next = b;
  } else {
    b->next = neighbour->next;
    if (b->next) b->next->prev = b;
  }
  b->size += neighbour->size;
  free(neighbour);
}

static void model_free(void *context, const devbuf_memory_t *memory) {
  model *m = context;
  block *b = memory->token;
  pool *p = &m->pools[b->segment->small];
  b->allocated = 0;
  absorb(p, b, b->prev);
  absorb(p, b, b->next);
  pool_insert(p, b);
  if (!b->prev && !b->next) add_whole_free(m, b->segment);
}

static void model_destroy(void *context) {
  model *m = context;
  free(m->whole_free); // the pools' blocks go with their segments
  // Blocks still allocated belong to nobody now; their segments go back whole.
  while (m->segment_count) give_back(m, m->segment_count - 1);
  free(m->segments);
  devbuf_allocator_release(m->upstream);
  free(m);
}

// torch.cuda.empty_cache(), and the retry after a failed cudaMalloc: a trace's "# E".
static void model_clear_cache(void *context) { release_free_segments(context); }

static const devbuf_allocator_vtable_t model_vtable = {.alloc = model_alloc,
                                                       .free = model_free,
                                                       .destroy = model_destroy,
                                                       .clear_cache = model_clear_cache};

devbuf_status devbuf_tool_cca_model_create(devbuf_allocator_t *upstream, uint64_t memory_limit,
                                           devbuf_allocator_t **out_allocator) {
  model *m = calloc(1, sizeof *m);
  if (!m) return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "CCA model: no memory for its state");
  m->upstream = devbuf_allocator_retain(upstream);
  m->memory_limit = memory_limit;
  devbuf_status status =
      devbuf_allocator_create(devbuf_allocator_device(upstream), &model_vtable, m, out_allocator);
  if (status != DEVBUF_OK) model_destroy(m);
  return status;
}
