// libFuzzer target: any bytes as a PyTorch memory snapshot pickle. The restricted
// unpickler and the conversion must refuse (with a message) or convert without reading
// outside the input, leaking, crashing or passing their bounds of memory and work; what
// they convert is a trace that starts with its header.
#include "pickle_reader.h"
#include "snapshot_reader.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = NULL;
  size_t length = 0;
  FILE *out = open_memstream(&text, &length);
  if (!out) return 0;
  char message[512];
  devbuf_snapshot_figures figures;
  int status =
      devbuf_snapshot_convert(data, size, "fuzz", 0, 8, out, &figures, message, sizeof message);
  fclose(out);
  if (status != 0 && (!message[0] || !memchr(message, '\0', sizeof message))) abort();
  if (status == 0 &&
      (length < 17 || memcmp(text, "# devbuf trace 1\n", 17) != 0 || figures.trace_bytes != length))
    abort();
  // The parser alone: a tree within its memory bound, freed whole.
  devbuf_pickle *pickle = NULL;
  const devbuf_pickle_value *root = NULL;
  if (devbuf_pickle_parse(data, size, &pickle, &root, message, sizeof message) == 0) {
    if (!root || devbuf_pickle_memory(pickle) >
                     size * DEVBUF_PICKLE_MEMORY_PER_BYTE + DEVBUF_PICKLE_MEMORY_FLOOR)
      abort();
    devbuf_pickle_free(pickle);
  } else if (pickle || root) {
    abort();
  }
  free(text);
  return 0;
}
