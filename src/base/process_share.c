// What sharing with another process takes from the operating system: memory files, leases
// (open-file-description locks, which the kernel drops when the last descriptor of the
// locking open goes: a crash cannot leave one behind), descriptors passed over Unix sockets,
// futexes on shared words, and watching a process end.
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

devbuf_status devbuf__memory_file_create(const char *name, size_t size, int *out_fd) {
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0)
    return devbuf__error(DEVBUF_IO_ERROR, "memfd_create('%s') failed: %s", name, strerror(errno));
  if (size > (size_t)INT64_MAX || ftruncate(fd, (off_t)size) != 0) {
    int error = errno;
    close(fd);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "a %zu-byte memory file was refused: %s", size,
                         strerror(error));
  }
  *out_fd = fd;
  return DEVBUF_OK;
}

devbuf_status devbuf__memory_file_check(int fd, size_t size, const char *what) {
  struct stat info;
  if (fstat(fd, &info) != 0)
    return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: descriptor %d cannot be examined: %s", what, fd,
                         strerror(errno));
  if (!S_ISREG(info.st_mode))
    return devbuf__error(DEVBUF_FORMAT_ERROR, "%s: descriptor %d is not a memory file (mode %o)",
                         what, fd, (unsigned)info.st_mode);
  if ((uint64_t)info.st_size < size)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "%s: the memory file has %lld bytes, fewer than the %zu it should have",
                         what, (long long)info.st_size, size);
  return DEVBUF_OK;
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

bool devbuf__lease_held(int watch) {
  struct flock probe = lease_lock(F_WRLCK);
  if (fcntl(watch, F_OFD_GETLK, &probe) != 0) return true; // cannot tell: keep the memory
  return probe.l_type != F_UNLCK;
}

// ---- descriptors over Unix sockets ----------------------------------------------------------

#define MAX_PASSED_FDS 4

devbuf_status devbuf__send_with_fds(int socket, const void *bytes, size_t size, const int *fds,
                                    size_t fd_count) {
  if (fd_count > MAX_PASSED_FDS)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%zu descriptors, more than %d", fd_count,
                         MAX_PASSED_FDS);
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
    piece.iov_base = (char *)bytes + sent;
    piece.iov_len = size - sent;
    message.msg_control = NULL;
    message.msg_controllen = 0;
  }
  return DEVBUF_OK;
}

static void close_all(int *fds, size_t count) {
  for (size_t i = 0; i < count; i++) close(fds[i]);
}

// Takes the descriptors out of a received message's control data (closing those over `max`).
static bool collect_fds(struct msghdr *message, int *fds, size_t max, size_t *count) {
  bool fits = true;
  for (struct cmsghdr *header = CMSG_FIRSTHDR(message); header;
       header = CMSG_NXTHDR(message, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
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
    char space[CMSG_SPACE(sizeof(int) * (MAX_PASSED_FDS + 4))];
  } control;
  size_t received = 0, count = 0;
  bool fits = true, cut = false;
  while (received < size) {
    struct iovec piece = {.iov_base = (char *)bytes + received, .iov_len = size - received};
    struct msghdr message = {.msg_iov = &piece, .msg_iovlen = 1};
    message.msg_control = control.space;
    message.msg_controllen = sizeof control.space;
    ssize_t done = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    if (done < 0 && errno == EINTR) continue;
    if (done > 0) {
      fits = collect_fds(&message, fds, max_fds, &count) && fits;
      cut = cut || (message.msg_flags & (MSG_CTRUNC | MSG_TRUNC));
    }
    if (done <= 0) {
      int error = errno;
      close_all(fds, count);
      return devbuf__error(DEVBUF_IO_ERROR, "receiving %zu bytes on socket %d: %s after %zu", size,
                           socket, done < 0 ? strerror(error) : "the peer closed it", received);
    }
    received += (size_t)done;
    if (cut) break;
  }
  if (!fits || cut) {
    close_all(fds, count);
    return devbuf__error(
        DEVBUF_FORMAT_ERROR, "a message of %zu bytes came %s: at most %zu descriptors belong to it",
        size, cut ? "cut short (truncated data or descriptors)" : "with too many descriptors",
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

void devbuf__shared_wake(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

int devbuf__process_watch(int pid) {
#ifdef SYS_pidfd_open
  return (int)syscall(SYS_pidfd_open, pid, 0);
#else
  (void)pid;
  return -1;
#endif
}

bool devbuf__process_alive(int watch, int pid) {
  if (watch >= 0) { // readable once the process has ended, reaped or not
    struct pollfd ended = {.fd = watch, .events = POLLIN};
    return poll(&ended, 1, 0) == 0;
  }
  return kill(pid, 0) == 0 || errno == EPERM;
}
