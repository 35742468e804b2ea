// The devbuf command-line tool: devices, benchmarks, allocation traces.
#include "commands.h"
#include "printable.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// jemalloc uses static TLS, which dlopen can only place when glibc reserves room for it at
// process start: the benchmark restarts itself once with that room.
static void reserve_static_tls(char **argv) {
  if (getenv("GLIBC_TUNABLES")) return;
  setenv("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=65536", 1);
  execv("/proc/self/exe", argv);
  unsetenv("GLIBC_TUNABLES"); // exec failed: go on without jemalloc
}

static int usage(FILE *out) {
  fprintf(out,
          "usage: devbuf <command> [options]\n"
          "  info                     devices this build can open, and why others cannot\n"
          "  inspect FILE [--json]    the tensors of a safetensors file (name, dtype, shape, bytes, offsets)\n"
          "  load [FILE] [--device SPEC] [--verify] [--copy]\n"
          "                           load a safetensors file into buffers, timed; --verify checksums\n"
          "                           every tensor; without FILE, the build's sample model\n"
          "  sample FILE [--mib N]    write a sample model of about N MiB (default 64)\n"
          "  bench [--quick] [--device SPEC] [--only alloc|copy|threads|queue|load]\n"
          "                           benchmarks, side by side with malloc/memcpy/read and Python\n"
          "  trace replay FILE [--device SPEC] [--memory-limit BYTES]\n"
          "                           replay an allocation trace against a caching allocator\n"
          "  help                     this text\n");
  return out == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  const char *command = argv[1];
  if (strcmp(command, "info") == 0) return devbuf_cmd_info(argc - 1, argv + 1);
  if (strcmp(command, "bench") == 0) {
    reserve_static_tls(argv);
    return devbuf_cmd_bench(argc - 1, argv + 1);
  }
  if (strcmp(command, "trace") == 0) return devbuf_cmd_trace(argc - 1, argv + 1);
  if (strcmp(command, "inspect") == 0) return devbuf_cmd_inspect(argc - 1, argv + 1);
  if (strcmp(command, "load") == 0) return devbuf_cmd_load(argc - 1, argv + 1);
  if (strcmp(command, "sample") == 0) return devbuf_cmd_sample(argc - 1, argv + 1);
  if (strcmp(command, "help") == 0 || strcmp(command, "--help") == 0 || strcmp(command, "-h") == 0)
    return usage(stdout);
  char safe[256];
  fprintf(stderr, "devbuf: unknown command '%s'\n", devbuf_tool_printable(command, safe, sizeof safe));
  return usage(stderr);
}
