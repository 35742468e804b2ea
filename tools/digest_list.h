// Lists of tensor digests as `devbuf load --verify` prints them and `--expect` reads them:
// one line per tensor, "<64 hex digits of SHA-256>  <name, escaped as the tool prints it>",
// which is sha256sum's layout. Lines of any other shape are skipped, so the whole saved
// output of an earlier `devbuf load --verify` is a valid list.
#ifndef DEVBUF_TOOL_DIGEST_LIST_H
#define DEVBUF_TOOL_DIGEST_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct devbuf_digest_entry {
  char hex[65];
  char *name; // the raw name (the list holds its escaped form)
  bool seen;  // matched by a tensor of the loaded file
} devbuf_digest_entry;

typedef struct devbuf_digest_list {
  devbuf_digest_entry *entries;
  size_t count;
} devbuf_digest_list;

// Reads the list at `path`; false with the reason in `why` if it cannot be read (errno's
// reason) or names one tensor with two different digests. A list of no line is read.
bool devbuf_digest_list_read(const char *path, devbuf_digest_list *out, char *why,
                             size_t why_capacity);
// The entry named `name` (raw bytes), or NULL.
devbuf_digest_entry *devbuf_digest_list_find(devbuf_digest_list *list, const char *name);
void devbuf_digest_list_free(devbuf_digest_list *list);

#endif
