// Status codes and the thread-local error message.
#include "base.h"

#include <stdarg.h>
#include <stdio.h>

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

devbuf_status devbuf_set_error(devbuf_status status, const char *format, ...) {
  int prefix = snprintf(error_message, sizeof error_message, "%s: ", devbuf_status_name(status));
  if (prefix < 0 || (size_t)prefix >= sizeof error_message) return status;
  if (!format) { // the status name alone
    error_message[prefix - 2] = '\0';
    return status;
  }
  va_list args;
  va_start(args, format);
  vsnprintf(error_message + prefix, sizeof error_message - (size_t)prefix, format, args);
  va_end(args);
  return status;
}
