// Thread scaling: small-block alloc + write + free loops on 1 thread, then on 2 threads at
// once, through the device's caching allocator. Target: 2 threads >= 1.5x the throughput.
#include "bench.h"

#include <pthread.h>
#include <stdio.h>

#define MAX_RUNS 101

typedef struct worker_args {
  devbuf_allocator_t *allocator;
  size_t operations;
  uint64_t seed;
} worker_args;

static void *worker(void *arg) {
  worker_args *args = arg;
  uint64_t state = args->seed;
  devbuf_memory_t held[8];
  for (int i = 0; i < 8; i++) devbuf_allocator_alloc(args->allocator, 256, &held[i]);
  for (size_t i = 0; i < args->operations; i++) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    size_t slot = state % 8, size = 64 + (state >> 8) % 4032;
    devbuf_allocator_free(args->allocator, &held[slot]);
    if (devbuf_allocator_alloc(args->allocator, size, &held[slot]) != DEVBUF_OK) break;
    ((volatile unsigned char *)held[slot].host)[0] = 1;
  }
  for (int i = 0; i < 8; i++) devbuf_allocator_free(args->allocator, &held[i]);
  return NULL;
}

// Operations per second with `threads` threads doing `operations` each.
static double throughput(devbuf_allocator_t *allocator, int threads, size_t operations) {
  pthread_t ids[2];
  worker_args args[2];
  uint64_t start = bench_now_ns();
  for (int i = 0; i < threads; i++) {
    args[i] = (worker_args){allocator, operations, 0x9E3779B97F4A7C15ull + (uint64_t)i};
    pthread_create(&ids[i], NULL, worker, &args[i]);
  }
  for (int i = 0; i < threads; i++) pthread_join(ids[i], NULL);
  return (double)threads * (double)operations / ((double)(bench_now_ns() - start) * 1e-9);
}

void bench_threads(const bench_config *config) {
  devbuf_allocator_t *allocator = devbuf_device_allocator(config->device);
  size_t operations = config->quick ? 500000 : 2000000;
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  double one[MAX_RUNS], two[MAX_RUNS];
  throughput(allocator, 2, operations / 10); // warm both threads' shards
  for (int r = 0; r < runs; r++) {
    one[r] = throughput(allocator, 1, operations);
    two[r] = throughput(allocator, 2, operations);
  }
  double single = bench_median(one, runs), dual = bench_median(two, runs);
  printf(
      "== small blocks (64 B - 4 KiB), alloc + write + free: million operations per second ==\n");
  printf("   1 thread   %7.2f\n", single / 1e6);
  bench_figure("threads", "1 thread", single / 1e6, "M ops/s", -1);
  bench_figure("threads", "2 threads against 1", dual / single, "x", dual / single >= 1.5);
  printf("   2 threads  %7.2f  %5.*fx  %s (target >= 1.5x)\n\n", dual / 1e6,
         bench_decimals(dual / single, 1.5), dual / single,
         dual / single >= 1.5 ? "met" : "MISSED");
  bench_pairs(config);
}
