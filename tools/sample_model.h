// A sample weight file shaped like a small transformer (embeddings, attention and MLP
// projections in f16, norms in f32, an int64 position table), filled with deterministic
// noise: what `devbuf load` shows without a file, and what the load benchmark reads.
#ifndef DEVBUF_TOOL_SAMPLE_MODEL_H
#define DEVBUF_TOOL_SAMPLE_MODEL_H

#include "devbuf.h"

// Writes the largest sample whose tensors take at most `bytes` bytes (at least 1 MiB) to `path`
// through the safetensors writer. Prints nothing; the error is in devbuf_last_error().
devbuf_status devbuf_tool_write_sample(const char *path, size_t bytes);

#endif
