// What `devbuf trace replay` adds to its figures for a PyTorch snapshot (what PyTorch's
// caching allocator did in that run, from the snapshot's own events) and under
// --least-limit (the least memory limit under which devbuf's policy, and the model of
// PyTorch's, refuse nothing).
#ifndef DEVBUF_TOOL_TRACE_EXTRAS_H
#define DEVBUF_TOOL_TRACE_EXTRAS_H

#include "least_limit.h"
#include "snapshot_reader.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct devbuf_tool_trace_extras {
  const devbuf_snapshot_figures *snapshot; // NULL for a plain trace
  int cuda_device;                         // the snapshot's device whose figures they are
  bool least_limits;                       // measured: the two below
  devbuf_tool_least_limit devbuf, cca;
} devbuf_tool_trace_extras;

// Measures the least limits of both policies on the trace at `path` (devbuf's with
// `options`' page and growable segments). A replay's error is returned as it is.
devbuf_status devbuf_tool_trace_extras_measure(devbuf_device_t *device,
                                               const devbuf_caching_options_t *options,
                                               const char *path, devbuf_tool_trace_extras *extras);
// The extras as lines of text, and as JSON fields (", \"name\": value", ...) to end an object.
void devbuf_tool_trace_extras_text(const devbuf_tool_trace_extras *extras, FILE *out);
void devbuf_tool_trace_extras_json(const devbuf_tool_trace_extras *extras, FILE *out);

#endif
