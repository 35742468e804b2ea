// The least memory limit under which a policy replays a trace refusing nothing, found by
// bisection over replays over the counting upstream (counting_upstream.h): about 30
// replays, each milliseconds for a real trace. The bisection takes "refuses something" to
// be monotone in the limit; where a policy gives cached segments back only under a limit,
// a limit just above the one found may still refuse, so the result is the least limit
// found between a refusing one and one that refuses nothing, exact to the byte.
#ifndef DEVBUF_TOOL_LEAST_LIMIT_H
#define DEVBUF_TOOL_LEAST_LIMIT_H

#include "counting_upstream.h"

typedef struct devbuf_tool_least_limit {
  uint64_t bytes;     // the least limit found: nothing refused under it
  uint64_t peak_free; // peak reserved bytes of the replay without a limit
  unsigned replays;   // replays made
} devbuf_tool_least_limit;

// For `policy` over `device`'s page policy with `options` (NULL or page, growable; its
// memory_limit is the one searched, so ignored) on the trace at `path`. A replay's error
// (with devbuf_last_error) is returned as it is.
devbuf_status devbuf_tool_find_least_limit(devbuf_device_t *device, devbuf_tool_policy policy,
                                           const devbuf_caching_options_t *options,
                                           const char *path, devbuf_tool_least_limit *out);

#endif
