// The caching allocator on real PyTorch training and inference runs: every trace of a
// folder like tests/data/traces (a sub-folder per source, each with *.trace files and the
// figures.json of PyTorch's own CUDA caching allocator, CCA) replayed over a counting
// upstream at a CUDA device's 2 MiB page and at the CPU's 4 KiB one, without a limit and
// at a memory limit of CCA's peak. Memory figures, not timings: they are exact, so one run
// says all.
#include "bench.h"
#include "counting_upstream.h"
#include "printable.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct cca_figures {
  char trace[256];
  uint64_t peak_reserved, system_allocs;
  bool expandable; // CCA ran with expandable segments (its allocator_settings say so)
} cca_figures;

// The number after `"key": ` at or after `from`, before `until`; false if none.
static bool number_after(const char *from, const char *until, const char *key, uint64_t *out) {
  char needle[64];
  snprintf(needle, sizeof needle, "\"%s\": ", key);
  const char *at = strstr(from, needle);
  if (!at || (until && at > until)) return false;
  char *end = NULL;
  *out = strtoull(at + strlen(needle), &end, 10);
  return end != at + strlen(needle);
}

// Says on stdout, in the table, and on stderr, where --json leaves it seen, what could not
// be measured; counts it in `*failures`.
static void failed(int *failures, const char *format, ...) __attribute__((format(printf, 2, 3)));
static void failed(int *failures, const char *format, ...) {
  char text[8192];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof text, format, args);
  va_end(args);
  printf("   (%s)\n", text);
  fprintf(stderr, "devbuf bench: %s\n", text);
  (*failures)++;
}

// Whether `"key": true` is at or after `from`, before `until`.
static bool true_after(const char *from, const char *until, const char *key) {
  char needle[64];
  snprintf(needle, sizeof needle, "\"%s\": true", key);
  const char *at = strstr(from, needle);
  return at && (!until || at < until);
}

// The entries of a figures.json (written by the traces' converter: one `"trace": "NAME"`
// per entry, its numbers after it). Returns how many were read, at most `capacity`; a file
// that cannot be read, and an entry without both figures, are failures.
static size_t read_figures(const char *path, cca_figures *out, size_t capacity, int *failures) {
  char why[160], safe[4 * 4096], safe_name[4 * sizeof out->trace];
  FILE *file = devbuf_tool_open_regular(path, why, sizeof why); // a FIFO never blocks
  if (!file) {
    failed(failures, "cannot read %s: %s", DEVBUF_PRINTABLE(path, safe), why);
    return 0;
  }
  static char text[1 << 20];
  size_t length = fread(text, 1, sizeof text - 1, file);
  bool whole = length < sizeof text - 1 || getc(file) == EOF;
  fclose(file);
  text[length] = '\0';
  if (!whole) {
    failed(failures, "%s is over %zu bytes", DEVBUF_PRINTABLE(path, safe), sizeof text - 1);
    return 0;
  }
  size_t count = 0, entries = 0;
  const char *at = strstr(text, "\"trace\": \"");
  for (; at && count < capacity; at = strstr(at + 1, "\"trace\": \"")) {
    const char *name = at + strlen("\"trace\": \"");
    const char *next = strstr(name, "\"trace\": \"");
    const char *quote = strchr(name, '"');
    cca_figures *f = &out[count];
    entries++;
    if (quote && (size_t)(quote - name) < sizeof f->trace) {
      memcpy(f->trace, name, (size_t)(quote - name));
      f->trace[quote - name] = '\0';
      if (number_after(name, next, "cca_peak_reserved", &f->peak_reserved) &&
          number_after(name, next, "cca_system_allocs", &f->system_allocs)) {
        f->expandable = true_after(name, next, "expandable_segments");
        count++;
      } else
        failed(failures, "%s: the entry of %s lacks cca_peak_reserved or cca_system_allocs",
               DEVBUF_PRINTABLE(path, safe), DEVBUF_PRINTABLE(f->trace, safe_name));
    } else {
      failed(failures, "%s: a trace name without its end, or over %zu bytes",
             DEVBUF_PRINTABLE(path, safe), sizeof f->trace - 1);
    }
  }
  if (at)
    failed(failures, "%s: entries past the first %zu left out", DEVBUF_PRINTABLE(path, safe),
           capacity);
  if (!entries)
    failed(failures, "%s names no trace (no \"trace\": \"NAME\" entry)",
           DEVBUF_PRINTABLE(path, safe));
  return count;
}

typedef struct replay_result {
  bool ok;
  uint64_t peak_requested, peak_reserved, system_allocs, refused, second_pass_allocs;
} replay_result;

static replay_result replay(devbuf_device_t *device, devbuf_tool_policy policy, const char *path,
                            uint64_t page, uint64_t limit, bool growable) {
  replay_result result = {0};
  devbuf_caching_options_t options = {
      .page_size = page, .memory_limit = limit, .growable = growable};
  devbuf_counting_upstream counts = {0};
  devbuf_allocator_t *allocator = NULL;
  devbuf_trace_summary_t summary;
  if (devbuf_tool_counting_policy(device, policy, &options, &counts, &allocator) != DEVBUF_OK ||
      devbuf_trace_replay(path, allocator, &summary) != DEVBUF_OK) {
    devbuf_allocator_release(allocator);
    return result;
  }
  result = (replay_result){true,          summary.peak_live_bytes, counts.peak_held,
                           counts.allocs, summary.failed_allocs,   0};
  if (devbuf_trace_replay(path, allocator, &summary) ==
      DEVBUF_OK) { // into what the first pass left cached
    result.second_pass_allocs = counts.allocs - result.system_allocs;
    result.refused += summary.failed_allocs;
  }
  devbuf_allocator_release(allocator);
  return result;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int bench_traces(const bench_config *config) {
  const char *folder = config->traces ? config->traces : "tests/data/traces";
  // Folders, file names and messages come from the file system and figures.json: escaped,
  // as everything the tool prints from a file or a path.
  static char safe[4 * 4096];
  printf("== real allocation traces (%s): devbuf's caching allocator against PyTorch's (CCA) ==\n",
         DEVBUF_PRINTABLE(folder, safe));
  DIR *dir = opendir(folder);
  if (!dir) {
    int error = errno;
    printf("   (skipped: cannot open the folder %s: %s; run from the repository root or pass "
           "--traces DIR)\n\n",
           DEVBUF_PRINTABLE(folder, safe), strerror(error));
    if (config->traces) // named on purpose: not there to measure is a failure, not a skip
      fprintf(stderr, "devbuf bench: cannot open the folder %s: %s\n",
              DEVBUF_PRINTABLE(folder, safe), strerror(error));
    return config->traces ? 1 : 0;
  }
  char *sources[64];
  size_t source_count = 0, sources_left_out = 0;
  for (struct dirent *entry; (entry = readdir(dir));) {
    char path[4096];
    struct stat info;
    snprintf(path, sizeof path, "%s/%s", folder, entry->d_name);
    if (entry->d_name[0] == '.' || stat(path, &info) != 0 || !S_ISDIR(info.st_mode)) continue;
    char *source = source_count < 64 ? strdup(entry->d_name) : NULL; // a folder per source
    if (source)
      sources[source_count++] = source;
    else
      sources_left_out++;
  }
  closedir(dir);
  qsort(sources, source_count, sizeof *sources, by_name);
  // Each trace's whole name on a line of its own, its two rows (one per page) under it: the
  // names (source folder / file) are too long for a column, and cut they lose what tells
  // them apart.
  printf("   %-7s %5s %9s %7s %7s %6s %11s | %-26s | %s\n", "", "", "", "", "", "", "",
         "at CCA's peak:", "growable segments:");
  printf("   %-7s %5s %9s %7s %7s %6s %11s | %7s %9s %8s | %7s %6s %9s %4s\n", "trace:", "page",
         "requested", "CCA", "devbuf", "ratio", "sys/CCA", "refused", "sys/CCA", "pass 2", "devbuf",
         "/req", "maps/CCA", "ref");
  int met = 0, rows = 0, growable_rows = 0, failures = 0;
  double worst_ratio = 0;
  if (sources_left_out)
    failed(&failures, "%zu source folders of %s left out: 64 are measured at most",
           sources_left_out, DEVBUF_PRINTABLE(folder, safe));
  for (size_t s = 0; s < source_count; s++) {
    char path[4096];
    int length = snprintf(path, sizeof path, "%s/%s/figures.json", folder, sources[s]);
    if (length < 0 || (size_t)length >= sizeof path) {
      failed(&failures, "the path of %s's figures.json is too long",
             DEVBUF_PRINTABLE(sources[s], safe));
      continue;
    }
    static cca_figures figures[64];
    size_t count = read_figures(path, figures, 64, &failures);
    for (size_t t = 0; t < count; t++) {
      char name[600];
      length = snprintf(name, sizeof name, "%s/%s", sources[s], figures[t].trace);
      int path_length =
          snprintf(path, sizeof path, "%s/%s/%s", folder, sources[s], figures[t].trace);
      if (length < 0 || (size_t)length >= sizeof name || path_length < 0 ||
          (size_t)path_length >= sizeof path) {
        failed(&failures, "the path of %s is too long", DEVBUF_PRINTABLE(name, safe));
        continue;
      }
      // A run whose CCA had expandable segments (pages mapped into one segment per pool)
      // is set against devbuf's growable segments on every column: fixed segments strand
      // what a split leaves, where its did not. Its system allocations are no target then:
      // the snapshot counts CCA's segments, not the pages it mapped into them.
      bool expandable = figures[t].expandable;
      printf("   %s%s\n", DEVBUF_PRINTABLE(name, safe),
             expandable ? " (CCA ran with expandable segments: devbuf's growable ones in every "
                          "column)"
                        : "");
      for (int p = 0; p < 2; p++) {
        uint64_t page = p == 0 ? (uint64_t)2 << 20 : 4096;
        uint64_t limit = figures[t].peak_reserved;
        replay_result free_run =
            replay(config->device, DEVBUF_TOOL_POLICY_DEVBUF, path, page, 0, expandable);
        replay_result limited =
            replay(config->device, DEVBUF_TOOL_POLICY_DEVBUF, path, page, limit, expandable);
        // What PyTorch's allocator does at the same limit is known only from its model (the
        // traces' figures are of runs without one), replayed the same way from nothing.
        replay_result cca_limited =
            replay(config->device, DEVBUF_TOOL_POLICY_CCA, path, page, limit, false);
        replay_result growing =
            replay(config->device, DEVBUF_TOOL_POLICY_DEVBUF, path, page, 0, true);
        // The growable target: nothing refused at 2% over what the program asks at its peak.
        uint64_t tight = free_run.peak_requested + free_run.peak_requested / 50;
        replay_result growing_limited =
            replay(config->device, DEVBUF_TOOL_POLICY_DEVBUF, path, page, tight, true);
        if (!free_run.ok || !limited.ok || !cca_limited.ok || !growing.ok || !growing_limited.ok) {
          char safe_name[sizeof name * 4];
          DEVBUF_PRINTABLE(devbuf_last_error(), safe);
          printf("   %-7s %5s cannot be replayed: %s\n", "", p == 0 ? "2 MiB" : "4 KiB", safe);
          fprintf(stderr, "devbuf bench: %s at the %s page cannot be replayed: %s\n",
                  DEVBUF_PRINTABLE(name, safe_name), p == 0 ? "2 MiB" : "4 KiB", safe);
          failures++;
          continue;
        }
        double ratio = (double)free_run.peak_reserved / (double)figures[t].peak_reserved;
        bool calls_met =
            expandable || (free_run.system_allocs <= figures[t].system_allocs &&
                           limited.system_allocs <= cca_limited.system_allocs &&
                           limited.second_pass_allocs <= cca_limited.second_pass_allocs);
        bool row_met = ratio <= 1.03 && limited.refused == 0 && calls_met;
        double growable_ratio = (double)growing.peak_reserved / (double)growing.peak_requested;
        bool growable_met = growing.peak_reserved <= figures[t].peak_reserved &&
                            growable_ratio <= 1.02 && growing_limited.refused == 0;
        growable_rows += growable_met;
        rows++;
        met += row_met;
        if (ratio > worst_ratio) worst_ratio = ratio;
        char at_limit[32], second[32], maps[32];
        snprintf(at_limit, sizeof at_limit, "%llu/%llu", (unsigned long long)limited.system_allocs,
                 (unsigned long long)cca_limited.system_allocs);
        snprintf(second, sizeof second, "%llu/%llu", (unsigned long long)limited.second_pass_allocs,
                 (unsigned long long)cca_limited.second_pass_allocs);
        snprintf(maps, sizeof maps, "%llu/%llu", (unsigned long long)growing.system_allocs,
                 (unsigned long long)figures[t].system_allocs);
        printf("   %-7s %5s %9.3f %7.3f %7.3f %6.3f %5llu/%-5llu | %7llu %9s %8s%s| %7.3f %6.3f "
               "%9s %4llu%s\n",
               "", p == 0 ? "2 MiB" : "4 KiB", (double)free_run.peak_requested / (1 << 30),
               (double)figures[t].peak_reserved / (1 << 30),
               (double)free_run.peak_reserved / (1 << 30), ratio,
               (unsigned long long)free_run.system_allocs,
               (unsigned long long)figures[t].system_allocs, (unsigned long long)limited.refused,
               at_limit, second, row_met ? " " : "*", (double)growing.peak_reserved / (1 << 30),
               growable_ratio, maps, (unsigned long long)growing_limited.refused,
               growable_met ? "" : " *");
        char figure[700];
        snprintf(figure, sizeof figure, "%s %s peak reserved / CCA", name,
                 p == 0 ? "2 MiB" : "4 KiB");
        bench_figure("traces", figure, ratio, "x", ratio <= 1.03);
        snprintf(figure, sizeof figure, "%s %s system allocations / CCA", name,
                 p == 0 ? "2 MiB" : "4 KiB");
        if (!expandable)
          bench_figure("traces", figure,
                       (double)free_run.system_allocs / (double)figures[t].system_allocs, "x",
                       free_run.system_allocs <= figures[t].system_allocs);
        snprintf(figure, sizeof figure, "%s %s refused at CCA's peak", name,
                 p == 0 ? "2 MiB" : "4 KiB");
        bench_figure("traces", figure, (double)limited.refused, "requests", limited.refused == 0);
        snprintf(figure, sizeof figure, "%s %s growable peak reserved / peak requested", name,
                 p == 0 ? "2 MiB" : "4 KiB");
        bench_figure("traces", figure, growable_ratio, "x", growable_met);
      }
    }
  }
  for (size_t s = 0; s < source_count; s++) free(sources[s]);
  printf(
      "   GiB = 2^30 bytes. ratio: devbuf's peak reserved / CCA's, without a limit; sys/CCA: "
      "devbuf's\n"
      "   system allocations / CCA's in the traces' README. At a memory limit of CCA's peak: the "
      "requests\n"
      "   devbuf refused (both passes), and the system allocations of a first pass and of a "
      "second pass\n"
      "   into the same cache, devbuf's / those of the model of CCA (tools/cca_model.h) replayed "
      "at the\n"
      "   same limit. Targets per row: ratio <= 1.03, sys <= CCA's without and at the limit, "
      "nothing\n"
      "   refused (* marks a miss). Growable segments: peak mapped in GiB and / peak requested, "
      "map calls\n"
      "   beside CCA's system allocations, requests refused at a limit of 1.02 x peak requested; "
      "targets:\n"
      "   <= CCA's peak, <= 1.02 x requested, nothing refused. Where CCA ran with expandable "
      "segments,\n"
      "   every column has devbuf's growable ones, and system allocations are no target.\n");
  printf(
      "   %d of %d rows meet every target; worst ratio %.3f; with growable segments %d of %d\n\n",
      met, rows, worst_ratio, growable_rows, rows);
  return failures;
}
