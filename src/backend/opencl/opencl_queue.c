// OpenCL queues, operations and programs. A device queue is an in-order cl_command_queue:
// operations are enqueued there behind the cl_events they wait for, and `complete` waits for
// the completion callback of the last of a group (in order, so all are done) before
// reading each one's status. A gate for a host-signalled wait is a marker behind a user
// event. Programs are built once per device, source and options, and shared.
#include "opencl.h"

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

void devbuf__opencl_event_release(devbuf_device_t *device, void *event) {
  devbuf__opencl_of(device)->cl->clReleaseEvent(event);
}

// ---- programs ------------------------------------------------------------------------------

#define KNOWN_KERNELS 16

// A kernel object no launch holds. Arguments are set on a kernel object, so two launches
// never share one at a time; each takes one from its program, sets its arguments, enqueues
// it (OpenCL keeps the argument values of an enqueued command) and gives it back. Making a
// kernel object per launch cost PoCL some microseconds of a few-microsecond launch.
// Arguments a launch leaves unset would keep an earlier launch's values (buffers that may be
// gone): a launch must give exactly as many as the kernel takes.
typedef struct idle_kernel {
  struct idle_kernel *next;
  cl_kernel kernel;
  cl_uint arg_count;
  char name[];
} idle_kernel;

// What a launch passes each argument as, and what the kernel declares it: a launch's buffers
// go to __global or __constant pointers, its scalars to private values. A scalar's bytes set
// as a buffer crash some drivers (PoCL takes them for a cl_mem); a buffer set as a number
// runs with its handle for a value.
typedef enum { ARG_BUFFER = 1, ARG_SCALAR, ARG_LOCAL, ARG_OTHER } arg_kind;

typedef struct known_kernel {
  char *name;
  cl_uint arg_count;
  uint8_t *kinds;        // arg_kind of each argument; NULL where the driver tells none
  size_t group_limit;    // the most work items in one of its groups; 0 where the driver tells none
  size_t item_limits[3]; // the device's most work items of a group in each dimension (0: none)
} known_kernel;

struct devbuf__opencl_program {
  devbuf__opencl_program *next; // the device's cache
  char *source, *options;
  cl_program program;
  pthread_mutex_t lock;                // the kernels and idle kernels below
  known_kernel kernels[KNOWN_KERNELS]; // described once (the first launches of each name)
  idle_kernel *idle;                   // at most one per name per launching thread
};

static char *copy_text(const char *text) {
  size_t size = strlen(text) + 1;
  char *copy = devbuf__malloc(size);
  if (copy) memcpy(copy, text, size);
  return copy;
}

static void program_free(const devbuf__opencl_api *cl, devbuf__opencl_program *program) {
  while (program->idle) {
    idle_kernel *next = program->idle->next;
    cl->clReleaseKernel(program->idle->kernel);
    devbuf__free(program->idle);
    program->idle = next;
  }
  if (program->program) cl->clReleaseProgram(program->program);
  for (int i = 0; i < KNOWN_KERNELS; i++) {
    devbuf__free(program->kernels[i].name);
    devbuf__free(program->kernels[i].kinds);
  }
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
  if (cl->clGetProgramBuildInfo(program, devbuf__opencl_of(device)->id, CL_PROGRAM_BUILD_LOG, 0,
                                NULL, &size) == CL_SUCCESS &&
      size && (log = devbuf__malloc(size + 1))) {
    if (cl->clGetProgramBuildInfo(program, devbuf__opencl_of(device)->id, CL_PROGRAM_BUILD_LOG,
                                  size, log, NULL) != CL_SUCCESS)
      size = 0;
    log[size] = '\0';
  }
  devbuf_status status =
      devbuf__error(DEVBUF_DEVICE_FAILURE, "%s: the program does not build (%d); build log:\n%s",
                    device->spec, (int)code, log && log[0] ? log : "(empty)");
  devbuf__free(log);
  return status;
}

devbuf_status devbuf__opencl_program_build(devbuf_device_t *device, const char *source,
                                           const char *options, void **out_program) {
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
    if (!p->program)
      status = devbuf__opencl_error(code, "%s: clCreateProgramWithSource", device->spec);
  }
  if (status == DEVBUF_OK) { // with the kernels' argument information, to check launches
    size_t length = strlen(options);
    char *with_info = devbuf__malloc(length + sizeof " -cl-kernel-arg-info");
    if (!with_info) {
      status = devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a program's options");
    } else {
      memcpy(with_info, options, length);
      memcpy(with_info + length, " -cl-kernel-arg-info", sizeof " -cl-kernel-arg-info");
      code = cl->clBuildProgram(p->program, 1, &state->id, with_info, NULL, NULL);
      devbuf__free(with_info);
      if (code != CL_SUCCESS) status = build_failure(device, p->program, code);
    }
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

// What an argument that is neither a pointer to __local memory nor to __global or
// __constant memory is: an image, sampler, pipe or device-side queue or event (which a
// launch cannot pass: taken for a buffer or a scalar, they crashed PoCL), or a value.
static arg_kind kind_of_value(const devbuf__opencl_api *cl, cl_kernel kernel, cl_uint i,
                              cl_uint where) {
  // Access qualifiers are for images and pipes alone, whatever their type is called.
  cl_uint access = CL_KERNEL_ARG_ACCESS_NONE;
  if (cl->clGetKernelArgInfo(kernel, i, CL_KERNEL_ARG_ACCESS_QUALIFIER, sizeof access, &access,
                             NULL) == CL_SUCCESS &&
      access != CL_KERNEL_ARG_ACCESS_NONE)
    return ARG_OTHER;
  cl_bitfield qualifiers = 0;
  if (cl->clGetKernelArgInfo(kernel, i, CL_KERNEL_ARG_TYPE_QUALIFIER, sizeof qualifiers,
                             &qualifiers, NULL) == CL_SUCCESS &&
      (qualifiers & CL_KERNEL_ARG_TYPE_PIPE))
    return ARG_OTHER;
  char type[32] = ""; // longer names are none of those below (a user's own type may begin
                      // like them: only the whole name counts)
  if (cl->clGetKernelArgInfo(kernel, i, CL_KERNEL_ARG_TYPE_NAME, sizeof type, type, NULL) !=
      CL_SUCCESS)
    type[0] = '\0';
  type[sizeof type - 1] = '\0';
  static const char *const opaque[] = {"sampler_t",
                                       "queue_t",
                                       "clk_event_t",
                                       "reserve_id_t",
                                       "image1d_t",
                                       "image1d_array_t",
                                       "image1d_buffer_t",
                                       "image2d_t",
                                       "image2d_array_t",
                                       "image3d_t",
                                       "image2d_depth_t",
                                       "image2d_array_depth_t",
                                       "image2d_msaa_t",
                                       "image2d_array_msaa_t",
                                       "image2d_msaa_depth_t",
                                       "image2d_array_msaa_depth_t"};
  for (size_t k = 0; k < sizeof opaque / sizeof opaque[0]; k++)
    if (strcmp(type, opaque[k]) == 0) return ARG_OTHER;
  return where == CL_KERNEL_ARG_ADDRESS_GLOBAL || where == CL_KERNEL_ARG_ADDRESS_CONSTANT
             ? ARG_BUFFER
             : ARG_SCALAR;
}

// Describes kernel `name` of the program: its argument count, what each argument is where
// the driver keeps the programs' argument information (it was asked to at the build), and
// the most work items its groups may have.
static devbuf_status describe_kernel(devbuf_device_t *device, devbuf__opencl_program *p,
                                     const char *name, known_kernel *out) {
  const devbuf__opencl_device *state = devbuf__opencl_of(device);
  const devbuf__opencl_api *cl = state->cl;
  cl_int code = CL_SUCCESS;
  cl_kernel kernel = cl->clCreateKernel(p->program, name, &code);
  if (!kernel)
    return devbuf__error(DEVBUF_NOT_FOUND, "%s: the program has no kernel '%.100s' (%d)",
                         device->spec, name, (int)code);
  cl_uint count = 0;
  code = cl->clGetKernelInfo(kernel, CL_KERNEL_NUM_ARGS, sizeof count, &count, NULL);
  uint8_t *kinds = code == CL_SUCCESS ? devbuf__malloc(count ? count : 1) : NULL;
  for (cl_uint i = 0; kinds && i < count; i++) {
    cl_uint where = 0;
    if (cl->clGetKernelArgInfo(kernel, i, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof where, &where,
                               NULL) != CL_SUCCESS) {
      devbuf__free(kinds); // no argument information: the count is all there is to check
      kinds = NULL;
      break;
    }
    kinds[i] =
        where == CL_KERNEL_ARG_ADDRESS_LOCAL ? ARG_LOCAL : kind_of_value(cl, kernel, i, where);
  }
  size_t group_limit = 0, item_limits[3] = {0, 0, 0};
  if (cl->clGetKernelWorkGroupInfo(kernel, state->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof group_limit,
                                   &group_limit, NULL) != CL_SUCCESS)
    group_limit = 0;
  if (cl->clGetDeviceInfo(state->id, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof item_limits, item_limits,
                          NULL) != CL_SUCCESS)
    item_limits[0] = item_limits[1] = item_limits[2] = 0;
  cl->clReleaseKernel(kernel);
  if (code != CL_SUCCESS)
    return devbuf__opencl_error(code, "%s: the arguments of kernel '%.100s'", device->spec, name);
  char *copied = copy_text(name);
  if (!copied) {
    devbuf__free(kinds);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to describe kernel '%.100s'", name);
  }
  *out = (known_kernel){.name = copied,
                        .arg_count = count,
                        .kinds = kinds,
                        .group_limit = group_limit,
                        .item_limits = {item_limits[0], item_limits[1], item_limits[2]}};
  return DEVBUF_OK;
}

static devbuf_status check_arguments(devbuf_device_t *device, const known_kernel *k,
                                     const char *name, size_t buffers, size_t scalars) {
  if (buffers + scalars != k->arg_count)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%s: kernel '%.100s' takes %u arguments; the launch gives %zu (%zu "
                         "buffers, %zu scalars)",
                         device->spec, name, (unsigned)k->arg_count, buffers + scalars, buffers,
                         scalars);
  static const char *const kind_names[] = {
      "?", "buffer (a __global or __constant pointer)", "scalar", "__local pointer",
      "driver object (an image, sampler, pipe, or device-side queue or event)"};
  for (size_t i = 0; k->kinds && i < k->arg_count; i++) {
    arg_kind given = i < buffers ? ARG_BUFFER : ARG_SCALAR;
    if (k->kinds[i] == given) continue;
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%s: argument %zu of kernel '%.100s' is a %s; the launch gives a %s "
                         "there (%s %zu)%s",
                         device->spec, i, name, kind_names[k->kinds[i]], kind_names[given],
                         given == ARG_BUFFER ? "use" : "scalar",
                         given == ARG_BUFFER ? i : i - buffers,
                         k->kinds[i] == ARG_LOCAL || k->kinds[i] == ARG_OTHER
                             ? ": launches pass buffers and scalars only"
                             : "");
  }
  return DEVBUF_OK;
}

// The largest divisor of `n` not above `most` (1 at least).
static size_t largest_divisor(size_t n, size_t most) {
  for (size_t q = most < n ? most : n; q > 1; q--)
    if (n % q == 0) return q;
  return 1;
}

// The grid of a launch, against what the device and the kernel run: local sizes within the
// device's per-dimension limits and, together, within the kernel's group limit (the driver
// refuses the launch otherwise: CL_INVALID_WORK_GROUP_SIZE, which would fail the queue), and
// at most 2^32 - 1 work-groups (PoCL counts them in 32 bits: more aborted the process, ran
// work items several times or skipped some). Where the driver chooses the local sizes, they
// must divide the global sizes: the fewest groups it can make are in the largest such sizes
// (a prime global size leaves it groups of one work item).
static devbuf_status check_grid(devbuf_device_t *device, const known_kernel *k, const char *name,
                                const devbuf_launch_t *launch) {
  uint64_t groups = 1; // the grid's work items fit a size_t (checked at submission)
  for (unsigned d = 0; d < launch->dims; d++) groups *= launch->global[d];
  if (!launch->local[0] && groups <= UINT32_MAX) return DEVBUF_OK; // even in groups of one
  size_t local[3] = {1, 1, 1}, group_size = 1;
  size_t group_limit = k->group_limit ? k->group_limit : 1;
  groups = 1;
  for (unsigned d = 0; d < launch->dims; d++) {
    if (launch->local[0]) {
      local[d] = launch->local[d];
      if (k->item_limits[d] && local[d] > k->item_limits[d])
        return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                             "%s: kernel '%.100s': local size %zu in dimension %u is more than "
                             "the device runs there (%zu)",
                             device->spec, name, local[d], d, k->item_limits[d]);
    } else {
      size_t most = k->item_limits[d] ? k->item_limits[d] : 1;
      size_t room = group_limit / group_size; // what the earlier dimensions left of a group
      local[d] = largest_divisor(launch->global[d], most < room ? most : room);
    }
    groups *= launch->global[d] / local[d];
    group_size *= local[d];
  }
  if (launch->local[0] && k->group_limit && group_size > k->group_limit)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%s: kernel '%.100s': groups of %zu x %zu x %zu = %zu work items, more "
                         "than the kernel runs in one group on this device (%zu)",
                         device->spec, name, local[0], local[1], local[2], group_size,
                         k->group_limit);
  if (groups <= UINT32_MAX) return DEVBUF_OK;
  return devbuf__error(
      DEVBUF_INVALID_ARGUMENT,
      "%s: kernel '%.100s': a grid of %zu x %zu x %zu work items makes %llu "
      "work-groups %s %zu x %zu x %zu, more than 2^32 - 1",
      device->spec, name, launch->global[0], launch->dims > 1 ? launch->global[1] : (size_t)1,
      launch->dims > 2 ? launch->global[2] : (size_t)1, (unsigned long long)groups,
      launch->local[0] ? "of" : "even in the largest groups the driver can choose,", local[0],
      local[1], local[2]);
}

devbuf_status devbuf__opencl_program_check_launch(devbuf_device_t *device, void *backend_program,
                                                  const char *name, const devbuf_launch_t *launch,
                                                  size_t buffers, size_t scalars) {
  devbuf_status status = DEVBUF_OK;
  devbuf__opencl_program *p = backend_program;
  pthread_mutex_lock(&p->lock);
  int at = 0;
  while (at < KNOWN_KERNELS && p->kernels[at].name && strcmp(p->kernels[at].name, name) != 0) at++;
  known_kernel described = {0}, *k = at < KNOWN_KERNELS ? &p->kernels[at] : &described;
  if (!k->name) status = describe_kernel(device, p, name, k); // kept where there is room
  if (status == DEVBUF_OK) status = check_arguments(device, k, name, buffers, scalars);
  if (status == DEVBUF_OK) status = check_grid(device, k, name, launch);
  pthread_mutex_unlock(&p->lock);
  devbuf__free(described.name);
  devbuf__free(described.kinds);
  return status;
}

// ---- operations ------------------------------------------------------------------------------

// A kernel object of `name` for one launch: an idle one, or a new one (NULL, `*out_code`,
// or a message on OUT_OF_MEMORY).
static idle_kernel *take_kernel(const devbuf__opencl_api *cl, devbuf__opencl_program *p,
                                const char *name, cl_int *out_code) {
  pthread_mutex_lock(&p->lock);
  for (idle_kernel **link = &p->idle; *link; link = &(*link)->next) {
    if (strcmp((*link)->name, name) == 0) {
      idle_kernel *found = *link;
      *link = found->next;
      pthread_mutex_unlock(&p->lock);
      return found;
    }
  }
  pthread_mutex_unlock(&p->lock);
  size_t length = strlen(name) + 1;
  idle_kernel *made = devbuf__malloc(sizeof *made + length);
  if (!made) {
    *out_code = CL_OUT_OF_HOST_MEMORY;
    return NULL;
  }
  memcpy(made->name, name, length);
  made->kernel = cl->clCreateKernel(p->program, name, out_code);
  if (made->kernel &&
      (*out_code = cl->clGetKernelInfo(made->kernel, CL_KERNEL_NUM_ARGS, sizeof made->arg_count,
                                       &made->arg_count, NULL)) != CL_SUCCESS) {
    cl->clReleaseKernel(made->kernel);
    made->kernel = NULL;
  }
  if (!made->kernel) {
    devbuf__free(made);
    return NULL;
  }
  return made;
}

static void give_back_kernel(devbuf__opencl_program *p, idle_kernel *kernel) {
  pthread_mutex_lock(&p->lock);
  kernel->next = p->idle;
  p->idle = kernel;
  pthread_mutex_unlock(&p->lock);
}

// A kernel: the operands as buffers of their own bytes (sub-buffers for views that do not
// start at the storage's start), then the scalars. Enqueued after `waits`.
static devbuf_status enqueue_launch(devbuf_device_t *device, cl_command_queue queue,
                                    const devbuf__op *op, cl_event *out_event) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  const devbuf__opencl_api *cl = state->cl;
  devbuf__opencl_program *p = op->program;
  cl_int code = CL_SUCCESS;
  idle_kernel *taken = take_kernel(cl, p, op->kernel_name, &code);
  if (!taken)
    return devbuf__opencl_error(code, "%s: kernel '%.100s'", device->spec, op->kernel_name);
  cl_kernel kernel = taken->kernel;
  if (op->operand_count + op->arg_count != taken->arg_count) {
    give_back_kernel(p, taken);
    return devbuf__opencl_error(CL_INVALID_KERNEL_ARGS,
                                "%s: kernel '%.100s' takes %u arguments; the launch gives %zu "
                                "(%zu buffers, %zu scalars)",
                                device->spec, op->kernel_name, (unsigned)taken->arg_count,
                                op->operand_count + op->arg_count, op->operand_count,
                                op->arg_count);
  }
  cl_mem stack_views[16], *views = stack_views;
  if (op->operand_count > 16 && !(views = devbuf__malloc(op->operand_count * sizeof *views))) {
    give_back_kernel(p, taken);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu kernel arguments",
                         op->operand_count);
  }
  size_t view_count = 0;
  devbuf_status status = DEVBUF_OK;
  cl_uint index = 0;
  for (size_t u = 0; u < op->operand_count && status == DEVBUF_OK; u++, index++) {
    const devbuf__operand *operand = &op->operands[u];
    cl_mem mem =
        operand->size ? devbuf__cl_mem(&operand->memory) : NULL; // a zero-length one may be gone
    size_t origin = operand->memory.offset + operand->offset;    // within the segment's cl_mem
    if (operand->size && (origin || operand->size != operand->memory.size)) {
      cl_buffer_region region = {origin, operand->size};
      mem = cl->clCreateSubBuffer(mem, 0, CL_BUFFER_CREATE_TYPE_REGION, &region,
                                  &code); // flags: the parent's
      if (!mem) {
        status = devbuf__opencl_error(code, "%s: a view of %zu bytes at %zu for argument %u",
                                      device->spec, operand->size, origin, index);
        break;
      }
      views[view_count++] = mem;
    }
    code = cl->clSetKernelArg(kernel, index, sizeof mem, &mem);
    if (code != CL_SUCCESS)
      status = devbuf__opencl_error(code, "%s: kernel '%.100s' argument %u (use %zu)", device->spec,
                                    op->kernel_name, index, u);
  }
  const char *bytes = op->arg_bytes;
  for (size_t a = 0; a < op->arg_count && status == DEVBUF_OK; a++, index++) {
    code = cl->clSetKernelArg(kernel, index, op->arg_sizes[a], bytes);
    if (code != CL_SUCCESS)
      status = devbuf__opencl_error(code, "%s: kernel '%.100s' argument %u (scalar %zu, %zu bytes)",
                                    device->spec, op->kernel_name, index, a, op->arg_sizes[a]);
    bytes += op->arg_sizes[a];
  }
  if (status == DEVBUF_OK) {
    const devbuf_launch_t *launch = op->launch;
    code = cl->clEnqueueNDRangeKernel(
        queue, kernel, launch->dims, NULL, launch->global, launch->local[0] ? launch->local : NULL,
        (cl_uint)op->wait_count, op->wait_count ? (const cl_event *)op->waits : NULL, out_event);
    if (code != CL_SUCCESS)
      status = devbuf__opencl_error(code, "%s: launching kernel '%.100s'", device->spec,
                                    op->kernel_name);
  }
  // The views may go and the kernel object serve another launch: the driver keeps what an
  // enqueued command uses, and the argument values it had.
  for (size_t v = 0; v < view_count; v++) cl->clReleaseMemObject(views[v]);
  if (views != stack_views) devbuf__free(views);
  give_back_kernel(p, taken);
  return status;
}

devbuf_status devbuf__opencl_enqueue(devbuf_device_t *device, void *queue, const devbuf__op *op,
                                     void **out_event) {
  const devbuf__opencl_api *cl = devbuf__opencl_of(device)->cl;
  const devbuf__operand *operands = op->operands;
  cl_uint wait_count = (cl_uint)op->wait_count;
  const cl_event *waits = (const cl_event *)op->waits;
  cl_event done = NULL;
  devbuf_status status;
  *out_event = NULL;
  switch (op->kind) {
  case DEVBUF__OP_FILL:
    status = devbuf__opencl_enqueue_fill(device, queue, &operands[0].memory, operands[0].offset,
                                         operands[0].size, op->pattern, op->pattern_size,
                                         wait_count, waits, &done);
    break;
  case DEVBUF__OP_COPY:
    status = devbuf__opencl_enqueue_copy(device, queue, &operands[0].memory, operands[0].offset,
                                         &operands[1].memory, operands[1].offset, operands[0].size,
                                         wait_count, waits, &done);
    break;
  case DEVBUF__OP_LAUNCH:
    status = enqueue_launch(device, queue, op, &done);
    break;
  default:
    status = devbuf__error(DEVBUF_UNSUPPORTED, "%s runs programs, not C kernels", device->spec);
  }
  if (done) {
    cl->clFlush(queue); // submitted: only then is completion (and the callback) promised
    *out_event = done;
  }
  return status;
}

devbuf_status devbuf__opencl_complete(devbuf_device_t *device, void *queue,
                                      devbuf__device_done *items, size_t count) {
  (void)queue;
  const devbuf__opencl_api *cl = devbuf__opencl_of(device)->cl;
  cl_event last = NULL; // in order: once the last command is done, all before it are
  for (size_t i = count; i-- > 0 && !last;) last = items[i].event;
  if (!last) return DEVBUF_OK;
  cl->clRetainEvent(last);
  devbuf__opencl_wait(cl, last, "queued work"); // statuses are read below, one by one
  // Backwards, so that the message left behind is the first failure's.
  devbuf_status first = DEVBUF_OK;
  for (size_t i = count; i-- > 0;) {
    cl_int state = CL_COMPLETE;
    if (!items[i].event || items[i].status != DEVBUF_OK ||
        cl->clGetEventInfo(items[i].event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state,
                           NULL) != CL_SUCCESS ||
        state >= 0)
      continue;
    first = items[i].status =
        devbuf__opencl_error(state, "%s: %s failed on the device", device->spec, items[i].what);
  }
  return first;
}

// ---- waits for host-signalled events -------------------------------------------------------

// A marker behind a user event: everything enqueued after it waits until the gate opens.
devbuf_status devbuf__opencl_gate_enqueue(devbuf_device_t *device, void *queue, void **out_gate,
                                          void **out_event) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  cl_int code = CL_SUCCESS;
  cl_event user = state->cl->clCreateUserEvent(state->context, &code);
  if (!user) return devbuf__opencl_error(code, "%s: clCreateUserEvent", device->spec);
  cl_event marker = NULL;
  code = state->cl->clEnqueueMarkerWithWaitList(queue, 1, &user, &marker);
  if (code != CL_SUCCESS) {
    state->cl->clSetUserEventStatus(user, CL_COMPLETE);
    state->cl->clReleaseEvent(user);
    return devbuf__opencl_error(code, "%s: a marker for an event wait", device->spec);
  }
  state->cl->clFlush(queue);
  *out_gate = user;
  *out_event = marker;
  return DEVBUF_OK;
}

// Always CL_COMPLETE: whether the wait succeeded is decided on the host, and a failed user
// event would fail the commands behind it in the in-order queue.
void devbuf__opencl_gate_open(devbuf_device_t *device, void *queue, void *gate) {
  (void)queue;
  devbuf__opencl_of(device)->cl->clSetUserEventStatus(gate, CL_COMPLETE);
}

void devbuf__opencl_gate_release(devbuf_device_t *device, void *queue, void *gate) {
  (void)queue;
  devbuf__opencl_of(device)->cl->clReleaseEvent(gate);
}
