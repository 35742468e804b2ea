// libFuzzer target: any bytes as a whole safetensors file image. The parser must refuse or
// accept without reading outside the image, leaking or crashing, and what it accepts must
// satisfy the format's rules.
#include "devbuf.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  devbuf_tensor_file_t *file = NULL;
  if (devbuf_safetensors_parse(data, size, &file) != DEVBUF_OK) {
    if (file) abort();
    return 0;
  }
  // Accepted: the tensors tile the data section exactly, and every lookup finds its tensor.
  uint64_t position = 0;
  for (size_t i = 0; i < devbuf_tensor_file_count(file); i++) {
    devbuf_tensor_info_t info;
    size_t found;
    if (devbuf_tensor_file_info(file, i, &info) != DEVBUF_OK || info.begin != position ||
        info.end < info.begin)
      abort();
    if (devbuf_tensor_file_find(file, info.name, &found) != DEVBUF_OK || found != i) abort();
    size_t bytes;
    size_t count = 1;
    for (size_t d = 0; d < info.ndim; d++) count *= info.shape[d];
    if (devbuf_dtype_bytes(info.dtype, count, &bytes) != DEVBUF_OK ||
        bytes != info.end - info.begin)
      abort();
    position = info.end;
  }
  if (position != devbuf_tensor_file_data_size(file) ||
      8 + devbuf_tensor_file_header_size(file) + devbuf_tensor_file_data_size(file) != size)
    abort();
  devbuf_tensor_file_release(file);
  return 0;
}
