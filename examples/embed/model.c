// all-MiniLM-L6-v2: the weights and the forward graph.
#include "model.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// ---- weights -------------------------------------------------------------------------------

// A tensor the model uses: its name (%d: the layer), shape, and where its buffer goes.
typedef struct tensor_spec {
  const char *name;
  size_t rows, cols; // cols 0: a vector of `rows`
  size_t at;         // offsetof the buffer pointer in embed_model_t or embed_layer_t
} tensor_spec;

#define MODEL(field) offsetof(embed_model_t, field)
#define LAYER(field) offsetof(embed_layer_t, field)

static const tensor_spec model_tensors[] = {
    {"embeddings.word_embeddings.weight", EMBED_VOCAB, EMBED_HIDDEN, MODEL(word)},
    {"embeddings.position_embeddings.weight", EMBED_POSITIONS, EMBED_HIDDEN, MODEL(position)},
    {"embeddings.token_type_embeddings.weight", 2, EMBED_HIDDEN, MODEL(type)},
    {"embeddings.LayerNorm.weight", EMBED_HIDDEN, 0, MODEL(norm_g)},
    {"embeddings.LayerNorm.bias", EMBED_HIDDEN, 0, MODEL(norm_b)},
};

static const tensor_spec layer_tensors[] = {
    {"encoder.layer.%d.attention.self.query.weight", EMBED_HIDDEN, EMBED_HIDDEN, LAYER(query_w)},
    {"encoder.layer.%d.attention.self.query.bias", EMBED_HIDDEN, 0, LAYER(query_b)},
    {"encoder.layer.%d.attention.self.key.weight", EMBED_HIDDEN, EMBED_HIDDEN, LAYER(key_w)},
    {"encoder.layer.%d.attention.self.key.bias", EMBED_HIDDEN, 0, LAYER(key_b)},
    {"encoder.layer.%d.attention.self.value.weight", EMBED_HIDDEN, EMBED_HIDDEN, LAYER(value_w)},
    {"encoder.layer.%d.attention.self.value.bias", EMBED_HIDDEN, 0, LAYER(value_b)},
    {"encoder.layer.%d.attention.output.dense.weight", EMBED_HIDDEN, EMBED_HIDDEN, LAYER(out_w)},
    {"encoder.layer.%d.attention.output.dense.bias", EMBED_HIDDEN, 0, LAYER(out_b)},
    {"encoder.layer.%d.attention.output.LayerNorm.weight", EMBED_HIDDEN, 0, LAYER(norm1_g)},
    {"encoder.layer.%d.attention.output.LayerNorm.bias", EMBED_HIDDEN, 0, LAYER(norm1_b)},
    {"encoder.layer.%d.intermediate.dense.weight", EMBED_FFN, EMBED_HIDDEN, LAYER(up_w)},
    {"encoder.layer.%d.intermediate.dense.bias", EMBED_FFN, 0, LAYER(up_b)},
    {"encoder.layer.%d.output.dense.weight", EMBED_HIDDEN, EMBED_FFN, LAYER(down_w)},
    {"encoder.layer.%d.output.dense.bias", EMBED_HIDDEN, 0, LAYER(down_b)},
    {"encoder.layer.%d.output.LayerNorm.weight", EMBED_HIDDEN, 0, LAYER(norm2_g)},
    {"encoder.layer.%d.output.LayerNorm.bias", EMBED_HIDDEN, 0, LAYER(norm2_b)},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void describe_shape(char *out, size_t size, size_t ndim, const size_t *shape) {
  size_t used = (size_t)snprintf(out, size, "[");
  for (size_t d = 0; d < ndim && used < size; d++)
    used += (size_t)snprintf(out + used, size - used, "%s%zu", d ? ", " : "", shape[d]);
  if (used < size) snprintf(out + used, size - used, "]");
}

// Where every tensor must be: on the CPU a view of the one mapping at the tensor's place in
// the file; on a device, in one storage of device memory. Found from the first tensor.
typedef struct weights_place {
  bool zero_copy;
  size_t copied;    // CPU: tensors the loader copied (misaligned in the file), not views
  const char *base; // the file's first byte in memory (zero-copy); NULL until the first
  uint64_t storage; // the storage all tensors share; 0 until the first
} weights_place;

// Finds `name`, checks its dtype and shape, checks where its memory is, retains it.
static int take_tensor(devbuf_device_t *device, const devbuf_tensor_file_t *file, const char *path,
                       const char *name, size_t rows, size_t cols, weights_place *place,
                       devbuf_buffer_t **out, char *err, size_t err_size) {
  size_t index;
  devbuf_tensor_info_t info;
  if (devbuf_tensor_file_find(file, name, &index) != DEVBUF_OK ||
      devbuf_tensor_file_info(file, index, &info) != DEVBUF_OK) {
    snprintf(err, err_size, "%s: no tensor '%s'", path, name);
    return -1;
  }
  bool vector = cols == 0;
  if (info.dtype != DEVBUF_FLOAT32 || info.ndim != (vector ? 1u : 2u) || info.shape[0] != rows ||
      (!vector && info.shape[1] != cols)) {
    char have[128], want[64];
    describe_shape(have, sizeof have, info.ndim, info.shape);
    if (vector)
      snprintf(want, sizeof want, "[%zu]", rows);
    else
      snprintf(want, sizeof want, "[%zu, %zu]", rows, cols);
    snprintf(err, err_size, "%s: tensor '%s' is %s %s; expected F32 %s", path, name,
             devbuf_dtype_safetensors_name(info.dtype), have, want);
    return -1;
  }
  devbuf_buffer_t *buffer = devbuf_tensor_file_buffer(file, index);
  if (!buffer) {
    snprintf(err, err_size, "%s: tensor '%s' has no buffer", path, name);
    return -1;
  }
  if (!place->storage) place->storage = devbuf_buffer_storage_id(buffer);
  bool shared = devbuf_buffer_storage_id(buffer) == place->storage;
  if (place->zero_copy && devbuf_buffer_is_mapped(buffer)) {
    // A view of the mapping at the tensor's place in the file.
    const void *data = NULL;
    if (devbuf_buffer_contents(buffer, &data, NULL) != DEVBUF_OK) {
      snprintf(err, err_size, "%s: tensor '%s': %s", path, name, devbuf_last_error());
      return -1;
    }
    devbuf_buffer_end_access(buffer, data);
    if (!place->base) place->base = (const char *)data - info.file_offset;
    if ((const char *)data != place->base + info.file_offset || !shared) {
      snprintf(err, err_size, "%s: tensor '%s' is not at its place in the one mapping", path, name);
      return -1;
    }
  } else if (place->zero_copy) {
    // The loader copied it: its offset in the file is no multiple of a float's size.
    place->copied++;
  } else if (!shared || devbuf_buffer_is_mapped(buffer) ||
             devbuf_buffer_is_cpu_accessible(buffer)) {
    snprintf(err, err_size, "%s: tensor '%s' is not in the one allocation of %s's memory", path,
             name, devbuf_device_spec(device));
    return -1;
  }
  *out = devbuf_buffer_retain(buffer);
  return 0;
}

// Whether the model uses a tensor: only those are loaded (the position ids and the pooler
// are left in the file). A layer past the model's is remembered: a deeper model's file.
static int used_by_model(void *context, size_t index, const devbuf_tensor_info_t *info) {
  (void)index;
  char *extra_layer = context;
  for (size_t i = 0; i < COUNT(model_tensors); i++)
    if (strcmp(info->name, model_tensors[i].name) == 0) return 1;
  for (int l = 0; l < EMBED_LAYERS; l++) {
    for (size_t i = 0; i < COUNT(layer_tensors); i++) {
      char name[128];
      snprintf(name, sizeof name, layer_tensors[i].name, l);
      if (strcmp(info->name, name) == 0) return 1;
    }
  }
  unsigned layer;
  int consumed = 0;
  if (!extra_layer[0] && sscanf(info->name, "encoder.layer.%u.%n", &layer, &consumed) == 1 &&
      consumed > 0 && layer >= EMBED_LAYERS)
    snprintf(extra_layer, 128, "%s", info->name);
  return 0;
}

int embed_model_folder(const char *dir, char *err, size_t err_size) {
  struct stat st;
  int missing = stat(dir, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  if (missing) snprintf(err, err_size, "model folder '%s': %s", dir, strerror(missing));
  return missing ? -1 : 0;
}

int embed_model_load(devbuf_device_t *device, const char *dir, embed_model_t **out_model, char *err,
                     size_t err_size) {
  if (embed_model_folder(dir, err, err_size) != 0) return -1;
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", dir) >= sizeof path) {
    snprintf(err, err_size, "model folder '%.200s...': path too long", dir);
    return -1;
  }
  embed_model_t *model = calloc(1, sizeof *model);
  if (!model) {
    snprintf(err, err_size, "no memory for the model");
    return -1;
  }
  // The CPU loads zero-copy: every tensor a view of the mapping. Devices get copies in one
  // allocation of the device's memory: through the caching allocator's size classes, one
  // allocation per tensor (30 below 1 MiB, 12 of 2.25 MiB) left a tenth of the 2 MiB and
  // 20 MiB segments empty.
  bool cpu = devbuf_device_kind_of(device) == DEVBUF_DEVICE_CPU;
  if (embed_model_check_settings(dir, &model->max_tokens, err, err_size) != 0) {
    free(model);
    return -1;
  }
  char extra_layer[128] = "";
  devbuf_load_options_t options = {
      .flags = DEVBUF_LOAD_ONE_ALLOCATION, .context = extra_layer, .select = used_by_model};
  devbuf_tensor_file_t *file = NULL;
  devbuf_status loaded = devbuf_safetensors_load(device, path, &options, &file);
  if (loaded != DEVBUF_OK) {
    snprintf(err, err_size, "%s%s", loaded == DEVBUF_OUT_OF_MEMORY ? "device out of memory: " : "",
             devbuf_last_error());
    free(model);
    return -1;
  }
  if (extra_layer[0]) {
    snprintf(err, err_size,
             "%s: tensor '%s' belongs to a layer past the model's %d: a deeper model, whose "
             "other layers this program would skip",
             path, extra_layer, EMBED_LAYERS);
    devbuf_tensor_file_release(file);
    free(model);
    return -1;
  }
  weights_place place = {.zero_copy = cpu};
  int failed = 0;
  for (size_t i = 0; i < COUNT(model_tensors) && !failed; i++) {
    const tensor_spec *t = &model_tensors[i];
    failed = take_tensor(device, file, path, t->name, t->rows, t->cols, &place,
                         (devbuf_buffer_t **)((char *)model + t->at), err, err_size);
  }
  for (int l = 0; l < EMBED_LAYERS && !failed; l++) {
    for (size_t i = 0; i < COUNT(layer_tensors) && !failed; i++) {
      const tensor_spec *t = &layer_tensors[i];
      char name[128];
      snprintf(name, sizeof name, t->name, l);
      failed = take_tensor(device, file, path, name, t->rows, t->cols, &place,
                           (devbuf_buffer_t **)((char *)&model->layers[l] + t->at), err, err_size);
    }
  }
  // The feed-forward layer's parts: views of the rows of its first matrix and bias.
  size_t part_rows = EMBED_FFN / EMBED_FFN_PARTS, f32 = sizeof(float);
  for (int l = 0; l < EMBED_LAYERS && !failed; l++) {
    embed_layer_t *w = &model->layers[l];
    for (size_t p = 0; p < EMBED_FFN_PARTS && !failed; p++) {
      failed = devbuf_buffer_view(w->up_w, p * part_rows * EMBED_HIDDEN * f32,
                                  part_rows * EMBED_HIDDEN * f32, &w->up_w_part[p]) != DEVBUF_OK ||
               devbuf_buffer_view(w->up_b, p * part_rows * f32, part_rows * f32,
                                  &w->up_b_part[p]) != DEVBUF_OK;
      if (failed) snprintf(err, err_size, "%s", devbuf_last_error());
    }
  }
  model->zero_copy = cpu && !failed && place.copied == 0;
  devbuf_tensor_file_release(file); // the model holds its tensors
  if (failed) {
    embed_model_free(model);
    return -1;
  }
  for (size_t i = 0; i < COUNT(model_tensors); i++)
    model->weight_bytes +=
        devbuf_buffer_size(*(devbuf_buffer_t **)((char *)model + model_tensors[i].at));
  for (int l = 0; l < EMBED_LAYERS; l++)
    for (size_t i = 0; i < COUNT(layer_tensors); i++)
      model->weight_bytes += devbuf_buffer_size(
          *(devbuf_buffer_t **)((char *)&model->layers[l] + layer_tensors[i].at));
  *out_model = model;
  return 0;
}

void embed_model_free(embed_model_t *model) {
  if (!model) return;
  for (size_t i = 0; i < COUNT(model_tensors); i++)
    devbuf_buffer_release(*(devbuf_buffer_t **)((char *)model + model_tensors[i].at));
  for (int l = 0; l < EMBED_LAYERS; l++) {
    for (size_t i = 0; i < COUNT(layer_tensors); i++)
      devbuf_buffer_release(*(devbuf_buffer_t **)((char *)&model->layers[l] + layer_tensors[i].at));
    for (size_t p = 0; p < EMBED_FFN_PARTS; p++) {
      devbuf_buffer_release(model->layers[l].up_w_part[p]);
      devbuf_buffer_release(model->layers[l].up_b_part[p]);
    }
  }
  free(model);
}

// ---- the forward graph ---------------------------------------------------------------------

// A lazy activation of `rows` x `cols` floats: its memory comes when the kernel that writes
// it is submitted, so that it may reuse memory that earlier work still uses (ordered after
// that work), as released activations are.
static devbuf_status activation(embed_exec_t *x, size_t rows, size_t cols, devbuf_buffer_t **out) {
  size_t shape[2] = {rows, cols};
  return devbuf_buffer_new(devbuf_device_allocator(x->device), DEVBUF_FLOAT32, shape, 2, 0, out);
}

static void drop(devbuf_buffer_t **buffer) {
  devbuf_buffer_release(*buffer);
  *buffer = NULL;
}

#define TRY(call)                                  \
  do {                                             \
    if ((status = (call)) != DEVBUF_OK) goto done; \
  } while (0)

devbuf_status embed_model_forward(const embed_model_t *m, embed_exec_t *x, devbuf_buffer_t *ids,
                                  devbuf_buffer_t *mask, devbuf_buffer_t *embeddings, size_t seqs,
                                  size_t tokens, size_t capacity) {
  const embed_kernels_t *k = x->k;
  const embed_shape_t b = {mask, seqs, tokens}, *s = &b;
  size_t hidden = EMBED_HIDDEN, part = EMBED_FFN / EMBED_FFN_PARTS;
  devbuf_buffer_t *h = NULL, *q = NULL, *key = NULL, *v = NULL, *ctx = NULL, *a = NULL;
  devbuf_buffer_t *h1 = NULL, *f[EMBED_FFN_PARTS] = {NULL}, *o = NULL;
  devbuf_status status;
  TRY(activation(x, capacity, hidden, &h));
  TRY(k->embed(x, s, h, ids, m->word, m->position, m->type, m->norm_g, m->norm_b));
  for (int l = 0; l < EMBED_LAYERS; l++) {
    const embed_layer_t *w = &m->layers[l];
    TRY(activation(x, capacity, hidden, &q));
    TRY(activation(x, capacity, hidden, &key));
    TRY(activation(x, capacity, hidden, &v));
    devbuf_buffer_t *qkv[] = {q, key, v}, *qkv_w[] = {w->query_w, w->key_w, w->value_w};
    devbuf_buffer_t *qkv_b[] = {w->query_b, w->key_b, w->value_b};
    TRY(k->linear(x, s, qkv, h, qkv_w, qkv_b, 3, hidden, hidden, false));
    TRY(activation(x, capacity, hidden, &ctx));
    TRY(k->attention(x, s, ctx, q, key, v));
    drop(&q), drop(&key), drop(&v);
    TRY(activation(x, capacity, hidden, &a));
    TRY(k->linear(x, s, &a, ctx, &w->out_w, &w->out_b, 1, hidden, hidden, false));
    drop(&ctx);
    TRY(activation(x, capacity, hidden, &h1));
    TRY(k->add_norm(x, s, h1, a, h, w->norm1_g, w->norm1_b));
    drop(&a), drop(&h);
    for (size_t p = 0; p < EMBED_FFN_PARTS; p++) TRY(activation(x, capacity, part, &f[p]));
    TRY(k->linear(x, s, f, h1, w->up_w_part, w->up_b_part, EMBED_FFN_PARTS, part, hidden, true));
    TRY(activation(x, capacity, hidden, &o));
    TRY(k->linear_parts(x, s, o, f, w->down_w, w->down_b, hidden, part));
    for (size_t p = 0; p < EMBED_FFN_PARTS; p++) drop(&f[p]);
    TRY(activation(x, capacity, hidden, &h));
    TRY(k->add_norm(x, s, h, o, h1, w->norm2_g, w->norm2_b));
    drop(&o), drop(&h1);
  }
  TRY(k->pool(x, s, embeddings, h));
done:
  devbuf_buffer_release(h), devbuf_buffer_release(q), devbuf_buffer_release(key);
  devbuf_buffer_release(v), devbuf_buffer_release(ctx), devbuf_buffer_release(a);
  devbuf_buffer_release(h1), devbuf_buffer_release(o);
  for (size_t p = 0; p < EMBED_FFN_PARTS; p++) devbuf_buffer_release(f[p]);
  return status;
}
