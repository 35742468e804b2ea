// The trace view of trace_view.h. devbuf_trace_replay_observed plays the trace through a
// caching allocator over a counting upstream and tells the view of every record, which it
// keeps with the live and reserved bytes after it; the page then samples that timeline in
// COLUMNS columns. Each of the DRAWN allocations that
// cover the most area (bytes x events) is a polygon stacked in allocation order (as a
// stack: when an older allocation goes, the newer ones above it move down); the rest of the
// live bytes form one grey area beneath them.
#include "trace_view.h"
#include "counting_upstream.h"
#include "printable.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COLUMNS 600
#define DRAWN   200
#define WIDTH   1200.0
#define HEIGHT  520.0
#define LEFT    90.0
#define TOP     20.0

typedef struct allocation {
  uint64_t size;
  size_t born, died; // event indices; died == event count when never freed
  int refused;
  int drawn;
} allocation;

typedef struct timeline {
  allocation *allocations; // index = id - 1 (ids come as 1, 2, 3, ...)
  size_t count, capacity;
  uint64_t *live, *reserved; // after each event
  size_t event_count, event_capacity;
  uint64_t live_now, peak_live, peak_reserved;
  size_t peak_live_at, peak_reserved_at;
  const devbuf_counting_upstream *counts;
  int out_of_memory;
} timeline;

static int grow(void **items, size_t *capacity, size_t count, size_t item_size) {
  if (count < *capacity) return 1;
  size_t bigger = *capacity ? 2 * *capacity : 1024;
  void *grown = realloc(*items, bigger * item_size);
  if (!grown) return 0;
  *items = grown;
  *capacity = bigger;
  return 1;
}

// The replay's observer: one event per record, with the bytes live and reserved after it.
static void on_record(void *context, uint64_t id, uint64_t size, int refused) {
  timeline *t = context;
  size_t capacity = t->event_capacity; // `live` and `reserved` grow alike: one capacity for both
  if (t->out_of_memory || !grow((void **)&t->live, &capacity, t->event_count, sizeof *t->live) ||
      !grow((void **)&t->reserved, &t->event_capacity, t->event_count, sizeof *t->reserved) ||
      (size && !grow((void **)&t->allocations, &t->capacity, t->count, sizeof *t->allocations))) {
    t->out_of_memory = 1;
    return;
  }
  size_t e = t->event_count++;
  if (size) {
    t->allocations[t->count++] =
        (allocation){.size = size, .born = e, .died = SIZE_MAX, .refused = refused};
    if (!refused) t->live_now += size;
  } else {
    allocation *a = &t->allocations[id - 1];
    a->died = e;
    if (!refused) t->live_now -= a->size;
  }
  t->live[e] = t->live_now;
  t->reserved[e] = t->counts->held;
  if (t->live_now > t->peak_live) t->peak_live = t->live_now, t->peak_live_at = e;
  if (t->counts->held > t->peak_reserved)
    t->peak_reserved = t->counts->held, t->peak_reserved_at = e;
}

static int by_area(const void *a, const void *b, void *context) {
  const allocation *all = context;
  const allocation *x = &all[*(const size_t *)a], *y = &all[*(const size_t *)b];
  double ax = (double)x->size * (double)(x->died - x->born),
         ay = (double)y->size * (double)(y->died - y->born);
  return (ax < ay) - (ax > ay);
}

// Marks the DRAWN allocations that cover the most area.
static void choose_drawn(timeline *t) {
  size_t *order = malloc((t->count ? t->count : 1) * sizeof *order);
  if (!order) return;
  for (size_t i = 0; i < t->count; i++) order[i] = i;
  qsort_r(order, t->count, sizeof *order, by_area, t->allocations);
  for (size_t i = 0; i < t->count && i < DRAWN; i++)
    if (!t->allocations[order[i]].refused) t->allocations[order[i]].drawn = 1;
  free(order);
}

static double x_of(size_t event, size_t events) {
  return LEFT + WIDTH * (double)event / (double)(events ? events : 1);
}
static double y_of(uint64_t bytes, uint64_t top) {
  return TOP + HEIGHT - HEIGHT * (double)bytes / (double)top;
}

// The event that column `c` shows: the state after it.
static size_t column_event(size_t c, size_t events) {
  return (c + 1) * events / COLUMNS - ((c + 1) * events >= COLUMNS);
}

static void write_page(FILE *out, const char *path, const timeline *t) {
  size_t events = t->event_count;
  uint64_t top = t->peak_reserved > t->peak_live ? t->peak_reserved : t->peak_live;
  if (!top) top = 1;
  char safe_path[1024];
  devbuf_tool_printable(path, safe_path, sizeof safe_path);
  fprintf(out, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>devbuf trace: ");
  for (const char *c = safe_path; *c; c++)
    fputs(*c == '<' ? "&lt;" : *c == '&' ? "&amp;" : (char[]){*c, 0}, out);
  fprintf(out, "</title>\n<style>body{font:14px sans-serif;margin:16px} .figure{font-weight:bold}"
               " svg text{font:12px sans-serif}</style></head><body>\n");
  fprintf(
      out,
      "<h1>Allocation trace</h1>\n<p>%zu allocations, %zu events. Live bytes stacked by allocation "
      "(the %d that cover the most area in colour, the rest grey); reserved bytes (a caching "
      "allocator "
      "over a counting upstream) as the red line.</p>\n",
      t->count, events, DRAWN);
  fprintf(out,
          "<p>peak live <span class=\"figure\" id=\"peak-live\" data-bytes=\"%" PRIu64 "\">%" PRIu64
          "</span> bytes at event %zu; peak reserved <span class=\"figure\" id=\"peak-reserved\" "
          "data-bytes=\"%" PRIu64 "\">%" PRIu64 "</span> bytes at event %zu</p>\n",
          t->peak_live, t->peak_live, t->peak_live_at, t->peak_reserved, t->peak_reserved,
          t->peak_reserved_at);
  fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\">\n",
          LEFT + WIDTH + 20, TOP + HEIGHT + 50);
  // Axes and a scale in GiB / MiB.
  double unit = top >= ((uint64_t)4 << 30) ? 1073741824.0 : 1048576.0;
  const char *unit_name = unit > 2e6 ? "GiB" : "MiB";
  for (int tick = 0; tick <= 4; tick++) {
    double bytes = (double)top * tick / 4, y = y_of((uint64_t)bytes, top);
    fprintf(out,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"4\" "
            "y=\"%.1f\">%.2f %s"
            "</text>\n",
            LEFT, y, LEFT + WIDTH, y, y + 4, bytes / unit, unit_name);
  }
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\">events (allocations and frees, in order)</text>\n",
          LEFT, TOP + HEIGHT + 30);
  // Grey: all live bytes, sampled per column.
  fprintf(out, "<polygon fill=\"#ccc\" points=\"%.1f,%.1f", LEFT, y_of(0, top));
  for (size_t c = 0; c < COLUMNS && events; c++) {
    size_t e = column_event(c, events);
    fprintf(out, " %.1f,%.1f", x_of(e + 1, events), y_of(t->live[e], top));
  }
  fprintf(out, " %.1f,%.1f\"><title>smaller allocations</title></polygon>\n", LEFT + WIDTH,
          y_of(0, top));
  // The drawn allocations: per column, each one's base is the live bytes below it.
  uint64_t *bases = calloc((size_t)COLUMNS * DRAWN + 1, sizeof *bases);
  size_t *drawn = calloc(DRAWN + 1, sizeof *drawn), drawn_count = 0;
  for (size_t i = 0; bases && drawn && i < t->count; i++)
    if (t->allocations[i].drawn) drawn[drawn_count++] = i;
  for (size_t c = 0; bases && drawn && c < COLUMNS && events; c++) {
    size_t e = column_event(c, events);
    uint64_t below = 0;
    size_t next_drawn = 0;
    for (size_t i = 0; i < t->count; i++) { // in allocation order: older below newer
      const allocation *a = &t->allocations[i];
      int alive = !a->refused && a->born <= e && e < a->died;
      if (a->drawn) bases[c * DRAWN + next_drawn++] = alive ? below : UINT64_MAX;
      if (alive) below += a->size;
    }
  }
  for (size_t d = 0; bases && drawn && d < drawn_count; d++) {
    const allocation *a = &t->allocations[drawn[d]];
    unsigned hue = (unsigned)(drawn[d] * 137u % 360u);
    fprintf(out,
            "<polygon fill=\"hsl(%u,60%%,60%%)\" stroke=\"hsl(%u,60%%,40%%)\" stroke-width=\"0.3\" "
            "points=\"",
            hue, hue);
    size_t first = SIZE_MAX, last = 0;
    for (size_t c = 0; c < COLUMNS; c++) {
      if (bases[c * DRAWN + d] == UINT64_MAX) continue;
      if (first == SIZE_MAX) first = c;
      last = c;
    }
    if (first == SIZE_MAX) { // shorter than a column: a sliver where it was born
      double x = x_of(a->born, events);
      fprintf(out, "%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f", x, y_of(0, top), x + 1, y_of(0, top),
              x + 1, y_of(a->size, top), x, y_of(a->size, top));
    } else {
      for (size_t c = first; c <= last; c++)
        if (bases[c * DRAWN + d] != UINT64_MAX)
          fprintf(out, "%.1f,%.1f ", x_of(column_event(c, events) + 1, events),
                  y_of(bases[c * DRAWN + d] + a->size, top));
      for (size_t c = last + 1; c-- > first;)
        if (bases[c * DRAWN + d] != UINT64_MAX)
          fprintf(out, "%.1f,%.1f ", x_of(column_event(c, events) + 1, events),
                  y_of(bases[c * DRAWN + d], top));
    }
    fprintf(out,
            "\"><title>allocation %zu: %" PRIu64
            " bytes, from event %zu to %s%zu (%zu events)</title></polygon>\n",
            drawn[d] + 1, a->size, a->born, a->died == events ? "the end, never freed, " : "",
            a->died, a->died - a->born);
  }
  free(bases);
  free(drawn);
  // Reserved bytes: the highest value in each column, so that no peak hides between samples.
  fprintf(out, "<polyline fill=\"none\" stroke=\"#c00\" stroke-width=\"1.5\" points=\"");
  for (size_t c = 0, e = 0; c < COLUMNS && events; c++) {
    size_t end = column_event(c, events);
    uint64_t highest = 0;
    for (; e <= end; e++)
      if (t->reserved[e] > highest) highest = t->reserved[e];
    fprintf(out, "%.1f,%.1f ", x_of(end + 1, events), y_of(highest, top));
  }
  fprintf(out, "\"><title>reserved bytes</title></polyline>\n");
  // The peaks.
  double live_x = x_of(t->peak_live_at + 1, events),
         reserved_x = x_of(t->peak_reserved_at + 1, events);
  fprintf(out,
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" "
          "stroke-dasharray=\"4 3\"/>"
          "<text x=\"%.1f\" y=\"%.1f\">peak live %.2f %s</text>\n",
          live_x, TOP, live_x, TOP + HEIGHT, live_x + 4, y_of(t->peak_live, top) + 14,
          (double)t->peak_live / unit, unit_name);
  fprintf(out,
          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#c00\"><title>peak reserved: %" PRIu64
          " bytes</title></circle><text x=\"%.1f\" y=\"%.1f\" fill=\"#c00\">peak reserved %.2f "
          "%s</text>\n",
          reserved_x, y_of(t->peak_reserved, top), t->peak_reserved, reserved_x + 6,
          y_of(t->peak_reserved, top) - 6, (double)t->peak_reserved / unit, unit_name);
  fprintf(out, "</svg>\n</body></html>\n");
}

int devbuf_tool_trace_view(devbuf_device_t *device, const char *path, const char *page) {
  devbuf_counting_upstream counts;
  timeline t = {.counts = &counts};
  char safe[1024];
  int code = 1;
  devbuf_allocator_t *caching = NULL;
  devbuf_trace_summary_t summary;
  devbuf_status status = devbuf_tool_counting_caching(device, NULL, &counts, &caching);
  if (status == DEVBUF_OK)
    status = devbuf_trace_replay_observed(path, caching, on_record, &t, &summary);
  if (status != DEVBUF_OK) {
    devbuf_tool_report("trace", NULL);
  } else if (t.out_of_memory) {
    fprintf(stderr, "devbuf trace: no memory to draw %s\n", DEVBUF_PRINTABLE(path, safe));
  } else {
    for (size_t i = 0; i < t.count; i++)
      if (t.allocations[i].died == SIZE_MAX) t.allocations[i].died = t.event_count; // never freed
    choose_drawn(&t);
    FILE *out = fopen(page, "w");
    if (!out) {
      fprintf(stderr, "devbuf trace: cannot write %s\n", DEVBUF_PRINTABLE(page, safe));
    } else {
      write_page(out, path, &t);
      code = fclose(out) == 0 ? 0 : 1;
      printf("wrote %s: peak live %" PRIu64 " bytes, peak reserved %" PRIu64 " bytes\n",
             DEVBUF_PRINTABLE(page, safe), t.peak_live, t.peak_reserved);
    }
  }
  devbuf_allocator_release(caching);
  free(t.allocations);
  free(t.live);
  free(t.reserved);
  return code;
}
