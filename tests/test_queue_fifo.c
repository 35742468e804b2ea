// A queue's FIFO (src/exec/work_fifo.c): items run in submission order across its chunks,
// whoever takes them (the worker, a finishing thread) and however far the submitters run
// ahead; cancel takes what is queued and nothing else; read chunks are reused, few kept.
#include "check.h"
#include "../src/exec/queue.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define LOG_SIZE 200000

static devbuf_device_t *device;
static size_t logged[LOG_SIZE];
static atomic_size_t log_length;

// Host task: appends its scalar to the log.
static devbuf_status append(const devbuf_kernel_args_t *args) {
  size_t at = atomic_fetch_add(&log_length, 1);
  if (at < LOG_SIZE) logged[at] = *(const size_t *)args->scalars;
  return DEVBUF_OK;
}

static devbuf_status submit_append(devbuf_queue_t *queue, size_t value) {
  return devbuf_queue_host_task(queue, append, NULL, 0, &value, sizeof value);
}

// The log holds first, first + 1, ... for `count` entries.
static void check_log_runs(size_t first, size_t count) {
  CHECK_EQ_U(atomic_load(&log_length), count);
  size_t wrong = 0;
  for (size_t i = 0; i < count && i < LOG_SIZE; i++) wrong += logged[i] != first + i;
  CHECK_EQ_U(wrong, 0);
}

// A new queue holding `items` appends of 0, 1, ... behind a wait for *gate (new) to reach 1;
// the log is empty.
static devbuf_queue_t *held_queue(size_t items, devbuf_event_t **gate) {
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_event_create(0, gate));
  atomic_store(&log_length, 0);
  CHECK_OK(devbuf_queue_wait(queue, *gate, 1));
  for (size_t i = 0; i < items; i++) CHECK_OK(submit_append(queue, i));
  CHECK_EQ_U(atomic_load(&log_length), 0);
  return queue;
}

// Items held behind a wait, many chunks of them, then run: in order.
static void test_held_items_run_in_order(void) {
  devbuf_event_t *gate = NULL;
  devbuf_queue_t *queue = held_queue(1000, &gate);
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  check_log_runs(0, 1000);
  // Chunks the worker read to the end came back for reuse, at most a few kept.
  CHECK(atomic_load(&queue->fifo_out.emptied_count) <= DEVBUF__FIFO_SPARES);
  devbuf_queue_release(queue);
  devbuf_event_release(gate);
}

// A producer far ahead of a worker that takes items as they come, and one that finishes
// after every few items (the finishing thread runs them while the worker dozes): in order.
static void test_streams_run_in_order(void) {
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_set_depth(queue, 0, 0));
  atomic_store(&log_length, 0);
  for (size_t i = 0; i < LOG_SIZE; i++) CHECK_OK(submit_append(queue, i));
  CHECK_OK(devbuf_queue_finish(queue));
  check_log_runs(0, LOG_SIZE);
  atomic_store(&log_length, 0);
  for (size_t round = 0; round < 300; round++) {
    for (size_t i = 0; i < 70; i++) CHECK_OK(submit_append(queue, round * 70 + i));
    CHECK_OK(devbuf_queue_finish(queue));
  }
  check_log_runs(0, 300 * 70);
  devbuf_queue_release(queue);
}

// Cancel drops what is queued, across chunks, and the queue goes on in order after it.
static void test_cancel_takes_what_is_queued(void) {
  devbuf_event_t *gate = NULL;
  devbuf_queue_t *queue = held_queue(500, &gate);
  CHECK_OK(devbuf_queue_cancel(queue));
  CHECK_EQ_U(atomic_load(&log_length), 0);
  for (size_t i = 0; i < 300; i++) CHECK_OK(submit_append(queue, 1000 + i));
  CHECK_OK(devbuf_queue_finish(queue));
  check_log_runs(1000, 300);
  devbuf_queue_release(queue);
  devbuf_event_release(gate);
}

// ---- several submitters ----------------------------------------------------------------

#define SUBMITTERS    4
#define PER_SUBMITTER 20000
static size_t last_seen[SUBMITTERS];
static atomic_size_t out_of_order;

// Host task: its scalar is submitter * PER_SUBMITTER + sequence; each submitter's come in
// its order (one worker runs them, so no lock is needed).
static devbuf_status note_sequence(const devbuf_kernel_args_t *args) {
  size_t value = *(const size_t *)args->scalars;
  size_t submitter = value / PER_SUBMITTER, sequence = value % PER_SUBMITTER + 1;
  if (sequence != last_seen[submitter] + 1) atomic_fetch_add(&out_of_order, 1);
  last_seen[submitter] = sequence;
  return DEVBUF_OK;
}

typedef struct submitter_args {
  devbuf_queue_t *queue;
  size_t index;
  devbuf_status status;
} submitter_args;

static void *submit_sequence(void *arg) {
  submitter_args *a = arg;
  a->status = DEVBUF_OK;
  for (size_t i = 0; i < PER_SUBMITTER && a->status == DEVBUF_OK; i++) {
    size_t value = a->index * PER_SUBMITTER + i;
    a->status = devbuf_queue_host_task(a->queue, note_sequence, NULL, 0, &value, sizeof value);
  }
  return NULL;
}

static void test_submitters_keep_their_order(void) {
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  atomic_store(&out_of_order, 0);
  submitter_args args[SUBMITTERS];
  pthread_t threads[SUBMITTERS];
  for (size_t t = 0; t < SUBMITTERS; t++) {
    last_seen[t] = 0;
    args[t] = (submitter_args){queue, t, DEVBUF_OK};
    CHECK(pthread_create(&threads[t], NULL, submit_sequence, &args[t]) == 0);
  }
  for (size_t t = 0; t < SUBMITTERS; t++) {
    pthread_join(threads[t], NULL);
    CHECK_OK(args[t].status);
  }
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_EQ_U(atomic_load(&out_of_order), 0);
  for (size_t t = 0; t < SUBMITTERS; t++) CHECK_EQ_U(last_seen[t], PER_SUBMITTER);
  devbuf_queue_release(queue);
}

// ---- a worker that goes idle while others take its items ---------------------------------

static devbuf_status nothing(const devbuf_kernel_args_t *args) {
  (void)args;
  return DEVBUF_OK;
}

typedef struct burst_args {
  devbuf_queue_t *queue;
  atomic_bool done;
  devbuf_status status;
} burst_args;

static void *submit_bursts(void *arg) {
  burst_args *a = arg;
  for (int i = 0; i < 200000 && a->status == DEVBUF_OK; i++)
    a->status = devbuf_queue_host_task(a->queue, nothing, NULL, 0, NULL, 0);
  atomic_store(&a->done, true);
  return NULL;
}

// One thread submits while another finishes over and over (taking the items itself while the
// worker sleeps, so that the worker goes idle and wakes again and again, racing the takes).
// Then the worker still runs what comes: a signal reaches its event without a finish.
static void test_worker_outlives_idle_races(void) {
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *event = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_event_create(0, &event));
  burst_args args = {.queue = queue, .status = DEVBUF_OK};
  atomic_init(&args.done, false);
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, submit_bursts, &args) == 0);
  while (!atomic_load(&args.done)) CHECK_OK(devbuf_queue_finish(queue));
  pthread_join(thread, NULL);
  CHECK_OK(args.status);
  for (uint64_t value = 1; value <= 50; value++) {
    CHECK_OK(devbuf_queue_signal(queue, event, value));
    CHECK_OK(devbuf_event_wait(event, value, 10ull * 1000 * 1000 * 1000)); // not TIMEOUT
  }
  devbuf_queue_release(queue);
  devbuf_event_release(event);
}

// Pooled items each start on a cache line of their own and take whole lines, so that the
// worker retiring one item never writes a line of the next one the submitter fills.
static void test_pooled_items_own_their_lines(void) {
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  const struct {
    devbuf__work_kind kind;
    size_t uses, scalars;
  } shapes[] = {{DEVBUF__WORK_FILL, 1, 1},
                {DEVBUF__WORK_KERNEL, 1, 16},
                {DEVBUF__WORK_COPY, 2, 0},
                {DEVBUF__WORK_KERNEL, 4, 64}};
  enum { PER_SHAPE = 8 };
  devbuf__work *items[4 * PER_SHAPE];
  size_t made = 0;
  for (size_t s = 0; s < 4; s++)
    for (size_t i = 0; i < PER_SHAPE; i++) {
      devbuf__work *work =
          devbuf__work_new(queue, shapes[s].kind, shapes[s].uses, shapes[s].scalars);
      CHECK(work != NULL);
      if (!work) continue;
      CHECK_EQ_U((uintptr_t)work % DEVBUF__CACHE_LINE, 0);
      items[made++] = work;
    }
  // No two items' lines meet: each one's bytes end before the next line another one starts on.
  for (size_t a = 0; a < made; a++)
    for (size_t b = 0; b < made; b++) {
      uintptr_t start = (uintptr_t)items[a], other = (uintptr_t)items[b];
      size_t bytes =
          devbuf__work_bytes(items[a]->kind, items[a]->use_count, items[a]->scalars_size);
      if (a != b && other >= start)
        CHECK(other >=
              ((start + bytes + DEVBUF__CACHE_LINE - 1) & ~(uintptr_t)(DEVBUF__CACHE_LINE - 1)));
    }
  for (size_t i = 0; i < made; i++) { // never queued: abandoned as a refused submission is
    atomic_store(&items[i]->fence.done, true);
    devbuf__work_release(items[i]);
  }
  devbuf__work_pool_trim(); // the pooled items go back to the heap whole (ASan checks the frees)
  devbuf_queue_release(queue);
}

int main(void) {
  CHECK_OK(devbuf_device_open("cpu", &device));
  RUN(test_pooled_items_own_their_lines);
  RUN(test_held_items_run_in_order);
  RUN(test_streams_run_in_order);
  RUN(test_cancel_takes_what_is_queued);
  RUN(test_submitters_keep_their_order);
  RUN(test_worker_outlives_idle_races);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
