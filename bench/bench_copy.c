// Copy benchmark: copyin and copyout of 256 MiB against memcpy of the same bytes, in one
// process, alternating run by run. All memory is touched before timing.
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RUNS 101

// Through a pointer, so the compiler cannot turn the reference copy into something else.
static void *(*volatile plain_memcpy)(void *, const void *, size_t) = memcpy;

void bench_copy(const bench_config *config) {
  size_t size = config->quick ? (size_t)64 << 20 : (size_t)256 << 20;
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  unsigned char *host = malloc(size), *other = malloc(size);
  devbuf_buffer_t *buffer = NULL;
  if (!host || !other ||
      devbuf_buffer_allocate(devbuf_device_allocator(config->device), DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK) {
    printf("== copy: skipped, no memory for 2 x %zu MiB (%s) ==\n\n", size >> 20, devbuf_last_error());
    free(host);
    free(other);
    return;
  }
  memset(host, 1, size);
  memset(other, 2, size);
  devbuf_buffer_copyin(buffer, host, size);
  double in[MAX_RUNS], out[MAX_RUNS], reference[MAX_RUNS];
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = bench_now_ns();
    plain_memcpy(other, host, size);
    uint64_t t1 = bench_now_ns();
    devbuf_buffer_copyin(buffer, host, size);
    uint64_t t2 = bench_now_ns();
    devbuf_buffer_copyout(buffer, other, size);
    uint64_t t3 = bench_now_ns();
    reference[r] = (double)(t1 - t0);
    in[r] = (double)(t2 - t1);
    out[r] = (double)(t3 - t2);
  }
  double ref = bench_median(reference, runs), copyin = bench_median(in, runs), copyout = bench_median(out, runs);
  double gib = (double)size / (1 << 30);
  printf("== copies of %zu MiB: GiB/s (x memcpy; target >= 0.95x) ==\n", size >> 20);
  printf("   memcpy  %7.2f\n", gib / (ref * 1e-9));
  printf("   copyin  %7.2f  %5.2fx  %s\n", gib / (copyin * 1e-9), ref / copyin, ref / copyin >= 0.95 ? "met" : "MISSED");
  printf("   copyout %7.2f  %5.2fx  %s\n\n", gib / (copyout * 1e-9), ref / copyout,
         ref / copyout >= 0.95 ? "met" : "MISSED");
  devbuf_buffer_release(buffer);
  free(host);
  free(other);
}
