// The CPU backend: aligned host memory; copies at full bandwidth (copy_bytes.c).
#include "cpu.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

// Blocks of at least this size come straight from mmap: they are page-aligned, and
// giving them back returns the pages to the system at once.
#define CPU_MMAP_THRESHOLD ((size_t)1 << 20)
#define CPU_MIN_ALIGNMENT  64

static void read_cpu_model(char *out, size_t capacity) {
  FILE *file = fopen("/proc/cpuinfo", "r");
  char line[256];
  out[0] = '\0';
  if (!file) return;
  while (fgets(line, sizeof line, file)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) == 0 && colon) {
      colon++;
      while (*colon == ' ' || *colon == '\t') colon++;
      colon[strcspn(colon, "\n")] = '\0';
      snprintf(out, capacity, "%s", colon);
      break;
    }
  }
  fclose(file);
}

static devbuf_status cpu_open(devbuf_device_t *device, int index) {
  if (index != 0)
    return devbuf__error(DEVBUF_UNAVAILABLE,
                         "there is one CPU device, cpu:0; cpu:%d does not exist", index);
  char model[96];
  read_cpu_model(model, sizeof model);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(device->name, sizeof device->name, "%s (%ld cores)", model[0] ? model : "host CPU",
           cores);
  long page = sysconf(_SC_PAGESIZE);
  device->page_size = page > 0 ? (size_t)page : 4096;
  device->host_accessible = true;
  device->global_memory = (uint64_t)sysconf(_SC_PHYS_PAGES) * device->page_size;
  device->max_allocation = device->global_memory;
  device->alignment = CPU_MIN_ALIGNMENT;
  device->unified_memory = true;
  device->processor = DEVBUF_PROCESSOR_CPU;
  device->shares_memory = true;
  return DEVBUF_OK;
}

// Shareable memory is a memory file mapped shared; its descriptor rides in the token (+1, so
// that plain memory's NULL token means none).
static int memory_file_of(const devbuf_memory_t *memory) {
  return (int)((intptr_t)memory->token - 1);
}

static devbuf_status map_memory_file(int fd, size_t size, devbuf_memory_t *out) {
  void *pointer = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (pointer == MAP_FAILED) { // short of memory, or a descriptor (imported) that forbids writes
    int error = errno;
    return devbuf__error(error == ENOMEM || error == EAGAIN ? DEVBUF_OUT_OF_MEMORY
                                                            : DEVBUF_FORMAT_ERROR,
                         "mapping a %zu-byte memory file (descriptor %d) to read and write "
                         "failed: %s",
                         size, fd, strerror(error));
  }
  *out = (devbuf_memory_t){.host = pointer, .device = (uint64_t)(uintptr_t)pointer, .size = size};
  return DEVBUF_OK;
}

static devbuf_status cpu_alloc_shareable(devbuf_device_t *device, size_t size,
                                         devbuf_memory_t *out) {
  size_t rounded = (size + device->page_size - 1) & ~(device->page_size - 1);
  if (rounded < size) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "cannot allocate %zu bytes", size);
  int fd = -1;
  devbuf_status status = devbuf__memory_file_create("devbuf-shared", rounded, &fd);
  if (status == DEVBUF_OK) status = devbuf__memory_file_seal(fd, false);
  if (status == DEVBUF_OK) status = map_memory_file(fd, rounded, out);
  if (status != DEVBUF_OK) {
    if (fd >= 0) close(fd);
    return status;
  }
  out->token = (void *)(intptr_t)(fd + 1);
  return DEVBUF_OK;
}

static devbuf_status cpu_raw_export(devbuf_device_t *device, const devbuf_memory_t *memory,
                                    int *out_fd) {
  if (!memory->token)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "%s: this memory is not shareable (allocate it from the device's "
                         "DEVBUF_MEMORY_SHAREABLE allocator)",
                         device->spec);
  int fd = fcntl(memory_file_of(memory), F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return devbuf__error(DEVBUF_IO_ERROR, "%s: no descriptor for an export: %s", device->spec,
                         strerror(errno));
  *out_fd = fd;
  return DEVBUF_OK;
}

static devbuf_status cpu_raw_import(devbuf_device_t *device, int fd, size_t size,
                                    devbuf_memory_t *out) {
  (void)device;
  devbuf_status status = devbuf__memory_file_check(fd, size, "an imported buffer's memory");
  return status == DEVBUF_OK ? map_memory_file(fd, size, out) : status;
}

static void cpu_raw_unimport(devbuf_device_t *device, const devbuf_memory_t *memory) {
  (void)device;
  munmap(memory->host, memory->size);
}

static devbuf_status cpu_raw_alloc(devbuf_device_t *device, devbuf_memory_kind kind, size_t size,
                                   devbuf_memory_t *out) {
  if (kind == DEVBUF_MEMORY_SHAREABLE) return cpu_alloc_shareable(device, size, out);
  void *pointer = NULL; // every other kind: host memory is visible to the host
  if (size >= CPU_MMAP_THRESHOLD) {
    size_t rounded = (size + device->page_size - 1) & ~(device->page_size - 1);
    if (rounded < size)
      return devbuf__error(DEVBUF_OUT_OF_MEMORY, "cannot allocate %zu bytes", size);
    pointer = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pointer == MAP_FAILED)
      return devbuf__error(DEVBUF_OUT_OF_MEMORY, "the system refused %zu bytes (mmap)", rounded);
    size = rounded;
  } else {
    size_t alignment = size >= device->page_size ? device->page_size : CPU_MIN_ALIGNMENT;
    if (posix_memalign(&pointer, alignment, size) != 0)
      return devbuf__error(DEVBUF_OUT_OF_MEMORY, "the system refused %zu bytes (posix_memalign)",
                           size);
  }
  out->host = pointer;
  out->device = (uint64_t)(uintptr_t)pointer;
  out->size = size;
  out->token = NULL;
  out->offset = 0;
  return DEVBUF_OK;
}

static void cpu_raw_free(devbuf_device_t *device, const devbuf_memory_t *memory) {
  (void)device;
  if (memory->token) {
    munmap(memory->host, memory->size);
    close(memory_file_of(memory));
  } else if (memory->size >= CPU_MMAP_THRESHOLD)
    munmap(memory->host, memory->size);
  else
    free(memory->host);
}

// Growable segments: addresses reserved with no access and no commit charge; mapping
// makes a range readable and writable (the kernel gives it pages as they are touched),
// unmapping gives the pages back and takes the access away again.
static devbuf_status cpu_raw_reserve(devbuf_device_t *device, size_t size, devbuf_memory_t *out) {
  (void)device;
  void *base = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "the system refused %zu bytes of addresses", size);
  *out = (devbuf_memory_t){.host = base, .device = (uint64_t)(uintptr_t)base, .size = size};
  return DEVBUF_OK;
}

static devbuf_status cpu_raw_map(devbuf_device_t *device, const devbuf_memory_t *reservation,
                                 size_t offset, size_t size) {
  (void)device;
  if (mprotect((char *)reservation->host + offset, size, PROT_READ | PROT_WRITE) != 0)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY,
                         "the system refused to map %zu bytes at offset %zu (mprotect)", size,
                         offset);
  return DEVBUF_OK;
}

static void cpu_raw_unmap(devbuf_device_t *device, const devbuf_memory_t *reservation,
                          size_t offset, size_t size) {
  (void)device;
  char *at = (char *)reservation->host + offset;
  madvise(at, size, MADV_DONTNEED);
  mprotect(at, size, PROT_NONE);
}

static void cpu_raw_unreserve(devbuf_device_t *device, const devbuf_memory_t *reservation) {
  (void)device;
  munmap(reservation->host, reservation->size);
}

static devbuf_status cpu_write(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                               const void *src, size_t size) {
  (void)device;
  devbuf__copy_bytes((char *)dst->host + offset, src, size);
  return DEVBUF_OK;
}

static devbuf_status cpu_read(devbuf_device_t *device, const devbuf_memory_t *src, size_t offset,
                              void *dst, size_t size) {
  (void)device;
  devbuf__copy_bytes(dst, (const char *)src->host + offset, size);
  return DEVBUF_OK;
}

static devbuf_status cpu_copy(devbuf_device_t *device, const devbuf_memory_t *dst,
                              size_t dst_offset, const devbuf_memory_t *src, size_t src_offset,
                              size_t size) {
  (void)device;
  devbuf__copy_bytes((char *)dst->host + dst_offset, (const char *)src->host + src_offset, size);
  return DEVBUF_OK;
}

static devbuf_status cpu_zero(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                              size_t size) {
  (void)device;
  memset((char *)dst->host + offset, 0, size);
  return DEVBUF_OK;
}

const devbuf__backend devbuf__backend_cpu = {
    .dlpack_device_type = 1, // kDLCPU
    .one_device = true,
    .host_memory_in_children = true,
    .open = cpu_open,
    .raw_alloc = cpu_raw_alloc,
    .raw_free = cpu_raw_free,
    .raw_reserve = cpu_raw_reserve,
    .raw_map = cpu_raw_map,
    .raw_unmap = cpu_raw_unmap,
    .raw_unreserve = cpu_raw_unreserve,
    .raw_export = cpu_raw_export,
    .raw_import = cpu_raw_import,
    .raw_unimport = cpu_raw_unimport,
    .write = cpu_write,
    .read = cpu_read,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .enqueue = devbuf__cpu_enqueue,
    .runs_c_kernels = true,
};
