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

// A name cut by a precision ("%.100s") can end inside a UTF-8 character: the partial
// character is dropped, so that the message stays UTF-8 that a reader can decode.
static void drop_cut_characters(char *text) {
  unsigned char *at = (unsigned char *)text, *to = at;
  while (*at) {
    size_t need = *at >= 0xF0 && *at < 0xF8   ? 3
                  : *at >= 0xE0 && *at < 0xF0 ? 2
                  : *at >= 0xC0               ? 1
                                              : 0;
    size_t have = 0;
    while (have < need && (at[1 + have] & 0xC0) == 0x80) have++;
    if (have < need) { // cut: skip the lead byte and what came of the character
      at += 1 + have;
      continue;
    }
    for (size_t i = 0; i <= need; i++) *to++ = *at++;
  }
  *to = '\0';
}

devbuf_status devbuf_set_error(devbuf_status status, const char *format, ...) {
  // Formatted apart first: the arguments may point into the message itself (a caller that
  // wraps the last error in its own words).
  char text[sizeof error_message];
  text[0] = '\0';
  if (format) {
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    drop_cut_characters(text);
  }
  snprintf(error_message, sizeof error_message, format ? "%s: %s" : "%s",
           devbuf_status_name(status), text);
  return status;
}

devbuf_status devbuf__error_cause(devbuf_status status, const char *format, ...) {
  char cause[sizeof error_message]; // the message is rewritten from itself: a copy first
  snprintf(cause, sizeof cause, "%s", error_message);
  int prefix = snprintf(error_message, sizeof error_message, "%s: ", devbuf_status_name(status));
  if (prefix < 0 || (size_t)prefix >= sizeof error_message) return status;
  va_list args;
  va_start(args, format);
  int context =
      vsnprintf(error_message + prefix, sizeof error_message - (size_t)prefix, format, args);
  va_end(args);
  size_t used = (size_t)prefix + (context > 0 ? (size_t)context : 0);
  // ": <cause>", cut where the message ends (a long chain loses its tail, never its head).
  const char *parts[2] = {": ", cause};
  for (size_t p = 0; p < 2 && cause[0]; p++)
    for (const char *c = parts[p]; *c && used + 1 < sizeof error_message; c++)
      error_message[used++] = *c;
  if (used < sizeof error_message) error_message[used] = '\0';
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
