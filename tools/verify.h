// Digests of every tensor of a loaded table, on every core: tensors are handed out largest
// first to worker threads, so the work balances and each digest is the same as one thread
// would compute. The fast checksum (checksum.h) for benchmarks, or SHA-256 for users.
#ifndef DEVBUF_TOOL_VERIFY_H
#define DEVBUF_TOOL_VERIFY_H

#include "devbuf.h"

typedef enum devbuf_tool_digest_kind {
  DEVBUF_TOOL_CHECKSUM,
  DEVBUF_TOOL_SHA256
} devbuf_tool_digest_kind;

typedef struct devbuf_tool_digest {
  uint64_t checksum;        // DEVBUF_TOOL_CHECKSUM
  unsigned char sha256[32]; // DEVBUF_TOOL_SHA256
} devbuf_tool_digest;

// Fills digests[i] for every tensor i of `file`; `progress` (optional) is called from the
// calling thread with the bytes done so far. Threads: 0 means one per online CPU.
devbuf_status devbuf_tool_verify(const devbuf_tensor_file_t *file, devbuf_tool_digest_kind kind,
                                 devbuf_tool_digest *digests, unsigned threads,
                                 void (*progress)(void *context, uint64_t done, uint64_t total),
                                 void *context);

#endif
