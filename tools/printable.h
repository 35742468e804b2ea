// Text from files (tensor names, metadata) made safe for a terminal: control characters
// are shown as \xNN instead of being sent to the terminal raw.
#ifndef DEVBUF_TOOL_PRINTABLE_H
#define DEVBUF_TOOL_PRINTABLE_H

#include <stddef.h>

// Writes the escaped form of `text` into `out` (capacity > 0, always terminated, cut to
// fit) and returns `out`.
const char *devbuf_tool_printable(const char *text, char *out, size_t capacity);

#endif
