// Loading safetensors files: the header alone (inspect), or every tensor as a buffer —
// zero-copy views of one read-only mapping where the device can read host memory, copies
// read from the file (pread) elsewhere or when asked for.
#include "tensor_file.h"

#include <string.h>
#include <unistd.h>

// File reads for devices the CPU cannot address, in pieces of whole elements of every dtype
// (6-bit ones come 4 to 3 bytes).
#define STAGING_BYTES ((size_t)6 << 20)

// Where the table's bytes come from: the open file (pread), or its mapping, read with a
// guard so that a file cut short under the mapping answers IO_ERROR, not SIGBUS.
typedef struct table_source {
  int fd;                        // or -1: `mapped`
  const devbuf_memory_t *mapped; // the whole file's mapping
  const char *path;
} table_source;

static devbuf_status read_source(const table_source *source, void *out, size_t size,
                                 uint64_t offset) {
  if (source->fd >= 0) return devbuf__read_at(source->fd, out, size, offset, source->path);
  return devbuf__guarded_file_copy(out, source->mapped, (size_t)offset, size, source->path);
}

// The table (without buffers) of the file: its 8-byte prefix and header, read. A format error
// names the file (a model comes in several).
static devbuf_status read_table(const table_source *source, uint64_t file_size,
                                devbuf_tensor_file_t **out_file) {
  const char *path = source->path;
  if (file_size < 8)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "safetensors: '%.200s' has %llu bytes, too few for the 8-byte header "
                         "length",
                         path, (unsigned long long)file_size);
  unsigned char prefix[8];
  uint64_t header_size = 0;
  devbuf_status status = read_source(source, prefix, 8, 0);
  if (status != DEVBUF_OK) return status;
  status = devbuf__safetensors_header_length(prefix, file_size, &header_size);
  char *header = NULL;
  if (status == DEVBUF_OK && !(header = devbuf__malloc(header_size ? (size_t)header_size : 1)))
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a %llu-byte header",
                         (unsigned long long)header_size);
  if (status == DEVBUF_OK &&
      (status = read_source(source, header, (size_t)header_size, 8)) != DEVBUF_OK) {
    devbuf__free(header);
    return status;
  }
  if (status == DEVBUF_OK)
    status = devbuf__safetensors_parse_header(header, header_size, file_size - 8 - header_size,
                                              out_file);
  devbuf__free(header);
  if (status != DEVBUF_OK) devbuf__error_cause(status, "the header of '%.200s'", path);
  return status;
}

devbuf_status devbuf_safetensors_inspect(const char *path, devbuf_tensor_file_t **out_file) {
  if (!path || !out_file)
    return devbuf__null_argument("safetensors_inspect", "path, out_file",
                                 (const void *[]){path, out_file});
  int fd = -1;
  uint64_t file_size = 0;
  devbuf_status status = devbuf__open_regular_file(path, &fd, &file_size);
  if (status != DEVBUF_OK) return status;
  status = read_table(&(table_source){fd, NULL, path}, file_size, out_file);
  close(fd);
  return status;
}

// Reads `size` file bytes at `offset` into `target` (of that size): straight into its memory
// when the CPU can address it, else through the host-visible `staging` buffer.
static devbuf_status read_into(int fd, uint64_t offset, devbuf_buffer_t *target,
                               devbuf_buffer_t *staging, const char *path) {
  size_t size = devbuf_buffer_size(target);
  if (!size) return DEVBUF_OK;
  if (devbuf_buffer_is_cpu_accessible(target)) {
    void *data = NULL;
    devbuf_status status = devbuf_buffer_contents_mut(target, &data, NULL);
    if (status != DEVBUF_OK) return status;
    status = devbuf__read_at(fd, data, size, offset, path);
    devbuf_buffer_end_access(target, data);
    return status;
  }
  devbuf_status status = DEVBUF_OK;
  for (size_t done = 0; done < size && status == DEVBUF_OK;) {
    size_t piece = size - done < STAGING_BYTES ? size - done : STAGING_BYTES;
    devbuf_buffer_t *from = NULL, *to = NULL;
    void *data = NULL;
    status = devbuf_buffer_view(staging, 0, piece, &from);
    if (status == DEVBUF_OK) status = devbuf_buffer_view(target, done, piece, &to);
    if (status == DEVBUF_OK) status = devbuf_buffer_contents_mut(from, &data, NULL);
    if (status == DEVBUF_OK) {
      status = devbuf__read_at(fd, data, piece, offset + done, path);
      devbuf_buffer_end_access(from, data);
    }
    if (status == DEVBUF_OK) status = devbuf_buffer_copy_from(to, from);
    devbuf_buffer_release(from);
    devbuf_buffer_release(to);
    done += piece;
  }
  return status;
}

static bool selected(const devbuf_tensor_file_t *file, size_t index,
                     const devbuf_load_options_t *options) {
  if (!options->select) return true;
  devbuf_tensor_info_t info;
  devbuf_tensor_file_info(file, index, &info);
  return options->select(options->context, index, &info) != 0;
}

static void tell(const devbuf_tensor_file_t *file, size_t index,
                 const devbuf_load_options_t *options) {
  if (!options->on_tensor) return;
  devbuf_tensor_info_t info;
  devbuf_tensor_file_info(file, index, &info);
  options->on_tensor(options->context, index, &info, file->buffers[index]);
}

// The step a tensor's offset in one allocation keeps: the device's alignment `align` (a
// power of two), times 3 for 6-bit elements, whose whole groups of 4 take 3 bytes.
static size_t offset_step(devbuf_dtype dtype, size_t align) {
  return devbuf_dtype_bits(dtype) % 3 == 0 && devbuf_dtype_bits(dtype) % 8 ? 3 * align : align;
}

// With DEVBUF_LOAD_ONE_ALLOCATION: one buffer for every chosen tensor, each at a multiple
// of the device's alignment (*out_offsets[i], for the tensors in `chosen`) that is also a
// whole number of its elements.
static devbuf_status one_allocation(devbuf_device_t *device, devbuf_allocator_t *allocator,
                                    const devbuf_tensor_file_t *file, const bool *chosen,
                                    size_t *offsets, devbuf_buffer_t **out_whole) {
  size_t align = device->alignment > 64 ? device->alignment : 64, total = 0;
  for (size_t i = 0; i < file->count; i++) {
    if (!chosen[i]) continue;
    uint64_t bytes = file->entries[i].end - file->entries[i].begin;
    size_t step = offset_step(file->entries[i].dtype, align), at, end;
    if (devbuf__add_overflows(total, step - 1, &at) || bytes > SIZE_MAX ||
        devbuf__add_overflows(at / step * step, (size_t)bytes, &end) ||
        devbuf__add_overflows(end, align - 1, &total))
      return devbuf__error(DEVBUF_OVERFLOW, "safetensors_load: the tensors' bytes overflow");
    offsets[i] = at / step * step;
    total = end;
  }
  total = (total + align - 1) & ~(align - 1); // no overflow: checked with the last tensor
  if (!total) total = align; // nothing chosen: a buffer all the same, of one alignment
  return devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &total, 1, 0, out_whole);
}

// The chosen tensors as buffers from `allocator` (each its own, or views of one), read from
// the file.
static devbuf_status load_copies(devbuf_device_t *device, devbuf_allocator_t *allocator, int fd,
                                 const char *path, devbuf_tensor_file_t *file,
                                 const devbuf_load_options_t *options) {
  devbuf_buffer_t *staging = NULL, *whole = NULL;
  size_t slots = file->count ? file->count : 1;
  bool *chosen = devbuf__calloc(slots, sizeof *chosen);
  size_t *offsets = devbuf__calloc(slots, sizeof *offsets);
  if (!chosen || !offsets) {
    devbuf__free(chosen);
    devbuf__free(offsets);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu tensors", file->count);
  }
  uint64_t largest = 0;
  for (size_t i = 0; i < file->count; i++) {
    chosen[i] = selected(file, i, options);
    if (chosen[i] && file->entries[i].end - file->entries[i].begin > largest)
      largest = file->entries[i].end - file->entries[i].begin;
  }
  devbuf_status status = DEVBUF_OK;
  if (options->flags & DEVBUF_LOAD_ONE_ALLOCATION)
    status = one_allocation(device, allocator, file, chosen, offsets, &whole);
  if (status == DEVBUF_OK && !devbuf__allocator_host_accessible(allocator) && largest) {
    size_t size = largest < STAGING_BYTES ? (size_t)largest : STAGING_BYTES;
    status = devbuf_buffer_allocate(devbuf_device_allocator_for(device, DEVBUF_MEMORY_HOST_VISIBLE),
                                    DEVBUF_UINT8, &size, 1, 0, &staging);
  }
  uint64_t data_offset = 8 + file->header_size;
  for (size_t i = 0; status == DEVBUF_OK && i < file->count; i++) {
    if (!chosen[i]) continue;
    const devbuf__tensor_entry *entry = &file->entries[i];
    status = whole ? devbuf_buffer_view_as(whole, offsets[i], entry->dtype, entry->shape,
                                           entry->ndim, &file->buffers[i])
                   : devbuf_buffer_allocate(allocator, entry->dtype, entry->shape, entry->ndim, 0,
                                            &file->buffers[i]);
    if (status == DEVBUF_OK)
      status = read_into(fd, data_offset + entry->begin, file->buffers[i], staging, path);
    if (status == DEVBUF_OK)
      tell(file, i, options);
    else
      devbuf__error_cause(status, "loading tensor '%.100s' of '%.200s'", entry->name, path);
  }
  devbuf_buffer_release(whole); // the views keep it
  devbuf_buffer_release(staging);
  devbuf__free(chosen);
  devbuf__free(offsets);
  return status;
}

// Whether a tensor's bytes at file offset `at` are off its element's alignment (a writer that
// did not pad): a view would hand out misaligned typed pointers.
static bool misaligned(const devbuf__tensor_entry *entry, uint64_t at) {
  return at % devbuf__dtype_alignment(entry->dtype) != 0;
}

// A tensor of the mapped file in aligned memory of its own, copied out of the mapping.
static devbuf_status aligned_copy(devbuf_device_t *device, const devbuf_memory_t *mapped,
                                  uint64_t at, const devbuf__tensor_entry *entry, const char *path,
                                  devbuf_buffer_t **out) {
  devbuf_status status = devbuf_buffer_allocate(devbuf_device_allocator(device), entry->dtype,
                                                entry->shape, entry->ndim, 0, out);
  size_t size = (size_t)(entry->end - entry->begin);
  void *data = NULL;
  if (status != DEVBUF_OK || !size) return status;
  status = devbuf_buffer_contents_mut(*out, &data, NULL);
  if (status != DEVBUF_OK) return status;
  status = devbuf__guarded_file_copy(data, mapped, (size_t)at, size, path);
  devbuf_buffer_end_access(*out, data);
  return status;
}

// Every tensor as a zero-copy view of one mapping of the file (a misaligned one, a copy).
static devbuf_status load_views(devbuf_device_t *device, const char *path,
                                devbuf_tensor_file_t **out_file,
                                const devbuf_load_options_t *options) {
  devbuf_buffer_t *mapping = NULL;
  devbuf_status status = devbuf_buffer_map_file(device, path, &mapping);
  if (status != DEVBUF_OK) return status;
  const devbuf_memory_t *bytes = &mapping->storage->memory;
  uint64_t file_size = mapping->size;
  devbuf_tensor_file_t *file = NULL;
  status = read_table(&(table_source){-1, bytes, path}, file_size, &file);
  if (status == DEVBUF_OK &&
      !(file->buffers = devbuf__calloc(file->count ? file->count : 1, sizeof *file->buffers)))
    status =
        devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu tensor handles", file->count);
  devbuf__storage *storage = mapping->storage;
  for (size_t i = 0; status == DEVBUF_OK && i < file->count; i++) {
    if (!selected(file, i, options)) continue;
    const devbuf__tensor_entry *entry = &file->entries[i];
    uint64_t at = 8 + file->header_size + entry->begin;
    if (misaligned(entry, at)) {
      status = aligned_copy(device, bytes, at, entry, path, &file->buffers[i]);
    } else {
      devbuf__ref_retain(&storage->refs);
      status = devbuf__buffer_wrap(storage, (size_t)at, (size_t)(entry->end - entry->begin),
                                   entry->dtype, entry->shape, entry->ndim, &file->buffers[i]);
    }
    if (status == DEVBUF_OK)
      tell(file, i, options);
    else
      devbuf__error_cause(status, "loading tensor '%.100s' of '%.200s'", entry->name, path);
  }
  devbuf_buffer_release(mapping); // the views keep the mapping alive
  if (status != DEVBUF_OK) {
    devbuf_tensor_file_release(file);
    return status;
  }
  *out_file = file;
  return DEVBUF_OK;
}

devbuf_status devbuf_safetensors_load(devbuf_device_t *device, const char *path,
                                      const devbuf_load_options_t *options,
                                      devbuf_tensor_file_t **out_file) {
  if (!device || !path || !out_file)
    return devbuf__null_argument("safetensors_load", "device, path, out_file",
                                 (const void *[]){device, path, out_file});
  devbuf_load_options_t none = {0};
  if (!options) options = &none;
  const uint32_t known = DEVBUF_LOAD_COPY | DEVBUF_LOAD_ONE_ALLOCATION;
  if (options->flags & ~known)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "safetensors_load: unknown flags 0x%x",
                         options->flags & ~known);
  devbuf_allocator_t *allocator =
      options->allocator ? options->allocator : devbuf_device_allocator(device);
  if (allocator->device != device)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "safetensors_load: an allocator of %s for tensors on %s",
                         allocator->device->spec, device->spec);
  bool copy = (options->flags & DEVBUF_LOAD_COPY) || !device->host_accessible || options->allocator;
  if (!copy) return load_views(device, path, out_file, options);
  int fd = -1;
  uint64_t file_size = 0;
  devbuf_status status = devbuf__open_regular_file(path, &fd, &file_size);
  if (status != DEVBUF_OK) return status;
  devbuf_tensor_file_t *file = NULL;
  status = read_table(&(table_source){fd, NULL, path}, file_size, &file);
  if (status == DEVBUF_OK &&
      !(file->buffers = devbuf__calloc(file->count ? file->count : 1, sizeof *file->buffers)))
    status =
        devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu tensor handles", file->count);
  if (status == DEVBUF_OK) status = load_copies(device, allocator, fd, path, file, options);
  close(fd);
  if (status != DEVBUF_OK) {
    devbuf_tensor_file_release(file);
    return status;
  }
  *out_file = file;
  return DEVBUF_OK;
}
