// CUDA queues and programs. Each devbuf queue owns a non-blocking stream; its worker
// enqueues an item there, records an event behind it (for items of other queues that
// depend on it: they wait for it on their stream), and returns once the item has completed
// (devbuf__cuda_wait). Programs are modules loaded from PTX, cubin or fatbin.
#include "cuda_backend.h"
#include "queue.h"

#include <string.h>

typedef struct cuda_queue {
  CUstream stream;
} cuda_queue;

devbuf_status devbuf__cuda_queue_create(devbuf_device_t *device, void **out_queue) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  cuda_queue *q = devbuf__calloc(1, sizeof *q);
  if (!q) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a queue");
  CUresult code = cu->cuStreamCreate(&q->stream, CU_STREAM_NON_BLOCKING);
  if (code != CUDA_SUCCESS) {
    devbuf__free(q);
    return devbuf__cuda_error(cu, code, "%s: cuStreamCreate", device->spec);
  }
  *out_queue = q;
  return DEVBUF_OK;
}

void devbuf__cuda_queue_destroy(devbuf_device_t *device, void *queue) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  cuda_queue *q = queue;
  if (devbuf__cuda_enter(device) == DEVBUF_OK) {
    cu->cuStreamSynchronize(q->stream);
    cu->cuStreamDestroy(q->stream);
  }
  devbuf__free(q);
}

void devbuf__cuda_event_release(devbuf_device_t *device, void *event) {
  if (devbuf__cuda_enter(device) == DEVBUF_OK) devbuf__cuda_of(device)->cu->cuEventDestroy(event);
}

// Waits of a queue for host-signalled events happen on its worker (devbuf__event_wait), which
// the generic cancel wakes: nothing is parked on the device.
void devbuf__cuda_cancel_wait(devbuf_device_t *device, void *queue) {
  (void)device;
  (void)queue;
}

// ---- programs ------------------------------------------------------------------------------

devbuf_status devbuf__cuda_program_build(devbuf_device_t *device, const char *source, const char *options,
                                         void **out_program) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  if (options && options[0])
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s loads compiled programs (PTX, cubin, fatbin): options '%.60s' do not apply",
                         device->spec, options);
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  CUmodule module = NULL;
  CUresult code = cu->cuModuleLoadData(&module, source);
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: loading the program (PTX, cubin or fatbin%s)", device->spec,
                              code == CUDA_ERROR_NO_BINARY_FOR_GPU ? " with no code for this GPU" : "");
  *out_program = module;
  return DEVBUF_OK;
}

void devbuf__cuda_program_release(devbuf_device_t *device, void *program) {
  if (devbuf__cuda_enter(device) == DEVBUF_OK) devbuf__cuda_of(device)->cu->cuModuleUnload(program);
}

devbuf_status devbuf__cuda_program_has_kernel(devbuf_device_t *device, void *program, const char *name) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  CUfunction function;
  CUresult code = cu->cuModuleGetFunction(&function, program, name);
  if (code != CUDA_SUCCESS)
    return devbuf__error(DEVBUF_NOT_FOUND, "%s: the program has no kernel '%.100s' (%d)", device->spec, name, code);
  return DEVBUF_OK;
}

// ---- running work items --------------------------------------------------------------------

// Dependencies already enqueued on this device are waited for on the stream, the rest on
// the host.
typedef struct stream_waits {
  devbuf_device_t *device;
  CUstream stream;
} stream_waits;

static bool wait_on_stream(void *context, devbuf__work *dep, void *event) {
  stream_waits *waits = context;
  return dep->event_device == waits->device &&
         devbuf__cuda_of(waits->device)->cu->cuStreamWaitEvent(waits->stream, event, 0) == CUDA_SUCCESS;
}

static devbuf_status enqueue_fill(devbuf_device_t *device, cuda_queue *q, devbuf__work *work) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  devbuf__work_use *use = &work->uses[0];
  if (use->size == 0) return DEVBUF_OK;
  CUdeviceptr address = use->memory.device + use->offset;
  size_t width = work->scalars_size;
  if ((width == 1 || width == 2 || width == 4) && address % width == 0) { // the driver's own fills
    CUresult code;
    if (width == 1) {
      code = cu->cuMemsetD8Async(address, *(const unsigned char *)work->scalars, use->size, q->stream);
    } else if (width == 2) {
      unsigned short value;
      memcpy(&value, work->scalars, 2);
      code = cu->cuMemsetD16Async(address, value, use->size / 2, q->stream);
    } else {
      unsigned int value;
      memcpy(&value, work->scalars, 4);
      code = cu->cuMemsetD32Async(address, value, use->size / 4, q->stream);
    }
    return code == CUDA_SUCCESS ? DEVBUF_OK : devbuf__cuda_error(cu, code, "%s: filling %zu bytes", device->spec, use->size);
  }
  // Other patterns: written out on the host, copied in; the staging waits for the copy.
  char *bytes = devbuf__malloc(use->size);
  if (!bytes) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "%s: no host memory to stage a %zu-byte fill", device->spec, use->size);
  for (size_t done = 0; done < use->size; done += work->scalars_size) memcpy(bytes + done, work->scalars, work->scalars_size);
  CUresult code = cu->cuMemcpyAsync(address, (CUdeviceptr)(uintptr_t)bytes, use->size, q->stream);
  devbuf_status status = code == CUDA_SUCCESS ? devbuf__cuda_wait(device, q->stream, "a staged fill")
                                               : devbuf__cuda_error(cu, code, "%s: filling %zu bytes", device->spec, use->size);
  devbuf__free(bytes);
  return status;
}

static devbuf_status enqueue_copy(devbuf_device_t *device, cuda_queue *q, devbuf__work *work) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  size_t size = work->uses[0].size;
  CUdeviceptr dst = work->uses[0].memory.device + work->uses[0].offset;
  CUdeviceptr src = work->uses[1].memory.device + work->uses[1].offset;
  if (size == 0) return DEVBUF_OK;
  if (dst < src + size && src < dst + size) { // overlapping: through the host, after what came before
    devbuf_status status = devbuf__cuda_wait(device, q->stream, "work before a copy");
    if (status != DEVBUF_OK) return status;
    return device->backend->copy(device, &work->uses[0].memory, work->uses[0].offset, &work->uses[1].memory,
                                 work->uses[1].offset, size);
  }
  CUresult code = cu->cuMemcpyAsync(dst, src, size, q->stream);
  return code == CUDA_SUCCESS ? DEVBUF_OK : devbuf__cuda_error(cu, code, "%s: copying %zu bytes", device->spec, size);
}

// A kernel: each use's address, then the scalars. The grid is whole blocks (256 threads
// unless given), so kernels check their index against the size they are passed.
static devbuf_status enqueue_launch(devbuf_device_t *device, cuda_queue *q, devbuf__work *work) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  CUfunction function;
  CUresult code = cu->cuModuleGetFunction(&function, work->program->backend_program, work->kernel_name);
  if (code != CUDA_SUCCESS) return devbuf__cuda_error(cu, code, "%s: kernel '%.100s'", device->spec, work->kernel_name);
  size_t count = work->use_count + work->arg_count;
  if (cu->cuFuncGetParamInfo) { // the driver reads as many arguments as the kernel declares
    size_t declared = 0, offset, size;
    while (cu->cuFuncGetParamInfo(function, declared, &offset, &size) == CUDA_SUCCESS) declared++;
    if (declared != count)
      return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: kernel '%.100s' takes %zu arguments; the launch gives %zu uses "
                           "and %zu scalars", device->spec, work->kernel_name, declared, work->use_count, work->arg_count);
  }
  void **params = devbuf__malloc((count ? count : 1) * sizeof *params);
  CUdeviceptr *addresses = devbuf__malloc((work->use_count ? work->use_count : 1) * sizeof *addresses);
  if (!params || !addresses) {
    devbuf__free(params);
    devbuf__free(addresses);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu kernel arguments", count);
  }
  for (size_t u = 0; u < work->use_count; u++) {
    addresses[u] = work->uses[u].size ? work->uses[u].memory.device + work->uses[u].offset : 0;
    params[u] = &addresses[u];
  }
  const size_t *sizes = work->scalars;
  char *bytes = (char *)(sizes + work->arg_count);
  for (size_t a = 0; a < work->arg_count; a++) {
    params[work->use_count + a] = bytes;
    bytes += sizes[a];
  }
  const devbuf_launch_t *launch = &work->launch;
  unsigned block[3] = {1, 1, 1}, grid[3] = {1, 1, 1};
  for (unsigned d = 0; d < launch->dims; d++) {
    size_t threads = launch->local[0] ? launch->local[d] : d == 0 ? 256 : 1;
    size_t blocks = (launch->global[d] + threads - 1) / threads;
    if (threads > 1024 || blocks > (d == 0 ? 0x7fffffffu : 65535u)) {
      devbuf__free(params);
      devbuf__free(addresses);
      return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: kernel '%.100s': dimension %u has %zu blocks of %zu threads, "
                           "more than CUDA launches", device->spec, work->kernel_name, d, blocks, threads);
    }
    block[d] = (unsigned)threads;
    grid[d] = (unsigned)blocks;
  }
  code = cu->cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, q->stream, params, NULL);
  devbuf__free(params);
  devbuf__free(addresses);
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: launching kernel '%.100s'", device->spec, work->kernel_name);
  return DEVBUF_OK;
}

devbuf_status devbuf__cuda_run(devbuf_device_t *device, void *queue, devbuf__work *work) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  cuda_queue *q = queue;
  devbuf_status status = devbuf__cuda_enter(device);
  stream_waits waits = {device, q->stream};
  if (status == DEVBUF_OK) status = devbuf__work_wait_deps(work, wait_on_stream, &waits);
  if (status != DEVBUF_OK) return status;
  switch (work->kind) {
  case DEVBUF__WORK_FILL:
    status = enqueue_fill(device, q, work);
    break;
  case DEVBUF__WORK_COPY:
    status = enqueue_copy(device, q, work);
    break;
  case DEVBUF__WORK_LAUNCH:
    status = enqueue_launch(device, q, work);
    break;
  case DEVBUF__WORK_WAIT:
    return devbuf__event_wait(work->event, work->value, UINT64_MAX, &work->cancel);
  default:
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s cannot run this work item", device->spec);
  }
  if (status != DEVBUF_OK) return status;
  CUevent done = NULL; // for dependents on other queues, which wait for it on their streams
  if (cu->cuEventCreate(&done, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
    if (cu->cuEventRecord(done, q->stream) == CUDA_SUCCESS) {
      work->event_device = devbuf_device_retain(device);
      atomic_store_explicit(&work->device_event, done, memory_order_release);
    } else {
      cu->cuEventDestroy(done);
    }
  }
  return devbuf__cuda_wait(device, q->stream, work->kind == DEVBUF__WORK_LAUNCH ? work->kernel_name : "a command");
}
