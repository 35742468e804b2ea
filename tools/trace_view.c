// The trace view of trace_view.h. The trace is replayed once per policy (devbuf's caching
// allocator, then the CCA model) over a counting upstream; a thin allocator between the
// replay and the policy notes where each allocation landed, and the upstream's observer
// notes each segment's address, size and lifetime. The page gets those facts as JSON and
// its script (trace_view.js, built into the tool) draws everything from them: live bytes
// follow from the allocations' lifetimes, reserved bytes from the segments'.
#include "trace_view.h"
#include "counting_upstream.h"
#include "printable.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define POLICIES   2
#define MAX_FRAMES 64 // `# frame` lines kept per allocation
#define NEVER      UINT64_MAX

extern const unsigned char devbuf_trace_view_script[];
extern const size_t devbuf_trace_view_script_size;

typedef struct segment {
  uint64_t base, size, born, died; // died: NEVER while held
} segment;

typedef struct placed {
  int64_t segment; // -1: refused
  uint64_t offset;
} placed;

// One policy's replay: where each allocation went, the segments, the peaks.
typedef struct run {
  devbuf_tool_policy policy;
  devbuf_allocator_t *allocator;
  placed *placements;
  size_t placement_capacity;
  segment *segments;
  size_t segment_count, segment_capacity;
  uint64_t live, peak_live, peak_reserved, peak_reserved_at, system_allocs, refused;
} run;

typedef struct allocation {
  uint64_t size, born, died; // died: NEVER until freed
  size_t first_frame, frame_count;
} allocation;

typedef struct view {
  allocation *allocations;
  size_t count, capacity;
  uint64_t events;
  run runs[POLICIES];
  run *current;
  devbuf_counting_upstream counts;
  uint64_t last_address; // where the policy put the allocation just made
  uint64_t *times;       // per event, microseconds; NULL when the trace has no `# t` lines
  char **frames;
  size_t frame_count, frame_capacity;
  int out_of_memory;
} view;

static int grow(void **items, size_t *capacity, size_t count, size_t item_size) {
  if (count < *capacity) return 1;
  size_t bigger = *capacity ? 2 * *capacity : 1024;
  void *grown = realloc(*items, bigger * item_size);
  if (!grown) return 0;
  *items = grown;
  *capacity = bigger;
  return 1;
}

// The segment that holds `address`: bases only grow (the counting upstream never reuses one).
static int64_t segment_of(const run *r, uint64_t address) {
  size_t low = 0, high = r->segment_count;
  while (low < high) {
    size_t middle = low + (high - low) / 2;
    if (r->segments[middle].base <= address)
      low = middle + 1;
    else
      high = middle;
  }
  return low ? (int64_t)low - 1 : -1;
}

static void on_segment(void *context, uint64_t address, uint64_t size, int freed) {
  view *v = context;
  run *r = v->current;
  if (freed) {
    int64_t s = segment_of(r, address);
    if (s >= 0) r->segments[s].died = v->events;
  } else if (grow((void **)&r->segments, &r->segment_capacity, r->segment_count,
                  sizeof *r->segments)) {
    r->segments[r->segment_count++] =
        (segment){.base = address, .size = size, .born = v->events, .died = NEVER};
  } else {
    v->out_of_memory = 1;
  }
}

static void on_record(void *context, uint64_t id, uint64_t size, int refused) {
  view *v = context;
  run *r = v->current;
  uint64_t e = v->events++;
  size_t index = (size_t)id - 1;
  if (v->out_of_memory) return;
  if (size) {
    if (r == &v->runs[0]) { // the first replay records the allocations themselves
      if (!grow((void **)&v->allocations, &v->capacity, v->count, sizeof *v->allocations)) {
        v->out_of_memory = 1;
        return;
      }
      v->allocations[v->count++] = (allocation){.size = size, .born = e, .died = NEVER};
    }
    if (!grow((void **)&r->placements, &r->placement_capacity, index, sizeof *r->placements)) {
      v->out_of_memory = 1;
      return;
    }
    int64_t s = refused ? -1 : segment_of(r, v->last_address);
    r->placements[index] = (placed){s, s < 0 ? 0 : v->last_address - r->segments[s].base};
    if (refused)
      r->refused++;
    else
      r->live += size;
  } else {
    if (r == &v->runs[0]) v->allocations[index].died = e;
    if (r->placements[index].segment >= 0) r->live -= v->allocations[index].size;
  }
  if (r->live > r->peak_live) r->peak_live = r->live;
  if (v->counts.held > r->peak_reserved) r->peak_reserved = v->counts.held, r->peak_reserved_at = e;
}

// The allocator between the replay and the policy: it remembers each allocation's address.
static devbuf_status noting_alloc(void *context, size_t size, devbuf_memory_t *out) {
  view *v = context;
  devbuf_status status = devbuf_allocator_alloc(v->current->allocator, size, out);
  if (status == DEVBUF_OK) v->last_address = out->device;
  return status;
}

static void noting_free(void *context, const devbuf_memory_t *memory) {
  view *v = context;
  devbuf_allocator_free(v->current->allocator, memory);
}

// A trace's "# E": the policy behind gives its cache back, as replay's does.
static void noting_clear_cache(void *context) {
  devbuf_allocator_clear_cache(((view *)context)->current->allocator);
}

static const devbuf_allocator_vtable_t noting_vtable = {
    .alloc = noting_alloc, .free = noting_free, .clear_cache = noting_clear_cache};

static devbuf_status replay(view *v, run *r, devbuf_device_t *device,
                            const devbuf_caching_options_t *options, const char *path) {
  v->current = r;
  v->events = 0;
  v->counts = (devbuf_counting_upstream){.on_segment = on_segment, .observer_context = v};
  devbuf_allocator_t *noting = NULL;
  devbuf_trace_summary_t summary;
  devbuf_status status =
      devbuf_tool_counting_policy(device, r->policy, options, &v->counts, &r->allocator);
  if (status == DEVBUF_OK) status = devbuf_allocator_create(device, &noting_vtable, v, &noting);
  if (status == DEVBUF_OK)
    status = devbuf_trace_replay_observed(path, noting, on_record, v, &summary);
  r->system_allocs = v->counts.allocs;
  devbuf_allocator_release(noting);
  devbuf_allocator_release(r->allocator);
  r->allocator = NULL;
  return status;
}

// The microseconds of a `# t` line (`text` after "# t"): digits only, below 2^64, blanks
// around them, as replay reads the numbers of its records.
static bool read_time(const char *text, uint64_t *out) {
  while (*text == ' ' || *text == '\t') text++;
  if (*text < '0' || *text > '9') return false;
  uint64_t value = 0;
  for (; *text >= '0' && *text <= '9'; text++) {
    unsigned digit = (unsigned)(*text - '0');
    if (value > (UINT64_MAX - digit) / 10) return false;
    value = value * 10 + digit;
  }
  while (*text == ' ' || *text == '\t' || *text == '\r') text++;
  *out = value;
  return *text == '\0';
}

// The trace's annotations, which replay skips: `# t MICROSECONDS` gives the time of the
// record after it, `# frame TEXT` lines the stack of the allocation after them (innermost
// first). The file has passed replay, so its records are well formed and no line is longer
// than 255 characters, but replay does not read times: a time that is no number (a sign,
// 2^64 or more, letters) is refused here, naming its line, where strtoull made it 0 or
// 2^64 - 1. 1, or 0 without memory, or -1 for such a time (the message printed).
static int read_annotations(view *v, const char *path, const char *shown) {
  char why[256], line[512], safe[1024], safe_line[300];
  FILE *file = devbuf_tool_open_regular(path, why, sizeof why);
  if (!file) return 0;
  uint64_t event = 0, time = 0;
  unsigned long number = 0;
  size_t next_allocation = 0, pending_first = v->frame_count, pending = 0;
  int timed = 0, result = 1;
  while (fgets(line, sizeof line, file)) {
    number++;
    line[strcspn(line, "\n")] = 0;
    if (strncmp(line, "# t ", 4) == 0 || strcmp(line, "# t") == 0) {
      if (!read_time(line + 3, &time)) {
        fprintf(stderr,
                "devbuf trace: %s: trace line %lu: '# t' takes the microseconds as an unsigned "
                "decimal number below 2^64, not '%s'\n",
                DEVBUF_PRINTABLE(shown, safe), number,
                DEVBUF_PRINTABLE(line + (line[3] ? 4 : 3), safe_line));
        result = -1;
        break;
      }
      if (event >= v->events) continue; // the time of no record
      if (!timed && !(v->times = calloc(v->events ? v->events : 1, sizeof *v->times))) {
        result = 0;
        break;
      }
      if (!timed) // records before the first time (allocations live when recording began) take it
        for (uint64_t e = 0; e < event; e++) v->times[e] = time;
      timed = 1;
    } else if (event >= v->events) {
      continue;
    } else if (strncmp(line, "# frame ", 8) == 0 && pending < MAX_FRAMES) {
      char *text = strdup(line + 8);
      if (!text ||
          !grow((void **)&v->frames, &v->frame_capacity, v->frame_count, sizeof *v->frames)) {
        free(text);
        result = 0;
        break;
      }
      v->frames[v->frame_count++] = text;
      pending++;
    } else if (line[0] == 'a' || line[0] == 'f') {
      if (timed) v->times[event] = time;
      if (line[0] == 'a' && next_allocation < v->count) {
        v->allocations[next_allocation].first_frame = pending_first;
        v->allocations[next_allocation++].frame_count = pending;
      }
      if (line[0] == 'a') pending_first = v->frame_count, pending = 0;
      event++;
    }
  }
  fclose(file);
  return result;
}

// Text for HTML: as it is, but for the characters markup gives a meaning.
static void write_html_text(FILE *out, const char *text) {
  for (const char *c = text; *c; c++) {
    if (*c == '<')
      fputs("&lt;", out);
    else if (*c == '>')
      fputs("&gt;", out);
    else if (*c == '&')
      fputs("&amp;", out);
    else if (*c == '"')
      fputs("&quot;", out);
    else
      fputc(*c, out);
  }
}

// A JSON string inside a <script> element: `<` never appears, so no text ends the element.
static void write_script_string(FILE *out, const char *text) {
  fputc('"', out);
  for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
    if (*c == '"' || *c == '\\')
      fprintf(out, "\\%c", *c);
    else if (*c < 0x20 || *c == '<' || *c == '>' || *c == '&')
      fprintf(out, "\\u%04x", *c);
    else
      fputc(*c, out);
  }
  fputc('"', out);
}

static void write_policy_json(FILE *out, const view *v, const run *r, const char *label) {
  fprintf(out, "{\"name\": \"%s\", \"label\": ", devbuf_tool_policy_name(r->policy));
  write_script_string(out, label);
  fprintf(out,
          ", \"peak_live\": %" PRIu64 ", \"peak_reserved\": %" PRIu64
          ", \"peak_reserved_at\": %" PRIu64 ", \"system_allocs\": %" PRIu64
          ", \"refused\": %" PRIu64 ",\n\"segments\": [",
          r->peak_live, r->peak_reserved, r->peak_reserved_at, r->system_allocs, r->refused);
  for (size_t s = 0; s < r->segment_count; s++) {
    const segment *g = &r->segments[s];
    fprintf(out, "%s%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64, s ? "," : "", g->base, g->size,
            g->born, g->died == NEVER ? v->events : g->died);
  }
  fprintf(out, "],\n\"placements\": [");
  for (size_t i = 0; i < v->count; i++)
    fprintf(out, "%s%" PRId64 ",%" PRIu64, i ? "," : "", r->placements[i].segment,
            r->placements[i].offset);
  fprintf(out, "]}");
}

static void write_figure(FILE *out, const char *id, const char *what, uint64_t value,
                         const char *unit) {
  fprintf(out,
          "%s <span class=\"figure\" id=\"%s\" data-value=\"%" PRIu64 "\">%" PRIu64 "</span>%s",
          what, id, value, value, unit);
}

static void write_page(FILE *out, const char *path, const view *v, const char *labels[POLICIES]) {
  const run *mine = &v->runs[0], *theirs = &v->runs[1];
  fprintf(out, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>devbuf trace: ");
  write_html_text(out, path);
  fprintf(out, "</title>\n<style>\n"
               "body{font:13px sans-serif;margin:12px;color:#222}h1{font-size:18px;margin:4px 0}"
               "h2{font-size:14px;margin:6px 0}.figure{font-weight:bold}"
               "#panels{display:flex;flex-wrap:wrap;gap:16px}.panel{flex:1 1 640px;min-width:640px}"
               "svg text{font:11px sans-serif;fill:#333}.axis-title{fill:#666}"
               "#tip{position:fixed;pointer-events:none;background:#fffff4;border:1px solid #999;"
               "padding:4px 6px;font:12px "
               "monospace;white-space:pre-wrap;word-break:break-all;max-width:720px;"
               "box-shadow:1px 1px 4px #888;z-index:9}"
               ".segment-summary{font:12px monospace;margin:4px 0}.help{color:#555}"
               "button{font:12px sans-serif}\n</style></head><body>\n<h1>Allocation trace: ");
  write_html_text(out, path);
  fprintf(out, "</h1>\n<p>%zu allocations, %" PRIu64 " events (allocations and frees). ", v->count,
          v->events);
  write_figure(out, "peak-live", "Peak live", mine->peak_live, " bytes;");
  fprintf(out, " devbuf: ");
  write_figure(out, "peak-reserved", "peak reserved", mine->peak_reserved, " bytes,");
  write_figure(out, "devbuf-system-allocs", "", mine->system_allocs, " system allocations,");
  write_figure(out, "devbuf-refused", "", mine->refused, " refused;");
  fprintf(out, " PyTorch's CCA (model): ");
  write_figure(out, "cca-peak-reserved", "peak reserved", theirs->peak_reserved, " bytes,");
  write_figure(out, "cca-system-allocs", "", theirs->system_allocs, " system allocations,");
  write_figure(out, "cca-refused", "", theirs->refused, " refused.</p>\n");
  fprintf(out,
          "<p class=\"help\">Live bytes stacked by allocation (older below newer; the largest by "
          "bytes x time in colour, the rest grey, which also shows the highest live bytes within "
          "each pixel, so a spike of one event stays visible); reserved bytes as the red line. "
          "Hover for an allocation's size, lifetime and stack. Scroll to zoom, drag across a "
          "range to zoom into it, double-click or <button id=\"whole\">whole trace</button> to "
          "see all. Click a moment to see what each segment held then.</p>\n"
          "<p id=\"range\"></p>\n<div id=\"panels\"></div>\n<div id=\"tip\" hidden></div>\n"
          "<script type=\"application/json\" id=\"trace-data\">\n{\"file\": ");
  write_script_string(out, path);
  fprintf(out, ", \"events\": %" PRIu64 ",\n\"times\": ", v->events);
  if (v->times) {
    fputc('[', out);
    for (uint64_t e = 0; e < v->events; e++) fprintf(out, "%s%" PRIu64, e ? "," : "", v->times[e]);
    fputc(']', out);
  } else {
    fputs("null", out);
  }
  fprintf(out, ",\n\"allocations\": [");
  for (size_t i = 0; i < v->count; i++) {
    const allocation *a = &v->allocations[i];
    fprintf(out, "%s%" PRIu64 ",%" PRIu64 ",%" PRIu64, i ? "," : "", a->size, a->born,
            a->died == NEVER ? v->events : a->died);
  }
  fprintf(out, "],\n\"stacks\": [");
  for (size_t i = 0, written = 0; i < v->count; i++) {
    const allocation *a = &v->allocations[i];
    if (!a->frame_count) continue;
    fprintf(out, "%s[%zu", written++ ? "," : "", i);
    for (size_t f = 0; f < a->frame_count; f++) {
      fputc(',', out);
      write_script_string(out, v->frames[a->first_frame + f]);
    }
    fputc(']', out);
  }
  fprintf(out, "],\n\"policies\": [");
  for (int p = 0; p < POLICIES; p++) {
    if (p) fprintf(out, ",\n");
    write_policy_json(out, v, &v->runs[p], labels[p]);
  }
  fprintf(out, "]}\n</script>\n<script>\n");
  fwrite(devbuf_trace_view_script, 1, devbuf_trace_view_script_size, out);
  fprintf(out, "</script>\n</body></html>\n");
}

static void view_free(view *v) {
  free(v->allocations);
  for (int p = 0; p < POLICIES; p++) {
    free(v->runs[p].placements);
    free(v->runs[p].segments);
  }
  free(v->times);
  for (size_t f = 0; f < v->frame_count; f++) free(v->frames[f]);
  free(v->frames);
}

static const char *file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "something else";
}

// The page goes to a regular file only: opening a FIFO to write waits for a reader, forever
// if none comes. Non-blocking, so that a FIFO made after the first check fails the open
// (ENXIO) or the check after it instead of waiting; NULL with the reason in `why`.
static FILE *open_page(const char *page, char *why, size_t why_capacity) {
  int fd = open(page, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0666);
  struct stat info;
  if (fd < 0 || fstat(fd, &info) != 0) {
    snprintf(why, why_capacity, "%s", strerror(errno));
    if (fd >= 0) close(fd);
    return NULL;
  }
  FILE *file = NULL;
  if (!S_ISREG(info.st_mode))
    snprintf(why, why_capacity, "it is %s, not a regular file", file_kind(info.st_mode));
  else if (ftruncate(fd, 0) != 0 || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 ||
           !(file = fdopen(fd, "w")))
    snprintf(why, why_capacity, "%s", strerror(errno));
  if (!file) close(fd);
  return file;
}

int devbuf_tool_trace_view(devbuf_device_t *device, const char *path, const char *shown,
                           const devbuf_caching_options_t *options, const char *page) {
  view v = {.runs = {{.policy = DEVBUF_TOOL_POLICY_DEVBUF}, {.policy = DEVBUF_TOOL_POLICY_CCA}}};
  char safe[1024], labels[POLICIES][160];
  int code = 1;
  struct stat input, output; // the page must not replace the run it draws
  if (stat(shown, &input) == 0 && stat(page, &output) == 0 && input.st_dev == output.st_dev &&
      input.st_ino == output.st_ino) {
    fprintf(stderr, "devbuf trace: the page %s would overwrite its input: name another file\n",
            DEVBUF_PRINTABLE(page, safe));
    return 1;
  }
  if (stat(page, &output) == 0 && !S_ISREG(output.st_mode)) { // before the replays, not after
    fprintf(stderr, "devbuf trace: cannot write the page %s: it is %s, not a regular file\n",
            DEVBUF_PRINTABLE(page, safe), file_kind(output.st_mode));
    return 1;
  }
  uint64_t page_size =
      options && options->page_size ? options->page_size : devbuf_device_page_size(device);
  snprintf(labels[0], sizeof labels[0], "devbuf's caching allocator (%s, %" PRIu64 "-byte page)",
           devbuf_device_spec(device), page_size);
  snprintf(labels[1], sizeof labels[1], "PyTorch's CUDA caching allocator (model, defaults)");
  if (options && options->memory_limit) {
    for (int p = 0; p < POLICIES; p++) {
      size_t used = strlen(labels[p]);
      snprintf(labels[p] + used, sizeof labels[p] - used, ", limit %" PRIu64 " bytes",
               options->memory_limit);
    }
  }
  devbuf_status status = DEVBUF_OK;
  int annotations = 1;
  for (int p = 0; p < POLICIES && status == DEVBUF_OK && !v.out_of_memory; p++)
    status = replay(&v, &v.runs[p], device, options, path);
  if (status != DEVBUF_OK) {
    devbuf_tool_report("trace", NULL);
  } else if (v.out_of_memory || (annotations = read_annotations(&v, path, shown)) == 0) {
    fprintf(stderr, "devbuf trace: no memory to draw %s\n", DEVBUF_PRINTABLE(shown, safe));
  } else if (annotations > 0) {
    char why[128];
    FILE *out = open_page(page, why, sizeof why);
    if (!out) {
      fprintf(stderr, "devbuf trace: cannot write the page %s: %s\n", DEVBUF_PRINTABLE(page, safe),
              why);
    } else {
      const char *label_of[POLICIES] = {labels[0], labels[1]};
      write_page(out, shown, &v, label_of);
      code = fclose(out) == 0 ? 0 : 1;
      if (code)
        fprintf(stderr, "devbuf trace: cannot write %s: %s\n", DEVBUF_PRINTABLE(page, safe),
                strerror(errno));
      else
        printf("wrote %s: peak live %" PRIu64 " bytes, peak reserved %" PRIu64
               " bytes (PyTorch's CCA, modelled: %" PRIu64 ")\n",
               DEVBUF_PRINTABLE(page, safe), v.runs[0].peak_live, v.runs[0].peak_reserved,
               v.runs[1].peak_reserved);
    }
  }
  view_free(&v);
  return code;
}
