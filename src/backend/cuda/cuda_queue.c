// CUDA queues and programs. Each devbuf queue owns a non-blocking stream; its worker
// enqueues items there back to back, each with an event recorded behind it (items of other
// queues that depend on it wait for that event on their own stream), and retires a group
// once the last one's event has completed (devbuf__cuda_complete). A wait for a host
// event value is a stream memory operation on a pinned word that the value (or cancel)
// writes; it stays a barrier, so that cancel drops what follows it unstarted. Programs
// are modules loaded from PTX, cubin or fatbin.
#include "cuda_backend.h"
#include "../../exec/queue.h"

#include <string.h>

// A host-signalled wait in flight: the event watch writes the queue's pinned word once the
// value is reached (or fails), cancel writes it too; the first write opens it. The worker
// detaches it when the wait is over, so that a watch firing later writes nothing.
typedef struct gate {
  pthread_mutex_t lock;
  devbuf__refcount refs;              // the worker's and the watch's
  volatile uint32_t *word;            // NULL once detached
  uint32_t target;
} gate;

typedef struct cuda_queue {
  CUstream stream;
  uint32_t *gate_word;                // pinned, made on the first wait; never goes down
  uint32_t gates;                     // waits so far: the value that opens the next one
  bool host_waits;                    // the driver refused a stream memory operation
  pthread_mutex_t lock;               // `waiting`, against cancel
  gate *waiting;
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
  pthread_mutex_init(&q->lock, NULL);
  *out_queue = q;
  return DEVBUF_OK;
}

void devbuf__cuda_queue_destroy(devbuf_device_t *device, void *queue) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  cuda_queue *q = queue;
  if (devbuf__cuda_enter(device) == DEVBUF_OK) {
    cu->cuStreamSynchronize(q->stream);
    cu->cuStreamDestroy(q->stream);
    if (q->gate_word) cu->cuMemFreeHost(q->gate_word);
  }
  pthread_mutex_destroy(&q->lock);
  devbuf__free(q);
}

// ---- events ----------------------------------------------------------------------------------

// Every item has an event behind it; the device keeps a few spare ones, as creating one
// costs a driver call.
#define SPARE_EVENTS (sizeof ((devbuf__cuda_device *)0)->spare_events / sizeof(CUevent))

static CUresult event_take(devbuf_device_t *device, CUevent *out) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  pthread_mutex_lock(&state->events_lock);
  *out = state->spare_count ? state->spare_events[--state->spare_count] : NULL;
  pthread_mutex_unlock(&state->events_lock);
  // Blocking synchronization: the worker sleeps in the driver instead of spinning a core.
  return *out ? CUDA_SUCCESS : state->cu->cuEventCreate(out, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING);
}

void devbuf__cuda_event_release(devbuf_device_t *device, void *event) {
  devbuf__cuda_device *state = devbuf__cuda_of(device);
  pthread_mutex_lock(&state->events_lock);
  bool kept = state->spare_count < SPARE_EVENTS;
  if (kept) state->spare_events[state->spare_count++] = event;
  pthread_mutex_unlock(&state->events_lock);
  if (!kept && devbuf__cuda_enter(device) == DEVBUF_OK) state->cu->cuEventDestroy(event);
}

// ---- waits for host-signalled events ---------------------------------------------------------

static void gate_unref(gate *g) {
  if (!devbuf__ref_drop(&g->refs)) return;
  pthread_mutex_destroy(&g->lock);
  devbuf__free(g);
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->lock);
  if (g->word) __atomic_store_n(g->word, g->target, __ATOMIC_RELEASE); // the device polls the pinned word
  pthread_mutex_unlock(&g->lock);
}

static void gate_reached(void *context, devbuf_status status) {
  (void)status; // the worker reads the event's value and status once the gate is open
  gate_open(context);
  gate_unref(context);
}

void devbuf__cuda_cancel_wait(devbuf_device_t *device, void *queue) {
  (void)device;
  cuda_queue *q = queue;
  pthread_mutex_lock(&q->lock);
  if (q->waiting) gate_open(q->waiting);
  pthread_mutex_unlock(&q->lock);
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

// A CUDA error on the device is sticky for the whole context, so a wait on the device passes
// on nothing that ordering only would not: order-only dependencies wait here too.
static bool wait_on_stream(void *context, const devbuf__dep *dep, void *event) {
  stream_waits *waits = context;
  return devbuf__work_of(dep->work)->event_device == waits->device &&
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
  CUfunction kernel = width <= 64 ? devbuf__cuda_fill_kernel(device) : NULL;
  if (kernel) { // devbuf's fill kernel: 16 bytes a thread
    struct {
      unsigned char bytes[64];
    } pattern = {{0}};
    memcpy(pattern.bytes, work->scalars, width);
    unsigned long long size = use->size;
    unsigned pattern_size = (unsigned)width;
    void *params[4] = {&address, &size, &pattern, &pattern_size};
    size_t threads = (use->size + 15) / 16, blocks = (threads + 255) / 256;
    unsigned grid = blocks > 65536 ? 65536 : (unsigned)blocks; // the kernel strides past the grid
    CUresult code = cu->cuLaunchKernel(kernel, grid, 1, 1, 256, 1, 1, 0, q->stream, params, NULL);
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

// A wait for an event value, on the device where the driver has stream memory operations:
// the stream waits for the queue's pinned word to reach this wait's number. Without them
// the worker waits on the host. Either way the wait is over when this returns.
static devbuf_status run_wait(devbuf_device_t *device, cuda_queue *q, devbuf__work *work) {
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  if (!cu->cuStreamWaitValue32 || q->host_waits)
    return devbuf__event_wait(work->event, work->value, UINT64_MAX, &work->cancel);
  if (!q->gate_word) {
    void *word = NULL;
    CUresult code = cu->cuMemAllocHost(&word, sizeof(uint32_t));
    if (code != CUDA_SUCCESS) return devbuf__cuda_error(cu, code, "%s: pinned memory for event waits", device->spec);
    q->gate_word = word;
    *q->gate_word = 0;
  }
  // Some drivers have the entry point but stream memory operations turned off: the host
  // waits for them, from then on.
  CUresult code = cu->cuStreamWaitValue32(q->stream, (CUdeviceptr)(uintptr_t)q->gate_word, q->gates + 1,
                                          CU_STREAM_WAIT_VALUE_GEQ);
  if (code != CUDA_SUCCESS) {
    q->host_waits = true;
    return devbuf__event_wait(work->event, work->value, UINT64_MAX, &work->cancel);
  }
  gate *g = devbuf__malloc(sizeof *g);
  if (!g) { // the stream already waits for the word: open it, so that nothing stays parked
    __atomic_store_n(q->gate_word, ++q->gates, __ATOMIC_RELEASE);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an event wait");
  }
  pthread_mutex_init(&g->lock, NULL);
  devbuf__ref_init(&g->refs, 2);
  g->word = q->gate_word;
  g->target = ++q->gates;
  devbuf_status status = DEVBUF_OK;
  CUevent done = NULL;
  if (code == CUDA_SUCCESS) code = event_take(device, &done);
  if (code == CUDA_SUCCESS) code = cu->cuEventRecord(done, q->stream);
  if (code != CUDA_SUCCESS) status = devbuf__cuda_error(cu, code, "%s: a wait for an event value", device->spec);
  pthread_mutex_lock(&q->lock);
  q->waiting = g;
  pthread_mutex_unlock(&q->lock);
  if (status != DEVBUF_OK || devbuf__event_watch_value(work->event, work->value, gate_reached, g) != DEVBUF_OK) {
    gate_open(g); // nothing will open it: the host decides below
    gate_unref(g);
  }
  if (atomic_load(&work->cancel)) gate_open(g); // cancelled before the gate was there
  if (status == DEVBUF_OK) {
    code = cu->cuEventSynchronize(done);
    if (code != CUDA_SUCCESS) status = devbuf__cuda_error(cu, code, "%s: a wait for an event value", device->spec);
  }
  if (done) devbuf__cuda_event_release(device, done);
  pthread_mutex_lock(&q->lock);
  q->waiting = NULL;
  pthread_mutex_unlock(&q->lock);
  gate_open(g); // after a failure above the stream must not stay parked on it
  pthread_mutex_lock(&g->lock);
  g->word = NULL;
  pthread_mutex_unlock(&g->lock);
  gate_unref(g);
  return status != DEVBUF_OK ? status : devbuf__wait_outcome(work);
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
    return run_wait(device, q, work);
  default:
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s cannot run this work item", device->spec);
  }
  if (status != DEVBUF_OK) return status;
  CUevent done = NULL; // completion, and what dependents on other queues wait for on their streams
  CUresult code = event_take(device, &done);
  if (code == CUDA_SUCCESS) code = cu->cuEventRecord(done, q->stream);
  if (code != CUDA_SUCCESS) {
    if (done) devbuf__cuda_event_release(device, done);
    cu->cuStreamSynchronize(q->stream); // the item is enqueued: it must be over before it retires
    return devbuf__cuda_error(cu, code, "%s: an event behind %s", device->spec,
                              work->kind == DEVBUF__WORK_LAUNCH ? work->kernel_name : "a command");
  }
  work->event_device = devbuf__device_keep(device);
  atomic_store_explicit(&work->device_event, done, memory_order_release);
  return DEVBUF_OK;
}

devbuf_status devbuf__cuda_complete(devbuf_device_t *device, void *queue, devbuf__work **items, size_t count) {
  (void)queue;
  const devbuf__cuda_api *cu = devbuf__cuda_of(device)->cu;
  CUevent last = NULL; // in order: once the last command is done, all before it are
  for (size_t i = count; i-- > 0 && !last;) last = atomic_load_explicit(&items[i]->device_event, memory_order_acquire);
  if (!last) return DEVBUF_OK;
  CUresult code = cu->cuCtxSetCurrent(devbuf__cuda_of(device)->context);
  if (code == CUDA_SUCCESS) code = cu->cuEventSynchronize(last);
  if (code == CUDA_SUCCESS) return DEVBUF_OK;
  // A fault poisons the context: which of these ran before it cannot be told, so none did.
  devbuf_status failed = DEVBUF_OK;
  for (size_t i = 0; i < count; i++) {
    if (items[i]->status != DEVBUF_OK) continue;
    items[i]->status = devbuf__cuda_error(cu, code, "%s: %s failed on the device", device->spec,
                                          items[i]->kind == DEVBUF__WORK_LAUNCH ? items[i]->kernel_name : "a command");
    if (failed == DEVBUF_OK) failed = items[i]->status;
  }
  return failed;
}
