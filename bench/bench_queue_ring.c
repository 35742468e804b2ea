// Queue items against ring-buffer queues: 256-byte fills of one buffer submitted to a devbuf
// queue, and the same memsets through two minimal pthread queues over a ring of slots (a
// mutex, a condition variable each way): one signals its worker on every push, the other
// only when the worker sleeps. Each side submits every item and then waits for the last;
// ns per item, the faster ring as the reference.
#include "bench.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_RUNS   101
#define RING_SLOTS 4096 // as deep as a devbuf queue by default
#define FILL_BYTES 256

typedef struct ring_fill {
  unsigned char *target;
  unsigned char pattern;
} ring_fill;

typedef struct ring_queue {
  pthread_mutex_t lock;
  pthread_cond_t not_empty, not_full, drained;
  ring_fill slots[RING_SLOTS];
  size_t head, tail; // pushed, popped (running counts)
  bool worker_sleeps, stop, signal_always;
  pthread_t worker;
} ring_queue;

static void *ring_worker(void *arg) {
  ring_queue *q = arg;
  pthread_mutex_lock(&q->lock);
  for (;;) {
    while (q->head == q->tail && !q->stop) {
      q->worker_sleeps = true;
      pthread_cond_wait(&q->not_empty, &q->lock);
      q->worker_sleeps = false;
    }
    if (q->head == q->tail) break;
    ring_fill fill = q->slots[q->tail % RING_SLOTS];
    pthread_mutex_unlock(&q->lock);
    memset(fill.target, fill.pattern, FILL_BYTES);
    pthread_mutex_lock(&q->lock);
    if (q->head - q->tail++ == RING_SLOTS) pthread_cond_signal(&q->not_full);
    if (q->head == q->tail) pthread_cond_broadcast(&q->drained);
  }
  pthread_mutex_unlock(&q->lock);
  return NULL;
}

static ring_queue *ring_start(bool signal_always) {
  static ring_queue q; // the ring is too large for the stack
  memset(&q, 0, sizeof q);
  q.signal_always = signal_always;
  pthread_mutex_init(&q.lock, NULL);
  pthread_cond_init(&q.not_empty, NULL);
  pthread_cond_init(&q.not_full, NULL);
  pthread_cond_init(&q.drained, NULL);
  pthread_create(&q.worker, NULL, ring_worker, &q);
  return &q;
}

static void ring_push(ring_queue *q, unsigned char *target, unsigned char pattern) {
  pthread_mutex_lock(&q->lock);
  while (q->head - q->tail == RING_SLOTS) pthread_cond_wait(&q->not_full, &q->lock);
  q->slots[q->head++ % RING_SLOTS] = (ring_fill){target, pattern};
  if (q->signal_always || q->worker_sleeps) pthread_cond_signal(&q->not_empty);
  pthread_mutex_unlock(&q->lock);
}

static void ring_wait_drained(ring_queue *q) {
  pthread_mutex_lock(&q->lock);
  while (q->head != q->tail) pthread_cond_wait(&q->drained, &q->lock);
  pthread_mutex_unlock(&q->lock);
}

// Waits until the ring is drained and tells the worker to stop.
static void ring_drain(ring_queue *q) {
  ring_wait_drained(q);
  pthread_mutex_lock(&q->lock);
  q->stop = true;
  pthread_cond_signal(&q->not_empty);
  pthread_mutex_unlock(&q->lock);
}

static void ring_end(ring_queue *q) {
  pthread_join(q->worker, NULL);
  pthread_cond_destroy(&q->drained);
  pthread_cond_destroy(&q->not_full);
  pthread_cond_destroy(&q->not_empty);
  pthread_mutex_destroy(&q->lock);
}

static double time_ring(size_t items, unsigned char *target, bool signal_always) {
  ring_queue *q = ring_start(signal_always);
  uint64_t start = bench_now_ns();
  for (size_t i = 0; i < items; i++) ring_push(q, target, (unsigned char)i);
  ring_drain(q);
  uint64_t elapsed = bench_now_ns() - start;
  ring_end(q);
  return (double)elapsed / (double)items;
}

// ---- what an idle worker costs: items submitted one at a time, far apart ----------------

#define SPARSE_GAP_NS 1000000 // between two submissions: the worker runs dry and sleeps

static uint64_t process_cpu_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

static void sleep_gap(void) {
  struct timespec gap = {0, SPARSE_GAP_NS};
  nanosleep(&gap, NULL);
}

// CPU time of the whole process per item (the submitter's, which sleeps between items, and
// the worker's), for the ring that signals a sleeper.
static double ring_sparse_cpu(size_t items, unsigned char *target) {
  ring_queue *q = ring_start(false);
  uint64_t start = process_cpu_ns();
  for (size_t i = 0; i < items; i++) {
    ring_push(q, target, (unsigned char)i);
    sleep_gap();
  }
  ring_drain(q);
  uint64_t used = process_cpu_ns() - start;
  ring_end(q);
  return (double)used / (double)items;
}

static double devbuf_sparse_cpu(devbuf_queue_t *queue, devbuf_buffer_t *target, size_t items) {
  uint64_t start = process_cpu_ns();
  for (size_t i = 0; i < items; i++) {
    unsigned char pattern = (unsigned char)i;
    if (devbuf_queue_fill(queue, target, &pattern, 1) != DEVBUF_OK) return -1;
    sleep_gap();
  }
  if (devbuf_queue_finish(queue) != DEVBUF_OK) return -1;
  return (double)(process_cpu_ns() - start) / (double)items;
}

static double time_devbuf_fills(devbuf_queue_t *queue, devbuf_buffer_t *target, size_t items) {
  uint64_t start = bench_now_ns();
  for (size_t i = 0; i < items; i++) {
    unsigned char pattern = (unsigned char)i;
    if (devbuf_queue_fill(queue, target, &pattern, 1) != DEVBUF_OK) return -1;
  }
  if (devbuf_queue_finish(queue) != DEVBUF_OK) return -1;
  return (double)(bench_now_ns() - start) / (double)items;
}

// ---- one item at a time, each waited for: a synchronous call through the queue -----------
// A loop that submits and finishes at once, as an eager array library or a collective in a
// host task does. A devbuf queue whose finishing threads keep running the work themselves
// lets its worker doze (src/exec/queue.c); the ring hands every item to its worker and
// sleeps until it is done.

#define SYNC_GAP_NS 1000000 // between two calls, in the sparse case

// The sparse case counts the process's CPU time; the other, wall time.
static uint64_t round_trip_clock(uint64_t gap_ns) {
  return gap_ns ? process_cpu_ns() : bench_now_ns();
}

static double ring_round_trips(size_t items, unsigned char *target, uint64_t gap_ns) {
  ring_queue *q = ring_start(false);
  uint64_t start = round_trip_clock(gap_ns);
  for (size_t i = 0; i < items; i++) {
    ring_push(q, target, (unsigned char)i);
    ring_wait_drained(q);
    if (gap_ns) sleep_gap();
  }
  uint64_t used = round_trip_clock(gap_ns) - start;
  ring_drain(q);
  ring_end(q);
  return (double)used / (double)items;
}

static double devbuf_round_trips(devbuf_queue_t *queue, devbuf_buffer_t *target, size_t items,
                                 uint64_t gap_ns) {
  uint64_t start = round_trip_clock(gap_ns);
  for (size_t i = 0; i < items; i++) {
    unsigned char pattern = (unsigned char)i;
    if (devbuf_queue_fill(queue, target, &pattern, 1) != DEVBUF_OK ||
        devbuf_queue_finish(queue) != DEVBUF_OK)
      return -1;
    if (gap_ns) sleep_gap();
  }
  return (double)(round_trip_clock(gap_ns) - start) / (double)items;
}

static void bench_round_trips(const bench_config *config, devbuf_queue_t *queue,
                              devbuf_buffer_t *target, unsigned char *ring_target) {
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  size_t items = config->quick ? 2000 : 20000, sparse = config->quick ? 20 : 200;
  double ring[MAX_RUNS], ours[MAX_RUNS], ratio[MAX_RUNS], ring_cpu[MAX_RUNS], our_cpu[MAX_RUNS];
  for (int r = 0; r < runs; r++) {
    ring[r] = ring_round_trips(items, ring_target, 0);
    ours[r] = devbuf_round_trips(queue, target, items, 0);
    ring_cpu[r] = ring_round_trips(sparse, ring_target, SYNC_GAP_NS);
    our_cpu[r] = devbuf_round_trips(queue, target, sparse, SYNC_GAP_NS);
    if (ours[r] < 0 || our_cpu[r] < 0) {
      printf("== synchronous calls through the queue failed: %s ==\n\n", devbuf_last_error());
      return;
    }
    ratio[r] = ours[r] / ring[r];
  }
  double g = bench_median(ring, runs), o = bench_median(ours, runs), x = bench_median(ratio, runs);
  double gc = bench_median(ring_cpu, runs), oc = bench_median(our_cpu, runs);
  printf("== %zu fills of %d bytes, each waited for before the next is submitted: ns per item ==\n",
         items, FILL_BYTES);
  printf("   ring, signals a sleeper   %8.1f\n", g);
  printf("   devbuf queue              %8.1f  %5.2fx the ring (median of the runs' ratios; the "
         "finishing thread runs each item, the worker dozes)\n",
         o, x);
  printf("   the same, %zu of them %d us apart: CPU time of the process per item, us: ring %.1f, "
         "devbuf %.1f\n\n",
         sparse, SYNC_GAP_NS / 1000, gc / 1e3, oc / 1e3);
  bench_figure("queue", "ring signalling a sleeper, per synchronous fill", g, "ns", -1);
  bench_figure("queue", "devbuf queue, per synchronous fill", o, "ns", -1);
  bench_figure("queue", "devbuf queue / the ring, per synchronous fill", x, "x", -1);
  bench_figure("queue", "ring, CPU per sparse synchronous fill", gc / 1e3, "us", -1);
  bench_figure("queue", "devbuf queue, CPU per sparse synchronous fill", oc / 1e3, "us", -1);
}

void bench_queue_ring(const bench_config *config) {
  size_t items = config->quick ? 20000 : 200000;
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  size_t bytes = FILL_BYTES;
  devbuf_queue_t *queue = NULL;
  devbuf_buffer_t *target = NULL;
  void *ring_target = NULL;
  if (devbuf_queue_create(config->device, &queue) != DEVBUF_OK ||
      devbuf_buffer_allocate(devbuf_device_allocator(config->device), DEVBUF_UINT8, &bytes, 1, 0,
                             &target) != DEVBUF_OK ||
      devbuf_buffer_unsynchronized_ptr(target, &ring_target, NULL) != DEVBUF_OK) {
    printf("== queue items against rings skipped: %s ==\n\n", devbuf_last_error());
    devbuf_buffer_release(target);
    devbuf_queue_release(queue);
    return;
  }
  // The rings fill the buffer's own bytes (the CPU's), so both sides write the same memory.
  double always[MAX_RUNS], sleeper[MAX_RUNS], ours[MAX_RUNS], ratio[MAX_RUNS];
  bool failed = false;
  for (int r = 0; r < runs && !failed; r++) {
    always[r] = time_ring(items, ring_target, true);
    sleeper[r] = time_ring(items, ring_target, false);
    ours[r] = time_devbuf_fills(queue, target, items);
    failed = ours[r] < 0;
    double faster = always[r] < sleeper[r] ? always[r] : sleeper[r];
    ratio[r] = ours[r] / faster;
  }
  if (failed) {
    printf("== queue items against rings failed: %s ==\n\n", devbuf_last_error());
  } else {
    double a = bench_median(always, runs), s = bench_median(sleeper, runs),
           o = bench_median(ours, runs), x = bench_median(ratio, runs);
    printf("== %zu fills of %d bytes queued, then waited for: ns per item ==\n", items, FILL_BYTES);
    printf("   ring, signals every push  %8.1f\n", a);
    printf("   ring, signals a sleeper   %8.1f\n", s);
    printf("   devbuf queue              %8.1f  %5.*fx the faster ring (median of the runs' "
           "ratios)  %s (target <= 1.2x)\n\n",
           o, bench_decimals(x, 1.2), x, x <= 1.2 ? "met" : "MISSED");
    bench_figure("queue", "ring signalling every push, per fill", a, "ns", -1);
    bench_figure("queue", "ring signalling a sleeper, per fill", s, "ns", -1);
    bench_figure("queue", "devbuf queue, per fill", o, "ns", -1);
    bench_figure("queue", "devbuf queue / the faster ring, per fill", x, "x", x <= 1.2);
    // The worker's spin before it sleeps, priced: the CPU an item costs where each one finds
    // the worker dry, against the ring whose worker sleeps at once (src/exec/queue.c spins
    // only while work comes back within about the spin, so here it should cost nothing).
    size_t sparse = config->quick ? 20 : 200;
    double ring_cpu[MAX_RUNS], our_cpu[MAX_RUNS];
    for (int r = 0; r < runs && !failed; r++) {
      ring_cpu[r] = ring_sparse_cpu(sparse, ring_target);
      our_cpu[r] = devbuf_sparse_cpu(queue, target, sparse);
      failed = our_cpu[r] < 0;
    }
    if (!failed) {
      double rc = bench_median(ring_cpu, runs), oc = bench_median(our_cpu, runs);
      printf("== %zu fills submitted %d us apart (the worker runs dry each time): CPU time of the "
             "process per item, us ==\n",
             sparse, SPARSE_GAP_NS / 1000);
      printf("   ring, signals a sleeper   %8.1f\n", rc / 1e3);
      printf("   devbuf queue              %8.1f  (its worker spins up to 50 us before it sleeps "
             "only while work comes back soon)\n\n",
             oc / 1e3);
      bench_figure("queue", "ring signalling a sleeper, CPU per sparse item", rc / 1e3, "us", -1);
      bench_figure("queue", "devbuf queue, CPU per sparse item", oc / 1e3, "us", -1);
    }
  }
  if (!failed) bench_round_trips(config, queue, target, ring_target);
  devbuf_buffer_release(target);
  devbuf_queue_release(queue);
}
