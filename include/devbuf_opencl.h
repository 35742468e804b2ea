// devbuf_opencl.h: the OpenCL handles under devbuf's objects, for code that calls OpenCL
// itself beside devbuf (its own kernels or queues, interop, benchmarks).
//
// The handles are OpenCL's own types passed as `void *` (cl_platform_id, cl_device_id,
// cl_context, cl_command_queue), so this header needs no OpenCL headers; cast them. They
// belong to devbuf: retain them (clRetainContext, ...) to keep one past the life of the
// devbuf object it came from, and never release one you did not retain. A buffer's cl_mem
// and offset come from devbuf_buffer_device_handle (devbuf.h).
#ifndef DEVBUF_OPENCL_H
#define DEVBUF_OPENCL_H

#include "devbuf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct devbuf_opencl_handles {
  void *platform; // cl_platform_id
  void *device;   // cl_device_id
  void *context;  // cl_context: every buffer of the device belongs to it
} devbuf_opencl_handles_t;

// The handles of an OpenCL device; INVALID_ARGUMENT (naming it) for a device of another kind.
DEVBUF_API devbuf_status devbuf_opencl_device_handles(devbuf_device_t *device,
                                                      devbuf_opencl_handles_t *out_handles);
// The in-order cl_command_queue of a devbuf queue on an OpenCL device. The queue's worker
// thread enqueues submitted work there in its own time, and devbuf's hazard tracking does
// not see what the caller enqueues: a command enqueued once devbuf_queue_finish returned
// (or once a value the queue signals was reached) runs after all work submitted before,
// and before all work submitted after it returns.
DEVBUF_API devbuf_status devbuf_opencl_queue_handle(devbuf_queue_t *queue,
                                                    void **out_command_queue);
// The entry point `name` ("clCreateBuffer") of the OpenCL library devbuf uses (the ICD
// loader it found at run time), or NULL when it lacks that name, and for every name when
// devbuf could not load the library (or it lacks an entry point devbuf itself needs).
DEVBUF_API void *devbuf_opencl_entry_point(const char *name);

#ifdef __cplusplus
}
#endif

#endif // DEVBUF_OPENCL_H
