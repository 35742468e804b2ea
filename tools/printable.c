// The text helpers of printable.h.
#include "printable.h"

#include <stdio.h>

const char *devbuf_tool_printable(const char *text, char *out, size_t capacity) {
  size_t used = 0;
  for (; *text && used + 1 < capacity; text++) {
    unsigned char c = (unsigned char)*text;
    if (c >= 0x20 && c != 0x7f) { // UTF-8 sequences pass through whole
      out[used++] = (char)c;
    } else if (used + 5 < capacity) {
      snprintf(out + used, capacity - used, "\\x%02x", c);
      used += 4;
    } else {
      break;
    }
  }
  out[used] = '\0';
  return out;
}

const char *devbuf_tool_shape_text(const size_t *shape, size_t ndim, const char *separator, char *out,
                                   size_t capacity) {
  size_t used = (size_t)snprintf(out, capacity, "[");
  for (size_t d = 0; d < ndim && used < capacity; d++)
    used += (size_t)snprintf(out + used, capacity - used, "%s%zu", d ? separator : "", shape[d]);
  if (used < capacity) snprintf(out + used, capacity - used, "]");
  return out;
}
