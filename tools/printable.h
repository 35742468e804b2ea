// Text for the terminal: names and metadata from files made safe (control characters shown
// as \xNN instead of being sent raw), and shapes.
#ifndef DEVBUF_TOOL_PRINTABLE_H
#define DEVBUF_TOOL_PRINTABLE_H

#include <stddef.h>
#include <stdio.h>

// Writes the escaped form of `text` into `out` (capacity > 0, always terminated, cut to
// fit) and returns `out`: well-formed UTF-8 passes, control characters (C0, DEL, C1), the
// backslash and bytes of no well-formed sequence become \xNN (so every escaped form reads
// back as exactly one text: devbuf_tool_unescape).
const char *devbuf_tool_printable(const char *text, char *out, size_t capacity);
// The text whose escaped form is `escaped` (\xNN read back as the byte, except \x00),
// allocated; NULL without memory.
char *devbuf_tool_unescape(const char *escaped);
// Bytes of the printable UTF-8 sequence at `text`, or 0 where printable would escape.
size_t devbuf_tool_printable_length(const unsigned char *text);

// "[2, 3]" (with `separator` between dimensions) into `out`, cut to fit; returns `out`.
const char *devbuf_tool_shape_text(const size_t *shape, size_t ndim, const char *separator,
                                   char *out, size_t capacity);

// Prints "devbuf <what>: [<path>: ]<message>" on stderr, the path and the library's last
// error message made printable: messages quote tensor names, dtype strings and paths.
void devbuf_tool_report(const char *what, const char *path);

// Writes `text` as a JSON string: quotes, backslashes and control characters escaped (C1
// ones too), well-formed UTF-8 as it is, bytes of no well-formed sequence as U+FFFD.
void devbuf_tool_json_string(const char *text, FILE *out);

// Opens a regular file for reading without blocking on a FIFO (what is not a regular file
// is refused); NULL with the reason in `why`.
FILE *devbuf_tool_open_regular(const char *path, char *why, size_t why_capacity);

// Shorthand for the escaped form of `text` in a buffer of the caller's frame.
#define DEVBUF_PRINTABLE(text, buffer) devbuf_tool_printable((text), (buffer), sizeof(buffer))

#endif
