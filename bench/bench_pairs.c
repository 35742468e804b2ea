// Alloc + free pairs on 1 thread and on 2 threads at once, per thread: devbuf's caching
// allocator, the whole buffer path (devbuf_buffer_allocate + release) and the system
// allocators (glibc; jemalloc and mimalloc when installed), each writing one byte of what
// it gets. The second thread shows what the threads share: a pair that touches no shared
// cache line costs on 2 threads what it costs on one.
#include "bench.h"

#include <pthread.h>
#include <stdio.h>

#define MAX_RUNS 101

typedef enum pair_kind { PAIR_ALLOCATOR, PAIR_BUFFER, PAIR_MALLOC } pair_kind;

typedef struct pair_job {
  pair_kind kind;
  devbuf_allocator_t *allocator;
  const bench_malloc *malloc_like;
  size_t size, iterations;
  pthread_barrier_t *start;
  uint64_t elapsed_ns;
  bool failed;
} pair_job;

static bool one_pair(pair_job *job) {
  size_t size = job->size;
  switch (job->kind) {
  case PAIR_ALLOCATOR: {
    devbuf_memory_t memory;
    if (devbuf_allocator_alloc(job->allocator, size, &memory) != DEVBUF_OK) return false;
    ((volatile unsigned char *)memory.host)[0] = 1;
    devbuf_allocator_free(job->allocator, &memory);
    return true;
  }
  case PAIR_BUFFER: {
    devbuf_buffer_t *buffer;
    void *data;
    if (devbuf_buffer_allocate(job->allocator, DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK)
      return false;
    devbuf_buffer_unsynchronized_ptr(buffer, &data, NULL);
    ((volatile unsigned char *)data)[0] = 1;
    devbuf_buffer_release(buffer);
    return true;
  }
  case PAIR_MALLOC: {
    volatile unsigned char *p = job->malloc_like->alloc(size);
    if (!p) return false;
    p[0] = 1;
    job->malloc_like->release((void *)p);
    return true;
  }
  }
  return false;
}

static void *run_pairs(void *arg) {
  pair_job *result = arg;
  // The loop works on its own copy: the two threads' jobs sit side by side in one array, and
  // a store per pair into either moved their shared cache line between the cores (every
  // allocator took 2 to 4 times its one-thread time on 2 threads in `devbuf bench --only
  // threads` before, about its one-thread time since: docs/allocator.md).
  pair_job job = *result;
  bool failed = false;
  for (int i = 0; i < 64 && !failed; i++) failed = !one_pair(&job); // warm
  pthread_barrier_wait(job.start);
  uint64_t start = bench_now_ns();
  for (size_t i = 0; i < job.iterations && !failed; i++) failed = !one_pair(&job);
  result->elapsed_ns = bench_now_ns() - start;
  result->failed = failed;
  return NULL;
}

// ns per pair per thread with `threads` threads at once (the slower thread's), or -1.
static double time_pairs(pair_job model, int threads) {
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads);
  pthread_t ids[2];
  pair_job jobs[2];
  for (int t = 0; t < threads; t++) {
    jobs[t] = model;
    jobs[t].start = &start;
    pthread_create(&ids[t], NULL, run_pairs, &jobs[t]);
  }
  uint64_t slowest = 0;
  bool failed = false;
  for (int t = 0; t < threads; t++) {
    pthread_join(ids[t], NULL);
    failed |= jobs[t].failed;
    if (jobs[t].elapsed_ns > slowest) slowest = jobs[t].elapsed_ns;
  }
  pthread_barrier_destroy(&start);
  return failed ? -1 : (double)slowest / (double)model.iterations;
}

static void print_cell(double ns) {
  if (ns < 0)
    printf(" %9s", "-");
  else
    printf(" %9.1f", ns);
}

void bench_pairs(const bench_config *config) {
  bench_malloc mallocs[BENCH_MALLOC_COUNT];
  bench_find_mallocs(mallocs);
  devbuf_allocator_t *allocator = devbuf_device_allocator(config->device);
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  size_t iterations = config->quick ? 50000 : 1000000;
  static const size_t sizes[] = {256, 4096, 1 << 20};
  printf("== alloc + write a byte + free, ns per pair per thread: 1 thread, then 2 at once ==\n");
  for (int m = 0; m < BENCH_MALLOC_COUNT; m++)
    if (mallocs[m].missing) printf("   (%s skipped: %s)\n", mallocs[m].name, mallocs[m].missing);
  printf("   %-9s %7s %9s %9s %9s %9s %9s   %s\n", "size", "threads", "devbuf", "dv-buffer",
         "glibc", "jemalloc", "mimalloc", "devbuf x fastest, buffer x devbuf, x 1 thread");
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    double single_buffer = 0, single_pair = 0;
    for (int threads = 1; threads <= 2; threads++) {
      // Columns: devbuf, buffer, then each system allocator; interleaved run by run.
      double samples[2 + BENCH_MALLOC_COUNT][MAX_RUNS];
      for (int r = 0; r < runs; r++)
        for (int c = 0; c < 2 + BENCH_MALLOC_COUNT; c++) {
          pair_job job = {.kind = c == 0   ? PAIR_ALLOCATOR
                                  : c == 1 ? PAIR_BUFFER
                                           : PAIR_MALLOC,
                          .allocator = allocator,
                          .malloc_like = c >= 2 ? &mallocs[c - 2] : NULL,
                          .size = sizes[s],
                          .iterations = iterations};
          samples[c][r] = c >= 2 && mallocs[c - 2].missing ? -1 : time_pairs(job, threads);
        }
      double median[2 + BENCH_MALLOC_COUNT], fastest = -1;
      for (int c = 0; c < 2 + BENCH_MALLOC_COUNT; c++) {
        median[c] = bench_median(samples[c], runs);
        if (c >= 2 && median[c] > 0 && (fastest < 0 || median[c] < fastest)) fastest = median[c];
      }
      if (threads == 1) {
        single_buffer = median[1];
        single_pair = median[0];
      }
      char label[32];
      bench_size_label(sizes[s], label, sizeof label);
      printf("   %-9s %7d", label, threads);
      for (int c = 0; c < 2 + BENCH_MALLOC_COUNT; c++) print_cell(median[c]);
      double against = median[0] / fastest, buffer_over = median[1] / median[0];
      printf("   %.*fx%s, %.1fx%s", bench_decimals(against, 1.0), against,
             against <= 1.0 ? "" : " MISSED", buffer_over, buffer_over <= 3.0 ? "" : " MISSED");
      // The devbuf pair's own factor is what the machine gives a second thread that shares
      // no written cache line (at these sizes the pair writes none): on a shared virtual
      // machine it can be less than a core. Beyond it, the buffer path's own sharing.
      double buffer_factor = median[1] / single_buffer, pair_factor = median[0] / single_pair;
      if (threads == 2)
        printf(", buffer %.2fx (pair %.2fx: buffer / pair %.2fx%s)", buffer_factor, pair_factor,
               buffer_factor / pair_factor, buffer_factor / pair_factor <= 1.2 ? "" : " MISSED");
      printf("\n");
      char figure[128];
      snprintf(figure, sizeof figure, "%s %d thread%s: devbuf / fastest system allocator", label,
               threads, threads == 1 ? "" : "s");
      bench_figure("threads", figure, against, "x", against <= 1.0);
      snprintf(figure, sizeof figure, "%s %d thread%s: buffer path / devbuf pair", label, threads,
               threads == 1 ? "" : "s");
      bench_figure("threads", figure, buffer_over, "x", buffer_over <= 3.0);
      if (threads == 2) {
        snprintf(figure, sizeof figure, "%s: buffer path, 2 threads / 1 thread", label);
        bench_figure("threads", figure, buffer_factor, "x", buffer_factor <= 1.2);
        snprintf(figure, sizeof figure,
                 "%s: buffer path's 2-thread factor / the devbuf pair's 2-thread factor", label);
        bench_figure("threads", figure, buffer_factor / pair_factor, "x",
                     buffer_factor / pair_factor <= 1.2);
      }
    }
  }
  printf("   targets (MISSED marks a miss): devbuf <= 1.0x the fastest system allocator; the\n"
         "   buffer path <= 3x devbuf's pair, and on 2 threads <= 1.2x its time on one (where the\n"
         "   pair itself slows on 2 threads, the machine shares its cores: buffer / pair is the\n"
         "   path's own)\n\n");
}
