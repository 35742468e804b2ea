// devbuf trace replay FILE: plays an allocation trace against a caching allocator over a
// counting upstream (no memory behind it) and prints what the allocator did; devbuf trace
// view FILE -o PAGE.html draws it (trace_view.c). A PyTorch memory snapshot (a pickle) is
// converted to a trace first (snapshot_reader.c).
#include "commands.h"
#include "counting_upstream.h"
#include "trace_extras.h"
#include "trace_view.h"
#include "devbuf.h"
#include "printable.h"
#include "sizes.h"
#include "usage.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// What each pass of a replay added: its system allocations and refusals. Every other figure
// covers all the passes (counts summed, peaks the highest), as the allocator's statistics
// and the upstream's counts do: a line that mixed one pass's requests with every pass's
// cache hits showed more hits than requests.
typedef struct pass_figures {
  uint64_t system_allocs, refused;
} pass_figures;

// Sizes in binary units first, the exact bytes after them (--json has exact bytes only).
static const char *size_text(uint64_t bytes, char *out, size_t capacity) {
  char human[32], exact[32];
  if (bytes < 1024) {
    snprintf(out, capacity, "%llu bytes", (unsigned long long)bytes);
  } else {
    snprintf(out, capacity, "%s (%s bytes)", devbuf_tool_human_size(bytes, human, sizeof human),
             devbuf_tool_grouped(bytes, exact, sizeof exact));
  }
  return out;
}

// `growable`: 0 plain segments, 1 growable ones, 2 growable as the snapshot's run had.
static void print_text(const char *path, const char *spec, devbuf_tool_policy policy, uint64_t page,
                       int growable, const devbuf_trace_summary_t *summary,
                       const devbuf_allocator_stats_t *stats,
                       const devbuf_counting_upstream *counts, const pass_figures *passes,
                       int pass_count) {
  char safe_path[1024], safe_spec[64], page_text[32], a[32], b[32], c[32], d[32];
  char requested[80], reserved[80], allocator_peak[80];
  char over[48] = "";
  if (pass_count > 1) snprintf(over, sizeof over, ", %d passes into one cache", pass_count);
  printf("replayed %s with %s%s, %s page%s%s: %s allocations, %s frees, %s refused, %s "
         "never freed\n",
         DEVBUF_PRINTABLE(path, safe_path),
         policy == DEVBUF_TOOL_POLICY_CCA ? "the model of PyTorch's caching allocator"
                                          : DEVBUF_PRINTABLE(spec, safe_spec),
         policy == DEVBUF_TOOL_POLICY_CCA ? "" : "'s policy",
         devbuf_tool_human_size(page, page_text, sizeof page_text),
         growable == 2 ? ", growable segments as PyTorch's expandable ones in the run "
                         "(--no-growable: plain)"
         : growable    ? ", growable segments"
                       : "",
         over, devbuf_tool_grouped(summary->allocs, a, sizeof a),
         devbuf_tool_grouped(summary->frees, b, sizeof b),
         devbuf_tool_grouped(summary->failed_allocs, c, sizeof c),
         devbuf_tool_grouped(summary->leaked, d, sizeof d));
  if (summary->cache_clears)
    printf("  %s cache clears replayed (\"# E\" lines: the traced allocator gave its cache "
           "back there)\n",
           devbuf_tool_grouped(summary->cache_clears, a, sizeof a));
  printf("  peak requested  %s\n",
         size_text(summary->peak_live_bytes, requested, sizeof requested));
  printf("  peak reserved   %s\n", size_text(counts->peak_held, reserved, sizeof reserved));
  printf("  allocator peak  %s, requests as the allocator rounds them\n",
         size_text(stats->peak, allocator_peak, sizeof allocator_peak));
  printf("  %s system allocations, %s system frees, %s cache hits\n",
         devbuf_tool_grouped(stats->system_allocs, a, sizeof a),
         devbuf_tool_grouped(stats->system_frees, b, sizeof b),
         devbuf_tool_grouped(stats->cache_hits, c, sizeof c));
  for (int i = 0; pass_count > 1 && i < pass_count; i++)
    printf("  pass %d: %s system allocations, %s refused\n", i + 1,
           devbuf_tool_grouped(passes[i].system_allocs, a, sizeof a),
           devbuf_tool_grouped(passes[i].refused, b, sizeof b));
}

static void print_json(const char *path, const char *spec, devbuf_tool_policy policy, uint64_t page,
                       bool growable, const devbuf_trace_summary_t *summary,
                       const devbuf_allocator_stats_t *stats,
                       const devbuf_counting_upstream *counts, const pass_figures *passes,
                       int pass_count, const devbuf_tool_trace_extras *extras) {
  printf("{\"policy\": \"%s\", \"page_bytes\": %llu, \"growable\": %s, \"file\": ",
         devbuf_tool_policy_name(policy), (unsigned long long)page, growable ? "true" : "false");
  devbuf_tool_json_string(path, stdout);
  printf(", \"device\": ");
  devbuf_tool_json_string(spec, stdout);
  printf(", \"allocs\": %llu, \"frees\": %llu, \"refused\": %llu, \"never_freed\": %llu, "
         "\"peak_requested_bytes\": %llu, \"peak_reserved_bytes\": %llu, \"allocator_peak_bytes\": "
         "%llu, "
         "\"system_allocs\": %llu, \"system_frees\": %llu, \"cache_hits\": %llu, "
         "\"cache_clears\": %llu, \"passes\": [",
         (unsigned long long)summary->allocs, (unsigned long long)summary->frees,
         (unsigned long long)summary->failed_allocs, (unsigned long long)summary->leaked,
         (unsigned long long)summary->peak_live_bytes, (unsigned long long)counts->peak_held,
         (unsigned long long)stats->peak, (unsigned long long)stats->system_allocs,
         (unsigned long long)stats->system_frees, (unsigned long long)stats->cache_hits,
         (unsigned long long)summary->cache_clears);
  for (int i = 0; i < pass_count; i++)
    printf("%s{\"system_allocs\": %llu, \"refused\": %llu}", i ? ", " : "",
           (unsigned long long)passes[i].system_allocs, (unsigned long long)passes[i].refused);
  printf("]");
  devbuf_tool_trace_extras_json(extras, stdout);
  printf("}\n");
}

int devbuf_cmd_trace(int argc, char **argv) {
  const char *path = NULL, *spec = "cpu", *html_path = NULL, *subcommand = NULL;
  devbuf_caching_options_t options = {0};
  int json = 0, pass_count = 1, least_limit = 0, cuda_device = 0, cuda_device_given = 0;
  int growable = -1; // -1: as the run a snapshot records (plain for a trace)
  devbuf_tool_policy policy = DEVBUF_TOOL_POLICY_DEVBUF;
  for (int i = 1; i < argc; i++) {
    char safe[256];
    if (devbuf_tool_wants_help(argv[i])) return devbuf_tool_help("trace");
    if (!subcommand && (strcmp(argv[i], "replay") == 0 || strcmp(argv[i], "view") == 0)) {
      subcommand = argv[i];
    } else if (!subcommand) {
      return devbuf_tool_misuse("trace", "unknown subcommand '%s'",
                                DEVBUF_PRINTABLE(argv[i], safe));
    } else if (strcmp(argv[i], "--json") == 0 && subcommand[0] == 'r') {
      json = 1;
    } else if (strcmp(argv[i], "-o") == 0 && subcommand[0] == 'v') {
      if (++i == argc) return devbuf_tool_misuse("trace", "-o needs the path of the page to write");
      html_path = argv[i];
    } else if (strcmp(argv[i], "--device") == 0) {
      if (++i == argc)
        return devbuf_tool_misuse("trace", "--device needs a device, such as cpu or opencl:0");
      spec = argv[i];
    } else if (strcmp(argv[i], "--policy") == 0 && subcommand[0] == 'r') {
      if (++i == argc || !devbuf_tool_policy_named(argv[i], &policy))
        return devbuf_tool_misuse("trace", "--policy takes devbuf or cca, not '%s'",
                                  DEVBUF_PRINTABLE(i < argc ? argv[i] : "", safe));
    } else if (strcmp(argv[i], "--least-limit") == 0 && subcommand[0] == 'r') {
      least_limit = 1;
    } else if ((strcmp(argv[i], "--growable") == 0 || strcmp(argv[i], "--no-growable") == 0) &&
               subcommand[0] == 'r') {
      growable = strcmp(argv[i], "--growable") == 0;
    } else if (strcmp(argv[i], "--cuda-device") == 0) {
      long number;
      int misuse = devbuf_tool_count_option("trace", "--cuda-device",
                                            i + 1 < argc ? argv[++i] : NULL, 0, 1023, &number);
      if (misuse) return misuse;
      cuda_device = (int)number;
      cuda_device_given = 1;
    } else if (strcmp(argv[i], "--passes") == 0 && subcommand[0] == 'r') {
      long count;
      int misuse = devbuf_tool_count_option("trace", "--passes", i + 1 < argc ? argv[++i] : NULL, 1,
                                            100, &count);
      if (misuse) return misuse;
      pass_count = (int)count;
    } else if (strcmp(argv[i], "--memory-limit") == 0 || strcmp(argv[i], "--page") == 0) {
      const char *option = argv[i];
      uint64_t bytes;
      bool page = option[2] == 'p'; // the library takes pages from 4 KiB to 1 GiB
      int misuse =
          devbuf_tool_size_option("trace", option, i + 1 < argc ? argv[++i] : NULL, page ? 4096 : 0,
                                  page ? (uint64_t)1 << 30 : UINT64_MAX, &bytes);
      if (misuse) return misuse;
      if (!page && bytes == 0) // the library reads a limit of 0 as none: say so, not replay
        return devbuf_tool_misuse("trace",
                                  "--memory-limit takes at least 1 byte, not '%s' (a limit of 0 "
                                  "would be none: leave the option out for no limit)",
                                  DEVBUF_PRINTABLE(argv[i], safe));
      if (page && (bytes & (bytes - 1)))
        return devbuf_tool_misuse("trace",
                                  "--page takes a power of two from 4 KiB to 1 GiB, not '%s' (%llu "
                                  "bytes)",
                                  DEVBUF_PRINTABLE(argv[i], safe), (unsigned long long)bytes);
      *(option[2] == 'p' ? &options.page_size : &options.memory_limit) = bytes;
    } else if (!path && argv[i][0] != '-') {
      path = argv[i];
    } else {
      return devbuf_tool_misuse("trace", "%s '%s'",
                                argv[i][0] == '-' ? "unknown option" : "one FILE only, not also",
                                DEVBUF_PRINTABLE(argv[i], safe));
    }
  }
  if (!subcommand || !path)
    return devbuf_tool_misuse("trace", "replay or view, and a trace FILE, are needed");
  if (subcommand[0] == 'v' && !html_path)
    return devbuf_tool_misuse("trace", "view needs -o PAGE.html");
  if (policy == DEVBUF_TOOL_POLICY_CCA && (growable >= 0 || options.page_size))
    return devbuf_tool_misuse("trace", "--policy cca is PyTorch's default policy: it takes "
                                       "none of --growable, --no-growable, --page");
  // The library's messages cut a path at 200 characters, which can leave the name of a
  // folder that exists: a file that cannot be opened is reported here, its path whole.
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int error = errno;
    size_t capacity = 4 * strlen(path) + 1; // \xNN at most for each byte
    char *safe = malloc(capacity);
    fprintf(stderr, "devbuf trace: cannot open '%s': %s\n",
            safe ? devbuf_tool_printable(path, safe, capacity) : "(no memory to print it)",
            strerror(error));
    free(safe);
    return 1;
  }
  close(fd);
  // A PyTorch snapshot is converted into a temporary trace that replay and view read.
  devbuf_tool_snapshot snapshot = {.trace_path = ""};
  int is_snapshot = devbuf_tool_is_snapshot(path);
  if (cuda_device_given && !is_snapshot) {
    // A trace holds one device's allocations: a GPU named for it would be ignored. A file
    // that cannot be read is left to replay, which says why (exit 1).
    char why[256], safe[1024];
    FILE *file = devbuf_tool_open_regular(path, why, sizeof why);
    if (file) {
      fclose(file);
      return devbuf_tool_misuse("trace",
                                "--cuda-device chooses a GPU of a PyTorch snapshot; %s is a "
                                "devbuf trace, of one device",
                                DEVBUF_PRINTABLE(path, safe));
    }
  }
  if (is_snapshot && devbuf_tool_snapshot_open("trace", path, cuda_device, &snapshot)) return 1;
  const char *trace = is_snapshot ? snapshot.trace_path : path;
  // A run whose PyTorch allocator had expandable segments compares with growable ones: its
  // segments grew page by page, where plain ones strand what splits leave (the fixed
  // segments of devbuf's policy were refused at that run's peak where its own were not).
  bool as_the_run = growable < 0 && subcommand[0] == 'r' && is_snapshot &&
                    policy == DEVBUF_TOOL_POLICY_DEVBUF && snapshot.figures.expandable_segments;
  options.growable = as_the_run || growable > 0;
  devbuf_tool_trace_extras extras = {.snapshot = is_snapshot ? &snapshot.figures : NULL,
                                     .cuda_device = cuda_device};
  devbuf_device_t *device = NULL;
  int opened = devbuf_tool_open_device("trace", spec, &device);
  if (opened) {
    devbuf_tool_snapshot_close(&snapshot);
    return opened;
  }
  int code = 0;
  if (subcommand[0] == 'v') {
    code = devbuf_tool_trace_view(device, trace, path, &options, html_path);
  } else {
    devbuf_counting_upstream counts = {0};
    devbuf_allocator_t *caching = NULL;
    devbuf_status status = devbuf_tool_counting_policy(device, policy, &options, &counts, &caching);
    uint64_t page = policy == DEVBUF_TOOL_POLICY_CCA
                        ? (uint64_t)2 << 20 // CCA's segments: whole 2 MiB
                    : options.page_size ? options.page_size
                                        : devbuf_device_page_size(device);
    devbuf_trace_summary_t summary, all = {0};
    pass_figures passes[100];
    devbuf_allocator_stats_t stats = {0};
    // Later passes replay into what the earlier ones left cached: a workload that fits
    // makes no system allocation after its first pass, unless its trace clears the cache.
    for (int pass = 0; pass < pass_count && status == DEVBUF_OK; pass++) {
      uint64_t allocs_before = stats.system_allocs;
      status = devbuf_trace_replay(trace, caching, &summary);
      devbuf_allocator_stats(caching, &stats);
      // System calls as the counting upstream saw them, whichever policy made them (the CCA
      // model is a plain allocator: its own statistics count calls to it, not to the system).
      stats.system_allocs = counts.allocs;
      stats.system_frees = counts.frees;
      if (policy == DEVBUF_TOOL_POLICY_CCA)
        stats.cache_hits = stats.alloc_calls - stats.failed_allocs - counts.allocs;
      passes[pass] = (pass_figures){stats.system_allocs - allocs_before, summary.failed_allocs};
      all.allocs += summary.allocs;
      all.frees += summary.frees;
      all.failed_allocs += summary.failed_allocs;
      all.leaked += summary.leaked;
      all.cache_clears += summary.cache_clears;
      if (summary.peak_live_bytes > all.peak_live_bytes)
        all.peak_live_bytes = summary.peak_live_bytes;
    }
    if (status == DEVBUF_OK && (is_snapshot || least_limit))
      status = devbuf_tool_trace_extras_measure(device, &options, trace, &extras);
    if (status == DEVBUF_OK) {
      if (json)
        print_json(path, spec, policy, page, options.growable != 0, &all, &stats, &counts, passes,
                   pass_count, &extras);
      else
        print_text(path, spec, policy, page, as_the_run ? 2 : options.growable != 0, &all, &stats,
                   &counts, passes, pass_count);
      if (!json) devbuf_tool_trace_extras_text(&extras, stdout);
    } else {
      devbuf_tool_report("trace", NULL);
      code = 1;
    }
    devbuf_allocator_release(caching);
  }
  devbuf_device_release(device);
  devbuf_tool_snapshot_close(&snapshot);
  return code;
}
