// OpenCL queues and programs. Each devbuf queue owns an in-order cl_command_queue; its
// worker enqueues items there one after another, and before items retire it waits for the
// completion callback of the last of them (in order, so all are done), so the tracker
// retires them exactly when the device is done with them. An item that depends on
// work of another queue waits for that work's cl_event on the device; a wait for a
// host-signalled event is a marker behind an OpenCL user event that the event completes.
// Programs are built once per device, source and options, and shared.
#include "opencl.h"
#include "../../exec/queue.h"

#include <string.h>

// A user event that one devbuf event value, or cancel, completes (whichever comes first).
typedef struct gate {
  const devbuf__opencl_api *cl;
  cl_event user;
  atomic_bool settled;
  devbuf__refcount refs; // the event's watch and the waiting worker
} gate;

typedef struct opencl_queue {
  cl_command_queue queue;
  pthread_mutex_t lock; // `waiting`
  gate *waiting;        // the gate the worker waits behind, for cancel
} opencl_queue;

static void gate_open(gate *g) {
  // Always CL_COMPLETE: whether the wait succeeded is decided on the host, and a failed user
  // event would fail the commands behind it in the in-order queue.
  if (!atomic_exchange(&g->settled, true)) g->cl->clSetUserEventStatus(g->user, CL_COMPLETE);
}

static void gate_unref(gate *g) {
  if (!devbuf__ref_drop(&g->refs)) return;
  g->cl->clReleaseEvent(g->user);
  devbuf__free(g);
}

static void gate_reached(void *context, devbuf_status status) {
  (void)status;
  gate_open(context);
  gate_unref(context);
}

devbuf_status devbuf__opencl_queue_create(devbuf_device_t *device, void **out_queue) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  opencl_queue *q = devbuf__calloc(1, sizeof *q);
  if (!q) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a queue");
  cl_int code = CL_SUCCESS;
  q->queue = state->cl->clCreateCommandQueue(state->context, state->id, 0, &code);
  if (!q->queue) {
    devbuf__free(q);
    return devbuf__opencl_error(code, "%s: clCreateCommandQueue", device->spec);
  }
  pthread_mutex_init(&q->lock, NULL);
  *out_queue = q;
  return DEVBUF_OK;
}

void devbuf__opencl_queue_destroy(devbuf_device_t *device, void *queue) {
  const devbuf__opencl_api *cl = devbuf__opencl_of(device)->cl;
  opencl_queue *q = queue;
  cl->clFinish(q->queue);
  cl->clReleaseCommandQueue(q->queue);
  pthread_mutex_destroy(&q->lock);
  devbuf__free(q);
}

void devbuf__opencl_cancel_wait(devbuf_device_t *device, void *queue) {
  (void)device;
  opencl_queue *q = queue;
  pthread_mutex_lock(&q->lock);
  if (q->waiting) gate_open(q->waiting);
  pthread_mutex_unlock(&q->lock);
}

void devbuf__opencl_event_release(devbuf_device_t *device, void *event) {
  devbuf__opencl_of(device)->cl->clReleaseEvent(event);
}

// ---- programs ------------------------------------------------------------------------------

#define KNOWN_KERNELS 16

struct devbuf__opencl_program {
  devbuf__opencl_program *next;     // the device's cache
  char *source, *options;
  cl_program program;
  pthread_mutex_t lock;             // the names below
  char *kernels[KNOWN_KERNELS];     // names checked to exist
};

static char *copy_text(const char *text) {
  size_t size = strlen(text) + 1;
  char *copy = devbuf__malloc(size);
  if (copy) memcpy(copy, text, size);
  return copy;
}

static void program_free(const devbuf__opencl_api *cl, devbuf__opencl_program *program) {
  if (program->program) cl->clReleaseProgram(program->program);
  for (int i = 0; i < KNOWN_KERNELS; i++) devbuf__free(program->kernels[i]);
  pthread_mutex_destroy(&program->lock);
  devbuf__free(program->source);
  devbuf__free(program->options);
  devbuf__free(program);
}

void devbuf__opencl_release_programs(devbuf_device_t *device) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  while (state->programs) {
    devbuf__opencl_program *next = state->programs->next;
    program_free(state->cl, state->programs);
    state->programs = next;
  }
}

// A failed build: the status carries as much of the compiler's log as the message holds.
static devbuf_status build_failure(devbuf_device_t *device, cl_program program, cl_int code) {
  const devbuf__opencl_api *cl = devbuf__opencl_of(device)->cl;
  size_t size = 0;
  char *log = NULL;
  if (cl->clGetProgramBuildInfo(program, devbuf__opencl_of(device)->id, CL_PROGRAM_BUILD_LOG, 0, NULL, &size) ==
          CL_SUCCESS &&
      size && (log = devbuf__malloc(size + 1))) {
    if (cl->clGetProgramBuildInfo(program, devbuf__opencl_of(device)->id, CL_PROGRAM_BUILD_LOG, size, log, NULL) !=
        CL_SUCCESS)
      size = 0;
    log[size] = '\0';
  }
  devbuf_status status = devbuf__error(DEVBUF_DEVICE_FAILURE, "%s: the program does not build (%d); build log:\n%s",
                                       device->spec, (int)code, log && log[0] ? log : "(empty)");
  devbuf__free(log);
  return status;
}

devbuf_status devbuf__opencl_program_build(devbuf_device_t *device, const char *source, const char *options,
                                           void **out_program) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  const devbuf__opencl_api *cl = state->cl;
  if (!options) options = "";
  // One lock over lookup and build: two threads building the same source build it once.
  pthread_mutex_lock(&state->programs_lock);
  for (devbuf__opencl_program *p = state->programs; p; p = p->next) {
    if (strcmp(p->source, source) == 0 && strcmp(p->options, options) == 0) {
      pthread_mutex_unlock(&state->programs_lock);
      *out_program = p;
      return DEVBUF_OK;
    }
  }
  devbuf__opencl_program *p = devbuf__calloc(1, sizeof *p);
  devbuf_status status = DEVBUF_OK;
  if (!p || !(p->source = copy_text(source)) || !(p->options = copy_text(options)))
    status = devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a program");
  if (p) pthread_mutex_init(&p->lock, NULL);
  cl_int code = CL_SUCCESS;
  if (status == DEVBUF_OK) {
    p->program = cl->clCreateProgramWithSource(state->context, 1, &source, NULL, &code);
    if (!p->program) status = devbuf__opencl_error(code, "%s: clCreateProgramWithSource", device->spec);
  }
  if (status == DEVBUF_OK) {
    code = cl->clBuildProgram(p->program, 1, &state->id, options, NULL, NULL);
    if (code != CL_SUCCESS) status = build_failure(device, p->program, code);
  }
  if (status != DEVBUF_OK) {
    pthread_mutex_unlock(&state->programs_lock);
    if (p) program_free(cl, p);
    return status;
  }
  p->next = state->programs;
  state->programs = p;
  pthread_mutex_unlock(&state->programs_lock);
  *out_program = p;
  return DEVBUF_OK;
}

// Builds stay in the device's cache until the device goes: releasing a program is free.
void devbuf__opencl_program_release(devbuf_device_t *device, void *program) {
  (void)device;
  (void)program;
}

devbuf_status devbuf__opencl_program_has_kernel(devbuf_device_t *device, void *backend_program, const char *name) {
  devbuf__opencl_program *p = backend_program;
  const devbuf__opencl_api *cl = devbuf__opencl_of(device)->cl;
  pthread_mutex_lock(&p->lock);
  for (int i = 0; i < KNOWN_KERNELS && p->kernels[i]; i++) {
    if (strcmp(p->kernels[i], name) == 0) {
      pthread_mutex_unlock(&p->lock);
      return DEVBUF_OK;
    }
  }
  cl_int code = CL_SUCCESS;
  cl_kernel kernel = cl->clCreateKernel(p->program, name, &code);
  devbuf_status status = DEVBUF_OK;
  if (!kernel) {
    status = devbuf__error(DEVBUF_NOT_FOUND, "%s: the program has no kernel '%.100s' (%d)", device->spec, name, (int)code);
  } else {
    cl->clReleaseKernel(kernel);
    for (int i = 0; i < KNOWN_KERNELS; i++) {
      if (!p->kernels[i]) {
        p->kernels[i] = copy_text(name);
        break;
      }
    }
  }
  pthread_mutex_unlock(&p->lock);
  return status;
}

// ---- running work items --------------------------------------------------------------------

// A kernel: the uses as buffers of their own bytes (sub-buffers for views that do not start
// at the storage's start), then the scalars. Enqueued after `waits`.
static devbuf_status enqueue_launch(devbuf_device_t *device, cl_command_queue queue, devbuf__work *work,
                                    cl_uint wait_count, const cl_event *waits, cl_event *out_event) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  const devbuf__opencl_api *cl = state->cl;
  devbuf__opencl_program *p = work->program->backend_program;
  cl_int code = CL_SUCCESS;
  cl_kernel kernel = cl->clCreateKernel(p->program, work->kernel_name, &code); // one per launch: no shared args
  if (!kernel) return devbuf__opencl_error(code, "%s: kernel '%.100s'", device->spec, work->kernel_name);
  cl_mem stack_views[16], *views = stack_views;
  if (work->use_count > 16 && !(views = devbuf__malloc(work->use_count * sizeof *views))) {
    cl->clReleaseKernel(kernel);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu kernel arguments", work->use_count);
  }
  size_t view_count = 0;
  devbuf_status status = DEVBUF_OK;
  cl_uint index = 0;
  for (size_t u = 0; u < work->use_count && status == DEVBUF_OK; u++, index++) {
    devbuf__work_use *use = &work->uses[u];
    // A zero-length use is tracked by nothing, so its memory may be gone: the kernel gets NULL.
    cl_mem mem = use->size ? devbuf__cl_mem(&use->memory) : NULL;
    size_t origin = use->memory.offset + use->offset; // within the segment's cl_mem
    if (use->size && (origin || use->size != use->memory.size)) {
      cl_buffer_region region = {origin, use->size};
      mem = cl->clCreateSubBuffer(mem, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &code); // flags: the parent's
      if (!mem) {
        status = devbuf__opencl_error(code, "%s: a view of %zu bytes at %zu for argument %u", device->spec, use->size,
                                      origin, index);
        break;
      }
      views[view_count++] = mem;
    }
    code = cl->clSetKernelArg(kernel, index, sizeof mem, &mem);
    if (code != CL_SUCCESS) status = devbuf__opencl_error(code, "%s: kernel '%.100s' argument %u (use %zu)", device->spec,
                                                          work->kernel_name, index, u);
  }
  const size_t *sizes = work->scalars;
  const char *bytes = (const char *)(sizes + work->arg_count);
  for (size_t a = 0; a < work->arg_count && status == DEVBUF_OK; a++, index++) {
    code = cl->clSetKernelArg(kernel, index, sizes[a], bytes);
    if (code != CL_SUCCESS) status = devbuf__opencl_error(code, "%s: kernel '%.100s' argument %u (scalar %zu, %zu bytes)",
                                                          device->spec, work->kernel_name, index, a, sizes[a]);
    bytes += sizes[a];
  }
  if (status == DEVBUF_OK) {
    const devbuf_launch_t *launch = &work->launch;
    code = cl->clEnqueueNDRangeKernel(queue, kernel, launch->dims, NULL, launch->global,
                                      launch->local[0] ? launch->local : NULL, wait_count, wait_count ? waits : NULL,
                                      out_event);
    if (code != CL_SUCCESS)
      status = devbuf__opencl_error(code, "%s: launching kernel '%.100s'", device->spec, work->kernel_name);
  }
  // Kernel and views may go now: the driver keeps what an enqueued command uses.
  for (size_t v = 0; v < view_count; v++) cl->clReleaseMemObject(views[v]);
  if (views != stack_views) devbuf__free(views);
  cl->clReleaseKernel(kernel);
  return status;
}

// Data dependencies already enqueued on this device join the command's wait list (retained,
// ours from here); the rest are waited for on the host. A command whose wait list holds an
// event that failed fails too, so a dependency that only orders reused memory after its
// previous owner's work waits on the host: that work's failure is not this command's.
typedef struct wait_list {
  devbuf_device_t *device;
  cl_event *events;
  cl_uint count;
} wait_list;

static bool join_wait_list(void *context, const devbuf__dep *dep, void *event) {
  wait_list *list = context;
  if (dep->order_only || devbuf__work_of(dep->work)->event_device != list->device) return false;
  devbuf__opencl_of(list->device)->cl->clRetainEvent(event); // alive while we hold `dep`
  list->events[list->count++] = event;
  return true;
}

// A wait for a host-signalled event value: a marker behind a user event that the value
// (or cancel) completes.
static devbuf_status enqueue_wait(devbuf_device_t *device, opencl_queue *q, devbuf__work *work, cl_event *out_event) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  gate *g = devbuf__malloc(sizeof *g);
  if (!g) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an event wait");
  cl_int code = CL_SUCCESS;
  g->cl = state->cl;
  g->user = state->cl->clCreateUserEvent(state->context, &code);
  if (!g->user) {
    devbuf__free(g);
    return devbuf__opencl_error(code, "%s: clCreateUserEvent", device->spec);
  }
  atomic_init(&g->settled, false);
  devbuf__ref_init(&g->refs, 2);
  pthread_mutex_lock(&q->lock);
  q->waiting = g;
  pthread_mutex_unlock(&q->lock);
  if (devbuf__event_watch_value(work->event, work->value, gate_reached, g) != DEVBUF_OK) {
    gate_open(g); // no watch: the host decides below
    gate_unref(g);
  }
  if (atomic_load(&work->cancel)) gate_open(g); // cancelled before the gate was there
  code = state->cl->clEnqueueMarkerWithWaitList(q->queue, 1, &g->user, out_event);
  devbuf_status status = DEVBUF_OK;
  if (code != CL_SUCCESS) {
    gate_open(g);
    status = devbuf__opencl_error(code, "%s: a marker for an event wait", device->spec);
  }
  return status;
}

// After the marker of a wait: forget the gate, and say how the wait ended.
static devbuf_status finish_wait(opencl_queue *q, devbuf__work *work, devbuf_status status) {
  pthread_mutex_lock(&q->lock);
  gate *g = q->waiting;
  q->waiting = NULL;
  pthread_mutex_unlock(&q->lock);
  if (g) gate_unref(g);
  return status != DEVBUF_OK ? status : devbuf__wait_outcome(work);
}

devbuf_status devbuf__opencl_run(devbuf_device_t *device, void *queue, devbuf__work *work) {
  const devbuf__opencl_api *cl = devbuf__opencl_of(device)->cl;
  opencl_queue *q = queue;
  cl_event stack_waits[16], *waits = stack_waits;
  if (work->dep_count > 16 && !(waits = devbuf__malloc(work->dep_count * sizeof *waits)))
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu dependencies", work->dep_count);
  wait_list list = {device, waits, 0};
  devbuf_status status = devbuf__work_wait_deps(work, join_wait_list, &list);
  cl_uint wait_count = list.count;
  cl_event done = NULL;
  if (status == DEVBUF_OK) {
    switch (work->kind) {
    case DEVBUF__WORK_FILL:
      status = devbuf__opencl_enqueue_fill(device, q->queue, &work->uses[0].memory, work->uses[0].offset,
                                           work->uses[0].size, work->scalars, work->scalars_size, wait_count, waits,
                                           &done);
      break;
    case DEVBUF__WORK_COPY:
      status = devbuf__opencl_enqueue_copy(device, q->queue, &work->uses[0].memory, work->uses[0].offset,
                                           &work->uses[1].memory, work->uses[1].offset, work->uses[0].size, wait_count,
                                           waits, &done);
      break;
    case DEVBUF__WORK_LAUNCH:
      status = enqueue_launch(device, q->queue, work, wait_count, waits, &done);
      break;
    case DEVBUF__WORK_WAIT:
      status = enqueue_wait(device, q, work, &done);
      break;
    default:
      status = devbuf__error(DEVBUF_UNSUPPORTED, "%s cannot run this work item", device->spec);
    }
  }
  for (cl_uint i = 0; i < wait_count; i++) cl->clReleaseEvent(waits[i]); // the driver keeps what it needs
  if (waits != stack_waits) devbuf__free(waits);
  if (done) { // dependents on other queues may wait for it on the device from now on
    cl->clFlush(q->queue); // submitted: only then is completion (and the callback) promised
    work->event_device = devbuf__device_keep(device);
    atomic_store_explicit(&work->device_event, done, memory_order_release);
  }
  // A wait ends here, so that what follows it is enqueued only once it is over (cancel then
  // drops it unstarted). Everything else completes in devbuf__opencl_complete.
  if (work->kind == DEVBUF__WORK_WAIT) {
    if (done) {
      cl->clRetainEvent(done);
      status = devbuf__opencl_wait(cl, done, "an event wait");
    }
    status = finish_wait(q, work, status);
  }
  return status;
}

devbuf_status devbuf__opencl_complete(devbuf_device_t *device, void *queue, devbuf__work **items, size_t count) {
  (void)queue;
  const devbuf__opencl_api *cl = devbuf__opencl_of(device)->cl;
  cl_event last = NULL; // in-order: once the last command is done, all before it are
  for (size_t i = count; i-- > 0 && !last;) last = atomic_load_explicit(&items[i]->device_event, memory_order_acquire);
  if (!last) return DEVBUF_OK;
  cl->clRetainEvent(last);
  devbuf__opencl_wait(cl, last, "queued work"); // statuses are read below, item by item
  // Backwards, so that the message left behind is the first failure's.
  devbuf_status first = DEVBUF_OK;
  for (size_t i = count; i-- > 0;) {
    devbuf__work *work = items[i];
    cl_event event = atomic_load_explicit(&work->device_event, memory_order_acquire);
    cl_int state = CL_COMPLETE;
    if (!event || work->status != DEVBUF_OK ||
        cl->clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL) != CL_SUCCESS ||
        state >= 0)
      continue;
    first = work->status = devbuf__opencl_error(state, "%s: %s failed on the device", device->spec,
                                                work->kind == DEVBUF__WORK_LAUNCH ? work->kernel_name : "a command");
  }
  return first;
}
