// The escaping of printable.h.
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
