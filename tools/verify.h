// Checksums of every tensor of a loaded table, on every core: tensors are handed out
// largest first to worker threads, so the work balances and each sum is the same as one
// thread would compute.
#ifndef DEVBUF_TOOL_VERIFY_H
#define DEVBUF_TOOL_VERIFY_H

#include "devbuf.h"

// Fills sums[i] for every tensor i of `file`; `progress` (optional) is called from the
// calling thread with the bytes done so far. Threads: 0 means one per online CPU.
devbuf_status devbuf_tool_verify(const devbuf_tensor_file_t *file, uint64_t *sums, unsigned threads,
                                 void (*progress)(void *context, uint64_t done, uint64_t total), void *context);

#endif
