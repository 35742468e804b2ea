// A queue's FIFO of submitted items: chunks of item pointers that the submitter fills in
// order (one at a time: under its device's submission lock) and that the queue's runner reads
// in order. The runner finds eight items on each cache line it reads, one line after the
// other: a list linked through the items themselves made it wait for each item's line in
// turn before it knew the next item, the most of a small item's cost once the submitter was
// on another core. A chunk the runner has read goes back to the submitter for reuse.
#ifndef DEVBUF_WORK_FIFO_H
#define DEVBUF_WORK_FIFO_H

#include "../base/base.h"

typedef struct devbuf__work devbuf__work;

#define DEVBUF__FIFO_SLOTS 63 // a chunk of 512 bytes

// The slots hold no count: the runner takes as many items as `published` says, in order, and
// a chunk is full before the next is linked. So nothing of a chunk is written by both sides.
typedef struct devbuf__fifo_chunk {
  struct devbuf__fifo_chunk *_Atomic next; // the newer chunk, linked once this one is full
  devbuf__work *slots[DEVBUF__FIFO_SLOTS];
} devbuf__fifo_chunk;

// The submitter's end.
typedef struct devbuf__fifo_in {
  devbuf__fifo_chunk *chunk;  // the newest chunk
  uint32_t slot;              // its first free slot (what it published)
  devbuf__fifo_chunk *spares; // chunks at hand for when it is full, linked through `next`
  // Items published: a seq_cst store after each, for the runner's test of emptiness that
  // decides its sleep (queue.c, wait_for_work).
  atomic_uint_least64_t published;
} devbuf__fifo_in;

// The runner's end.
typedef struct devbuf__fifo_out {
  devbuf__spinlock lock;       // the runner's takes, and a cancel's from another thread
  devbuf__fifo_chunk *chunk;   // the oldest chunk
  uint32_t slot;               // its first slot not taken
  atomic_uint_least64_t taken; // items taken
  // Chunks read to the end, for the submitter: a stack the runner pushes to and the
  // submitter takes whole; at most DEVBUF__FIFO_SPARES, beyond which they are freed.
  devbuf__fifo_chunk *_Atomic emptied;
  atomic_uint emptied_count;
} devbuf__fifo_out;

#define DEVBUF__FIFO_SPARES 4

// An empty FIFO: false without host memory for its first chunk.
bool devbuf__fifo_init(devbuf__fifo_in *in, devbuf__fifo_out *out);
// Frees the chunks; nobody submits or takes any more.
void devbuf__fifo_destroy(devbuf__fifo_in *in, devbuf__fifo_out *out);

bool devbuf__fifo_grow(devbuf__fifo_in *in, devbuf__fifo_out *out);
// Whether the next push has a slot: taken before anything is recorded for an item, so that
// a submission without host memory is refused whole. Submitter only.
static inline bool devbuf__fifo_room(devbuf__fifo_in *in, devbuf__fifo_out *out) {
  return DEVBUF_LIKELY(in->slot < DEVBUF__FIFO_SLOTS || in->spares) || devbuf__fifo_grow(in, out);
}

void devbuf__fifo_push_linking(devbuf__fifo_in *in, devbuf__work *work);
// Appends `work` (after devbuf__fifo_room said yes) and publishes it. Submitter only. The
// line of the slots eight ahead is fetched for writing: a reused chunk's lines were last read
// by the runner.
static inline void devbuf__fifo_push(devbuf__fifo_in *in, devbuf__work *work) {
  uint32_t slot = in->slot;
  if (DEVBUF_LIKELY(slot < DEVBUF__FIFO_SLOTS)) {
    if (slot + 8 < DEVBUF__FIFO_SLOTS) devbuf__prefetch_for_write(&in->chunk->slots[slot + 8]);
    in->chunk->slots[slot] = work;
    in->slot = slot + 1;
  } else {
    devbuf__fifo_push_linking(in, work);
  }
  // seq_cst: a release of the slot (and of a new chunk's link) to the runner's acquire
  atomic_store(&in->published, atomic_load_explicit(&in->published, memory_order_relaxed) + 1);
}

// Takes up to `most` published items, oldest first, into `items`; their count.
size_t devbuf__fifo_take(const devbuf__fifo_in *in, devbuf__fifo_out *out, devbuf__work **items,
                         size_t most);

// Whether items are published and not taken (sequentially consistent loads; a stale `taken`
// read from another thread than the runner's may say yes when the runner has them).
static inline bool devbuf__fifo_waiting(const devbuf__fifo_in *in, const devbuf__fifo_out *out) {
  uint64_t published = atomic_load(&in->published);
  return published > atomic_load(&out->taken);
}

#endif // DEVBUF_WORK_FIFO_H
