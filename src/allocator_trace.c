// The trace adaptor (A5) and trace replay. A trace is a text file, one record a line:
//   # devbuf trace 1          header
//   a <id> <size>             allocation number <id> (from 1) of <size> bytes
//   f <id>                    that allocation was freed
// Replaying it against another allocator reproduces the workload's allocation pattern.
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_HEADER "# devbuf trace 1"

typedef struct trace_adaptor {
  devbuf_allocator_t base;
  devbuf_allocator_t *upstream;
  pthread_mutex_t lock;           // orders lines in the file
  FILE *file;
  uint64_t next_id;               // under the lock
} trace_adaptor;

typedef struct trace_record {
  devbuf_memory_t upstream;
  uint64_t id;
} trace_record;

static devbuf_status trace_alloc(devbuf_allocator_t *base, size_t size, devbuf_memory_t *out) {
  trace_adaptor *self = (trace_adaptor *)base;
  trace_record *record = devbuf__malloc(sizeof *record);
  if (!record) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "trace: no host memory for a record");
  devbuf_status status = devbuf_allocator_alloc(self->upstream, size, &record->upstream);
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

static void trace_free(devbuf_allocator_t *base, const devbuf_memory_t *memory) {
  trace_adaptor *self = (trace_adaptor *)base;
  trace_record *record = memory->token;
  pthread_mutex_lock(&self->lock);
  fprintf(self->file, "f %" PRIu64 "\n", record->id);
  pthread_mutex_unlock(&self->lock);
  devbuf_allocator_free(self->upstream, &record->upstream);
  devbuf__free(record);
}

static void trace_destroy(devbuf_allocator_t *base) {
  trace_adaptor *self = (trace_adaptor *)base;
  fclose(self->file);
  pthread_mutex_destroy(&self->lock);
  devbuf_allocator_release(self->upstream);
  devbuf__free(self);
}

static const devbuf__allocator_ops trace_ops = {
    .kind = "trace",
    .alloc = trace_alloc,
    .free = trace_free,
    .destroy = trace_destroy,
};

devbuf_status devbuf_trace_adaptor_create(devbuf_allocator_t *upstream, const char *path,
                                          devbuf_allocator_t **out_allocator) {
  if (!upstream || !path || !out_allocator)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "trace adaptor: upstream, path and out_allocator are required");
  FILE *file = fopen(path, "w");
  if (!file) return devbuf__error(DEVBUF_IO_ERROR, "trace: cannot create '%.200s': %s", path, strerror(errno));
  trace_adaptor *self = devbuf__calloc(1, sizeof *self);
  if (!self) {
    fclose(file);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a trace adaptor");
  }
  fprintf(file, "%s\n", TRACE_HEADER);
  devbuf__allocator_init(&self->base, &trace_ops, upstream->device, DEVBUF__HOLDS_DEVICE);
  self->base.memory_kind = upstream->memory_kind;
  self->upstream = devbuf_allocator_retain(upstream);
  devbuf__mutex_init(&self->lock);
  self->file = file;
  self->next_id = 1;
  *out_allocator = &self->base;
  return DEVBUF_OK;
}

// ---- replay ---------------------------------------------------------------------------

typedef struct replay_slot {
  devbuf_memory_t memory;
  size_t size;       // bytes the trace asked for
  bool live, failed; // failed: the target refused it, so its free is skipped
} replay_slot;

typedef struct replay_state {
  replay_slot *slots; // indexed by id
  size_t capacity;
  uint64_t live_bytes;
} replay_state;

static devbuf_status grow_slots(replay_state *state, uint64_t id, unsigned long line) {
  if (id < state->capacity) return DEVBUF_OK;
  if (id > ((uint64_t)1 << 32))
    return devbuf__error(DEVBUF_FORMAT_ERROR, "trace line %lu: allocation id %" PRIu64 " is implausibly large", line, id);
  size_t capacity = state->capacity ? state->capacity : 1024;
  while (capacity <= id) capacity *= 2;
  replay_slot *slots = devbuf__calloc(capacity, sizeof *slots);
  if (!slots) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "trace replay: no host memory for %zu slots", capacity);
  if (state->capacity) memcpy(slots, state->slots, state->capacity * sizeof *slots);
  devbuf__free(state->slots);
  state->slots = slots;
  state->capacity = capacity;
  return DEVBUF_OK;
}

static devbuf_status replay_line(const char *text, unsigned long line, replay_state *state,
                                 devbuf_allocator_t *allocator, devbuf_trace_summary_t *summary) {
  uint64_t id;
  size_t size;
  char tail;
  if (text[0] == '#' || text[0] == '\n' || text[0] == '\0') return DEVBUF_OK;
  if (sscanf(text, "a %" SCNu64 " %zu %c", &id, &size, &tail) == 2) {
    devbuf_status status = grow_slots(state, id, line);
    if (status != DEVBUF_OK) return status;
    replay_slot *slot = &state->slots[id];
    if (id == 0 || slot->live || slot->failed || size == 0)
      return devbuf__error(DEVBUF_FORMAT_ERROR, "trace line %lu: allocation %" PRIu64 " of %zu bytes is invalid or repeated",
                           line, id, size);
    summary->allocs++;
    if (devbuf_allocator_alloc(allocator, size, &slot->memory) != DEVBUF_OK) {
      summary->failed_allocs++;
      slot->failed = true;
      return DEVBUF_OK;
    }
    slot->live = true;
    slot->size = size;
    state->live_bytes += size;
    if (state->live_bytes > summary->peak_live_bytes) summary->peak_live_bytes = state->live_bytes;
    return DEVBUF_OK;
  }
  if (sscanf(text, "f %" SCNu64 " %c", &id, &tail) == 1) {
    replay_slot *slot = id < state->capacity ? &state->slots[id] : NULL;
    if (slot && slot->failed) {
      slot->failed = false;
      summary->frees++;
      return DEVBUF_OK;
    }
    if (!slot || !slot->live)
      return devbuf__error(DEVBUF_FORMAT_ERROR, "trace line %lu: free of allocation %" PRIu64 " that is not live", line, id);
    devbuf_allocator_free(allocator, &slot->memory);
    slot->live = false;
    state->live_bytes -= slot->size;
    summary->frees++;
    return DEVBUF_OK;
  }
  return devbuf__error(DEVBUF_FORMAT_ERROR, "trace line %lu is not a record: '%.60s'", line, text);
}

devbuf_status devbuf_trace_replay(const char *path, devbuf_allocator_t *allocator, devbuf_trace_summary_t *out_summary) {
  if (!path || !allocator || !out_summary)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "trace replay: path, allocator and out_summary are required");
  FILE *file = fopen(path, "r");
  if (!file) return devbuf__error(DEVBUF_IO_ERROR, "trace: cannot open '%.200s': %s", path, strerror(errno));
  devbuf_trace_summary_t summary = {0};
  replay_state state = {0};
  char text[256];
  unsigned long line = 0;
  devbuf_status status = DEVBUF_OK;
  while (status == DEVBUF_OK && fgets(text, sizeof text, file)) {
    line++;
    if (line == 1 && strncmp(text, TRACE_HEADER, strlen(TRACE_HEADER)) != 0)
      status = devbuf__error(DEVBUF_FORMAT_ERROR, "'%.200s' does not start with '%s'", path, TRACE_HEADER);
    else if (!strchr(text, '\n') && !feof(file))
      status = devbuf__error(DEVBUF_FORMAT_ERROR, "trace line %lu is longer than %zu characters", line, sizeof text);
    else
      status = replay_line(text, line, &state, allocator, &summary);
  }
  if (status == DEVBUF_OK && line == 0)
    status = devbuf__error(DEVBUF_FORMAT_ERROR, "'%.200s' is empty: no trace header", path);
  for (size_t id = 0; id < state.capacity; id++) { // free what the trace left live
    if (!state.slots[id].live) continue;
    devbuf_allocator_free(allocator, &state.slots[id].memory);
    summary.leaked++;
  }
  devbuf__free(state.slots);
  fclose(file);
  if (status == DEVBUF_OK) *out_summary = summary;
  return status;
}
