// A CPU queue whose finishing threads run its work themselves: its worker dozes on a timer
// instead of being woken by each submission (src/exec/queue.c, wait_for_work). The work
// still runs when a thread blocks on it in any other way (it nudges the worker), when no
// finish comes within the doze (and the queue then goes back to waking its worker), and
// when the queue is released. DEVBUF_QUEUE_DOZE_US sets the doze of each queue made after
// it: long (10 s) where only a nudge can run the work in time, so that a missing nudge fails
// the test by its timeout instead of passing late.
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define LONG_DOZE_US "10000000" // 10 s: far beyond every wait the tests allow
#define WAIT_NS      5000000000ull
#define VALUES       16 // floats in the test's buffer

static pthread_t last_runner; // the thread that ran the last task
static atomic_int tasks_run;  // tasks run since the test began
static atomic_bool task_done; // set by flag_task

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static devbuf_status note_runner(const devbuf_kernel_args_t *args) {
  float *values = args->data[0];
  values[0] += 1.0f;
  last_runner = pthread_self();
  atomic_fetch_add(&tasks_run, 1);
  return DEVBUF_OK;
}

static devbuf_status flag_task(const devbuf_kernel_args_t *args) {
  float *values = args->data[0];
  values[0] = 7.0f;
  atomic_store(&task_done, true);
  return DEVBUF_OK;
}

typedef struct fixture {
  devbuf_device_t *cpu;
  devbuf_queue_t *queue;
  devbuf_buffer_t *buffer;
  devbuf_use_t use;
} fixture;

static bool open_fixture(fixture *f, const char *doze_us) {
  setenv("DEVBUF_QUEUE_DOZE_US", doze_us, 1);
  size_t count = VALUES;
  bool ok = devbuf_device_open("cpu", &f->cpu) == DEVBUF_OK &&
            devbuf_queue_create(f->cpu, &f->queue) == DEVBUF_OK &&
            devbuf_buffer_allocate(devbuf_device_allocator(f->cpu), DEVBUF_FLOAT32, &count, 1,
                                   DEVBUF_BUFFER_ZERO, &f->buffer) == DEVBUF_OK;
  unsetenv("DEVBUF_QUEUE_DOZE_US");
  CHECK(ok);
  f->use = (devbuf_use_t){f->buffer, DEVBUF_ACCESS_READ_WRITE};
  return ok;
}

static void close_fixture(fixture *f) {
  devbuf_buffer_release(f->buffer);
  devbuf_queue_release(f->queue);
  devbuf_device_release(f->cpu);
}

// Submits and finishes tasks until `in_a_row` of them ran on this thread; whether they did
// within 2000 tries (the first few run on the worker, until the queue sees the pattern).
static bool run_on_this_thread(fixture *f, int in_a_row) {
  int row = 0;
  for (int i = 0; i < 2000 && row < in_a_row; i++) {
    if (devbuf_queue_host_task(f->queue, note_runner, &f->use, 1, NULL, 0) != DEVBUF_OK ||
        devbuf_queue_finish(f->queue) != DEVBUF_OK)
      return false;
    row = pthread_equal(last_runner, pthread_self()) ? row + 1 : 0;
  }
  return row >= in_a_row;
}

static void test_finishing_thread_runs_the_work(void) {
  fixture f;
  if (!open_fixture(&f, LONG_DOZE_US)) return;
  atomic_store(&tasks_run, 0);
  CHECK(run_on_this_thread(&f, 200));
  float values[VALUES] = {0};
  CHECK_OK(devbuf_buffer_copyout(f.buffer, values, sizeof values));
  CHECK(values[0] == (float)atomic_load(&tasks_run)); // every task ran, once
  close_fixture(&f);
}

typedef struct waiter_args {
  devbuf_event_t *event;
  uint64_t value;
  devbuf_status status;
} waiter_args;

static void *wait_on_event(void *arg) {
  waiter_args *waiter = arg;
  waiter->status = devbuf_event_wait(waiter->event, waiter->value, WAIT_NS);
  return NULL;
}

// Each way to block on the work, without a finish, gets it run long before the doze ends.
static void test_blocked_waiters_nudge_the_worker(void) {
  fixture f;
  if (!open_fixture(&f, LONG_DOZE_US)) return;
  devbuf_event_t *event = NULL;
  CHECK_OK(devbuf_event_create(0, &event));
  for (int way = 0; way < 5 && event; way++) {
    if (!run_on_this_thread(&f, 20)) {
      CHECK(!"the queue never came to run its work on the finishing thread");
      break;
    }
    atomic_store(&task_done, false);
    CHECK_OK(devbuf_queue_host_task(f.queue, flag_task, &f.use, 1, NULL, 0));
    double began = now_s();
    float values[VALUES] = {0};
    switch (way) {
    case 0: // an event the work signals, waited for on this thread
      CHECK_OK(devbuf_queue_signal(f.queue, event, (uint64_t)way + 1));
      CHECK_OK(devbuf_event_wait(event, (uint64_t)way + 1, WAIT_NS));
      break;
    case 1: { // ... and on another thread, while this one blocks outside the library
      CHECK_OK(devbuf_queue_signal(f.queue, event, 2));
      waiter_args waiter = {event, 2, DEVBUF_TIMEOUT};
      pthread_t thread;
      CHECK(pthread_create(&thread, NULL, wait_on_event, &waiter) == 0);
      pthread_join(thread, NULL);
      CHECK_OK(waiter.status);
      break;
    }
    case 2: // reading the bytes the work writes
      CHECK_OK(devbuf_buffer_copyout(f.buffer, values, sizeof values));
      CHECK(values[0] == 7.0f);
      break;
    case 3: // waiting for the buffer's work
      CHECK_OK(devbuf_buffer_wait(f.buffer));
      break;
    case 4: // waiting for the device's work
      CHECK_OK(devbuf_device_synchronize(f.cpu));
      break;
    }
    double waited = now_s() - began;
    if (!atomic_load(&task_done) || waited > 5.0)
      fprintf(stderr, "way %d: done %d after %.3f s\n", way, (int)atomic_load(&task_done), waited);
    CHECK(atomic_load(&task_done));
    CHECK(waited < 5.0);
    CHECK_OK(devbuf_queue_finish(f.queue));
  }
  devbuf_event_release(event);
  close_fixture(&f);
}

// Work submitted while the worker dozes, that no finish or waiter comes for, runs once the
// doze ends; the queue then wakes its worker for each submission again.
static void test_work_nobody_waits_for_runs_after_the_doze(void) {
  fixture f;
  if (!open_fixture(&f, "300000")) return; // 0.3 s
  CHECK(run_on_this_thread(&f, 20));
  for (int round = 0; round < 2; round++) {
    atomic_store(&task_done, false);
    double began = now_s();
    CHECK_OK(devbuf_queue_host_task(f.queue, flag_task, &f.use, 1, NULL, 0));
    while (!atomic_load(&task_done) && now_s() - began < 5.0) {
      struct timespec pause = {0, 100000};
      nanosleep(&pause, NULL); // outside the library: nothing nudges the worker
    }
    double waited = now_s() - began;
    CHECK(atomic_load(&task_done));
    // The second round comes after the doze ran out with work: the submission wakes the
    // worker at once (a wake, not a doze of 0.3 s).
    if (round == 1 && waited >= 0.2) fprintf(stderr, "round 1 waited %.3f s\n", waited);
    if (round == 1) CHECK(waited < 0.2);
    CHECK_OK(devbuf_queue_finish(f.queue));
  }
  close_fixture(&f);
}

// Releasing a queue whose worker dozes with work queued runs the work, at once.
static void test_release_runs_what_the_dozing_worker_holds(void) {
  fixture f;
  if (!open_fixture(&f, LONG_DOZE_US)) return;
  CHECK(run_on_this_thread(&f, 20));
  atomic_store(&task_done, false);
  double began = now_s();
  CHECK_OK(devbuf_queue_host_task(f.queue, flag_task, &f.use, 1, NULL, 0));
  devbuf_queue_release(f.queue);
  f.queue = NULL;
  while (!atomic_load(&task_done) && now_s() - began < 5.0) {
    struct timespec pause = {0, 100000};
    nanosleep(&pause, NULL);
  }
  CHECK(atomic_load(&task_done));
  float values[VALUES] = {0};
  CHECK_OK(devbuf_buffer_copyout(f.buffer, values, sizeof values));
  CHECK(values[0] == 7.0f);
  close_fixture(&f);
}

int main(void) {
  RUN(test_finishing_thread_runs_the_work);
  RUN(test_blocked_waiters_nudge_the_worker);
  RUN(test_work_nobody_waits_for_runs_after_the_doze);
  RUN(test_release_runs_what_the_dozing_worker_holds);
  return CHECK_EXIT();
}
