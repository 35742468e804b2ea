// The strict JSON reader of json.h.
#include "json.h"

#include <stdio.h>
#include <string.h>

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void skip_blanks(devbuf__json *json) {
  while (json->pos < json->size && is_blank(json->text[json->pos])) json->pos++;
}

int devbuf__json_peek(devbuf__json *json) {
  skip_blanks(json);
  return json->pos < json->size ? (unsigned char)json->text[json->pos] : -1;
}

// What stands at the current position, for messages: "'x'", "byte 0x1f" or "the end".
static const char *found(devbuf__json *json, char *out, size_t capacity) {
  int c = devbuf__json_peek(json);
  if (c < 0)
    snprintf(out, capacity, "the end of the header");
  else if (c >= 0x20 && c < 0x7f)
    snprintf(out, capacity, "'%c'", c);
  else
    snprintf(out, capacity, "byte 0x%02x", (unsigned)c);
  return out;
}

devbuf_status devbuf__json_expect(devbuf__json *json, char c, const char *context) {
  if (devbuf__json_peek(json) == (unsigned char)c) {
    json->pos++;
    return DEVBUF_OK;
  }
  char seen[32];
  return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: %s: expected '%c' at byte %zu, found %s",
                       json->what, context, c, json->pos, found(json, seen, sizeof seen));
}

devbuf_status devbuf__json_next(devbuf__json *json, char close, size_t index, bool *out_more,
                                const char *context) {
  int c = devbuf__json_peek(json);
  if (c == (unsigned char)close) {
    json->pos++;
    *out_more = false;
    return DEVBUF_OK;
  }
  *out_more = true;
  if (index == 0) return DEVBUF_OK;
  if (c == ',') {
    json->pos++;
    if (devbuf__json_peek(json) == (unsigned char)close) // JSON has no trailing commas
      return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: %s: trailing ',' before '%c' at byte %zu",
                           json->what, context, close, json->pos);
    return DEVBUF_OK;
  }
  char seen[32];
  return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: %s: expected ',' or '%c' at byte %zu, found %s",
                       json->what, context, close, json->pos, found(json, seen, sizeof seen));
}

// Length of the UTF-8 sequence at `s` (at most `left` bytes), 0 if it is malformed.
static size_t utf8_sequence(const unsigned char *s, size_t left) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t length;
  uint32_t lowest;
  uint32_t code;
  if (c >= 0xc2 && c <= 0xdf) {
    length = 2, lowest = 0x80, code = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    length = 3, lowest = 0x800, code = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    length = 4, lowest = 0x10000, code = c & 0x07;
  } else {
    return 0;
  }
  if (left < length) return 0;
  for (size_t i = 1; i < length; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    code = code << 6 | (s[i] & 0x3f);
  }
  if (code < lowest || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
  return length;
}

bool devbuf__utf8_valid(const char *bytes, size_t size) {
  const unsigned char *s = (const unsigned char *)bytes;
  for (size_t i = 0; i < size;) {
    size_t length = utf8_sequence(s + i, size - i);
    if (!length) return false;
    i += length;
  }
  return true;
}

static size_t utf8_encode(uint32_t code, char *out) {
  if (code < 0x80) {
    out[0] = (char)code;
    return 1;
  }
  if (code < 0x800) {
    out[0] = (char)(0xc0 | code >> 6);
    out[1] = (char)(0x80 | (code & 0x3f));
    return 2;
  }
  if (code < 0x10000) {
    out[0] = (char)(0xe0 | code >> 12);
    out[1] = (char)(0x80 | (code >> 6 & 0x3f));
    out[2] = (char)(0x80 | (code & 0x3f));
    return 3;
  }
  out[0] = (char)(0xf0 | code >> 18);
  out[1] = (char)(0x80 | (code >> 12 & 0x3f));
  out[2] = (char)(0x80 | (code >> 6 & 0x3f));
  out[3] = (char)(0x80 | (code & 0x3f));
  return 4;
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Four hex digits at `pos`; -1 if they are not there.
static long hex4(const devbuf__json *json, size_t pos) {
  if (json->size - pos < 4) return -1;
  long value = 0;
  for (size_t i = 0; i < 4; i++) {
    int digit = hex_value(json->text[pos + i]);
    if (digit < 0) return -1;
    value = value << 4 | digit;
  }
  return value;
}

devbuf_status devbuf__json_string(devbuf__json *json, char **out_string, const char *context) {
  *out_string = NULL;
  devbuf_status status = devbuf__json_expect(json, '"', context);
  if (status != DEVBUF_OK) return status;
  size_t start = json->pos;
  size_t end = start; // the closing quote; escapes only ever shrink the text
  while (end < json->size && json->text[end] != '"') end += json->text[end] == '\\' ? 2 : 1;
  if (end >= json->size)
    return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: %s: string from byte %zu is not terminated",
                         json->what, context, start - 1);
  char *out = devbuf__malloc(end - start + 1);
  if (!out)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "%s: no memory for a %zu-byte string", json->what,
                         end - start);
  size_t length = 0;
  const unsigned char *s = (const unsigned char *)json->text;
  size_t pos = start;
  const char *problem = NULL;
  while (pos < end) {
    unsigned char c = s[pos];
    if (c < 0x20) {
      problem = "a raw control character";
      break;
    }
    if (c != '\\') {
      size_t n = utf8_sequence(s + pos, end - pos);
      if (!n) {
        problem = "invalid UTF-8";
        break;
      }
      memcpy(out + length, s + pos, n);
      length += n, pos += n;
      continue;
    }
    char e = (char)s[pos + 1];
    pos += 2;
    static const char simple_in[] = "\"\\/bfnrt", simple_out[] = "\"\\/\b\f\n\r\t";
    const char *simple = strchr(simple_in, e);
    if (e && simple) {
      out[length++] = simple_out[simple - simple_in];
      continue;
    }
    if (e != 'u') {
      problem = "an unknown escape";
      pos -= 2;
      break;
    }
    long unit = hex4(json, pos);
    if (unit < 0 || pos + 4 > end) {
      problem = "a malformed \\u escape";
      pos -= 2;
      break;
    }
    pos += 4;
    uint32_t code = (uint32_t)unit;
    if (code >= 0xdc00 && code <= 0xdfff) {
      problem = "a lone low surrogate";
      pos -= 6;
      break;
    }
    if (code >= 0xd800 && code <= 0xdbff) {
      long low = pos + 6 <= end && s[pos] == '\\' && s[pos + 1] == 'u' ? hex4(json, pos + 2) : -1;
      if (low < 0xdc00 || low > 0xdfff) {
        problem = "a lone high surrogate";
        pos -= 6;
        break;
      }
      code = 0x10000 + ((code - 0xd800) << 10) + ((uint32_t)low - 0xdc00);
      pos += 6;
    }
    if (code == 0) {
      problem = "U+0000";
      pos -= 6;
      break;
    }
    length += utf8_encode(code, out + length);
  }
  if (problem) {
    devbuf__free(out);
    return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: %s: string has %s at byte %zu", json->what,
                         context, problem, pos);
  }
  out[length] = '\0';
  json->pos = end + 1;
  *out_string = out;
  return DEVBUF_OK;
}

devbuf_status devbuf__json_u64(devbuf__json *json, uint64_t *out_value, const char *context) {
  int c = devbuf__json_peek(json);
  size_t start = json->pos;
  if (c < '0' || c > '9') {
    char seen[32];
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "%s: %s: expected a non-negative integer at byte %zu, found %s",
                         json->what, context, start, found(json, seen, sizeof seen));
  }
  uint64_t value = 0;
  bool overflow = false;
  size_t pos = start;
  while (pos < json->size && json->text[pos] >= '0' && json->text[pos] <= '9') {
    unsigned digit = (unsigned)(json->text[pos] - '0');
    if (__builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, digit, &value))
      overflow = true;
    pos++;
  }
  int digits = (int)(pos - start);
  if (pos < json->size &&
      (json->text[pos] == '.' || json->text[pos] == 'e' || json->text[pos] == 'E'))
    return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: %s: number at byte %zu is not an integer",
                         json->what, context, start);
  if (digits > 1 && json->text[start] == '0')
    return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: %s: number at byte %zu has a leading zero",
                         json->what, context, start);
  if (overflow)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "%s: %s: number %.*s%s at byte %zu is larger than %llu", json->what,
                         context, digits > 40 ? 40 : digits, json->text + start,
                         digits > 40 ? "..." : "", start, (unsigned long long)UINT64_MAX);
  json->pos = pos;
  *out_value = value;
  return DEVBUF_OK;
}

devbuf_status devbuf__json_end(devbuf__json *json) {
  if (devbuf__json_peek(json) < 0) return DEVBUF_OK;
  char seen[32];
  return devbuf__error(DEVBUF_FORMAT_ERROR,
                       "%s: unexpected %s at byte %zu after the end of the object", json->what,
                       found(json, seen, sizeof seen), json->pos);
}
