// Sharing with other processes on the CPU: the lifetime of exported memory (an importer
// killed with SIGKILL mid-use gives it back), events that order one process's queue after
// another's writes, waits whose signaller dies or fails, and hostile messages. Every other
// process is this program run again with a role, as a user's would be started.
#include "../src/core/core.h"
#include "check.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stddef.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *self_path;
static devbuf_device_t *device;
static devbuf_allocator_t *shareable;

static pid_t start_role(const char *role, int socket) {
  char fd_text[16];
  snprintf(fd_text, sizeof fd_text, "%d", socket);
  pid_t child = fork();
  if (child == 0) {
    execl(self_path, self_path, role, fd_text, (char *)NULL);
    _exit(127);
  }
  return child;
}

// A socket pair, the child started with one end; the other end is the caller's.
static pid_t start_with_socket(const char *role, int *out_socket) {
  int sockets[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) == 0);
  CHECK(fcntl(sockets[1], F_SETFD, 0) == 0); // the child's end crosses exec
  pid_t child = start_role(role, sockets[1]);
  close(sockets[1]);
  *out_socket = sockets[0];
  return child;
}

static char read_byte(int socket) {
  char byte = 0;
  return read(socket, &byte, 1) == 1 ? byte : 0;
}

static void write_byte(int socket, char byte) { CHECK(write(socket, &byte, 1) == 1); }

static int reap(pid_t child) {
  int status = -1;
  CHECK(waitpid(child, &status, 0) == child);
  return WIFEXITED(status) ? WEXITSTATUS(status)
                           : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static devbuf_buffer_t *shared_bytes(size_t size) {
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_buffer_allocate(shareable, DEVBUF_UINT8, &size, 1, DEVBUF_BUFFER_ZERO, &buffer));
  return buffer;
}

static devbuf_allocator_stats_t stats_now(void) {
  devbuf_allocator_stats_t stats = {0};
  CHECK_OK(devbuf_allocator_stats(shareable, &stats));
  return stats;
}

// ---- roles of the other processes ----

// Imports a buffer, says so, then writes it until it is killed.
static int role_hold_and_write(int socket) {
  devbuf_export_t *shared = NULL;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_export_receive(socket, &shared));
  CHECK_OK(devbuf_buffer_import(device, shared, &buffer));
  devbuf_export_free(shared);
  void *data = NULL;
  size_t size = 0;
  CHECK_OK(devbuf_buffer_contents_mut(buffer, &data, &size));
  write_byte(socket, check_failures ? 'F' : 'k');
  for (unsigned round = 0;; round++) { // until killed; a closed socket ends it too
    memset(data, (int)(round & 0xff), size);
    if (send(socket, "", 0, MSG_NOSIGNAL) < 0) break;
  }
  return 1;
}

static devbuf_status copy_kernel(const devbuf_kernel_args_t *args) {
  memcpy(args->data[1], args->data[0], args->sizes[0]);
  return DEVBUF_OK;
}

// Receives an event and a buffer; its queue waits for the event before it copies the
// buffer, submitted before the exporter has written it. Reports what the copy saw.
static int role_wait_then_read(int socket) {
  devbuf_export_t *event_export = NULL, *buffer_export = NULL;
  devbuf_event_t *written = NULL;
  devbuf_buffer_t *input = NULL;
  CHECK_OK(devbuf_export_receive(socket, &event_export));
  CHECK_OK(devbuf_export_receive(socket, &buffer_export));
  CHECK_STATUS(devbuf_buffer_import(device, event_export, &input), DEVBUF_INVALID_ARGUMENT);
  CHECK_OK(devbuf_event_import(event_export, &written));
  CHECK_OK(devbuf_buffer_import(device, buffer_export, &input));
  devbuf_export_free(event_export);
  devbuf_export_free(buffer_export);
  if (!written || !input) return 1;
  CHECK_STATUS(devbuf_event_signal(written, 5), DEVBUF_INVALID_ARGUMENT); // only its exporter
  CHECK_MESSAGE("only its exporting process signals it");
  devbuf_export_t *again = NULL;
  CHECK_STATUS(devbuf_event_export(written, &again), DEVBUF_UNSUPPORTED);
  CHECK_STATUS(devbuf_event_wait(written, 1, 1000000), DEVBUF_TIMEOUT); // not yet signalled
  size_t size = devbuf_buffer_size(input);
  devbuf_buffer_t *copy = shared_bytes(size);
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_STATUS(devbuf_queue_signal(queue, written, 9), DEVBUF_INVALID_ARGUMENT);
  CHECK_OK(devbuf_queue_wait(queue, written, 1));
  devbuf_use_t uses[2] = {{input, DEVBUF_ACCESS_READ}, {copy, DEVBUF_ACCESS_WRITE}};
  CHECK_OK(devbuf_queue_submit(queue, copy_kernel, uses, 2, NULL, 0));
  write_byte(socket, 'r'); // submitted: now the exporter writes and signals
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_EQ_U(devbuf_event_value(written), 1);
  const unsigned char *seen = NULL;
  CHECK_OK(devbuf_buffer_contents(copy, (const void **)&seen, NULL));
  size_t matching = 0;
  for (size_t i = 0; i < size; i++) matching += seen[i] == 0x42;
  CHECK_EQ_U(matching, size);
  CHECK_OK(devbuf_buffer_end_access(copy, seen));
  devbuf_queue_release(queue);
  devbuf_buffer_release(copy);
  devbuf_buffer_release(input);
  devbuf_event_release(written);
  write_byte(socket, check_failures ? 'F' : 'k');
  return CHECK_EXIT();
}

static devbuf_status failing_kernel(const devbuf_kernel_args_t *args) {
  (void)args;
  return devbuf_set_error(DEVBUF_IO_ERROR, "the exporter's kernel failed on purpose");
}

// Exports an event, signals 1, then: waits to be killed ("die"), releases it ("release"),
// or fails it through its queue ("fail"), and waits for the other side to finish.
static int role_signal(int socket, const char *then) {
  devbuf_event_t *event = NULL;
  devbuf_export_t *shared = NULL;
  CHECK_OK(devbuf_event_create(0, &event));
  CHECK_OK(devbuf_event_export(event, &shared));
  CHECK_OK(devbuf_export_send(shared, socket));
  devbuf_export_free(shared);
  CHECK_OK(devbuf_event_signal(event, 1));
  if (strcmp(then, "die") == 0) {
    write_byte(socket, 'k');
    for (;;) pause();
  }
  if (strcmp(then, "fork-exec") == 0 && fork() == 0) { // a child that outlives the exec
    prctl(PR_SET_PDEATHSIG, SIGKILL);                  // and goes with the sleep
    for (;;) pause();
  }
  if (strncmp(then, "exec", 4) == 0 || strcmp(then, "fork-exec") == 0) {
    // the pid lives on, the exporting program does not
    write_byte(socket, 'k');
    execl("/bin/sleep", "sleep", "60", (char *)NULL);
    return 1;
  }
  if (strcmp(then, "release") == 0) {
    devbuf_event_release(event);
  } else {
    devbuf_queue_t *queue = NULL;
    CHECK_OK(devbuf_queue_create(device, &queue));
    // The kernel waits until the signal is queued behind it: a queue that failed already
    // refuses the signal instead (the worker may be that quick).
    devbuf_event_t *go = NULL;
    CHECK_OK(devbuf_event_create(0, &go));
    CHECK_OK(devbuf_queue_wait(queue, go, 1));
    CHECK_OK(devbuf_queue_submit(queue, failing_kernel, NULL, 0, NULL, 0));
    CHECK_OK(devbuf_queue_signal(queue, event, 2));
    CHECK_OK(devbuf_event_signal(go, 1));
    CHECK_STATUS(devbuf_queue_finish(queue), DEVBUF_IO_ERROR);
    devbuf_queue_release(queue);
    devbuf_event_release(go);
  }
  write_byte(socket, 'k');
  read_byte(socket); // until the other side has seen it
  if (strcmp(then, "release") != 0) devbuf_event_release(event);
  return CHECK_EXIT();
}

static uint64_t now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

static void sleep_ns(long ns) {
  struct timespec pause_for = {ns / 1000000000, ns % 1000000000};
  nanosleep(&pause_for, NULL);
}

#define TIMED_RAISES 7

// Exports an event; each time the other side says it waits, raises the event 30 ms later
// (long after the waiter stopped spinning: it sleeps) and sends when it raised.
static int role_signal_timed(int socket) {
  devbuf_event_t *event = NULL;
  devbuf_export_t *shared = NULL;
  CHECK_OK(devbuf_event_create(0, &event));
  CHECK_OK(devbuf_event_export(event, &shared));
  CHECK_OK(devbuf_export_send(shared, socket));
  devbuf_export_free(shared);
  for (uint64_t k = 1; k <= TIMED_RAISES; k++) {
    CHECK(read_byte(socket) == 'w');
    sleep_ns(30000000);
    uint64_t raised = now_ns();
    CHECK_OK(devbuf_event_signal(event, k));
    CHECK(write(socket, &raised, sizeof raised) == (ssize_t)sizeof raised);
  }
  read_byte(socket); // until the other side has seen it
  devbuf_event_release(event);
  return CHECK_EXIT();
}

// A hostile importer: it maps the sleepers' word of the event it receives and scribbles on
// it (mostly "nobody sleeps", sometimes all ones, and it punches the page out of the file)
// until told to stop. It also tries to cut the file and to seal it against the others.
static int role_scribble_sleepers(int socket) {
  devbuf_export_t *shared = NULL;
  CHECK_OK(devbuf_export_receive(socket, &shared));
  if (!shared) return 1;
  int fd = shared->fds[DEVBUF__EXPORT_SLEEPERS];
  _Atomic uint32_t *word = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(word != MAP_FAILED);
  if (word == MAP_FAILED) return 1;
  CHECK(ftruncate(fd, 0) != 0);        // sealed against shrinking: the exporter never faults
  CHECK(ftruncate(fd, 1u << 20) != 0); // and growing
  CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) != 0); // would keep others from mapping it
  write_byte(socket, check_failures ? 'F' : 'r');
  for (unsigned round = 0;; round++) {
    atomic_store(word, round % 8 == 7 ? UINT32_MAX : 0);
    if (round % 64 == 0) fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096);
    char stop = 0;
    if (recv(socket, &stop, 1, MSG_DONTWAIT) == 1) break;
    sleep_ns(20000);
  }
  munmap(word, 4096);
  devbuf_export_free(shared);
  write_byte(socket, check_failures ? 'F' : 'k');
  return CHECK_EXIT();
}

// ---- tests ----

// Starts an importer that writes `buffer` until it is killed, hands it the buffer, and
// releases the exporter's handle once the importer holds it.
static pid_t hand_to_writer(devbuf_buffer_t *buffer, int *out_socket) {
  pid_t child = start_with_socket("hold-and-write", out_socket);
  devbuf_export_t *shared = NULL;
  CHECK_OK(devbuf_buffer_export(buffer, &shared));
  CHECK_OK(devbuf_export_send(shared, *out_socket));
  devbuf_export_free(shared);
  CHECK(read_byte(*out_socket) == 'k');
  devbuf_buffer_release(buffer);
  return child;
}

// The importer is killed while it writes the buffer: until then the exporter's memory is
// not reused although the exporter released it; then it comes back and serves again.
static void test_killed_importer_gives_memory_back(void) {
  size_t size = 4u << 20;
  devbuf_buffer_t *exported = shared_bytes(size);
  uint64_t exported_at = place_of(exported);
  int socket = -1;
  pid_t child = hand_to_writer(exported, &socket);
  uint64_t held = 0;
  CHECK_OK(devbuf_export_reclaim(&held));
  CHECK_EQ_U(held, size);
  devbuf_allocator_stats_t before = stats_now();
  CHECK_EQ_U(before.active, size); // still counted: nobody else may have it

  devbuf_buffer_t *other = shared_bytes(size); // another buffer of the same size ...
  CHECK(place_of(other) != exported_at);       // ... does not get the importer's bytes
  uint64_t other_at = place_of(other);
  devbuf_buffer_release(other);
  other = shared_bytes(size);
  CHECK(place_of(other) == other_at); // while memory nobody imported is reused as ever

  CHECK(kill(child, SIGKILL) == 0);
  CHECK_EQ_U(reap(child), 128 + SIGKILL);
  close(socket);
  CHECK_OK(devbuf_export_reclaim(&held));
  CHECK_EQ_U(held, 0);
  devbuf_allocator_stats_t after = stats_now();
  CHECK_EQ_U(after.active, size); // only `other`
  devbuf_buffer_t *again = shared_bytes(size);
  CHECK(place_of(again) == exported_at); // the importer's bytes serve again, from the cache
  CHECK_EQ_U(stats_now().system_allocs, after.system_allocs);
  devbuf_buffer_release(again);
  devbuf_buffer_release(other);
}

// Memory kept for an importer comes back without an explicit reclaim once the importer is
// gone: the next allocations from the shareable allocator look.
static void test_allocations_reclaim(void) {
  size_t size = 1u << 20;
  int socket = -1;
  pid_t child = hand_to_writer(shared_bytes(size), &socket);
  CHECK(kill(child, SIGKILL) == 0);
  reap(child);
  close(socket);
  uint64_t active = stats_now().active;
  CHECK_EQ_U(active, size);
  for (int i = 0; i < 100 && active; i++) { // reclaim runs at most once a millisecond
    struct timespec pause_for = {0, 2000000};
    nanosleep(&pause_for, NULL);
    devbuf_buffer_release(shared_bytes(4096));
    active = stats_now().active;
  }
  CHECK_EQ_U(active, 0);
}

// Process B's queue waits for process A's event before it reads A's buffer; A writes and
// signals only once B has submitted, later.
static void test_event_orders_another_process(void) {
  size_t size = 1u << 20;
  devbuf_buffer_t *data = shared_bytes(size);
  devbuf_event_t *written = NULL;
  CHECK_OK(devbuf_event_create(0, &written));
  int socket = -1;
  pid_t child = start_with_socket("wait-then-read", &socket);
  devbuf_export_t *shared = NULL;
  CHECK_OK(devbuf_event_export(written, &shared));
  CHECK_OK(devbuf_export_send(shared, socket));
  devbuf_export_free(shared);
  CHECK_OK(devbuf_buffer_export(data, &shared));
  CHECK_OK(devbuf_export_send(shared, socket));
  devbuf_export_free(shared);
  CHECK(read_byte(socket) == 'r');
  struct timespec later = {0, 50000000}; // the reader would have read zeros by now
  nanosleep(&later, NULL);
  devbuf_queue_t *queue = NULL;
  unsigned char byte = 0x42;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_fill(queue, data, &byte, 1));
  CHECK_OK(devbuf_queue_signal(queue, written, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK(read_byte(socket) == 'k');
  CHECK_EQ_U(reap(child), 0);
  close(socket);
  devbuf_queue_release(queue);
  devbuf_event_release(written);
  devbuf_buffer_release(data);
}

static devbuf_event_t *receive_event(int socket) {
  devbuf_export_t *shared = NULL;
  devbuf_event_t *event = NULL;
  CHECK_OK(devbuf_export_receive(socket, &shared));
  CHECK(devbuf_export_kind_of(shared) == DEVBUF_EXPORT_EVENT);
  CHECK_OK(devbuf_event_import(shared, &event));
  devbuf_export_free(shared);
  return event;
}

// The signalling process dies: a wait for a value it never signalled ends in an error, on
// the host and in a queue, long before its timeout; what it did signal still counts.
static void test_dead_signaller(void) {
  int socket = -1;
  pid_t child = start_with_socket("signal-die", &socket);
  devbuf_event_t *event = receive_event(socket);
  if (!event) return;
  CHECK_OK(devbuf_event_wait(event, 1, 10000000000u));
  CHECK(read_byte(socket) == 'k');
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_wait(queue, event, 2));
  CHECK(kill(child, SIGKILL) == 0); // not reaped yet: the waiter must not mistake the zombie
  CHECK_STATUS(devbuf_event_wait(event, 2, 60000000000u), DEVBUF_UNAVAILABLE);
  CHECK_MESSAGE("ended at value 1");
  CHECK_STATUS(devbuf_queue_finish(queue), DEVBUF_UNAVAILABLE);
  CHECK_OK(devbuf_event_wait(event, 1, 0));
  reap(child);
  close(socket);
  devbuf_queue_release(queue);
  devbuf_event_release(event);
}

// Starts an exporter in `role` that signals 1, then ends its event its own way: a wait for 2
// fails with `status` and a message that says why, long before its timeout; 1 still counts.
static void expect_end(const char *role, devbuf_status status, const char *why, bool kill_it) {
  int socket = -1;
  pid_t child = start_with_socket(role, &socket);
  devbuf_event_t *event = receive_event(socket);
  CHECK(read_byte(socket) == 'k');
  CHECK_STATUS(devbuf_event_wait(event, 2, 60000000000u), status);
  CHECK_MESSAGE(why);
  CHECK_OK(devbuf_event_wait(event, 1, 0));
  if (kill_it)
    CHECK(kill(child, SIGKILL) == 0);
  else
    write_byte(socket, 'k');
  int code = reap(child);
  if (!kill_it) CHECK_EQ_U(code, 0);
  close(socket);
  devbuf_event_release(event);
}

// The exporter execs another program (its pid lives on, but nothing will signal; a child it
// forked before, which inherited its descriptors, lives on too), releases its event, or its
// work fails.
static void test_exec_release_and_failure(void) {
  expect_end("signal-exec", DEVBUF_UNAVAILABLE, "ended at value 1", true);
  expect_end("signal-fork-exec", DEVBUF_UNAVAILABLE, "ended at value 1", true);
  expect_end("signal-release", DEVBUF_CANCELLED, "released the event at 1", false);
  expect_end("signal-fail", DEVBUF_IO_ERROR, "the exporter's kernel failed on purpose", false);
}

// ---- hostile messages ----

// Sends `header` with `fds` and receives it on the other end of a fresh pair.
static devbuf_status deliver(const void *bytes, size_t size, const int *fds, size_t fd_count,
                             devbuf_export_t **out) {
  int sockets[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sockets) == 0);
  CHECK_OK(devbuf__send_with_fds(sockets[0], bytes, size, fds, fd_count, NULL));
  close(sockets[0]); // a cut message then ends instead of blocking
  devbuf_status status = devbuf_export_receive(sockets[1], out);
  close(sockets[1]);
  return status;
}

static devbuf__export_header valid_header(size_t segment) {
  devbuf__export_header h = {.kind = DEVBUF_EXPORT_BUFFER,
                             .device_kind = DEVBUF_DEVICE_CPU,
                             .pid = (int32_t)getpid(),
                             .dtype = DEVBUF_FLOAT32,
                             .ndim = 2,
                             .storage_id = 7,
                             .segment_size = segment,
                             .storage_offset = 0,
                             .storage_size = segment,
                             .view_offset = 0,
                             .view_size = segment};
  memcpy(h.magic, DEVBUF__EXPORT_MAGIC, sizeof h.magic);
  h.shape[0] = segment / 64;
  h.shape[1] = 16;
  return h;
}

#define EXPECT_REFUSED(header_expr, fds, count, status, needle)             \
  do {                                                                      \
    devbuf__export_header h_ = (header_expr);                               \
    devbuf_export_t *got_ = NULL;                                           \
    CHECK_STATUS(deliver(&h_, sizeof h_, (fds), (count), &got_), (status)); \
    CHECK_MESSAGE(needle);                                                  \
    CHECK(got_ == NULL);                                                    \
  } while (0)

static devbuf__export_header with_magic(devbuf__export_header h, const char *magic) {
  memcpy(h.magic, magic, sizeof h.magic);
  return h;
}

// A hostile exporter lowers its page's value after raising it: the importer's timeline never
// goes down (its value, and its waits for values it reached, stay as they were).
typedef struct forged_timeline { // the page's layout (src/exec/event_share.c)
  char magic[8];
  _Atomic uint64_t value;
  _Atomic uint32_t changes, state;
  uint32_t failure;
  int32_t pid;
  char message[256];
} forged_timeline;

static void test_hostile_exporter_lowers_value(void) {
  int page_fd = -1, locked = -1;
  CHECK_OK(devbuf__memory_file_create("forged-timeline", 4096, &page_fd));
  forged_timeline *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, page_fd, 0);
  CHECK(page != MAP_FAILED);
  if (page == MAP_FAILED) return;
  memcpy(page->magic, "devbufE2", 8);
  page->pid = (int32_t)getpid();
  atomic_store(&page->value, 10);
  CHECK_OK(devbuf__lock_reopened(page_fd, &locked)); // the exporter's "alive" lock
  int sleepers_fd = -1;
  CHECK_OK(devbuf__memory_file_create("forged-sleepers", 4096, &sleepers_fd));
  devbuf__export_header event = valid_header(4096);
  event.kind = DEVBUF_EXPORT_EVENT;
  int self = devbuf__process_watch(getpid()), fds[3] = {page_fd, self, sleepers_fd};
  devbuf_export_t *got = NULL;
  devbuf_event_t *imported = NULL;
  CHECK_OK(deliver(&event, sizeof event, fds, 3, &got));
  CHECK_OK(devbuf_event_import(got, &imported));
  devbuf_export_free(got);
  if (imported) {
    CHECK_OK(devbuf_event_wait(imported, 10, 1000000000ull));
    CHECK_EQ_U(devbuf_event_value(imported), 10);
    atomic_store(&page->value, 3); // the hostile part
    atomic_fetch_add(&page->changes, 1);
    CHECK_OK(devbuf_event_wait(imported, 7, 0)); // reached before: still reached
    CHECK_EQ_U(devbuf_event_value(imported), 10);
    CHECK_STATUS(devbuf_event_wait(imported, 11, 1000000ull), DEVBUF_TIMEOUT);
    CHECK_MESSAGE("stayed at 10");
    devbuf_event_release(imported);
  }
  munmap(page, 4096);
  close(locked);
  close(page_fd);
  close(sleepers_fd);
  close(self);
}

// An importer that follows the sleepers' protocol by hand (src/exec/event_share.c): counted
// in, the value and the change count read again, then a futex wait of 10 s on the count.
typedef struct hand_sleeper {
  forged_timeline *page;
  _Atomic uint32_t *sleepers;
  uint64_t target, took_ns;
} hand_sleeper;

static void *sleep_by_hand(void *context) {
  hand_sleeper *sleeper = context;
  forged_timeline *page = sleeper->page;
  uint64_t start = now_ns();
  for (;;) {
    uint32_t seen = atomic_load(&page->changes);
    uint64_t published = atomic_load(&page->value);
    if (published >= sleeper->target || now_ns() - start > 30000000000u) break;
    atomic_fetch_add(sleeper->sleepers, 1);
    if (atomic_load(&page->value) == published && atomic_load(&page->changes) == seen) {
      struct timespec limit = {10, 0};
      syscall(SYS_futex, (uint32_t *)&page->changes, FUTEX_WAIT, seen, &limit, NULL, 0);
    }
    atomic_fetch_sub(sleeper->sleepers, 1);
  }
  sleeper->took_ns = now_ns() - start;
  return NULL;
}

// A raise wakes an importer that said it sleeps, at once: without that wake the importer above
// sleeps its whole 10 s. A raise while nobody sleeps leaves the change count alone.
static void test_sleeping_importer_is_woken(void) {
  devbuf_event_t *event = NULL;
  devbuf_export_t *shared = NULL;
  CHECK_OK(devbuf_event_create(0, &event));
  CHECK_OK(devbuf_event_export(event, &shared));
  if (!shared) return;
  forged_timeline *page =
      mmap(NULL, 4096, PROT_READ, MAP_SHARED, shared->fds[DEVBUF__EXPORT_MEMORY], 0);
  _Atomic uint32_t *sleepers =
      mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, shared->fds[DEVBUF__EXPORT_SLEEPERS], 0);
  devbuf_export_free(shared);
  CHECK(page != MAP_FAILED && sleepers != MAP_FAILED);
  if (page == MAP_FAILED || sleepers == MAP_FAILED) return;
  uint32_t changes = atomic_load(&page->changes);
  CHECK_OK(devbuf_event_signal(event, 1));
  CHECK_EQ_U(atomic_load(&page->value), 1);
  CHECK_EQ_U(atomic_load(&page->changes), changes);

  hand_sleeper sleeper = {.page = page, .sleepers = sleepers, .target = 2};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, sleep_by_hand, &sleeper) == 0);
  for (int tries = 0; tries < 5000 && atomic_load(sleepers) == 0; tries++) sleep_ns(1000000);
  sleep_ns(20000000); // in its futex wait by now (were it not, the raise's count stops it)
  CHECK_OK(devbuf_event_signal(event, 2));
  pthread_join(thread, NULL);
  CHECK(sleeper.took_ns < 5000000000u);
  CHECK_EQ_U(atomic_load(sleepers), 0);
  munmap(page, 4096);
  munmap(sleepers, 4096);
  devbuf_event_release(event);
}

// Two threads of the exporter raise one exported event at once, round after round: in round
// r this thread raises 2r and the other 2r - 1 (refused if it comes after the higher one),
// the other starting ahead by a head start swept from round to round, so that either comes
// first. Each raise swaps its value onto the page and puts back a higher one it swapped out,
// so after every round the page holds the round's highest, as the event does. (The window
// in which two raises overlap is a few nanoseconds: a raise that lost the higher value is
// seldom caught here.)
enum { RACING_ROUNDS = 20000 };
typedef struct racing_raiser {
  devbuf_event_t *event;
  _Atomic uint64_t started, finished; // rounds
} racing_raiser;

static void *raise_odd_values(void *context) {
  racing_raiser *r = context;
  for (uint64_t round = 1; round <= RACING_ROUNDS; round++) {
    while (atomic_load(&r->started) < round) {
    }
    devbuf_status status = devbuf_event_signal(r->event, 2 * round - 1);
    CHECK(status == DEVBUF_OK || status == DEVBUF_INVALID_ARGUMENT); // below the other's
    atomic_store(&r->finished, round);
  }
  return NULL;
}

static void test_racing_raisers(void) {
  racing_raiser r = {0};
  devbuf_export_t *shared = NULL;
  CHECK_OK(devbuf_event_create(0, &r.event));
  CHECK_OK(devbuf_event_export(r.event, &shared));
  if (!shared) return;
  const forged_timeline *page =
      mmap(NULL, 4096, PROT_READ, MAP_SHARED, shared->fds[DEVBUF__EXPORT_MEMORY], 0);
  devbuf_export_free(shared);
  CHECK(page != MAP_FAILED);
  if (page == MAP_FAILED) return;
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, raise_odd_values, &r) == 0);
  unsigned behind = 0; // rounds that left the page below the event
  for (uint64_t round = 1; round <= RACING_ROUNDS; round++) {
    atomic_store(&r.started, round);
    for (volatile unsigned delay = 0; delay < round % 257; delay++) { // sweeps the other's
    }                                                                 // head start
    CHECK_OK(devbuf_event_signal(r.event, 2 * round));
    while (atomic_load(&r.finished) < round) {
    }
    behind += atomic_load(&page->value) != 2 * round;
  }
  pthread_join(thread, NULL);
  CHECK_EQ_U(behind, 0);
  CHECK_EQ_U(devbuf_event_value(r.event), 2 * RACING_ROUNDS);
  munmap((void *)page, 4096);
  devbuf_event_release(r.event);
}

static int by_value(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

// An exporter raises its event step by step, then releases it, while a host wait on its
// import (here, in the same process) waits for each value in turn: a value the exporter
// reached succeeds, also when the release is mirrored between the wait's look at the value
// and its look at the failure (it answered CANCELLED, "released the event at 15", for 15).
typedef struct raiser {
  devbuf_event_t *event;
  uint64_t top;
  unsigned pause_us;
} raiser;

static void *raise_then_release(void *arg) {
  raiser *r = arg;
  for (uint64_t v = 1; v <= r->top; v++) {
    devbuf_event_signal(r->event, v);
    if (r->pause_us) usleep(r->pause_us);
  }
  devbuf_event_release(r->event);
  return NULL;
}

static void test_waits_for_values_reached_before_a_release(void) {
  uint64_t rng = 12345;
  int wrong = 0;
  for (int round = 0; round < 300; round++) {
    devbuf_event_t *event = NULL, *imported = NULL;
    devbuf_export_t *shared = NULL;
    CHECK_OK(devbuf_event_create(0, &event));
    CHECK_OK(devbuf_event_export(event, &shared));
    CHECK_OK(devbuf_event_import(shared, &imported));
    devbuf_export_free(shared);
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    raiser r = {event, 1 + (rng >> 33) % 30, (unsigned)((rng >> 17) % 200)};
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, raise_then_release, &r) == 0);
    for (uint64_t v = 1; v <= r.top; v++)
      if (devbuf_event_wait(imported, v, 3000000000ull) != DEVBUF_OK) {
        if (!wrong++)
          printf("     round %d, value %llu of %llu: %s\n", round, (unsigned long long)v,
                 (unsigned long long)r.top, devbuf_last_error());
        break;
      }
    CHECK_STATUS(devbuf_event_wait(imported, r.top + 1, 3000000000ull), DEVBUF_CANCELLED);
    pthread_join(thread, NULL);
    devbuf_event_release(imported);
  }
  CHECK_EQ_U(wrong, 0);
}

// Host waits in another process sleep once they have spun; each raise wakes them at once.
// Without the wake they would notice at the end of their 20 ms slice (the raises come 30 ms
// after the wait began, about 10 ms into a slice).
static void test_sleeping_waits_wake_at_once(void) {
  int socket = -1;
  pid_t child = start_with_socket("signal-timed", &socket);
  devbuf_event_t *event = receive_event(socket);
  uint64_t latency[TIMED_RAISES] = {0};
  for (uint64_t k = 1; event && k <= TIMED_RAISES; k++) {
    write_byte(socket, 'w');
    CHECK_OK(devbuf_event_wait(event, k, 10000000000u));
    uint64_t woken = now_ns(), raised = 0;
    CHECK(read(socket, &raised, sizeof raised) == (ssize_t)sizeof raised);
    latency[k - 1] = woken > raised ? woken - raised : 0;
  }
  qsort(latency, TIMED_RAISES, sizeof *latency, by_value);
  if (latency[TIMED_RAISES / 2] >= 5000000u)
    fprintf(stderr, "woken %.2f ms after the raise (median of %d)\n",
            latency[TIMED_RAISES / 2] / 1e6, TIMED_RAISES);
  CHECK(latency[TIMED_RAISES / 2] < 5000000u);
  write_byte(socket, 'k');
  CHECK_EQ_U(reap(child), 0);
  close(socket);
  devbuf_event_release(event);
}

typedef struct honest_waits {
  devbuf_event_t *event;
  uint64_t first, count;
  int failed;
} honest_waits;

static void *wait_honestly(void *context) {
  honest_waits *waits = context;
  for (uint64_t k = waits->first; k < waits->first + waits->count; k++)
    if (devbuf_event_wait(waits->event, k, 2000000000u) != DEVBUF_OK) waits->failed++;
  return NULL;
}

// A hostile importer scribbles on the sleepers' word: the exporter's raises neither hang nor
// fault, and an honest importer's sleeping waits still end (woken, or with their slice).
static void test_hostile_importer_scribbles_sleepers(void) {
  devbuf_event_t *event = NULL, *honest = NULL;
  CHECK_OK(devbuf_event_create(0, &event));
  int socket = -1;
  pid_t child = start_with_socket("scribble-sleepers", &socket);
  devbuf_export_t *shared = NULL;
  CHECK_OK(devbuf_event_export(event, &shared));
  CHECK_OK(devbuf_export_send(shared, socket));
  devbuf_export_free(shared);
  CHECK_OK(devbuf_event_export(event, &shared));
  CHECK_OK(devbuf_event_import(shared, &honest)); // in this process: the same pages
  devbuf_export_free(shared);
  CHECK(read_byte(socket) == 'r');
  if (!honest) return;
  uint64_t start = now_ns(), raises = 100000;
  for (uint64_t k = 1; k <= raises; k++) CHECK_OK(devbuf_event_signal(event, k));
  CHECK(now_ns() - start < 10000000000u);
  honest_waits waits = {.event = honest, .first = raises + 1, .count = 10};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, wait_honestly, &waits) == 0);
  for (uint64_t k = waits.first; k < waits.first + waits.count; k++) {
    sleep_ns(5000000);
    CHECK_OK(devbuf_event_signal(event, k));
  }
  pthread_join(thread, NULL);
  CHECK_EQ_U(waits.failed, 0);
  write_byte(socket, 's');
  CHECK(read_byte(socket) == 'k');
  CHECK_EQ_U(reap(child), 0);
  close(socket);
  devbuf_event_release(honest);
  devbuf_event_release(event);
}

static void test_hostile_messages(void) {
  size_t descriptors = test_open_descriptors();
  size_t segment = 1u << 16;
  int memory = -1, hold = -1, watch = -1, pipe_ends[2];
  CHECK_OK(devbuf__memory_file_create("test", segment, &memory));
  CHECK_OK(devbuf__lease_create(&hold, &watch));
  CHECK(pipe(pipe_ends) == 0);
  int both[2] = {memory, hold}, three[3] = {memory, hold, pipe_ends[0]},
      four[4] = {memory, hold, pipe_ends[0], pipe_ends[1]};
  devbuf__export_header h = valid_header(segment);

  EXPECT_REFUSED(with_magic(h, "devbufX9"), both, 2, DEVBUF_FORMAT_ERROR, "but with 'devbufX9'");
  devbuf__export_header bad = h;
  bad.kind = 9;
  EXPECT_REFUSED(bad, both, 2, DEVBUF_FORMAT_ERROR, "kind 9");
  bad = h, bad.pid = -4;
  EXPECT_REFUSED(bad, both, 2, DEVBUF_FORMAT_ERROR, "process id -4");
  bad = h, bad.ndim = 40;
  EXPECT_REFUSED(bad, both, 2, DEVBUF_FORMAT_ERROR, "ndim 40");
  bad = h, bad.dtype = 1000;
  EXPECT_REFUSED(bad, both, 2, DEVBUF_FORMAT_ERROR, "dtype 1000");
  bad = h, bad.shape[0] = (uint64_t)1 << 62, bad.shape[1] = (uint64_t)1 << 62;
  EXPECT_REFUSED(bad, both, 2, DEVBUF_FORMAT_ERROR, "shape is invalid");
  bad = h, bad.shape[1] = 17;
  EXPECT_REFUSED(bad, both, 2, DEVBUF_FORMAT_ERROR, "the view says");
  bad = h, bad.storage_offset = 64;
  EXPECT_REFUSED(bad, both, 2, DEVBUF_FORMAT_ERROR, "does not fit");
  bad = h, bad.view_offset = UINT64_MAX - 8;
  EXPECT_REFUSED(bad, both, 2, DEVBUF_FORMAT_ERROR, "does not fit");
  bad = h, bad.device_kind = DEVBUF_DEVICE_OPENCL;
  EXPECT_REFUSED(bad, both, 2, DEVBUF_FORMAT_ERROR, "cannot share memory");
  EXPECT_REFUSED(h, both, 1, DEVBUF_FORMAT_ERROR, "1 descriptors came, 2 belong");
  CHECK_STATUS(devbuf__send_with_fds(-1, &h, 0, both, 2, NULL), DEVBUF_INVALID_ARGUMENT);
  int packets[2]; // on a message socket, a short message is cut, not joined to the next
  devbuf_export_t *got_packet = NULL;
  CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, packets) == 0);
  CHECK_OK(devbuf__send_with_fds(packets[0], &h, sizeof h / 2, both, 2, NULL));
  CHECK_OK(devbuf__send_with_fds(packets[0], &h, sizeof h, both, 2, NULL));
  CHECK_STATUS(devbuf_export_receive(packets[1], &got_packet), DEVBUF_FORMAT_ERROR);
  char expected[96]; // the message says what came: it said "cut short" of any length
  snprintf(expected, sizeof expected, "a message of %zu bytes where %zu were expected",
           sizeof h / 2, sizeof h);
  CHECK_MESSAGE(expected);
  CHECK_OK(devbuf_export_receive(packets[1], &got_packet)); // the next message is whole
  devbuf_export_free(got_packet);
  unsigned char longer[sizeof h + 64] = {0};
  memcpy(longer, &h, sizeof h);
  CHECK_OK(devbuf__send_with_fds(packets[0], longer, sizeof longer, NULL, 0, NULL));
  CHECK_STATUS(devbuf_export_receive(packets[1], &got_packet), DEVBUF_FORMAT_ERROR);
  snprintf(expected, sizeof expected, "a message longer than the %zu bytes expected came",
           sizeof h);
  CHECK_MESSAGE(expected);
  CHECK_OK(devbuf__send_with_fds(packets[0], &h, sizeof h, both, 2, NULL));
  CHECK_OK(devbuf_export_receive(packets[1], &got_packet));
  devbuf_export_free(got_packet);
  close(packets[0]), close(packets[1]);
  EXPECT_REFUSED(h, NULL, 0, DEVBUF_FORMAT_ERROR, "0 descriptors came");
  EXPECT_REFUSED(h, three, 3, DEVBUF_FORMAT_ERROR, "3 descriptors came, 2 belong");
  EXPECT_REFUSED(h, four, 4, DEVBUF_FORMAT_ERROR, "too many descriptors");
  EXPECT_REFUSED(h, both, 0, DEVBUF_FORMAT_ERROR, "0 descriptors"); // fds never sent
  devbuf_export_t *got = NULL;
  CHECK_STATUS(deliver(&h, sizeof h / 2, both, 2, &got), DEVBUF_IO_ERROR); // cut short
  CHECK_MESSAGE("the peer closed it");

  // Well-formed messages whose descriptors lie: refused when imported.
  bad = h, bad.segment_size = bad.storage_size = bad.view_size = segment * 1024;
  bad.shape[0] = segment * 1024 / 64;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(deliver(&bad, sizeof bad, both, 2, &got));
  CHECK_STATUS(devbuf_buffer_import(device, got, &buffer), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("fewer than");
  devbuf_export_free(got);
  int piped[2] = {pipe_ends[1], hold};
  CHECK_OK(deliver(&h, sizeof h, piped, 2, &got));
  CHECK_STATUS(devbuf_buffer_import(device, got, &buffer), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("not a memory file");
  devbuf_export_free(got);
  bad = h, bad.storage_offset = 8, bad.storage_size = bad.view_size = segment - 64;
  bad.shape[0] = (segment - 64) / 64;
  CHECK_OK(deliver(&bad, sizeof bad, both, 2, &got));
  CHECK_STATUS(devbuf_buffer_import(device, got, &buffer), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("not a multiple");
  devbuf_export_free(got);
  bad = h, bad.device_uuid[3] = 7; // memory of a device this process does not have
  CHECK_OK(deliver(&bad, sizeof bad, both, 2, &got));
  CHECK_STATUS(devbuf_buffer_import(device, got, &buffer), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("its UUID differs");
  devbuf_export_free(got);
  int unsealed = memfd_create("unsealed", MFD_CLOEXEC), lying[2] = {unsealed, hold};
  CHECK(unsealed >= 0 && ftruncate(unsealed, (off_t)segment) == 0);
  CHECK_OK(deliver(&h, sizeof h, lying, 2, &got)); // its sender could cut it under the mapping
  CHECK_STATUS(devbuf_buffer_import(device, got, &buffer), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("not sealed against shrinking");
  devbuf_export_free(got);
  devbuf__export_header event = h;
  event.kind = DEVBUF_EXPORT_EVENT;
  devbuf_event_t *imported = NULL;
  EXPECT_REFUSED(event, both, 2, DEVBUF_FORMAT_ERROR, "2 descriptors came, 3 belong");
  int lease_as_pidfd[3] = {memory, hold, memory};
  CHECK_OK(deliver(&event, sizeof event, lease_as_pidfd, 3, &got)); // a lease for the pidfd
  CHECK_STATUS(devbuf_event_import(got, &imported), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("does not watch the exporting process");
  devbuf_export_free(got);
  int named_pidfd = memfd_create("pidfd", MFD_CLOEXEC), posing[3] = {memory, named_pidfd, memory};
  CHECK(named_pidfd >= 0);
  CHECK_OK(deliver(&event, sizeof event, posing, 3, &got)); // its link names "pidfd" too
  CHECK_STATUS(devbuf_event_import(got, &imported), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("does not watch the exporting process");
  devbuf_export_free(got);
  close(named_pidfd);
  int self = devbuf__process_watch(getpid()), with_self[3] = {memory, self, memory};
  CHECK(self >= 0);
  CHECK_OK(deliver(&event, sizeof event, with_self, 3, &got)); // a page of zeros
  CHECK_STATUS(devbuf_event_import(got, &imported), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("not a devbuf timeline");
  devbuf_export_free(got);
  event.pid = 1; // a pidfd of this process, claimed to be another's
  CHECK_OK(deliver(&event, sizeof event, with_self, 3, &got));
  CHECK_STATUS(devbuf_event_import(got, &imported), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("does not watch the exporting process 1");
  devbuf_export_free(got);
  event.pid = (int32_t)getpid(); // a timeline, with sleepers' words that cannot be written
  int timeline = -1, sealed = -1;
  CHECK_OK(devbuf__memory_file_create("timeline", 4096, &timeline));
  CHECK_OK(devbuf__memory_file_create("sealed", 4096, &sealed));
  char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, timeline, 0);
  CHECK(page != MAP_FAILED);
  if (page != MAP_FAILED) {
    memcpy(page, "devbufE2", 8);
    memcpy(page + offsetof(forged_timeline, pid), &event.pid, sizeof event.pid);
    munmap(page, 4096);
  }
  CHECK_OK(devbuf__memory_file_seal(sealed, true));
  int piped_sleepers[3] = {timeline, self, pipe_ends[0]};
  CHECK_OK(deliver(&event, sizeof event, piped_sleepers, 3, &got));
  CHECK_STATUS(devbuf_event_import(got, &imported), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("not a memory file");
  devbuf_export_free(got);
  int read_only_sleepers[3] = {timeline, self, sealed};
  CHECK_OK(deliver(&event, sizeof event, read_only_sleepers, 3, &got));
  CHECK_STATUS(devbuf_event_import(got, &imported), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("cannot be mapped to write");
  devbuf_export_free(got);
  close(timeline), close(sealed);
  CHECK(buffer == NULL && imported == NULL);

  CHECK_OK(deliver(&h, sizeof h, both, 2, &got)); // the honest one imports
  CHECK_OK(devbuf_buffer_import(device, got, &buffer));
  CHECK_EQ_U(devbuf_buffer_storage_id(buffer), 7);
  CHECK_EQ_U(devbuf_buffer_size(buffer), segment);
  devbuf_buffer_release(buffer);
  devbuf_export_free(got);
  CHECK_STATUS(devbuf_export_receive(-1, &got), DEVBUF_IO_ERROR);
  close(memory), close(hold), close(watch), close(pipe_ends[0]), close(pipe_ends[1]);
  close(unsealed), close(self);
  CHECK_EQ_U(test_open_descriptors(), descriptors); // nothing received stays open
}

// Exporting what cannot be: memory of another allocator, a zero-length buffer, NULLs.
// An import in the process that exported it: the same bytes at two addresses. A copy
// between overlapping views of the two behaves like memmove, either way round; a queued
// copy there is refused (its bytes would smear), and one between bytes apart runs.
static void test_copy_between_an_import_and_its_exporter(void) {
  size_t size = 1 << 20, span = 200000;
  devbuf_buffer_t *original = NULL, *imported = NULL;
  CHECK_OK(devbuf_buffer_allocate(shareable, DEVBUF_UINT8, &size, 1, 0, &original));
  devbuf_export_t *shared = NULL;
  CHECK_OK(devbuf_buffer_export(original, &shared));
  CHECK_OK(devbuf_buffer_import(device, shared, &imported));
  devbuf_export_free(shared);
  unsigned char *expected = malloc(size), *back = malloc(size);
  for (size_t i = 0; i < size; i++) expected[i] = (unsigned char)(i * 7 + i / 251);
  CHECK_OK(devbuf_buffer_copyin(original, expected, size));
  size_t places[2][2] = {{64, 0}, {0, 64}}; // {destination, source}: forward, then backward
  for (int k = 0; k < 2; k++) {
    devbuf_buffer_t *dst = NULL, *src = NULL;
    CHECK_OK(devbuf_buffer_view(imported, places[k][0], span, &dst));
    CHECK_OK(devbuf_buffer_view(original, places[k][1], span, &src));
    CHECK_OK(devbuf_buffer_copy_from(dst, src));
    memmove(expected + places[k][0], expected + places[k][1], span);
    CHECK_OK(devbuf_buffer_copyout(original, back, size));
    CHECK(memcmp(back, expected, size) == 0);
    devbuf_queue_t *queue = NULL;
    CHECK_OK(devbuf_queue_create(device, &queue));
    CHECK_STATUS(devbuf_queue_copy(queue, dst, src), DEVBUF_INVALID_ARGUMENT);
    CHECK_MESSAGE("an import and its exporter, overlapping");
    devbuf_buffer_release(dst);
    CHECK_OK(devbuf_buffer_view(imported, size - span, span, &dst));
    CHECK_OK(devbuf_queue_copy(queue, dst, src)); // bytes apart: an ordinary copy
    CHECK_OK(devbuf_queue_finish(queue));
    memmove(expected + size - span, expected + places[k][1], span);
    CHECK_OK(devbuf_buffer_copyout(original, back, size));
    CHECK(memcmp(back, expected, size) == 0);
    devbuf_queue_release(queue);
    devbuf_buffer_release(dst);
    devbuf_buffer_release(src);
  }
  free(expected);
  free(back);
  devbuf_buffer_release(imported);
  devbuf_buffer_release(original);
}

static void test_refusals(void) {
  devbuf_buffer_t *plain = NULL, *empty = NULL;
  size_t size = 256, none = 0;
  devbuf_export_t *shared = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &plain));
  CHECK_STATUS(devbuf_buffer_export(plain, &shared), DEVBUF_UNSUPPORTED);
  CHECK_OK(devbuf_buffer_allocate(shareable, DEVBUF_UINT8, &none, 1, 0, &empty));
  CHECK_STATUS(devbuf_buffer_export(empty, &shared), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_buffer_export(NULL, &shared), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_event_export(NULL, &shared), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_buffer_import(device, NULL, &plain), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_export_send(NULL, 0), DEVBUF_INVALID_ARGUMENT);
  CHECK(shared == NULL);
  devbuf_export_free(NULL);
  devbuf_buffer_release(plain);
  devbuf_buffer_release(empty);
}

// An empty message on a socket that keeps message bounds still carries descriptors: the
// receiver refuses it and closes them, every one.
static void test_empty_message_leaves_no_descriptor(void) {
  int sockets[2];
  CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sockets) == 0);
  int memory = memfd_create("empty", MFD_CLOEXEC);
  CHECK(memory >= 0);
  size_t before = test_open_descriptors();
  union {
    struct cmsghdr header;
    char space[CMSG_SPACE(3 * sizeof(int))];
  } control;
  memset(&control, 0, sizeof control);
  struct msghdr message = {.msg_control = control.space, .msg_controllen = sizeof control.space};
  struct cmsghdr *header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(3 * sizeof(int));
  int three[3] = {memory, memory, memory};
  memcpy(CMSG_DATA(header), three, sizeof three);
  CHECK(sendmsg(sockets[0], &message, 0) == 0);
  devbuf_export_t *got = NULL;
  CHECK_STATUS(devbuf_export_receive(sockets[1], &got), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("a message of 0 bytes where");
  CHECK(got == NULL);
  CHECK_EQ_U(test_open_descriptors(), before);
  close(memory);
  close(sockets[0]);
  close(sockets[1]);
}

int main(int argc, char **argv) {
  self_path = argv[0];
  signal(SIGPIPE, SIG_IGN);
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) return 1;
  shareable = devbuf_device_allocator_for(device, DEVBUF_MEMORY_SHAREABLE);
  if (!shareable) return 1;
  if (argc == 3) { // a role in another process
    int socket = atoi(argv[2]), status = 1;
    if (strcmp(argv[1], "hold-and-write") == 0) status = role_hold_and_write(socket);
    if (strcmp(argv[1], "wait-then-read") == 0) status = role_wait_then_read(socket);
    if (strcmp(argv[1], "signal-timed") == 0)
      status = role_signal_timed(socket);
    else if (strncmp(argv[1], "signal-", 7) == 0)
      status = role_signal(socket, argv[1] + 7);
    if (strcmp(argv[1], "scribble-sleepers") == 0) status = role_scribble_sleepers(socket);
    devbuf_device_release(device);
    return status;
  }
  RUN(test_killed_importer_gives_memory_back);
  RUN(test_allocations_reclaim);
  RUN(test_event_orders_another_process);
  RUN(test_dead_signaller);
  RUN(test_exec_release_and_failure);
  RUN(test_racing_raisers);
  RUN(test_hostile_messages);
  RUN(test_empty_message_leaves_no_descriptor);
  RUN(test_hostile_exporter_lowers_value);
  RUN(test_sleeping_importer_is_woken);
  RUN(test_sleeping_waits_wake_at_once);
  RUN(test_waits_for_values_reached_before_a_release);
  RUN(test_hostile_importer_scribbles_sleepers);
  RUN(test_refusals);
  RUN(test_copy_between_an_import_and_its_exporter);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
