// Text for the terminal: names and metadata from files made safe (control characters shown
// as \xNN instead of being sent raw), and shapes.
#ifndef DEVBUF_TOOL_PRINTABLE_H
#define DEVBUF_TOOL_PRINTABLE_H

#include <stddef.h>

// Writes the escaped form of `text` into `out` (capacity > 0, always terminated, cut to
// fit) and returns `out`.
const char *devbuf_tool_printable(const char *text, char *out, size_t capacity);

// "[2, 3]" (with `separator` between dimensions) into `out`, cut to fit; returns `out`.
const char *devbuf_tool_shape_text(const size_t *shape, size_t ndim, const char *separator, char *out,
                                   size_t capacity);

#endif
