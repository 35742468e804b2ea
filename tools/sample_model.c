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

static devbuf_status add(sample *s, const char *name, devbuf_dtype dtype, size_t rows, size_t cols) {
  if (s->count == sizeof s->tensors / sizeof *s->tensors) return DEVBUF_OK;
  size_t shape[2] = {rows, cols};
  devbuf_buffer_t *buffer;
  devbuf_status status = devbuf_buffer_allocate(s->allocator, dtype, shape, cols ? 2 : 1, 0, &buffer);
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
  // Hidden size h, 8 layers; a layer holds 12 h^2 bf16 weights (24 h^2 bytes), the
  // embedding 8 h^2 bytes: pick h so the total is close to `bytes`.
  size_t target = bytes < (1u << 20) ? (1u << 20) : bytes;
  size_t hidden = 64;
  while ((8 * 24 + 8) * (hidden + 64) * (hidden + 64) <= target) hidden += 64;
  size_t vocab = 4 * hidden;
  char name[64];
  status = add(s, "model.embed_tokens.weight", DEVBUF_BFLOAT16, vocab, hidden);
  if (status == DEVBUF_OK) status = add(s, "model.position_ids", DEVBUF_INT64, 2048, 0);
  static const struct {
    const char *name;
    size_t rows, cols; // in units of hidden
  } projections[] = {{"self_attn.q_proj", 1, 1}, {"self_attn.k_proj", 1, 1}, {"self_attn.v_proj", 1, 1},
                     {"self_attn.o_proj", 1, 1}, {"mlp.gate_proj", 8, 3},    {"mlp.up_proj", 8, 3},
                     {"mlp.down_proj", 1, 1}};
  for (int layer = 0; status == DEVBUF_OK && layer < 8; layer++) {
    for (size_t p = 0; status == DEVBUF_OK && p < sizeof projections / sizeof *projections; p++) {
      snprintf(name, sizeof name, "model.layers.%d.%s.weight", layer, projections[p].name);
      // gate/up are (8/3) h x h; down is h x (8/3) h, stored as h x h here to keep shapes whole
      size_t rows = hidden * projections[p].rows / projections[p].cols / 64 * 64;
      status = add(s, name, DEVBUF_BFLOAT16, rows, hidden);
    }
    snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", layer);
    if (status == DEVBUF_OK) status = add(s, name, DEVBUF_FLOAT32, hidden, 0);
    snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", layer);
    if (status == DEVBUF_OK) status = add(s, name, DEVBUF_FLOAT32, hidden, 0);
  }
  if (status == DEVBUF_OK) status = add(s, "model.norm.weight", DEVBUF_FLOAT32, hidden, 0);
  if (status == DEVBUF_OK) status = add(s, "lm_head.weight", DEVBUF_BFLOAT16, vocab, hidden);
  devbuf_metadata_entry_t metadata[] = {{"format", "pt"}, {"generator", "devbuf sample model"}};
  if (status == DEVBUF_OK) status = devbuf_safetensors_write(path, s->tensors, s->count, metadata, 2);
  for (size_t i = 0; i < s->count; i++) devbuf_buffer_release(s->tensors[i].buffer);
  free(s);
  devbuf_device_release(device);
  return status;
}
