// A queue's FIFO of submitted items (work_fifo.h): the chunks' lifecycle and the runner's
// takes.
#include "work_fifo.h"

static devbuf__fifo_chunk *chunk_new(void) {
  devbuf__fifo_chunk *chunk = devbuf__malloc(sizeof *chunk);
  if (chunk) atomic_init(&chunk->next, NULL);
  return chunk;
}

static void free_chain(devbuf__fifo_chunk *chunk) {
  while (chunk) {
    devbuf__fifo_chunk *next = atomic_load_explicit(&chunk->next, memory_order_relaxed);
    devbuf__free(chunk);
    chunk = next;
  }
}

bool devbuf__fifo_init(devbuf__fifo_in *in, devbuf__fifo_out *out) {
  devbuf__fifo_chunk *first = chunk_new();
  if (!first) return false;
  *in = (devbuf__fifo_in){.chunk = first, .slot = 0, .spares = NULL};
  atomic_init(&in->published, 0);
  out->lock = (devbuf__spinlock)DEVBUF__SPINLOCK_INITIALIZER;
  out->chunk = first;
  out->slot = 0;
  atomic_init(&out->taken, 0);
  atomic_init(&out->emptied, NULL);
  atomic_init(&out->emptied_count, 0);
  return true;
}

void devbuf__fifo_destroy(devbuf__fifo_in *in, devbuf__fifo_out *out) {
  free_chain(out->chunk); // every chunk from the oldest to the submitter's newest
  free_chain(in->spares);
  free_chain(atomic_load_explicit(&out->emptied, memory_order_acquire));
  in->chunk = out->chunk = in->spares = NULL;
}

// The submitter's chunk is full and it has no spare: the runner's emptied chunks, or a new
// one.
bool devbuf__fifo_grow(devbuf__fifo_in *in, devbuf__fifo_out *out) {
  devbuf__fifo_chunk *emptied = atomic_exchange_explicit(&out->emptied, NULL, memory_order_acquire);
  if (emptied) {
    unsigned count = 0;
    for (devbuf__fifo_chunk *c = emptied; c;
         c = atomic_load_explicit(&c->next, memory_order_relaxed))
      count++;
    atomic_fetch_sub_explicit(&out->emptied_count, count, memory_order_relaxed);
    in->spares = emptied;
    return true;
  }
  in->spares = chunk_new();
  return in->spares != NULL;
}

// The submitter's chunk is full: a spare (devbuf__fifo_room made sure of one) is linked after
// it and takes `work`.
void devbuf__fifo_push_linking(devbuf__fifo_in *in, devbuf__work *work) {
  devbuf__fifo_chunk *spare = in->spares, *full = in->chunk;
  in->spares = atomic_load_explicit(&spare->next, memory_order_relaxed);
  atomic_store_explicit(&spare->next, NULL, memory_order_relaxed);
  spare->slots[0] = work;
  atomic_store_explicit(&full->next, spare, memory_order_relaxed); // published with the item
  in->chunk = spare;
  in->slot = 1;
}

// A chunk read to its end, which the submitter has left for the next: back to the
// submitter, or freed when it holds enough.
static void hand_back(devbuf__fifo_out *out, devbuf__fifo_chunk *chunk) {
  if (atomic_load_explicit(&out->emptied_count, memory_order_relaxed) >= DEVBUF__FIFO_SPARES) {
    devbuf__free(chunk);
    return;
  }
  atomic_fetch_add_explicit(&out->emptied_count, 1, memory_order_relaxed);
  devbuf__fifo_chunk *top = atomic_load_explicit(&out->emptied, memory_order_relaxed);
  do {
    atomic_store_explicit(&chunk->next, top, memory_order_relaxed);
  } while (!atomic_compare_exchange_weak_explicit(&out->emptied, &top, chunk, memory_order_release,
                                                  memory_order_relaxed));
}

size_t devbuf__fifo_take(const devbuf__fifo_in *in, devbuf__fifo_out *out, devbuf__work **items,
                         size_t most) {
  devbuf__spin_lock(&out->lock);
  // What is counted published is in its slots, in order, and `taken` never passes it, so
  // that the two counts tell emptiness (devbuf__fifo_waiting) at every moment.
  uint64_t published = atomic_load_explicit(&in->published, memory_order_acquire);
  uint64_t taken = atomic_load_explicit(&out->taken, memory_order_relaxed);
  size_t count = 0, wanted = published - taken < most ? (size_t)(published - taken) : most;
  while (count < wanted) {
    if (out->slot == DEVBUF__FIFO_SLOTS) { // the next chunk holds the rest: it is linked
      devbuf__fifo_chunk *read = out->chunk;
      out->chunk = atomic_load_explicit(&read->next, memory_order_relaxed);
      out->slot = 0;
      hand_back(out, read);
    }
    while (out->slot < DEVBUF__FIFO_SLOTS && count < wanted)
      items[count++] = out->chunk->slots[out->slot++];
  }
  if (count) atomic_store_explicit(&out->taken, taken + count, memory_order_relaxed);
  devbuf__spin_unlock(&out->lock);
  return count;
}
