// What failed events and refused exports say: a cancelled event's message names its status
// once, and an event export refused for lack of descriptors names the descriptor limit.
#include "check.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_cancelled_event_says_cancelled_once(void) {
  devbuf_device_t *device = NULL;
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *gate = NULL, *done = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_event_create(0, &done));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  CHECK_OK(devbuf_queue_signal(queue, done, 1));
  CHECK_OK(devbuf_queue_cancel(queue));
  CHECK_STATUS(devbuf_event_wait(done, 1, 1000000000ull), DEVBUF_CANCELLED);
  CHECK_MESSAGE("CANCELLED: queue "); // which queue: the waiter may be another queue's
  CHECK_MESSAGE(" on cpu was cancelled before this signal ran");
  CHECK(!strstr(devbuf_last_error(), "CANCELLED: CANCELLED"));
  CHECK_STATUS(devbuf_event_status(done), DEVBUF_CANCELLED);
  CHECK(!strstr(devbuf_last_error(), "CANCELLED: CANCELLED"));
  devbuf_event_release(gate);
  devbuf_event_release(done);
  devbuf_queue_release(queue);
  devbuf_device_release(device);
}

// In a child: every descriptor taken, then an event export.
static int export_without_descriptors(void) {
  struct rlimit limit = {64, 64};
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return 10;
  int any = open("/dev/null", O_RDONLY); // standard input may be closed
  if (any < 0) return 14;
  while (dup(any) >= 0) {
  }
  devbuf_event_t *event = NULL;
  if (devbuf_event_create(0, &event) != DEVBUF_OK) return 11;
  devbuf_export_t *shared = NULL;
  devbuf_status status = devbuf_event_export(event, &shared);
  if (status == DEVBUF_OK) return 12;
  if (status == DEVBUF_UNSUPPORTED || !strstr(devbuf_last_error(), "descriptor")) {
    fprintf(stderr, "export answered %s: %s\n", devbuf_status_name(status), devbuf_last_error());
    return 13;
  }
  return 0;
}

static void test_event_export_without_descriptors_names_the_limit(void) {
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) _exit(export_without_descriptors());
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK_EQ_U(WEXITSTATUS(status), 0);
}

static devbuf_status fails_with_its_values(const devbuf_kernel_args_t *args) {
  (void)args;
  return devbuf_set_error(DEVBUF_DEVICE_FAILURE,
                          "NaN at row 1234, column 5678, step 91011: check the learning rate "
                          "schedule and the loss scale of the optimizer");
}

// Queues `task` and then a signal of `event` to `value`, both behind a gate opened once they
// are queued: a queue that has failed refuses later submissions, so a task that fails at once
// would otherwise leave the signal refused and the event never failed.
static void queue_task_then_signal(devbuf_queue_t *queue, devbuf_cpu_kernel_fn task,
                                   devbuf_event_t *event, uint64_t value) {
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  CHECK_OK(devbuf_queue_host_task(queue, task, NULL, 0, NULL, 0));
  CHECK_OK(devbuf_queue_signal(queue, event, value));
  CHECK_OK(devbuf_event_signal(gate, 1));
  devbuf_event_release(gate);
}

static atomic_int runs;

static devbuf_status count_a_run(const devbuf_kernel_args_t *args) {
  (void)args;
  atomic_fetch_add(&runs, 1);
  return DEVBUF_OK;
}

// A failed event stays failed for every value it had not reached: another queue (or the host)
// that signals a higher value later does not make a failed producer's consumer run.
static void test_failed_event_stays_failed(void) {
  devbuf_device_t *device = NULL;
  devbuf_queue_t *failing = NULL, *other = NULL;
  devbuf_event_t *event = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_queue_create(device, &failing));
  CHECK_OK(devbuf_queue_create(device, &other));
  CHECK_OK(devbuf_event_create(0, &event));
  CHECK_OK(devbuf_event_signal(event, 5));
  queue_task_then_signal(failing, fails_with_its_values, event, 10);
  CHECK_STATUS(devbuf_queue_finish(failing), DEVBUF_DEVICE_FAILURE);
  CHECK_STATUS(devbuf_event_wait(event, 10, 0), DEVBUF_DEVICE_FAILURE);
  CHECK_OK(devbuf_queue_signal(other, event, 20)); // "two queues may raise one timeline"
  CHECK_OK(devbuf_queue_finish(other));
  CHECK_EQ_U(devbuf_event_value(event), 5); // what was raised after the failure counts for nothing
  CHECK_STATUS(devbuf_event_wait(event, 10, 0), DEVBUF_DEVICE_FAILURE);
  CHECK_STATUS(devbuf_event_wait(event, 20, UINT64_MAX), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("NaN at row 1234");
  CHECK_OK(devbuf_event_wait(event, 5, 0)); // reached before the failure
  // A queue that waits for it fails too, and its work does not run.
  devbuf_queue_t *consumer = NULL;
  CHECK_OK(devbuf_queue_create(device, &consumer));
  devbuf_event_t *gate = NULL; // held until all its work is queued, as below
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_queue_wait(consumer, gate, 1));
  CHECK_OK(devbuf_queue_wait(consumer, event, 15));
  CHECK_OK(devbuf_queue_host_task(consumer, count_a_run, NULL, 0, NULL, 0));
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_STATUS(devbuf_queue_finish(consumer), DEVBUF_DEVICE_FAILURE);
  CHECK_EQ_U(atomic_load(&runs), 0); // the consumer's work did not run
  CHECK_MESSAGE("NaN at row 1234");
  CHECK_STATUS(devbuf_event_signal(event, 30), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("signalling 30: the event failed at 5");
  CHECK_EQ_U(devbuf_event_value(event), 5);
  devbuf_queue_release(consumer);
  devbuf_event_release(gate);
  devbuf_event_release(event);
  devbuf_queue_release(failing);
  devbuf_queue_release(other);
  devbuf_device_release(device);
}

// An event that failed at the top of its timeline (UINT64_MAX) is failed all the same: the
// host's signal is refused (UINT64_MAX also marked a healthy event, so it was let through).
static void test_failed_at_the_top(void) {
  devbuf_device_t *device = NULL;
  devbuf_queue_t *failing = NULL;
  devbuf_event_t *event = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_queue_create(device, &failing));
  CHECK_OK(devbuf_event_create(UINT64_MAX, &event));
  queue_task_then_signal(failing, fails_with_its_values, event, 7);
  CHECK_STATUS(devbuf_queue_finish(failing), DEVBUF_DEVICE_FAILURE);
  CHECK_STATUS(devbuf_event_status(event), DEVBUF_DEVICE_FAILURE);
  CHECK_STATUS(devbuf_event_signal(event, UINT64_MAX), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("NaN at row 1234");
  CHECK_OK(devbuf_event_wait(event, UINT64_MAX, 0)); // reached before the failure
  devbuf_event_release(event);
  devbuf_queue_release(failing);
  devbuf_device_release(device);
}

// A failure passed along a chain of queues keeps its root cause, whatever the chain adds in
// front: queue k+1 waits on the event queue k signals, and the first one's work fails.
static void test_long_chain_keeps_the_cause(void) {
  enum { HOPS = 12 };
  devbuf_device_t *device = NULL;
  devbuf_queue_t *queues[HOPS] = {NULL};
  devbuf_event_t *events[HOPS] = {NULL}, *gate = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_event_create(0, &gate));
  for (int i = 0; i < HOPS; i++) { // every queue held until the chain is all queued
    CHECK_OK(devbuf_queue_create(device, &queues[i]));
    CHECK_OK(devbuf_event_create(0, &events[i]));
    CHECK_OK(devbuf_queue_wait(queues[i], gate, 1));
    if (i)
      CHECK_OK(devbuf_queue_wait(queues[i], events[i - 1], 1));
    else
      CHECK_OK(devbuf_queue_host_task(queues[i], fails_with_its_values, NULL, 0, NULL, 0));
    CHECK_OK(devbuf_queue_signal(queues[i], events[i], 1));
  }
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_STATUS(devbuf_event_wait(events[HOPS - 1], 1, UINT64_MAX), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("the loss scale of the optimizer");
  CHECK_MESSAGE("...");
  CHECK_STATUS(devbuf_queue_finish(queues[HOPS - 1]), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("NaN at row 1234, column 5678, step 91011: check the learning rate schedule and "
                "the loss scale of the optimizer");
  for (int i = 0; i < HOPS; i++) {
    devbuf_queue_finish(queues[i]);
    devbuf_queue_release(queues[i]);
    devbuf_event_release(events[i]);
  }
  devbuf_event_release(gate);
  devbuf_device_release(device);
}

static devbuf_status returns_its_own_code(const devbuf_kernel_args_t *args) {
  (void)args;
  return (devbuf_status)999;
}

// A kernel that returns a number that is no status fails its queue and events as a device
// failure that names the number, not as "UNKNOWN".
static void test_kernel_status_that_is_no_status(void) {
  devbuf_device_t *device = NULL;
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *done = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_event_create(0, &done));
  queue_task_then_signal(queue, returns_its_own_code, done, 1);
  CHECK_STATUS(devbuf_queue_finish(queue), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("kernel returned 999, which is no devbuf status");
  CHECK_STATUS(devbuf_event_wait(done, 1, 0), DEVBUF_DEVICE_FAILURE);
  CHECK(!strstr(devbuf_last_error(), "UNKNOWN"));
  devbuf_event_release(done);
  devbuf_queue_release(queue);
  devbuf_device_release(device);
}

int main(void) {
  RUN(test_kernel_status_that_is_no_status);
  RUN(test_failed_event_stays_failed);
  RUN(test_failed_at_the_top);
  RUN(test_long_chain_keeps_the_cause);
  RUN(test_cancelled_event_says_cancelled_once);
  RUN(test_event_export_without_descriptors_names_the_limit);
  return CHECK_EXIT();
}
