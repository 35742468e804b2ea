// Batching and the pipeline over the two queues.
//
// The main thread submits, per batch: this batch's forward pass on the compute queue behind
// a wait for its upload's event value; then it reads back the PREVIOUS batch (a copyout,
// which waits for that batch's last kernel), and submits the upload of the NEXT batch (its
// ids and mask into a fresh device buffer, on the upload queue, then a signal of the upload
// event), which runs while this batch computes. Nothing else waits: no queue finish, no
// device synchronize between kernels.
//
// Each batch's ids, mask and embeddings are views of one buffer of two, one per slot (batch
// b uses slot b % 2), allocated before the first batch and used again by every other batch
// once its embeddings are read: a pipeline's two staging buffers, all the system memory it
// needs taken before the first batch. They are allocated at once (not lazily at
// submission), so they never reuse memory that compute work still uses and an upload never
// waits for the compute queue.
//
// Memory: batches go longest first, and every batch's activations are sized for the first
// (the largest) batch, so that every batch asks the allocator for the same sizes and gets
// back the blocks the one before released: after the first batch the cache serves every
// request, and what the allocator holds is what the largest batch needed.
#include "batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
  devbuf_buffer_t *io;                      // ids, mask and embeddings of the slot's batches
  devbuf_buffer_t *ids, *mask, *embeddings; // views of io
  size_t first, seqs, tokens;               // sequences [first, first + seqs) of the order
} slot;

typedef struct run {
  const embed_model_t *model;
  embed_exec_t *x;
  const embed_sequences_t *seqs;
  size_t *order;            // sequence indices, longest first
  size_t batch, batches;    // sequences per batch; batches
  size_t capacity;          // rows of every activation: the first batch's
  size_t seq_capacity;      // rows of every batch's embeddings
  size_t io_bytes[4];       // offsets in a batch's io buffer: ids, mask, embeddings, end
  int32_t *host_ids;        // [capacity]: the batch being uploaded
  float *host_mask;         // [capacity]
  float *readback;          // [seq_capacity x 384]
  devbuf_event_t *uploaded; // value b + 1: batch b's ids and mask are on the device
  embed_memory_t *memory;
} run;

static const size_t *sort_counts; // qsort has no context argument

static size_t round_up(size_t bytes) { return (bytes + 4095) & ~(size_t)4095; }

static int longer_first(const void *a, const void *b) {
  size_t i = *(const size_t *)a, j = *(const size_t *)b;
  if (sort_counts[i] != sort_counts[j]) return sort_counts[i] > sort_counts[j] ? -1 : 1;
  return i < j ? -1 : i > j; // stable: input order among equals
}

// A view of `bytes` bytes at `offset` of `buffer` as `dtype` (a vector).
static devbuf_status view(devbuf_buffer_t *buffer, size_t offset, size_t bytes, devbuf_dtype dtype,
                          devbuf_buffer_t **out) {
  devbuf_buffer_t *span = NULL;
  size_t count = bytes / 4;
  devbuf_status status = devbuf_buffer_view(buffer, offset, bytes, &span);
  if (status == DEVBUF_OK) status = devbuf_buffer_reshape(span, dtype, &count, 1, out);
  devbuf_buffer_release(span);
  return status;
}

static void sample(run *r) {
  devbuf_allocator_stats_t st;
  if (devbuf_allocator_stats(devbuf_device_allocator(r->x->device), &st) != DEVBUF_OK) return;
  r->memory->peak_reserved = st.peak_reserved;
  r->memory->peak_active = st.peak;
  r->memory->system_allocs = st.system_allocs;
}

// Batch b's ids and mask into its slot's buffer, uploaded on the upload queue.
static devbuf_status stage(run *r, size_t b, slot *s) {
  s->first = b * r->batch;
  s->seqs = r->seqs->count - s->first < r->batch ? r->seqs->count - s->first : r->batch;
  s->tokens = r->seqs->counts[r->order[s->first]];
  size_t rows = s->seqs * s->tokens;
  for (size_t i = 0; i < s->seqs; i++) {
    size_t seq = r->order[s->first + i], count = r->seqs->counts[seq];
    int32_t *ids = r->host_ids + i * s->tokens;
    float *mask = r->host_mask + i * s->tokens;
    memcpy(ids, r->seqs->ids + r->seqs->offsets[seq], count * sizeof *ids);
    for (size_t t = 0; t < s->tokens; t++) mask[t] = t < count ? 1.0f : 0.0f;
    for (size_t t = count; t < s->tokens; t++) ids[t] = 0; // [PAD]
  }
  const size_t *at = r->io_bytes;
  devbuf_status status = view(s->io, at[0], rows * sizeof(int32_t), DEVBUF_INT32, &s->ids);
  if (status == DEVBUF_OK)
    status = view(s->io, at[1], rows * sizeof(float), DEVBUF_FLOAT32, &s->mask);
  if (status == DEVBUF_OK)
    status =
        view(s->io, at[2], s->seqs * EMBED_HIDDEN * sizeof(float), DEVBUF_FLOAT32, &s->embeddings);
  if (status == DEVBUF_OK)
    status = r->x->k->upload(r->x, s->ids, s->mask, r->host_ids, r->host_mask, rows);
  if (status == DEVBUF_OK) status = devbuf_queue_signal(r->x->upload, r->uploaded, b + 1);
  return status;
}

// Batch b's forward pass, behind its upload.
static devbuf_status compute(run *r, size_t b, slot *s) {
  devbuf_status status = devbuf_queue_wait(r->x->compute, r->uploaded, b + 1);
  if (status == DEVBUF_OK)
    status = embed_model_forward(r->model, r->x, s->ids, s->mask, s->embeddings, s->seqs, s->tokens,
                                 r->capacity);
  // The pooling kernel was the last reader of both.
  devbuf_buffer_release(s->ids), s->ids = NULL;
  devbuf_buffer_release(s->mask), s->mask = NULL;
  return status;
}

// Batch b's embeddings to their sequences' rows (waits for its last kernel).
static devbuf_status read_back(run *r, size_t b, slot *s, float *embeddings, bool verbose) {
  devbuf_status status =
      devbuf_buffer_copyout(s->embeddings, r->readback, devbuf_buffer_size(s->embeddings));
  devbuf_buffer_release(s->embeddings), s->embeddings = NULL;
  if (status != DEVBUF_OK) return status;
  for (size_t i = 0; i < s->seqs; i++)
    memcpy(embeddings + r->order[s->first + i] * EMBED_HIDDEN, r->readback + i * EMBED_HIDDEN,
           EMBED_HIDDEN * sizeof(float));
  sample(r);
  if (verbose)
    fprintf(stderr,
            "batch %zu: %zu x %zu tokens; reserved %llu, peak active %llu, system allocs %llu\n", b,
            s->seqs, s->tokens, (unsigned long long)r->memory->peak_reserved,
            (unsigned long long)r->memory->peak_active,
            (unsigned long long)r->memory->system_allocs);
  return DEVBUF_OK;
}

static void clear(slot *s) {
  devbuf_buffer_release(s->ids);
  devbuf_buffer_release(s->mask);
  devbuf_buffer_release(s->embeddings);
  devbuf_buffer_release(s->io);
  memset(s, 0, sizeof *s);
}

devbuf_status embed_batches(const embed_model_t *model, embed_exec_t *x,
                            const embed_sequences_t *seqs, size_t batch, bool verbose,
                            float *embeddings, embed_memory_t *memory) {
  memset(memory, 0, sizeof *memory);
  run r = {.model = model, .x = x, .seqs = seqs, .batch = batch, .memory = memory};
  slot slots[2] = {{0}}; // b % 2: batch b; batch b - 1 (read back) and b + 1 (uploaded)
  uint64_t first = 0;    // system allocations once the first batch was submitted
  sample(&r);
  if (seqs->count == 0) return DEVBUF_OK;
  r.batches = (seqs->count + batch - 1) / batch;
  r.order = malloc(seqs->count * sizeof *r.order);
  devbuf_status status = DEVBUF_OK;
  if (!r.order) return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no memory for the batch order");
  for (size_t i = 0; i < seqs->count; i++) r.order[i] = i;
  sort_counts = seqs->counts;
  qsort(r.order, seqs->count, sizeof *r.order, longer_first);
  r.seq_capacity = seqs->count < batch ? seqs->count : batch;
  r.capacity = r.seq_capacity * seqs->counts[r.order[0]];
  r.host_ids = malloc(r.capacity * sizeof *r.host_ids);
  r.host_mask = malloc(r.capacity * sizeof *r.host_mask);
  r.readback = malloc(r.seq_capacity * EMBED_HIDDEN * sizeof *r.readback);
  if (!r.host_ids || !r.host_mask || !r.readback) {
    status = devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no memory for %zu rows", r.capacity);
    goto done;
  }
  // A batch's io buffer: ids, mask and embeddings, each at a multiple of 4096 bytes (the
  // alignment OpenCL and CUDA ask of the views their kernels get).
  r.io_bytes[0] = 0;
  r.io_bytes[1] = round_up(r.capacity * sizeof(int32_t));
  r.io_bytes[2] = r.io_bytes[1] + round_up(r.capacity * sizeof(float));
  r.io_bytes[3] = r.io_bytes[2] + r.seq_capacity * EMBED_HIDDEN * sizeof(float);
  if ((status = devbuf_event_create(0, &r.uploaded)) != DEVBUF_OK) goto done;
  for (size_t i = 0; i < 2 && i < r.batches; i++)
    if ((status = devbuf_buffer_allocate(devbuf_device_allocator(x->device), DEVBUF_UINT8,
                                         &r.io_bytes[3], 1, 0, &slots[i].io)) != DEVBUF_OK)
      goto drain;
  if ((status = stage(&r, 0, &slots[0])) != DEVBUF_OK) goto drain;
  for (size_t b = 0; b < r.batches; b++) {
    if ((status = compute(&r, b, &slots[b % 2])) != DEVBUF_OK) goto drain;
    sample(&r); // the allocator keeps the peaks; sampled after each batch for --verbose
    if (b == 0) first = r.memory->system_allocs;
    if (b > 0 &&
        (status = read_back(&r, b - 1, &slots[(b - 1) % 2], embeddings, verbose)) != DEVBUF_OK)
      goto drain;
    if (b + 1 < r.batches && (status = stage(&r, b + 1, &slots[(b + 1) % 2])) != DEVBUF_OK)
      goto drain;
  }
  status = read_back(&r, r.batches - 1, &slots[(r.batches - 1) % 2], embeddings, verbose);
drain:
  for (int i = 0; i < 2; i++) clear(&slots[i]);
  sample(&r);
  memory->allocs_after_one = memory->system_allocs - first;
done:
  devbuf_event_release(r.uploaded);
  free(r.order);
  free(r.host_ids);
  free(r.host_mask);
  free(r.readback);
  return status;
}
