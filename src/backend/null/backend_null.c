// The null backend: the smallest whole backend, and the template for a new one
// (docs/backends.md, "Adding a backend"). Its device's memory is plain host memory, fills
// and copies run on the queue's worker thread, and kernels are refused. It is built for
// the tests only, never installed: it shows that a backend is its folder and one registry
// entry, and it runs the conformance suite with the expectations declared for it.
#include "../backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NULL_ALIGNMENT 64

static devbuf_status null_open(devbuf_device_t *device, int index) {
  if (index != 0)
    return devbuf__error(DEVBUF_UNAVAILABLE,
                         "there is one null device, null:0; null:%d does "
                         "not exist",
                         index);
  snprintf(device->name, sizeof device->name, "null device (host memory, no kernels)");
  device->page_size = 4096;
  device->host_accessible = true;
  device->unified_memory = true;
  device->global_memory = device->max_allocation = (uint64_t)1 << 40; // what the host gives
  device->alignment = NULL_ALIGNMENT;
  device->processor = DEVBUF_PROCESSOR_CPU;
  return DEVBUF_OK;
}

static devbuf_status null_raw_alloc(devbuf_device_t *device, devbuf_memory_kind kind, size_t size,
                                    devbuf_memory_t *out) {
  (void)kind; // every kind the device has is host memory
  void *pointer = NULL;
  if (posix_memalign(&pointer, NULL_ALIGNMENT, size) != 0)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "%s: the system refused %zu bytes", device->spec,
                         size);
  *out = (devbuf_memory_t){.host = pointer, .device = (uint64_t)(uintptr_t)pointer, .size = size};
  return DEVBUF_OK;
}

static void null_raw_free(devbuf_device_t *device, const devbuf_memory_t *memory) {
  (void)device;
  free(memory->host);
}

static devbuf_status null_write(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                                const void *src, size_t size) {
  (void)device;
  memmove((char *)dst->host + offset, src, size);
  return DEVBUF_OK;
}

static devbuf_status null_read(devbuf_device_t *device, const devbuf_memory_t *src, size_t offset,
                               void *dst, size_t size) {
  (void)device;
  memmove(dst, (const char *)src->host + offset, size);
  return DEVBUF_OK;
}

static devbuf_status null_copy(devbuf_device_t *device, const devbuf_memory_t *dst,
                               size_t dst_offset, const devbuf_memory_t *src, size_t src_offset,
                               size_t size) {
  (void)device;
  memmove((char *)dst->host + dst_offset, (const char *)src->host + src_offset, size);
  return DEVBUF_OK;
}

static devbuf_status null_zero(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                               size_t size) {
  (void)device;
  memset((char *)dst->host + offset, 0, size);
  return DEVBUF_OK;
}

static void *operand_bytes(const devbuf__operand *operand) {
  return (char *)operand->memory.host + operand->offset;
}

// Fills and copies run here and now, on the queue's worker thread: no driver events.
static devbuf_status null_enqueue(devbuf_device_t *device, void *queue, const devbuf__op *op,
                                  void **out_event) {
  (void)queue;
  *out_event = NULL;
  const devbuf__operand *operands = op->operands;
  switch (op->kind) {
  case DEVBUF__OP_FILL: {
    unsigned char *bytes = operand_bytes(&operands[0]);
    const unsigned char *pattern = op->pattern;
    for (size_t i = 0; i < operands[0].size; i++) bytes[i] = pattern[i % op->pattern_size];
    return DEVBUF_OK;
  }
  case DEVBUF__OP_COPY:
    if (!operands[0].size) return DEVBUF_OK;
    if (operands[1].mapped) // a file that shrank fails the copy, not the process
      return devbuf__guarded_file_copy(operand_bytes(&operands[0]), &operands[1].memory,
                                       operands[1].offset, operands[0].size, "queue_copy");
    memmove(operand_bytes(&operands[0]), operand_bytes(&operands[1]), operands[0].size);
    return DEVBUF_OK;
  case DEVBUF__OP_LAUNCH:
  case DEVBUF__OP_CALL:
    break;
  }
  return devbuf__error(DEVBUF_UNSUPPORTED, "%s runs no kernels", device->spec);
}

const devbuf__backend devbuf__backend_null = {
    .dlpack_device_type = 1, // kDLCPU: its memory is host memory
    .one_device = true,
    .host_memory_in_children = true,
    .open = null_open,
    .raw_alloc = null_raw_alloc,
    .raw_free = null_raw_free,
    .write = null_write,
    .read = null_read,
    .copy = null_copy,
    .zero = null_zero,
    .enqueue = null_enqueue,
};
