// Sharing with another process on the CPU, side by side with the system's own pieces doing
// the same work in the same run:
// - an event ping-pong between two processes (each signals one exported event and waits for
//   the other's), against two counters on a shared page with futex waits: one pair that wakes
//   on every signal, and one that, as devbuf does, wakes only when a waiter said it sleeps;
// - handing a buffer over (export, send, receive, import, first read, release), against a
//   memory file sent over the same socket and mapped.
// The other process is a fork of this one. It touches none of the parent's buffers,
// allocators, queues or events: it imports, makes events of its own, and uses the CPU
// device (docs/processes.md says what a forked child may use).
#include "bench.h"

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_RUNS 101
#define SPINS    2000 // pauses, as devbuf's waits spin before they sleep

// ---- where the two processes run ---------------------------------------------------------

// A round trip costs what the two CPUs cost to pass a line between them, which differs
// from pair to pair (two hardware threads of one core, two cores, two sockets): each
// ping-pong, reference and devbuf alike, runs its parent on the first CPU this process may
// use and its child on the second, so that all of them pay the same. Fewer than two CPUs:
// no pinning. pin_side(-1) gives the parent back every CPU it had.
static cpu_set_t allowed_cpus;
static int pinned_cpus[2] = {-1, -1};

static void choose_cpus(void) {
  if (sched_getaffinity(0, sizeof allowed_cpus, &allowed_cpus) != 0) return;
  for (int cpu = 0, found = 0; cpu < CPU_SETSIZE && found < 2; cpu++)
    if (CPU_ISSET(cpu, &allowed_cpus)) pinned_cpus[found++] = cpu;
  if (pinned_cpus[1] < 0) pinned_cpus[0] = -1;
}

static void pin_side(int side) {
  if (pinned_cpus[0] < 0) return;
  if (side < 0) {
    sched_setaffinity(0, sizeof allowed_cpus, &allowed_cpus);
    return;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(pinned_cpus[side], &one);
  sched_setaffinity(0, sizeof one, &one);
}

// ---- the reference: two counters on a shared page --------------------------------------

// The counters sit on one cache line, or each on a line of its own as devbuf's two events
// do (each has its page); the sleepers' words on a line of their own, as devbuf's sit on a
// page of their own.
typedef struct raw_pair {
  _Atomic uint32_t ping, pong_same_line;
  _Alignas(64) _Atomic uint32_t pong_own_line;
  _Alignas(64) _Atomic uint32_t ping_sleepers, pong_sleepers;
} raw_pair;

// `sleepers` NULL: wake on every signal. Otherwise only when a waiter counted itself in there
// (seq_cst store, then the load: a waiter that counts in after it reads the new value).
static void raw_signal(_Atomic uint32_t *word, _Atomic uint32_t *sleepers, uint32_t value) {
  atomic_store(word, value);
  if (!sleepers || atomic_load(sleepers) != 0)
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static void raw_wait(_Atomic uint32_t *word, _Atomic uint32_t *sleepers, uint32_t value) {
  for (int spin = 0; spin < SPINS; spin++) {
    if (atomic_load(word) >= value) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  for (uint32_t seen; (seen = atomic_load(word)) < value;) {
    if (sleepers) atomic_fetch_add(sleepers, 1);
    if (!sleepers || atomic_load(word) == seen)
      syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, NULL, NULL, 0);
    if (sleepers) atomic_fetch_sub(sleepers, 1);
  }
}

static double raw_ping_pong(int rounds, bool wake_sleepers_only, bool own_lines) {
  raw_pair *pair = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (pair == MAP_FAILED) return 0;
  _Atomic uint32_t *pong = own_lines ? &pair->pong_own_line : &pair->pong_same_line;
  _Atomic uint32_t *ping_sleepers = wake_sleepers_only ? &pair->ping_sleepers : NULL;
  _Atomic uint32_t *pong_sleepers = wake_sleepers_only ? &pair->pong_sleepers : NULL;
  pin_side(0);
  pid_t child = fork();
  if (child == 0) {
    pin_side(1);
    for (int k = 1; k <= rounds; k++) {
      raw_wait(&pair->ping, ping_sleepers, (uint32_t)k);
      raw_signal(pong, pong_sleepers, (uint32_t)k);
    }
    _exit(0);
  }
  uint64_t start = bench_now_ns();
  for (int k = 1; k <= rounds; k++) {
    raw_signal(&pair->ping, ping_sleepers, (uint32_t)k);
    raw_wait(pong, pong_sleepers, (uint32_t)k);
  }
  uint64_t elapsed = bench_now_ns() - start;
  waitpid(child, NULL, 0);
  pin_side(-1);
  munmap(pair, 4096);
  return (double)elapsed / rounds;
}

// ---- devbuf: two exported events ---------------------------------------------------------

static devbuf_event_t *receive_event(int socket) {
  devbuf_export_t *shared = NULL;
  devbuf_event_t *event = NULL;
  if (devbuf_export_receive(socket, &shared) == DEVBUF_OK) devbuf_event_import(shared, &event);
  devbuf_export_free(shared);
  return event;
}

static bool send_event(devbuf_event_t *event, int socket) {
  devbuf_export_t *shared = NULL;
  bool sent = devbuf_event_export(event, &shared) == DEVBUF_OK &&
              devbuf_export_send(shared, socket) == DEVBUF_OK;
  devbuf_export_free(shared);
  return sent;
}

static double devbuf_ping_pong(int rounds) {
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sockets) != 0) return 0;
  pin_side(0);
  pid_t child = fork();
  if (child == 0) {
    pin_side(1);
    close(sockets[0]);
    devbuf_event_t *ping = receive_event(sockets[1]), *pong = NULL;
    devbuf_event_create(0, &pong);
    if (!ping || !send_event(pong, sockets[1])) _exit(1);
    for (int k = 1; k <= rounds; k++) {
      devbuf_event_wait(ping, (uint64_t)k, UINT64_MAX);
      devbuf_event_signal(pong, (uint64_t)k);
    }
    char done;
    if (read(sockets[1], &done, 1) != 1) _exit(1); // pong lives until the parent has seen it all
    _exit(0);
  }
  close(sockets[1]);
  devbuf_event_t *ping = NULL, *pong = NULL;
  devbuf_event_create(0, &ping);
  double per_round = 0;
  if (send_event(ping, sockets[0]) && (pong = receive_event(sockets[0]))) {
    uint64_t start = bench_now_ns();
    for (int k = 1; k <= rounds; k++) {
      devbuf_event_signal(ping, (uint64_t)k);
      if (devbuf_event_wait(pong, (uint64_t)k, UINT64_MAX) != DEVBUF_OK) break;
    }
    per_round = (double)(bench_now_ns() - start) / rounds;
  }
  if (write(sockets[0], "k", 1) != 1) per_round = 0;
  waitpid(child, NULL, 0);
  pin_side(-1);
  close(sockets[0]);
  devbuf_event_release(pong);
  devbuf_event_release(ping);
  return per_round;
}

// ---- handing a buffer over -----------------------------------------------------------------

// The child's part of one handover: receive, map, read the first byte, say what it saw.
static void raw_receive_one(int socket, size_t size) {
  char byte = 0;
  struct msghdr message = {0};
  union {
    struct cmsghdr header;
    char space[CMSG_SPACE(sizeof(int))];
  } control;
  struct iovec piece = {&byte, 1};
  message.msg_iov = &piece;
  message.msg_iovlen = 1;
  message.msg_control = control.space;
  message.msg_controllen = sizeof control.space;
  if (recvmsg(socket, &message, 0) != 1) _exit(1);
  int fd;
  memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&message)), sizeof fd);
  unsigned char *data = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  byte = data == MAP_FAILED ? 0 : (char)data[0];
  if (data != MAP_FAILED) munmap(data, size);
  if (write(socket, &byte, 1) != 1) _exit(1);
}

static void devbuf_receive_one(int socket, devbuf_device_t *device) {
  devbuf_export_t *shared = NULL;
  devbuf_buffer_t *buffer = NULL;
  char byte = 0;
  if (devbuf_export_receive(socket, &shared) == DEVBUF_OK &&
      devbuf_buffer_import(device, shared, &buffer) == DEVBUF_OK) {
    const unsigned char *data = NULL;
    if (devbuf_buffer_contents(buffer, (const void **)&data, NULL) == DEVBUF_OK) {
      byte = (char)data[0];
      devbuf_buffer_end_access(buffer, data);
    }
  }
  devbuf_buffer_release(buffer);
  devbuf_export_free(shared);
  if (write(socket, &byte, 1) != 1) _exit(1);
}

// Median nanoseconds of one handover of `size` bytes, the reference's and devbuf's
// alternating in one run.
static void handovers(const bench_config *config, size_t size, int count, double *raw,
                      double *ours) {
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sockets) != 0) return;
  pid_t child = fork();
  if (child == 0) {
    close(sockets[0]);
    for (int i = 0; i < count; i++) {
      raw_receive_one(sockets[1], size);
      devbuf_receive_one(sockets[1], config->device);
    }
    _exit(0);
  }
  close(sockets[1]);
  devbuf_allocator_t *shareable =
      devbuf_device_allocator_for(config->device, DEVBUF_MEMORY_SHAREABLE);
  double raw_ns[MAX_RUNS], our_ns[MAX_RUNS];
  int done = 0;
  for (int i = 0; i < count; i++, done++) {
    char seen = 0;
    uint64_t start = bench_now_ns();
    int fd = memfd_create("bench-raw", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
      printf("   (raw handover: cannot make a memfd of %zu bytes: %s)\n", size, strerror(errno));
      if (fd >= 0) close(fd);
      break;
    }
    unsigned char *data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      printf("   (raw handover: cannot map %zu bytes of a memfd: %s)\n", size, strerror(errno));
      close(fd);
      break;
    }
    data[0] = 0x42;
    char byte = 0;
    union {
      struct cmsghdr header;
      char space[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof control);
    struct iovec piece = {&byte, 1};
    struct msghdr message = {.msg_iov = &piece, .msg_iovlen = 1};
    message.msg_control = control.space;
    message.msg_controllen = sizeof control.space;
    CMSG_FIRSTHDR(&message)->cmsg_level = SOL_SOCKET;
    CMSG_FIRSTHDR(&message)->cmsg_type = SCM_RIGHTS;
    CMSG_FIRSTHDR(&message)->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(CMSG_FIRSTHDR(&message)), &fd, sizeof fd);
    if (sendmsg(sockets[0], &message, 0) != 1 || read(sockets[0], &seen, 1) != 1) break;
    munmap(data, size);
    close(fd);
    raw_ns[i] = (double)(bench_now_ns() - start);

    start = bench_now_ns();
    devbuf_buffer_t *buffer = NULL;
    devbuf_export_t *shared = NULL;
    void *bytes = NULL;
    if (devbuf_buffer_allocate(shareable, DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK ||
        devbuf_buffer_contents_mut(buffer, &bytes, NULL) != DEVBUF_OK) {
      devbuf_buffer_release(buffer);
      break;
    }
    *(unsigned char *)bytes = 0x42;
    devbuf_buffer_end_access(buffer, bytes);
    bool handed = devbuf_buffer_export(buffer, &shared) == DEVBUF_OK &&
                  devbuf_export_send(shared, sockets[0]) == DEVBUF_OK &&
                  read(sockets[0], &seen, 1) == 1;
    devbuf_export_free(shared);
    devbuf_buffer_release(buffer);
    if (!handed) break;
    our_ns[i] = (double)(bench_now_ns() - start);
    if (seen != 0x42) our_ns[i] = 0; // the importer must have seen the exporter's byte
  }
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  close(sockets[0]);
  *raw = done ? bench_median(raw_ns, done) : 0;
  *ours = done ? bench_median(our_ns, done) : 0;
}

void bench_share(const bench_config *config) {
  printf("== other processes: events and buffers shared with a forked process ==\n");
  if (!devbuf_device_allocator_for(config->device, DEVBUF_MEMORY_SHAREABLE)) {
    printf("%s shares no memory with other processes\n\n", devbuf_device_spec(config->device));
    return;
  }
  int rounds = config->quick ? 2000 : 20000,
      runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  // Alternating in each run: the pair waking always, the pair waking sleepers only with its
  // counters on one line, then on a line each (the layout of two events, whose pages are
  // apart), and devbuf.
  choose_cpus();
  double always[MAX_RUNS], one_line[MAX_RUNS], own_lines[MAX_RUNS], ours[MAX_RUNS];
  for (int run = 0; run < runs; run++) {
    always[run] = raw_ping_pong(rounds, false, false);
    one_line[run] = raw_ping_pong(rounds, true, false);
    own_lines[run] = raw_ping_pong(rounds, true, true);
    ours[run] = devbuf_ping_pong(rounds);
  }
  double always_ns = bench_median(always, runs), one_line_ns = bench_median(one_line, runs),
         own_lines_ns = bench_median(own_lines, runs), our_ns = bench_median(ours, runs);
  double ratio = own_lines_ns > 0 ? our_ns / own_lines_ns : 0;
  printf("event ping-pong, %d rounds, ns per round: devbuf events %.0f; futex pair waking "
         "sleepers only, its counters on a line each %.0f (%.2fx, target <= 1.2x: %s), on one "
         "line %.0f (%.2fx); waking always %.0f\n",
         rounds, our_ns, own_lines_ns, ratio, ratio <= 1.2 ? "met" : "missed", one_line_ns,
         one_line_ns > 0 ? our_ns / one_line_ns : 0, always_ns);
  // The names without a line count keep their meaning of earlier commits (counters on one line).
  bench_figure("share", "event round trip (futex pair)", always_ns, "ns", -1);
  bench_figure("share", "event round trip (futex pair, waking sleepers only)", one_line_ns, "ns",
               -1);
  bench_figure("share", "event round trip (futex pair, waking sleepers only, a line each)",
               own_lines_ns, "ns", -1);
  bench_figure("share", "event round trip (devbuf)", our_ns, "ns", -1);
  bench_figure("share", "event round trip, devbuf / futex pair with a line each", ratio, "x",
               ratio <= 1.2);
  size_t sizes[] = {1u << 20, 64u << 20};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    double raw_handover = 0, our_handover = 0;
    handovers(config, sizes[s], config->quick ? 21 : 101, &raw_handover, &our_handover);
    printf("hand over %3zu MiB (make, send, map, read a byte, let go): memory file %.1f us, "
           "devbuf %.1f us (%.2fx)\n",
           sizes[s] >> 20, raw_handover / 1e3, our_handover / 1e3,
           raw_handover > 0 ? our_handover / raw_handover : 0);
    char name[64];
    snprintf(name, sizeof name, "handover %zu MiB (memory file)", sizes[s] >> 20);
    bench_figure("share", name, raw_handover / 1e3, "us", -1);
    snprintf(name, sizeof name, "handover %zu MiB (devbuf)", sizes[s] >> 20);
    bench_figure("share", name, our_handover / 1e3, "us", -1);
  }
  printf("\n");
}
