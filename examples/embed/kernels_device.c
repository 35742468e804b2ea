// The forward pass's kernels on OpenCL and CUDA devices: launches of kernels.cl's kernels
// (OpenCL C built by the driver at start-up; on CUDA the same source compiled by nvcc into a
// fatbin at build time, kernels.cu). Uploads go through host-visible staging memory and a
// device copy on the upload queue; where the device has no host-visible memory, copyin.
#include "kernels.h"

#include <stdio.h>
#include <string.h>

extern const unsigned char embed_kernels_cl[];
#ifdef EMBED_CUDA_FATBIN
extern const unsigned char embed_kernels_fatbin[];
extern const unsigned char embed_kernels_empty_fatbin[];
#endif

devbuf_status embed_device_program(embed_exec_t *x) {
  switch (devbuf_device_kind_of(x->device)) {
  case DEVBUF_DEVICE_OPENCL: {
    devbuf_device_info_t info;
    devbuf_status status = devbuf_device_info(x->device, &info);
    if (status != DEVBUF_OK) return status;
    x->cpu_device = info.processor == DEVBUF_PROCESSOR_CPU;
    char options[64];
    snprintf(options, sizeof options, "-DEMBED_EMPTY=%d -DEMBED_CPU_DEVICE=%d", x->empty,
             x->cpu_device);
    return devbuf_program_build(x->device, (const char *)embed_kernels_cl, options, &x->program);
  }
  case DEVBUF_DEVICE_CUDA:
#ifdef EMBED_CUDA_FATBIN
    return devbuf_program_build(
        x->device, (const char *)(x->empty ? embed_kernels_empty_fatbin : embed_kernels_fatbin),
        NULL, &x->program);
#else
    return devbuf_set_error(DEVBUF_UNSUPPORTED,
                            "%s: devbuf-embed was built without nvcc, so without CUDA kernels",
                            devbuf_device_spec(x->device));
#endif
  default:
    return devbuf_set_error(DEVBUF_UNSUPPORTED, "%s runs C kernels, not programs",
                            devbuf_device_spec(x->device));
  }
}

// Launches `name` over a grid of global x local items, with uint32 scalars after the uses.
// A grid of global1 == 0 has one dimension.
static devbuf_status launch(embed_exec_t *x, const char *name, size_t global0, size_t global1,
                            size_t local0, size_t local1, const devbuf_use_t *uses, size_t count,
                            const uint32_t *scalars, size_t scalar_count) {
  devbuf_arg_t args[8] = {{NULL, 0}};
  for (size_t i = 0; i < scalar_count; i++) args[i] = (devbuf_arg_t){&scalars[i], sizeof *scalars};
  devbuf_launch_t grid = {global1 ? 2 : 1, {global0, global1 ? global1 : 1, 1}, {0, 0, 0}};
  if (local0) grid.local[0] = local0, grid.local[1] = global1 ? local1 : 1, grid.local[2] = 1;
  return devbuf_queue_launch(x->compute, x->program, name, &grid, uses, count, args, scalar_count);
}

#define R(buffer) \
  { buffer, DEVBUF_ACCESS_READ }
#define W(buffer) \
  { buffer, DEVBUF_ACCESS_WRITE }

// ids and mask are exactly `rows` long (views of the batch's buffer).
static devbuf_status device_upload(embed_exec_t *x, devbuf_buffer_t *ids, devbuf_buffer_t *mask,
                                   const int32_t *host_ids, const float *host_mask, size_t rows) {
  size_t bytes = rows * sizeof(int32_t), both = 2 * rows;
  devbuf_buffer_t *stage = NULL;
  devbuf_status status = x->staging
                             ? devbuf_buffer_allocate(x->staging, DEVBUF_INT32, &both, 1, 0, &stage)
                             : DEVBUF_UNSUPPORTED;
  if (status == DEVBUF_UNSUPPORTED) { // no host-visible memory on this device: copy from here
    x->staging = NULL;
    status = devbuf_buffer_copyin(ids, host_ids, bytes);
    return status == DEVBUF_OK ? devbuf_buffer_copyin(mask, host_mask, bytes) : status;
  }
  if (status != DEVBUF_OK) return status;
  void *data = NULL;
  status = devbuf_buffer_contents_mut(stage, &data, NULL);
  if (status == DEVBUF_OK) {
    memcpy(data, host_ids, bytes);
    memcpy((char *)data + bytes, host_mask, bytes);
    status = devbuf_buffer_end_access(stage, data);
  }
  devbuf_buffer_t *staged_ids = NULL, *staged_mask = NULL;
  if (status == DEVBUF_OK) status = devbuf_buffer_view(stage, 0, bytes, &staged_ids);
  if (status == DEVBUF_OK) status = devbuf_buffer_view(stage, bytes, bytes, &staged_mask);
  if (status == DEVBUF_OK) status = devbuf_queue_copy(x->upload, ids, staged_ids);
  if (status == DEVBUF_OK) status = devbuf_queue_copy(x->upload, mask, staged_mask);
  devbuf_buffer_release(staged_ids);
  devbuf_buffer_release(staged_mask);
  devbuf_buffer_release(stage); // back to its cache in flight until the copies are done
  return status;
}

static devbuf_status device_embed(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                                  devbuf_buffer_t *ids, devbuf_buffer_t *word,
                                  devbuf_buffer_t *position, devbuf_buffer_t *type,
                                  devbuf_buffer_t *gamma, devbuf_buffer_t *beta) {
  uint32_t s[] = {(uint32_t)b->tokens, EMBED_VOCAB};
  devbuf_use_t uses[] = {W(out),  R(ids),   R(word), R(position),
                         R(type), R(gamma), R(beta), R(b->mask)};
  return launch(x, "embed_tokens", 128 * b->seqs * b->tokens, 0, 128, 0, uses, 8, s, 2);
}

// The products: on GPUs tiles of 64 x 64 outputs per group of 16 x 16; on CPUs (PoCL) 4 x 4
// outputs per item, in groups the driver chooses.
static devbuf_status device_linear(embed_exec_t *x, const embed_shape_t *b,
                                   devbuf_buffer_t *const *out, devbuf_buffer_t *in,
                                   devbuf_buffer_t *const *w, devbuf_buffer_t *const *bias,
                                   size_t count, size_t n, size_t k, bool gelu) {
  size_t rows = b->seqs * b->tokens;
  uint32_t s[] = {(uint32_t)rows, (uint32_t)n, (uint32_t)k, gelu};
  devbuf_status status = DEVBUF_OK;
  for (size_t i = 0; i < count && status == DEVBUF_OK; i++) {
    devbuf_use_t uses[] = {W(out[i]), R(in), R(w[i]), R(bias[i]), R(b->mask)};
    status = x->cpu_device
                 ? launch(x, "linear", n / 4, (rows + 3) / 4, 0, 0, uses, 5, s, 4)
                 : launch(x, "linear", n / 4, (rows + 63) / 64 * 16, 16, 16, uses, 5, s, 4);
  }
  return status;
}

static devbuf_status device_linear_parts(embed_exec_t *x, const embed_shape_t *b,
                                         devbuf_buffer_t *out, devbuf_buffer_t *const *in,
                                         devbuf_buffer_t *w, devbuf_buffer_t *bias, size_t n,
                                         size_t k) {
  size_t rows = b->seqs * b->tokens;
  uint32_t s[] = {(uint32_t)rows, (uint32_t)n, (uint32_t)k};
  devbuf_use_t uses[] = {W(out), R(in[0]), R(in[1]), R(in[2]), R(in[3]), R(w), R(bias), R(b->mask)};
  if (x->cpu_device) return launch(x, "linear_parts", n / 4, (rows + 3) / 4, 0, 0, uses, 8, s, 3);
  return launch(x, "linear_parts", n / 4, (rows + 63) / 64 * 16, 16, 16, uses, 8, s, 3);
}

static devbuf_status device_attention(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *ctx,
                                      devbuf_buffer_t *q, devbuf_buffer_t *k, devbuf_buffer_t *v) {
  uint32_t s[] = {(uint32_t)b->tokens};
  devbuf_use_t uses[] = {W(ctx), R(q), R(k), R(v), R(b->mask)};
  return launch(x, "attention", (b->tokens + 63) / 64 * 64, b->seqs * EMBED_HEADS, 64, 1, uses, 5,
                s, 1);
}

static devbuf_status device_add_norm(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                                     devbuf_buffer_t *a, devbuf_buffer_t *residual,
                                     devbuf_buffer_t *gamma, devbuf_buffer_t *beta) {
  devbuf_use_t uses[] = {W(out), R(a), R(residual), R(gamma), R(beta), R(b->mask)};
  return launch(x, "add_norm", 128 * b->seqs * b->tokens, 0, 128, 0, uses, 6, NULL, 0);
}

static devbuf_status device_pool(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                                 devbuf_buffer_t *in) {
  uint32_t s[] = {(uint32_t)b->tokens};
  devbuf_use_t uses[] = {W(out), R(in), R(b->mask)};
  return launch(x, "pool", 128 * b->seqs, 0, 128, 0, uses, 3, s, 1);
}

const embed_kernels_t embed_device_kernels = {
    .upload = device_upload,
    .embed = device_embed,
    .linear = device_linear,
    .linear_parts = device_linear_parts,
    .attention = device_attention,
    .add_norm = device_add_norm,
    .pool = device_pool,
};
