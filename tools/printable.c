// The text helpers of printable.h.
#include "printable.h"

#include "devbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int hex_value(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

char *devbuf_tool_unescape(const char *escaped) {
  char *out = malloc(strlen(escaped) + 1), *at = out;
  if (!out) return NULL;
  for (const char *from = escaped; *from;) {
    int high = from[0] == '\\' && from[1] == 'x' ? hex_value(from[2]) : -1;
    int low = high >= 0 ? hex_value(from[3]) : -1;
    if (low >= 0 && (high | low)) {
      *at++ = (char)(high * 16 + low);
      from += 4;
    } else {
      *at++ = *from++;
    }
  }
  *at = '\0';
  return out;
}

// Length of the well-formed UTF-8 sequence at `text` that a terminal shows as text (no
// C1 control, U+0080..U+009F, which terminals may take for escape sequences); 0 otherwise.
size_t devbuf_tool_printable_length(const unsigned char *text) {
  unsigned char c = text[0];
  if (c == '\\') return 0; // escaped too, so that the escaped form has one reading
  if (c >= 0x20 && c < 0x7f) return 1;
  size_t length = c >= 0xc2 && c <= 0xdf   ? 2
                  : c >= 0xe0 && c <= 0xef ? 3
                  : c >= 0xf0 && c <= 0xf4 ? 4
                                           : 0;
  for (size_t i = 1; i < length; i++)
    if ((text[i] & 0xc0) != 0x80) return 0;
  if (length == 2 && c == 0xc2 && text[1] < 0xa0) return 0; // C1 controls
  if (length == 3 && ((c == 0xe0 && text[1] < 0xa0) || (c == 0xed && text[1] >= 0xa0)))
    return 0; // overlong, surrogates
  if (length == 4 && ((c == 0xf0 && text[1] < 0x90) || (c == 0xf4 && text[1] >= 0x90)))
    return 0; // overlong, > U+10FFFF
  return length;
}

const char *devbuf_tool_printable(const char *text, char *out, size_t capacity) {
  size_t used = 0;
  const unsigned char *at = (const unsigned char *)text;
  while (*at) {
    size_t length = devbuf_tool_printable_length(at);
    if (length) {
      if (used + length >= capacity) break;
      for (size_t i = 0; i < length; i++) out[used++] = (char)at[i];
      at += length;
    } else { // a control character or a byte of no well-formed sequence: shown, not sent
      if (used + 5 > capacity - 1) break;
      snprintf(out + used, capacity - used, "\\x%02x", *at);
      used += 4;
      at++;
    }
  }
  out[used] = '\0';
  return out;
}

const char *devbuf_tool_shape_text(const size_t *shape, size_t ndim, const char *separator,
                                   char *out, size_t capacity) {
  size_t used = (size_t)snprintf(out, capacity, "[");
  for (size_t d = 0; d < ndim && used < capacity; d++)
    used += (size_t)snprintf(out + used, capacity - used, "%s%zu", d ? separator : "", shape[d]);
  if (used < capacity) used += (size_t)snprintf(out + used, capacity - used, "]");
  if (used >= capacity && capacity >= 5) // cut: say so, never end on a shortened number
    memcpy(out + capacity - 5, "...]", 5);
  return out;
}

void devbuf_tool_report(const char *what, const char *path) {
  char message[2048], safe_path[1024];
  fprintf(stderr, "devbuf %s: %s%s%s\n", what, path ? DEVBUF_PRINTABLE(path, safe_path) : "",
          path ? ": " : "", DEVBUF_PRINTABLE(devbuf_last_error(), message));
}

// A JSON string: quotes, backslashes and control characters escaped; UTF-8 passes through.
void devbuf_tool_json_string(const char *s, FILE *out) {
  fputc('"', out);
  for (const unsigned char *at = (const unsigned char *)s; *at;) {
    size_t length = devbuf_tool_printable_length(at);
    if (*at == '"' || *at == '\\')
      fprintf(out, "\\%c", *at);
    else if (length)
      fwrite(at, 1, length, out);
    else if (*at < 0x80 || (at[0] == 0xc2 && at[1] >= 0x80 && at[1] < 0xa0)) // a control character
      fprintf(out, "\\u%04x", *at < 0x80 ? *at : at[1]);
    else
      fputs("\\ufffd", out); // no character: the JSON stays valid
    at += length ? length : *at == 0xc2 && at[1] >= 0x80 && at[1] < 0xa0 ? 2 : 1;
  }
  fputc('"', out);
}

FILE *devbuf_tool_open_regular(const char *path, char *why, size_t why_capacity) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  struct stat info;
  if (fd < 0 || fstat(fd, &info) != 0) {
    snprintf(why, why_capacity, "%s", strerror(errno));
    if (fd >= 0) close(fd);
    return NULL;
  }
  if (!S_ISREG(info.st_mode)) {
    snprintf(why, why_capacity, "not a regular file");
    close(fd);
    return NULL;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  FILE *file = fdopen(fd, "r");
  if (!file) {
    snprintf(why, why_capacity, "%s", strerror(errno));
    close(fd);
  }
  return file;
}
