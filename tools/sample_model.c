// The sample model of sample_model.h.
#include "sample_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sample {
  devbuf_named_buffer_t tensors[512];
  char names[512][64];
  size_t count;
  devbuf_allocator_t *allocator;
  uint64_t noise;
} sample;

static devbuf_status add(sample *s, const char *name, devbuf_dtype dtype, size_t rows,
                         size_t cols) {
  if (s->count == sizeof s->tensors / sizeof *s->tensors) return DEVBUF_OK;
  size_t shape[2] = {rows, cols};
  devbuf_buffer_t *buffer;
  devbuf_status status =
      devbuf_buffer_allocate(s->allocator, dtype, shape, cols ? 2 : 1, 0, &buffer);
  if (status != DEVBUF_OK) return status;
  uint64_t *words;
  size_t size;
  status = devbuf_buffer_contents_mut(buffer, (void **)&words, &size);
  if (status != DEVBUF_OK) {
    devbuf_buffer_release(buffer);
    return status;
  }
  for (size_t i = 0; i < size / 8; i++) { // xorshift noise: incompressible, reproducible
    s->noise ^= s->noise << 13, s->noise ^= s->noise >> 7, s->noise ^= s->noise << 17;
    words[i] = s->noise;
  }
  memset((char *)words + size / 8 * 8, 0x5a, size % 8);
  devbuf_buffer_end_access(buffer, words);
  snprintf(s->names[s->count], sizeof s->names[s->count], "%s", name);
  s->tensors[s->count] = (devbuf_named_buffer_t){s->names[s->count], buffer};
  s->count++;
  return DEVBUF_OK;
}

#define LAYERS 8

// Rows of a projection (in units of hidden: gate and up are 8/3 h, kept to multiples of 64).
static size_t projection_rows(size_t hidden, size_t rows, size_t cols) {
  return hidden * rows / cols / 64 * 64;
}

static const struct {
  const char *name;
  size_t rows, cols;
} projections[] = {{"self_attn.q_proj", 1, 1}, {"self_attn.k_proj", 1, 1},
                   {"self_attn.v_proj", 1, 1}, {"self_attn.o_proj", 1, 1},
                   {"mlp.gate_proj", 8, 3},    {"mlp.up_proj", 8, 3},
                   {"mlp.down_proj", 1, 1}};

// The file's data bytes for hidden size `hidden` (what devbuf_tool_write_sample lays out).
static size_t model_bytes(size_t hidden) {
  size_t layer = 2 * hidden * 4; // two f32 norms
  for (size_t p = 0; p < sizeof projections / sizeof *projections; p++)
    layer += projection_rows(hidden, projections[p].rows, projections[p].cols) * hidden * 2;
  return LAYERS * layer + 2 * (4 * hidden) * hidden * 2 + 2048 * 8 + hidden * 4;
}

devbuf_status devbuf_tool_write_sample(const char *path, size_t bytes) {
  devbuf_device_t *device;
  devbuf_status status = devbuf_device_open("cpu", &device);
  if (status != DEVBUF_OK) return status;
  sample *s = calloc(1, sizeof *s);
  if (!s) {
    devbuf_device_release(device);
    return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no memory for the sample model's table");
  }
  s->allocator = devbuf_device_allocator(device);
  s->noise = 0x2545f4914f6cdd1dull;
  size_t target = bytes < (1u << 20) ? (1u << 20) : bytes; // the largest model that fits
  size_t hidden = 64;
  while (model_bytes(hidden + 64) <= target) hidden += 64;
  size_t vocab = 4 * hidden;
  char name[64];
  status = add(s, "model.embed_tokens.weight", DEVBUF_FLOAT16, vocab, hidden);
  if (status == DEVBUF_OK) status = add(s, "model.position_ids", DEVBUF_INT64, 2048, 0);
  for (int layer = 0; status == DEVBUF_OK && layer < LAYERS; layer++) {
    for (size_t p = 0; status == DEVBUF_OK && p < sizeof projections / sizeof *projections; p++) {
      snprintf(name, sizeof name, "model.layers.%d.%s.weight", layer, projections[p].name);
      status = add(s, name, DEVBUF_FLOAT16,
                   projection_rows(hidden, projections[p].rows, projections[p].cols), hidden);
    }
    snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", layer);
    if (status == DEVBUF_OK) status = add(s, name, DEVBUF_FLOAT32, hidden, 0);
    snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", layer);
    if (status == DEVBUF_OK) status = add(s, name, DEVBUF_FLOAT32, hidden, 0);
  }
  if (status == DEVBUF_OK) status = add(s, "model.norm.weight", DEVBUF_FLOAT32, hidden, 0);
  if (status == DEVBUF_OK) status = add(s, "lm_head.weight", DEVBUF_FLOAT16, vocab, hidden);
  devbuf_metadata_entry_t metadata[] = {{"format", "pt"}, {"generator", "devbuf sample model"}};
  if (status == DEVBUF_OK)
    status = devbuf_safetensors_write(path, s->tensors, s->count, metadata, 2);
  for (size_t i = 0; i < s->count; i++) devbuf_buffer_release(s->tensors[i].buffer);
  free(s);
  devbuf_device_release(device);
  return status;
}
