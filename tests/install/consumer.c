// Uses the installed headers and library: one buffer round trip on the CPU, and the
// backends' native-handle headers refusing a CPU device.
#include <devbuf.h>
#include <devbuf_cuda.h>
#include <devbuf_opencl.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  devbuf_device_t *cpu = NULL;
  devbuf_buffer_t *buffer = NULL;
  size_t shape[] = {4};
  float in[4] = {1, 2, 3, 4}, out[4] = {0};
  if (devbuf_device_open("cpu", &cpu) != DEVBUF_OK ||
      devbuf_buffer_new(devbuf_device_allocator(cpu), DEVBUF_FLOAT32, shape, 1, 0, &buffer) !=
          DEVBUF_OK ||
      devbuf_buffer_copyin(buffer, in, sizeof in) != DEVBUF_OK ||
      devbuf_buffer_copyout(buffer, out, sizeof out) != DEVBUF_OK) {
    fprintf(stderr, "consumer: %s\n", devbuf_last_error());
    return 1;
  }
  devbuf_opencl_handles_t opencl;
  devbuf_cuda_handles_t cuda;
  int refused = devbuf_opencl_device_handles(cpu, &opencl) == DEVBUF_INVALID_ARGUMENT &&
                devbuf_cuda_device_handles(cpu, &cuda) == DEVBUF_INVALID_ARGUMENT;
  devbuf_buffer_release(buffer);
  devbuf_device_release(cpu);
  return memcmp(in, out, sizeof in) == 0 && refused ? 0 : 1;
}
