// Queue benchmark: 100,000 small kernels, each using 3 buffers, on one queue, against a
// minimal pthread work queue that runs the same kernel without any tracking; then the same
// kernels alternating between 2 queues so that every item waits for the other queue; then
// the memory a queue holds for a producer far ahead of its worker, bounded and not.
#include "bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#define MAX_RUNS 101

static devbuf_status add3(const devbuf_kernel_args_t *args) {
  float *c = args->data[2];
  const float *a = args->data[0], *b = args->data[1];
  c[0] += a[0] + b[0];
  return DEVBUF_OK;
}

// ---- the baseline: a mutex, a condition variable and a FIFO -----------------------------

typedef struct plain_item {
  float *a, *b, *c;
  struct plain_item *next;
} plain_item;

typedef struct plain_queue {
  pthread_mutex_t lock;
  pthread_cond_t available, drained;
  plain_item *head, *tail;
  size_t pending;
  int idle, stop;
  pthread_t worker;
} plain_queue;

static void *plain_worker(void *arg) {
  plain_queue *q = arg;
  pthread_mutex_lock(&q->lock);
  for (;;) {
    while (!q->head && !q->stop) {
      q->idle = 1;
      pthread_cond_wait(&q->available, &q->lock);
      q->idle = 0;
    }
    if (!q->head) break;
    plain_item *item = q->head;
    q->head = item->next;
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
    item->c[0] += item->a[0] + item->b[0];
    free(item);
    pthread_mutex_lock(&q->lock);
    if (--q->pending == 0) pthread_cond_broadcast(&q->drained);
  }
  pthread_mutex_unlock(&q->lock);
  return NULL;
}

static double time_plain(size_t items, float *a, float *b, float *c) {
  plain_queue q = {.head = NULL};
  pthread_mutex_init(&q.lock, NULL);
  pthread_cond_init(&q.available, NULL);
  pthread_cond_init(&q.drained, NULL);
  pthread_create(&q.worker, NULL, plain_worker, &q);
  uint64_t start = bench_now_ns();
  for (size_t i = 0; i < items; i++) {
    plain_item *item = malloc(sizeof *item);
    *item = (plain_item){a, b, c, NULL};
    pthread_mutex_lock(&q.lock);
    if (q.tail)
      q.tail->next = item;
    else
      q.head = item;
    q.tail = item;
    q.pending++;
    if (q.idle) pthread_cond_signal(&q.available);
    pthread_mutex_unlock(&q.lock);
  }
  pthread_mutex_lock(&q.lock);
  while (q.pending) pthread_cond_wait(&q.drained, &q.lock);
  q.stop = 1;
  pthread_cond_signal(&q.available);
  pthread_mutex_unlock(&q.lock);
  uint64_t elapsed = bench_now_ns() - start;
  pthread_join(q.worker, NULL);
  pthread_cond_destroy(&q.available);
  pthread_cond_destroy(&q.drained);
  pthread_mutex_destroy(&q.lock);
  return (double)elapsed / (double)items;
}

// ---- devbuf ------------------------------------------------------------------------------

// ns per item: `items` kernels over a, b (read) and c (written), on queues[i % queue_count].
static double time_devbuf(devbuf_queue_t **queues, int queue_count, size_t items,
                          devbuf_buffer_t **buffers) {
  devbuf_use_t uses[3] = {{buffers[0], DEVBUF_ACCESS_READ},
                          {buffers[1], DEVBUF_ACCESS_READ},
                          {buffers[2], DEVBUF_ACCESS_READ_WRITE}};
  uint64_t start = bench_now_ns();
  for (size_t i = 0; i < items; i++) {
    if (devbuf_queue_submit(queues[i % (size_t)queue_count], add3, uses, 3, NULL, 0) != DEVBUF_OK) {
      fprintf(stderr, "bench: %s\n", devbuf_last_error());
      return -1;
    }
  }
  for (int q = 0; q < queue_count; q++) devbuf_queue_finish(queues[q]);
  return (double)(bench_now_ns() - start) / (double)items;
}

// ---- memory held for queued items ------------------------------------------------------

#if defined(__GLIBC__)
static atomic_bool producer_done;

// The queue's first item: holds the worker back until the producer is done (or 10 s, if it
// never says so): every item submitted meanwhile is held at once.
static devbuf_status hold_worker(const devbuf_kernel_args_t *args) {
  (void)args;
  struct timespec pause = {0, 1000000};
  for (int waited = 0; waited < 10000 && !atomic_load(&producer_done); waited++)
    nanosleep(&pause, NULL);
  return DEVBUF_OK;
}

static size_t heap_in_use(void) {
  struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

// The most heap `items` fills of 256 bytes take while the worker is held back, with
// `depth` (0: no bound); SIZE_MAX if a submission failed.
static size_t queued_heap(devbuf_device_t *device, devbuf_buffer_t *target, size_t items,
                          uint64_t depth) {
  devbuf_queue_t *queue = NULL;
  if (devbuf_queue_create(device, &queue) != DEVBUF_OK) return SIZE_MAX;
  devbuf_queue_set_depth(queue, depth, 0);
  atomic_store(&producer_done, false);
  size_t before = heap_in_use(), most = before;
  unsigned char pattern = 7;
  int ok = devbuf_queue_host_task(queue, hold_worker, NULL, 0, NULL, 0) == DEVBUF_OK;
  for (size_t i = 0; i < items && ok; i++) {
    ok = devbuf_queue_fill(queue, target, &pattern, 1) == DEVBUF_OK;
    if (i % 1024 == 0) {
      size_t now = heap_in_use();
      if (now > most) most = now;
    }
  }
  atomic_store(&producer_done, true);
  if (devbuf_queue_finish(queue) != DEVBUF_OK) ok = 0;
  devbuf_queue_release(queue);
  return ok ? (most > before ? most - before : 0) : SIZE_MAX;
}

static void bench_queued_memory(const bench_config *config, devbuf_buffer_t *target) {
  size_t items = config->quick ? 100000 : 500000;
  size_t bounded = queued_heap(config->device, target, items, DEVBUF_QUEUE_DEFAULT_DEPTH);
  size_t unbounded = queued_heap(config->device, target, items, 0);
  if (bounded == SIZE_MAX || unbounded == SIZE_MAX) {
    printf("== queued memory skipped: %s ==\n\n", devbuf_last_error());
    return;
  }
  double per_item = (double)unbounded / (double)items;
  double bound_mb = (double)bounded / 1e6, unbound_mb = (double)unbounded / 1e6;
  printf("== %zu fills of 256 bytes queued while the worker is held: the heap they take ==\n",
         items);
  printf("   no bound                  %8.1f MB  %6.1f bytes per item  %s (target <= 256)\n",
         unbound_mb, per_item, per_item <= 256 ? "met" : "MISSED");
  printf("   default depth (%u)      %8.1f MB  the submitter waits for room (target: bounded)\n\n",
         DEVBUF_QUEUE_DEFAULT_DEPTH, bound_mb);
  bench_figure("queue", "heap per queued item, no bound", per_item, "B", per_item <= 256);
  bench_figure("queue", "heap of queued items, default depth", bound_mb, "MB",
               bounded < unbounded / 4);
}
#else
static void bench_queued_memory(const bench_config *config, devbuf_buffer_t *target) {
  (void)config, (void)target;
  printf("== queued memory skipped: no glibc heap statistics here ==\n\n");
}
#endif

void bench_queue(const bench_config *config) {
  size_t items = config->quick ? 20000 : 100000;
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  devbuf_allocator_t *allocator = devbuf_device_allocator(config->device);
  devbuf_buffer_t *buffers[3] = {NULL, NULL, NULL};
  devbuf_queue_t *queues[2] = {NULL, NULL};
  size_t count = 16;
  int ok = devbuf_queue_create(config->device, &queues[0]) == DEVBUF_OK &&
           devbuf_queue_create(config->device, &queues[1]) == DEVBUF_OK;
  for (int i = 0; i < 3 && ok; i++)
    ok = devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &count, 1, DEVBUF_BUFFER_ZERO,
                                &buffers[i]) == DEVBUF_OK;
  float plain_memory[3][16] = {{0}};
  // The machine's load drifts between runs: each run times the baseline and devbuf back to
  // back, and the ratio quoted is the median of the runs' own ratios.
  double plain[MAX_RUNS], one[MAX_RUNS], two[MAX_RUNS], ratio[MAX_RUNS];
  for (int r = 0; r < runs && ok; r++) {
    plain[r] = time_plain(items, plain_memory[0], plain_memory[1], plain_memory[2]);
    one[r] = time_devbuf(queues, 1, items, buffers);
    two[r] = time_devbuf(queues, 2, items, buffers);
    ratio[r] = one[r] / plain[r];
  }
  if (ok) {
    double p = bench_median(plain, runs), o = bench_median(one, runs), t = bench_median(two, runs);
    double x = bench_median(ratio, runs);
    printf("== %zu kernels using 3 buffers each: ns per item (submit to completion) ==\n", items);
    printf("   untracked pthread queue   %8.1f\n", p);
    bench_figure("queue", "untracked pthread queue, per item", p, "ns", -1);
    bench_figure("queue", "devbuf, 1 queue, per item", o, "ns", o <= 1000);
    bench_figure("queue", "devbuf, 1 queue, against untracked", x, "x", x <= 1.5);
    bench_figure("queue", "devbuf, 2 queues waiting for each other, per item", t, "ns", -1);
    printf("   devbuf, 1 queue           %8.1f  %5.*fx untracked (median of the runs' ratios)  %s "
           "(target <= 1000 ns "
           "and <= 1.5x)\n",
           o, bench_decimals(x, 1.5), x, o <= 1000 && x <= 1.5 ? "met" : "MISSED");
    printf("   devbuf, 2 queues          %8.1f  every item waits for the other queue: +%.1f ns per "
           "wait\n\n",
           t, t - o);
    bench_queue_ring(config);
    size_t fill_bytes = 256;
    devbuf_buffer_t *target = NULL;
    if (devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &fill_bytes, 1, 0, &target) == DEVBUF_OK)
      bench_queued_memory(config, target);
    devbuf_buffer_release(target);
  } else {
    printf("== queue benchmark skipped: %s ==\n\n", devbuf_last_error());
  }
  for (int i = 0; i < 3; i++) devbuf_buffer_release(buffers[i]);
  devbuf_queue_release(queues[0]);
  devbuf_queue_release(queues[1]);
}
