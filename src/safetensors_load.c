// Loading safetensors files: the header alone (inspect), or every tensor as a buffer —
// zero-copy views of one read-only mapping where the device can read host memory, staged
// copies elsewhere.
#include "tensor_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Reads exactly `size` bytes at `offset`.
static devbuf_status read_at(int fd, void *out, size_t size, uint64_t offset, const char *path) {
  size_t done = 0;
  while (done < size) {
    ssize_t got = pread(fd, (char *)out + done, size - done, (off_t)(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return devbuf__error(DEVBUF_IO_ERROR, "cannot read %zu bytes at %llu of '%.200s': %s", size - done,
                           (unsigned long long)(offset + done), path, got < 0 ? strerror(errno) : "file shrank");
    done += (size_t)got;
  }
  return DEVBUF_OK;
}

devbuf_status devbuf_safetensors_inspect(const char *path, devbuf_tensor_file_t **out_file) {
  if (!path || !out_file) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "safetensors_inspect: path and out_file are required");
  *out_file = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return devbuf__error(DEVBUF_IO_ERROR, "cannot open '%.200s': %s", path, strerror(errno));
  struct stat info;
  devbuf_status status = DEVBUF_OK;
  if (fstat(fd, &info) != 0)
    status = devbuf__error(DEVBUF_IO_ERROR, "cannot stat '%.200s': %s", path, strerror(errno));
  else if (!S_ISREG(info.st_mode))
    status = devbuf__error(DEVBUF_IO_ERROR, "'%.200s' is not a regular file", path);
  uint64_t file_size = status == DEVBUF_OK ? (uint64_t)info.st_size : 0;
  if (status == DEVBUF_OK && file_size < 8)
    status = devbuf__error(DEVBUF_FORMAT_ERROR, "safetensors: '%.200s' has %llu bytes, too few for the 8-byte header "
                           "length", path, (unsigned long long)file_size);
  unsigned char prefix[8];
  uint64_t header_size = 0;
  if (status == DEVBUF_OK) status = read_at(fd, prefix, 8, 0, path);
  if (status == DEVBUF_OK) status = devbuf__safetensors_header_length(prefix, file_size, &header_size);
  char *header = NULL;
  if (status == DEVBUF_OK && !(header = devbuf__malloc((size_t)header_size)))
    status = devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a %llu-byte header",
                           (unsigned long long)header_size);
  if (status == DEVBUF_OK) status = read_at(fd, header, (size_t)header_size, 8, path);
  close(fd);
  if (status == DEVBUF_OK)
    status = devbuf__safetensors_parse_header(header, header_size, file_size - 8 - header_size, out_file);
  devbuf__free(header);
  return status;
}

// The buffer of one tensor: a view of the mapping, or a copy of it on `device`.
static devbuf_status tensor_buffer(devbuf_buffer_t *mapping, size_t file_offset, const devbuf__tensor_entry *entry,
                                   devbuf_device_t *device, bool copy, devbuf_buffer_t **out) {
  size_t bytes = (size_t)(entry->end - entry->begin);
  devbuf__storage *storage = mapping->storage;
  if (!copy) {
    atomic_fetch_add_explicit(&storage->refs, 1, memory_order_relaxed);
    return devbuf__buffer_wrap(storage, file_offset, bytes, entry->dtype, entry->shape, entry->ndim, out);
  }
  devbuf_buffer_t *source;
  devbuf_status status = devbuf_buffer_view(mapping, file_offset, bytes, &source);
  if (status != DEVBUF_OK) return status;
  devbuf_buffer_t *target = NULL;
  status = devbuf_buffer_allocate(devbuf_device_allocator(device), entry->dtype, entry->shape, entry->ndim, 0, &target);
  if (status == DEVBUF_OK) status = devbuf_buffer_copy_from(target, source);
  devbuf_buffer_release(source);
  if (status != DEVBUF_OK) {
    devbuf_buffer_release(target);
    return status;
  }
  *out = target;
  return DEVBUF_OK;
}

devbuf_status devbuf_safetensors_load(devbuf_device_t *device, const char *path, const devbuf_load_options_t *options,
                                      devbuf_tensor_file_t **out_file) {
  if (!device || !path || !out_file)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "safetensors_load: device, path and out_file are required");
  *out_file = NULL;
  devbuf_load_options_t none = {0};
  if (!options) options = &none;
  if (options->flags & ~(uint32_t)DEVBUF_LOAD_COPY)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "safetensors_load: unknown flags 0x%x",
                         options->flags & ~(unsigned)DEVBUF_LOAD_COPY);
  bool copy = (options->flags & DEVBUF_LOAD_COPY) || !device->host_accessible;

  // Devices that cannot read host memory stage their copies from a mapping on the CPU.
  devbuf_device_t *map_device = device;
  devbuf_status status = DEVBUF_OK;
  if (!device->host_accessible) status = devbuf_device_open("cpu", &map_device);
  devbuf_buffer_t *mapping = NULL;
  if (status == DEVBUF_OK) status = devbuf_buffer_map_file(map_device, path, &mapping);
  if (map_device != device && map_device) devbuf_device_release(map_device);
  if (status != DEVBUF_OK) return status;

  const unsigned char *bytes = mapping->storage->memory.host;
  uint64_t file_size = mapping->size;
  uint64_t header_size = 0;
  devbuf_tensor_file_t *file = NULL;
  if (file_size < 8)
    status = devbuf__error(DEVBUF_FORMAT_ERROR, "safetensors: '%.200s' has %llu bytes, too few for the 8-byte header "
                           "length", path, (unsigned long long)file_size);
  if (status == DEVBUF_OK) status = devbuf__safetensors_header_length(bytes, file_size, &header_size);
  if (status == DEVBUF_OK)
    status = devbuf__safetensors_parse_header((const char *)bytes + 8, header_size, file_size - 8 - header_size, &file);
  if (status == DEVBUF_OK && !(file->buffers = devbuf__calloc(file->count ? file->count : 1, sizeof *file->buffers)))
    status = devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu tensor handles", file->count);
  // A device may read the mapping directly instead of through staged copies, while loading.
  void *registration = NULL;
  size_t data_offset = (size_t)(8 + header_size);
  if (status == DEVBUF_OK && copy && device->backend->register_host && file_size > data_offset &&
      device->backend->register_host(device, bytes + data_offset, (size_t)file_size - data_offset, &registration) !=
          DEVBUF_OK) {
    registration = NULL; // staged copies, then
    devbuf__clear_error();
  }
  for (size_t i = 0; status == DEVBUF_OK && i < file->count; i++) {
    const devbuf__tensor_entry *entry = &file->entries[i];
    status = tensor_buffer(mapping, (size_t)(8 + header_size + entry->begin), entry, device, copy, &file->buffers[i]);
    if (status == DEVBUF_OK && options->on_tensor) {
      devbuf_tensor_info_t info;
      devbuf_tensor_file_info(file, i, &info);
      options->on_tensor(options->context, i, &info, file->buffers[i]);
    }
  }
  if (registration) device->backend->unregister_host(device, registration);
  devbuf_buffer_release(mapping); // the views keep the mapping alive
  if (status != DEVBUF_OK) {
    devbuf_tensor_file_release(file);
    return status;
  }
  *out_file = file;
  return DEVBUF_OK;
}
