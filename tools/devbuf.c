// The devbuf command-line tool: devices, benchmarks, allocation traces.
#include "commands.h"

#include <stdio.h>
#include <string.h>

static int usage(FILE *out) {
  fprintf(out,
          "usage: devbuf <command> [options]\n"
          "  info                     devices this build can open, and why others cannot\n"
          "  bench [--quick] [--device SPEC]\n"
          "                           allocator and copy benchmarks, side by side with malloc/memcpy\n"
          "  trace replay FILE [--device SPEC] [--memory-limit BYTES]\n"
          "                           replay an allocation trace against a caching allocator\n"
          "  help                     this text\n");
  return out == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  const char *command = argv[1];
  if (strcmp(command, "info") == 0) return devbuf_cmd_info(argc - 1, argv + 1);
  if (strcmp(command, "bench") == 0) return devbuf_cmd_bench(argc - 1, argv + 1);
  if (strcmp(command, "trace") == 0) return devbuf_cmd_trace(argc - 1, argv + 1);
  if (strcmp(command, "help") == 0 || strcmp(command, "--help") == 0 || strcmp(command, "-h") == 0)
    return usage(stdout);
  fprintf(stderr, "devbuf: unknown command '%s'\n", command);
  return usage(stderr);
}
