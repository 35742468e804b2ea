// devbuf sample FILE [--mib N | --size SIZE]: writes the sample model (see sample_model.h),
// a file of exactly that many bytes.
#include "commands.h"
#include "printable.h"
#include "sample_model.h"
#include "sizes.h"
#include "usage.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int devbuf_cmd_sample(int argc, char **argv) {
  const char *path = NULL;
  uint64_t bytes = (uint64_t)64 << 20;
  for (int i = 1; i < argc; i++) {
    if (devbuf_tool_wants_help(argv[i])) return devbuf_tool_help("sample");
    if (strcmp(argv[i], "--mib") == 0) {
      long mib;
      int misuse = devbuf_tool_count_option("sample", "--mib", i + 1 < argc ? argv[++i] : NULL, 1,
                                            1L << 20, &mib);
      if (misuse) return misuse;
      bytes = (uint64_t)mib << 20;
    } else if (strcmp(argv[i], "--size") == 0) {
      int misuse = devbuf_tool_size_option("sample", "--size", i + 1 < argc ? argv[++i] : NULL,
                                           (uint64_t)1 << 20, (uint64_t)1 << 40, &bytes);
      if (misuse) return misuse;
    } else if (!path && argv[i][0] != '-') {
      path = argv[i];
    } else {
      return devbuf_tool_unexpected("sample", argv[i], " (one FILE only)");
    }
  }
  if (!path) return devbuf_tool_misuse("sample", "FILE is needed");
  char safe_path[1024], human[32], exact[32];
  if (devbuf_tool_write_sample(path, (size_t)bytes) != DEVBUF_OK) {
    devbuf_tool_report("sample", path);
    return 1;
  }
  struct stat info;
  if (stat(path, &info) != 0) {
    fprintf(stderr, "devbuf sample: cannot stat %s: %s\n", DEVBUF_PRINTABLE(path, safe_path),
            strerror(errno));
    return 1;
  }
  printf("wrote %s: %s (%s bytes)\n", DEVBUF_PRINTABLE(path, safe_path),
         devbuf_tool_human_size((uint64_t)info.st_size, human, sizeof human),
         devbuf_tool_grouped((uint64_t)info.st_size, exact, sizeof exact));
  return 0;
}
