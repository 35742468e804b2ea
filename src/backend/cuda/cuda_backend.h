// The CUDA backend's shared pieces: the loaded driver API, the per-device state, errors.
#ifndef DEVBUF_CUDA_BACKEND_H
#define DEVBUF_CUDA_BACKEND_H

#include "cuda_abi.h"
#include "../backend.h"

// The driver's entry points, loaded and initialised (cuInit) on first use; NULL without a
// usable driver, with the reason.
const devbuf__cuda_api *devbuf__cuda_load(const char **out_reason);
// Any entry point of the driver by its exported name; NULL without a usable driver.
void *devbuf__cuda_symbol(const char *name);

typedef struct devbuf__cuda_device {
  const devbuf__cuda_api *cu;
  CUdevice id;
  CUcontext context;  // the device's primary context
  CUstream transfers; // copies outside queues
  bool maps_memory;   // the driver's virtual memory management works on this GPU (read at open)
  pthread_mutex_t builtins_lock; // loading devbuf's kernels, on first need
  int builtins_state;            // 0 not tried, 1 loaded, -1 unavailable (under the lock)
  char builtins_failure[160];    // why they are unavailable (fills then go through the host)
  CUmodule builtins;
  CUfunction fill;
  pthread_mutex_t staging_lock; // the pinned staging pair below, one copy at a time
  void *staging[2];             // made on the first pageable copy that needs them
  CUevent staged[2];            // the device is done with staging[i]
  pthread_mutex_t events_lock;
  CUevent spare_events[256]; // events of retired work, for the next items (cuda_queue.c)
  size_t spare_count;
  pthread_mutex_t mappings_lock;   // the physical memory behind growable segments (cuda_vmm.c):
  struct devbuf__cuda_page *pages; // an open-addressing table of mapped pages by address
  size_t page_capacity, page_count;
} devbuf__cuda_device;

static inline devbuf__cuda_device *devbuf__cuda_of(const devbuf_device_t *device) {
  return device->backend_state;
}

// Growable segments on CUDA's virtual memory management (cuda_vmm.c): the backend's
// raw_reserve, raw_map, raw_unmap and raw_unreserve. UNSUPPORTED where the driver lacks it.
devbuf_status devbuf__cuda_reserve(devbuf_device_t *device, size_t size, devbuf_memory_t *out);
devbuf_status devbuf__cuda_map(devbuf_device_t *device, const devbuf_memory_t *reservation,
                               size_t offset, size_t size);
void devbuf__cuda_unmap(devbuf_device_t *device, const devbuf_memory_t *reservation, size_t offset,
                        size_t size);
void devbuf__cuda_unreserve(devbuf_device_t *device, const devbuf_memory_t *reservation);

// Memory other processes map (cuda_share.c): raw_alloc of DEVBUF_MEMORY_SHAREABLE, and
// the backend's raw_export and raw_import; release gives back memory made or imported so
// (raw_free's part for it, and raw_unimport). A raw allocation's token names its kind (0 to
// 2); shareable memory's is a record of its handle instead.
devbuf_status devbuf__cuda_alloc_shareable(devbuf_device_t *device, size_t size,
                                           devbuf_memory_t *out);
void devbuf__cuda_release_shareable(devbuf_device_t *device, const devbuf_memory_t *memory);
static inline bool devbuf__cuda_is_shareable(const devbuf_memory_t *memory) {
  return (uintptr_t)memory->token > DEVBUF_MEMORY_SHAREABLE;
}
devbuf_status devbuf__cuda_export(devbuf_device_t *device, const devbuf_memory_t *memory,
                                  int *out_fd);
devbuf_status devbuf__cuda_import(devbuf_device_t *device, int fd, size_t size,
                                  devbuf_memory_t *out);

// Makes the device's context current on the calling thread (every entry point calls it).
devbuf_status devbuf__cuda_enter(devbuf_device_t *device);
// Sets an error naming what failed and the CUDA code and name; OUT_OF_MEMORY for
// allocation failures, DEVICE_FAILURE otherwise.
devbuf_status devbuf__cuda_error(const devbuf__cuda_api *cu, CUresult code, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
// Waits for everything enqueued on `stream` so far through an event recorded behind it: a
// host function enqueued there never runs once a kernel faults, so its waiter would hang.
devbuf_status devbuf__cuda_wait(devbuf_device_t *device, CUstream stream, const char *what);

// devbuf's kernels (cuda_builtins.cu), loaded on first use; NULL when this build has none
// or the driver cannot load them for this GPU (callers then do without).
CUfunction devbuf__cuda_fill_kernel(devbuf_device_t *device);
// Why devbuf's kernels are not loaded: NULL once they are, "not tried yet" before the first
// fill that needs them. For the tests, which check that a build with nvcc runs them.
const char *devbuf__cuda_builtins_failure(devbuf_device_t *device);

// Queues, operations and programs (cuda_queue.c): the backend's entries.
devbuf_status devbuf__cuda_queue_create(devbuf_device_t *device, void **out_queue);
void devbuf__cuda_queue_destroy(devbuf_device_t *device, void *queue);
CUstream devbuf__cuda_queue_stream(void *queue); // a device queue's stream
devbuf_status devbuf__cuda_enqueue(devbuf_device_t *device, void *queue, const devbuf__op *op,
                                   void **out_event);
devbuf_status devbuf__cuda_complete(devbuf_device_t *device, void *queue,
                                    devbuf__device_done *items, size_t count);
void devbuf__cuda_event_release(devbuf_device_t *device, void *event);
devbuf_status devbuf__cuda_program_build(devbuf_device_t *device, const char *source,
                                         const char *options, void **out_program);
void devbuf__cuda_program_release(devbuf_device_t *device, void *program);
devbuf_status devbuf__cuda_program_check_launch(devbuf_device_t *device, void *program,
                                                const char *name, const devbuf_launch_t *launch,
                                                size_t buffers, size_t scalars);

#endif
