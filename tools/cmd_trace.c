// devbuf trace replay FILE: plays an allocation trace against a caching allocator and
// prints what the allocator did.
#include "commands.h"
#include "devbuf.h"
#include "printable.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int devbuf_cmd_trace(int argc, char **argv) {
  if (argc < 3 || strcmp(argv[1], "replay") != 0) {
    fprintf(stderr, "usage: devbuf trace replay FILE [--device SPEC] [--memory-limit BYTES]\n");
    return 2;
  }
  const char *path = argv[2], *spec = "cpu";
  devbuf_caching_options_t options = {0};
  for (int i = 3; i < argc; i++) {
    if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      spec = argv[++i];
    } else if (strcmp(argv[i], "--memory-limit") == 0 && i + 1 < argc) {
      char *end;
      options.memory_limit = strtoull(argv[++i], &end, 10);
      if (*end) {
        char safe[256];
        fprintf(stderr, "devbuf trace: --memory-limit takes a number of bytes, not '%s'\n", DEVBUF_PRINTABLE(argv[i], safe));
        return 2;
      }
    } else {
      char safe[256];
      fprintf(stderr, "devbuf trace: unknown option '%s'\n", DEVBUF_PRINTABLE(argv[i], safe));
      return 2;
    }
  }
  devbuf_device_t *device = NULL;
  devbuf_allocator_t *raw = NULL, *caching = NULL;
  devbuf_status status = devbuf_device_open(spec, &device);
  if (status == DEVBUF_OK) status = devbuf_device_raw_allocator(device, &raw);
  if (status == DEVBUF_OK) status = devbuf_caching_allocator_create(raw, &options, &caching);
  devbuf_trace_summary_t summary;
  if (status == DEVBUF_OK) status = devbuf_trace_replay(path, caching, &summary);
  if (status == DEVBUF_OK) {
    devbuf_allocator_stats_t stats;
    devbuf_allocator_stats(caching, &stats);
    char safe_path[1024], safe_spec[64];
    printf("replayed %s on %s: %llu allocations, %llu frees, %llu refused, %llu never freed\n",
           DEVBUF_PRINTABLE(path, safe_path), DEVBUF_PRINTABLE(spec, safe_spec),
           (unsigned long long)summary.allocs, (unsigned long long)summary.frees,
           (unsigned long long)summary.failed_allocs, (unsigned long long)summary.leaked);
    printf("peak requested %llu bytes; allocator peak %llu bytes; %llu system allocations, %llu cache hits\n",
           (unsigned long long)summary.peak_live_bytes, (unsigned long long)stats.peak,
           (unsigned long long)stats.system_allocs, (unsigned long long)stats.cache_hits);
  } else {
    devbuf_tool_report("trace", NULL);
  }
  devbuf_allocator_release(caching);
  devbuf_allocator_release(raw);
  devbuf_device_release(device);
  return status == DEVBUF_OK ? 0 : 1;
}
