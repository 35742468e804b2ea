// A child forked while the parent's threads submit work, allocate and release: whatever
// lock those threads held at the fork, the child makes events of its own and uses the CPU
// device (docs/processes.md), and never hangs. The parent's queues refuse the child, and the
// parent's queued work on a buffer does not hold up the child's reads of it.
#include "check.h"

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SUBMITTERS 2
#define CHILDREN   60
#define WORDS      1024

static atomic_bool stop;
static devbuf_device_t *cpu;
static devbuf_queue_t *parent_queue;

static devbuf_status add_one(const devbuf_kernel_args_t *args) {
  uint32_t *words = args->data[0];
  for (size_t i = 0; i < args->sizes[0] / sizeof *words; i++) words[i]++;
  return DEVBUF_OK;
}

// Keeps the submission lock, the item pool and the allocator busy: fresh buffers each
// round, released while their work may still run (so their bytes go back in flight).
static void *submitter(void *unused) {
  (void)unused;
  devbuf_queue_t *queue = NULL;
  if (devbuf_queue_create(cpu, &queue) != DEVBUF_OK) return NULL;
  size_t shape[] = {WORDS};
  while (!atomic_load(&stop)) {
    devbuf_buffer_t *buffer = NULL;
    if (devbuf_buffer_new(devbuf_device_allocator(cpu), DEVBUF_UINT32, shape, 1, 0, &buffer) !=
        DEVBUF_OK)
      continue;
    devbuf_use_t use = {buffer, DEVBUF_ACCESS_READ_WRITE};
    for (int i = 0; i < 8; i++) (void)devbuf_queue_submit(queue, add_one, &use, 1, NULL, 0);
    devbuf_buffer_release(buffer);
  }
  devbuf_queue_finish(queue);
  devbuf_queue_release(queue);
  return NULL;
}

// What the child does: 0 when all of it worked, else the number of the step that failed.
static int child_work(void) {
  if (devbuf_queue_submit(parent_queue, add_one, NULL, 0, NULL, 0) != DEVBUF_INVALID_ARGUMENT ||
      !strstr(devbuf_last_error(), "forked"))
    return 1;
  // Refused before the queue's lock, which a parent's thread may have held at the fork.
  if (devbuf_queue_status(parent_queue) != DEVBUF_INVALID_ARGUMENT ||
      !strstr(devbuf_last_error(), "forked"))
    return 14;
  if (devbuf_queue_set_depth(parent_queue, 8, 0) != DEVBUF_INVALID_ARGUMENT ||
      !strstr(devbuf_last_error(), "forked"))
    return 15;
  devbuf_device_t *device = NULL;
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) return 2;
  devbuf_queue_t *queue = NULL;
  if (devbuf_queue_create(device, &queue) != DEVBUF_OK) return 3;
  size_t shape[] = {WORDS};
  devbuf_buffer_t *buffer = NULL;
  if (devbuf_buffer_new(devbuf_device_allocator(device), DEVBUF_UINT32, shape, 1, 0, &buffer) !=
      DEVBUF_OK)
    return 4;
  devbuf_use_t use = {buffer, DEVBUF_ACCESS_WRITE};
  uint32_t value = 41;
  if (devbuf_queue_submit(queue, test_set_words, &use, 1, &value, sizeof value) != DEVBUF_OK)
    return 5;
  use.access = DEVBUF_ACCESS_READ_WRITE;
  if (devbuf_queue_submit(queue, add_one, &use, 1, NULL, 0) != DEVBUF_OK) return 6;
  devbuf_event_t *event = NULL;
  if (devbuf_event_create(0, &event) != DEVBUF_OK) return 7;
  if (devbuf_queue_signal(queue, event, 1) != DEVBUF_OK) return 8;
  if (devbuf_event_wait(event, 1, 5000000000ull) != DEVBUF_OK) return 9;
  if (devbuf_queue_finish(queue) != DEVBUF_OK) return 10;
  if (devbuf_device_synchronize(device) != DEVBUF_OK) return 11;
  uint32_t words[WORDS];
  if (devbuf_buffer_copyout(buffer, words, sizeof words) != DEVBUF_OK) return 12;
  for (size_t i = 0; i < WORDS; i++)
    if (words[i] != 42) return 13;
  devbuf_event_release(event);
  devbuf_buffer_release(buffer);
  devbuf_queue_release(queue);
  devbuf_device_release(device);
  return 0;
}

// Waits up to 5 s for the child; kills it after that. Its exit status, or -1 for a hang.
static int wait_child(pid_t child) {
  for (int tick = 0; tick < 500; tick++) {
    int status = 0;
    if (waitpid(child, &status, WNOHANG) == child)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  // Where it hangs, for the log (when gdb is there).
  char command[128];
  snprintf(command, sizeof command, "gdb -p %d -batch -ex 'thread apply all bt' </dev/null 1>&2",
           (int)child);
  if (system(command) != 0) fprintf(stderr, "(no backtrace: gdb is missing or failed)\n");
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  return -1;
}

static void test_fork_while_submitting(void) {
  CHECK_OK(devbuf_device_open("cpu", &cpu));
  CHECK_OK(devbuf_queue_create(cpu, &parent_queue));
  pthread_t threads[SUBMITTERS];
  for (int i = 0; i < SUBMITTERS; i++) pthread_create(&threads[i], NULL, submitter, NULL);
  int hung = 0, failed = 0;
  for (int i = 0; i < CHILDREN; i++) {
    nanosleep(&(struct timespec){0, 1000000 + (i % 7) * 300000}, NULL);
    pid_t child = fork();
    if (child == 0) _exit(child_work());
    CHECK(child > 0);
    int code = wait_child(child);
    if (code == -1) hung++;
    if (code > 0) {
      fprintf(stderr, "child %d failed at step %d\n", i, code);
      failed++;
    }
  }
  atomic_store(&stop, true);
  for (int i = 0; i < SUBMITTERS; i++) pthread_join(threads[i], NULL);
  CHECK_EQ_U(hung, 0);
  CHECK_EQ_U(failed, 0);
  devbuf_queue_release(parent_queue);
  devbuf_device_release(cpu);
}

// The child of a parent whose queue still holds a write of a buffer: that work never runs in
// the child (it counts as done there), so the child's reads of its copy of the bytes answer
// at once instead of waiting for good.
static int child_reads(devbuf_buffer_t *buffer) {
  uint32_t words[WORDS];
  const void *data = NULL;
  if (devbuf_buffer_copyout(buffer, words, sizeof words) != DEVBUF_OK) return 1;
  if (words[0] != 7) return 2; // the bytes as they were at the fork
  if (devbuf_buffer_wait(buffer) != DEVBUF_OK) return 3;
  if (devbuf_buffer_in_use(buffer)) return 4;
  if (devbuf_buffer_contents(buffer, &data, NULL) != DEVBUF_OK) return 5;
  devbuf_buffer_end_access(buffer, data);
  return 0;
}

static void test_parent_work_in_flight(void) {
  CHECK_OK(devbuf_device_open("cpu", &cpu));
  CHECK_OK(devbuf_queue_create(cpu, &parent_queue));
  size_t shape[] = {WORDS};
  devbuf_buffer_t *buffer = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_buffer_new(devbuf_device_allocator(cpu), DEVBUF_UINT32, shape, 1, 0, &buffer));
  uint32_t seven[WORDS];
  for (size_t i = 0; i < WORDS; i++) seven[i] = 7;
  CHECK_OK(devbuf_buffer_copyin(buffer, seven, sizeof seven));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_queue_wait(parent_queue, gate, 1));
  devbuf_use_t use = {buffer, DEVBUF_ACCESS_WRITE};
  uint32_t value = 9;
  CHECK_OK(devbuf_queue_submit(parent_queue, test_set_words, &use, 1, &value, sizeof value));
  pid_t child = fork();
  if (child == 0) _exit(child_reads(buffer));
  CHECK(child > 0);
  CHECK_EQ_U(wait_child(child), 0);
  CHECK(devbuf_buffer_in_use(buffer)); // the parent's work is its own to wait for
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(parent_queue));
  uint32_t words[WORDS];
  CHECK_OK(devbuf_buffer_copyout(buffer, words, sizeof words));
  CHECK_EQ_U(words[WORDS - 1], 9);
  devbuf_event_release(gate);
  devbuf_buffer_release(buffer);
  devbuf_queue_release(parent_queue);
  devbuf_device_release(cpu);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED_ALLOCATOR 1
#endif
#endif

int main(void) {
#ifdef SANITIZED_ALLOCATOR
  // Seen here: a child hung in ASan's malloc, whose lock another thread held at the fork.
  printf("SKIP: the sanitizer's allocator has no fork handlers: a child forked while other "
         "threads allocate can hang inside malloc, whatever devbuf does\n");
  return SKIP_EXIT_CODE;
#endif
  RUN(test_fork_while_submitting);
  RUN(test_parent_work_in_flight);
  return CHECK_EXIT();
}
