// An upstream allocator for replaying traces: it hands out addresses no memory stands
// behind (nothing reads or writes them in a replay) and counts what it holds, so a trace
// of a 40 GiB training run replays on any machine and the figures are exact.
#ifndef DEVBUF_TOOL_COUNTING_UPSTREAM_H
#define DEVBUF_TOOL_COUNTING_UPSTREAM_H

#include "devbuf.h"

typedef struct devbuf_counting_upstream {
  uint64_t next_address;
  uint64_t held, peak_held; // bytes
  uint64_t allocs, frees;   // system calls the caching allocator made
} devbuf_counting_upstream;

// A caching allocator over a counting upstream with `device`'s page policy (or the page
// and limits of `options`, which may be NULL).
devbuf_status devbuf_tool_counting_caching(devbuf_device_t *device,
                                           const devbuf_caching_options_t *options,
                                           devbuf_counting_upstream *counts,
                                           devbuf_allocator_t **out_caching);

#endif
