// The table of named tensors read from a weight file (devbuf_tensor_file_t).
#ifndef DEVBUF_TENSOR_FILE_H
#define DEVBUF_TENSOR_FILE_H

#include "../core/core.h"

typedef struct devbuf__tensor_entry {
  char *name;
  devbuf_dtype dtype;
  size_t ndim;
  size_t *shape;       // ndim entries (NULL when ndim is 0)
  uint64_t begin, end; // within the data section
} devbuf__tensor_entry;

struct devbuf_tensor_file {
  size_t count;
  devbuf__tensor_entry *entries; // in file order: by begin, then end, then name
  size_t *by_name;               // indices of entries sorted by name, for lookups
  size_t metadata_count;
  struct devbuf__metadata_pair {
    char *key, *value;
  } * metadata; // in file order
  uint64_t header_size, data_size;
  devbuf_buffer_t **buffers; // one per entry once loaded; NULL for inspect/parse
};

// Reads the header text (N bytes, after the 8-byte length) of a file whose data section
// holds `data_size` bytes into a new table without buffers.
devbuf_status devbuf__safetensors_parse_header(const char *header, uint64_t header_size,
                                               uint64_t data_size, devbuf_tensor_file_t **out_file);
// Checks the 8-byte prefix of a file of `file_size` bytes: the header length, bounded by
// the limit and by the file.
devbuf_status devbuf__safetensors_header_length(const unsigned char prefix[8], uint64_t file_size,
                                                uint64_t *out_header_size);

#endif
