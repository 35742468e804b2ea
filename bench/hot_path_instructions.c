// The caching allocator's hot path in instructions (deterministic, unlike timings on a shared
// machine): run under callgrind by scripts/hot_path_instructions.sh, twice with different
// counts, whose difference divided by the extra iterations is the cost of one cycle.
// usage: hot_path_instructions allocator|buffer|buffer_write|queue|task SIZE ITERATIONS [DEVICE]
// (default cpu); buffer_write: as `devbuf bench --only threads` does the buffer path, with
// devbuf_buffer_unsynchronized_ptr and a one-byte write between allocate and release; task:
// a host task over a buffer, each waited for with devbuf_queue_finish before the next (what
// a loop of collectives does, bench/mpi), which the finishing thread runs itself
#include "devbuf.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static devbuf_status touch_first_byte(const devbuf_kernel_args_t *args) {
  if (args->sizes[0]) ((volatile unsigned char *)args->data[0])[0]++;
  return DEVBUF_OK;
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) return 2;
  size_t size = strtoull(argv[2], NULL, 0);
  long iterations = atol(argv[3]);
  devbuf_device_t *cpu = NULL;
  if (devbuf_device_open(argc == 5 ? argv[4] : "cpu", &cpu) != DEVBUF_OK) return 1;
  devbuf_allocator_t *allocator = devbuf_device_allocator(cpu);
  bool task = strcmp(argv[1], "task") == 0;
  if (task || strcmp(argv[1], "queue") == 0) { // queue: a fill submitted, run and retired, 64
                                               // at a time
    devbuf_queue_t *queue = NULL;
    devbuf_buffer_t *buffer = NULL;
    if (devbuf_queue_create(cpu, &queue) != DEVBUF_OK ||
        devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK)
      return 1;
    unsigned char pattern = 7;
    devbuf_use_t use = {buffer, DEVBUF_ACCESS_READ_WRITE};
    for (long i = 0; i < iterations; i++) {
      devbuf_status status = task
                                 ? devbuf_queue_host_task(queue, touch_first_byte, &use, 1, NULL, 0)
                                 : devbuf_queue_fill(queue, buffer, &pattern, 1);
      if (status == DEVBUF_OK && (task || i % 64 == 63)) status = devbuf_queue_finish(queue);
      if (status != DEVBUF_OK) return 1;
    }
    devbuf_queue_finish(queue);
    devbuf_buffer_release(buffer);
    devbuf_queue_release(queue);
    devbuf_device_release(cpu);
    return 0;
  }
  if (strcmp(argv[1], "buffer_write") == 0) {
    for (long i = 0; i < iterations; i++) {
      devbuf_buffer_t *buffer = NULL;
      void *data = NULL;
      if (devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK ||
          devbuf_buffer_unsynchronized_ptr(buffer, &data, NULL) != DEVBUF_OK)
        return 1;
      ((volatile char *)data)[0] = 1;
      devbuf_buffer_release(buffer);
    }
    devbuf_device_release(cpu);
    return 0;
  }
  bool buffers = strcmp(argv[1], "buffer") == 0;
  for (long i = 0; i < iterations; i++) {
    if (buffers) { // devbuf_buffer_allocate + release: handle, storage and block
      devbuf_buffer_t *buffer = NULL;
      if (devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK)
        return 1;
      devbuf_buffer_release(buffer);
    } else { // the device allocator's alloc + free, touching the block
      devbuf_memory_t memory;
      if (devbuf_allocator_alloc(allocator, size, &memory) != DEVBUF_OK) return 1;
      if (memory.host) ((volatile char *)memory.host)[0] = 1; // device memory: no host address
      devbuf_allocator_free(allocator, &memory);
    }
  }
  devbuf_device_release(cpu);
  return 0;
}
