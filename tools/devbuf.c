// The devbuf command-line tool: devices, benchmarks, allocation traces.
#include "commands.h"
#include "devbuf.h"
#include "printable.h"
#include "usage.h"

#include <errno.h>
#include <stdbool.h>
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

static int run_command(int argc, char **argv) {
  if (argc < 2) return devbuf_tool_misuse("", "a command is needed");
  const char *command = argv[1];
  if (strcmp(command, "--version") == 0 || strcmp(command, "version") == 0) {
    // Words after it are a mistake, as after any command, not something to ignore.
    if (argc > 2 && devbuf_tool_wants_help(argv[2])) return devbuf_tool_help(NULL);
    if (argc > 2) return devbuf_tool_unexpected("", argv[2], " (--version takes no argument)");
    printf("devbuf %d.%d.%d\n", DEVBUF_VERSION_MAJOR, DEVBUF_VERSION_MINOR, DEVBUF_VERSION_PATCH);
    return 0;
  }
  if (strcmp(command, "help") == 0 || devbuf_tool_wants_help(command)) {
    // `help --help`, `help -h` and `help help` ask for this text too.
    if (argc > 2 && (devbuf_tool_wants_help(argv[2]) || strcmp(argv[2], "help") == 0))
      return devbuf_tool_help(NULL);
    if (argc > 2 && strcmp(devbuf_tool_usage(argv[2]), devbuf_tool_usage(NULL)) == 0) {
      char safe[256];
      return devbuf_tool_misuse("help", "no command is named '%s'",
                                DEVBUF_PRINTABLE(argv[2], safe));
    }
    // After COMMAND: --help or -h again, or (for trace) the subcommand its usage covers.
    for (int i = 3; i < argc; i++) {
      bool subcommand = i == 3 && strcmp(argv[2], "trace") == 0 &&
                        (strcmp(argv[3], "replay") == 0 || strcmp(argv[3], "view") == 0);
      if (!subcommand && !devbuf_tool_wants_help(argv[i]))
        return devbuf_tool_unexpected("help", argv[i], " (help takes one COMMAND)");
    }
    return devbuf_tool_help(argc > 2 ? argv[2] : NULL);
  }
  if (strcmp(command, "info") == 0) return devbuf_cmd_info(argc - 1, argv + 1);
  if (strcmp(command, "bench") == 0) {
    reserve_static_tls(argv);
    return devbuf_cmd_bench(argc - 1, argv + 1);
  }
  if (strcmp(command, "trace") == 0) return devbuf_cmd_trace(argc - 1, argv + 1);
  if (strcmp(command, "inspect") == 0) return devbuf_cmd_inspect(argc - 1, argv + 1);
  if (strcmp(command, "load") == 0) return devbuf_cmd_load(argc - 1, argv + 1);
  if (strcmp(command, "sample") == 0) return devbuf_cmd_sample(argc - 1, argv + 1);
  char safe[256];
  return devbuf_tool_misuse("", "unknown command '%s'", DEVBUF_PRINTABLE(command, safe));
}

int main(int argc, char **argv) {
  int code = run_command(argc, argv);
  // Output that could not be written (a full disk, a closed pipe) is a failure, not a success
  // that printed nothing.
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "devbuf: cannot write the output: %s\n", strerror(errno));
    if (code == 0) code = 1;
  }
  return code;
}
