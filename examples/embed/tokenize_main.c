// embed-tokenize MODEL_DIR FILE: prints the token ids of each line of FILE, space-separated,
// one output line per input line, as the embed example feeds them to the model (at most 256
// ids). Lines are split on '\n' only, and nothing else is stripped, so a line is exactly what
// Python's data.split(b'\n') gives; a final '\n' ends the last line rather than starting an
// empty one. tests/embed/check_tokens.py compares the output with Hugging Face tokenizers.
// MIT licence, part of devbuf.
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_LEN = 256 }; // all-MiniLM-L6-v2's max_seq_length

static char *read_all(FILE *f, size_t *out_len) {
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    len += fread(buf + len, 1, cap - len, f);
    if (len < cap) break;
    char *bigger = realloc(buf, 2 * cap);
    if (!bigger) {
      free(buf);
      return NULL;
    }
    buf = bigger, cap *= 2;
  }
  if (buf && ferror(f)) {
    free(buf);
    return NULL;
  }
  *out_len = len;
  return buf;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL_DIR FILE\n", argv[0]);
    return 2;
  }
  char err[512];
  embed_tokenizer_t *tok;
  if (embed_tokenizer_load(argv[1], &tok, err, sizeof err)) {
    fprintf(stderr, "embed-tokenize: %s\n", err);
    return 1;
  }
  FILE *f = strcmp(argv[2], "-") == 0 ? stdin : fopen(argv[2], "rb");
  size_t len = 0;
  char *text = f ? read_all(f, &len) : NULL;
  if (f && f != stdin) fclose(f);
  if (!text) {
    fprintf(stderr, "embed-tokenize: %s: cannot read\n", argv[2]);
    embed_tokenizer_free(tok);
    return 1;
  }
  int rc = 0;
  int32_t ids[MAX_LEN];
  for (size_t start = 0; start < len;) {
    const char *nl = memchr(text + start, '\n', len - start);
    size_t end = nl ? (size_t)(nl - text) : len, n;
    if (embed_tokenizer_encode(tok, text + start, end - start, ids, MAX_LEN, &n, err, sizeof err)) {
      fprintf(stderr, "embed-tokenize: %s\n", err);
      rc = 1;
      break;
    }
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
    putchar('\n');
    start = end + 1;
  }
  if (fflush(stdout) != 0) rc = 1;
  free(text);
  embed_tokenizer_free(tok);
  return rc;
}
