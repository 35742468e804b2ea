// The JSON reader of json_reader.h.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE // O_CLOEXEC where built alone with -std=c11 (tests/data/embed/README.md)
#endif
#include "json_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 64

int embed_read_file(const char *path, bool missing_ok, char **out, size_t *out_len, char *err,
                    size_t err_size) {
  // Without O_NONBLOCK, opening a FIFO would wait for a writer that may never come.
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (missing_ok && errno == ENOENT) return 1;
    snprintf(err, err_size, "%s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, err_size, "%s: not a regular file", path);
    close(fd);
    return -1;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap + 1);
  const char *bad = NULL;
  while (buf && !bad) {
    ssize_t got = read(fd, buf + len, cap - len);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) bad = strerror(errno);
    if (got <= 0) break;
    len += (size_t)got;
    if (len < cap) continue;
    char *bigger = cap > SIZE_MAX / 4 ? NULL : realloc(buf, 2 * cap + 1);
    if (!bigger) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = bigger, cap *= 2;
  }
  close(fd);
  if (!buf || bad) {
    free(buf);
    snprintf(err, err_size, "%s: %s", path, buf ? bad : "out of memory");
    return -1;
  }
  buf[len] = '\0';
  *out = buf, *out_len = len;
  return 0;
}

typedef struct walker {
  const char *p, *end;
  char path[192];
  size_t path_len;
  char text[1024]; // the last string value, unescaped
  json_visit_fn visit;
  void *context;
  const char *msg; // the first error
} walker;

static int fail(walker *w, const char *msg) {
  if (!w->msg) w->msg = msg;
  return -1;
}

static int visit(walker *w, json_item *item) {
  item->path = w->path;
  const char *refused = w->visit(w->context, item);
  return refused ? fail(w, refused) : 0;
}

static void ws(walker *w) {
  while (w->p < w->end && (*w->p == ' ' || *w->p == '\t' || *w->p == '\n' || *w->p == '\r')) w->p++;
}

static int hex4(walker *w, int32_t *c) {
  if (w->end - w->p < 4) return fail(w, "short \\u escape");
  *c = 0;
  for (int i = 0; i < 4; i++) {
    char h = *w->p++;
    int d = h >= '0' && h <= '9'   ? h - '0'
            : h >= 'a' && h <= 'f' ? h - 'a' + 10
            : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                   : -1;
    if (d < 0) return fail(w, "bad \\u escape");
    *c = *c * 16 + d;
  }
  return 0;
}

static size_t utf8_encode(int32_t c, unsigned char *b) {
  if (c < 0x80) return b[0] = (unsigned char)c, 1;
  if (c < 0x800)
    return b[0] = (unsigned char)(0xC0 | c >> 6), b[1] = (unsigned char)(0x80 | (c & 0x3F)), 2;
  if (c < 0x10000) {
    b[0] = (unsigned char)(0xE0 | c >> 12), b[1] = (unsigned char)(0x80 | (c >> 6 & 0x3F));
    b[2] = (unsigned char)(0x80 | (c & 0x3F));
    return 3;
  }
  b[0] = (unsigned char)(0xF0 | c >> 18), b[1] = (unsigned char)(0x80 | (c >> 12 & 0x3F));
  b[2] = (unsigned char)(0x80 | (c >> 6 & 0x3F)), b[3] = (unsigned char)(0x80 | (c & 0x3F));
  return 4;
}

// The string at w->p (on its quote), unescaped into out and NUL-terminated; what does not
// fit in cap is dropped and *cut set.
static int string(walker *w, char *out, size_t cap, bool *cut) {
  size_t n = 0;
  *cut = false;
  w->p++;
  while (w->p < w->end && *w->p != '"') {
    unsigned char ch = (unsigned char)*w->p++;
    int32_t c = ch;
    if (ch < 0x20) return fail(w, "control character in a string");
    if (ch == '\\') {
      if (w->p >= w->end) break;
      switch (*w->p++) {
      case '"':
        c = '"';
        break;
      case '\\':
        c = '\\';
        break;
      case '/':
        c = '/';
        break;
      case 'b':
        c = '\b';
        break;
      case 'f':
        c = '\f';
        break;
      case 'n':
        c = '\n';
        break;
      case 'r':
        c = '\r';
        break;
      case 't':
        c = '\t';
        break;
      case 'u':
        if (hex4(w, &c)) return -1;
        if (c >= 0xDC00 && c <= 0xDFFF) return fail(w, "lone surrogate escape");
        if (c >= 0xD800 && c <= 0xDBFF) {
          int32_t lo;
          if (w->end - w->p < 2 || w->p[0] != '\\' || w->p[1] != 'u')
            return fail(w, "lone surrogate escape");
          w->p += 2;
          if (hex4(w, &lo)) return -1;
          if (lo < 0xDC00 || lo > 0xDFFF) return fail(w, "lone surrogate escape");
          c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
        }
        break;
      default:
        return fail(w, "bad escape");
      }
      unsigned char b[4];
      size_t k = utf8_encode(c, b);
      if (n + k < cap)
        memcpy(out + n, b, k), n += k;
      else
        *cut = true;
    } else if (n + 1 < cap) {
      out[n++] = (char)ch;
    } else {
      *cut = true;
    }
  }
  if (w->p >= w->end) return fail(w, "unterminated string");
  w->p++;
  out[n] = '\0';
  return 0;
}

static int value(walker *w, const char *key, bool key_cut, int depth);

static void path_add(walker *w, const char *sep, const char *part) {
  size_t n = w->path_len;
  int k = snprintf(w->path + n, sizeof w->path - n, "%s%s", n ? sep : "", part);
  n += k > 0 ? (size_t)k : 0;
  w->path_len = n < sizeof w->path ? n : sizeof w->path - 1;
}

static int container(walker *w, const char *key, int depth) {
  bool obj = *w->p == '{';
  char close = obj ? '}' : ']';
  size_t saved = w->path_len;
  if (depth > MAX_DEPTH) return fail(w, "nested too deeply");
  if (key) path_add(w, ".", key);
  if (!obj) path_add(w, "", "[]");
  w->p++;
  ws(w);
  if (w->p < w->end && *w->p == close)
    w->p++;
  else
    for (;;) {
      char k[256];
      bool cut = false;
      if (obj) {
        if (w->p >= w->end || *w->p != '"') return fail(w, "expected a key");
        if (string(w, k, sizeof k, &cut)) return -1;
        ws(w);
        if (w->p >= w->end || *w->p++ != ':') return fail(w, "expected ':'");
        ws(w);
      }
      if (value(w, obj ? k : NULL, cut, depth + 1)) return -1;
      ws(w);
      if (w->p < w->end && *w->p == ',') {
        w->p++;
        ws(w);
        continue;
      }
      if (w->p < w->end && *w->p == close) {
        w->p++;
        break;
      }
      return fail(w, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  if (obj && visit(w, &(json_item){.key = "", .type = JSON_OBJECT_END, .text = ""})) return -1;
  w->path_len = saved;
  w->path[saved] = '\0';
  return 0;
}

static int value(walker *w, const char *key, bool key_cut, int depth) {
  if (w->p >= w->end) return fail(w, "unexpected end");
  char ch = *w->p;
  if (ch == '{' || ch == '[') return container(w, key, depth);
  json_item item = {.key = key ? key : "", .key_cut = key_cut, .text = "", .whole = -1};
  if (ch == '"') {
    if (string(w, w->text, sizeof w->text, &item.text_cut)) return -1;
    item.type = JSON_STRING;
    item.text = w->text;
    return visit(w, &item);
  }
  static const struct {
    const char *word;
    json_type type;
  } words[] = {{"true", JSON_TRUE}, {"false", JSON_FALSE}, {"null", JSON_NULL}};
  for (size_t i = 0; i < 3; i++) {
    size_t n = strlen(words[i].word);
    if ((size_t)(w->end - w->p) >= n && memcmp(w->p, words[i].word, n) == 0) {
      w->p += n;
      item.type = words[i].type;
      return visit(w, &item);
    }
  }
  const char *q = w->p + (*w->p == '-');
  if (q >= w->end || *q < '0' || *q > '9') return fail(w, "unexpected character");
  long long whole = 0;
  for (; q < w->end && *q >= '0' && *q <= '9'; q++)
    whole = whole < 100000000000LL ? whole * 10 + (*q - '0') : whole;
  bool fraction = false;
  for (; q < w->end && *q && strchr(".eE+-0123456789", *q); q++) fraction = true;
  char number[64];
  size_t length = (size_t)(q - w->p) < sizeof number - 1 ? (size_t)(q - w->p) : sizeof number - 1;
  memcpy(number, w->p, length);
  number[length] = '\0';
  item.type = JSON_NUMBER;
  item.number = strtod(number, NULL);
  item.whole = fraction ? -1 : *w->p == '-' ? -whole : whole;
  w->p = q;
  return visit(w, &item);
}

int json_walk(const char *text, size_t len, const char *name, json_visit_fn visit_fn, void *context,
              char *err, size_t err_size) {
  walker *w = malloc(sizeof *w);
  if (!w) {
    snprintf(err, err_size, "%s: out of memory", name);
    return -1;
  }
  *w = (walker){.p = text, .end = text + len, .visit = visit_fn, .context = context};
  ws(w);
  if (value(w, NULL, false, 0) == 0) {
    ws(w);
    if (w->p != w->end) fail(w, "text after the document");
  }
  int rc = 0;
  if (w->msg) {
    size_t line = 1;
    for (const char *q = text; q < w->p && q < w->end; q++) line += *q == '\n';
    snprintf(err, err_size, "%s: line %zu: %s", name, line, w->msg);
    rc = -1;
  }
  free(w);
  return rc;
}
