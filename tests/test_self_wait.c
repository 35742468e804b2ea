// Work that waits for itself: a CPU kernel or a host task that calls queue_finish or
// queue_cancel on its own queue, device_synchronize on its device, or waits for a buffer
// that it (or later work of its queue) uses. Each is refused with INVALID_ARGUMENT and a
// message that says why; none hangs (an alarm turns a hang into a failure). Bytes that
// earlier work of the queue wrote are not refused.
#include "check.h"

#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

static devbuf_device_t *device;
static devbuf_queue_t *queue, *other_queue;
static devbuf_buffer_t *used, *unused;

enum {
  FINISH,
  CANCEL,
  SYNCHRONIZE,
  WAIT_OWN_BUFFER,
  COPYOUT_OWN_BUFFER,
  WAIT_LATER_WORK,
  FINISH_OTHER_QUEUE,
  COPYOUT_UNUSED,
  CALLS
};
static const char *const call_names[CALLS] = {"queue_finish", "queue_cancel", "device_synchronize",
                                              "buffer_wait",  "copyout",      "buffer_wait",
                                              "queue_finish", "copyout"};
static devbuf_status seen[CALLS];
static char seen_message[CALLS][512];
static pthread_t ran_on; // the thread that ran the last call

// Makes one of the calls from inside running work; what it answered goes to seen[].
static devbuf_status call_inside(const devbuf_kernel_args_t *args) {
  int call;
  memcpy(&call, args->scalars, sizeof call);
  uint32_t words[16];
  devbuf_status status = DEVBUF_OK;
  switch (call) {
  case FINISH:
    status = devbuf_queue_finish(queue);
    break;
  case CANCEL:
    status = devbuf_queue_cancel(queue);
    break;
  case SYNCHRONIZE:
    status = devbuf_device_synchronize(device);
    break;
  case WAIT_OWN_BUFFER:
  case WAIT_LATER_WORK:
    status = devbuf_buffer_wait(used);
    break;
  case COPYOUT_OWN_BUFFER:
    status = devbuf_buffer_copyout(used, words, sizeof words);
    break;
  case FINISH_OTHER_QUEUE:
    status = devbuf_queue_finish(other_queue);
    break;
  case COPYOUT_UNUSED:
    status = devbuf_buffer_copyout(unused, words, sizeof words);
    break;
  }
  seen[call] = status;
  snprintf(seen_message[call], sizeof seen_message[call], "%s", devbuf_last_error());
  ran_on = pthread_self();
  return DEVBUF_OK; // the work itself succeeds: the refusal is the call's, not the queue's
}

static devbuf_status nothing(const devbuf_kernel_args_t *args) {
  (void)args;
  return DEVBUF_OK;
}

typedef devbuf_status (*submit_fn)(devbuf_queue_t *, devbuf_cpu_kernel_fn, const devbuf_use_t *,
                                   size_t, const void *, size_t);

// With `gated`, the worker runs each call once everything of its round is submitted (the
// later work too); without, the worker sleeps when it is submitted, and the thread that
// then finishes the queue may run it itself (*on_finisher counts how often it did).
static void run_calls(submit_fn submit, const char *how, bool gated, int *on_finisher) {
  for (int call = 0; call < CALLS; call++) {
    if (!gated && call == WAIT_LATER_WORK) continue; // the later work may come after it ran
    seen[call] = DEVBUF_UNSUPPORTED;                 // never an answer of these calls
    devbuf_use_t use = {used, DEVBUF_ACCESS_READ_WRITE};
    size_t use_count = call == WAIT_LATER_WORK ? 0 : 1;
    devbuf_event_t *gate = NULL;
    CHECK_OK(devbuf_event_create(0, &gate));
    if (gated)
      CHECK_OK(devbuf_queue_wait(queue, gate, 1));
    else
      usleep(2000); // the worker goes to sleep
    CHECK_OK(submit(queue, call_inside, &use, use_count, &call, sizeof call));
    if (call == WAIT_LATER_WORK) // work behind the caller in its own queue uses the buffer
      CHECK_OK(devbuf_queue_submit(queue, nothing, &use, 1, NULL, 0));
    CHECK_OK(devbuf_event_signal(gate, 1));
    CHECK_OK(devbuf_queue_finish(queue));
    if (on_finisher && pthread_equal(ran_on, pthread_self())) ++*on_finisher;
    devbuf_event_release(gate);
    bool refused = call != FINISH_OTHER_QUEUE && call != COPYOUT_UNUSED;
    if (refused) {
      if (seen[call] != DEVBUF_INVALID_ARGUMENT || !strstr(seen_message[call], call_names[call]) ||
          !strstr(seen_message[call], "would wait for work of that queue")) {
        fprintf(stderr, "%s: call %s answered %s: %s\n", how, call_names[call],
                devbuf_status_name(seen[call]), seen_message[call]);
        check_failures++;
      }
    } else if (seen[call] != DEVBUF_OK) {
      fprintf(stderr, "%s: %s of unrelated work answered %s: %s\n", how, call_names[call],
              devbuf_status_name(seen[call]), seen_message[call]);
      check_failures++;
    }
  }
  CHECK_OK(devbuf_queue_status(queue));
}

static void setup(void) {
  size_t shape[] = {16};
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_create(device, &other_queue));
  CHECK_OK(devbuf_buffer_new(devbuf_device_allocator(device), DEVBUF_UINT32, shape, 1, 0, &used));
  CHECK_OK(devbuf_buffer_new(devbuf_device_allocator(device), DEVBUF_UINT32, shape, 1, 0, &unused));
  CHECK_OK(devbuf_buffer_ensure_allocated(unused));
}

static void teardown(void) {
  devbuf_buffer_release(used);
  devbuf_buffer_release(unused);
  devbuf_queue_release(other_queue);
  devbuf_queue_release(queue);
  devbuf_device_release(device);
}

static void test_from_cpu_kernel(void) { run_calls(devbuf_queue_submit, "CPU kernel", true, NULL); }
static void test_from_host_task(void) {
  run_calls(devbuf_queue_host_task, "host task", true, NULL);
}

// devbuf_queue_finish runs what it finds queued behind a sleeping worker on its own thread:
// the work is refused the same waits there, and the thread's own waits stay its own after.
static void test_run_by_finish(void) {
  int on_finisher = 0;
  for (int round = 0; round < 10; round++) {
    run_calls(devbuf_queue_submit, "CPU kernel run by finish", false, &on_finisher);
    run_calls(devbuf_queue_host_task, "host task run by finish", false, &on_finisher);
  }
  // Each round submits to a sleeping worker and finishes at once: the finishing thread
  // claims the queue before the worker wakes nearly always (only a scheduler that runs
  // the woken worker first, every time, would leave this at 0).
  CHECK(on_finisher > 0);
  CHECK_OK(devbuf_queue_finish(queue)); // not refused: this thread is no queue's worker now
  CHECK_OK(devbuf_buffer_wait(used));
}

static uint32_t read_inside[3];
static devbuf_status read_earlier_writes(const devbuf_kernel_args_t *args) {
  (void)args;
  uint32_t words[16];
  const void *data = NULL;
  seen[0] = devbuf_buffer_copyout(used, words, sizeof words);
  read_inside[0] = words[15];
  seen[1] = devbuf_buffer_wait(used);
  seen[2] = devbuf_buffer_contents(used, &data, NULL);
  read_inside[1] = data ? ((const uint32_t *)data)[3] : 0;
  if (data) devbuf_buffer_end_access(used, data);
  read_inside[2] = 1;
  return DEVBUF_OK;
}

// An item of the queue that reads bytes an earlier item wrote: that item has run, so the
// reads answer at once, whether the worker retired it yet or still holds it in its batch
// (it runs the items it takes together, and retires them together).
static void test_earlier_items_are_done(void) {
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_event_create(0, &gate));
  for (uint32_t round = 1; round <= 20; round++) {
    CHECK_OK(devbuf_queue_wait(queue, gate, round)); // both come in one batch
    devbuf_use_t write = {used, DEVBUF_ACCESS_WRITE};
    CHECK_OK(devbuf_queue_submit(queue, test_set_words, &write, 1, &round, sizeof round));
    memset(read_inside, 0, sizeof read_inside);
    CHECK_OK(devbuf_queue_submit(queue, read_earlier_writes, NULL, 0, NULL, 0));
    CHECK_OK(devbuf_event_signal(gate, round));
    CHECK_OK(devbuf_queue_finish(queue));
    CHECK(read_inside[2] == 1);
    CHECK_EQ_U(seen[0], DEVBUF_OK);
    CHECK_EQ_U(seen[1], DEVBUF_OK);
    CHECK_EQ_U(seen[2], DEVBUF_OK);
    CHECK_EQ_U(read_inside[0], round);
    CHECK_EQ_U(read_inside[1], round);
  }
  devbuf_event_release(gate);
}

// A kernel that blocks on another queue's work, which waits for an earlier item of the
// kernel's own batch: that item has run, and retires before the kernel blocks (it stayed in
// the batch, unretired, and the three waited for each other for good). Each way to block:
// a copyout of bytes the other queue writes, an event it signals, finishing it, and a
// submission to it while it is full.
enum { BLOCK_COPYOUT, BLOCK_EVENT, BLOCK_FINISH, BLOCK_SUBMIT_TO_FULL, BLOCKS };
static devbuf_buffer_t *copied;
static devbuf_event_t *copied_event;
static devbuf_status do_nothing(const devbuf_kernel_args_t *args) {
  (void)args;
  return DEVBUF_OK;
}

static devbuf_status block_on_other_queue(const devbuf_kernel_args_t *args) {
  int how;
  memcpy(&how, args->scalars, sizeof how);
  uint32_t words[16] = {0};
  devbuf_status status = how == BLOCK_EVENT    ? devbuf_event_wait(copied_event, 1, UINT64_MAX)
                         : how == BLOCK_FINISH ? devbuf_queue_finish(other_queue)
                         : how == BLOCK_SUBMIT_TO_FULL // room comes once the copy is done
                             ? devbuf_queue_submit(other_queue, do_nothing, NULL, 0, NULL, 0)
                             : DEVBUF_OK;
  if (status == DEVBUF_OK && how == BLOCK_SUBMIT_TO_FULL) status = devbuf_queue_finish(other_queue);
  if (status == DEVBUF_OK) status = devbuf_buffer_copyout(copied, words, sizeof words);
  return status != DEVBUF_OK ? status
         : words[15] == 7    ? DEVBUF_OK
                             : devbuf_set_error(DEVBUF_DEVICE_FAILURE, "read %u", words[15]);
}

static void test_block_on_work_that_waits_for_the_batch(void) {
  size_t count = 16;
  CHECK_OK(
      devbuf_buffer_new(devbuf_device_allocator(device), DEVBUF_UINT32, &count, 1, 0, &copied));
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_event_create(0, &gate));
  for (int how = 0; how < BLOCKS; how++) {
    CHECK_OK(devbuf_event_create(0, &copied_event));
    uint32_t seven = 7;
    CHECK_OK(devbuf_queue_wait(queue, gate, (uint64_t)how + 1)); // the rest come in one batch
    devbuf_use_t write = {used, DEVBUF_ACCESS_WRITE};
    CHECK_OK(devbuf_queue_submit(queue, test_set_words, &write, 1, &seven, sizeof seven));
    CHECK_OK(devbuf_queue_submit(queue, block_on_other_queue, NULL, 0, &how, sizeof how));
    CHECK_OK(devbuf_queue_set_depth(
        other_queue, how == BLOCK_SUBMIT_TO_FULL ? 2 : DEVBUF_QUEUE_DEFAULT_DEPTH, 0));
    CHECK_OK(devbuf_queue_copy(other_queue, copied, used));      // after the write only
    CHECK_OK(devbuf_queue_signal(other_queue, copied_event, 1)); // full at a depth of 2
    CHECK_OK(devbuf_event_signal(gate, (uint64_t)how + 1));
    CHECK_OK(devbuf_queue_finish(queue));
    CHECK_OK(devbuf_queue_finish(other_queue));
    devbuf_event_release(copied_event);
  }
  CHECK_OK(devbuf_queue_set_depth(other_queue, DEVBUF_QUEUE_DEFAULT_DEPTH, 0));
  devbuf_event_release(gate);
  devbuf_buffer_release(copied);
}

// The same calls from the host, once the work is done, answer OK: the refusal is only
// for the worker's own thread.
static void test_from_host_thread(void) {
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_OK(devbuf_queue_cancel(queue));
  CHECK_OK(devbuf_device_synchronize(device));
  CHECK_OK(devbuf_buffer_wait(used));
}

int main(void) {
  alarm(120); // a wait for itself would hang: fail instead
  setup();
  RUN(test_from_cpu_kernel);
  RUN(test_from_host_task);
  RUN(test_run_by_finish);
  RUN(test_earlier_items_are_done);
  RUN(test_block_on_work_that_waits_for_the_batch);
  RUN(test_from_host_thread);
  teardown();
  return CHECK_EXIT();
}
