// A sample weight file shaped like a small transformer (embeddings, attention and MLP
// projections in f16, norms in f32, an int64 position table), filled with deterministic
// noise: what `devbuf load` shows without a file, and what the load benchmark reads.
#ifndef DEVBUF_TOOL_SAMPLE_MODEL_H
#define DEVBUF_TOOL_SAMPLE_MODEL_H

#include "devbuf.h"

// Writes a sample of exactly `bytes` bytes (at least 1 MiB; the file, header included) to
// `path` through the safetensors writer: the largest model that fits, and a u8 tensor of
// noise named "padding" (or "padding_", ... where the header's length needs it) for the
// rest. Prints nothing; the error is in devbuf_last_error().
devbuf_status devbuf_tool_write_sample(const char *path, size_t bytes);

#endif
