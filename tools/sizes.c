// The sizes of sizes.h.
#include "sizes.h"
#include "printable.h"
#include "usage.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct unit {
  const char *name;
  unsigned shift; // the unit is 2^shift bytes
} unit;

static const unit units[] = {
    {"", 0},     {"b", 0},  {"k", 10},  {"kb", 10},  {"kib", 10}, {"m", 20},  {"mb", 20},
    {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30}, {"t", 40},   {"tb", 40}, {"tib", 40},
};

const char *devbuf_tool_parse_size(const char *text, uint64_t *out) {
  *out = 0;
  if (!text || !text[0]) return "is empty";
  if (text[0] == '-') return "is negative";
  if (text[0] < '0' || text[0] > '9') return "is not a number";
  uint64_t number = 0;
  const char *at = text;
  for (; *at >= '0' && *at <= '9'; at++) {
    unsigned digit = (unsigned)(*at - '0');
    if (number > (UINT64_MAX - digit) / 10) return "is more than 2^64 - 1 bytes";
    number = number * 10 + digit;
  }
  if (*at == '.' || *at == ',') return "is not a whole number";
  for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
    if (strcasecmp(at, units[i].name) != 0) continue;
    if (units[i].shift && number > UINT64_MAX >> units[i].shift)
      return "is more than 2^64 - 1 bytes";
    *out = number << units[i].shift;
    return NULL;
  }
  return "has an unknown unit (B, K, KiB, M, MiB, G, GiB, T or TiB)";
}

int devbuf_tool_size_option(const char *command, const char *option, const char *text, uint64_t min,
                            uint64_t max, uint64_t *out) {
  char safe[256], low[32], high[32];
  if (!text)
    return devbuf_tool_misuse(command, "%s needs a size, such as 4096, 64KiB or 2G", option);
  const char *why = devbuf_tool_parse_size(text, out);
  if (why)
    return devbuf_tool_misuse(command, "%s takes a size such as 4096, 64KiB or 2G: '%s' %s", option,
                              DEVBUF_PRINTABLE(text, safe), why);
  if (*out < min && max == UINT64_MAX)
    return devbuf_tool_misuse(command, "%s takes a size of at least %s, not '%s'", option,
                              devbuf_tool_human_size(min, low, sizeof low),
                              DEVBUF_PRINTABLE(text, safe));
  if (*out < min || *out > max)
    return devbuf_tool_misuse(command, "%s takes a size from %s to %s, not '%s'", option,
                              devbuf_tool_human_size(min, low, sizeof low),
                              devbuf_tool_human_size(max, high, sizeof high),
                              DEVBUF_PRINTABLE(text, safe));
  return 0;
}

const char *devbuf_tool_human_size(uint64_t bytes, char *out, size_t capacity) {
  static const char *const names[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(out, capacity, "%llu byte%s", (unsigned long long)bytes, bytes == 1 ? "" : "s");
    return out;
  }
  int index = 0;
  double value = (double)bytes / 1024;
  while (value >= 1023.5 && index < 5) value /= 1024, index++; // never "1024 KiB"
  if (value == (double)(uint64_t)value)                        // whole: 512 KiB, 2 MiB
    snprintf(out, capacity, "%.0f %s", value, names[index]);
  else
    snprintf(out, capacity,
             value < 10    ? "%.2f %s"
             : value < 100 ? "%.1f %s"
                           : "%.0f %s",
             value, names[index]);
  return out;
}

const char *devbuf_tool_grouped(uint64_t value, char *out, size_t capacity) {
  char digits[24];
  int length = snprintf(digits, sizeof digits, "%llu", (unsigned long long)value);
  size_t used = 0;
  for (int i = 0; i < length && used + 2 < capacity; i++) {
    if (i && (length - i) % 3 == 0) out[used++] = ',';
    out[used++] = digits[i];
  }
  out[used] = '\0';
  return out;
}

int devbuf_tool_count_option(const char *command, const char *option, const char *text, long min,
                             long max, long *out) {
  char safe[256];
  if (!text)
    return devbuf_tool_misuse(command, "%s needs a number from %ld to %ld", option, min, max);
  char *end = NULL;
  errno = 0;
  long value = text[0] >= '0' && text[0] <= '9' ? strtol(text, &end, 10) : -1;
  if (!end || *end || errno || value < min || value > max)
    return devbuf_tool_misuse(command, "%s takes a number from %ld to %ld, not '%s'", option, min,
                              max, DEVBUF_PRINTABLE(text, safe));
  *out = value;
  return 0;
}
