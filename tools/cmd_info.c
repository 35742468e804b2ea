// devbuf info [--json]: every device kind of the build (the library's registry of backends),
// its first device opened or the reason it is unavailable.
#include "commands.h"
#include "devbuf.h"
#include "printable.h"
#include "usage.h"

#include <stdio.h>
#include <string.h>

static const struct {
  uint32_t bit;
  const char *name;
} capability_names[] = {
    {DEVBUF_CAN_QUEUE, "queues"},           {DEVBUF_CAN_C_KERNELS, "c-kernels"},
    {DEVBUF_CAN_PROGRAMS, "programs"},      {DEVBUF_CAN_SHARE, "sharing"},
    {DEVBUF_CAN_GROW, "growable-segments"},
};
#define CAPABILITY_COUNT (sizeof capability_names / sizeof capability_names[0])

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
  printf("          can:");
  for (size_t i = 0; i < CAPABILITY_COUNT; i++)
    if (info.capabilities & capability_names[i].bit) printf(" %s", capability_names[i].name);
  printf("\n");
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
         "\"page_bytes\": %zu, \"host_unified\": %s, \"svm\": %s",
         (unsigned long long)info.global_memory, (unsigned long long)info.max_allocation,
         info.alignment, devbuf_device_page_size(device), info.host_unified ? "true" : "false",
         info.svm_capabilities ? "true" : "false");
  printf(", \"capabilities\": [");
  const char *comma = "";
  for (size_t i = 0; i < CAPABILITY_COUNT; i++)
    if (info.capabilities & capability_names[i].bit) {
      printf("%s\"%s\"", comma, capability_names[i].name);
      comma = ", ";
    }
  printf("]}");
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
  for (size_t kind = 1; kind <= devbuf_device_kind_count(); kind++) {
    char spec[64]; // the first device; opened, its spec is canonical ("cpu" for "cpu:0")
    snprintf(spec, sizeof spec, "%s:0", devbuf_device_kind_name((devbuf_device_kind)kind));
    devbuf_device_t *device = NULL;
    if (devbuf_device_open(spec, &device) != DEVBUF_OK) device = NULL;
    const char *shown = device ? devbuf_device_spec(device) : spec;
    if (json)
      print_json(shown, device, kind == 1);
    else
      print_text(shown, device);
    devbuf_device_release(device);
  }
  if (json) printf("\n]}\n");
  return 0;
}
