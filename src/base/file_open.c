// Opening files that devbuf reads (weight files, mapped files, traces). Only regular files
// are read: a FIFO, a device or a socket could block forever or change under a mapping.
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

// File systems whose regular files are made up when read (/proc, /sys, cgroups, debugfs,
// tracefs): the size they report says nothing of their content (0, or a page).
static const char *pseudo_file_system(int fd) {
  struct statfs where;
  if (fstatfs(fd, &where) != 0) return NULL;
  switch ((unsigned long)where.f_type) {
  case 0x9fa0ul:
    return "proc";
  case 0x62656572ul:
    return "sysfs";
  case 0x27e0ebul:
    return "cgroup";
  case 0x63677270ul:
    return "cgroup2";
  case 0x64626720ul:
    return "debugfs";
  case 0x74726163ul:
    return "tracefs";
  default:
    return NULL;
  }
}

static const char *file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "something else";
}

devbuf_status devbuf__open_regular_file(const char *path, int *out_fd, uint64_t *out_size) {
  // Non-blocking, so that opening a FIFO with no writer returns at once instead of waiting
  // for one; the flag is cleared once the file is known to be regular (where it means nothing).
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return devbuf__error(DEVBUF_IO_ERROR, "cannot open '%.200s': %s", path, strerror(errno));
  struct stat info;
  if (fstat(fd, &info) != 0) {
    int error = errno;
    close(fd);
    return devbuf__error(DEVBUF_IO_ERROR, "cannot stat '%.200s': %s", path, strerror(error));
  }
  if (!S_ISREG(info.st_mode)) {
    close(fd);
    return devbuf__error(DEVBUF_IO_ERROR,
                         "'%.200s' is %s, not a regular file (devbuf reads regular files only)",
                         path, file_kind(info.st_mode));
  }
  const char *pseudo = pseudo_file_system(fd);
  if (pseudo) {
    close(fd);
    return devbuf__error(DEVBUF_IO_ERROR,
                         "'%.200s' is a file of %s, made up as it is read: its size (%llu bytes) "
                         "says nothing of its content (devbuf reads files of real file systems)",
                         path, pseudo, (unsigned long long)info.st_size);
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  *out_fd = fd;
  *out_size = (uint64_t)info.st_size;
  return DEVBUF_OK;
}

devbuf_status devbuf__read_at(int fd, void *out, size_t size, uint64_t offset, const char *path) {
  size_t done = 0;
  while (done < size) {
    ssize_t got = pread(fd, (char *)out + done, size - done, (off_t)(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return devbuf__error(DEVBUF_IO_ERROR, "cannot read %zu bytes at %llu of '%.200s': %s",
                           size - done, (unsigned long long)(offset + done), path,
                           got < 0 ? strerror(errno)
                                   : "the file is shorter than it was (changed while being read)");
    done += (size_t)got;
  }
  return DEVBUF_OK;
}
