// Growable segments on CUDA: addresses reserved with cuMemAddressReserve, and memory
// behind them page by page: each page (the device's 2 MiB) is one physical allocation
// (cuMemCreate) mapped at its address (cuMemMap), and a map call makes its pages
// accessible to the device at once (cuMemSetAccess). cuMemUnmap takes back only whole
// mappings, and the caching allocator gives back any free pages, inside what it mapped in
// one call too: so one handle per page, found by its address in a table.
#include "cuda_backend.h"

typedef struct devbuf__cuda_page {
  CUdeviceptr at; // 0: an empty slot
  CUmemGenericAllocationHandle handle;
} devbuf__cuda_page;

static size_t slot_of(CUdeviceptr at, size_t capacity) {
  uint64_t x = (uint64_t)at * 0x9e3779b97f4a7c15ull;
  return (size_t)(x >> 20) & (capacity - 1);
}

// Adds a page (the caller holds mappings_lock); false without host memory.
static bool pages_add(devbuf__cuda_device *state, CUdeviceptr at,
                      CUmemGenericAllocationHandle handle) {
  if (2 * (state->page_count + 1) > state->page_capacity) {
    size_t capacity = state->page_capacity ? 2 * state->page_capacity : 64;
    devbuf__cuda_page *grown = devbuf__calloc(capacity, sizeof *grown);
    if (!grown) return false;
    for (size_t i = 0; i < state->page_capacity; i++)
      if (state->pages[i].at) {
        size_t j = slot_of(state->pages[i].at, capacity);
        while (grown[j].at) j = (j + 1) & (capacity - 1);
        grown[j] = state->pages[i];
      }
    devbuf__free(state->pages);
    state->pages = grown;
    state->page_capacity = capacity;
  }
  size_t j = slot_of(at, state->page_capacity);
  while (state->pages[j].at) j = (j + 1) & (state->page_capacity - 1);
  state->pages[j] = (devbuf__cuda_page){at, handle};
  state->page_count++;
  return true;
}

// Removes the page at `at` and gives its handle; false if no such page is mapped.
static bool pages_take(devbuf__cuda_device *state, CUdeviceptr at,
                       CUmemGenericAllocationHandle *out) {
  if (!state->page_capacity) return false;
  size_t mask = state->page_capacity - 1, j = slot_of(at, state->page_capacity);
  while (state->pages[j].at && state->pages[j].at != at) j = (j + 1) & mask;
  if (!state->pages[j].at) return false;
  *out = state->pages[j].handle;
  state->pages[j].at = 0;
  state->page_count--;
  // Later entries of the same run move up where their probe allows (no tombstones).
  for (size_t hole = j, k = (j + 1) & mask; state->pages[k].at; k = (k + 1) & mask) {
    size_t home = slot_of(state->pages[k].at, state->page_capacity);
    bool movable = hole <= k ? (home <= hole || home > k) : (home <= hole && home > k);
    if (movable) {
      state->pages[hole] = state->pages[k];
      state->pages[k].at = 0;
      hole = k;
    }
  }
  return true;
}

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
  // Refused here, plain segments serve: cuMemCreate would fail every map.
  if (!state->maps_memory)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "%s: the GPU has no virtual memory management "
                         "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is not 1)",
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
  code = cu->cuMemAddressReserve(&base, size, device->page_size, 0, 0); // maps go page by page
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: reserving %zu bytes of addresses", device->spec, size);
  *out = (devbuf_memory_t){.device = base, .size = size};
  return DEVBUF_OK;
}

// Unmaps and releases the pages of [at, at + size) that are mapped.
static void unmap_pages(devbuf_device_t *device, CUdeviceptr at, size_t size) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  size_t page = device->page_size;
  for (size_t done = 0; done < size; done += page) {
    CUmemGenericAllocationHandle handle;
    pthread_mutex_lock(&state->mappings_lock);
    bool found = pages_take(state, at + done, &handle);
    pthread_mutex_unlock(&state->mappings_lock);
    if (!found) continue;
    state->cu->cuMemUnmap(at + done, page); // the physical memory goes once nothing maps it
    state->cu->cuMemRelease(handle);
  }
}

devbuf_status devbuf__cuda_map(devbuf_device_t *device, const devbuf_memory_t *reservation,
                               size_t offset, size_t size) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  const devbuf__cuda_api *cu = state->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  CUdeviceptr at = reservation->device + offset;
  size_t page = device->page_size, done = 0;
  if (offset % page || size % page) // a caching allocator told a smaller page_size
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%s: mapping %zu bytes at offset %zu of a growable segment: both must "
                         "be whole %zu-byte pages",
                         device->spec, size, offset, page);
  CUmemAllocationProp prop = device_memory(state);
  const char *step = NULL;
  CUresult code = CUDA_SUCCESS;
  for (; done < size && !step; done += page) {
    CUmemGenericAllocationHandle handle;
    code = cu->cuMemCreate(&handle, page, &prop, 0);
    if (code != CUDA_SUCCESS) {
      step = "cuMemCreate";
      break;
    }
    code = cu->cuMemMap(at + done, page, 0, handle, 0);
    if (code != CUDA_SUCCESS) {
      cu->cuMemRelease(handle);
      step = "cuMemMap";
      break;
    }
    pthread_mutex_lock(&state->mappings_lock);
    bool recorded = pages_add(state, at + done, handle);
    pthread_mutex_unlock(&state->mappings_lock);
    if (!recorded) {
      cu->cuMemUnmap(at + done, page);
      cu->cuMemRelease(handle);
      unmap_pages(device, at, done);
      return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to record a mapping");
    }
  }
  if (!step) {
    CUmemAccessDesc access = {.location = prop.location,
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    code = cu->cuMemSetAccess(at, size, &access, 1);
    if (code != CUDA_SUCCESS) step = "cuMemSetAccess";
  }
  if (step) {
    unmap_pages(device, at, done);
    return devbuf__cuda_error(cu, code,
                              "%s: mapping %zu bytes at offset %zu of a growable segment (%s)",
                              device->spec, size, offset, step);
  }
  return DEVBUF_OK;
}

void devbuf__cuda_unmap(devbuf_device_t *device, const devbuf_memory_t *reservation, size_t offset,
                        size_t size) {
  if (devbuf__cuda_enter(device) != DEVBUF_OK) return;
  unmap_pages(device, reservation->device + offset, size);
}

void devbuf__cuda_unreserve(devbuf_device_t *device, const devbuf_memory_t *reservation) {
  if (devbuf__cuda_enter(device) != DEVBUF_OK) return;
  devbuf__cuda_of(device)->cu->cuMemAddressFree(reservation->device, reservation->size);
}
