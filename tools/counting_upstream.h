// An upstream allocator for replaying traces: it hands out addresses no memory stands
// behind (nothing reads or writes them in a replay) and counts what it holds, so a trace
// of a 40 GiB training run replays on any machine and the figures are exact.
#ifndef DEVBUF_TOOL_COUNTING_UPSTREAM_H
#define DEVBUF_TOOL_COUNTING_UPSTREAM_H

#include "devbuf.h"

// Told of every segment the policy takes from the upstream (`freed` 0) or gives back (1).
typedef void (*devbuf_segment_observer_fn)(void *context, uint64_t address, uint64_t size,
                                           int freed);

typedef struct devbuf_counting_upstream {
  uint64_t next_address;
  uint64_t held, peak_held;              // bytes
  uint64_t allocs, frees;                // system calls the caching allocator made
  devbuf_segment_observer_fn on_segment; // optional, with its context
  void *observer_context;
} devbuf_counting_upstream;

// Whose policy a replay follows: devbuf's caching allocator, or the model of PyTorch's
// (cca_model.h).
typedef enum devbuf_tool_policy {
  DEVBUF_TOOL_POLICY_DEVBUF,
  DEVBUF_TOOL_POLICY_CCA
} devbuf_tool_policy;

// The policy named `name` ("devbuf" or "cca"); 0 when the name is neither.
int devbuf_tool_policy_named(const char *name, devbuf_tool_policy *out_policy);
const char *devbuf_tool_policy_name(devbuf_tool_policy policy);

// A caching allocator over a counting upstream with `device`'s page policy (or the page
// and limits of `options`, which may be NULL).
devbuf_status devbuf_tool_counting_caching(devbuf_device_t *device,
                                           const devbuf_caching_options_t *options,
                                           devbuf_counting_upstream *counts,
                                           devbuf_allocator_t **out_caching);
// `policy` over a counting upstream. The counters of `counts` start from zero; its observer
// (set by the caller, or NULL) stays. The CCA model takes only `memory_limit` of `options`.
devbuf_status devbuf_tool_counting_policy(devbuf_device_t *device, devbuf_tool_policy policy,
                                          const devbuf_caching_options_t *options,
                                          devbuf_counting_upstream *counts,
                                          devbuf_allocator_t **out_allocator);

#endif
