// Status codes and the thread-local error message.
#include "base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

// A fixed thread-local buffer: reporting an error must work when memory is exhausted.
static _Thread_local char error_message[512];

const char *devbuf_status_name(devbuf_status status) {
  switch (status) {
#define DEVBUF_STATUS_NAME_(name, value, text) \
  case DEVBUF_##name:                          \
    return #name;
    DEVBUF_STATUS_TABLE(DEVBUF_STATUS_NAME_)
#undef DEVBUF_STATUS_NAME_
  }
  return "UNKNOWN";
}

const char *devbuf_status_str(devbuf_status status) {
  switch (status) {
#define DEVBUF_STATUS_TEXT_(name, value, text) \
  case DEVBUF_##name:                          \
    return text;
    DEVBUF_STATUS_TABLE(DEVBUF_STATUS_TEXT_)
#undef DEVBUF_STATUS_TEXT_
  }
  return "unknown status";
}

const char *devbuf_last_error(void) { return error_message; }

void devbuf__clear_error(void) { error_message[0] = '\0'; }

// The bytes of the UTF-8 character at `at` (1 to 4), or 0 where none starts there.
static size_t character_length(const unsigned char *at) {
  if (*at < 0x80) return 1;
  size_t length = *at >= 0xC2 && *at <= 0xDF   ? 2
                  : *at >= 0xE0 && *at <= 0xEF ? 3
                  : *at >= 0xF0 && *at <= 0xF4 ? 4
                                               : 0;
  for (size_t i = 1; i < length; i++)
    if ((at[i] & 0xC0) != 0x80) return 0;
  return length;
}

// Control characters a terminal acts on (ESC starts its escape sequences; C1's CSI too): a
// name from a hostile file or a caller's path must not restyle or rewrite what a log shows.
// Newlines and tabs stay: compilers' build logs are lines.
static bool is_control(const unsigned char *at, size_t length) {
  if (length == 1) return (*at < 0x20 && *at != '\n' && *at != '\t') || *at == 0x7F;
  return length == 2 && at[0] == 0xC2 && at[1] < 0xA0; // U+0080 to U+009F
}

// Appends `text` to out[*used..size) as UTF-8 a reader can decode: a byte that starts no
// character (a name cut inside one by a precision such as "%.100s", a Latin-1 path), and each
// byte of a control character, shows as \xNN; a character that the end of `out` would cut
// is left out whole.
static void append_utf8(char *out, size_t size, size_t *used, const char *text) {
  for (const unsigned char *at = (const unsigned char *)text; *at;) {
    size_t length = character_length(at);
    if (length && is_control(at, length)) length = 0; // escaped a byte at a time
    size_t room = size - 1 - *used;
    if ((length ? length : 4) > room) break;
    if (length) {
      memcpy(out + *used, at, length);
      *used += length;
      at += length;
    } else {
      snprintf(out + *used, 5, "\\x%02x", *at++);
      *used += 4;
    }
  }
  out[*used] = '\0';
}

// The thread's message: "<STATUS>[: <text>][: <cause>]", cut where it ends (a long chain
// loses its tail, never its head). Neither part may point into the message.
static void write_message(devbuf_status status, const char *text, const char *cause) {
  size_t used = 0;
  error_message[0] = '\0';
  append_utf8(error_message, sizeof error_message, &used, devbuf_status_name(status));
  for (const char *const *part = (const char *const[]){text, cause}, *const *end = part + 2;
       part < end; part++) {
    if (!*part) continue;
    append_utf8(error_message, sizeof error_message, &used, ": ");
    append_utf8(error_message, sizeof error_message, &used, *part);
  }
}

devbuf_status devbuf_set_error(devbuf_status status, const char *format, ...) {
  // Formatted apart first: the arguments may point into the message itself (a caller that
  // wraps the last error in its own words).
  char text[sizeof error_message];
  if (format) {
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
  }
  write_message(status, format ? text : NULL, NULL);
  return status;
}

devbuf_status devbuf__error_cause(devbuf_status status, const char *format, ...) {
  char cause[sizeof error_message], context[sizeof error_message];
  snprintf(cause, sizeof cause, "%s", error_message); // rewritten from itself: a copy first
  va_list args;
  va_start(args, format);
  vsnprintf(context, sizeof context, format, args);
  va_end(args);
  write_message(status, context, cause[0] ? cause : NULL);
  return status;
}

devbuf_status devbuf__null_argument(const char *call, const char *names,
                                    const void *const *pointers) {
  const char *name = names;
  for (size_t i = 0; *name; i++) {
    const char *end = strstr(name, ", ");
    size_t length = end ? (size_t)(end - name) : strlen(name);
    if (!pointers[i])
      return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s%s%.*s is NULL", call, *call ? ": " : "",
                           (int)length, name);
    name += length + (end ? 2 : 0);
  }
  return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s%s%s are required", call, *call ? ": " : "",
                       names);
}

void devbuf__join_message(char *out, size_t size, const char *head, const char *cause) {
  if (!size) return;
  static const char elided[] = "...";
  size_t head_length = strlen(head), cause_length = strlen(cause);
  if (head_length >= size) head_length = size - 1;
  memcpy(out, head, head_length);
  size_t room = size - 1 - head_length;
  if (cause_length > room && room >= sizeof elided) {
    size_t skip = cause_length - (room - (sizeof elided - 1));
    while (skip < cause_length && ((unsigned char)cause[skip] & 0xC0) == 0x80) skip++; // UTF-8
    memcpy(out + head_length, elided, sizeof elided - 1);
    head_length += sizeof elided - 1;
    cause += skip;
    cause_length -= skip;
    room = size - 1 - head_length;
  }
  if (cause_length > room) cause_length = room;
  memcpy(out + head_length, cause, cause_length);
  out[head_length + cause_length] = '\0';
}

const char *devbuf__bytes_text(uint64_t bytes, char text[32]) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(text, 32, "%llu byte%s", (unsigned long long)bytes, bytes == 1 ? "" : "s");
    return text;
  }
  double value = (double)bytes / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < sizeof units / sizeof units[0]) {
    value /= 1024;
    unit++;
  }
  if (value >= 1023.95 && unit + 1 < sizeof units / sizeof units[0]) { // not "1024.0 KiB"
    value /= 1024;
    unit++;
  }
  // Whole numbers plainly ("64 MiB"); others to one decimal ("1.5 MiB").
  if (value == (double)(uint64_t)value)
    snprintf(text, 32, "%llu %s", (unsigned long long)value, units[unit]);
  else
    snprintf(text, 32, "%.1f %s", value, units[unit]);
  return text;
}
