// A reference model of PyTorch's CUDA caching allocator (CCA) with its default settings, as a
// devbuf allocator, so that `devbuf trace replay --policy cca` and `devbuf trace view` can
// set devbuf's policy beside PyTorch's on the same trace and the same counting upstream.
//
// The model follows the rules tests/data/traces/README.md states and checks against real
// runs: requests round up to 512 bytes; those of at most 1 MiB come from 2 MiB segments
// (the small pool), those below 10 MiB from 20 MiB segments, larger ones from segments of
// their size rounded up to 2 MiB (the large pool); a request takes the smallest free block
// of its pool that fits (lowest address among equals) and splits it when the rest is at
// least 512 bytes (small pool) or over 1 MiB (large pool); a freed block merges with free
// neighbours of its segment. Segments go back only when a new one would pass the memory
// limit: then every wholly free segment goes back and the request tries once more, as CCA
// does on a failed cudaMalloc; and at devbuf_allocator_clear_cache (a trace's "# E"), as
// at torch.cuda.empty_cache().
#ifndef DEVBUF_TOOL_CCA_MODEL_H
#define DEVBUF_TOOL_CCA_MODEL_H

#include "devbuf.h"

#include <stdint.h>

// The model over `upstream` (retained); `memory_limit` 0 means none. Single-threaded, as a
// replay is.
devbuf_status devbuf_tool_cca_model_create(devbuf_allocator_t *upstream, uint64_t memory_limit,
                                           devbuf_allocator_t **out_allocator);

#endif
