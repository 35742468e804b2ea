// devbuf trace view: an allocation trace as one self-contained HTML page (its script and
// data inline, nothing loaded from outside). Two policies side by side on the same trace:
// devbuf's caching allocator and the model of PyTorch's (cca_model.h). Each shows live
// bytes over time stacked by allocation with the reserved bytes as a line, axes in bytes
// and in events (and in time where the trace's `# t` lines give it), hover for an
// allocation's size, lifetime and stack (the trace's `# frame` lines), zoom, and what each
// segment held, used and free, at a moment the user clicks. The figures are those `devbuf
// trace replay [--policy cca]` prints for the same trace.
#ifndef DEVBUF_TOOL_TRACE_VIEW_H
#define DEVBUF_TOOL_TRACE_VIEW_H

#include "devbuf.h"

// Writes the page for the trace at `path` to `page`, replaying with `options` (page size and
// memory limit; NULL for the device's own); the page names the trace `shown` (the file the
// user gave, where `path` is a trace converted from it). The exit code (0, or 1 with a
// message).
int devbuf_tool_trace_view(devbuf_device_t *device, const char *path, const char *shown,
                           const devbuf_caching_options_t *options, const char *page);

#endif
