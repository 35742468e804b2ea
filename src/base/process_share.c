// What sharing with another process takes from the operating system: memory files, leases
// (open-file-description locks, which the kernel drops when the last descriptor of the
// locking open goes: a crash cannot leave one behind), descriptors passed over Unix sockets,
// futexes on shared words, and watching a process end.
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/magic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 // Linux 5.1
#endif

// Memory files are sealed against shrinking and growing at once: a process that shares one
// cannot cut it under another's mapping (which would fault there, SIGBUS, on the next touch).
devbuf_status devbuf__memory_file_create(const char *name, size_t size, int *out_fd) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return devbuf__error(DEVBUF_IO_ERROR, "memfd_create('%s') failed: %s", name, strerror(errno));
  int error = size > (size_t)INT64_MAX ? EFBIG : 0;
  if (!error && ftruncate(fd, (off_t)size) != 0) error = errno;
  if (error) {
    close(fd);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "a %zu-byte memory file was refused: %s", size,
                         strerror(error));
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    error = errno;
    close(fd);
    return devbuf__error(DEVBUF_IO_ERROR, "sealing a memory file failed: %s", strerror(error));
  }
  *out_fd = fd;
  return DEVBUF_OK;
}

devbuf_status devbuf__memory_file_seal(int fd, bool read_only_elsewhere) {
  int seals = F_SEAL_SEAL | (read_only_elsewhere ? F_SEAL_FUTURE_WRITE : 0);
  if (fcntl(fd, F_ADD_SEALS, seals) != 0)
    return devbuf__error(DEVBUF_IO_ERROR, "sealing a memory file failed: %s", strerror(errno));
  return DEVBUF_OK;
}

devbuf_status devbuf__memory_file_check(int fd, size_t size, const char *what) {
  // Seals first: only memory files have them, and asking costs no file system a round trip
  // (fstat of a FUSE file waits for its daemon, which a hostile sender may run).
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "%s: descriptor %d is not a memory file (it has no seals: %s)", what, fd,
                         strerror(errno));
  if (!(seals & F_SEAL_SHRINK))
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "%s: the memory file is not sealed against shrinking (its owner could "
                         "cut it under the mapping; seals 0x%x)",
                         what, (unsigned)seals);
  struct stat info;
  struct statfs where;
  if (fstat(fd, &info) != 0 || fstatfs(fd, &where) != 0)
    return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: descriptor %d cannot be examined: %s", what, fd,
                         strerror(errno));
  if (!S_ISREG(info.st_mode))
    return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: descriptor %d is not a memory file (mode %o)",
                         what, fd, (unsigned)info.st_mode);
  // hugetlbfs (a memory file made with MFD_HUGETLB): mappings would not be what they seem.
  // The file system, not st_blksize, which transparent huge pages may raise on tmpfs too.
  if ((unsigned long)where.f_type == HUGETLBFS_MAGIC)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "%s: the memory file has huge pages (%ld bytes), not the system's", what,
                         (long)info.st_blksize);
  if ((uint64_t)info.st_size < size)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "%s: the memory file has %lld bytes, fewer than the %zu it should have",
                         what, (long long)info.st_size, size);
  return DEVBUF_OK;
}

void devbuf__close_fds(const int *fds, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (fds[i] >= 0) close(fds[i]);
}

// ---- leases -----------------------------------------------------------------------------

static struct flock lease_lock(short type) {
  return (struct flock){.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
}

devbuf_status devbuf__lease_create(int *out_hold, int *out_watch) {
  int hold = -1;
  devbuf_status status = devbuf__memory_file_create("devbuf-lease", 0, &hold);
  if (status != DEVBUF_OK) return status;
  struct flock lock = lease_lock(F_RDLCK);
  if (fcntl(hold, F_OFD_SETLK, &lock) != 0) {
    int error = errno;
    close(hold);
    return devbuf__error(DEVBUF_IO_ERROR, "a lease lock was refused: %s", strerror(error));
  }
  // A second open of the same file, not a copy of the descriptor: its locks are its own, so
  // it sees the holder's lock as someone else's.
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", hold);
  int watch = open(path, O_RDONLY | O_CLOEXEC);
  if (watch < 0) {
    int error = errno;
    close(hold);
    return devbuf__error(DEVBUF_IO_ERROR, "cannot reopen a lease through %s: %s", path,
                         strerror(error));
  }
  *out_hold = hold;
  *out_watch = watch;
  return DEVBUF_OK;
}

devbuf_status devbuf__lock_reopened(int file, int *out_locked) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", file);
  int locked = open(path, O_RDONLY | O_CLOEXEC);
  struct flock lock = lease_lock(F_RDLCK);
  if (locked < 0 || fcntl(locked, F_OFD_SETLK, &lock) != 0) {
    int error = errno;
    if (locked >= 0) close(locked);
    return devbuf__error(DEVBUF_IO_ERROR, "cannot lock a reopening of %s: %s", path,
                         strerror(error));
  }
  *out_locked = locked;
  return DEVBUF_OK;
}

bool devbuf__lease_held(int watch) {
  struct flock probe = lease_lock(F_WRLCK);
  if (fcntl(watch, F_OFD_GETLK, &probe) != 0) return true; // cannot tell: keep the memory
  return probe.l_type != F_UNLCK;
}

// ---- descriptors over Unix sockets ----------------------------------------------------------

#define MAX_PASSED_FDS 4
#ifndef SCM_PIDFD
#define SCM_PIDFD 0x04 // Linux 6.5: a receiver with SO_PASSPIDFD gets the sender's pidfd
#endif
// Room for what a receiver's socket options add beside the descriptors: credentials
// (SO_PASSCRED), a pidfd (SO_PASSPIDFD), a security label (SO_PASSSEC). Without it the kernel
// cuts the control data and drops the descriptors with it.
#define CONTROL_EXTRA 512

// Descriptors travel only on Unix sockets: elsewhere sendmsg takes the bytes and silently
// drops SCM_RIGHTS (and an export sent that way would be lost).
static devbuf_status check_unix_socket(int socket, const char *what) {
  int domain = AF_UNIX;
  socklen_t domain_size = sizeof domain;
  if (getsockopt(socket, SOL_SOCKET, SO_DOMAIN, &domain, &domain_size) != 0)
    return devbuf__error(errno == ENOTSOCK ? DEVBUF_INVALID_ARGUMENT : DEVBUF_IO_ERROR,
                         "%s: descriptor %d is not a usable socket: %s", what, socket,
                         strerror(errno));
  if (domain != AF_UNIX)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%s: socket %d is not a Unix socket (domain %d): descriptors cannot "
                         "travel on it",
                         what, socket, domain);
  return DEVBUF_OK;
}

devbuf_status devbuf__send_with_fds(int socket, const void *bytes, size_t size, const int *fds,
                                    size_t fd_count, bool *out_fds_sent) {
  if (out_fds_sent) *out_fds_sent = false;
  if (fd_count > MAX_PASSED_FDS || (fd_count && !size))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%zu descriptors with %zu bytes: at most %d, and with at least a byte",
                         fd_count, size, MAX_PASSED_FDS);
  if (fd_count) {
    devbuf_status status = check_unix_socket(socket, "sending descriptors");
    if (status != DEVBUF_OK) return status;
  }
  union {
    struct cmsghdr header;
    char space[CMSG_SPACE(sizeof(int) * MAX_PASSED_FDS)];
  } control;
  memset(&control, 0, sizeof control);
  struct iovec piece = {.iov_base = (void *)bytes, .iov_len = size};
  struct msghdr message = {.msg_iov = &piece, .msg_iovlen = 1};
  if (fd_count) {
    message.msg_control = control.space;
    message.msg_controllen = CMSG_SPACE(sizeof(int) * fd_count);
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fd_count);
    memcpy(CMSG_DATA(header), fds, sizeof(int) * fd_count);
  }
  size_t sent = 0;
  while (sent < size) { // the descriptors go with the first byte; a stream may take the rest later
    ssize_t done = sendmsg(socket, &message, MSG_NOSIGNAL);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0)
      return devbuf__error(DEVBUF_IO_ERROR, "sending %zu bytes on socket %d failed after %zu: %s",
                           size, socket, sent, done < 0 ? strerror(errno) : "nothing was sent");
    sent += (size_t)done;
    if (out_fds_sent && fd_count) *out_fds_sent = true; // with the first byte
    piece.iov_base = (char *)bytes + sent;
    piece.iov_len = size - sent;
    message.msg_control = NULL;
    message.msg_controllen = 0;
  }
  return DEVBUF_OK;
}

// Whether this process has reached its descriptor limit (the kernel then cuts the control
// data of a message, as it does for a message that carries too many).
static bool out_of_descriptors(int socket) {
  int probe = fcntl(socket, F_DUPFD_CLOEXEC, 0);
  if (probe >= 0) close(probe);
  return probe < 0 && errno == EMFILE;
}

// Takes the descriptors out of a received message's control data (closing those over `max`).
static bool collect_fds(struct msghdr *message, int *fds, size_t max, size_t *count) {
  bool fits = true;
  for (struct cmsghdr *header = CMSG_FIRSTHDR(message); header;
       header = CMSG_NXTHDR(message, header)) {
    if (header->cmsg_level != SOL_SOCKET) continue;
    if (header->cmsg_type == SCM_PIDFD && header->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int pidfd; // installed for us whether we want it or not
      memcpy(&pidfd, CMSG_DATA(header), sizeof pidfd);
      close(pidfd);
      continue;
    }
    if (header->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof fd);
      if (*count < max) {
        fds[(*count)++] = fd;
      } else {
        close(fd);
        fits = false;
      }
    }
  }
  return fits;
}

devbuf_status devbuf__receive_with_fds(int socket, void *bytes, size_t size, int *fds,
                                       size_t max_fds, size_t *out_fd_count) {
  union {
    struct cmsghdr header;
    char space[CMSG_SPACE(sizeof(int) * (MAX_PASSED_FDS + 4)) + CONTROL_EXTRA];
  } control;
  devbuf_status status = check_unix_socket(socket, "receiving descriptors");
  if (status != DEVBUF_OK) return status;
  size_t received = 0, count = 0;
  bool fits = true, cut = false, control_cut = false, too_long = false;
  int type = SOCK_STREAM;
  socklen_t type_size = sizeof type;
  getsockopt(socket, SOL_SOCKET, SO_TYPE, &type, &type_size);
  while (received < size) {
    struct iovec piece = {.iov_base = (char *)bytes + received, .iov_len = size - received};
    struct msghdr message = {.msg_iov = &piece, .msg_iovlen = 1};
    message.msg_control = control.space;
    message.msg_controllen = sizeof control.space;
    ssize_t done = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    if (done < 0 && errno == EINTR) continue;
    if (done >= 0) { // an empty message may carry descriptors too: they are ours to close
      fits = collect_fds(&message, fds, max_fds, &count) && fits;
      cut = cut || (message.msg_flags & (MSG_CTRUNC | MSG_TRUNC));
      control_cut = control_cut || (message.msg_flags & MSG_CTRUNC);
      too_long = too_long || (message.msg_flags & MSG_TRUNC);
    }
    if (done < 0 || (done == 0 && type == SOCK_STREAM)) {
      int error = errno;
      devbuf__close_fds(fds, count);
      return devbuf__error(DEVBUF_IO_ERROR, "receiving %zu bytes on socket %d: %s after %zu", size,
                           socket, done < 0 ? strerror(error) : "the peer closed it", received);
    }
    received += (size_t)done;
    if (type != SOCK_STREAM && received < size) cut = true; // a message comes whole or not at all
    if (cut) break;
  }
  if (!fits || cut) {
    bool starved = control_cut && out_of_descriptors(socket); // before ours free a place
    devbuf__close_fds(fds, count);
    if (starved) {
      struct rlimit limit = {0, 0};
      getrlimit(RLIMIT_NOFILE, &limit);
      return devbuf__error(DEVBUF_UNAVAILABLE,
                           "a message of %zu bytes came without its descriptors: this process "
                           "has none left (limit %llu), and the kernel dropped them (the "
                           "sender must send again)",
                           size, (unsigned long long)limit.rlim_cur);
    }
    // What came, in the sender's terms: a message of another length (a packet socket delivers
    // a message whole or cut), or more descriptors than belong to one.
    char what[96];
    if (too_long)
      snprintf(what, sizeof what, "a message longer than the %zu bytes expected", size);
    else if (received < size)
      snprintf(what, sizeof what, "a message of %zu bytes where %zu were expected", received, size);
    else
      snprintf(what, sizeof what, "a message of %zu bytes", size);
    return devbuf__error(DEVBUF_FORMAT_ERROR, "%s came%s (at most %zu descriptors belong to one)",
                         what,
                         control_cut ? " with more descriptors than fit (the kernel cut them)"
                         : !fits     ? " with too many descriptors"
                                     : "",
                         max_fds);
  }
  *out_fd_count = count;
  return DEVBUF_OK;
}

// ---- futexes and processes ----------------------------------------------------------------

void devbuf__shared_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns) {
  struct timespec timeout = {.tv_sec = (time_t)(timeout_ns / 1000000000u),
                             .tv_nsec = (long)(timeout_ns % 1000000000u)};
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &timeout, NULL, 0);
}

void devbuf__shared_wait_either(_Atomic uint32_t *first, uint32_t first_expected,
                                _Atomic uint32_t *second, uint32_t second_expected,
                                uint64_t timeout_ns) {
#ifdef SYS_futex_waitv
  // Off for good once the call is refused (an old kernel, a seccomp filter): the fallback
  // then, not a loop of failing calls.
  static atomic_bool refused;
  if (atomic_load_explicit(&refused, memory_order_relaxed)) goto one_word;
  struct futex_waitv waiters[2] = {
      {.val = first_expected, .uaddr = (uint64_t)(uintptr_t)first, .flags = FUTEX_32},
      {.val = second_expected, .uaddr = (uint64_t)(uintptr_t)second, .flags = FUTEX_32}};
  uint64_t deadline = devbuf__now_ns() + timeout_ns;
  struct timespec until = {.tv_sec = (time_t)(deadline / 1000000000u),
                           .tv_nsec = (long)(deadline % 1000000000u)};
  if (syscall(SYS_futex_waitv, waiters, 2, 0, &until, CLOCK_MONOTONIC) >= 0 || errno == EAGAIN ||
      errno == ETIMEDOUT || errno == EINTR)
    return;
  atomic_store(&refused, true);
one_word:
#endif
  // Before Linux 5.16: the first word only; the second is seen when the wait times out.
  (void)second, (void)second_expected;
  devbuf__shared_wait(first, first_expected, timeout_ns);
}

void devbuf__shared_wake(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

int devbuf__process_watch(int pid) {
#ifdef SYS_pidfd_open
  int fd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

bool devbuf__process_alive(int watch) {
  struct pollfd ended = {.fd = watch, .events = POLLIN};
  int ready;
  do ready = poll(&ended, 1, 0);
  while (ready < 0 && errno == EINTR);
  return !(ready > 0 && (ended.revents & (POLLIN | POLLHUP | POLLNVAL)));
}

bool devbuf__is_process_watch(int fd, int *out_pid) {
  char path[64], target[64] = "", line[128];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t length = readlink(path, target, sizeof target - 1);
  // The link of a pidfd, and only of one (a memory file or a FIFO named "pidfd" is not):
  // "anon_inode:[pidfd]", or "pidfd:[inode]" where pidfs has them (Linux 6.9).
  if (length <= 0 ||
      (strcmp(target, "anon_inode:[pidfd]") != 0 && strncmp(target, "pidfd:[", 7) != 0))
    return false;
  snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
  FILE *info = fopen(path, "re");
  *out_pid = 0; // not shown (before Linux 5.5, or another namespace's process)
  while (info && fgets(line, sizeof line, info))
    if (strncmp(line, "Pid:", 4) == 0) *out_pid = atoi(line + 4); // -1 once reaped
  if (info) fclose(info);
  return true;
}
