// libFuzzer target: DLPack import of tensors whose every field comes from the input. An
// import either refuses (and never calls the deleter) or yields a buffer whose bytes lie
// inside the memory the tensor claims, and calls the deleter exactly once on release.
#include "../src/interop/dlpack_abi.h"
#include "devbuf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char backing[1 << 16];
static int deleted;

static void delete_versioned(DLManagedTensorVersioned *tensor) { (void)tensor, deleted++; }
static void delete_legacy(DLManagedTensor *tensor) { (void)tensor, deleted++; }

// Consumes `size` bytes of input into `out` (zeros once the input runs out).
static void take(const uint8_t **data, size_t *left, void *out, size_t size) {
  size_t n = *left < size ? *left : size;
  memset(out, 0, size);
  memcpy(out, *data, n);
  *data += n, *left -= n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t header[4];
  take(&data, &size, header, sizeof header);
  int32_t ndim = (int8_t)header[1]; // -128..127: outside 0..32 too
  int64_t shape[128], strides[128];
  for (int i = 0; i < 128; i++) {
    uint16_t dim;
    take(&data, &size, &dim, sizeof dim);
    shape[i] = header[2] & 1 ? (int64_t)(int16_t)dim : dim % 9; // small dims, or anything
    take(&data, &size, &dim, sizeof dim);
    strides[i] = (int16_t)dim;
  }
  DLTensor t = {
      .data = backing, .ndim = ndim, .shape = shape, .strides = header[2] & 2 ? NULL : strides};
  take(&data, &size, &t.dtype, sizeof t.dtype);
  take(&data, &size, &t.device, sizeof t.device);
  if (header[2] & 4) t.device = (DLDevice){DEVBUF_DL_CPU, 0};
  // The data of a device tensor is a driver handle (a cl_mem): a fuzzed one would only test
  // the driver. Device tensors are imported as CPU ones instead.
  if (t.device.device_type == DEVBUF_DL_OPENCL || t.device.device_type == DEVBUF_DL_CUDA)
    t.device.device_type = DEVBUF_DL_CPU;
  uint16_t offset;
  take(&data, &size, &offset, sizeof offset);
  t.byte_offset = header[2] & 8 ? UINT64_MAX - offset : offset;

  deleted = 0;
  devbuf_buffer_t *buffer = NULL;
  devbuf_status status;
  // The tensors live as long as the buffers that own them.
  DLManagedTensorVersioned versioned = {
      .version = {header[3] % 3, 1}, .deleter = delete_versioned, .dl_tensor = t};
  DLManagedTensor legacy = {.dl_tensor = t, .deleter = delete_legacy};
  if (header[0] & 1) {
    take(&data, &size, &versioned.flags, sizeof versioned.flags);
    status = devbuf_buffer_from_dlpack_versioned(&versioned, &buffer);
  } else {
    status = devbuf_buffer_from_dlpack(&legacy, &buffer);
  }
  if (status != DEVBUF_OK) {
    if (buffer || deleted) abort();
    return 0;
  }
  // Read the bytes only where the claimed memory really is the backing array.
  uint64_t address;
  if (devbuf_buffer_is_cpu_accessible(buffer) &&
      devbuf_buffer_device_ptr(buffer, &address) == DEVBUF_OK && address >= (uintptr_t)backing &&
      address + devbuf_buffer_size(buffer) <= (uintptr_t)backing + sizeof backing) {
    static unsigned char copy[sizeof backing];
    if (devbuf_buffer_copyout(buffer, copy, devbuf_buffer_size(buffer)) != DEVBUF_OK) {
      fprintf(stderr, "copyout: %s\n", devbuf_last_error());
      abort();
    }
  }
  devbuf_buffer_t *view = NULL;
  if (devbuf_buffer_size(buffer) &&
      devbuf_buffer_view(buffer, 0, devbuf_buffer_size(buffer), &view) != DEVBUF_OK)
    abort();
  devbuf_buffer_release(buffer);
  if (view && deleted) abort(); // the view still holds it
  devbuf_buffer_release(view);
  if (deleted != 1) abort();
  return 0;
}
