// Queued 256-byte fills of one buffer, on a queue that is the process's first: its work items
// are the first the heap hands out, one after the other, as in a program whose queue is its
// first busy one (`devbuf bench --only queue` makes them after its other sections, wherever
// the heap has room then). Prints ns per item, submitted then finished, for each run and
// their median. For comparing two builds side by side: scripts/queue_fills.sh.
// usage: queue_fills [ITEMS [RUNS]]   (default 200000 and 9)
#define _POSIX_C_SOURCE 200809L // clock_gettime under -std=c11
#include <devbuf.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  size_t items = argc > 1 ? strtoull(argv[1], NULL, 10) : 200000;
  int runs = argc > 2 ? atoi(argv[2]) : 9;
  if (items == 0 || runs < 1 || runs > 101) {
    fprintf(stderr, "usage: queue_fills [ITEMS [RUNS]] (ITEMS > 0, RUNS 1 to 101)\n");
    return 2;
  }
  devbuf_device_t *device = NULL;
  devbuf_queue_t *queue = NULL;
  devbuf_buffer_t *target = NULL;
  size_t bytes = 256;
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK ||
      devbuf_queue_create(device, &queue) != DEVBUF_OK ||
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &bytes, 1, 0,
                             &target) != DEVBUF_OK) {
    fprintf(stderr, "queue_fills: %s\n", devbuf_last_error());
    return 1;
  }
  double per_item[101];
  printf("ns per queued fill of 256 bytes, %zu items a run:", items);
  for (int run = 0; run < runs; run++) {
    uint64_t start = now_ns();
    for (size_t i = 0; i < items; i++) {
      unsigned char pattern = (unsigned char)i;
      if (devbuf_queue_fill(queue, target, &pattern, 1) != DEVBUF_OK) {
        fprintf(stderr, "\nqueue_fills: %s\n", devbuf_last_error());
        return 1;
      }
    }
    if (devbuf_queue_finish(queue) != DEVBUF_OK) {
      fprintf(stderr, "\nqueue_fills: %s\n", devbuf_last_error());
      return 1;
    }
    per_item[run] = (double)(now_ns() - start) / (double)items;
    printf(" %.0f", per_item[run]);
  }
  qsort(per_item, (size_t)runs, sizeof *per_item, by_value);
  printf("; median %.0f\n", per_item[runs / 2]);
  devbuf_buffer_release(target);
  devbuf_queue_release(queue);
  devbuf_device_release(device);
  return 0;
}
