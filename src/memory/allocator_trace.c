// The trace adaptor and trace replay. A trace is a text file, one record a line:
//   # devbuf trace 1          header
//   a <id> <size>             allocation number <id> (from 1) of <size> bytes
//   f <id>                    that allocation was freed
// Replaying it against another allocator reproduces the workload's allocation pattern.
#include "memory.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TRACE_HEADER    "# devbuf trace 1"
#define TRACE_LINE_MOST 255                 // characters of a line, its end aside
#define TRACE_LARGEST   ((uint64_t)1 << 47) // bytes of one allocation: the x86-64 user space

typedef struct trace_adaptor {
  devbuf__adaptor adaptor;
  pthread_mutex_t lock; // orders lines in the file
  FILE *file;
  uint64_t next_id; // under the lock
} trace_adaptor;

typedef struct trace_record {
  devbuf_memory_t upstream;
  uint64_t id;
} trace_record;

// An allocation, ordered after work where `visit` is set (memory released in flight).
static devbuf_status trace_alloc_with(devbuf_allocator_t *base, size_t size,
                                      devbuf__in_flight_visit visit, void *context,
                                      devbuf_memory_t *out) {
  trace_adaptor *self = (trace_adaptor *)base;
  trace_record *record = devbuf__malloc(sizeof *record);
  if (!record) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "trace: no host memory for a record");
  devbuf_status status =
      visit ? devbuf__allocator_alloc_ordered(self->adaptor.upstream, size, visit, context,
                                              &record->upstream)
            : devbuf_allocator_alloc(self->adaptor.upstream, size, &record->upstream);
  if (status != DEVBUF_OK) {
    devbuf__free(record);
    return status;
  }
  pthread_mutex_lock(&self->lock);
  record->id = self->next_id++;
  fprintf(self->file, "a %" PRIu64 " %zu\n", record->id, size);
  pthread_mutex_unlock(&self->lock);
  *out = record->upstream;
  out->token = record;
  return DEVBUF_OK;
}

static devbuf_status trace_alloc(devbuf_allocator_t *base, size_t size, devbuf_memory_t *out) {
  return trace_alloc_with(base, size, NULL, NULL, out);
}

static devbuf_status trace_alloc_ordered(devbuf_allocator_t *base, size_t size,
                                         devbuf__in_flight_visit visit, void *context,
                                         devbuf_memory_t *out) {
  return trace_alloc_with(base, size, visit, context, out);
}

static void trace_line_free(trace_adaptor *self, const trace_record *record) {
  pthread_mutex_lock(&self->lock);
  fprintf(self->file, "f %" PRIu64 "\n", record->id);
  pthread_mutex_unlock(&self->lock);
}

// The line goes first: the upstream may hand the memory out again at once.
static void trace_free(devbuf_allocator_t *base, const devbuf_memory_t *memory) {
  trace_adaptor *self = (trace_adaptor *)base;
  trace_record *record = memory->token;
  trace_line_free(self, record);
  devbuf_allocator_free(self->adaptor.upstream, &record->upstream);
  devbuf__free(record);
}

// Released while work uses it: freed, for the trace, once the upstream took it back (an
// ordered allocation may take it in between: its line then comes first).
static devbuf_status trace_free_in_flight(devbuf_allocator_t *base, const devbuf_memory_t *memory,
                                          void *fence, devbuf__in_flight **out_range) {
  trace_adaptor *self = (trace_adaptor *)base;
  trace_record *record = memory->token;
  devbuf_status status =
      devbuf__allocator_free_in_flight(self->adaptor.upstream, &record->upstream, fence, out_range);
  if (status != DEVBUF_OK) return status; // the caller keeps the memory: no free yet
  trace_line_free(self, record);
  devbuf__free(record);
  return DEVBUF_OK;
}

static void trace_destroy(devbuf_allocator_t *base) {
  trace_adaptor *self = (trace_adaptor *)base;
  fclose(self->file);
  pthread_mutex_destroy(&self->lock);
  devbuf_allocator_release(self->adaptor.upstream);
  devbuf__free(self);
}

static const devbuf__allocator_ops trace_ops = {
    .kind = "trace",
    .alloc = trace_alloc,
    .free = trace_free,
    .destroy = trace_destroy,
    .free_in_flight = trace_free_in_flight,
    .alloc_ordered = trace_alloc_ordered,
};

devbuf_status devbuf_trace_adaptor_create(devbuf_allocator_t *upstream, const char *path,
                                          devbuf_allocator_t **out_allocator) {
  if (!upstream || !path || !out_allocator)
    return devbuf__null_argument("trace adaptor", "upstream, path, out_allocator",
                                 (const void *[]){upstream, path, out_allocator});
  FILE *file = fopen(path, "w");
  if (!file)
    return devbuf__error(DEVBUF_IO_ERROR, "trace: cannot create '%.200s': %s", path,
                         strerror(errno));
  trace_adaptor *self = devbuf__calloc(1, sizeof *self);
  if (!self) {
    fclose(file);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a trace adaptor");
  }
  fprintf(file, "%s\n", TRACE_HEADER);
  devbuf__adaptor_ops(&trace_ops, upstream, &self->adaptor.ops);
  devbuf__allocator_init(&self->adaptor.base, &self->adaptor.ops, upstream->device,
                         DEVBUF__HOLDS_DEVICE);
  self->adaptor.base.memory_kind = upstream->memory_kind;
  self->adaptor.upstream = devbuf_allocator_retain(upstream);
  devbuf__mutex_init(&self->lock);
  self->file = file;
  self->next_id = 1;
  *out_allocator = &self->adaptor.base;
  return DEVBUF_OK;
}

// ---- replay ---------------------------------------------------------------------------

// Allocations the trace holds live at once (and refused ones whose free has not come): the
// replay's memory grows with these, not with the ids or the sizes the file names.
#define REPLAY_MAX_LIVE ((size_t)1 << 26)

typedef struct replay_entry {
  uint64_t id; // 0: empty
  devbuf_memory_t memory;
  size_t size; // bytes the trace asked for
  bool failed; // the target refused it, so its free is skipped
} replay_entry;

// Open addressing with linear probing, at most half full; removal shifts later entries of
// the same run back, so lookups never need tombstones.
typedef struct replay_table {
  replay_entry *entries;
  size_t capacity, count; // capacity: a power of two (0 before the first insert)
  uint64_t next_id;       // ids come as 1, 2, 3, ...: the id the next "a" line must have
  uint64_t live_bytes;
  devbuf_trace_observer_fn observer; // told of every record once it is played (may be NULL)
  void *observer_context;
} replay_table;

static size_t slot_of(const replay_table *table, uint64_t id) {
  return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17) & (table->capacity - 1);
}

static replay_entry *table_find(const replay_table *table, uint64_t id) {
  if (!table->capacity || id == 0) return NULL; // 0 marks an empty slot: no allocation has it
  for (size_t i = slot_of(table, id);; i = (i + 1) & (table->capacity - 1)) {
    if (table->entries[i].id == id) return &table->entries[i];
    if (table->entries[i].id == 0) return NULL;
  }
}

static devbuf_status table_grow(replay_table *table, unsigned long line) {
  if (table->count >= REPLAY_MAX_LIVE)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "trace line %lu: more than %zu allocations live at once", line,
                         REPLAY_MAX_LIVE);
  size_t capacity = table->capacity ? 2 * table->capacity : 1024;
  replay_entry *entries = devbuf__calloc(capacity, sizeof *entries);
  if (!entries)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "trace replay: no host memory for %zu entries",
                         capacity);
  replay_table grown = {entries,
                        capacity,
                        0,
                        table->next_id,
                        table->live_bytes,
                        table->observer,
                        table->observer_context};
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

static devbuf_status table_insert(replay_table *table, const replay_entry *entry,
                                  unsigned long line) {
  if (2 * (table->count + 1) > table->capacity) {
    devbuf_status status = table_grow(table, line);
    if (status != DEVBUF_OK) return status;
  }
  size_t i = slot_of(table, entry->id);
  while (table->entries[i].id) i = (i + 1) & (table->capacity - 1);
  table->entries[i] = *entry;
  table->count++;
  return DEVBUF_OK;
}

static void table_remove(replay_table *table, replay_entry *entry) {
  size_t mask = table->capacity - 1, hole = (size_t)(entry - table->entries);
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

static devbuf_status replay_alloc(uint64_t id, size_t size, unsigned long line, replay_table *table,
                                  devbuf_allocator_t *allocator, devbuf_trace_summary_t *summary) {
  if (id != table->next_id || size == 0)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "trace line %lu: allocation %" PRIu64 " of %zu bytes (the next "
                         "allocation is number %" PRIu64 ", of at least 1 byte)",
                         line, id, size, table->next_id);
  replay_entry entry = {.id = id, .size = size};
  devbuf_status status = table_insert(table, &entry, line);
  if (status != DEVBUF_OK) return status;
  table->next_id++;
  summary->allocs++;
  replay_entry *slot = table_find(table, id);
  if (devbuf_allocator_alloc(allocator, size, &slot->memory) != DEVBUF_OK) {
    summary->failed_allocs++;
    slot->failed = true;
  } else {
    table->live_bytes += size;
    if (table->live_bytes > summary->peak_live_bytes) summary->peak_live_bytes = table->live_bytes;
  }
  if (table->observer) table->observer(table->observer_context, id, size, slot->failed);
  return DEVBUF_OK;
}

static devbuf_status replay_free(uint64_t id, unsigned long line, replay_table *table,
                                 devbuf_allocator_t *allocator, devbuf_trace_summary_t *summary) {
  replay_entry *slot = table_find(table, id);
  if (!slot)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "trace line %lu: free of allocation %" PRIu64 " that is not live", line,
                         id);
  bool refused = slot->failed;
  if (!refused) {
    devbuf_allocator_free(allocator, &slot->memory);
    table->live_bytes -= slot->size;
  }
  table_remove(table, slot);
  if (table->observer) table->observer(table->observer_context, id, 0, refused);
  summary->frees++;
  return DEVBUF_OK;
}

// A record's number: digits only (no sign, which sscanf took, so that "-4096" was 2^64 -
// 4096), and no overflow. Moves *at past it and the blanks before it.
static bool read_number(const char **at, uint64_t *out) {
  const char *p = *at;
  while (*p == ' ' || *p == '\t') p++;
  if (*p < '0' || *p > '9') return false;
  uint64_t value = 0;
  for (; *p >= '0' && *p <= '9'; p++) {
    unsigned digit = (unsigned)(*p - '0');
    if (value > (UINT64_MAX - digit) / 10) return false;
    value = value * 10 + digit;
  }
  *at = p;
  *out = value;
  return true;
}

static bool at_line_end(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\r') p++;
  return *p == '\n' || *p == '\0';
}

typedef enum line_read { LINE, TOO_LONG, HOLDS_NUL, ENDED } line_read;

// The next line of `file` into `text` (of `capacity` bytes) without its '\n', NUL-ended; the
// rest of a line too long for it is read and dropped. ENDED at the end of the file.
static line_read read_line(FILE *file, char *text, size_t capacity) {
  size_t length = 0;
  bool long_line = false, nul = false;
  int c = getc(file);
  if (c == EOF) return ENDED;
  for (; c != EOF && c != '\n'; c = getc(file)) {
    nul = nul || c == '\0';
    if (length + 1 < capacity)
      text[length++] = (char)c;
    else
      long_line = true;
  }
  text[length] = '\0';
  if (length && text[length - 1] == '\r') text[--length] = '\0';
  return long_line || length > TRACE_LINE_MOST ? TOO_LONG : nul ? HOLDS_NUL : LINE;
}

static devbuf_status replay_line(const char *text, unsigned long line, replay_table *table,
                                 devbuf_allocator_t *allocator, devbuf_trace_summary_t *summary) {
  uint64_t id, size;
  if (text[0] == '#' || text[0] == '\0') return DEVBUF_OK; // read_line took the '\n' off
  const char *at = text + 1;
  bool blank = text[1] == ' ' || text[1] == '\t';
  if (text[0] == 'a' && blank && read_number(&at, &id) && read_number(&at, &size) &&
      at_line_end(at)) {
    if (size > TRACE_LARGEST)
      return devbuf__error(DEVBUF_FORMAT_ERROR,
                           "trace line %lu: allocation %" PRIu64 " of %" PRIu64
                           " bytes, past the %" PRIu64 " a process can address",
                           line, id, size, TRACE_LARGEST);
    return replay_alloc(id, (size_t)size, line, table, allocator, summary);
  }
  if (text[0] == 'f' && blank && read_number(&at, &id) && at_line_end(at))
    return replay_free(id, line, table, allocator, summary);
  return devbuf__error(DEVBUF_FORMAT_ERROR, "trace line %lu is not a record: '%.60s'", line, text);
}

devbuf_status devbuf_trace_replay(const char *path, devbuf_allocator_t *allocator,
                                  devbuf_trace_summary_t *out_summary) {
  return devbuf_trace_replay_observed(path, allocator, NULL, NULL, out_summary);
}

devbuf_status devbuf_trace_replay_observed(const char *path, devbuf_allocator_t *allocator,
                                           devbuf_trace_observer_fn observer, void *context,
                                           devbuf_trace_summary_t *out_summary) {
  if (!path || !allocator || !out_summary)
    return devbuf__null_argument("trace replay", "path, allocator, out_summary",
                                 (const void *[]){path, allocator, out_summary});
  int fd = -1;
  uint64_t file_size = 0;
  devbuf_status status = devbuf__open_regular_file(path, &fd, &file_size);
  if (status != DEVBUF_OK) return status;
  FILE *file = fdopen(fd, "r");
  if (!file) {
    close(fd);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "trace: no host memory to read '%.200s'", path);
  }
  devbuf_trace_summary_t summary = {0};
  replay_table table = {.next_id = 1, .observer = observer, .observer_context = context};
  char text[TRACE_LINE_MOST + 2]; // and a '\r' before the line's end, and the NUL
  unsigned long line = 0;
  size_t header = strlen(TRACE_HEADER);
  for (line_read got; status == DEVBUF_OK && (got = read_line(file, text, sizeof text)) != ENDED;) {
    line++;
    if (line == 1 && (strncmp(text, TRACE_HEADER, header) != 0 || !at_line_end(text + header)))
      status = devbuf__error(DEVBUF_FORMAT_ERROR, "'%.200s' does not start with '%s'", path,
                             TRACE_HEADER);
    else if (got == TOO_LONG)
      status = devbuf__error(DEVBUF_FORMAT_ERROR, "trace line %lu is longer than %d characters",
                             line, TRACE_LINE_MOST);
    else if (got == HOLDS_NUL)
      status = devbuf__error(DEVBUF_FORMAT_ERROR, "trace line %lu holds a NUL byte", line);
    else
      status = replay_line(text, line, &table, allocator, &summary);
  }
  if (status == DEVBUF_OK && ferror(file))
    status = devbuf__error(DEVBUF_IO_ERROR, "cannot read '%.200s': %s", path, strerror(errno));
  if (status == DEVBUF_OK && line == 0)
    status = devbuf__error(DEVBUF_FORMAT_ERROR, "'%.200s' is empty: no trace header", path);
  for (size_t i = 0; i < table.capacity; i++) { // free what the trace left live
    if (!table.entries[i].id || table.entries[i].failed) continue;
    devbuf_allocator_free(allocator, &table.entries[i].memory);
    summary.leaked++;
  }
  devbuf__free(table.entries);
  fclose(file);
  if (status == DEVBUF_OK) *out_summary = summary;
  return status;
}
