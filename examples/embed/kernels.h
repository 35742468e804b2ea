// The kernels of the forward pass, one interface over two kinds of backend: C kernels on
// the CPU (kernels_cpu.c, devbuf_queue_submit) and programs on OpenCL and CUDA devices
// (kernels_device.c: kernels.cl as OpenCL C, kernels.cu built by nvcc, devbuf_queue_launch).
// Each call submits one kernel to a queue and returns at once; the buffers it names are
// the kernel's uses (devbuf orders the work by their bytes). Activations are row-major
// float32 [rows, columns] with rows = sequences x tokens; a buffer may hold more rows than a
// batch uses (see model.c), so every call says how many rows count.
#ifndef EMBED_KERNELS_H
#define EMBED_KERNELS_H

#include <devbuf.h>

#include <stdbool.h>
#include <stdint.h>

// all-MiniLM-L6-v2 (BERT).
#define EMBED_HIDDEN     384   // columns of the hidden state
#define EMBED_HEADS      12    // attention heads
#define EMBED_HEAD_DIM   32    // columns per head
#define EMBED_FFN        1536  // columns of the feed-forward layer
#define EMBED_LAYERS     6     // transformer layers
#define EMBED_VOCAB      30522 // token ids
#define EMBED_POSITIONS  512   // rows of the position table
#define EMBED_MAX_TOKENS 256   // a sequence's most tokens, [CLS] and [SEP] included
// The feed-forward layer's 1536 columns live in 4 activations of 384 (see model.c).
#define EMBED_FFN_PARTS  4

// What the kernels run on: the queues, the program (devices), the options.
typedef struct embed_exec {
  devbuf_device_t *device;       // borrowed
  devbuf_queue_t *compute;       // the forward pass
  devbuf_queue_t *upload;        // token ids and masks of the next batch
  devbuf_allocator_t *staging;   // host-visible memory for uploads (devices; NULL: copyin)
  devbuf_program_t *program;     // devices: kernels.cl or kernels.cu's fatbin
  bool empty;                    // --empty-kernels: the same launches, kernels that do nothing
  bool cpu_device;               // an OpenCL device that is a CPU (PoCL): its own products
  const struct embed_kernels *k; // the backend's table
} embed_exec_t;

// The batch a kernel works on: seqs x tokens rows, and which of them are tokens. Row-wise
// kernels may leave the rows of padding (mask 0) out, the CPU's do: what they hold is then
// undefined, and no kernel reads it (attention and pooling read the rows of tokens only).
typedef struct embed_shape {
  devbuf_buffer_t *mask; // [rows] float32: 1 for a token, 0 for padding (a prefix of 1s)
  size_t seqs, tokens;   // rows = seqs x tokens
} embed_shape_t;

typedef struct embed_kernels {
  // Writes `rows` token ids (int32) and mask values (float32, 1 or 0) from host arrays
  // into `ids` and `mask` with work on x->upload (the host arrays may be reused at return).
  devbuf_status (*upload)(embed_exec_t *x, devbuf_buffer_t *ids, devbuf_buffer_t *mask,
                          const int32_t *host_ids, const float *host_mask, size_t rows);
  // out[r] = LayerNorm(word[ids[r]] + position[r % tokens] + type[0]).
  devbuf_status (*embed)(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                         devbuf_buffer_t *ids, devbuf_buffer_t *word, devbuf_buffer_t *position,
                         devbuf_buffer_t *type, devbuf_buffer_t *gamma, devbuf_buffer_t *beta);
  // out[i][rows, n] = in[rows, k] . w[i][n, k]^T + bias[i] for each i < count (1 to 4:
  // products of one input, such as the query, key and value projections), then GELU (erf)
  // when `gelu`.
  devbuf_status (*linear)(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *const *out,
                          devbuf_buffer_t *in, devbuf_buffer_t *const *w,
                          devbuf_buffer_t *const *bias, size_t count, size_t n, size_t k,
                          bool gelu);
  // out[rows, n] = sum over p of in[p][rows, k] . w[:, p k : (p + 1) k]^T + bias, for
  // EMBED_FFN_PARTS inputs and w [n, EMBED_FFN_PARTS x k]: a product whose input is split
  // by columns into activations of their own.
  devbuf_status (*linear_parts)(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                                devbuf_buffer_t *const *in, devbuf_buffer_t *w,
                                devbuf_buffer_t *bias, size_t n, size_t k);
  // ctx = softmax(q k^T / sqrt(32) + mask) v per sequence and head; keys with mask 0 are
  // left out, query rows with mask 0 get zeros.
  devbuf_status (*attention)(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *ctx,
                             devbuf_buffer_t *q, devbuf_buffer_t *k, devbuf_buffer_t *v);
  // out = LayerNorm(a + residual).
  devbuf_status (*add_norm)(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                            devbuf_buffer_t *a, devbuf_buffer_t *residual, devbuf_buffer_t *gamma,
                            devbuf_buffer_t *beta);
  // out[s] = L2-normalised mean of the rows of sequence s whose mask is 1.
  devbuf_status (*pool)(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                        devbuf_buffer_t *in);
} embed_kernels_t;

// The CPU's kernels. embed_cpu_start starts the threads the kernels split their work over
// (`threads`, 1 or 2; OpenBLAS runs single-threaded inside each) and must precede the first
// submission; embed_cpu_stop ends them once every queue has finished.
extern const embed_kernels_t embed_cpu_kernels;
devbuf_status embed_cpu_start(unsigned threads);
void embed_cpu_stop(void);
// The OpenBLAS kernels in use ("SkylakeX", "Haswell", ...).
const char *embed_cpu_blas_core(void);

// The devices' kernels: embed_device_program builds the program for x->device (OpenCL C
// source, or the CUDA fatbin; the empty variant with x->empty) into x->program.
extern const embed_kernels_t embed_device_kernels;
devbuf_status embed_device_program(embed_exec_t *x);

#endif // EMBED_KERNELS_H
