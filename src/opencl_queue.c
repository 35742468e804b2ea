// OpenCL queues and programs. Each devbuf queue owns an in-order cl_command_queue; its
// worker enqueues an item (fill, copy, kernel) there and returns when the item's completion
// callback fires, so the tracker retires it exactly when the device is done with it.
// Programs are built once per device, source and options, and shared.
#include "opencl.h"
#include "queue.h"

#include <string.h>

devbuf_status devbuf__opencl_queue_create(devbuf_device_t *device, void **out_queue) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  cl_int code = CL_SUCCESS;
  cl_command_queue queue = state->cl->clCreateCommandQueue(state->context, state->id, 0, &code);
  if (!queue) return devbuf__opencl_error(code, "%s: clCreateCommandQueue", device->spec);
  *out_queue = queue;
  return DEVBUF_OK;
}

void devbuf__opencl_queue_destroy(devbuf_device_t *device, void *queue) {
  const devbuf__opencl_api *cl = devbuf__opencl_of(device)->cl;
  cl->clFinish(queue);
  cl->clReleaseCommandQueue(queue);
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
// at the storage's start), then the scalars.
static devbuf_status run_launch(devbuf_device_t *device, cl_command_queue queue, devbuf__work *work) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  const devbuf__opencl_api *cl = state->cl;
  devbuf__opencl_program *p = work->program->backend_program;
  cl_int code = CL_SUCCESS;
  cl_kernel kernel = cl->clCreateKernel(p->program, work->kernel_name, &code); // one per launch: no shared args
  if (!kernel) return devbuf__opencl_error(code, "%s: kernel '%.100s'", device->spec, work->kernel_name);
  cl_mem views[64];
  size_t view_count = 0;
  devbuf_status status = DEVBUF_OK;
  cl_uint index = 0;
  for (size_t u = 0; u < work->use_count && status == DEVBUF_OK; u++, index++) {
    devbuf__work_use *use = &work->uses[u];
    cl_mem mem = devbuf__cl_mem(&use->memory);
    if (use->offset || use->size != use->memory.size) {
      cl_buffer_region region = {use->offset, use->size ? use->size : 1};
      mem = view_count < 64 ? cl->clCreateSubBuffer(mem, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &code)
                            : NULL;
      if (!mem) {
        status = devbuf__opencl_error(code, "%s: a view of %zu bytes at %zu for argument %u", device->spec, use->size,
                                      use->offset, index);
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
    cl_event done = NULL;
    const devbuf_launch_t *launch = &work->launch;
    code = cl->clEnqueueNDRangeKernel(queue, kernel, launch->dims, NULL, launch->global,
                                      launch->local[0] ? launch->local : NULL, 0, NULL, &done);
    if (code != CL_SUCCESS)
      status = devbuf__opencl_error(code, "%s: launching kernel '%.100s'", device->spec, work->kernel_name);
    else
      status = devbuf__opencl_wait(cl, done, "a kernel");
  }
  for (size_t v = 0; v < view_count; v++) cl->clReleaseMemObject(views[v]);
  cl->clReleaseKernel(kernel);
  return status;
}

devbuf_status devbuf__opencl_run(devbuf_device_t *device, void *queue, devbuf__work *work) {
  switch (work->kind) {
  case DEVBUF__WORK_FILL:
    return devbuf__opencl_fill(device, queue, &work->uses[0].memory, work->uses[0].offset, work->uses[0].size,
                               work->scalars, work->scalars_size);
  case DEVBUF__WORK_COPY:
    return devbuf__opencl_copy(device, queue, &work->uses[0].memory, work->uses[0].offset, &work->uses[1].memory,
                               work->uses[1].offset, work->uses[0].size);
  case DEVBUF__WORK_LAUNCH:
    return run_launch(device, queue, work);
  default:
    return devbuf__error(DEVBUF_UNSUPPORTED, "%s cannot run this work item", device->spec);
  }
}
