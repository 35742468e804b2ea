// Allocation benchmark: allocate, write every page, free, in steady state, at sizes from
// 256 B to 256 MiB; devbuf's caching allocator (and a whole buffer) against glibc malloc,
// jemalloc and mimalloc, interleaved run by run so that drift hits all alike.
#include "bench.h"

#include <stdio.h>

#define MAX_RUNS 101

static const size_t all_sizes[] = {256, 4096, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20};
static const size_t quick_sizes[] = {256, 4096, 64 << 10, 64 << 20};

static size_t iterations_for(size_t size, int quick) {
  size_t budget = (quick ? (size_t)1 << 26 : (size_t)1 << 28) / size;
  size_t cap = quick ? 20000 : 100000;
  return budget < 4 ? 4 : budget > cap ? cap : budget;
}

static double time_malloc(const bench_malloc *m, size_t size, size_t iterations) {
  unsigned char *warm = m->alloc(size); // steady state: the first cycle is not timed
  if (!warm) return -1;
  bench_touch(warm, size);
  m->release(warm);
  uint64_t start = bench_now_ns();
  for (size_t i = 0; i < iterations; i++) {
    unsigned char *p = m->alloc(size);
    if (!p) return -1;
    bench_touch(p, size);
    m->release(p);
  }
  return (double)(bench_now_ns() - start) / (double)iterations;
}

static double time_devbuf_allocator(devbuf_allocator_t *allocator, size_t size, size_t iterations) {
  devbuf_memory_t memory;
  if (devbuf_allocator_alloc(allocator, size, &memory) != DEVBUF_OK) return -1;
  bench_touch(memory.host, size);
  devbuf_allocator_free(allocator, &memory);
  uint64_t start = bench_now_ns();
  for (size_t i = 0; i < iterations; i++) {
    if (devbuf_allocator_alloc(allocator, size, &memory) != DEVBUF_OK) return -1;
    bench_touch(memory.host, size);
    devbuf_allocator_free(allocator, &memory);
  }
  return (double)(bench_now_ns() - start) / (double)iterations;
}

// The whole buffer API: a handle and storage record per cycle, lazy allocation, a pointer.
static double time_devbuf_buffer(devbuf_allocator_t *allocator, size_t size, size_t iterations) {
  uint64_t start = 0;
  for (size_t i = 0; i <= iterations; i++) {
    if (i == 1) start = bench_now_ns(); // cycle 0 warms up
    devbuf_buffer_t *buffer;
    void *data;
    if (devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK)
      return -1;
    devbuf_buffer_unsynchronized_ptr(buffer, &data, NULL);
    bench_touch(data, size);
    devbuf_buffer_release(buffer);
  }
  return (double)(bench_now_ns() - start) / (double)iterations;
}

void bench_alloc(const bench_config *config) {
  bench_malloc mallocs[BENCH_MALLOC_COUNT];
  bench_find_mallocs(mallocs);
  devbuf_allocator_t *allocator = devbuf_device_allocator(config->device);
  const size_t *sizes = config->quick ? quick_sizes : all_sizes;
  size_t size_count = config->quick ? sizeof quick_sizes / sizeof *quick_sizes
                                    : sizeof all_sizes / sizeof *all_sizes;
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;

  printf("== alloc + write every page + free, steady state: ns per cycle ==\n");
  for (int m = 1; m < BENCH_MALLOC_COUNT; m++)
    if (mallocs[m].missing) printf("   (%s skipped: %s)\n", mallocs[m].name, mallocs[m].missing);
  printf("   %-7s %10s %10s %10s %10s %10s %9s %10s  %s\n", "size", "devbuf", "dv-buffer", "glibc",
         "jemalloc", "mimalloc", "x glibc", "x fastest", "target");
  for (size_t s = 0; s < size_count; s++) {
    size_t size = sizes[s], iterations = iterations_for(size, config->quick);
    double devbuf_runs[MAX_RUNS], buffer_runs[MAX_RUNS], malloc_runs[BENCH_MALLOC_COUNT][MAX_RUNS];
    for (int r = 0; r < runs; r++) {
      devbuf_runs[r] = time_devbuf_allocator(allocator, size, iterations);
      buffer_runs[r] = time_devbuf_buffer(allocator, size, iterations);
      for (int m = 0; m < BENCH_MALLOC_COUNT; m++)
        malloc_runs[m][r] = mallocs[m].missing ? 0 : time_malloc(&mallocs[m], size, iterations);
    }
    double devbuf_ns = bench_median(devbuf_runs, runs), buffer_ns = bench_median(buffer_runs, runs);
    double malloc_ns[BENCH_MALLOC_COUNT], fastest = 0;
    for (int m = 0; m < BENCH_MALLOC_COUNT; m++) {
      malloc_ns[m] = mallocs[m].missing ? 0 : bench_median(malloc_runs[m], runs);
      if (!mallocs[m].missing && (fastest == 0 || malloc_ns[m] < fastest)) fastest = malloc_ns[m];
    }
    double vs_glibc = malloc_ns[BENCH_GLIBC] / devbuf_ns, vs_fastest = fastest / devbuf_ns;
    char size_text[32];
    bench_size_label(size, size_text, sizeof size_text);
    printf("   %-7s %10.1f %10.1f %10.1f", size_text, devbuf_ns, buffer_ns, malloc_ns[BENCH_GLIBC]);
    for (int m = 1; m < BENCH_MALLOC_COUNT; m++) {
      if (mallocs[m].missing)
        printf(" %10s", "-");
      else
        printf(" %10.1f", malloc_ns[m]);
    }
    printf(" %8.2fx %9.2fx  ", vs_glibc, vs_fastest);
    char label[96];
    snprintf(label, sizeof label, "%zu bytes: devbuf alloc + free", size);
    bench_figure("alloc", label, devbuf_ns, "ns", -1);
    snprintf(label, sizeof label, "%zu bytes: devbuf buffer allocate + release", size);
    bench_figure("alloc", label, buffer_ns, "ns", -1);
    snprintf(label, sizeof label, "%zu bytes: glibc malloc + free", size);
    bench_figure("alloc", label, malloc_ns[BENCH_GLIBC], "ns", -1);
    snprintf(label, sizeof label, "%zu bytes: devbuf against glibc", size);
    bench_figure("alloc", label, vs_glibc, "x", size >= ((size_t)64 << 20) ? vs_glibc >= 50 : -1);
    snprintf(label, sizeof label, "%zu bytes: devbuf against the fastest malloc", size);
    bench_figure("alloc", label, vs_fastest, "x",
                 size <= ((size_t)64 << 10) ? vs_fastest >= 1 / 1.5 : -1);
    if (size >= ((size_t)64 << 20))
      printf("%s (>= 50x glibc)\n", vs_glibc >= 50 ? "met" : "MISSED");
    else if (size <= ((size_t)64 << 10))
      printf("%s (>= 0.67x fastest)\n", vs_fastest >= 1 / 1.5 ? "met" : "MISSED");
    else
      printf("-\n");
  }
  printf(
      "   devbuf: the device's caching allocator; dv-buffer: devbuf_buffer_allocate + release\n\n");
}
