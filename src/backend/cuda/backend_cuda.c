// The CUDA backend: devices through the driver API loaded at run time, each in its primary
// context, which every entry point makes current on the calling thread and every entry of
// the backend's table puts the caller's back when it returns. Memory comes in three kinds, each
// through its own caching allocator with 2 MiB granularity for large blocks: device memory
// (cuMemAlloc), pinned host memory the device maps (cuMemAllocHost) and managed memory
// (cuMemAllocManaged). With unified addressing every kind has one address that copies can use from
// either side.
#include "cuda_backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_PAGE ((size_t)2 << 20)

devbuf_status devbuf__cuda_error(const devbuf__cuda_api *cu, CUresult code, const char *format,
                                 ...) {
  char what[300];
  va_list args;
  va_start(args, format);
  vsnprintf(what, sizeof what, format, args);
  va_end(args);
  const char *name = NULL;
  if (cu) cu->cuGetErrorName(code, &name);
  return devbuf__error(code == CUDA_ERROR_OUT_OF_MEMORY ? DEVBUF_OUT_OF_MEMORY
                                                        : DEVBUF_DEVICE_FAILURE,
                       "%s: %s (%d)", what, name ? name : "CUDA error", code);
}

devbuf_status devbuf__cuda_enter(devbuf_device_t *device) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  CUresult code = state->cu->cuCtxSetCurrent(state->context);
  return code == CUDA_SUCCESS
             ? DEVBUF_OK
             : devbuf__cuda_error(state->cu, code, "%s: cuCtxSetCurrent", device->spec);
}

// ---- completion ------------------------------------------------------------------------------

// Completion through an event behind the work, waited for with blocking synchronization. (A
// host function enqueued on the stream would never run after a fault in the context, and
// the wait would never end; an event wait returns the fault.)
devbuf_status devbuf__cuda_wait(devbuf_device_t *device, CUstream stream, const char *what) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  CUevent done = NULL;
  CUresult code = cu->cuEventCreate(&done, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING);
  if (code == CUDA_SUCCESS) code = cu->cuEventRecord(done, stream);
  if (code == CUDA_SUCCESS) code = cu->cuEventSynchronize(done);
  if (done) cu->cuEventDestroy(done);
  if (code != CUDA_SUCCESS) return devbuf__cuda_error(cu, code, "%s: %s", device->spec, what);
  return DEVBUF_OK;
}

// ---- devbuf's kernels -----------------------------------------------------------------------

#ifdef DEVBUF_CUDA_BUILTINS
extern const unsigned char devbuf__cuda_builtins[];
#endif

CUfunction devbuf__cuda_fill_kernel(devbuf_device_t *device) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  pthread_mutex_lock(&state->builtins_lock);
  if (state->builtins_state == 0) {
    state->builtins_state = -1;
    snprintf(state->builtins_failure, sizeof state->builtins_failure,
             "this build has none (no nvcc when it was built)");
#ifdef DEVBUF_CUDA_BUILTINS
    // A driver older than the nvcc that built them refuses them (UNSUPPORTED_PTX_VERSION):
    // the reason stays, for the tests and for whoever wonders why fills are slow.
    const char *step = "cuModuleLoadData";
    CUresult code = state->cu->cuModuleLoadData(&state->builtins, devbuf__cuda_builtins);
    if (code == CUDA_SUCCESS) {
      step = "cuModuleGetFunction(devbuf_fill)";
      code = state->cu->cuModuleGetFunction(&state->fill, state->builtins, "devbuf_fill");
    }
    const char *name = NULL;
    if (code != CUDA_SUCCESS) state->cu->cuGetErrorName(code, &name);
    snprintf(state->builtins_failure, sizeof state->builtins_failure, "%s: %s (%d)", step,
             name ? name : "CUDA error", code);
    if (code == CUDA_SUCCESS) state->builtins_state = 1;
#endif
  }
  CUfunction fill = state->builtins_state == 1 ? state->fill : NULL;
  pthread_mutex_unlock(&state->builtins_lock);
  return fill;
}

const char *devbuf__cuda_builtins_failure(devbuf_device_t *device) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  pthread_mutex_lock(&state->builtins_lock);
  const char *failure = state->builtins_state == 1   ? NULL
                        : state->builtins_state == 0 ? "not tried yet"
                                                     : state->builtins_failure;
  pthread_mutex_unlock(&state->builtins_lock);
  return failure;
}

// ---- devices -------------------------------------------------------------------------------

static int attribute(const devbuf__cuda_api *cu, CUdevice id, int which) {
  int value = 0;
  if (cu->cuDeviceGetAttribute(&value, which, id) != CUDA_SUCCESS) value = 0;
  return value;
}

static void cuda_close(devbuf_device_t *device) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  if (!state) return;
  state->cu->cuCtxSetCurrent(state->context);
  if (state->transfers) state->cu->cuStreamDestroy(state->transfers);
  for (size_t i = 0; i < state->spare_count; i++) state->cu->cuEventDestroy(state->spare_events[i]);
  if (state->builtins) state->cu->cuModuleUnload(state->builtins);
  for (int i = 0; i < 2; i++) {
    if (state->staging[i]) state->cu->cuMemFreeHost(state->staging[i]);
    if (state->staged[i]) state->cu->cuEventDestroy(state->staged[i]);
  }
  pthread_mutex_destroy(&state->staging_lock);
  pthread_mutex_destroy(&state->events_lock);
  pthread_mutex_destroy(&state->mappings_lock);
  devbuf__free(state->pages); // empty: every growable segment unmapped all it mapped
  pthread_mutex_destroy(&state->builtins_lock);
  if (state->context) state->cu->cuDevicePrimaryCtxRelease(state->id);
  devbuf__free(state);
  device->backend_state = NULL;
}

static devbuf_status cuda_open(devbuf_device_t *device, int index) {
  const char *reason = NULL;
  const devbuf__cuda_api *cu = devbuf__cuda_load(&reason);
  if (!cu) return devbuf__error(DEVBUF_UNAVAILABLE, "cuda:%d: %s", index, reason);
  int count = 0;
  CUresult code = cu->cuDeviceGetCount(&count);
  if (code != CUDA_SUCCESS) return devbuf__cuda_error(cu, code, "cuda:%d: cuDeviceGetCount", index);
  if (index >= count)
    return devbuf__error(DEVBUF_UNAVAILABLE, "cuda:%d does not exist: the driver sees %d device(s)",
                         index, count);
  devbuf__cuda_device *state = devbuf__calloc(1, sizeof *state);
  if (!state) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a CUDA device");
  state->cu = cu;
  pthread_mutex_init(&state->events_lock, NULL);
  pthread_mutex_init(&state->mappings_lock, NULL);
  pthread_mutex_init(&state->builtins_lock, NULL);
  pthread_mutex_init(&state->staging_lock, NULL);
  device->backend_state = state;
  devbuf_status status = DEVBUF_OK;
  code = cu->cuDeviceGet(&state->id, index);
  if (code == CUDA_SUCCESS) code = cu->cuDevicePrimaryCtxRetain(&state->context, state->id);
  if (code == CUDA_SUCCESS) code = cu->cuCtxSetCurrent(state->context);
  if (code == CUDA_SUCCESS) code = cu->cuStreamCreate(&state->transfers, CU_STREAM_NON_BLOCKING);
  if (code != CUDA_SUCCESS)
    status = devbuf__cuda_error(cu, code, "cuda:%d: opening the device", index);
  if (status == DEVBUF_OK && !attribute(cu, state->id, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING))
    status = devbuf__error(DEVBUF_UNAVAILABLE,
                           "cuda:%d has no unified addressing, which devbuf needs", index);
  if (status != DEVBUF_OK) {
    cuda_close(device);
    return status;
  }
  char name[96] = "";
  cu->cuDeviceGetName(name, (int)sizeof name - 1, state->id);
  snprintf(device->name, sizeof device->name, "%.80s (sm_%d%d)", name,
           attribute(cu, state->id, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
           attribute(cu, state->id, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
  int driver = 0;
  cu->cuDriverGetVersion(&driver);
  snprintf(device->version, sizeof device->version, "CUDA driver %d.%d", driver / 1000,
           driver % 1000 / 10);
  size_t total = 0;
  cu->cuDeviceTotalMem(&total, state->id);
  device->global_memory = total;
  device->max_allocation = total;
  device->alignment = 256; // cuMemAlloc's alignment, and what kernels may assume of a view
  device->unified_memory = attribute(cu, state->id, CU_DEVICE_ATTRIBUTE_INTEGRATED) != 0;
  device->processor = DEVBUF_PROCESSOR_GPU;
  device->managed_memory = attribute(cu, state->id, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) != 0;
  device->page_size = CUDA_PAGE;
  device->host_accessible = false;
  // A driver with the entry points may still drive a GPU without them (some virtual GPUs).
  state->maps_memory =
      cu->cuMemAddressReserve &&
      attribute(cu, state->id, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
  device->shares_memory =
      state->maps_memory && cu->cuMemExportToShareableHandle &&
      cu->cuMemImportFromShareableHandle &&
      attribute(cu, state->id, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
  if (cu->cuDeviceGetUuid) cu->cuDeviceGetUuid(device->uuid, state->id);
  return DEVBUF_OK;
}

// ---- memory --------------------------------------------------------------------------------

static devbuf_status cuda_raw_alloc(devbuf_device_t *device, devbuf_memory_kind kind, size_t size,
                                    devbuf_memory_t *out) {
  if (kind == DEVBUF_MEMORY_SHAREABLE) return devbuf__cuda_alloc_shareable(device, size, out);
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  const devbuf__cuda_api *cu = state->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  CUdeviceptr address = 0;
  void *host = NULL;
  CUresult code;
  if (kind == DEVBUF_MEMORY_HOST_VISIBLE) {
    code = cu->cuMemAllocHost(&host, size);
    if (code == CUDA_SUCCESS)
      address = (CUdeviceptr)(uintptr_t)host; // unified addressing: one address
  } else if (kind == DEVBUF_MEMORY_MANAGED) {
    code = cu->cuMemAllocManaged(&address, size, CU_MEM_ATTACH_GLOBAL);
    host = (void *)(uintptr_t)address;
  } else {
    code = cu->cuMemAlloc(&address, size);
  }
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: allocating %zu bytes of %s memory", device->spec, size,
                              kind == DEVBUF_MEMORY_HOST_VISIBLE ? "pinned host"
                              : kind == DEVBUF_MEMORY_MANAGED    ? "managed"
                                                                 : "device");
  *out = (devbuf_memory_t){
      .host = host, .device = address, .size = size, .token = (void *)(uintptr_t)kind};
  return DEVBUF_OK;
}

static void cuda_raw_free(devbuf_device_t *device, const devbuf_memory_t *memory) {
  if (devbuf__cuda_is_shareable(memory)) {
    devbuf__cuda_release_shareable(device, memory);
    return;
  }
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  if (devbuf__cuda_enter(device) != DEVBUF_OK) return;
  if ((uintptr_t)memory->token == DEVBUF_MEMORY_HOST_VISIBLE)
    state->cu->cuMemFreeHost(memory->host);
  else
    state->cu->cuMemFree(memory->device);
}

// Overlapping ranges (the driver promises no memmove) go through the host a piece at a time,
// in the direction memmove takes: moving down, front to back; moving up, back to front. A
// piece read before it is written over is all each step needs, so the host holds at most
// one piece, not the whole range.
#define OVERLAP_PIECE ((size_t)8 << 20)

static CUresult copy_overlapping(devbuf__cuda_device *state, CUdeviceptr dst, CUdeviceptr src,
                                 size_t size, void *staging, size_t piece_size) {
  const devbuf__cuda_api *cu = state->cu;
  CUresult code = CUDA_SUCCESS;
  CUdeviceptr bounce = (CUdeviceptr)(uintptr_t)staging;
  for (size_t done = 0; done < size && code == CUDA_SUCCESS;) {
    size_t piece = size - done < piece_size ? size - done : piece_size;
    size_t at = dst < src ? done : size - done - piece;
    code = cu->cuMemcpyAsync(bounce, src + at, piece, state->transfers);
    if (code == CUDA_SUCCESS) code = cu->cuMemcpyAsync(dst + at, bounce, piece, state->transfers);
    if (code == CUDA_SUCCESS) code = cu->cuStreamSynchronize(state->transfers);
    done += piece;
  }
  return code;
}

// One copy between any two addresses (unified addressing) on the transfer stream, waited
// for: the legacy stream's copies may still run when they return, and queue streams do not
// order themselves after it.
static devbuf_status copy_addresses(devbuf_device_t *device, CUdeviceptr dst, CUdeviceptr src,
                                    size_t size) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  const devbuf__cuda_api *cu = state->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK || size == 0 || dst == src) return status;
  CUresult code;
  if (dst < src + size && src < dst + size) {
    size_t piece = size < OVERLAP_PIECE ? size : OVERLAP_PIECE;
    void *staging = devbuf__malloc(piece);
    if (!staging)
      return devbuf__error(DEVBUF_OUT_OF_MEMORY, "%s: no host memory to stage a %zu-byte copy",
                           device->spec, piece);
    code = copy_overlapping(state, dst, src, size, staging, piece);
    devbuf__free(staging);
  } else {
    code = cu->cuMemcpyAsync(dst, src, size, state->transfers);
    if (code == CUDA_SUCCESS) code = cu->cuStreamSynchronize(state->transfers);
  }
  return code == CUDA_SUCCESS
             ? DEVBUF_OK
             : devbuf__cuda_error(cu, code, "%s: copying %zu bytes", device->spec, size);
}

// ---- copies through pinned staging --------------------------------------------------------

// Pageable host memory cannot be read by the device's copy engines: the driver stages it
// itself, one piece at a time. devbuf stages large copies through two pinned buffers
// instead, so that the CPU fills (or empties) one while the device copies the other.
#define STAGING_PIECE ((size_t)8 << 20)
#define STAGING_MIN   ((size_t)1 << 20) // below this, the driver's own staging costs less

static bool pageable(const devbuf__cuda_api *cu, const void *host) {
  unsigned type = 0; // the driver knows pinned, registered, managed and device memory
  return cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                   (CUdeviceptr)(uintptr_t)host) != CUDA_SUCCESS;
}

// Caller holds staging_lock.
static CUresult staging_ready(devbuf__cuda_device *state) {
  CUresult code = CUDA_SUCCESS;
  for (int i = 0; i < 2 && code == CUDA_SUCCESS; i++) {
    if (!state->staging[i]) code = state->cu->cuMemAllocHost(&state->staging[i], STAGING_PIECE);
    if (code == CUDA_SUCCESS && !state->staged[i])
      code = state->cu->cuEventCreate(&state->staged[i],
                                      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING);
  }
  return code;
}

// Host to device: the CPU copies piece k into staging[k % 2] once the device is done with
// what that buffer held before, then the device copies it on.
static CUresult stage_in(devbuf__cuda_device *state, CUdeviceptr dst, const char *src,
                         size_t size) {
  const devbuf__cuda_api *cu = state->cu;
  CUresult code = CUDA_SUCCESS;
  bool used[2] = {false, false};
  for (size_t done = 0, k = 0; done < size && code == CUDA_SUCCESS; done += STAGING_PIECE, k++) {
    size_t piece = size - done < STAGING_PIECE ? size - done : STAGING_PIECE;
    int b = (int)(k % 2);
    if (used[b]) code = cu->cuEventSynchronize(state->staged[b]);
    if (code != CUDA_SUCCESS) break;
    devbuf__copy_bytes(state->staging[b], src + done, piece);
    code = cu->cuMemcpyAsync(dst + done, (CUdeviceptr)(uintptr_t)state->staging[b], piece,
                             state->transfers);
    if (code == CUDA_SUCCESS) code = cu->cuEventRecord(state->staged[b], state->transfers);
    used[b] = true;
  }
  CUresult drained = cu->cuStreamSynchronize(state->transfers);
  return code != CUDA_SUCCESS ? code : drained;
}

// Device to host: the device copies piece k + 1 into one buffer while the CPU copies piece
// k out of the other.
static CUresult stage_out(devbuf__cuda_device *state, char *dst, CUdeviceptr src, size_t size) {
  const devbuf__cuda_api *cu = state->cu;
  size_t pieces = (size + STAGING_PIECE - 1) / STAGING_PIECE;
  CUresult code = CUDA_SUCCESS;
  for (size_t k = 0; k <= pieces && code == CUDA_SUCCESS; k++) {
    if (k < pieces) { // start piece k
      size_t at = k * STAGING_PIECE, piece = size - at < STAGING_PIECE ? size - at : STAGING_PIECE;
      code = cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)state->staging[k % 2], src + at, piece,
                               state->transfers);
      if (code == CUDA_SUCCESS) code = cu->cuEventRecord(state->staged[k % 2], state->transfers);
    }
    if (k > 0 && code == CUDA_SUCCESS) { // finish piece k - 1
      size_t at = (k - 1) * STAGING_PIECE,
             piece = size - at < STAGING_PIECE ? size - at : STAGING_PIECE;
      code = cu->cuEventSynchronize(state->staged[(k - 1) % 2]);
      if (code == CUDA_SUCCESS) devbuf__copy_bytes(dst + at, state->staging[(k - 1) % 2], piece);
    }
  }
  CUresult drained = cu->cuStreamSynchronize(state->transfers);
  return code != CUDA_SUCCESS ? code : drained;
}

// A copy between device memory and host memory at `host`: through the staging pair when
// the host side is large and pageable, directly otherwise.
static devbuf_status copy_host(devbuf_device_t *device, CUdeviceptr device_address, void *host,
                               size_t size, bool to_device) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  const devbuf__cuda_api *cu = state->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK || size == 0) return status;
  if (size >= STAGING_MIN && pageable(cu, host)) {
    pthread_mutex_lock(&state->staging_lock);
    CUresult code =
        staging_ready(state); // without pinned memory, the driver stages it itself (below)
    bool staged = code == CUDA_SUCCESS;
    if (staged)
      code = to_device ? stage_in(state, device_address, host, size)
                       : stage_out(state, host, device_address, size);
    pthread_mutex_unlock(&state->staging_lock);
    if (staged && code != CUDA_SUCCESS)
      return devbuf__cuda_error(
          cu, code, "%s: copying %zu bytes %s pageable host memory through pinned staging",
          device->spec, size, to_device ? "from" : "to");
    if (staged) return DEVBUF_OK;
  }
  CUdeviceptr address = (CUdeviceptr)(uintptr_t)host;
  return to_device ? copy_addresses(device, device_address, address, size)
                   : copy_addresses(device, address, device_address, size);
}

static devbuf_status cuda_write(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                                const void *src, size_t size) {
  return copy_host(device, dst->device + offset, (void *)src, size, true);
}

static devbuf_status cuda_read(devbuf_device_t *device, const devbuf_memory_t *src, size_t offset,
                               void *dst, size_t size) {
  return copy_host(device, src->device + offset, dst, size, false);
}

static devbuf_status cuda_copy(devbuf_device_t *device, const devbuf_memory_t *dst,
                               size_t dst_offset, const devbuf_memory_t *src, size_t src_offset,
                               size_t size) {
  return copy_addresses(device, dst->device + dst_offset, src->device + src_offset, size);
}

static devbuf_status cuda_zero(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                               size_t size) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  const devbuf__cuda_api *cu = state->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  CUresult code = cu->cuMemsetD8Async(dst->device + offset, 0, size, state->transfers);
  if (code == CUDA_SUCCESS) code = cu->cuStreamSynchronize(state->transfers);
  return code == CUDA_SUCCESS
             ? DEVBUF_OK
             : devbuf__cuda_error(cu, code, "%s: zeroing %zu bytes", device->spec, size);
}

static devbuf_status cuda_synchronize(devbuf_device_t *device) {
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  return devbuf__cuda_wait(device, devbuf__cuda_of(device)->transfers, "synchronize");
}

// ---- the caller's context ------------------------------------------------------------------

// The CUDA runtime takes the thread's current context for its current device: had devbuf
// left its own current, a program's next cudaMalloc or torch.empty(device="cuda") on that
// thread would land on devbuf's GPU, and a context of the caller's own would be lost. So each
// entry of the backend's table below notes the caller's context (none included) and puts it
// back when it returns; devbuf's own paths still make theirs current (devbuf__cuda_enter).
typedef struct caller_context {
  CUcontext previous;
  bool restore;
} caller_context;

static caller_context caller_note(const devbuf__cuda_api *cu, CUcontext ours) {
  CUcontext previous = NULL;
  if (cu->cuCtxGetCurrent(&previous) != CUDA_SUCCESS) return (caller_context){NULL, false};
  return (caller_context){previous, previous != ours};
}

static void caller_restore(const devbuf__cuda_api *cu, caller_context caller) {
  if (caller.restore) cu->cuCtxSetCurrent(caller.previous);
}

// Each entry of the table, wrapped: `name` called between noting and restoring.
#define KEEPING_CALLER(type, name, parameters, arguments)                      \
  static type name##_keeping parameters {                                      \
    const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;                  \
    caller_context caller = caller_note(cu, devbuf__cuda_of(device)->context); \
    type result = name arguments;                                              \
    caller_restore(cu, caller);                                                \
    return result;                                                             \
  }
#define KEEPING_CALLER_VOID(name, parameters, arguments)                       \
  static void name##_keeping parameters {                                      \
    const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;                  \
    caller_context caller = caller_note(cu, devbuf__cuda_of(device)->context); \
    name arguments;                                                            \
    caller_restore(cu, caller);                                                \
  }

KEEPING_CALLER(devbuf_status, cuda_raw_alloc,
               (devbuf_device_t * device, devbuf_memory_kind kind, size_t size,
                devbuf_memory_t *out),
               (device, kind, size, out))
KEEPING_CALLER_VOID(cuda_raw_free, (devbuf_device_t * device, const devbuf_memory_t *memory),
                    (device, memory))
KEEPING_CALLER(devbuf_status, devbuf__cuda_reserve,
               (devbuf_device_t * device, size_t size, devbuf_memory_t *out), (device, size, out))
KEEPING_CALLER(devbuf_status, devbuf__cuda_map,
               (devbuf_device_t * device, const devbuf_memory_t *reservation, size_t offset,
                size_t size),
               (device, reservation, offset, size))
KEEPING_CALLER_VOID(devbuf__cuda_unmap,
                    (devbuf_device_t * device, const devbuf_memory_t *reservation, size_t offset,
                     size_t size),
                    (device, reservation, offset, size))
KEEPING_CALLER_VOID(devbuf__cuda_unreserve,
                    (devbuf_device_t * device, const devbuf_memory_t *reservation),
                    (device, reservation))
KEEPING_CALLER(devbuf_status, devbuf__cuda_export,
               (devbuf_device_t * device, const devbuf_memory_t *memory, int *out_fd),
               (device, memory, out_fd))
KEEPING_CALLER(devbuf_status, devbuf__cuda_import,
               (devbuf_device_t * device, int fd, size_t size, devbuf_memory_t *out),
               (device, fd, size, out))
KEEPING_CALLER_VOID(devbuf__cuda_release_shareable,
                    (devbuf_device_t * device, const devbuf_memory_t *memory), (device, memory))
KEEPING_CALLER(devbuf_status, cuda_write,
               (devbuf_device_t * device, const devbuf_memory_t *dst, size_t offset,
                const void *src, size_t size),
               (device, dst, offset, src, size))
KEEPING_CALLER(devbuf_status, cuda_read,
               (devbuf_device_t * device, const devbuf_memory_t *src, size_t offset, void *dst,
                size_t size),
               (device, src, offset, dst, size))
KEEPING_CALLER(devbuf_status, cuda_copy,
               (devbuf_device_t * device, const devbuf_memory_t *dst, size_t dst_offset,
                const devbuf_memory_t *src, size_t src_offset, size_t size),
               (device, dst, dst_offset, src, src_offset, size))
KEEPING_CALLER(devbuf_status, cuda_zero,
               (devbuf_device_t * device, const devbuf_memory_t *dst, size_t offset, size_t size),
               (device, dst, offset, size))
KEEPING_CALLER(devbuf_status, cuda_synchronize, (devbuf_device_t * device), (device))
KEEPING_CALLER(devbuf_status, devbuf__cuda_queue_create,
               (devbuf_device_t * device, void **out_queue), (device, out_queue))
KEEPING_CALLER_VOID(devbuf__cuda_queue_destroy, (devbuf_device_t * device, void *queue),
                    (device, queue))
KEEPING_CALLER(devbuf_status, devbuf__cuda_enqueue,
               (devbuf_device_t * device, void *queue, const devbuf__op *op, void **out_event),
               (device, queue, op, out_event))
KEEPING_CALLER(devbuf_status, devbuf__cuda_complete,
               (devbuf_device_t * device, void *queue, devbuf__device_done *items, size_t count),
               (device, queue, items, count))
KEEPING_CALLER_VOID(devbuf__cuda_event_release, (devbuf_device_t * device, void *event),
                    (device, event))
KEEPING_CALLER(devbuf_status, devbuf__cuda_program_build,
               (devbuf_device_t * device, const char *source, const char *options,
                void **out_program),
               (device, source, options, out_program))
KEEPING_CALLER_VOID(devbuf__cuda_program_release, (devbuf_device_t * device, void *program),
                    (device, program))
KEEPING_CALLER(devbuf_status, devbuf__cuda_program_check_launch,
               (devbuf_device_t * device, void *program, const char *name,
                const devbuf_launch_t *launch, size_t buffers, size_t scalars),
               (device, program, name, launch, buffers, scalars))

// Opening and closing note the caller's context before the device's state exists, and put it
// back after it is gone (the primary context released).
static devbuf_status cuda_open_keeping(devbuf_device_t *device, int index) {
  const char *reason = NULL;
  const devbuf__cuda_api *cu = devbuf__cuda_load(&reason);
  caller_context caller = {NULL, false}; // none yet of the device's: put back whatever it is
  if (cu) caller.restore = cu->cuCtxGetCurrent(&caller.previous) == CUDA_SUCCESS;
  devbuf_status status = cuda_open(device, index);
  if (cu) caller_restore(cu, caller);
  return status;
}

static void cuda_close_keeping(devbuf_device_t *device) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  const devbuf__cuda_api *cu = state ? state->cu : NULL;
  caller_context caller = cu ? caller_note(cu, state->context) : (caller_context){NULL, false};
  // A caller whose current context is this one (the runtime's, on the same GPU) keeps it:
  // the primary context lives on while the runtime holds it.
  cuda_close(device);
  if (cu) caller_restore(cu, caller);
}

const devbuf__backend devbuf__backend_cuda = {
    .dlpack_device_type = 2, // kDLCUDA
    .open = cuda_open_keeping,
    .close = cuda_close_keeping,
    .raw_alloc = cuda_raw_alloc_keeping,
    .raw_free = cuda_raw_free_keeping,
    .raw_reserve = devbuf__cuda_reserve_keeping,
    .raw_map = devbuf__cuda_map_keeping,
    .raw_unmap = devbuf__cuda_unmap_keeping,
    .raw_unreserve = devbuf__cuda_unreserve_keeping,
    .raw_export = devbuf__cuda_export_keeping,
    .raw_import = devbuf__cuda_import_keeping,
    .raw_unimport = devbuf__cuda_release_shareable_keeping,
    .write = cuda_write_keeping,
    .read = cuda_read_keeping,
    .copy = cuda_copy_keeping,
    .zero = cuda_zero_keeping,
    .synchronize = cuda_synchronize_keeping,
    .queue_create = devbuf__cuda_queue_create_keeping,
    .queue_destroy = devbuf__cuda_queue_destroy_keeping,
    .enqueue = devbuf__cuda_enqueue_keeping,
    .complete = devbuf__cuda_complete_keeping,
    .event_release = devbuf__cuda_event_release_keeping,
    .program_build = devbuf__cuda_program_build_keeping,
    .program_release = devbuf__cuda_program_release_keeping,
    .program_check_launch = devbuf__cuda_program_check_launch_keeping,
};
