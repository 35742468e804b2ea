// Growable segments on CUDA: addresses reserved with cuMemAddressReserve; each mapped range
// is one physical allocation (cuMemCreate) mapped there (cuMemMap) and made accessible to
// the device (cuMemSetAccess). The caching allocator unmaps exactly the ranges it mapped,
// last first, so a range's handle is found by its address.
#include "cuda_backend.h"

typedef struct devbuf__cuda_mapping {
  CUdeviceptr at;
  size_t size;
  CUmemGenericAllocationHandle handle;
  struct devbuf__cuda_mapping *next;
} devbuf__cuda_mapping;

static CUmemAllocationProp device_memory(const devbuf__cuda_device *state) {
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED};
  prop.location = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = state->id};
  return prop;
}

devbuf_status devbuf__cuda_reserve(devbuf_device_t *device, size_t size, devbuf_memory_t *out) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  const devbuf__cuda_api *cu = state->cu;
  if (!cu->cuMemAddressReserve)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "%s: the driver has no virtual memory management (cuMemAddressReserve)",
                         device->spec);
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  CUmemAllocationProp prop = device_memory(state);
  size_t granularity = 0;
  CUresult code =
      cu->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: cuMemGetAllocationGranularity", device->spec);
  if (!granularity || granularity > device->page_size || device->page_size % granularity)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "%s: mapping granularity %zu does not divide the %zu-byte page",
                         device->spec, granularity, device->page_size);
  size &= ~(device->page_size - 1);
  CUdeviceptr base = 0;
  code = cu->cuMemAddressReserve(&base, size, 0, 0, 0);
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: reserving %zu bytes of addresses", device->spec, size);
  *out = (devbuf_memory_t){.device = base, .size = size};
  return DEVBUF_OK;
}

devbuf_status devbuf__cuda_map(devbuf_device_t *device, const devbuf_memory_t *reservation,
                               size_t offset, size_t size) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  const devbuf__cuda_api *cu = state->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  devbuf__cuda_mapping *mapping = devbuf__malloc(sizeof *mapping);
  if (!mapping) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to record a mapping");
  *mapping = (devbuf__cuda_mapping){.at = reservation->device + offset, .size = size};
  CUmemAllocationProp prop = device_memory(state);
  CUmemAccessDesc access = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  const char *step = "cuMemCreate";
  CUresult code = cu->cuMemCreate(&mapping->handle, size, &prop, 0);
  if (code == CUDA_SUCCESS) {
    step = "cuMemMap";
    code = cu->cuMemMap(mapping->at, size, 0, mapping->handle, 0);
    if (code == CUDA_SUCCESS) {
      step = "cuMemSetAccess";
      code = cu->cuMemSetAccess(mapping->at, size, &access, 1);
      if (code != CUDA_SUCCESS) cu->cuMemUnmap(mapping->at, size);
    }
    if (code != CUDA_SUCCESS) cu->cuMemRelease(mapping->handle);
  }
  if (code != CUDA_SUCCESS) {
    devbuf__free(mapping);
    return devbuf__cuda_error(cu, code,
                              "%s: mapping %zu bytes at offset %zu of a growable segment (%s)",
                              device->spec, size, offset, step);
  }
  pthread_mutex_lock(&state->mappings_lock);
  mapping->next = state->mappings;
  state->mappings = mapping;
  pthread_mutex_unlock(&state->mappings_lock);
  return DEVBUF_OK;
}

void devbuf__cuda_unmap(devbuf_device_t *device, const devbuf_memory_t *reservation, size_t offset,
                        size_t size) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  CUdeviceptr at = reservation->device + offset;
  pthread_mutex_lock(&state->mappings_lock);
  devbuf__cuda_mapping *found = NULL;
  for (devbuf__cuda_mapping **link = &state->mappings; *link; link = &(*link)->next)
    if ((*link)->at == at && (*link)->size == size) {
      found = *link;
      *link = found->next;
      break;
    }
  pthread_mutex_unlock(&state->mappings_lock);
  if (!found || devbuf__cuda_enter(device) != DEVBUF_OK) {
    devbuf__free(found);
    return;
  }
  state->cu->cuMemUnmap(at, size); // the physical memory goes once nothing maps it
  state->cu->cuMemRelease(found->handle);
  devbuf__free(found);
}

void devbuf__cuda_unreserve(devbuf_device_t *device, const devbuf_memory_t *reservation) {
  if (devbuf__cuda_enter(device) != DEVBUF_OK) return;
  devbuf__cuda_of(device)->cu->cuMemAddressFree(reservation->device, reservation->size);
}
