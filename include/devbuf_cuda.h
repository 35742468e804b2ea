// devbuf_cuda.h: the CUDA driver handles under devbuf's objects, for code that calls the
// driver API itself beside devbuf (its own kernels or streams, interop, benchmarks).
//
// The handles are the driver's own types passed as `void *` or `int` (CUcontext, CUstream,
// CUdevice), so this header needs no CUDA headers; cast them. They belong to devbuf: the
// context is the device's primary context (retain it with cuDevicePrimaryCtxRetain to keep
// it), and a queue's stream lives as long as the queue. A buffer's device address comes
// from devbuf_buffer_device_ptr (devbuf.h). devbuf makes its context current only for the
// length of a call: the calling thread's current context is the same after it as before.
#ifndef DEVBUF_CUDA_H
#define DEVBUF_CUDA_H

#include "devbuf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct devbuf_cuda_handles {
  int device;    // CUdevice
  void *context; // CUcontext: the device's primary context, where devbuf allocates
} devbuf_cuda_handles_t;

// The handles of a CUDA device; INVALID_ARGUMENT (naming it) for a device of another kind.
DEVBUF_API devbuf_status devbuf_cuda_device_handles(devbuf_device_t *device,
                                                    devbuf_cuda_handles_t *out_handles);
// The CUstream of a devbuf queue on a CUDA device (non-blocking). The queue's worker thread
// enqueues submitted work there in its own time, and devbuf's hazard tracking does not see
// what the caller enqueues: work enqueued once devbuf_queue_finish returned (or once a
// value the queue signals was reached) runs after all work submitted before, and before
// all work submitted after it returns.
DEVBUF_API devbuf_status devbuf_cuda_queue_stream(devbuf_queue_t *queue, void **out_stream);
// The driver entry point `name` as the driver exports it ("cuMemAlloc_v2") from the CUDA
// driver devbuf loaded at run time, or NULL when it lacks that name, and for every name
// when devbuf has no usable driver (missing, the toolkit's stub, or without an entry point
// devbuf itself needs).
DEVBUF_API void *devbuf_cuda_entry_point(const char *name);

#ifdef __cplusplus
}
#endif

#endif // DEVBUF_CUDA_H
