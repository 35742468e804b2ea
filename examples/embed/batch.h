// Batching: sequences sorted by length, padded batches uploaded on one queue while the
// previous batch computes on another, embeddings read back a batch behind the submissions.
#ifndef EMBED_BATCH_H
#define EMBED_BATCH_H

#include "model.h"

// The device allocator's figures over the run.
typedef struct embed_memory {
  uint64_t peak_reserved;    // the most bytes the allocator held from its upstream
  uint64_t peak_active;      // the most bytes handed out at once
  uint64_t system_allocs;    // the allocator's calls of its upstream
  uint64_t allocs_after_one; // of those, the calls after the first batch was submitted
} embed_memory_t;

// The token ids of `count` sequences: sequence i is ids[offsets[i]], counts[i] ids long
// ([CLS] ... [SEP], at most EMBED_MAX_TOKENS).
typedef struct embed_sequences {
  const int32_t *ids;
  const size_t *offsets, *counts;
  size_t count;
} embed_sequences_t;

// Embeds every sequence in batches of at most `batch`, longest first: each batch is padded
// to its longest sequence (mask 0 on the padding). Batch i + 1's ids and mask are uploaded
// on x->upload while batch i computes on x->compute, which waits for the upload's event
// value; batch i is read back once batch i + 1 is submitted. `embeddings` gets count x 384
// floats in the sequences' order. `verbose`: a line per batch on stderr.
devbuf_status embed_batches(const embed_model_t *model, embed_exec_t *x,
                            const embed_sequences_t *seqs, size_t batch, bool verbose,
                            float *embeddings, embed_memory_t *memory);

#endif // EMBED_BATCH_H
