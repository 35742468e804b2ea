// devbuf sample FILE [--mib N]: writes the sample model (see sample_model.h).
#include "commands.h"
#include "printable.h"
#include "sample_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int devbuf_cmd_sample(int argc, char **argv) {
  const char *path = NULL;
  long mib = 64;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
      mib = strtol(argv[++i], NULL, 10);
    } else if (!path && argv[i][0] != '-') {
      path = argv[i];
    } else {
      path = NULL;
      break;
    }
  }
  if (!path || mib < 1 || mib > (1L << 20)) {
    fprintf(stderr, "usage: devbuf sample FILE [--mib N]   (N from 1 to 1048576)\n");
    return 2;
  }
  if (devbuf_tool_write_sample(path, (size_t)mib << 20) != DEVBUF_OK) {
    devbuf_tool_report("sample", path);
    return 1;
  }
  char safe_path[1024];
  printf("wrote %s\n", DEVBUF_PRINTABLE(path, safe_path));
  return 0;
}
