// devbuf info: every device kind, opened or with the reason it is unavailable.
#include "commands.h"
#include "devbuf.h"

#include <stdio.h>

int devbuf_cmd_info(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("devbuf %d.%d.%d\n", DEVBUF_VERSION_MAJOR, DEVBUF_VERSION_MINOR, DEVBUF_VERSION_PATCH);
  const char *specs[] = {"cpu", "opencl:0", "cuda:0"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    devbuf_device_t *device = NULL;
    devbuf_status status = devbuf_device_open(specs[i], &device);
    if (status != DEVBUF_OK) {
      printf("%-9s %s\n", specs[i], devbuf_last_error()); // the message starts with the status name
      continue;
    }
    devbuf_allocator_stats_t stats;
    devbuf_allocator_stats(devbuf_device_allocator(device), &stats);
    devbuf_device_info_t info;
    devbuf_device_info(device, &info);
    printf("%-9s available: %s\n", devbuf_device_spec(device), devbuf_device_name(device));
    if (info.version[0]) printf("          %s\n", info.version);
    printf("          memory %.1f GiB, largest allocation %.1f GiB, alignment %zu bytes, host-unified %s, SVM %s\n",
           (double)info.global_memory / (1 << 30), (double)info.max_allocation / (1 << 30), info.alignment,
           info.host_unified ? "yes" : "no", info.svm_capabilities ? "yes" : "no");
    printf("          page %zu bytes; allocator %s (active %llu, cached %llu bytes)\n",
           devbuf_device_page_size(device), devbuf_allocator_kind(devbuf_device_allocator(device)),
           (unsigned long long)stats.active, (unsigned long long)stats.cached);
    devbuf_device_release(device);
  }
  return 0;
}
