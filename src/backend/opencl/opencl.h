// The OpenCL backend's shared pieces: the loaded API, the per-device state, errors.
#ifndef DEVBUF_OPENCL_BACKEND_H
#define DEVBUF_OPENCL_BACKEND_H

#include "../backend.h"
#include "opencl_abi.h"

// The ICD loader's entry points, loaded on first use; NULL without one, with the reason.
const devbuf__opencl_api *devbuf__opencl_load(const char **out_reason);
// Any entry point of that library by name; NULL without the library or the symbol.
void *devbuf__opencl_symbol(const char *name);

typedef struct devbuf__opencl_program devbuf__opencl_program;

typedef struct devbuf__opencl_device {
  const devbuf__opencl_api *cl;
  cl_platform_id platform;
  cl_device_id id;
  cl_context context;
  cl_command_queue transfers; // blocking copies outside queues (copyin, copyout, copy_from)
  pthread_mutex_t programs_lock;
  devbuf__opencl_program *programs; // built programs, by source and options
} devbuf__opencl_device;

static inline devbuf__opencl_device *devbuf__opencl_of(const devbuf_device_t *device) {
  return device->backend_state;
}
static inline cl_mem devbuf__cl_mem(const devbuf_memory_t *memory) {
  return (cl_mem)(uintptr_t)memory->device;
}

// Sets an error naming what failed and the OpenCL code (with its name when known), and
// returns the devbuf status it maps to: OUT_OF_MEMORY for allocation failures, else
// DEVICE_FAILURE.
devbuf_status devbuf__opencl_error(cl_int code, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

// Waits for `event` through its completion callback and releases it; DEVICE_FAILURE if
// the command ended with an error status.
devbuf_status devbuf__opencl_wait(const devbuf__opencl_api *cl, cl_event event, const char *what);

// Fill and copy enqueued on `queue` after `waits`; *out_event is the command's event, or
// NULL when the work was done at once on the host (staged patterns and overlapping copies,
// after waiting for `waits` there).
devbuf_status devbuf__opencl_enqueue_fill(devbuf_device_t *device, cl_command_queue queue,
                                          const devbuf_memory_t *dst, size_t offset, size_t size,
                                          const void *pattern, size_t pattern_size,
                                          cl_uint wait_count, const cl_event *waits,
                                          cl_event *out_event);
devbuf_status devbuf__opencl_enqueue_copy(devbuf_device_t *device, cl_command_queue queue,
                                          const devbuf_memory_t *dst, size_t dst_offset,
                                          const devbuf_memory_t *src, size_t src_offset,
                                          size_t size, cl_uint wait_count, const cl_event *waits,
                                          cl_event *out_event);

// Queues and programs (opencl_queue.c): the backend's entries.
devbuf_status devbuf__opencl_queue_create(devbuf_device_t *device, void **out_queue);
void devbuf__opencl_queue_destroy(devbuf_device_t *device, void *queue);
devbuf_status devbuf__opencl_enqueue(devbuf_device_t *device, void *queue, const devbuf__op *op,
                                     void **out_event);
devbuf_status devbuf__opencl_complete(devbuf_device_t *device, void *queue,
                                      devbuf__device_done *items, size_t count);
void devbuf__opencl_event_release(devbuf_device_t *device, void *event);
devbuf_status devbuf__opencl_gate_enqueue(devbuf_device_t *device, void *queue, void **out_gate,
                                          void **out_event);
void devbuf__opencl_gate_open(devbuf_device_t *device, void *queue, void *gate);
void devbuf__opencl_gate_release(devbuf_device_t *device, void *queue, void *gate);
devbuf_status devbuf__opencl_program_build(devbuf_device_t *device, const char *source,
                                           const char *options, void **out_program);
void devbuf__opencl_program_release(devbuf_device_t *device, void *program);
devbuf_status devbuf__opencl_program_check_launch(devbuf_device_t *device, void *program,
                                                  const char *name, const devbuf_launch_t *launch,
                                                  size_t buffers, size_t scalars);
// Frees the device's cached programs (when the device closes).
void devbuf__opencl_release_programs(devbuf_device_t *device);

#endif
