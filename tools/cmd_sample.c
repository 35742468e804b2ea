// devbuf sample FILE [--mib N]: writes the sample model (see sample_model.h).
#include "commands.h"
#include "printable.h"
#include "sample_model.h"
#include "usage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int devbuf_cmd_sample(int argc, char **argv) {
  const char *path = NULL;
  long mib = 64;
  for (int i = 1; i < argc; i++) {
    char safe[256];
    if (devbuf_tool_wants_help(argv[i])) return devbuf_tool_help("sample");
    if (strcmp(argv[i], "--mib") == 0) {
      char *end = NULL;
      mib = i + 1 < argc ? strtol(argv[++i], &end, 10) : 0;
      if (!end || *end || mib < 1 || mib > (1L << 20))
        return devbuf_tool_misuse("sample",
                                  "--mib takes a number of MiB from 1 to 1048576, not '%s'",
                                  DEVBUF_PRINTABLE(i < argc ? argv[i] : "", safe));
    } else if (!path && argv[i][0] != '-') {
      path = argv[i];
    } else {
      return devbuf_tool_misuse("sample", "%s '%s'",
                                argv[i][0] == '-' ? "unknown option" : "one FILE only, not also",
                                DEVBUF_PRINTABLE(argv[i], safe));
    }
  }
  if (!path) return devbuf_tool_misuse("sample", "FILE is needed");
  if (devbuf_tool_write_sample(path, (size_t)mib << 20) != DEVBUF_OK) {
    devbuf_tool_report("sample", path);
    return 1;
  }
  char safe_path[1024];
  printf("wrote %s (%ld MiB of tensors)\n", DEVBUF_PRINTABLE(path, safe_path), mib);
  return 0;
}
