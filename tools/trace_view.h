// devbuf trace view: an allocation trace as one self-contained HTML page (inline SVG, no
// script, no network): live bytes over time stacked by allocation, the bytes a caching
// allocator reserved as a line, both peaks marked; hovering an allocation shows its size
// and lifetime. The figures are those `devbuf trace replay` prints for the same trace.
#ifndef DEVBUF_TOOL_TRACE_VIEW_H
#define DEVBUF_TOOL_TRACE_VIEW_H

#include "devbuf.h"

// Writes the page for the trace at `path` to `page`; the exit code (0, or 1 with a message).
int devbuf_tool_trace_view(devbuf_device_t *device, const char *path, const char *page);

#endif
