// The safetensors header: its length prefix, its JSON, and every rule of the reference
// reader checked before any tensor is handed out.
#include "../base/json.h"
#include "tensor_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

devbuf_status devbuf__safetensors_header_length(const unsigned char prefix[8], uint64_t file_size,
                                                uint64_t *out_header_size) {
  uint64_t length = 0;
  for (int i = 7; i >= 0; i--) length = length << 8 | prefix[i];
  if (length > DEVBUF_SAFETENSORS_MAX_HEADER)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "safetensors: header length %llu exceeds the limit of %u bytes",
                         (unsigned long long)length, DEVBUF_SAFETENSORS_MAX_HEADER);
  if (length > file_size - 8) // file_size >= 8 was checked by the caller
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "safetensors: header length %llu runs past the end of the %llu-byte file",
                         (unsigned long long)length, (unsigned long long)file_size);
  if (length < 2)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "safetensors: header length %llu cannot hold a JSON object",
                         (unsigned long long)length);
  *out_header_size = length;
  return DEVBUF_OK;
}

void devbuf_tensor_file_release(devbuf_tensor_file_t *file) {
  if (!file) return;
  for (size_t i = 0; i < file->count; i++) {
    devbuf__free(file->entries[i].name);
    devbuf__free(file->entries[i].shape);
    if (file->buffers) devbuf_buffer_release(file->buffers[i]);
  }
  for (size_t i = 0; i < file->metadata_count; i++) {
    devbuf__free(file->metadata[i].key);
    devbuf__free(file->metadata[i].value);
  }
  devbuf__free(file->entries);
  devbuf__free(file->by_name);
  devbuf__free(file->metadata);
  devbuf__free(file->buffers);
  devbuf__free(file);
}

// Grows an array of `element` bytes so that it holds one more than `count`.
static bool grow(void **array, size_t *capacity, size_t count, size_t element) {
  if (count < *capacity) return true;
  size_t wanted = *capacity ? *capacity * 2 : 16;
  void *bigger = devbuf__malloc(wanted * element);
  if (!bigger) return false;
  if (count) memcpy(bigger, *array, count * element);
  devbuf__free(*array);
  *array = bigger;
  *capacity = wanted;
  return true;
}

typedef struct parser {
  devbuf__json json;
  devbuf_tensor_file_t *file;
  size_t entry_capacity, metadata_capacity;
  bool has_metadata;
} parser;

static devbuf_status no_memory(void) {
  return devbuf__error(DEVBUF_OUT_OF_MEMORY, "safetensors: no host memory for the header's table");
}

static devbuf_status parse_metadata(parser *p) {
  devbuf__json *json = &p->json;
  if (p->has_metadata)
    return devbuf__error(DEVBUF_FORMAT_ERROR, "safetensors header: '__metadata__' appears twice");
  p->has_metadata = true;
  devbuf_status status = devbuf__json_expect(json, '{', "'__metadata__'");
  devbuf_tensor_file_t *file = p->file;
  bool more = true;
  for (size_t index = 0; status == DEVBUF_OK; index++) {
    status = devbuf__json_next(json, '}', index, &more, "'__metadata__'");
    if (status != DEVBUF_OK || !more) break;
    char *key = NULL, *value = NULL;
    status = devbuf__json_string(json, &key, "'__metadata__' key");
    if (status == DEVBUF_OK) status = devbuf__json_expect(json, ':', "'__metadata__'");
    if (status == DEVBUF_OK) {
      char context[160];
      snprintf(context, sizeof context,
               "'__metadata__' value of '%.100s' (metadata values are strings)", key);
      status = devbuf__json_string(json, &value, context);
    }
    if (status == DEVBUF_OK && !grow((void **)&file->metadata, &p->metadata_capacity,
                                     file->metadata_count, sizeof *file->metadata))
      status = no_memory();
    if (status == DEVBUF_OK) {
      file->metadata[file->metadata_count++] = (struct devbuf__metadata_pair){key, value};
      continue;
    }
    devbuf__free(key);
    devbuf__free(value);
  }
  return status;
}

static devbuf_status parse_dtype(devbuf__json *json, const char *context, devbuf_dtype *out) {
  char *name;
  devbuf_status status = devbuf__json_string(json, &name, context);
  if (status != DEVBUF_OK) return status;
  for (int dtype = 0; dtype < DEVBUF_DTYPE_COUNT; dtype++) {
    if (strcmp(devbuf_dtype_safetensors_name((devbuf_dtype)dtype), name) == 0) {
      devbuf__free(name);
      *out = (devbuf_dtype)dtype;
      return DEVBUF_OK;
    }
  }
  status = devbuf__error(DEVBUF_FORMAT_ERROR, "safetensors header: %s: unknown dtype '%.40s'",
                         context, name);
  devbuf__free(name);
  return status;
}

static devbuf_status parse_shape(devbuf__json *json, const char *context,
                                 devbuf__tensor_entry *entry) {
  devbuf_status status = devbuf__json_expect(json, '[', context);
  size_t dims[DEVBUF_MAX_NDIM];
  size_t ndim = 0;
  bool more = true;
  for (size_t index = 0; status == DEVBUF_OK; index++) {
    status = devbuf__json_next(json, ']', index, &more, context);
    if (status != DEVBUF_OK || !more) break;
    uint64_t dim;
    status = devbuf__json_u64(json, &dim, context);
    if (status != DEVBUF_OK) break;
    if (ndim == DEVBUF_MAX_NDIM)
      return devbuf__error(DEVBUF_UNSUPPORTED, "safetensors header: %s has more than %d dimensions",
                           context, DEVBUF_MAX_NDIM);
    if (dim != (size_t)dim) // a 32-bit build: never cut a dimension short
      return devbuf__error(DEVBUF_OVERFLOW, "safetensors header: %s has dimension %llu, past %zu",
                           context, (unsigned long long)dim, (size_t)SIZE_MAX);
    dims[ndim++] = (size_t)dim;
  }
  if (status != DEVBUF_OK) return status;
  entry->ndim = ndim;
  if (ndim) {
    entry->shape = devbuf__malloc(ndim * sizeof(size_t));
    if (!entry->shape) return no_memory();
    memcpy(entry->shape, dims, ndim * sizeof(size_t));
  }
  return DEVBUF_OK;
}

static devbuf_status parse_offsets(devbuf__json *json, const char *context,
                                   devbuf__tensor_entry *entry) {
  devbuf_status status = devbuf__json_expect(json, '[', context);
  uint64_t values[2];
  size_t count = 0;
  bool more = true;
  for (size_t index = 0; status == DEVBUF_OK; index++) {
    status = devbuf__json_next(json, ']', index, &more, context);
    if (status != DEVBUF_OK || !more) break;
    uint64_t value;
    status = devbuf__json_u64(json, &value, context);
    if (status == DEVBUF_OK && count == 2)
      return devbuf__error(DEVBUF_FORMAT_ERROR, "safetensors header: %s has more than 2 entries",
                           context);
    if (status == DEVBUF_OK) values[count++] = value;
  }
  if (status != DEVBUF_OK) return status;
  if (count != 2)
    return devbuf__error(DEVBUF_FORMAT_ERROR, "safetensors header: %s has %zu entries, not 2",
                         context, count);
  entry->begin = values[0];
  entry->end = values[1];
  return DEVBUF_OK;
}

// {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}: exactly these three fields.
static devbuf_status parse_tensor(parser *p, devbuf__tensor_entry *entry) {
  devbuf__json *json = &p->json;
  char context[160];
  snprintf(context, sizeof context, "tensor '%.100s'", entry->name);
  devbuf_status status = devbuf__json_expect(json, '{', context);
  enum { DTYPE = 1, SHAPE = 2, OFFSETS = 4 };
  unsigned seen = 0;
  bool more = true;
  for (size_t index = 0; status == DEVBUF_OK; index++) {
    status = devbuf__json_next(json, '}', index, &more, context);
    if (status != DEVBUF_OK || !more) break;
    char *field;
    status = devbuf__json_string(json, &field, context);
    if (status != DEVBUF_OK) break;
    unsigned which = strcmp(field, "dtype") == 0          ? DTYPE
                     : strcmp(field, "shape") == 0        ? SHAPE
                     : strcmp(field, "data_offsets") == 0 ? OFFSETS
                                                          : 0;
    char field_context[240];
    snprintf(field_context, sizeof field_context, "%s field '%.40s'", context, field);
    devbuf__free(field);
    if (!which)
      return devbuf__error(DEVBUF_FORMAT_ERROR, "safetensors header: %s: unknown field",
                           field_context);
    if (seen & which)
      return devbuf__error(DEVBUF_FORMAT_ERROR, "safetensors header: %s appears twice",
                           field_context);
    seen |= which;
    status = devbuf__json_expect(json, ':', context);
    if (status != DEVBUF_OK) break;
    if (which == DTYPE) status = parse_dtype(json, field_context, &entry->dtype);
    if (which == SHAPE) status = parse_shape(json, field_context, entry);
    if (which == OFFSETS) status = parse_offsets(json, field_context, entry);
  }
  if (status != DEVBUF_OK) return status;
  if (seen != (DTYPE | SHAPE | OFFSETS))
    return devbuf__error(DEVBUF_FORMAT_ERROR, "safetensors header: %s lacks the field '%s'",
                         context,
                         !(seen & DTYPE)   ? "dtype"
                         : !(seen & SHAPE) ? "shape"
                                           : "data_offsets");
  return DEVBUF_OK;
}

static devbuf_status parse_members(parser *p) {
  devbuf__json *json = &p->json;
  devbuf_tensor_file_t *file = p->file;
  size_t at = 0; // JSON lets blanks come first, and the reference reads them
  while (at < json->size && strchr(" \t\r\n", json->text[at]) && json->text[at]) at++;
  if (at == json->size)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "safetensors header: does not start with '{' (its %zu bytes are blanks)",
                         at);
  if (json->text[at] != '{')
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "safetensors header: does not start with '{' (byte %zu is 0x%02x)", at,
                         (unsigned)(unsigned char)json->text[at]);
  json->pos = at + 1;
  bool more = true;
  devbuf_status status = DEVBUF_OK;
  for (size_t index = 0; status == DEVBUF_OK; index++) {
    status = devbuf__json_next(json, '}', index, &more, "top-level object");
    if (status != DEVBUF_OK || !more) break;
    char *name;
    status = devbuf__json_string(json, &name, "tensor name");
    if (status == DEVBUF_OK) status = devbuf__json_expect(json, ':', "after a tensor name");
    if (status == DEVBUF_OK && strcmp(name, "__metadata__") == 0) {
      devbuf__free(name);
      if (devbuf__json_peek(json) == 'n' && json->size - json->pos >= 4 &&
          memcmp(json->text + json->pos, "null", 4) == 0) {
        if (p->has_metadata)
          return devbuf__error(DEVBUF_FORMAT_ERROR,
                               "safetensors header: '__metadata__' appears twice");
        p->has_metadata = true;
        json->pos += 4;
      } else {
        status = parse_metadata(p);
      }
      continue;
    }
    if (status == DEVBUF_OK &&
        !grow((void **)&file->entries, &p->entry_capacity, file->count, sizeof *file->entries))
      status = no_memory();
    if (status != DEVBUF_OK) {
      devbuf__free(name);
      break;
    }
    devbuf__tensor_entry *entry = &file->entries[file->count++];
    memset(entry, 0, sizeof *entry);
    entry->name = name;
    status = parse_tensor(p, entry);
  }
  if (status == DEVBUF_OK) status = devbuf__json_end(json);
  return status;
}

static int compare_offsets(const void *a, const void *b) {
  const devbuf__tensor_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

typedef struct named {
  const char *name;
  size_t index;
} named;

static int compare_named(const void *a, const void *b) {
  const named *x = a, *y = b;
  int order = strcmp(x->name, y->name);
  return order ? order : (x->index > y->index) - (x->index < y->index);
}

// Sorts `count` names (with their indices); FORMAT_ERROR names the first one given twice.
// Sorting keeps a hostile header with millions of names from costing count^2.
static devbuf_status sort_names(named *names, size_t count, const char *what) {
  qsort(names, count, sizeof *names, compare_named);
  for (size_t i = 1; i < count; i++)
    if (strcmp(names[i].name, names[i - 1].name) == 0)
      return devbuf__error(DEVBUF_FORMAT_ERROR, "safetensors header: %s '%.100s' appears twice",
                           what, names[i].name);
  return DEVBUF_OK;
}

// Each tensor's size agrees with its dtype and shape; the tensors tile the data section.
static devbuf_status validate(devbuf_tensor_file_t *file) {
  for (size_t i = 0; i < file->count; i++) {
    devbuf__tensor_entry *e = &file->entries[i];
    size_t count = 1;
    for (size_t d = 0; d < e->ndim; d++)
      if (devbuf__mul_overflows(count, e->shape[d], &count))
        return devbuf__error(DEVBUF_FORMAT_ERROR,
                             "safetensors header: tensor '%.100s': the element count of its "
                             "shape overflows at dimension %zu (%zu)",
                             e->name, d, e->shape[d]);
    size_t bytes;
    unsigned bits = devbuf_dtype_bits(e->dtype);
    if (devbuf__mul_overflows(count, bits, &bytes))
      return devbuf__error(DEVBUF_FORMAT_ERROR,
                           "safetensors header: tensor '%.100s': %zu elements of %s overflow",
                           e->name, count, devbuf_dtype_safetensors_name(e->dtype));
    if (bytes % 8)
      return devbuf__error(DEVBUF_FORMAT_ERROR,
                           "safetensors header: tensor '%.100s': %zu elements of %u bits do "
                           "not fill whole bytes",
                           e->name, count, bits);
    bytes /= 8;
    // What a buffer of this shape must satisfy (its strides too, where an extent of 0 leaves
    // no element), judged as devbuf_buffer_new judges it.
    size_t shape_bytes;
    if (devbuf__shape_bytes(e->dtype, e->shape, e->ndim, &shape_bytes, NULL) != DEVBUF_OK)
      return devbuf__error_cause(DEVBUF_FORMAT_ERROR, "safetensors header: tensor '%.100s'",
                                 e->name);
    if (e->end < e->begin)
      return devbuf__error(DEVBUF_FORMAT_ERROR,
                           "safetensors header: tensor '%.100s': data_offsets [%llu, %llu] "
                           "end before they begin",
                           e->name, (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end - e->begin != bytes)
      return devbuf__error(DEVBUF_FORMAT_ERROR,
                           "safetensors header: tensor '%.100s': data_offsets [%llu, %llu] "
                           "span %llu bytes but %zu elements of %s take %zu",
                           e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                           (unsigned long long)(e->end - e->begin), count,
                           devbuf_dtype_safetensors_name(e->dtype), bytes);
  }
  if (file->count > 1) qsort(file->entries, file->count, sizeof *file->entries, compare_offsets);
  uint64_t position = 0;
  for (size_t i = 0; i < file->count; i++) {
    const devbuf__tensor_entry *e = &file->entries[i];
    const char *previous = i ? file->entries[i - 1].name : NULL;
    if (e->begin < position)
      return devbuf__error(DEVBUF_FORMAT_ERROR,
                           "safetensors header: tensor '%.100s' at [%llu, %llu) overlaps "
                           "tensor '%.100s', which ends at %llu",
                           e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                           previous, (unsigned long long)position);
    if (e->begin > position)
      return devbuf__error(DEVBUF_FORMAT_ERROR,
                           "safetensors header: bytes [%llu, %llu) before tensor '%.100s' "
                           "belong to no tensor",
                           (unsigned long long)position, (unsigned long long)e->begin, e->name);
    position = e->end;
    if (position > file->data_size)
      return devbuf__error(DEVBUF_FORMAT_ERROR,
                           "safetensors header: tensor '%.100s' ends at %llu, past the data "
                           "section of %llu bytes",
                           e->name, (unsigned long long)position,
                           (unsigned long long)file->data_size);
  }
  if (position != file->data_size)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "safetensors header: the tensors end at %llu but the data section "
                         "holds %llu bytes",
                         (unsigned long long)position, (unsigned long long)file->data_size);

  size_t most = file->count > file->metadata_count ? file->count : file->metadata_count;
  named *names = devbuf__malloc((most ? most : 1) * sizeof *names);
  file->by_name = devbuf__malloc((file->count ? file->count : 1) * sizeof(size_t));
  if (!names || !file->by_name) {
    devbuf__free(names);
    return no_memory();
  }
  for (size_t i = 0; i < file->metadata_count; i++) names[i] = (named){file->metadata[i].key, i};
  devbuf_status status = sort_names(names, file->metadata_count, "metadata key");
  for (size_t i = 0; i < file->count; i++) names[i] = (named){file->entries[i].name, i};
  if (status == DEVBUF_OK) status = sort_names(names, file->count, "tensor");
  for (size_t i = 0; i < file->count; i++) file->by_name[i] = names[i].index;
  devbuf__free(names);
  return status;
}

devbuf_status devbuf__safetensors_parse_header(const char *header, uint64_t header_size,
                                               uint64_t data_size,
                                               devbuf_tensor_file_t **out_file) {
  parser p = {.json = {.text = header, .size = (size_t)header_size, .what = "safetensors header"}};
  p.file = devbuf__calloc(1, sizeof *p.file);
  if (!p.file) return no_memory();
  p.file->header_size = header_size;
  p.file->data_size = data_size;
  devbuf_status status = parse_members(&p);
  if (status == DEVBUF_OK) status = validate(p.file);
  if (status != DEVBUF_OK) {
    devbuf_tensor_file_release(p.file);
    return status;
  }
  *out_file = p.file;
  return DEVBUF_OK;
}

devbuf_status devbuf_safetensors_parse(const void *data, size_t size,
                                       devbuf_tensor_file_t **out_file) {
  if (!out_file || (!data && size))
    return devbuf__null_argument("safetensors_parse", "data, out_file",
                                 (const void *[]){data, out_file});
  if (size < 8)
    return devbuf__error(
        DEVBUF_FORMAT_ERROR,
        "safetensors: the image has %zu bytes, too few for the 8-byte header length", size);
  uint64_t header_size = 0;
  devbuf_status status = devbuf__safetensors_header_length(data, size, &header_size);
  if (status != DEVBUF_OK) return status;
  return devbuf__safetensors_parse_header((const char *)data + 8, header_size,
                                          size - 8 - header_size, out_file);
}

// ---- the table's accessors ----------------------------------------------------------------

size_t devbuf_tensor_file_count(const devbuf_tensor_file_t *file) { return file ? file->count : 0; }

devbuf_status devbuf_tensor_file_info(const devbuf_tensor_file_t *file, size_t index,
                                      devbuf_tensor_info_t *out_info) {
  if (!file || !out_info)
    return devbuf__null_argument("tensor_file_info", "file, out_info",
                                 (const void *[]){file, out_info});
  if (index >= file->count)
    return devbuf__error(DEVBUF_OUT_OF_RANGE,
                         "tensor_file_info: index %zu, but the file holds %zu tensors", index,
                         file->count);
  const devbuf__tensor_entry *e = &file->entries[index];
  *out_info = (devbuf_tensor_info_t){.name = e->name,
                                     .dtype = e->dtype,
                                     .ndim = e->ndim,
                                     .shape = e->shape,
                                     .begin = e->begin,
                                     .end = e->end,
                                     .file_offset = 8 + file->header_size + e->begin};
  return DEVBUF_OK;
}

devbuf_status devbuf_tensor_file_find(const devbuf_tensor_file_t *file, const char *name,
                                      size_t *out_index) {
  if (!file || !name || !out_index)
    return devbuf__null_argument("tensor_file_find", "file, name, out_index",
                                 (const void *[]){file, name, out_index});
  size_t low = 0, high = file->count;
  while (low < high) {
    size_t middle = low + (high - low) / 2;
    int order = strcmp(file->entries[file->by_name[middle]].name, name);
    if (order == 0) {
      *out_index = file->by_name[middle];
      return DEVBUF_OK;
    }
    if (order < 0)
      low = middle + 1;
    else
      high = middle;
  }
  return devbuf__error(DEVBUF_NOT_FOUND, "no tensor named '%.200s' among %zu", name, file->count);
}

devbuf_buffer_t *devbuf_tensor_file_buffer(const devbuf_tensor_file_t *file, size_t index) {
  return file && file->buffers && index < file->count ? file->buffers[index] : NULL;
}

size_t devbuf_tensor_file_metadata_count(const devbuf_tensor_file_t *file) {
  return file ? file->metadata_count : 0;
}

devbuf_status devbuf_tensor_file_metadata(const devbuf_tensor_file_t *file, size_t index,
                                          const char **out_key, const char **out_value) {
  if (!file || !out_key || !out_value)
    return devbuf__null_argument("tensor_file_metadata", "file, out_key, out_value",
                                 (const void *[]){file, out_key, out_value});
  if (index >= file->metadata_count)
    return devbuf__error(DEVBUF_OUT_OF_RANGE,
                         "tensor_file_metadata: index %zu, but the file has %zu entries", index,
                         file->metadata_count);
  *out_key = file->metadata[index].key;
  *out_value = file->metadata[index].value;
  return DEVBUF_OK;
}

const char *devbuf_tensor_file_metadata_get(const devbuf_tensor_file_t *file, const char *key) {
  for (size_t i = 0; file && key && i < file->metadata_count; i++)
    if (strcmp(file->metadata[i].key, key) == 0) return file->metadata[i].value;
  return NULL;
}

uint64_t devbuf_tensor_file_header_size(const devbuf_tensor_file_t *file) {
  return file ? file->header_size : 0;
}
uint64_t devbuf_tensor_file_data_size(const devbuf_tensor_file_t *file) {
  return file ? file->data_size : 0;
}
