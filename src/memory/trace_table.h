// Live allocations by number, for the trace adaptor (which numbers what it hands out) and
// trace replay (which numbers what the file names). Not installed.
#ifndef DEVBUF_TRACE_TABLE_H
#define DEVBUF_TRACE_TABLE_H

#include "memory.h"

// At most this many live at once: memory follows what a trace holds, not the ids it names.
#define DEVBUF__TRACE_MAX_LIVE ((size_t)1 << 26)

typedef struct devbuf__trace_entry {
  uint64_t id; // 0: an empty slot
  devbuf_memory_t memory;
  size_t size; // bytes asked for
  bool failed; // replay: the target refused it, so its free is skipped
} devbuf__trace_entry;

// Open addressing with linear probing, at most half full; removal shifts later entries of
// the same run back, so lookups never need tombstones. Zero-initialised is empty.
typedef struct devbuf__trace_table {
  devbuf__trace_entry *entries;
  size_t capacity, count; // capacity: a power of two (0 before the first insert)
} devbuf__trace_table;

// The entry of `id`, or NULL (always for id 0).
devbuf__trace_entry *devbuf__trace_table_find(const devbuf__trace_table *table, uint64_t id);
// Adds `entry` (its id nonzero and not in the table) and points *out_slot at its copy, valid
// until the next insert or remove. OUT_OF_MEMORY or UNSUPPORTED (too many live) with a
// message that starts with `who`, the table unchanged.
devbuf_status devbuf__trace_table_insert(devbuf__trace_table *table,
                                         const devbuf__trace_entry *entry, const char *who,
                                         devbuf__trace_entry **out_slot);
void devbuf__trace_table_remove(devbuf__trace_table *table, devbuf__trace_entry *slot);
void devbuf__trace_table_free(devbuf__trace_table *table);

#endif
