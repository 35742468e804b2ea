// The OpenCL backend: every device of every platform the ICD loader knows, numbered in
// order as opencl:0, opencl:1, ...; memory is cl_mem (device memory, or host-visible memory
// mapped once for good); copies outside queues go through one in-order transfer queue.
#include "opencl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *code_name(cl_int code) {
  switch (code) {
  case CL_DEVICE_NOT_FOUND:
    return "CL_DEVICE_NOT_FOUND";
  case CL_MEM_OBJECT_ALLOCATION_FAILURE:
    return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
  case CL_OUT_OF_RESOURCES:
    return "CL_OUT_OF_RESOURCES";
  case CL_OUT_OF_HOST_MEMORY:
    return "CL_OUT_OF_HOST_MEMORY";
  case CL_BUILD_PROGRAM_FAILURE:
    return "CL_BUILD_PROGRAM_FAILURE";
  case CL_MISALIGNED_SUB_BUFFER_OFFSET:
    return "CL_MISALIGNED_SUB_BUFFER_OFFSET";
  case -30:
    return "CL_INVALID_VALUE";
  case -34:
    return "CL_INVALID_CONTEXT";
  case -36:
    return "CL_INVALID_COMMAND_QUEUE";
  case -38:
    return "CL_INVALID_MEM_OBJECT";
  case -46:
    return "CL_INVALID_KERNEL_NAME";
  case -48:
    return "CL_INVALID_KERNEL";
  case -49:
    return "CL_INVALID_ARG_INDEX";
  case -50:
    return "CL_INVALID_ARG_VALUE";
  case -51:
    return "CL_INVALID_ARG_SIZE";
  case -43:
    return "CL_INVALID_BUILD_OPTIONS";
  case -52:
    return "CL_INVALID_KERNEL_ARGS";
  case -53:
    return "CL_INVALID_WORK_DIMENSION";
  case -54:
    return "CL_INVALID_WORK_GROUP_SIZE";
  case -55:
    return "CL_INVALID_WORK_ITEM_SIZE";
  case -61:
    return "CL_INVALID_BUFFER_SIZE";
  case -59:
    return "CL_INVALID_OPERATION";
  case -63:
    return "CL_INVALID_GLOBAL_WORK_SIZE";
  case CL_PLATFORM_NOT_FOUND_KHR:
    return "CL_PLATFORM_NOT_FOUND_KHR";
  default:
    return "an OpenCL error";
  }
}

devbuf_status devbuf__opencl_error(cl_int code, const char *format, ...) {
  char what[300];
  va_list args;
  va_start(args, format);
  vsnprintf(what, sizeof what, format, args);
  va_end(args);
  bool memory = code == CL_MEM_OBJECT_ALLOCATION_FAILURE || code == CL_OUT_OF_RESOURCES ||
                code == CL_OUT_OF_HOST_MEMORY || code == CL_INVALID_BUFFER_SIZE;
  return devbuf__error(memory ? DEVBUF_OUT_OF_MEMORY : DEVBUF_DEVICE_FAILURE, "%s: %s (%d)", what,
                       code_name(code), (int)code);
}

// ---- completion through event callbacks ---------------------------------------------------

typedef struct completion {
  pthread_mutex_t lock;
  pthread_cond_t done_signal;
  bool done;
  cl_int status;
} completion;

static void on_complete(cl_event event, cl_int status, void *context) {
  (void)event;
  completion *c = context;
  pthread_mutex_lock(&c->lock);
  c->status = status;
  c->done = true;
  pthread_cond_signal(&c->done_signal);
  pthread_mutex_unlock(&c->lock);
}

devbuf_status devbuf__opencl_wait(const devbuf__opencl_api *cl, cl_event event, const char *what) {
  completion c = {.done = false, .status = CL_SUCCESS};
  pthread_mutex_init(&c.lock, NULL);
  pthread_cond_init(&c.done_signal, NULL);
  cl_int code = cl->clSetEventCallback(event, CL_COMPLETE, on_complete, &c);
  if (code == CL_SUCCESS) {
    pthread_mutex_lock(&c.lock);
    while (!c.done) pthread_cond_wait(&c.done_signal, &c.lock);
    pthread_mutex_unlock(&c.lock);
    code = c.status;
  } else {
    code = cl->clWaitForEvents(1, &event); // the callback could not be set: wait directly
  }
  pthread_cond_destroy(&c.done_signal);
  pthread_mutex_destroy(&c.lock);
  cl->clReleaseEvent(event);
  if (code != CL_SUCCESS) return devbuf__opencl_error(code, "%s ended with an error", what);
  return DEVBUF_OK;
}

// ---- devices -------------------------------------------------------------------------------

static void info_string(const devbuf__opencl_api *cl, cl_device_id id, cl_device_info what,
                        char *out, size_t size) {
  out[0] = '\0';
  if (cl->clGetDeviceInfo(id, what, size - 1, out, NULL) != CL_SUCCESS) out[0] = '\0';
  out[size - 1] = '\0';
}

static uint64_t info_u64(const devbuf__opencl_api *cl, cl_device_id id, cl_device_info what,
                         size_t bytes) {
  uint64_t value = 0; // little-endian: narrower answers fill the low bytes
  if (cl->clGetDeviceInfo(id, what, bytes, &value, NULL) != CL_SUCCESS) value = 0;
  return value;
}

// Finds device `index` counting over every platform's devices.
static devbuf_status find_device(const devbuf__opencl_api *cl, int index,
                                 cl_platform_id *out_platform, cl_device_id *out_device) {
  cl_uint platforms = 0;
  cl_int code = cl->clGetPlatformIDs(0, NULL, &platforms);
  if (code == CL_PLATFORM_NOT_FOUND_KHR || (code == CL_SUCCESS && platforms == 0))
    return devbuf__error(DEVBUF_UNAVAILABLE,
                         "opencl:%d: the OpenCL ICD loader found no platform (no vendor "
                         "driver registered in /etc/OpenCL/vendors or OCL_ICD_VENDORS)",
                         index);
  if (code != CL_SUCCESS) return devbuf__opencl_error(code, "opencl:%d: clGetPlatformIDs", index);
  cl_platform_id ids[64];
  if (platforms > 64) platforms = 64;
  cl->clGetPlatformIDs(platforms, ids, NULL);
  int seen = 0;
  for (cl_uint p = 0; p < platforms; p++) {
    cl_uint count = 0;
    if (cl->clGetDeviceIDs(ids[p], CL_DEVICE_TYPE_ALL, 0, NULL, &count) != CL_SUCCESS) continue;
    if (index < seen + (int)count) {
      cl_device_id devices[256];
      if (index - seen >= 256) break; // more devices on one platform than devbuf numbers
      if (count > 256) count = 256;
      cl->clGetDeviceIDs(ids[p], CL_DEVICE_TYPE_ALL, count, devices, NULL);
      *out_platform = ids[p];
      *out_device = devices[index - seen];
      return DEVBUF_OK;
    }
    seen += (int)count;
  }
  return devbuf__error(DEVBUF_UNAVAILABLE,
                       "opencl:%d does not exist: %d device(s) on %u platform(s)", index, seen,
                       (unsigned)platforms);
}

static void opencl_close(devbuf_device_t *device) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  if (!state) return;
  devbuf__opencl_release_programs(device);
  if (state->transfers) state->cl->clReleaseCommandQueue(state->transfers);
  if (state->context) state->cl->clReleaseContext(state->context);
  pthread_mutex_destroy(&state->programs_lock);
  devbuf__free(state);
  device->backend_state = NULL;
}

static devbuf_status opencl_open(devbuf_device_t *device, int index) {
  const char *reason = NULL;
  const devbuf__opencl_api *cl = devbuf__opencl_load(&reason);
  if (!cl) return devbuf__error(DEVBUF_UNAVAILABLE, "opencl:%d: %s", index, reason);
  devbuf__opencl_device *state = devbuf__calloc(1, sizeof *state);
  if (!state) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an OpenCL device");
  state->cl = cl;
  pthread_mutex_init(&state->programs_lock, NULL);
  device->backend_state = state;
  devbuf_status status = find_device(cl, index, &state->platform, &state->id);
  cl_int code = CL_SUCCESS;
  if (status == DEVBUF_OK) {
    cl_context_properties properties[] = {CL_CONTEXT_PLATFORM,
                                          (cl_context_properties)state->platform, 0};
    state->context = cl->clCreateContext(properties, 1, &state->id, NULL, NULL, &code);
    if (!state->context) status = devbuf__opencl_error(code, "opencl:%d: clCreateContext", index);
  }
  if (status == DEVBUF_OK) {
    state->transfers = cl->clCreateCommandQueue(state->context, state->id, 0, &code);
    if (!state->transfers)
      status = devbuf__opencl_error(code, "opencl:%d: clCreateCommandQueue", index);
  }
  if (status != DEVBUF_OK) {
    opencl_close(device);
    return status;
  }
  char name[96], platform[64];
  info_string(cl, state->id, CL_DEVICE_NAME, name, sizeof name);
  platform[0] = '\0';
  if (cl->clGetPlatformInfo(state->platform, CL_PLATFORM_NAME, sizeof platform - 1, platform,
                            NULL) != CL_SUCCESS)
    platform[0] = '\0';
  platform[sizeof platform - 1] = '\0';
  snprintf(device->name, sizeof device->name, "%.80s (%.40s)", name, platform);
  info_string(cl, state->id, CL_DEVICE_VERSION, device->version, sizeof device->version);
  device->global_memory = info_u64(cl, state->id, CL_DEVICE_GLOBAL_MEM_SIZE, 8);
  device->max_allocation = info_u64(cl, state->id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, 8);
  device->alignment = (size_t)info_u64(cl, state->id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, 4) / 8;
  if (device->alignment < 1) device->alignment = 1;
  device->unified_memory = info_u64(cl, state->id, CL_DEVICE_HOST_UNIFIED_MEMORY, 4) != 0;
  device->svm_capabilities = info_u64(cl, state->id, CL_DEVICE_SVM_CAPABILITIES, 8);
  uint64_t type = info_u64(cl, state->id, CL_DEVICE_TYPE, 8);
  device->processor = type & CL_DEVICE_TYPE_GPU   ? DEVBUF_PROCESSOR_GPU
                      : type & CL_DEVICE_TYPE_CPU ? DEVBUF_PROCESSOR_CPU
                                                  : DEVBUF_PROCESSOR_ACCELERATOR;
  device->page_size = 4096;
  device->memory_handles = true;   // a block is its segment's cl_mem and an offset
  device->host_accessible = false; // device memory; host-visible memory is its own kind
  return DEVBUF_OK;
}

// ---- memory --------------------------------------------------------------------------------

static devbuf_status opencl_raw_alloc(devbuf_device_t *device, devbuf_memory_kind kind, size_t size,
                                      devbuf_memory_t *out) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  const devbuf__opencl_api *cl = state->cl;
  if (size > device->max_allocation)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY,
                         "%s allocates at most %llu bytes at once (CL_DEVICE_MAX_MEM_ALLOC_SIZE); "
                         "%zu requested",
                         device->spec, (unsigned long long)device->max_allocation, size);
  bool host_visible = kind == DEVBUF_MEMORY_HOST_VISIBLE;
  // Host-visible memory stays mapped while the device uses it, which OpenCL only allows
  // where device and host share memory; elsewhere it would need a map around every access.
  if (host_visible && !device->unified_memory)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "%s: host-visible memory needs a device with host-unified memory "
                         "(CL_DEVICE_HOST_UNIFIED_MEMORY); use device memory and copies",
                         device->spec);
  cl_int code = CL_SUCCESS;
  cl_mem mem = cl->clCreateBuffer(state->context,
                                  CL_MEM_READ_WRITE | (host_visible ? CL_MEM_ALLOC_HOST_PTR : 0),
                                  size, NULL, &code);
  if (!mem)
    return devbuf__opencl_error(code, "%s: clCreateBuffer of %zu bytes", device->spec, size);
  void *host = NULL;
  if (host_visible) { // mapped once, for the life of the memory
    host = cl->clEnqueueMapBuffer(state->transfers, mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                  size, 0, NULL, NULL, &code);
    if (!host) {
      cl->clReleaseMemObject(mem);
      return devbuf__opencl_error(code, "%s: mapping %zu bytes of host-visible memory",
                                  device->spec, size);
    }
  }
  *out = (devbuf_memory_t){
      .host = host, .device = (uint64_t)(uintptr_t)mem, .size = size, .token = NULL, .offset = 0};
  return DEVBUF_OK;
}

static void opencl_raw_free(devbuf_device_t *device, const devbuf_memory_t *memory) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  if (memory->host)
    state->cl->clEnqueueUnmapMemObject(state->transfers, devbuf__cl_mem(memory), memory->host, 0,
                                       NULL, NULL);
  state->cl->clReleaseMemObject(devbuf__cl_mem(memory)); // freed once the unmap has run
}

static devbuf_status opencl_write(devbuf_device_t *device, const devbuf_memory_t *dst,
                                  size_t offset, const void *src, size_t size) {
  if (dst->host) {
    devbuf__copy_bytes((char *)dst->host + offset, src, size);
    return DEVBUF_OK;
  }
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  cl_int code = state->cl->clEnqueueWriteBuffer(state->transfers, devbuf__cl_mem(dst), CL_TRUE,
                                                dst->offset + offset, size, src, 0, NULL, NULL);
  if (code != CL_SUCCESS)
    return devbuf__opencl_error(code, "%s: writing %zu bytes at offset %zu", device->spec, size,
                                offset);
  return DEVBUF_OK;
}

static devbuf_status opencl_read(devbuf_device_t *device, const devbuf_memory_t *src, size_t offset,
                                 void *dst, size_t size) {
  if (src->host) {
    devbuf__copy_bytes(dst, (const char *)src->host + offset, size);
    return DEVBUF_OK;
  }
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  cl_int code = state->cl->clEnqueueReadBuffer(state->transfers, devbuf__cl_mem(src), CL_TRUE,
                                               src->offset + offset, size, dst, 0, NULL, NULL);
  if (code != CL_SUCCESS)
    return devbuf__opencl_error(code, "%s: reading %zu bytes at offset %zu", device->spec, size,
                                offset);
  return DEVBUF_OK;
}

// Before a staged operation runs on the host: the commands already on `queue`, and `waits`,
// must have completed (the host cannot be handed a wait list).
static devbuf_status wait_all(const devbuf__opencl_api *cl, cl_command_queue queue, cl_uint count,
                              const cl_event *waits) {
  cl_int code = cl->clFinish(queue);
  if (code == CL_SUCCESS && count) code = cl->clWaitForEvents(count, waits);
  return code == CL_SUCCESS ? DEVBUF_OK
                            : devbuf__opencl_error(code, "work this item waits for failed");
}

devbuf_status devbuf__opencl_enqueue_copy(devbuf_device_t *device, cl_command_queue queue,
                                          const devbuf_memory_t *dst, size_t dst_offset,
                                          const devbuf_memory_t *src, size_t src_offset,
                                          size_t size, cl_uint wait_count, const cl_event *waits,
                                          cl_event *out_event) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  const devbuf__opencl_api *cl = state->cl;
  *out_event = NULL;
  size_t dst_at = dst->offset + dst_offset,
         src_at = src->offset + src_offset; // within the cl_mem objects
  bool overlap = dst->device == src->device && dst_at < src_at + size && src_at < dst_at + size;
  if (size == 0 ||
      overlap) { // OpenCL refuses overlapping copies within one buffer: stage through the host
    devbuf_status status = size ? wait_all(cl, queue, wait_count, waits) : DEVBUF_OK;
    if (status != DEVBUF_OK || size == 0) return status;
    void *staging = devbuf__malloc(size);
    if (!staging)
      return devbuf__error(DEVBUF_OUT_OF_MEMORY, "%s: no host memory to stage a %zu-byte copy",
                           device->spec, size);
    status = opencl_read(device, src, src_offset, staging, size);
    if (status == DEVBUF_OK) status = opencl_write(device, dst, dst_offset, staging, size);
    devbuf__free(staging);
    return status;
  }
  cl_int code =
      cl->clEnqueueCopyBuffer(queue, devbuf__cl_mem(src), devbuf__cl_mem(dst), src_at, dst_at, size,
                              wait_count, wait_count ? waits : NULL, out_event);
  if (code != CL_SUCCESS)
    return devbuf__opencl_error(code, "%s: copying %zu bytes", device->spec, size);
  return DEVBUF_OK;
}

static devbuf_status opencl_copy(devbuf_device_t *device, const devbuf_memory_t *dst,
                                 size_t dst_offset, const devbuf_memory_t *src, size_t src_offset,
                                 size_t size) {
  cl_event done;
  devbuf_status status =
      devbuf__opencl_enqueue_copy(device, devbuf__opencl_of(device)->transfers, dst, dst_offset,
                                  src, src_offset, size, 0, NULL, &done);
  if (status != DEVBUF_OK || !done) return status;
  devbuf__opencl_of(device)->cl->clFlush(devbuf__opencl_of(device)->transfers);
  return devbuf__opencl_wait(devbuf__opencl_of(device)->cl, done, "a copy");
}

devbuf_status devbuf__opencl_enqueue_fill(devbuf_device_t *device, cl_command_queue queue,
                                          const devbuf_memory_t *dst, size_t offset, size_t size,
                                          const void *pattern, size_t pattern_size,
                                          cl_uint wait_count, const cl_event *waits,
                                          cl_event *out_event) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  *out_event = NULL;
  bool native = pattern_size <= 128 && (pattern_size & (pattern_size - 1)) == 0 &&
                (dst->offset + offset) % pattern_size == 0;
  if (size == 0 ||
      !native) { // the driver fills only power-of-two patterns at aligned offsets: write it out
    devbuf_status status = size ? wait_all(state->cl, queue, wait_count, waits) : DEVBUF_OK;
    if (status != DEVBUF_OK || size == 0) return status;
    char *bytes = devbuf__malloc(size);
    if (!bytes)
      return devbuf__error(DEVBUF_OUT_OF_MEMORY, "%s: no host memory to stage a %zu-byte fill",
                           device->spec, size);
    for (size_t done = 0; done < size; done += pattern_size)
      memcpy(bytes + done, pattern, pattern_size);
    status = opencl_write(device, dst, offset, bytes, size);
    devbuf__free(bytes);
    return status;
  }
  cl_int code = state->cl->clEnqueueFillBuffer(queue, devbuf__cl_mem(dst), pattern, pattern_size,
                                               dst->offset + offset, size, wait_count,
                                               wait_count ? waits : NULL, out_event);
  if (code != CL_SUCCESS)
    return devbuf__opencl_error(code, "%s: filling %zu bytes", device->spec, size);
  return DEVBUF_OK;
}

static devbuf_status opencl_zero(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                                 size_t size) {
  if (dst->host) {
    memset((char *)dst->host + offset, 0, size);
    return DEVBUF_OK;
  }
  static const unsigned char zero = 0;
  cl_event done;
  devbuf_status status = devbuf__opencl_enqueue_fill(device, devbuf__opencl_of(device)->transfers,
                                                     dst, offset, size, &zero, 1, 0, NULL, &done);
  if (status != DEVBUF_OK || !done) return status;
  devbuf__opencl_of(device)->cl->clFlush(devbuf__opencl_of(device)->transfers);
  return devbuf__opencl_wait(devbuf__opencl_of(device)->cl, done, "a fill");
}

static devbuf_status opencl_synchronize(devbuf_device_t *device) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  cl_int code = state->cl->clFinish(state->transfers);
  return code == CL_SUCCESS ? DEVBUF_OK : devbuf__opencl_error(code, "%s: clFinish", device->spec);
}

// A cl_mem handed over by a caller: of this device's context (another's would fail every
// command, or worse), as large as the tensor says, and, where it is a sub-buffer, known by its
// parent and offset (OpenCL makes no sub-buffer of a sub-buffer, which views of it need).
static devbuf_status opencl_import_handle(devbuf_device_t *device, uint64_t handle, size_t bytes,
                                          devbuf_memory_t *out) {
  devbuf__opencl_device *state = devbuf__opencl_of(device);
  const devbuf__opencl_api *cl = state->cl;
  cl_mem mem = (cl_mem)(uintptr_t)handle, parent = NULL;
  cl_context context = NULL;
  size_t size = 0, offset = 0;
  cl_int code = cl->clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof context, &context, NULL);
  if (code == CL_SUCCESS) code = cl->clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof size, &size, NULL);
  if (code == CL_SUCCESS)
    code = cl->clGetMemObjectInfo(mem, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL);
  if (code == CL_SUCCESS && parent)
    code = cl->clGetMemObjectInfo(mem, CL_MEM_OFFSET, sizeof offset, &offset, NULL);
  if (code != CL_SUCCESS)
    return devbuf__opencl_error(code, "%s: the imported cl_mem %p", device->spec, (void *)mem);
  if (context != state->context)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%s: the imported cl_mem %p belongs to another OpenCL context (%p, not "
                         "the device's %p)",
                         device->spec, (void *)mem, (void *)context, (void *)state->context);
  if (size < bytes)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%s: the imported cl_mem %p holds %zu bytes; the tensor needs %zu",
                         device->spec, (void *)mem, size, bytes);
  out->device = (uint64_t)(uintptr_t)(parent ? parent : mem);
  out->offset = parent ? offset : 0;
  return DEVBUF_OK;
}

const devbuf__backend devbuf__backend_opencl = {
    .dlpack_device_type = 4, // kDLOpenCL
    .open = opencl_open,
    .close = opencl_close,
    .import_handle = opencl_import_handle,
    .raw_alloc = opencl_raw_alloc,
    .raw_free = opencl_raw_free,
    .write = opencl_write,
    .read = opencl_read,
    .copy = opencl_copy,
    .zero = opencl_zero,
    .synchronize = opencl_synchronize,
    .queue_create = devbuf__opencl_queue_create,
    .queue_destroy = devbuf__opencl_queue_destroy,
    .enqueue = devbuf__opencl_enqueue,
    .complete = devbuf__opencl_complete,
    .event_release = devbuf__opencl_event_release,
    .waits_pass_failure = true,
    .gate_enqueue = devbuf__opencl_gate_enqueue,
    .gate_open = devbuf__opencl_gate_open,
    .gate_release = devbuf__opencl_gate_release,
    .program_build = devbuf__opencl_program_build,
    .program_release = devbuf__opencl_program_release,
    .program_check_launch = devbuf__opencl_program_check_launch,
};
