// The OpenCL handles under devbuf's objects (devbuf_opencl.h).
#include "../backend/opencl/opencl.h"
#include "../exec/queue.h"
#include "devbuf_opencl.h"

devbuf_status devbuf_opencl_device_handles(devbuf_device_t *device,
                                           devbuf_opencl_handles_t *out_handles) {
  if (!device || !out_handles)
    return devbuf__null_argument("", "device, out_handles", (const void *[]){device, out_handles});
  if (device->kind != DEVBUF_DEVICE_OPENCL)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s is not an OpenCL device", device->spec);
  const devbuf__opencl_device *state = devbuf__opencl_of(device);
  *out_handles = (devbuf_opencl_handles_t){state->platform, state->id, state->context};
  return DEVBUF_OK;
}

devbuf_status devbuf_opencl_queue_handle(devbuf_queue_t *queue, void **out_command_queue) {
  if (!queue || !out_command_queue)
    return devbuf__null_argument("", "queue, out_command_queue",
                                 (const void *[]){queue, out_command_queue});
  devbuf_device_t *device = devbuf_queue_device(queue);
  if (device->kind != DEVBUF_DEVICE_OPENCL)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "a queue on %s is not on an OpenCL device",
                         device->spec);
  *out_command_queue =
      devbuf__queue_device_queue(queue); // the device queue is the cl_command_queue
  return DEVBUF_OK;
}

void *devbuf_opencl_entry_point(const char *name) {
  return name ? devbuf__opencl_symbol(name) : NULL;
}
