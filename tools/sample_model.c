// The sample model of sample_model.h.
#include "sample_model.h"
#include "printable.h"

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

// Larger elements first, then by name: the order devbuf_safetensors_write lays tensors out.
static int layout_order(const void *a, const void *b) {
  const devbuf_named_buffer_t *x = a, *y = b;
  unsigned xbits = devbuf_dtype_bits(devbuf_buffer_dtype(x->buffer));
  unsigned ybits = devbuf_dtype_bits(devbuf_buffer_dtype(y->buffer));
  if (xbits != ybits) return xbits > ybits ? -1 : 1;
  return strcmp(x->name, y->name);
}

// The JSON header as devbuf_safetensors_write writes it (safetensors_write.c, build_header),
// without its closing brace and padding: metadata, then every tensor in layout order with
// its shape and data offsets. The sample's names and metadata need no escapes. Sorts the
// tensors into layout order; *data_bytes gets the bytes of all their data.
static size_t header_without_end(sample *s, const devbuf_metadata_entry_t *metadata,
                                 size_t metadata_count, uint64_t *data_bytes) {
  qsort(s->tensors, s->count, sizeof *s->tensors, layout_order);
  char piece[256];
  size_t length = 1; // {
  if (metadata_count) length += strlen("\"__metadata__\":{}");
  for (size_t i = 0; i < metadata_count; i++)
    length += (i ? 1 : 0) + strlen(metadata[i].key) + strlen(metadata[i].value) + 5; // "k":"v"
  uint64_t offset = 0;
  for (size_t i = 0; i < s->count; i++) {
    devbuf_buffer_t *buffer = s->tensors[i].buffer;
    char shape[64];
    devbuf_tool_shape_text(devbuf_buffer_shape(buffer), devbuf_buffer_ndim(buffer), ",", shape,
                           sizeof shape);
    uint64_t end = offset + devbuf_buffer_size(buffer);
    length +=
        (size_t)snprintf(piece, sizeof piece,
                         "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}",
                         i || metadata_count ? "," : "", s->tensors[i].name,
                         devbuf_dtype_safetensors_name(devbuf_buffer_dtype(buffer)), shape,
                         (unsigned long long)offset, (unsigned long long)end);
    offset = end;
  }
  *data_bytes = offset;
  return length;
}

// The bytes of padding tensor `name` (u8, laid out last) that make the file exactly
// `file_bytes` long after a header of `fixed` bytes (header_without_end) and `data` bytes of
// other tensors; 0 if no count does with this name (its digits would move the header's
// padding across the count). The file: 8-byte length, header padded to a multiple of 8, data.
static uint64_t padding_for(const char *name, size_t fixed, uint64_t data, uint64_t file_bytes) {
  uint64_t padding = 0;
  for (int round = 0; round < 4; round++) {
    char entry[160];
    size_t header = fixed +
                    (size_t)snprintf(entry, sizeof entry,
                                     ",\"%s\":{\"dtype\":\"U8\",\"shape\":[%llu],"
                                     "\"data_offsets\":[%llu,%llu]}",
                                     name, (unsigned long long)padding, (unsigned long long)data,
                                     (unsigned long long)(data + padding)) +
                    1;
    header = (header + 7) / 8 * 8;
    if (8 + header + data > file_bytes) return 0;
    uint64_t wanted = file_bytes - 8 - header - data;
    if (wanted == padding && padding) return padding;
    padding = wanted;
  }
  return 0;
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
  size_t target = bytes < (1u << 20) ? (1u << 20) : bytes;
  const size_t header_room = 16384; // the header takes under 10 KiB, the padding tensor the rest
  size_t hidden = 64;
  while (model_bytes(hidden + 64) + header_room <= target) hidden += 64;
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
  // A u8 tensor of noise fills the file to exactly `target` bytes. Where its size's digits
  // would push the header's padding across it, a name one character longer moves the
  // padding (one of 8 lengths always fits).
  if (status == DEVBUF_OK) {
    uint64_t data;
    size_t fixed = header_without_end(s, metadata, 2, &data);
    char padding_name[32] = "padding";
    uint64_t padding = 0;
    for (int extra = 0; extra < 8 && !padding; extra++) {
      padding = padding_for(padding_name, fixed, data, target);
      if (!padding) strcat(padding_name, "_");
    }
    if (!padding)
      status =
          devbuf_set_error(DEVBUF_INVALID_ARGUMENT, "the sample model cannot be %zu bytes", target);
    else
      status = add(s, padding_name, DEVBUF_UINT8, (size_t)padding, 0);
  }
  if (status == DEVBUF_OK)
    status = devbuf_safetensors_write(path, s->tensors, s->count, metadata, 2);
  for (size_t i = 0; i < s->count; i++) devbuf_buffer_release(s->tensors[i].buffer);
  free(s);
  devbuf_device_release(device);
  return status;
}
