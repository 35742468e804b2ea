// The trace adaptor and trace replay. A trace is a text file, one record a line:
//   # devbuf trace 1          header
//   a <id> <size>             allocation number <id> (from 1) of <size> bytes
//   f <id>                    that allocation was freed
//   # E                       the allocator's cache was given back (clear_cache)
// Replaying it against another allocator reproduces the workload's allocation pattern.
#include "trace_table.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TRACE_HEADER      "# devbuf trace 1"
#define TRACE_CACHE_CLEAR "# E"
#define TRACE_LINE_MOST   255                 // characters of a line, its end aside
#define TRACE_LARGEST     ((uint64_t)1 << 47) // bytes of one allocation: the x86-64 user space

typedef struct trace_adaptor {
  devbuf__adaptor adaptor;
  pthread_mutex_t lock; // orders lines in the file; guards the two below
  FILE *file;
  uint64_t next_id;
  // What the adaptor has handed out and not taken back, by number. The memory it hands out
  // is its upstream's with the number for a token, so that a free of memory it does not
  // hold now (a second free) is refused, not read from a record already gone.
  devbuf__trace_table live;
} trace_adaptor;

// An allocation, ordered after work where `visit` is set (memory released in flight).
static devbuf_status trace_alloc_with(devbuf_allocator_t *base, size_t size,
                                      devbuf__in_flight_visit visit, void *context,
                                      devbuf_memory_t *out) {
  trace_adaptor *self = (trace_adaptor *)base;
  devbuf_memory_t upstream;
  devbuf_status status = visit ? devbuf__allocator_alloc_ordered(self->adaptor.upstream, size,
                                                                 visit, context, &upstream)
                               : devbuf_allocator_alloc(self->adaptor.upstream, size, &upstream);
  if (status != DEVBUF_OK) return status;
  pthread_mutex_lock(&self->lock);
  devbuf__trace_entry entry = {.id = self->next_id, .memory = upstream, .size = size}, *slot;
  status = devbuf__trace_table_insert(&self->live, &entry, "trace adaptor", &slot);
  if (status == DEVBUF_OK) {
    self->next_id++;
    fprintf(self->file, "a %" PRIu64 " %zu\n", entry.id, size);
  }
  pthread_mutex_unlock(&self->lock);
  if (status != DEVBUF_OK) {
    devbuf_allocator_free(self->adaptor.upstream, &upstream);
    return status;
  }
  *out = upstream;
  out->token = (void *)(uintptr_t)entry.id;
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

// The entry `memory` came from, under the lock; NULL (with the thread's message set) for
// memory the adaptor does not hold now.
static devbuf__trace_entry *entry_of(trace_adaptor *self, const devbuf_memory_t *memory) {
  devbuf__trace_entry *entry = devbuf__trace_table_find(&self->live, (uintptr_t)memory->token);
  if (entry && entry->memory.host == memory->host && entry->memory.device == memory->device &&
      entry->memory.offset == memory->offset && entry->memory.size == memory->size)
    return entry; // (blocks of one OpenCL segment share its handle: the offset tells them apart)
  devbuf__error(DEVBUF_INVALID_ARGUMENT,
                "trace adaptor: the %zu bytes at %p are not handed out by this adaptor now "
                "(freed already?): left alone",
                memory->size, memory->host);
  return NULL;
}

// Takes `memory`'s entry out and writes its line; false for memory it does not hold.
static bool take_entry(trace_adaptor *self, const devbuf_memory_t *memory,
                       devbuf_memory_t *out_upstream) {
  pthread_mutex_lock(&self->lock);
  devbuf__trace_entry *entry = entry_of(self, memory);
  if (entry) {
    *out_upstream = entry->memory;
    fprintf(self->file, "f %" PRIu64 "\n", entry->id);
    devbuf__trace_table_remove(&self->live, entry);
  }
  pthread_mutex_unlock(&self->lock);
  return entry != NULL;
}

// The line goes first: the upstream may hand the memory out again at once.
static void trace_free(devbuf_allocator_t *base, const devbuf_memory_t *memory) {
  trace_adaptor *self = (trace_adaptor *)base;
  devbuf_memory_t upstream;
  if (take_entry(self, memory, &upstream)) devbuf_allocator_free(self->adaptor.upstream, &upstream);
}

// Released while work uses it: freed, for the trace, once the upstream took it back (an
// ordered allocation may take it in between: its line then comes first). The entry is taken
// out first, so that a second free racing with this one finds none; it goes back if the
// upstream keeps the memory.
static devbuf_status trace_free_in_flight(devbuf_allocator_t *base, const devbuf_memory_t *memory,
                                          void *fence, devbuf__in_flight **out_range) {
  trace_adaptor *self = (trace_adaptor *)base;
  pthread_mutex_lock(&self->lock);
  devbuf__trace_entry *found = entry_of(self, memory),
                      entry = found ? *found : (devbuf__trace_entry){0};
  if (found) devbuf__trace_table_remove(&self->live, found);
  pthread_mutex_unlock(&self->lock);
  if (!found) return DEVBUF_INVALID_ARGUMENT;
  devbuf_status status =
      devbuf__allocator_free_in_flight(self->adaptor.upstream, &entry.memory, fence, out_range);
  pthread_mutex_lock(&self->lock);
  if (status == DEVBUF_OK) {
    fprintf(self->file, "f %" PRIu64 "\n", entry.id);
  } else { // the caller keeps the memory: no free yet. A removal never shrinks the table, so
    // the insert fails only where other threads filled it meanwhile and no host memory is
    // left to grow it: the memory then stays the caller's, and the trace ends it here.
    devbuf__trace_entry *slot;
    if (devbuf__trace_table_insert(&self->live, &entry, "trace adaptor", &slot) != DEVBUF_OK)
      fprintf(self->file, "f %" PRIu64 "\n", entry.id);
  }
  pthread_mutex_unlock(&self->lock);
  return status;
}

// The line goes first, as a free's does: an allocation that another thread makes once the
// cache is given back comes after it in the file, as it came after it in time.
static void trace_clear_cache(devbuf_allocator_t *base) {
  trace_adaptor *self = (trace_adaptor *)base;
  pthread_mutex_lock(&self->lock);
  fprintf(self->file, "%s\n", TRACE_CACHE_CLEAR);
  pthread_mutex_unlock(&self->lock);
  devbuf_allocator_clear_cache(self->adaptor.upstream);
}

static void trace_destroy(devbuf_allocator_t *base) {
  trace_adaptor *self = (trace_adaptor *)base;
  fclose(self->file);
  devbuf__trace_table_free(&self->live);
  pthread_mutex_destroy(&self->lock);
  devbuf_allocator_release(self->adaptor.upstream);
  devbuf__free(self);
}

static const devbuf__allocator_ops trace_ops = {
    .kind = "trace",
    .alloc = trace_alloc,
    .free = trace_free,
    .destroy = trace_destroy,
    .clear_cache = trace_clear_cache,
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

// The replay's state: what the trace holds live (and refused allocations whose free has not
// come), by the file's numbers.
typedef struct replay_table {
  devbuf__trace_table live;
  uint64_t next_id; // ids come as 1, 2, 3, ...: the id the next "a" line must have
  uint64_t live_bytes;
  // No record since the last "# E": another finds nothing to give back, and a run of them
  // would cost a call each (a user allocator's clear may cost it much more) for nothing.
  bool cleared;
  devbuf_trace_observer_fn observer; // told of every record once it is played (may be NULL)
  void *observer_context;
} replay_table;

static devbuf_status replay_alloc(uint64_t id, size_t size, unsigned long line, replay_table *table,
                                  devbuf_allocator_t *allocator, devbuf_trace_summary_t *summary) {
  if (id != table->next_id || size == 0)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "trace line %lu: allocation %" PRIu64 " of %zu bytes (the next "
                         "allocation is number %" PRIu64 ", of at least 1 byte)",
                         line, id, size, table->next_id);
  char who[40];
  snprintf(who, sizeof who, "trace line %lu", line);
  devbuf__trace_entry entry = {.id = id, .size = size}, *slot;
  devbuf_status status = devbuf__trace_table_insert(&table->live, &entry, who, &slot);
  if (status != DEVBUF_OK) return status;
  table->next_id++;
  summary->allocs++;
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
  devbuf__trace_entry *slot = devbuf__trace_table_find(&table->live, id);
  if (!slot)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "trace line %lu: free of allocation %" PRIu64 " that is not live", line,
                         id);
  bool refused = slot->failed;
  if (!refused) {
    devbuf_allocator_free(allocator, &slot->memory);
    table->live_bytes -= slot->size;
  }
  devbuf__trace_table_remove(&table->live, slot);
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
  if (strcmp(text, TRACE_CACHE_CLEAR) == 0) {
    if (!table->cleared) devbuf_allocator_clear_cache(allocator);
    table->cleared = true;
    summary->cache_clears++;
    return DEVBUF_OK;
  }
  if (text[0] == '#' || text[0] == '\0') return DEVBUF_OK; // read_line took the '\n' off
  table->cleared = false;                                  // a record, or a line refused below
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
  for (size_t i = 0; i < table.live.capacity; i++) { // free what the trace left live
    const devbuf__trace_entry *entry = &table.live.entries[i];
    if (!entry->id || entry->failed) continue;
    devbuf_allocator_free(allocator, &entry->memory);
    summary.leaked++;
  }
  devbuf__trace_table_free(&table.live);
  fclose(file);
  if (status == DEVBUF_OK) *out_summary = summary;
  return status;
}
