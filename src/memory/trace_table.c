// The live-allocation table of trace_table.h.
#include "trace_table.h"

static size_t slot_of(const devbuf__trace_table *table, uint64_t id) {
  return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17) & (table->capacity - 1);
}

devbuf__trace_entry *devbuf__trace_table_find(const devbuf__trace_table *table, uint64_t id) {
  if (!table->capacity || id == 0) return NULL; // 0 marks an empty slot: no allocation has it
  for (size_t i = slot_of(table, id);; i = (i + 1) & (table->capacity - 1)) {
    if (table->entries[i].id == id) return &table->entries[i];
    if (table->entries[i].id == 0) return NULL;
  }
}

static devbuf_status grow(devbuf__trace_table *table, const char *who) {
  if (table->count >= DEVBUF__TRACE_MAX_LIVE)
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s: more than %zu allocations live at once", who,
                         DEVBUF__TRACE_MAX_LIVE);
  size_t capacity = table->capacity ? 2 * table->capacity : 1024;
  devbuf__trace_entry *entries = devbuf__calloc(capacity, sizeof *entries);
  if (!entries)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "%s: no host memory for %zu live allocations", who,
                         capacity);
  devbuf__trace_table grown = {entries, capacity, 0};
  for (size_t i = 0; i < table->capacity; i++) {
    if (!table->entries[i].id) continue;
    size_t j = slot_of(&grown, table->entries[i].id);
    while (entries[j].id) j = (j + 1) & (capacity - 1);
    entries[j] = table->entries[i];
    grown.count++;
  }
  devbuf__free(table->entries);
  *table = grown;
  return DEVBUF_OK;
}

devbuf_status devbuf__trace_table_insert(devbuf__trace_table *table,
                                         const devbuf__trace_entry *entry, const char *who,
                                         devbuf__trace_entry **out_slot) {
  if (2 * (table->count + 1) > table->capacity) {
    devbuf_status status = grow(table, who);
    if (status != DEVBUF_OK) return status;
  }
  size_t i = slot_of(table, entry->id);
  while (table->entries[i].id) i = (i + 1) & (table->capacity - 1);
  table->entries[i] = *entry;
  table->count++;
  *out_slot = &table->entries[i];
  return DEVBUF_OK;
}

void devbuf__trace_table_remove(devbuf__trace_table *table, devbuf__trace_entry *slot) {
  size_t mask = table->capacity - 1, hole = (size_t)(slot - table->entries);
  table->entries[hole].id = 0;
  for (size_t i = (hole + 1) & mask; table->entries[i].id; i = (i + 1) & mask) {
    size_t home = slot_of(table, table->entries[i].id);
    // The entry may fill the hole if its home is not inside (hole, i] (cyclically).
    if (((i - home) & mask) >= ((i - hole) & mask)) {
      table->entries[hole] = table->entries[i];
      table->entries[i].id = 0;
      hole = i;
    }
  }
  table->count--;
}

void devbuf__trace_table_free(devbuf__trace_table *table) {
  devbuf__free(table->entries);
  *table = (devbuf__trace_table){0};
}
