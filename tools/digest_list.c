// The digest lists of digest_list.h.
#include "digest_list.h"
#include "printable.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_hex_digest(const char *line) {
  for (int i = 0; i < 64; i++)
    if (!((line[i] >= '0' && line[i] <= '9') || (line[i] >= 'a' && line[i] <= 'f'))) return false;
  return line[64] == ' ' && line[65] == ' ';
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const devbuf_digest_entry *)a)->name, ((const devbuf_digest_entry *)b)->name);
}

bool devbuf_digest_list_read(const char *path, devbuf_digest_list *out, char *why,
                             size_t why_capacity) {
  *out = (devbuf_digest_list){NULL, 0};
  FILE *file = devbuf_tool_open_regular(path, why, why_capacity);
  if (!file) return false;
  size_t capacity = 0;
  char *line = NULL;
  size_t line_capacity = 0;
  ssize_t length;
  bool ok = true;
  while ((length = getline(&line, &line_capacity, file)) >= 0) {
    while (length > 0 && (line[length - 1] == '\n' || line[length - 1] == '\r'))
      line[--length] = '\0';
    const char *at = line;
    while (*at == ' ') at++;                             // the tool indents its own lines
    if (strlen(at) < 66 || !is_hex_digest(at)) continue; // the name may be empty
    if (out->count == capacity) {
      capacity = capacity ? 2 * capacity : 64;
      devbuf_digest_entry *grown = realloc(out->entries, capacity * sizeof *grown);
      if (!grown) {
        ok = false;
        snprintf(why, why_capacity, "out of memory");
        break;
      }
      out->entries = grown;
    }
    devbuf_digest_entry *entry = &out->entries[out->count];
    memcpy(entry->hex, at, 64);
    entry->hex[64] = '\0';
    entry->name = devbuf_tool_unescape(at + 66); // matched as the raw bytes it stands for
    entry->seen = false;
    if (!entry->name) {
      ok = false;
      snprintf(why, why_capacity, "out of memory");
      break;
    }
    out->count++;
  }
  free(line);
  fclose(file);
  if (!ok) devbuf_digest_list_free(out);
  if (ok && out->count) qsort(out->entries, out->count, sizeof *out->entries, by_name); // for find
  size_t kept = out->count ? 1 : 0;
  for (size_t i = 1; ok && i < out->count; i++) { // one name, two digests: which one holds?
    devbuf_digest_entry *last = &out->entries[kept - 1];
    if (strcmp(out->entries[i].name, last->name) != 0) {
      out->entries[kept++] = out->entries[i];
      continue;
    }
    if (strcmp(out->entries[i].hex, last->hex) == 0) { // the same line again: one entry
      free(out->entries[i].name);
      continue;
    }
    char name[200];
    snprintf(why, why_capacity, "tensor '%s' has two different digests",
             DEVBUF_PRINTABLE(out->entries[i].name, name));
    for (size_t j = i; j < out->count; j++) free(out->entries[j].name); // not kept yet
    out->count = kept;
    devbuf_digest_list_free(out);
    ok = false;
  }
  if (ok) out->count = kept;
  return ok;
}

devbuf_digest_entry *devbuf_digest_list_find(devbuf_digest_list *list, const char *name) {
  devbuf_digest_entry key = {.name = (char *)name};
  return list->count ? bsearch(&key, list->entries, list->count, sizeof key, by_name) : NULL;
}

void devbuf_digest_list_free(devbuf_digest_list *list) {
  for (size_t i = 0; i < list->count; i++) free(list->entries[i].name);
  free(list->entries);
  *list = (devbuf_digest_list){NULL, 0};
}
