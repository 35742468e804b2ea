// Writing safetensors files atomically: header and tensors go to a temporary file in the
// target's folder, which is synced and then renamed over the target.
#include "../core/core.h"
#include "../base/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// A growing text; `failed` sticks once memory runs out.
typedef struct text {
  char *data;
  size_t size, capacity;
  bool failed;
} text;

static void text_append(text *t, const char *bytes, size_t size) {
  if (t->failed) return;
  if (t->size + size + 1 > t->capacity) {
    size_t wanted = t->capacity ? t->capacity : 256;
    while (wanted < t->size + size + 1) wanted *= 2;
    char *bigger = devbuf__malloc(wanted);
    if (!bigger) {
      t->failed = true;
      return;
    }
    if (t->size) memcpy(bigger, t->data, t->size);
    devbuf__free(t->data);
    t->data = bigger;
    t->capacity = wanted;
  }
  memcpy(t->data + t->size, bytes, size);
  t->size += size;
  t->data[t->size] = '\0';
}

static void text_printf(text *t, const char *format, ...) __attribute__((format(printf, 2, 3)));
static void text_printf(text *t, const char *format, ...) {
  char buffer[128];
  va_list args;
  va_start(args, format);
  int length = vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  if (length > 0)
    text_append(t, buffer, (size_t)length < sizeof buffer ? (size_t)length : sizeof buffer - 1);
}

// A JSON string; the caller checked that `s` is valid UTF-8.
static void text_json_string(text *t, const char *s) {
  text_append(t, "\"", 1);
  for (const char *run = s;; s++) {
    unsigned char c = (unsigned char)*s;
    if (c && c != '"' && c != '\\' && c >= 0x20) continue;
    text_append(t, run, (size_t)(s - run));
    if (!c) break;
    if (c == '"' || c == '\\')
      text_printf(t, "\\%c", c);
    else
      text_printf(t, "\\u%04x", c);
    run = s + 1;
  }
  text_append(t, "\"", 1);
}

static devbuf_status check_string(const char *s, const char *what, size_t index) {
  if (!s)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "safetensors_write: %s %zu is NULL", what, index);
  if (!devbuf__utf8_valid(s, strlen(s)))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "safetensors_write: %s %zu is not valid UTF-8",
                         what, index);
  return DEVBUF_OK;
}

typedef struct layout_entry {
  const devbuf_named_buffer_t *tensor;
  size_t element_bytes; // 0 for sub-byte dtypes
} layout_entry;

// Larger elements first, so that each tensor starts aligned to its element size; then by name.
static int compare_layout(const void *a, const void *b) {
  const layout_entry *x = a, *y = b;
  if (x->element_bytes != y->element_bytes) return x->element_bytes > y->element_bytes ? -1 : 1;
  return strcmp(x->tensor->name, y->tensor->name);
}

static int compare_names(const void *a, const void *b) {
  return strcmp(((const layout_entry *)a)->tensor->name, ((const layout_entry *)b)->tensor->name);
}

static devbuf_status write_all(int fd, const void *data, size_t size, const char *path) {
  const char *bytes = data;
  while (size) {
    ssize_t put = write(fd, bytes, size);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0)
      return devbuf__error(DEVBUF_IO_ERROR, "cannot write %zu bytes to '%.200s': %s", size, path,
                           put < 0 ? strerror(errno) : "nothing written");
    bytes += put;
    size -= (size_t)put;
  }
  return DEVBUF_OK;
}

typedef struct file_sink {
  int fd;
  const char *path;
} file_sink;

static devbuf_status write_piece(void *context, const void *data, size_t size) {
  const file_sink *sink = context;
  return write_all(sink->fd, data, size, sink->path);
}

// The permissions a new file gets from open(..., 0666) under this process's umask, read
// without changing the umask (umask() would race with other threads).
static mode_t default_file_mode(void) {
  mode_t mask = 022;
  FILE *status = fopen("/proc/self/status", "re");
  if (status) {
    char line[128];
    unsigned value;
    while (fgets(line, sizeof line, status))
      if (sscanf(line, "Umask: %o", &value) == 1) mask = (mode_t)value;
    fclose(status);
  }
  return 0666 & ~mask;
}

// The file replacing `path` gets its permissions (and its owner and group, where this
// process may set them): rewriting private weights must not make them readable by others.
// A new file gets what open(..., 0666) would give it under the umask.
static devbuf_status take_permissions(int fd, const char *path) {
  struct stat old;
  bool replacing = stat(path, &old) == 0 && S_ISREG(old.st_mode);
  if (replacing && (old.st_uid != geteuid() || old.st_gid != getegid()))
    (void)!fchown(fd, old.st_uid, old.st_gid); // refused unless privileged: then ours, mode kept
  mode_t mode =
      replacing ? old.st_mode & 07777 & ~(mode_t)(S_ISUID | S_ISGID) : default_file_mode();
  if (fchmod(fd, mode) != 0)
    return devbuf__error(DEVBUF_IO_ERROR, "cannot set the permissions of '%.200s' to %04o: %s",
                         path, (unsigned)mode, strerror(errno));
  return DEVBUF_OK;
}

// A temporary name beside `path` that fits the file-name limit whatever the target's name
// is (the target's name plus a suffix may not): "<folder>/.devbuf-XXXXXX". Caller frees.
static char *temporary_name(const char *path) {
  const char *slash = strrchr(path, '/');
  size_t folder = slash ? (size_t)(slash - path) + 1 : 0;
  static const char suffix[] = ".devbuf-XXXXXX";
  char *name = devbuf__malloc(folder + sizeof suffix);
  if (name) {
    memcpy(name, path, folder);
    memcpy(name + folder, suffix, sizeof suffix);
  }
  return name;
}

// The header: metadata first, then tensors in layout order, padded with spaces so that the
// data section starts at a multiple of 8.
static devbuf_status build_header(const layout_entry *layout, size_t count,
                                  const devbuf_metadata_entry_t *metadata, size_t metadata_count,
                                  text *header) {
  text_append(header, "{", 1);
  if (metadata_count) {
    text_append(header, "\"__metadata__\":{", 16);
    for (size_t i = 0; i < metadata_count; i++) {
      if (i) text_append(header, ",", 1);
      text_json_string(header, metadata[i].key);
      text_append(header, ":", 1);
      text_json_string(header, metadata[i].value);
    }
    text_append(header, "}", 1);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < count; i++) {
    devbuf_buffer_t *buffer = layout[i].tensor->buffer;
    if (i || metadata_count) text_append(header, ",", 1);
    text_json_string(header, layout[i].tensor->name);
    text_printf(header, ":{\"dtype\":\"%s\",\"shape\":[",
                devbuf_dtype_safetensors_name(devbuf_buffer_dtype(buffer)));
    const size_t *shape = devbuf_buffer_shape(buffer);
    for (size_t d = 0; d < devbuf_buffer_ndim(buffer); d++)
      text_printf(header, d ? ",%zu" : "%zu", shape[d]);
    uint64_t end = offset + devbuf_buffer_size(buffer);
    text_printf(header, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                (unsigned long long)end);
    offset = end;
  }
  text_append(header, "}", 1);
  while ((header->size + 8) % 8) text_append(header, " ", 1);
  if (header->failed)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "safetensors_write: no host memory for the header");
  if (header->size > DEVBUF_SAFETENSORS_MAX_HEADER)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "safetensors_write: the header takes %zu bytes, over the limit of %u",
                         header->size, DEVBUF_SAFETENSORS_MAX_HEADER);
  return DEVBUF_OK;
}

static devbuf_status write_file(int fd, const text *header, const layout_entry *layout,
                                size_t count, const char *path) {
  unsigned char prefix[8];
  for (int i = 0; i < 8; i++) prefix[i] = (unsigned char)((uint64_t)header->size >> (8 * i));
  devbuf_status status = write_all(fd, prefix, 8, path);
  if (status == DEVBUF_OK) status = write_all(fd, header->data, header->size, path);
  const size_t staging_size = 3u << 20; // whole elements of every dtype, 6-bit ones included
  void *staging = NULL;
  file_sink sink = {fd, path};
  for (size_t i = 0; status == DEVBUF_OK && i < count; i++) {
    devbuf_buffer_t *buffer = layout[i].tensor->buffer;
    if (!staging && devbuf_buffer_size(buffer) && !(staging = devbuf__malloc(staging_size)))
      status = devbuf__error(DEVBUF_OUT_OF_MEMORY,
                             "safetensors_write: no host memory for a staging buffer");
    // Each tensor as one copyout reads it: no work changes it between its pieces.
    if (status == DEVBUF_OK)
      status = devbuf__buffer_read_pieces(buffer, staging, staging_size, write_piece, &sink,
                                          "safetensors_write");
  }
  devbuf__free(staging);
  if (status == DEVBUF_OK) status = take_permissions(fd, path);
  if (status == DEVBUF_OK && fsync(fd) != 0)
    status = devbuf__error(DEVBUF_IO_ERROR, "cannot sync '%.200s': %s", path, strerror(errno));
  return status;
}

// Makes a rename durable: the folder holding `path` is synced too.
static void sync_folder(const char *path) {
  const char *slash = strrchr(path, '/');
  char folder[4096];
  if (!slash) {
    snprintf(folder, sizeof folder, ".");
  } else if ((size_t)(slash - path) < sizeof folder) {
    snprintf(folder, sizeof folder, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  } else {
    return;
  }
  int fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

static int compare_keys(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Every key and value valid UTF-8, and no key twice (found sorted: a million keys must not
// take a million squared comparisons).
static devbuf_status check_metadata(const devbuf_metadata_entry_t *metadata, size_t count) {
  for (size_t i = 0; i < count; i++) {
    devbuf_status status = check_string(metadata[i].key, "metadata key", i);
    if (status == DEVBUF_OK) status = check_string(metadata[i].value, "metadata value", i);
    if (status != DEVBUF_OK) return status;
  }
  if (count < 2) return DEVBUF_OK;
  const char **keys = devbuf__malloc(count * sizeof *keys);
  if (!keys)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY,
                         "safetensors_write: no host memory for %zu metadata keys", count);
  for (size_t i = 0; i < count; i++) keys[i] = metadata[i].key;
  qsort(keys, count, sizeof *keys, compare_keys);
  devbuf_status status = DEVBUF_OK;
  for (size_t i = 1; i < count && status == DEVBUF_OK; i++)
    if (strcmp(keys[i - 1], keys[i]) == 0)
      status = devbuf__error(DEVBUF_INVALID_ARGUMENT,
                             "safetensors_write: metadata key '%.100s' is given twice", keys[i]);
  devbuf__free(keys);
  return status;
}

devbuf_status devbuf_safetensors_write(const char *path, const devbuf_named_buffer_t *tensors,
                                       size_t count, const devbuf_metadata_entry_t *metadata,
                                       size_t metadata_count) {
  if (!path || (!tensors && count) || (!metadata && metadata_count))
    return devbuf__error(
        DEVBUF_INVALID_ARGUMENT,
        "safetensors_write: path, and tensors/metadata when counted, are required");
  devbuf_status checked = check_metadata(metadata, metadata_count);
  if (checked != DEVBUF_OK) return checked;
  // The new file is renamed over the target: that must not replace a device node, a FIFO or
  // a socket (as root, writing to /dev/full made it a regular file). A symlink is replaced
  // itself, not what it points to.
  struct stat target;
  if (lstat(path, &target) == 0 && !S_ISREG(target.st_mode) && !S_ISLNK(target.st_mode))
    return devbuf__error(DEVBUF_IO_ERROR,
                         "safetensors_write: '%.200s' is not a regular file (a %s): refusing to "
                         "replace it",
                         path,
                         S_ISDIR(target.st_mode)    ? "directory"
                         : S_ISFIFO(target.st_mode) ? "FIFO"
                         : S_ISSOCK(target.st_mode) ? "socket"
                                                    : "device");
  layout_entry *layout = devbuf__malloc((count ? count : 1) * sizeof *layout);
  if (!layout)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "safetensors_write: no host memory for %zu entries",
                         count);
  devbuf_status status = DEVBUF_OK;
  for (size_t i = 0; status == DEVBUF_OK && i < count; i++) {
    status = check_string(tensors[i].name, "tensor name", i);
    if (status == DEVBUF_OK && !tensors[i].buffer)
      status = devbuf__error(DEVBUF_INVALID_ARGUMENT,
                             "safetensors_write: tensor '%.100s' has no buffer", tensors[i].name);
    if (status == DEVBUF_OK && strcmp(tensors[i].name, "__metadata__") == 0)
      status = devbuf__error(DEVBUF_INVALID_ARGUMENT,
                             "safetensors_write: '__metadata__' cannot name a tensor");
    if (status == DEVBUF_OK)
      layout[i] = (layout_entry){&tensors[i],
                                 devbuf_dtype_bits(devbuf_buffer_dtype(tensors[i].buffer)) / 8};
  }
  if (status == DEVBUF_OK && count > 1) {
    qsort(layout, count, sizeof *layout, compare_names);
    for (size_t i = 1; status == DEVBUF_OK && i < count; i++)
      if (strcmp(layout[i].tensor->name, layout[i - 1].tensor->name) == 0)
        status = devbuf__error(DEVBUF_INVALID_ARGUMENT,
                               "safetensors_write: tensor '%.100s' is given twice",
                               layout[i].tensor->name);
    qsort(layout, count, sizeof *layout, compare_layout);
  }
  text header = {0};
  if (status == DEVBUF_OK) status = build_header(layout, count, metadata, metadata_count, &header);

  char *temporary = NULL;
  int fd = -1;
  if (status == DEVBUF_OK) {
    temporary = temporary_name(path);
    if (!temporary) {
      status =
          devbuf__error(DEVBUF_OUT_OF_MEMORY, "safetensors_write: no host memory for a file name");
    } else {
      fd = mkostemp(temporary, O_CLOEXEC);
      if (fd < 0)
        status =
            devbuf__error(DEVBUF_IO_ERROR, "cannot create a temporary file beside '%.200s': %s",
                          path, strerror(errno));
    }
  }
  if (status == DEVBUF_OK) status = write_file(fd, &header, layout, count, path);
  if (fd >= 0 && close(fd) != 0 && status == DEVBUF_OK)
    status =
        devbuf__error(DEVBUF_IO_ERROR, "cannot close '%.200s': %s", temporary, strerror(errno));
  if (status == DEVBUF_OK && rename(temporary, path) != 0)
    status = devbuf__error(DEVBUF_IO_ERROR, "cannot rename '%.200s' to '%.200s': %s", temporary,
                           path, strerror(errno));
  if (status == DEVBUF_OK)
    sync_folder(path);
  else if (fd >= 0)
    unlink(temporary);
  devbuf__free(temporary);
  devbuf__free(header.data);
  devbuf__free(layout);
  return status;
}
