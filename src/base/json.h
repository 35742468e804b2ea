// A strict, pull-style JSON reader for headers of weight files: the caller walks the
// document it expects (objects, arrays, strings, non-negative integers) and every deviation
// is an error naming the byte offset. Nothing is ever skipped, so nesting cannot recurse.
#ifndef DEVBUF_JSON_H
#define DEVBUF_JSON_H

#include "base.h"

typedef struct devbuf__json {
  const char *text;
  size_t size;
  size_t pos;
  const char *what; // prefix of every message ("safetensors header")
} devbuf__json;

// The next non-blank character without consuming it; -1 at the end of the text.
int devbuf__json_peek(devbuf__json *json);
// Consumes `c` (after blanks) or fails naming what was found instead.
devbuf_status devbuf__json_expect(devbuf__json *json, char c, const char *context);
// Steps through the members of an object or the elements of an array whose opening
// bracket was consumed: *out_more is false once the closing bracket has been consumed.
// `index` counts the members read so far (a comma is needed before all but the first).
devbuf_status devbuf__json_next(devbuf__json *json, char close, size_t index, bool *out_more,
                                const char *context);
// A string, decoded (escapes, surrogate pairs) into a NUL-terminated copy that the caller
// frees with devbuf__free. Refuses invalid UTF-8, lone surrogates, raw control characters
// and U+0000 (C strings could not hold it).
devbuf_status devbuf__json_string(devbuf__json *json, char **out_string, const char *context);
// A non-negative integer written without sign, fraction or exponent, up to UINT64_MAX.
devbuf_status devbuf__json_u64(devbuf__json *json, uint64_t *out_value, const char *context);
// Succeeds when only blanks remain.
devbuf_status devbuf__json_end(devbuf__json *json);

// Whether `bytes` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool devbuf__utf8_valid(const char *bytes, size_t size);

#endif
