// The CUDA driver handles under devbuf's objects (devbuf_cuda.h).
#include "../backend/cuda/cuda_backend.h"
#include "../exec/queue.h"
#include "devbuf_cuda.h"

devbuf_status devbuf_cuda_device_handles(devbuf_device_t *device,
                                         devbuf_cuda_handles_t *out_handles) {
  if (!device || !out_handles)
    return devbuf__null_argument("", "device, out_handles", (const void *[]){device, out_handles});
  if (device->kind != DEVBUF_DEVICE_CUDA)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s is not a CUDA device", device->spec);
  const devbuf__cuda_device *state = devbuf__cuda_of(device);
  *out_handles = (devbuf_cuda_handles_t){state->id, state->context};
  return DEVBUF_OK;
}

devbuf_status devbuf_cuda_queue_stream(devbuf_queue_t *queue, void **out_stream) {
  if (!queue || !out_stream)
    return devbuf__null_argument("", "queue, out_stream", (const void *[]){queue, out_stream});
  devbuf_device_t *device = devbuf_queue_device(queue);
  if (device->kind != DEVBUF_DEVICE_CUDA)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "a queue on %s is not on a CUDA device",
                         device->spec);
  *out_stream = devbuf__cuda_queue_stream(devbuf__queue_device_queue(queue));
  return DEVBUF_OK;
}

void *devbuf_cuda_entry_point(const char *name) { return name ? devbuf__cuda_symbol(name) : NULL; }
