// devbuf info [--json]: every device kind, opened or with the reason it is unavailable.
#include "commands.h"
#include "devbuf.h"
#include "printable.h"
#include "usage.h"

#include <stdio.h>
#include <string.h>

static void print_text(const char *spec, devbuf_device_t *device) {
  char text[1024];
  if (!device) { // the message starts with the status name
    printf("%-9s %s\n", spec, DEVBUF_PRINTABLE(devbuf_last_error(), text));
    return;
  }
  devbuf_allocator_stats_t stats;
  devbuf_allocator_stats(devbuf_device_allocator(device), &stats);
  devbuf_device_info_t info;
  devbuf_device_info(device, &info);
  printf("%-9s available: %s\n", devbuf_device_spec(device),
         DEVBUF_PRINTABLE(devbuf_device_name(device), text));
  if (info.version[0]) printf("          %s\n", DEVBUF_PRINTABLE(info.version, text));
  printf("          memory %.1f GiB, largest allocation %.1f GiB, alignment %zu bytes, "
         "host-unified %s, SVM %s\n",
         (double)info.global_memory / (1 << 30), (double)info.max_allocation / (1 << 30),
         info.alignment, info.host_unified ? "yes" : "no", info.svm_capabilities ? "yes" : "no");
  printf("          page %zu bytes; allocator %s (active %llu bytes, cached %llu bytes)\n",
         devbuf_device_page_size(device), devbuf_allocator_kind(devbuf_device_allocator(device)),
         (unsigned long long)stats.active, (unsigned long long)stats.cached);
}

static void print_json(const char *spec, devbuf_device_t *device, int first) {
  printf("%s\n    {\"spec\": ", first ? "" : ",");
  devbuf_tool_json_string(spec, stdout);
  if (!device) {
    printf(", \"available\": false, \"reason\": ");
    devbuf_tool_json_string(devbuf_last_error(), stdout);
    printf("}");
    return;
  }
  devbuf_device_info_t info;
  devbuf_device_info(device, &info);
  printf(", \"available\": true, \"name\": ");
  devbuf_tool_json_string(devbuf_device_name(device), stdout);
  printf(", \"version\": ");
  devbuf_tool_json_string(info.version, stdout);
  printf(", \"memory_bytes\": %llu, \"max_allocation_bytes\": %llu, \"alignment_bytes\": %zu, "
         "\"page_bytes\": %zu, \"host_unified\": %s, \"svm\": %s}",
         (unsigned long long)info.global_memory, (unsigned long long)info.max_allocation,
         info.alignment, devbuf_device_page_size(device), info.host_unified ? "true" : "false",
         info.svm_capabilities ? "true" : "false");
}

int devbuf_cmd_info(int argc, char **argv) {
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (devbuf_tool_wants_help(argv[i])) return devbuf_tool_help("info");
    if (strcmp(argv[i], "--json") == 0)
      json = 1;
    else
      return devbuf_tool_unexpected("info", argv[i], " (info takes no arguments)");
  }
  if (json)
    printf("{\"version\": \"%d.%d.%d\", \"devices\": [", DEVBUF_VERSION_MAJOR, DEVBUF_VERSION_MINOR,
           DEVBUF_VERSION_PATCH);
  else
    printf("devbuf %d.%d.%d\n", DEVBUF_VERSION_MAJOR, DEVBUF_VERSION_MINOR, DEVBUF_VERSION_PATCH);
  const char *specs[] = {"cpu", "opencl:0", "cuda:0"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    devbuf_device_t *device = NULL;
    if (devbuf_device_open(specs[i], &device) != DEVBUF_OK) device = NULL;
    if (json)
      print_json(specs[i], device, i == 0);
    else
      print_text(specs[i], device);
    devbuf_device_release(device);
  }
  if (json) printf("\n]}\n");
  return 0;
}
