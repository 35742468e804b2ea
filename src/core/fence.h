// What the core layer knows of submitted work: a fence. The hazard tracker and storages hold
// fences (to order later work after them, and to wait for them) without knowing the work
// items that carry them: exec/work.c puts one at the start of every work item and supplies
// how to wait for it and what its last release does.
#ifndef DEVBUF_FENCE_H
#define DEVBUF_FENCE_H

#include "core.h"

typedef struct devbuf__fence devbuf__fence;

typedef struct devbuf__fence_ops {
  void (*wait)(devbuf__fence *fence);         // until `done`
  void (*last_release)(devbuf__fence *fence); // the last reference went
} devbuf__fence_ops;

struct devbuf__fence {
  devbuf__refcount refs;
  const devbuf__fence_ops *ops;
  devbuf_queue_t *queue; // whose order it keeps: later work of that queue needs no wait for it
  unsigned epoch;        // the process's (devbuf__epoch) when submitted
  atomic_bool done;      // set once, when the work has completed (or failed, or was cancelled)
};

static inline devbuf__fence *devbuf__fence_retain(devbuf__fence *fence) {
  devbuf__ref_retain(&fence->refs);
  return fence;
}

static inline void devbuf__fence_release(devbuf__fence *fence) {
  if (devbuf__ref_drop(&fence->refs)) fence->ops->last_release(fence);
}

// Work of an ancestor process (forked before it completed) counts as done: it never runs
// in this process, and this process's copy of its bytes is no longer its to change.
static inline bool devbuf__fence_done(const devbuf__fence *fence) {
  return atomic_load_explicit(&fence->done, memory_order_acquire) ||
         DEVBUF_UNLIKELY(fence->epoch != devbuf__epoch());
}

static inline void devbuf__fence_wait(devbuf__fence *fence) {
  if (!devbuf__fence_done(fence)) fence->ops->wait(fence);
}

#endif
