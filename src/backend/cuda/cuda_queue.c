// CUDA queues, operations and programs. A device queue is a non-blocking stream: each
// operation is enqueued behind the events it waits for, with an event recorded behind it
// (what `complete` and the operations of other streams wait for). A wait for a
// host-signalled event is the worker's, on the host: a stream parked on a host word
// (cuStreamWaitValue32) would hold every call that synchronizes the device (cuMemFree,
// cuMemUnmap, lazy module loading) until the event is signalled, and for good when the
// thread in that call is the one to signal it. Programs are modules loaded from PTX, cubin
// or fatbin.
#include "cuda_backend.h"

#include <string.h>

#define STAGED_FILL ((size_t)64 << 10) // host bytes of a fill the kernel cannot do

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

CUstream devbuf__cuda_queue_stream(void *queue) { return ((cuda_queue *)queue)->stream; }

void devbuf__cuda_queue_destroy(devbuf_device_t *device, void *queue) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  cuda_queue *q = queue;
  if (devbuf__cuda_enter(device) == DEVBUF_OK) {
    cu->cuStreamSynchronize(q->stream);
    cu->cuStreamDestroy(q->stream);
  }
  devbuf__free(q);
}

// ---- events ----------------------------------------------------------------------------------

// Every item has an event behind it; the device keeps a few spare ones, as creating one
// costs a driver call.
#define SPARE_EVENTS (sizeof((devbuf__cuda_device *)0)->spare_events / sizeof(CUevent))

static CUresult event_take(devbuf_device_t *device, CUevent *out) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  pthread_mutex_lock(&state->events_lock);
  *out = state->spare_count ? state->spare_events[--state->spare_count] : NULL;
  pthread_mutex_unlock(&state->events_lock);
  // Blocking synchronization: the worker sleeps in the driver instead of spinning a core.
  return *out ? CUDA_SUCCESS
              : state->cu->cuEventCreate(out, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING);
}

void devbuf__cuda_event_release(devbuf_device_t *device, void *event) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  pthread_mutex_lock(&state->events_lock);
  bool kept = state->spare_count < SPARE_EVENTS;
  if (kept) state->spare_events[state->spare_count++] = event;
  pthread_mutex_unlock(&state->events_lock);
  if (!kept && devbuf__cuda_enter(device) == DEVBUF_OK) state->cu->cuEventDestroy(event);
}

// ---- programs ------------------------------------------------------------------------------

devbuf_status devbuf__cuda_program_build(devbuf_device_t *device, const char *source,
                                         const char *options, void **out_program) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  if (options && options[0])
    return devbuf__error(
        DEVBUF_UNSUPPORTED,
        "%s loads compiled programs (PTX, cubin, fatbin): options '%.60s' do not apply",
        device->spec, options);
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  CUmodule module = NULL;
  char log[1024] = ""; // the PTX compiler's errors, as OpenCL's build log
  int jit_options[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *values[2] = {log, (void *)(uintptr_t)sizeof log};
  CUresult code = cu->cuModuleLoadDataEx(&module, source, 2, jit_options, values);
  if (code != CUDA_SUCCESS) {
    log[sizeof log - 1] = '\0';
    for (char *c = log; *c; c++)
      if (*c == '\n' || *c == '\r') *c = ' '; // one line
    for (size_t end = strlen(log); end && log[end - 1] == ' ';) log[--end] = '\0';
    return devbuf__cuda_error(
        cu, code, "%s: loading the program (PTX, cubin or fatbin%s)%s%.240s", device->spec,
        code == CUDA_ERROR_NO_BINARY_FOR_GPU ? " with no code for this GPU" : "",
        log[0] ? "; the compiler says: " : "", log);
  }
  *out_program = module;
  return DEVBUF_OK;
}

void devbuf__cuda_program_release(devbuf_device_t *device, void *program) {
  if (devbuf__cuda_enter(device) == DEVBUF_OK) devbuf__cuda_of(device)->cu->cuModuleUnload(program);
}

// The most threads a block of `function` may have (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK):
// below the device's 1024 for a kernel whose registers or __launch_bounds__ allow fewer,
// and the driver refuses a larger block only when the launch is enqueued, failing the queue.
static devbuf_status kernel_block_limit(devbuf_device_t *device, CUfunction function,
                                        const char *name, unsigned *out_limit) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  int limit = 0;
  CUresult code = cu->cuFuncGetAttribute(&limit, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function);
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: kernel '%.100s': its threads per block", device->spec,
                              name);
  *out_limit = limit > 0 && limit < 1024 ? (unsigned)limit : 1024;
  return DEVBUF_OK;
}

// The blocks and threads of a launch: threads per block are the local sizes (or, where they
// are 0, 256 along x, fewer if the kernel takes fewer, and 1 elsewhere), blocks enough to
// cover the global sizes, within what CUDA launches: blocks of at most 1024 threads along x
// and y and 64 along z, 1024 in all, and no more than the kernel's `limit`.
static devbuf_status grid_of(devbuf_device_t *device, const char *name,
                             const devbuf_launch_t *launch, unsigned limit, unsigned block[3],
                             unsigned grid[3]) {
  for (unsigned d = 0; d < 3; d++) block[d] = grid[d] = 1;
  for (unsigned d = 0; d < launch->dims; d++) {
    size_t threads = launch->local[0] ? launch->local[d] : d == 0 ? (limit < 256 ? limit : 256) : 1;
    size_t blocks = launch->global[d] / threads + (launch->global[d] % threads != 0);
    if (threads > 1024 || blocks > (d == 0 ? 0x7fffffffu : 65535u))
      return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                           "%s: kernel '%.100s': dimension %u has %zu blocks of %zu threads, "
                           "more than CUDA launches",
                           device->spec, name, d, blocks, threads);
    block[d] = (unsigned)threads;
    grid[d] = (unsigned)blocks;
  }
  size_t threads = (size_t)block[0] * block[1] * block[2]; // each at most 1024: no overflow
  bool deep = block[2] > 64, wide = threads > 1024;
  if (deep || wide || threads > limit)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%s: kernel '%.100s': a block of %u x %u x %u threads (%zu in all), "
                         "more than %s: %u",
                         device->spec, name, block[0], block[1], block[2], threads,
                         deep   ? "CUDA launches along z"
                         : wide ? "CUDA launches in a block"
                                : "the kernel's limit (its registers or __launch_bounds__)",
                         deep   ? 64u
                         : wide ? 1024u
                                : limit);
  return DEVBUF_OK;
}

// The kernel exists and the grid is one CUDA launches; its parameters are checked as the
// launch is enqueued (cuFuncGetParamInfo, where the driver has it).
devbuf_status devbuf__cuda_program_check_launch(devbuf_device_t *device, void *program,
                                                const char *name, const devbuf_launch_t *launch,
                                                size_t buffers, size_t scalars) {
  (void)buffers, (void)scalars;
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status != DEVBUF_OK) return status;
  CUfunction function;
  CUresult code = cu->cuModuleGetFunction(&function, program, name);
  if (code != CUDA_SUCCESS)
    return devbuf__error(DEVBUF_NOT_FOUND, "%s: the program has no kernel '%.100s' (%d)",
                         device->spec, name, code);
  unsigned limit = 1024, block[3], grid[3];
  status = kernel_block_limit(device, function, name, &limit);
  if (status != DEVBUF_OK) return status;
  return grid_of(device, name, launch, limit, block, grid);
}

// ---- operations ------------------------------------------------------------------------------

static devbuf_status enqueue_fill(devbuf_device_t *device, cuda_queue *q, const devbuf__op *op) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  const devbuf__operand *dst = &op->operands[0];
  if (dst->size == 0) return DEVBUF_OK;
  CUdeviceptr address = dst->memory.device + dst->offset;
  size_t width = op->pattern_size;
  if ((width == 1 || width == 2 || width == 4) && address % width == 0) { // the driver's own fills
    CUresult code;
    if (width == 1) {
      code =
          cu->cuMemsetD8Async(address, *(const unsigned char *)op->pattern, dst->size, q->stream);
    } else if (width == 2) {
      unsigned short value;
      memcpy(&value, op->pattern, 2);
      code = cu->cuMemsetD16Async(address, value, dst->size / 2, q->stream);
    } else {
      unsigned int value;
      memcpy(&value, op->pattern, 4);
      code = cu->cuMemsetD32Async(address, value, dst->size / 4, q->stream);
    }
    return code == CUDA_SUCCESS
               ? DEVBUF_OK
               : devbuf__cuda_error(cu, code, "%s: filling %zu bytes", device->spec, dst->size);
  }
  CUfunction kernel = width <= 64 ? devbuf__cuda_fill_kernel(device) : NULL;
  if (kernel) { // devbuf's fill kernel: 16 bytes a thread
    struct {
      unsigned char bytes[64];
    } pattern = {{0}};
    memcpy(pattern.bytes, op->pattern, width);
    unsigned long long size = dst->size;
    unsigned pattern_size = (unsigned)width;
    void *params[4] = {&address, &size, &pattern, &pattern_size};
    size_t threads = (dst->size + 15) / 16, blocks = (threads + 255) / 256;
    unsigned grid = blocks > 65536 ? 65536 : (unsigned)blocks; // the kernel strides past the grid
    CUresult code = cu->cuLaunchKernel(kernel, grid, 1, 1, 256, 1, 1, 0, q->stream, params, NULL);
    return code == CUDA_SUCCESS
               ? DEVBUF_OK
               : devbuf__cuda_error(cu, code, "%s: filling %zu bytes", device->spec, dst->size);
  }
  // Other patterns: a first stretch written out on the host and copied in, then the filled
  // part copied onto what follows it on the device, doubling each time; the host holds one
  // stretch (whole patterns, about 64 KiB), not the whole fill. The staging waits for the
  // copies.
  size_t stretch = STAGED_FILL / width * width;
  if (stretch < width) stretch = width;
  if (stretch > dst->size) stretch = dst->size;
  char *bytes = devbuf__malloc(stretch);
  if (!bytes)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "%s: no host memory to stage a %zu-byte fill",
                         device->spec, stretch);
  for (size_t done = 0; done < stretch; done += width) memcpy(bytes + done, op->pattern, width);
  CUresult code = cu->cuMemcpyAsync(address, (CUdeviceptr)(uintptr_t)bytes, stretch, q->stream);
  for (size_t filled = stretch; filled < dst->size && code == CUDA_SUCCESS;) {
    size_t more = dst->size - filled < filled ? dst->size - filled : filled;
    code = cu->cuMemcpyAsync(address + filled, address, more, q->stream);
    filled += more;
  }
  devbuf_status status =
      code == CUDA_SUCCESS
          ? devbuf__cuda_wait(device, q->stream, "a staged fill")
          : devbuf__cuda_error(cu, code, "%s: filling %zu bytes", device->spec, dst->size);
  devbuf__free(bytes);
  return status;
}

static devbuf_status enqueue_copy(devbuf_device_t *device, cuda_queue *q, const devbuf__op *op) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  const devbuf__operand *to = &op->operands[0], *from = &op->operands[1];
  size_t size = to->size;
  CUdeviceptr dst = to->memory.device + to->offset, src = from->memory.device + from->offset;
  if (size == 0) return DEVBUF_OK;
  if (dst < src + size &&
      src < dst + size) { // overlapping: through the host, after what came before
    devbuf_status status = devbuf__cuda_wait(device, q->stream, "work before a copy");
    if (status != DEVBUF_OK) return status;
    return device->backend->copy(device, &to->memory, to->offset, &from->memory, from->offset,
                                 size);
  }
  CUresult code = cu->cuMemcpyAsync(dst, src, size, q->stream);
  return code == CUDA_SUCCESS
             ? DEVBUF_OK
             : devbuf__cuda_error(cu, code, "%s: copying %zu bytes", device->spec, size);
}

// A kernel: each operand's address, then the scalars. The grid is whole blocks (256
// threads, or the kernel's limit below that, unless given), so kernels check their index
// against the size they are passed.
static devbuf_status enqueue_launch(devbuf_device_t *device, cuda_queue *q, const devbuf__op *op) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  CUfunction function;
  CUresult code = cu->cuModuleGetFunction(&function, op->program, op->kernel_name);
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: kernel '%.100s'", device->spec, op->kernel_name);
  size_t count = op->operand_count + op->arg_count;
  if (cu->cuFuncGetParamInfo) {
    // The driver reads as many arguments as the kernel declares, each of the size it
    // declares: a 4-byte scalar for a size_t parameter would hand the kernel 4 bytes more.
    size_t declared = 0, offset, size;
    for (; (code = cu->cuFuncGetParamInfo(function, declared, &offset, &size)) == CUDA_SUCCESS;
         declared++) {
      if (declared >= count) continue;
      bool use = declared < op->operand_count;
      size_t given = use ? sizeof(CUdeviceptr) : op->arg_sizes[declared - op->operand_count];
      if (size != given)
        return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                             "%s: kernel '%.100s' takes %zu bytes as argument %zu; the launch "
                             "gives %zu (%s %zu)",
                             device->spec, op->kernel_name, size, declared, given,
                             use ? "the address of use" : "scalar",
                             use ? declared : declared - op->operand_count);
    }
    if (code != CUDA_ERROR_INVALID_VALUE) // past the last parameter: anything else is a fault
      return devbuf__cuda_error(cu, code, "%s: kernel '%.100s': its parameters", device->spec,
                                op->kernel_name);
    if (declared != count)
      return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                           "%s: kernel '%.100s' takes %zu arguments; the launch gives %zu uses "
                           "and %zu scalars",
                           device->spec, op->kernel_name, declared, op->operand_count,
                           op->arg_count);
  }
  unsigned limit = 1024, block[3], grid[3];
  devbuf_status grid_status = kernel_block_limit(device, function, op->kernel_name, &limit);
  if (grid_status == DEVBUF_OK)
    grid_status = grid_of(device, op->kernel_name, op->launch, limit, block, grid);
  if (grid_status != DEVBUF_OK) return grid_status;
  void **params = devbuf__malloc((count ? count : 1) * sizeof *params);
  CUdeviceptr *addresses =
      devbuf__malloc((op->operand_count ? op->operand_count : 1) * sizeof *addresses);
  if (!params || !addresses) {
    devbuf__free(params);
    devbuf__free(addresses);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu kernel arguments", count);
  }
  for (size_t u = 0; u < op->operand_count; u++) {
    const devbuf__operand *operand = &op->operands[u];
    addresses[u] = operand->size ? operand->memory.device + operand->offset : 0;
    params[u] = &addresses[u];
  }
  const char *bytes = op->arg_bytes;
  for (size_t a = 0; a < op->arg_count; a++) {
    params[op->operand_count + a] = (void *)bytes; // the driver only reads them
    bytes += op->arg_sizes[a];
  }
  code = cu->cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0,
                            q->stream, params, NULL);
  devbuf__free(params);
  devbuf__free(addresses);
  if (code != CUDA_SUCCESS)
    return devbuf__cuda_error(cu, code, "%s: launching kernel '%.100s'", device->spec,
                              op->kernel_name);
  return DEVBUF_OK;
}

// Events of other streams of this device: the stream waits for them, or (if the driver
// refuses that) the host does.
static devbuf_status wait_for_events(devbuf_device_t *device, cuda_queue *q, const devbuf__op *op) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  for (size_t i = 0; i < op->wait_count; i++) {
    if (cu->cuStreamWaitEvent(q->stream, op->waits[i], 0) == CUDA_SUCCESS) continue;
    CUresult code = cu->cuEventSynchronize(op->waits[i]);
    if (code != CUDA_SUCCESS)
      return devbuf__cuda_error(cu, code, "%s: waiting for work of another queue", device->spec);
  }
  return DEVBUF_OK;
}

// An event behind what `q` has enqueued so far: its completion.
static devbuf_status record_event(devbuf_device_t *device, cuda_queue *q, const char *what,
                                  void **out_event) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  CUevent done = NULL;
  CUresult code = event_take(device, &done);
  if (code == CUDA_SUCCESS) code = cu->cuEventRecord(done, q->stream);
  if (code != CUDA_SUCCESS) {
    if (done) devbuf__cuda_event_release(device, done);
    return devbuf__cuda_error(cu, code, "%s: an event behind %s", device->spec, what);
  }
  *out_event = done;
  return DEVBUF_OK;
}

devbuf_status devbuf__cuda_enqueue(devbuf_device_t *device, void *queue, const devbuf__op *op,
                                   void **out_event) {
  cuda_queue *q = queue;
  *out_event = NULL;
  devbuf_status status = devbuf__cuda_enter(device);
  if (status == DEVBUF_OK) status = wait_for_events(device, q, op);
  if (status != DEVBUF_OK) return status;
  switch (op->kind) {
  case DEVBUF__OP_FILL:
    status = enqueue_fill(device, q, op);
    break;
  case DEVBUF__OP_COPY:
    status = enqueue_copy(device, q, op);
    break;
  case DEVBUF__OP_LAUNCH:
    status = enqueue_launch(device, q, op);
    break;
  default:
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s runs programs, not C kernels", device->spec);
  }
  if (status != DEVBUF_OK) return status;
  status = record_event(device, q, op->kind == DEVBUF__OP_LAUNCH ? op->kernel_name : "a command",
                        out_event);
  if (status != DEVBUF_OK) // the operation is enqueued: it must be over before it retires
    devbuf__cuda_of(device)->cu->cuStreamSynchronize(q->stream);
  return status;
}

devbuf_status devbuf__cuda_complete(devbuf_device_t *device, void *queue,
                                    devbuf__device_done *items, size_t count) {
  (void)queue;
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  CUevent last = NULL; // in order: once the last command is done, all before it are
  for (size_t i = count; i-- > 0 && !last;) last = items[i].event;
  if (!last) return DEVBUF_OK;
  CUresult code = cu->cuCtxSetCurrent(devbuf__cuda_of(device)->context);
  if (code == CUDA_SUCCESS) code = cu->cuEventSynchronize(last);
  if (code == CUDA_SUCCESS) return DEVBUF_OK;
  // A fault poisons the context: which of these ran before it cannot be told, so none did.
  devbuf_status failed = DEVBUF_OK;
  for (size_t i = 0; i < count; i++) {
    if (items[i].status != DEVBUF_OK) continue;
    items[i].status =
        devbuf__cuda_error(cu, code, "%s: %s failed on the device", device->spec, items[i].what);
    if (failed == DEVBUF_OK) failed = items[i].status;
  }
  return failed;
}
