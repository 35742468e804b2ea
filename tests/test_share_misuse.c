// Sharing misused by the caller or the receiving process's setup: one export claimed by two
// threads at once, sockets that cannot carry descriptors or add their own control data, a
// receiver without a descriptor to spare, memory the receiver may not write, a view whose
// elements would be misaligned.
#include "../src/core/core.h"
#include "check.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#ifndef SO_PASSPIDFD
#define SO_PASSPIDFD 76 // Linux 6.5
#endif

static devbuf_device_t *device;
static devbuf_allocator_t *shareable;

// A connected pair whose receives give up after 10 s: a message that never comes fails the
// test instead of hanging it.
static void unix_pair(int type, int pair[2]) {
  CHECK(socketpair(AF_UNIX, type, 0, pair) == 0);
  struct timeval patience = {.tv_sec = 10};
  for (int i = 0; i < 2; i++)
    setsockopt(pair[i], SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
}

static devbuf_export_t *export_bytes(size_t size, devbuf_buffer_t **out_buffer) {
  devbuf_buffer_t *buffer = NULL;
  devbuf_export_t *shared = NULL;
  CHECK_OK(devbuf_buffer_allocate(shareable, DEVBUF_UINT8, &size, 1, DEVBUF_BUFFER_ZERO, &buffer));
  CHECK_OK(devbuf_buffer_export(buffer, &shared));
  *out_buffer = buffer;
  return shared;
}

// ---- one export, two threads ----

typedef struct {
  devbuf_export_t *shared;
  pthread_barrier_t *start;
  devbuf_buffer_t *imported;
  devbuf_status status;
} import_try;

static void *import_at_once(void *argument) {
  import_try *attempt = argument;
  pthread_barrier_wait(attempt->start);
  attempt->status = devbuf_buffer_import(device, attempt->shared, &attempt->imported);
  return NULL;
}

// Each round, two threads import one export at the same moment: one gets the lease, the
// other a refusal; never two buffers over one lease (the exporter would reuse memory that
// the second still writes).
static void test_one_export_two_threads(void) {
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, 2);
  int both = 0, neither = 0;
  for (int round = 0; round < 400; round++) {
    devbuf_buffer_t *buffer = NULL;
    devbuf_export_t *shared = export_bytes(4096, &buffer);
    import_try tries[2] = {{shared, &start, NULL, DEVBUF_OK}, {shared, &start, NULL, DEVBUF_OK}};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
      CHECK(pthread_create(&threads[i], NULL, import_at_once, &tries[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
    int won = (tries[0].status == DEVBUF_OK) + (tries[1].status == DEVBUF_OK);
    both += won == 2;
    neither += won == 0;
    for (int i = 0; i < 2; i++) {
      if (tries[i].status == DEVBUF_OK) continue;
      CHECK_EQ_U(tries[i].status, DEVBUF_INVALID_ARGUMENT);
      CHECK(tries[i].imported == NULL);
    }
    for (int i = 0; i < 2; i++) devbuf_buffer_release(tries[i].imported);
    devbuf_export_free(shared);
    devbuf_buffer_release(buffer);
  }
  CHECK_EQ_U(both, 0);
  CHECK_EQ_U(neither, 0);
  pthread_barrier_destroy(&start);
}

// ---- sockets ----

// A TCP connection takes the bytes and drops the descriptors: refused before anything goes,
// and the export stays whole for a Unix socket.
static void test_socket_without_descriptors(void) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in address = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t length = sizeof address;
  if (listener < 0 || bind(listener, (struct sockaddr *)&address, sizeof address) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, (struct sockaddr *)&address, &length) != 0) {
    printf("  (no loopback TCP here: that case is not checked)\n");
    if (listener >= 0) close(listener);
    return;
  }
  int client = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(connect(client, (struct sockaddr *)&address, sizeof address) == 0);
  int server = accept(listener, NULL, NULL);
  CHECK(server >= 0);
  struct timeval patience = {.tv_sec = 10};
  setsockopt(server, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
  devbuf_buffer_t *buffer = NULL;
  devbuf_export_t *shared = export_bytes(4096, &buffer), *got = NULL;
  CHECK_STATUS(devbuf_export_send(shared, client), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("not a Unix socket");
  CHECK_STATUS(devbuf_export_receive(server, &got), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("not a Unix socket");
  int pair[2];
  unix_pair(SOCK_STREAM, pair);
  CHECK_OK(devbuf_export_send(shared, pair[0])); // still whole
  CHECK_OK(devbuf_export_receive(pair[1], &got));
  devbuf_buffer_t *imported = NULL;
  CHECK_OK(devbuf_buffer_import(device, got, &imported));
  devbuf_buffer_release(imported);
  devbuf_export_free(got);
  devbuf_export_free(shared);
  devbuf_buffer_release(buffer);
  close(pair[0]), close(pair[1]), close(client), close(server), close(listener);
}

// A receiver whose socket asks for credentials or the sender's pidfd gets that control data
// beside the descriptors: the export still arrives, and no pidfd is left open.
static void test_receiver_socket_options(void) {
  int options[2] = {SO_PASSCRED, SO_PASSPIDFD};
  const char *names[2] = {"SO_PASSCRED", "SO_PASSPIDFD"};
  for (int o = 0; o < 2; o++) {
    int type = o ? SOCK_SEQPACKET : SOCK_STREAM, pair[2], on = 1;
    unix_pair(type, pair);
    if (setsockopt(pair[1], SOL_SOCKET, options[o], &on, sizeof on) != 0) {
      printf("  (%s: not on this kernel)\n", names[o]);
      close(pair[0]), close(pair[1]);
      continue;
    }
    size_t before = test_open_descriptors();
    for (int round = 0; round < 3; round++) {
      devbuf_buffer_t *buffer = NULL, *imported = NULL;
      devbuf_export_t *shared = export_bytes(4096, &buffer), *got = NULL;
      CHECK_OK(devbuf_export_send(shared, pair[0]));
      CHECK_OK(devbuf_export_receive(pair[1], &got));
      CHECK_OK(devbuf_buffer_import(device, got, &imported));
      devbuf_buffer_release(imported);
      devbuf_export_free(got);
      devbuf_export_free(shared);
      devbuf_buffer_release(buffer);
    }
    CHECK_OK(devbuf_export_reclaim(NULL));
    CHECK_EQ_U(test_open_descriptors(), before);
    close(pair[0]), close(pair[1]);
  }
}

// With no descriptor left, the kernel delivers the bytes and drops the descriptors: the
// receiver says so, not that the sender's message was malformed.
static void test_receiver_out_of_descriptors(void) {
  int pair[2];
  unix_pair(SOCK_SEQPACKET, pair);
  devbuf_buffer_t *buffer = NULL;
  devbuf_export_t *shared = export_bytes(4096, &buffer), *got = NULL;
  CHECK_OK(devbuf_export_send(shared, pair[0]));
  struct rlimit was;
  CHECK(getrlimit(RLIMIT_NOFILE, &was) == 0);
  enum { MOST = 4096 };
  static int fillers[MOST];
  int filled = 0, highest = 0;
  for (int fd = 0; fd < MOST / 2; fd++)
    if (fcntl(fd, F_GETFD) >= 0) highest = fd;
  struct rlimit tight = {(rlim_t)highest + 40, was.rlim_max};
  CHECK(setrlimit(RLIMIT_NOFILE, &tight) == 0);
  while (filled < MOST && (fillers[filled] = fcntl(pair[0], F_DUPFD_CLOEXEC, 0)) >= 0) filled++;
  CHECK(filled > 1 && filled < MOST);
  close(fillers[--filled]); // one place: the first of the two descriptors fits, not the second
  CHECK_STATUS(devbuf_export_receive(pair[1], &got), DEVBUF_UNAVAILABLE);
  CHECK_MESSAGE("has none left");
  CHECK(got == NULL);
  while (filled) close(fillers[--filled]);
  CHECK(setrlimit(RLIMIT_NOFILE, &was) == 0);
  devbuf_export_free(shared);
  devbuf_buffer_release(buffer);
  close(pair[0]), close(pair[1]);
}

// ---- what the message carries ----

static devbuf_status deliver(const devbuf__export_header *header, const int *fds, size_t count,
                             devbuf_export_t **out) {
  int pair[2];
  unix_pair(SOCK_STREAM, pair);
  CHECK_OK(devbuf__send_with_fds(pair[0], header, sizeof *header, fds, count, NULL));
  devbuf_status status = devbuf_export_receive(pair[1], out);
  close(pair[0]), close(pair[1]);
  return status;
}

// A memory file the receiver may only read, and a float view at an odd byte: both refused
// as the message's fault (FORMAT_ERROR), naming what is wrong.
static void test_memory_the_importer_cannot_use(void) {
  size_t segment = 1u << 16;
  int memory = -1, hold = -1, watch = -1;
  CHECK_OK(devbuf__memory_file_create("misuse", segment, &memory));
  CHECK_OK(devbuf__lease_create(&hold, &watch));
  devbuf__export_header h = {.kind = DEVBUF_EXPORT_BUFFER,
                             .device_kind = DEVBUF_DEVICE_CPU,
                             .pid = (int32_t)getpid(),
                             .dtype = DEVBUF_FLOAT32,
                             .ndim = 1,
                             .segment_size = segment,
                             .storage_size = segment,
                             .view_size = segment};
  memcpy(h.magic, DEVBUF__EXPORT_MAGIC, sizeof h.magic);
  h.shape[0] = segment / 4;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", memory);
  int read_only = open(path, O_RDONLY | O_CLOEXEC);
  CHECK(read_only >= 0);
  devbuf_export_t *got = NULL;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(deliver(&h, (int[]){read_only, hold}, 2, &got));
  CHECK_STATUS(devbuf_buffer_import(device, got, &buffer), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("to read and write");
  devbuf_export_free(got);

  devbuf__export_header odd = h;
  odd.view_offset = 2, odd.view_size = segment - 64, odd.shape[0] = (segment - 64) / 4;
  got = NULL;
  CHECK_STATUS(deliver(&odd, (int[]){memory, hold}, 2, &got), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("4-byte alignment");
  CHECK(got == NULL);
  close(read_only), close(memory), close(hold), close(watch);
}

int main(void) {
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) return 1;
  shareable = devbuf_device_allocator_for(device, DEVBUF_MEMORY_SHAREABLE);
  if (!shareable) return 1;
  RUN(test_one_export_two_threads);
  RUN(test_socket_without_descriptors);
  RUN(test_receiver_socket_options);
  RUN(test_receiver_out_of_descriptors);
  RUN(test_memory_the_importer_cannot_use);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
