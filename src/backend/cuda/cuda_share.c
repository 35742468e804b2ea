// Device memory other processes map: one physical allocation per segment, made with a POSIX
// descriptor handle (cuMemCreate), mapped into addresses of its own; exported as a descriptor
// (cuMemExportToShareableHandle), imported from one (cuMemImportFromShareableHandle) and
// mapped the same way. The physical memory lives until every process has unmapped and
// released it: the driver counts the handles. The device offers this only where the driver
// can (shares_memory, set when it opens).
#include "cuda_backend.h"

#include <fcntl.h>

typedef struct devbuf__cuda_shareable {
  CUmemGenericAllocationHandle handle;
} devbuf__cuda_shareable;

static CUmemAllocationProp shareable_memory(const devbuf__cuda_device *state) {
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
  prop.location = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = state->id};
  return prop;
}

// Maps `handle` (of `size` bytes) at fresh addresses the device may read and write.
static devbuf_status map_handle(devbuf_device_t *device, CUmemGenericAllocationHandle handle,
                                size_t size, CUdeviceptr *out) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  const devbuf__cuda_api *cu = state->cu;
  CUdeviceptr at = 0;
  const char *step = "cuMemAddressReserve";
  CUresult code = cu->cuMemAddressReserve(&at, size, 0, 0, 0);
  if (code == CUDA_SUCCESS) {
    step = "cuMemMap";
    code = cu->cuMemMap(at, size, 0, handle, 0);
    if (code == CUDA_SUCCESS) {
      CUmemAccessDesc access = {.location = shareable_memory(state).location,
                                .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
      step = "cuMemSetAccess";
      code = cu->cuMemSetAccess(at, size, &access, 1);
      if (code != CUDA_SUCCESS) cu->cuMemUnmap(at, size);
    }
    if (code != CUDA_SUCCESS) cu->cuMemAddressFree(at, size);
  }
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: mapping %zu bytes of shareable memory (%s)",
                              device->spec, size, step);
  *out = at;
  return DEVBUF_OK;
}

void devbuf__cuda_release_shareable(devbuf_device_t *device, const devbuf_memory_t *memory) {
  devbuf__cuda_shareable *record = memory->token;
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  if (devbuf__cuda_enter(device) == DEVBUF_OK) {
    cu->cuMemUnmap(memory->device, memory->size);
    cu->cuMemAddressFree(memory->device, memory->size);
    cu->cuMemRelease(record->handle);
  }
  devbuf__free(record);
}

// Maps a handle just made or imported as `out`; on failure the handle is released.
static devbuf_status hand_out(devbuf_device_t *device, CUmemGenericAllocationHandle handle,
                              size_t size, devbuf_memory_t *out) {
  devbuf__cuda_shareable *record = devbuf__malloc(sizeof *record);
  CUdeviceptr at = 0;
  devbuf_status status =
      record ? map_handle(device, handle, size, &at)
             : devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to record shareable memory");
  if (status != DEVBUF_OK) {
    devbuf__cuda_of(device)->cu->cuMemRelease(handle);
    devbuf__free(record);
    return status;
  }
  record->handle = handle;
  *out = (devbuf_memory_t){.device = at, .size = size, .token = record};
  return DEVBUF_OK;
}

devbuf_status devbuf__cuda_alloc_shareable(devbuf_device_t *device, size_t size,
                                           devbuf_memory_t *out) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  const devbuf__cuda_api *cu = state->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  size_t rounded = (size + device->page_size - 1) & ~(device->page_size - 1);
  if (rounded < size)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", device->spec, size);
  CUmemAllocationProp prop = shareable_memory(state);
  CUmemGenericAllocationHandle handle = 0;
  CUresult code = cu->cuMemCreate(&handle, rounded, &prop, 0);
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: cuMemCreate of %zu shareable bytes", device->spec,
                              rounded);
  return hand_out(device, handle, rounded, out);
}

devbuf_status devbuf__cuda_export(devbuf_device_t *device, const devbuf_memory_t *memory,
                                  int *out_fd) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  if (!devbuf__cuda_is_shareable(memory))
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s: this memory was not made shareable",
                         device->spec);
  const devbuf__cuda_shareable *record = memory->token;
  int fd = -1;
  CUresult code = cu->cuMemExportToShareableHandle(&fd, record->handle,
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: cuMemExportToShareableHandle", device->spec);
  fcntl(fd, F_SETFD, FD_CLOEXEC); // a program the process starts meanwhile does not inherit it
  *out_fd = fd;
  return DEVBUF_OK;
}

devbuf_status devbuf__cuda_import(devbuf_device_t *device, int fd, size_t size,
                                  devbuf_memory_t *out) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  if (size % device->page_size)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "%s: %zu bytes of imported memory are not whole %zu-byte pages",
                         device->spec, size, device->page_size);
  CUmemGenericAllocationHandle handle = 0;
  CUresult code = cu->cuMemImportFromShareableHandle(&handle, (void *)(intptr_t)fd,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: cuMemImportFromShareableHandle of descriptor %d",
                              device->spec, fd);
  return hand_out(device, handle, size, out);
}
