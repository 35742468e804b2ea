// Read-only mapped files: zero-copy, page-granular, alive while any view uses them.
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void unmap_file(devbuf__storage *storage) {
  if (storage->memory.token) close((int)((intptr_t)storage->memory.token - 1));
  if (!storage->size) return;
  munmap(storage->memory.host, storage->memory.size);
  size_t page = storage->device->page_size;
  atomic_fetch_sub(&storage->device->mapped_bytes, (storage->memory.size + page - 1) & ~(page - 1));
}

// A file's pages, mapped read-only (copy-on-write for DLPack's read-only consumers).
static const devbuf__storage_kind mapped_file = {
    .name = "mapped file",
    .file_backed = true,
    .give_back = unmap_file,
};

devbuf_status devbuf_buffer_map_file(devbuf_device_t *device, const char *path,
                                     devbuf_buffer_t **out_buffer) {
  if (!device || !path || !out_buffer)
    return devbuf__null_argument("map_file", "device, path, out_buffer",
                                 (const void *[]){device, path, out_buffer});
  if (!device->host_accessible)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "map_file: %s cannot read host memory; load the file with copies",
                         device->spec);
  int fd = -1;
  uint64_t file_size = 0;
  devbuf_status opened = devbuf__open_regular_file(path, &fd, &file_size);
  if (opened != DEVBUF_OK) return opened;
  if (file_size > SIZE_MAX) {
    close(fd);
    return devbuf__error(DEVBUF_OVERFLOW, "'%.200s' has %llu bytes, more than this process can map",
                         path, (unsigned long long)file_size);
  }
  size_t size = (size_t)file_size;
  void *address = NULL;
  if (size) {
    // Private and writable: devbuf refuses every write to it, but a consumer that ignores
    // DLPack's read-only flag (torch) writes to copy-on-write pages of this process, never to
    // the file, instead of faulting (what safetensors itself hands to torch).
    address = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      int error = errno;
      close(fd);
      return devbuf__error(DEVBUF_IO_ERROR, "cannot map %zu bytes of '%.200s': %s", size, path,
                           strerror(error));
    }
  }
  devbuf__storage *storage;
  devbuf_status status = devbuf__storage_create(NULL, device, size, 0, &storage);
  if (status != DEVBUF_OK) {
    if (size) munmap(address, size);
    close(fd);
    return status;
  }
  // The mapping keeps the file's pages; the descriptor stays to ask the file's size after
  // each guarded read (devbuf__guarded_file_copy), as the token (+1: 0 is none).
  storage->memory.token = (void *)(intptr_t)(fd + 1);
  storage->kind = &mapped_file;
  storage->read_only = true;
  storage->memory.host = address;
  storage->memory.device = (uint64_t)(uintptr_t)address;
  storage->memory.size = size;
  atomic_store_explicit(&storage->state, DEVBUF__ALLOCATED, memory_order_release);
  size_t page = device->page_size;
  atomic_fetch_add(&device->mapped_bytes, (size + page - 1) & ~(page - 1));
  return devbuf__buffer_wrap(storage, 0, size, DEVBUF_UINT8, &size, 1, out_buffer);
}
