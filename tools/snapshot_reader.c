// The snapshot conversion of snapshot_reader.h: the steps of tools/snapshot_to_trace.py's
// convert(), in its order, over the tree of pickle_reader.h (dictionaries looked up by
// string key, the last entry counting, as a Python dict does).
#include "snapshot_reader.h"
#include "pickle_reader.h"
#include "printable.h"
#include "python_printable.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SMALL_SEGMENT ((int64_t)2 << 20)
#define LONGEST_FRAME 240 // bytes of a frame's text: a trace line holds at most 255
#define SCALAR_TEXT   (DEVBUF_PICKLE_MAX_DIGITS + 2) // str() of any scalar it writes, and a NUL

// ---- a map of 64-bit keys (addresses) to values: open addressing, at most half full ------

typedef struct int_map {
  int64_t *keys;
  uint64_t *values;
  uint8_t *states;       // 0 empty, 1 present, 2 removed (the key stays: it may come back)
  size_t capacity, used; // slots; slots not empty
} int_map;

// Every bit of the key reaches the low bits (a multiply alone left addresses that differ
// only above bit 47 all in one slot): the mix of splitmix64.
static uint64_t hash_key(int64_t key) {
  uint64_t x = (uint64_t)key;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9u;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebu;
  return x ^ (x >> 31);
}

// The slot of `key`, or the empty slot where it would go.
static size_t map_slot(const int_map *map, int64_t key) {
  size_t mask = map->capacity - 1, slot = (size_t)hash_key(key) & mask;
  while (map->states[slot] && map->keys[slot] != key) slot = (slot + 1) & mask;
  return slot;
}

static uint64_t *map_find(const int_map *map, int64_t key) {
  if (!map->capacity) return NULL;
  size_t slot = map_slot(map, key);
  return map->states[slot] == 1 ? &map->values[slot] : NULL;
}

static bool map_has(const int_map *map, int64_t key) { return map_find(map, key) != NULL; }

static int map_put(int_map *map, int64_t key, uint64_t value) {
  if (2 * (map->used + 1) > map->capacity) {
    int_map grown = {.capacity = map->capacity ? map->capacity * 2 : 64};
    grown.keys = malloc(grown.capacity * sizeof *grown.keys);
    grown.values = malloc(grown.capacity * sizeof *grown.values);
    grown.states = calloc(grown.capacity, 1);
    if (!grown.keys || !grown.values || !grown.states) {
      free(grown.keys), free(grown.values), free(grown.states);
      return -1;
    }
    for (size_t i = 0; i < map->capacity; i++) {
      if (map->states[i] != 1) continue;
      size_t slot = map_slot(&grown, map->keys[i]);
      grown.keys[slot] = map->keys[i], grown.values[slot] = map->values[i];
      grown.states[slot] = 1;
      grown.used++;
    }
    free(map->keys), free(map->values), free(map->states);
    *map = grown;
  }
  size_t slot = map_slot(map, key);
  if (!map->states[slot]) map->used++;
  map->keys[slot] = key, map->values[slot] = value, map->states[slot] = 1;
  return 0;
}

static void map_remove(int_map *map, int64_t key) {
  if (!map->capacity) return;
  size_t slot = map_slot(map, key);
  if (map->states[slot] == 1) map->states[slot] = 2;
}

static void map_free(int_map *map) {
  free(map->keys), free(map->values), free(map->states);
  *map = (int_map){0};
}

// ---- the conversion's state ---------------------------------------------------------------

typedef struct segment {
  int64_t address, size;
  const devbuf_pickle_value *pool; // written as Python's str() of it
} segment;

typedef struct live_block {
  int64_t address, requested, block;
} live_block;

typedef struct converter {
  const devbuf_pickle_value **events; // the device's events that are dictionaries
  size_t event_count;
  const devbuf_pickle_value **segments; // the device's segments
  size_t segment_count;
  segment *start; // held when recording began, by address
  size_t start_count;
  live_block *live_at_start;
  size_t live_count;
  int_map traced_segments, allocated, seen, held_index, live_index, live;
  uint64_t steps, step_limit;    // dictionary entries and list items looked at
  uint64_t written, write_limit; // trace bytes
  FILE *out;
  devbuf_snapshot_figures *figures;
  char *message;
  size_t capacity;
} converter;

// The first failure's message stays: what follows it (a lookup refused past the step limit
// reads as a missing key) is its consequence.
__attribute__((format(printf, 2, 3))) static int fail(converter *c, const char *format, ...) {
  if (c->message[0]) return -1;
  va_list args;
  va_start(args, format);
  vsnprintf(c->message, c->capacity, format, args);
  va_end(args);
  return -1;
}

static int out_of_memory(converter *c) { return fail(c, "out of memory"); }

static int emit(converter *c, const char *format, ...) __attribute__((format(printf, 2, 3)));
static int emit(converter *c, const char *format, ...) {
  va_list args;
  va_start(args, format);
  int length = vfprintf(c->out, format, args);
  va_end(args);
  if (length < 0) return fail(c, "cannot write the trace: %s", strerror(errno));
  c->written += (uint64_t)length;
  if (c->written > c->write_limit)
    return fail(c,
                "the trace would pass %" PRIu64 " bytes (%d per byte of the snapshot, plus "
                "%" PRIu64 "): refused",
                c->write_limit, DEVBUF_SNAPSHOT_OUTPUT_PER_BYTE, DEVBUF_SNAPSHOT_OUTPUT_FLOOR);
  return 0;
}

static int count_step(converter *c, uint64_t steps) {
  c->steps += steps;
  if (c->steps > c->step_limit)
    return fail(c,
                "converting the snapshot would look at more than %" PRIu64 " values (%d per "
                "byte, plus %" PRIu64 "): refused",
                c->step_limit, DEVBUF_SNAPSHOT_STEPS_PER_BYTE, DEVBUF_SNAPSHOT_STEPS_FLOOR);
  return 0;
}

// Past the step limit every lookup misses at once, and the conversion fails saying why: each
// lookup scans its dictionary, and a snapshot of one large dictionary looked up for every
// event cost its size squared before the next count_step.
static const devbuf_pickle_value *get(converter *c, const devbuf_pickle_value *dict,
                                      const char *key) {
  if (c->steps > c->step_limit) {
    count_step(c, 0);
    return NULL;
  }
  return devbuf_pickle_get(dict, key, &c->steps);
}

static bool is_sequence(const devbuf_pickle_value *value) {
  return value->kind == DEVBUF_PICKLE_LIST || value->kind == DEVBUF_PICKLE_TUPLE;
}

// Python's truth of a value.
static bool truthy(const devbuf_pickle_value *value) {
  switch (value->kind) {
  case DEVBUF_PICKLE_NONE:
    return false;
  case DEVBUF_PICKLE_BOOL:
  case DEVBUF_PICKLE_INT:
    return value->as.integer != 0;
  case DEVBUF_PICKLE_FLOAT:
    return value->as.number != 0;
  case DEVBUF_PICKLE_STR:
  case DEVBUF_PICKLE_BYTES:
    return value->as.text.length != 0;
  case DEVBUF_PICKLE_CLASS:
  case DEVBUF_PICKLE_BIGINT: // never 0: 0 is an INT
    return true;
  default:
    return value->as.list.count != 0;
  }
}

// `what`'s integer `key` (required: Python's dict[key]), into `*out`.
static int need_int(converter *c, const devbuf_pickle_value *dict, const char *key,
                    const char *what, size_t index, int64_t *out) {
  const devbuf_pickle_value *value = get(c, dict, key);
  if (!value)
    return fail(c, "%s %zu (offset %u) has no '%s'", what, index, (unsigned)dict->offset, key);
  if (value->kind == DEVBUF_PICKLE_BIGINT) { // the pickle reads it; the trace cannot hold it
    char digits[SCALAR_TEXT];
    if (!devbuf_pickle_decimal(value, digits, sizeof digits, &c->steps))
      snprintf(digits, sizeof digits, "an integer of %zu bytes", value->as.text.length);
    return fail(c, "%s %zu (offset %u): '%s' is %s, outside the 64-bit signed range of the trace",
                what, index, (unsigned)dict->offset, key, digits);
  }
  if (value->kind != DEVBUF_PICKLE_INT)
    return fail(c, "%s %zu (offset %u): '%s' is a %s, not an integer", what, index,
                (unsigned)dict->offset, key, devbuf_pickle_kind_name(value));
  *out = value->as.integer;
  return 0;
}

// The same, `fallback` where the key is missing (Python's dict.get(key, fallback)).
static int get_int(converter *c, const devbuf_pickle_value *dict, const char *key, const char *what,
                   size_t index, int64_t fallback, int64_t *out) {
  if (!get(c, dict, key)) {
    *out = fallback;
    return 0;
  }
  return need_int(c, dict, key, what, index, out);
}

// ---- Python's str() of a scalar -----------------------------------------------------------

// repr(float): the shortest digits that read back as the same double, in Python's layout.
static void python_float(double x, char *out, size_t capacity) {
  if (isnan(x)) {
    snprintf(out, capacity, "nan");
    return;
  }
  if (isinf(x)) {
    snprintf(out, capacity, "%sinf", x < 0 ? "-" : "");
    return;
  }
  char text[40], digits[24];
  for (int precision = 1; precision <= 17; precision++) {
    snprintf(text, sizeof text, "%.*e", precision - 1, x);
    if (strtod(text, NULL) == x) break;
  }
  // "-d.ddde+XX": the digits without the point, and the point's place (0.DIGITS x 10^point).
  const char *at = text + (text[0] == '-');
  size_t count = 0;
  for (; *at && *at != 'e'; at++)
    if (*at != '.') digits[count++] = *at;
  while (count > 1 && digits[count - 1] == '0') count--;
  digits[count] = '\0';
  int point = atoi(at + 1) + 1;
  const char *sign = signbit(x) ? "-" : "";
  if (point <= -4 || point > 16) { // d.ddde+XX
    snprintf(out, capacity, "%s%c%s%.*se%c%02d", sign, digits[0], count > 1 ? "." : "",
             (int)count - 1, digits + 1, point - 1 < 0 ? '-' : '+', abs(point - 1));
  } else if (point <= 0) {
    snprintf(out, capacity, "%s0.%.*s%s", sign, -point, "0000", digits);
  } else if ((size_t)point >= count) {
    snprintf(out, capacity, "%s%s%.*s.0", sign, digits, point - (int)count, "0000000000000000");
  } else {
    snprintf(out, capacity, "%s%.*s.%s", sign, point, digits, digits + point);
  }
}

// Python's str() of `value` as (bytes, length), using `buffer` for numbers; -1 (with the
// message) for what str() would spell as a container's repr.
static int python_str(converter *c, const devbuf_pickle_value *value, char *buffer, size_t capacity,
                      const char **out_text, size_t *out_length) {
  switch (value->kind) {
  case DEVBUF_PICKLE_STR:
    *out_text = value->as.text.bytes;
    *out_length = value->as.text.length;
    return 0;
  case DEVBUF_PICKLE_NONE:
    snprintf(buffer, capacity, "None");
    break;
  case DEVBUF_PICKLE_BOOL:
    snprintf(buffer, capacity, value->as.integer ? "True" : "False");
    break;
  case DEVBUF_PICKLE_INT:
    snprintf(buffer, capacity, "%" PRId64, value->as.integer);
    break;
  case DEVBUF_PICKLE_FLOAT:
    python_float(value->as.number, buffer, capacity);
    break;
  case DEVBUF_PICKLE_BIGINT:
    if (!devbuf_pickle_decimal(value, buffer, capacity, &c->steps))
      return fail(c,
                  "an integer of %zu bytes (offset %u) has more than the %d digits Python's "
                  "str() writes",
                  value->as.text.length, (unsigned)value->offset, DEVBUF_PICKLE_MAX_DIGITS);
    if (count_step(c, 0)) return -1;
    break;
  default:
    return fail(c, "a %s (offset %u) where the trace needs text or a number",
                devbuf_pickle_kind_name(value), (unsigned)value->offset);
  }
  *out_text = buffer;
  *out_length = strlen(buffer);
  return 0;
}

static int emit_str(converter *c, const devbuf_pickle_value *value) {
  char buffer[SCALAR_TEXT];
  const char *text;
  size_t length;
  if (python_str(c, value, buffer, sizeof buffer, &text, &length)) return -1;
  if (fwrite(text, 1, length, c->out) != length)
    return fail(c, "cannot write the trace: %s", strerror(errno));
  c->written += length;
  return emit(c, "%s", ""); // checks the bound
}

// ---- a frame's text: FILE:LINE NAME, what Python does not print as '?', cut to fit ------

static bool python_printable(uint32_t code) {
  size_t low = 0, high = sizeof python_unprintable / sizeof *python_unprintable;
  while (low < high) {
    size_t middle = (low + high) / 2;
    if (code < python_unprintable[middle][0])
      high = middle;
    else if (code > python_unprintable[middle][1])
      low = middle + 1;
    else
      return false;
  }
  return true;
}

typedef struct frame_text {
  char text[LONGEST_FRAME + 8];
  size_t length;
  bool full; // more than LONGEST_FRAME bytes were offered
} frame_text;

// Appends `length` bytes of well-formed UTF-8, each code point Python would not print as '?'.
static void frame_append(frame_text *frame, const char *bytes, size_t length) {
  const unsigned char *s = (const unsigned char *)bytes;
  for (size_t i = 0; i < length && !frame->full;) {
    size_t n = s[i] < 0x80 ? 1 : s[i] < 0xe0 ? 2 : s[i] < 0xf0 ? 3 : 4;
    uint32_t code = n == 1 ? s[i] : (uint32_t)s[i] & (0xff >> (n + 1));
    for (size_t k = 1; k < n; k++) code = code << 6 | (s[i + k] & 0x3f);
    const char *piece = python_printable(code) ? (const char *)s + i : "?";
    size_t piece_length = python_printable(code) ? n : 1;
    if (frame->length + piece_length > LONGEST_FRAME) {
      frame->full = true;
      break;
    }
    memcpy(frame->text + frame->length, piece, piece_length);
    frame->length += piece_length;
    i += n;
  }
}

static int emit_frame(converter *c, const devbuf_pickle_value *frame) {
  static const devbuf_pickle_value question = {.kind = DEVBUF_PICKLE_STR,
                                               .as.text = {.bytes = "?", .length = 1}};
  const devbuf_pickle_value *parts[3] = {get(c, frame, "filename"), get(c, frame, "line"),
                                         get(c, frame, "name")};
  frame_text text = {.length = 0};
  for (int i = 0; i < 3; i++) {
    char buffer[SCALAR_TEXT];
    const char *bytes;
    size_t length;
    if (python_str(c, parts[i] ? parts[i] : &question, buffer, sizeof buffer, &bytes, &length))
      return -1;
    if (i) frame_append(&text, i == 1 ? ":" : " ", 1);
    frame_append(&text, bytes, length);
  }
  if (text.full) { // the longest start of whole characters within LONGEST_FRAME - 3 bytes
    size_t cut = LONGEST_FRAME - 3;
    while (cut && ((unsigned char)text.text[cut] & 0xc0) == 0x80) cut--;
    memcpy(text.text + cut, "...", 3);
    text.length = cut + 3;
  }
  return emit(c, "# frame %.*s\n", (int)text.length, text.text);
}

// The stack of an allocation: its frames that are dictionaries with a "filename", only the
// Python ones (a str filename ending in ".py") where there are any, the first `limit`.
static int emit_stack(converter *c, const devbuf_pickle_value *event, int limit) {
  const devbuf_pickle_value *frames = get(c, event, "frames");
  if (!frames || frames->kind != DEVBUF_PICKLE_LIST || limit <= 0) return 0;
  size_t count = frames->as.list.count, python = 0;
  if (count_step(c, count)) return -1;
  for (size_t i = 0; i < count; i++) {
    const devbuf_pickle_value *name = get(c, frames->as.list.items[i], "filename");
    if (name && name->kind == DEVBUF_PICKLE_STR && name->as.text.length >= 3 &&
        memcmp(name->as.text.bytes + name->as.text.length - 3, ".py", 3) == 0)
      python++;
  }
  int written = 0;
  for (size_t i = 0; i < count && written < limit; i++) {
    const devbuf_pickle_value *frame = frames->as.list.items[i];
    const devbuf_pickle_value *name = get(c, frame, "filename");
    if (!name) continue; // not a dictionary, or no filename
    if (python && !(name->kind == DEVBUF_PICKLE_STR && name->as.text.length >= 3 &&
                    memcmp(name->as.text.bytes + name->as.text.length - 3, ".py", 3) == 0))
      continue;
    if (emit_frame(c, frame)) return -1;
    written++;
  }
  return count_step(c, 0);
}

// ---- the steps of convert() -----------------------------------------------------------------

static int compare_segments(const void *a, const void *b) {
  int64_t x = ((const segment *)a)->address, y = ((const segment *)b)->address;
  return (x > y) - (x < y);
}

static int compare_live(const void *a, const void *b) {
  int64_t x = ((const live_block *)a)->address, y = ((const live_block *)b)->address;
  return (x > y) - (x < y);
}

static bool action_is(converter *c, const devbuf_pickle_value *event, const char *action) {
  return devbuf_pickle_is_str(get(c, event, "action"), action);
}

// An allocation of a recorded event: "alloc" with a size above 0 (Python: e.get("size", 0)).
static int alloc_size(converter *c, const devbuf_pickle_value *event, size_t index,
                      int64_t *out_size) {
  *out_size = 0;
  if (!action_is(c, event, "alloc")) return 0;
  return get_int(c, event, "size", "event", index, 0, out_size);
}

// The events of `device` that are dictionaries, and its segments.
static int select_device(converter *c, const devbuf_pickle_value *root, int device) {
  const devbuf_pickle_value *traces = get(c, root, "device_traces");
  const devbuf_pickle_value *events = NULL;
  if (traces && truthy(traces)) {
    if (!is_sequence(traces))
      return fail(c, "'device_traces' (offset %u) is a %s, not a list", (unsigned)traces->offset,
                  devbuf_pickle_kind_name(traces));
    if ((size_t)device < traces->as.list.count) events = traces->as.list.items[device];
  }
  if (events && !is_sequence(events))
    return fail(c, "the events of device %d (offset %u) are a %s, not a list", device,
                (unsigned)events->offset, devbuf_pickle_kind_name(events));
  size_t count = events ? events->as.list.count : 0;
  c->events = malloc((count ? count : 1) * sizeof *c->events);
  if (!c->events || count_step(c, count)) return c->events ? -1 : out_of_memory(c);
  for (size_t i = 0; i < count; i++)
    if (events->as.list.items[i]->kind == DEVBUF_PICKLE_DICT)
      c->events[c->event_count++] = events->as.list.items[i];
  const devbuf_pickle_value *segments = get(c, root, "segments");
  if (!is_sequence(segments))
    return fail(c, "'segments' (offset %u) is a %s, not a list", (unsigned)segments->offset,
                devbuf_pickle_kind_name(segments));
  count = segments->as.list.count;
  c->segments = malloc((count ? count : 1) * sizeof *c->segments);
  if (!c->segments || count_step(c, count)) return c->segments ? -1 : out_of_memory(c);
  for (size_t i = 0; i < count; i++) {
    const devbuf_pickle_value *s = segments->as.list.items[i];
    if (s->kind != DEVBUF_PICKLE_DICT) continue;
    const devbuf_pickle_value *on = get(c, s, "device"); // s.get("device", 0) == device
    bool same = !on ? device == 0
                : on->kind == DEVBUF_PICKLE_INT || on->kind == DEVBUF_PICKLE_BOOL
                    ? on->as.integer == device
                : on->kind == DEVBUF_PICKLE_FLOAT ? on->as.number == (double)device
                                                  : false;
    if (same) c->segments[c->segment_count++] = s;
  }
  return 0;
}

// Expandable segments, as the snapshot's allocator_settings (PyTorch 2.1 and later) or its
// segments' is_expandable say; absent from both, the default: off. PyTorch writes booleans:
// anything else (a string "False" is true to Python) counts as not said.
static bool says_on(const devbuf_pickle_value *value) {
  return value && (value->kind == DEVBUF_PICKLE_BOOL || value->kind == DEVBUF_PICKLE_INT) &&
         value->as.integer != 0;
}

static void read_settings(converter *c, const devbuf_pickle_value *root) {
  const devbuf_pickle_value *settings = get(c, root, "allocator_settings");
  bool expandable = settings && settings->kind == DEVBUF_PICKLE_DICT &&
                    says_on(get(c, settings, "expandable_segments"));
  for (size_t i = 0; !expandable && i < c->segment_count; i++)
    expandable = says_on(get(c, c->segments[i], "is_expandable"));
  c->figures->expandable_segments = expandable;
}

// Adds or replaces the segment held at the start at `address`.
static int hold(converter *c, int64_t address, int64_t size, const devbuf_pickle_value *pool,
                size_t capacity) {
  if (size < 0) return fail(c, "a segment at %#" PRIx64 " of %" PRId64 " bytes", address, size);
  uint64_t *index = map_find(&c->held_index, address);
  if (index) {
    c->start[*index] = (segment){address, size, pool};
    return 0;
  }
  if (c->start_count == capacity || map_put(&c->held_index, address, c->start_count))
    return out_of_memory(c);
  c->start[c->start_count++] = (segment){address, size, pool};
  return 0;
}

// The segments held when recording began: those at dump time the trace did not allocate,
// plus those it freed without having allocated them; in address order, none overlapping.
// Events are taken in order: a segment_free frees what the last segment_alloc of its address
// made where that is not freed yet, else a segment held at the start. CUDA hands a freed
// address out again, and a snapshot whose trace freed a segment held at the start and then
// allocated a new one at its address (a real one did, at 0x7f54fa000000) lost that segment
// when any segment_alloc of the address, earlier or later, made the free the trace's own:
// the allocation live in it at the start then lay "in no segment held at the start".
static int segments_at_start(converter *c) {
  static const devbuf_pickle_value large = {.kind = DEVBUF_PICKLE_STR,
                                            .as.text = {.bytes = "large", .length = 5}};
  static const devbuf_pickle_value small = {.kind = DEVBUF_PICKLE_STR,
                                            .as.text = {.bytes = "small", .length = 5}};
  size_t capacity = c->segment_count + c->event_count, freed_count = 0;
  c->start = malloc((capacity ? capacity : 1) * sizeof *c->start);
  // The events that free a segment held at the start, in their order.
  size_t *freed = malloc((c->event_count ? c->event_count : 1) * sizeof *freed);
  int status = c->start && freed ? 0 : out_of_memory(c);
  for (size_t i = 0; !status && i < c->event_count; i++) {
    const devbuf_pickle_value *e = c->events[i];
    int64_t address = 0;
    bool made = action_is(c, e, "segment_alloc");
    if (!made && !action_is(c, e, "segment_free")) continue;
    if ((status = need_int(c, e, "addr", "event", i, &address))) break;
    if (made) // traced_segments: made by the trace and not freed since
      status = map_put(&c->traced_segments, address, 1) ? out_of_memory(c) : 0;
    else if (map_has(&c->traced_segments, address))
      map_remove(&c->traced_segments, address);
    else
      freed[freed_count++] = i;
  }
  // Those at dump time, but for the ones the trace made.
  for (size_t i = 0; !status && i < c->segment_count; i++) {
    const devbuf_pickle_value *s = c->segments[i], *pool = NULL;
    int64_t address = 0, size = 0;
    if ((status = need_int(c, s, "address", "segment", i, &address))) break;
    if (map_has(&c->traced_segments, address)) continue;
    if ((status = need_int(c, s, "total_size", "segment", i, &size))) break;
    pool = get(c, s, "segment_type");
    status = hold(c, address, size, pool ? pool : &large, capacity);
  }
  // Those the trace freed (the last free of an address counts, as in a dictionary).
  for (size_t k = 0; !status && k < freed_count; k++) {
    const devbuf_pickle_value *e = c->events[freed[k]];
    int64_t address = 0, size = 0;
    status = need_int(c, e, "addr", "event", freed[k], &address) ||
                     need_int(c, e, "size", "event", freed[k], &size) ||
                     hold(c, address, size, size == SMALL_SEGMENT ? &small : &large, capacity)
                 ? -1
                 : 0;
  }
  free(freed);
  if (status) return -1;
  qsort(c->start, c->start_count, sizeof *c->start, compare_segments);
  for (size_t i = 0; i < c->start_count; i++) {
    int64_t end;
    if (__builtin_add_overflow(c->start[i].address, c->start[i].size, &end))
      return fail(c, "the segment at %#" PRIx64 " ends past 2^63", c->start[i].address);
    if (i + 1 < c->start_count && end > c->start[i + 1].address)
      return fail(c, "the segments at %#" PRIx64 " and %#" PRIx64 " overlap", c->start[i].address,
                  c->start[i + 1].address);
  }
  return 0;
}

// Adds or replaces the allocation live at the start at `address`.
static int live_at(converter *c, int64_t address, int64_t requested, int64_t block,
                   size_t capacity) {
  if (requested <= 0 || block <= 0)
    return fail(c,
                "an allocation live at the start, at address %" PRId64 ", of %" PRId64
                " bytes (%" PRId64 " requested): sizes are above 0",
                address, block, requested);
  uint64_t *index = map_find(&c->live_index, address);
  if (index) {
    c->live_at_start[*index] = (live_block){address, requested, block};
    return 0;
  }
  if (c->live_count == capacity || map_put(&c->live_index, address, c->live_count))
    return out_of_memory(c);
  c->live_at_start[c->live_count++] = (live_block){address, requested, block};
  return 0;
}

// The address of block `k` of segment `i` (a dictionary) where the segment's blocks are
// placed by their sizes: older PyTorch versions gave a block no 'address' (a 'history' of
// its allocations instead), and listed a segment's blocks in address order, end to end from
// the segment's address. `*position` is where the block starts (set to the segment's address
// at block 0), then where it ends. A block whose own address is elsewhere, or blocks that
// pass the segment's end, make no sense of that rule, and are refused.
static int place_block(converter *c, size_t i, size_t k, int64_t *position, int64_t *out) {
  const devbuf_pickle_value *held = c->segments[i];
  const devbuf_pickle_value *block = get(c, held, "blocks")->as.list.items[k];
  int64_t base = 0, total = 0, size = 0, own = 0, end = 0;
  if (need_int(c, held, "address", "segment", i, &base) ||
      need_int(c, held, "total_size", "segment", i, &total) ||
      need_int(c, block, "size", "block", k, &size))
    return -1;
  if (!k) *position = base;
  if (size < 0)
    return fail(c, "block %zu of segment %zu (offset %u): a size of %" PRId64 " bytes", k, i,
                (unsigned)block->offset, size);
  if (get(c, block, "address") && need_int(c, block, "address", "block", k, &own)) return -1;
  if (get(c, block, "address") && own != *position)
    return fail(c,
                "block %zu of segment %zu (offset %u) is at %#" PRIx64 ", not at %#" PRIx64
                " where the sizes of the blocks before it end (the segment's blocks without "
                "an 'address' are placed by them)",
                k, i, (unsigned)block->offset, own, *position);
  // *position - base is at most `total`, checked at the blocks before this one.
  if (size > total - (*position - base) || __builtin_add_overflow(*position, size, &end))
    return fail(c,
                "the blocks of segment %zu (offset %u), placed end to end by their sizes (some "
                "have no 'address'), pass its end at %" PRId64 " bytes with block %zu",
                i, (unsigned)held->offset, total, k);
  *out = *position;
  *position = end;
  return 0;
}

// Allocations live when recording began: blocks still allocated at dump time that the
// trace did not allocate, and allocations it frees without having allocated them.
static int allocations_at_start(converter *c) {
  size_t capacity = c->event_count;
  for (size_t i = 0; i < c->event_count; i++) {
    int64_t size = 0, address = 0;
    if (alloc_size(c, c->events[i], i, &size)) return -1;
    if (size > 0 && (need_int(c, c->events[i], "addr", "event", i, &address) ||
                     map_put(&c->allocated, address, 1)))
      return c->message[0] ? -1 : out_of_memory(c);
  }
  for (size_t i = 0; i < c->segment_count; i++) {
    const devbuf_pickle_value *blocks = get(c, c->segments[i], "blocks");
    if (!blocks) continue;
    if (!is_sequence(blocks))
      return fail(c, "the blocks of segment %zu (offset %u) are a %s, not a list", i,
                  (unsigned)blocks->offset, devbuf_pickle_kind_name(blocks));
    if (count_step(c, blocks->as.list.count)) return -1;
    if (capacity > SIZE_MAX / 2 - blocks->as.list.count) return out_of_memory(c);
    capacity += blocks->as.list.count;
  }
  c->live_at_start = malloc((capacity ? capacity : 1) * sizeof *c->live_at_start);
  if (!c->live_at_start) return out_of_memory(c);
  for (size_t i = 0; i < c->segment_count; i++) {
    const devbuf_pickle_value *blocks = get(c, c->segments[i], "blocks");
    size_t count = blocks ? blocks->as.list.count : 0;
    bool placed = false; // some block has no 'address': each lies where those before it end
    for (size_t k = 0; k < count; k++) {
      const devbuf_pickle_value *block = blocks->as.list.items[k];
      if (block->kind != DEVBUF_PICKLE_DICT)
        return fail(c, "block %zu of segment %zu (offset %u) is a %s, not a dictionary", k, i,
                    (unsigned)block->offset, devbuf_pickle_kind_name(block));
      if (!get(c, block, "address")) placed = true;
    }
    int64_t position = 0;
    for (size_t k = 0; k < count; k++) {
      const devbuf_pickle_value *block = blocks->as.list.items[k];
      int64_t address = 0, size = 0, requested = 0;
      if (placed && place_block(c, i, k, &position, &address)) return -1;
      if (!devbuf_pickle_is_str(get(c, block, "state"), "active_allocated")) continue;
      if (!placed && need_int(c, block, "address", "block", k, &address)) return -1;
      if (map_has(&c->allocated, address)) continue;
      if (need_int(c, block, "size", "block", k, &size)) return -1;
      // block.get("requested_size", block["size"]) or block["size"]
      const devbuf_pickle_value *wanted = get(c, block, "requested_size");
      if (!wanted || !truthy(wanted))
        requested = size;
      else if (need_int(c, block, "requested_size", "block", k, &requested))
        return -1;
      if (live_at(c, address, requested, size, capacity)) return -1;
    }
  }
  for (size_t i = 0; i < c->event_count; i++) {
    const devbuf_pickle_value *e = c->events[i];
    int64_t size = 0, address = 0;
    if (alloc_size(c, e, i, &size)) return -1;
    if (size > 0) {
      if (need_int(c, e, "addr", "event", i, &address) || map_put(&c->seen, address, 1))
        return c->message[0] ? -1 : out_of_memory(c);
      continue;
    }
    if (!action_is(c, e, "free_completed")) continue;
    if (need_int(c, e, "addr", "event", i, &address)) return -1;
    if (!map_has(&c->seen, address) && !map_has(&c->live_index, address)) {
      int64_t rounded = 0;
      if (need_int(c, e, "size", "event", i, &size)) return -1;
      if (__builtin_add_overflow(size, 511, &rounded))
        return fail(c, "event %zu: a size of %" PRId64 " bytes", i, size);
      rounded = (rounded >= 0 ? rounded / 512 : -((-rounded + 511) / 512)) * 512; // floor
      if (live_at(c, address, size, rounded, capacity)) return -1;
    }
    map_remove(&c->seen, address);
  }
  qsort(c->live_at_start, c->live_count, sizeof *c->live_at_start, compare_live);
  return 0;
}

// The segment of `start` holding `address` and the offset in it, or -1.
static int place(const converter *c, int64_t address, size_t *out_index, int64_t *out_offset) {
  size_t low = 0, high = c->start_count; // the first segment starting after `address`
  while (low < high) {
    size_t middle = (low + high) / 2;
    if (c->start[middle].address <= address)
      low = middle + 1;
    else
      high = middle;
  }
  if (!low || address - c->start[low - 1].address >= c->start[low - 1].size) return -1;
  *out_index = low - 1;
  *out_offset = address - c->start[low - 1].address;
  return 0;
}

static int add_reserved(converter *c, int64_t *reserved, int64_t bytes) {
  if (__builtin_add_overflow(*reserved, bytes, reserved))
    return fail(c, "the segments' bytes overflow 64 bits");
  return 0;
}

static int write_trace(converter *c, const char *source, int device, int frames) {
  devbuf_snapshot_figures *f = c->figures;
  char safe[1024];
  int64_t stream = INT64_MAX;
  for (size_t i = 0; i < c->event_count; i++) {
    int64_t s = 0;
    if (get_int(c, c->events[i], "stream", "event", i, 0, &s)) return -1;
    if (s < stream) stream = s;
  }
  if (!c->event_count) stream = 0;
  if (emit(c,
           "# devbuf trace 1\n# converted from %s: device %d, %zu events\n# stream %" PRId64 "\n",
           DEVBUF_PRINTABLE(source, safe), device, c->event_count, stream))
    return -1;
  int64_t reserved = 0, peak_from_start;
  for (size_t i = 0; i < c->start_count; i++) {
    if (emit(c, "# s %zu %" PRId64 " ", i, c->start[i].size) || emit_str(c, c->start[i].pool) ||
        emit(c, "\n") || add_reserved(c, &reserved, c->start[i].size))
      return -1;
  }
  f->segments_at_start = c->start_count;
  f->reserved_at_start = reserved;
  peak_from_start = reserved;
  uint64_t next_id = 1;
  for (size_t i = 0; i < c->live_count; i++) {
    const live_block *b = &c->live_at_start[i];
    size_t index;
    int64_t offset;
    if (place(c, b->address, &index, &offset))
      return fail(c, "the allocation at %#" PRIx64 " lies in no segment held at the start",
                  b->address);
    if (emit(c, "# p %zu %" PRId64 " %" PRIu64 " %" PRId64 "\na %" PRIu64 " %" PRId64 "\n", index,
             offset, next_id, b->block, next_id, b->requested) ||
        map_put(&c->live, b->address, next_id))
      return c->message[0] ? -1 : out_of_memory(c);
    next_id++;
  }
  f->allocs = f->live_at_start = c->live_count;
  bool in_free_run = false, recording = false;
  uint64_t frees_before_recording = 0;
  for (size_t i = 0; i < c->event_count; i++) {
    const devbuf_pickle_value *e = c->events[i];
    const devbuf_pickle_value *action = get(c, e, "action");
    bool alloc = devbuf_pickle_is_str(action, "alloc"),
         free = devbuf_pickle_is_str(action, "free_completed"),
         segment_alloc = devbuf_pickle_is_str(action, "segment_alloc"),
         segment_free = devbuf_pickle_is_str(action, "segment_free");
    int64_t s = 0, size = 0, address = 0;
    if (count_step(c, 1) || get_int(c, e, "stream", "event", i, 0, &s)) return -1;
    if ((alloc || free || segment_alloc || segment_free) && s != stream) {
      if (emit(c, "# stream %" PRId64 "\n", s)) return -1;
      stream = s;
    }
    if (!segment_free) in_free_run = false;
    if (alloc && alloc_size(c, e, i, &size)) return -1;
    if ((alloc && size > 0) || free) {
      if (need_int(c, e, "addr", "event", i, &address)) return -1;
    }
    bool recorded = (alloc && size > 0) || (free && map_has(&c->live, address));
    const devbuf_pickle_value *time = get(c, e, "time_us");
    if (recorded && time &&
        (time->kind == DEVBUF_PICKLE_INT || time->kind == DEVBUF_PICKLE_BOOL ||
         time->kind == DEVBUF_PICKLE_BIGINT) &&
        !devbuf_pickle_negative(time)) { // Python: isinstance(time, int) and time >= 0
      if (emit(c, "# t ") || emit_str(c, time) || emit(c, "\n")) return -1;
    }
    if (alloc) {
      if (size <= 0) continue;
      if (!recording) {
        recording = true;
        f->cca_peak_reserved = reserved;
      }
      if (emit_stack(c, e, frames) || map_put(&c->live, address, next_id) ||
          emit(c, "a %" PRIu64 " %" PRId64 "\n", next_id, size))
        return c->message[0] ? -1 : out_of_memory(c);
      next_id++;
      f->allocs++;
    } else if (free) {
      uint64_t *id = map_find(&c->live, address);
      if (id) {
        if (emit(c, "f %" PRIu64 "\n", *id)) return -1;
        map_remove(&c->live, address);
        f->frees++;
      }
    } else if (segment_alloc || segment_free) {
      if (need_int(c, e, "size", "event", i, &size)) return -1;
      if (size < 0) return fail(c, "event %zu: a segment of %" PRId64 " bytes", i, size);
      if (segment_free && !in_free_run) {
        if (emit(c, "# E\n")) return -1;
        in_free_run = true;
      }
      if (emit(c, "# %c %" PRId64 "\n", segment_alloc ? 'S' : 'F', size) ||
          add_reserved(c, &reserved, segment_alloc ? size : -size))
        return -1;
      if (segment_alloc)
        f->cca_segment_allocs++;
      else
        f->cca_segment_frees++;
      if (segment_free && !recording) frees_before_recording++;
      if (reserved > peak_from_start) peak_from_start = reserved;
      if (recording && reserved > f->cca_peak_reserved) f->cca_peak_reserved = reserved;
    }
  }
  if (!recording) f->cca_peak_reserved = peak_from_start;
  f->events = c->event_count;
  f->cca_reserved_at_end = reserved;
  f->cca_system_allocs = c->start_count - frees_before_recording + f->cca_segment_allocs;
  f->trace_bytes = c->written;
  return 0;
}

int devbuf_snapshot_convert(const uint8_t *data, size_t size, const char *source, int device,
                            int frames, FILE *out, devbuf_snapshot_figures *figures, char *message,
                            size_t capacity) {
  *figures = (devbuf_snapshot_figures){0};
  if (capacity) message[0] = '\0';
  devbuf_pickle *pickle = NULL;
  const devbuf_pickle_value *root = NULL;
  if (devbuf_pickle_parse(data, size, &pickle, &root, message, capacity)) return -1;
  converter c = {.out = out,
                 .figures = figures,
                 .message = message,
                 .capacity = capacity,
                 .step_limit = DEVBUF_SNAPSHOT_STEPS_FLOOR + DEVBUF_SNAPSHOT_STEPS_PER_BYTE * size,
                 .write_limit =
                     DEVBUF_SNAPSHOT_OUTPUT_FLOOR + DEVBUF_SNAPSHOT_OUTPUT_PER_BYTE * size};
  int status = 0;
  if (device < 0)
    status = fail(&c, "device %d: devices are numbered from 0", device);
  else if (root->kind != DEVBUF_PICKLE_DICT || !get(&c, root, "segments"))
    status = fail(&c, "not a memory snapshot (a dictionary with 'segments'), but a %s",
                  devbuf_pickle_kind_name(root));
  if (!status) status = select_device(&c, root, device);
  if (!status) read_settings(&c, root);
  if (!status) status = segments_at_start(&c);
  if (!status) status = allocations_at_start(&c);
  if (!status) status = write_trace(&c, source, device, frames);
  if (!status && count_step(&c, 0)) status = -1;
  free(c.events), free(c.segments), free(c.start), free(c.live_at_start);
  map_free(&c.traced_segments), map_free(&c.allocated), map_free(&c.seen);
  map_free(&c.held_index), map_free(&c.live_index), map_free(&c.live);
  devbuf_pickle_free(pickle);
  return status;
}

// ---- the tool's temporary trace -----------------------------------------------------------

int devbuf_tool_is_snapshot(const char *path) {
  char why[256];
  FILE *file = devbuf_tool_open_regular(path, why, sizeof why);
  if (!file) return 0;
  uint8_t head[2];
  size_t got = fread(head, 1, sizeof head, file);
  fclose(file);
  return devbuf_pickle_sniff(head, got);
}

// The temporary trace goes also when SIGHUP, SIGINT or SIGTERM ends the command: a handler
// removes it (unlink is async-signal-safe, the path is saved before the handler can run)
// and raises the signal again under its default action, so the process ends as it would
// have. A signal the process ignores (nohup, a background job's SIGINT) stays ignored.
static const int ending_signals[] = {SIGHUP, SIGINT, SIGTERM};
#define ENDING_SIGNALS (sizeof ending_signals / sizeof *ending_signals)
static char pending_trace[4096];
static volatile sig_atomic_t trace_pending;
static struct sigaction previous_actions[ENDING_SIGNALS];
static bool handled[ENDING_SIGNALS];

static void remove_pending_trace(int signal_number) {
  if (trace_pending) unlink(pending_trace);
  signal(signal_number, SIG_DFL);
  raise(signal_number); // delivered once the handler returns: the signal is blocked in it
}

static void block_ending_signals(int how, sigset_t *previous) {
  sigset_t set;
  sigemptyset(&set);
  for (size_t i = 0; i < ENDING_SIGNALS; i++) sigaddset(&set, ending_signals[i]);
  sigprocmask(how, &set, previous);
}

// With the ending signals blocked by the caller.
static void watch_trace(const char *trace_path) {
  snprintf(pending_trace, sizeof pending_trace, "%s", trace_path);
  trace_pending = 1;
  struct sigaction action = {.sa_handler = remove_pending_trace};
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < ENDING_SIGNALS; i++) {
    handled[i] = sigaction(ending_signals[i], NULL, &previous_actions[i]) == 0 &&
                 previous_actions[i].sa_handler == SIG_DFL &&
                 !(previous_actions[i].sa_flags & SA_SIGINFO) &&
                 sigaction(ending_signals[i], &action, NULL) == 0;
  }
}

// With the ending signals blocked by the caller.
static void unwatch_trace(void) {
  trace_pending = 0;
  for (size_t i = 0; i < ENDING_SIGNALS; i++)
    if (handled[i]) sigaction(ending_signals[i], &previous_actions[i], NULL), handled[i] = false;
}

int devbuf_tool_snapshot_open(const char *command, const char *path, int device,
                              devbuf_tool_snapshot *out) {
  *out = (devbuf_tool_snapshot){.trace_path = "", .device = device};
  char why[1024] = "", safe[1024];
  uint8_t *data = NULL;
  struct stat info;
  FILE *file = devbuf_tool_open_regular(path, why, sizeof why), *trace = NULL;
  if (file &&
      (fstat(fileno(file), &info) != 0 || (uint64_t)info.st_size >= DEVBUF_PICKLE_MAX_INPUT))
    snprintf(why, sizeof why, "a snapshot of more than 4 GiB");
  else if (file && !(data = malloc(info.st_size ? (size_t)info.st_size : 1)))
    snprintf(why, sizeof why, "out of memory");
  else if (file && fread(data, 1, (size_t)info.st_size, file) != (size_t)info.st_size)
    snprintf(why, sizeof why, "cannot read it: %s", strerror(errno));
  if (file) fclose(file);
  if (!why[0]) {
    const char *folder = getenv("TMPDIR");
    snprintf(out->trace_path, sizeof out->trace_path, "%s/devbuf-snapshot-XXXXXX.trace",
             folder && folder[0] ? folder : "/tmp");
    sigset_t unblocked;
    block_ending_signals(SIG_BLOCK, &unblocked); // no signal between the file and its handler
    int fd = mkstemps(out->trace_path, 6);
    if (fd >= 0) watch_trace(out->trace_path);
    sigprocmask(SIG_SETMASK, &unblocked, NULL);
    if (fd < 0 || !(trace = fdopen(fd, "w"))) {
      snprintf(why, sizeof why, "cannot make a temporary trace %s: %s",
               DEVBUF_PRINTABLE(out->trace_path, safe), strerror(errno));
      if (fd >= 0) close(fd), devbuf_tool_snapshot_close(out);
      out->trace_path[0] = '\0';
    }
  }
  if (!why[0] &&
      devbuf_snapshot_convert(data, (size_t)info.st_size, path, device,
                              DEVBUF_SNAPSHOT_DEFAULT_FRAMES, trace, &out->figures, why,
                              sizeof why) == 0 &&
      fflush(trace) != 0)
    snprintf(why, sizeof why, "cannot write the trace: %s", strerror(errno));
  if (trace && fclose(trace) != 0 && !why[0])
    snprintf(why, sizeof why, "cannot write the trace: %s", strerror(errno));
  // A device the snapshot shows nothing of is refused, 0 as any other: a mistyped device,
  // or a snapshot taken with no memory history recorded and nothing allocated, replayed as
  // all zeros, read as a run that needed no memory.
  if (!why[0] && !out->figures.events && !out->figures.segments_at_start)
    snprintf(why, sizeof why,
             "it records no event and no segment of CUDA device %d: nothing to replay", device);
  free(data);
  if (!why[0]) return 0;
  char safe_why[2048];
  fprintf(stderr, "devbuf %s: %s: %s\n", command, DEVBUF_PRINTABLE(path, safe),
          DEVBUF_PRINTABLE(why, safe_why));
  devbuf_tool_snapshot_close(out);
  return 1;
}

void devbuf_tool_snapshot_close(devbuf_tool_snapshot *snapshot) {
  if (!snapshot->trace_path[0]) return;
  sigset_t unblocked;
  block_ending_signals(SIG_BLOCK, &unblocked);
  unlink(snapshot->trace_path);
  unwatch_trace();
  sigprocmask(SIG_SETMASK, &unblocked, NULL);
  snapshot->trace_path[0] = '\0';
}
