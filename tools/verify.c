// The parallel verification of verify.h.
#include "verify.h"
#include "checksum.h"
#include "sha256.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct sized {
  size_t size, index;
} sized;

typedef struct job {
  const devbuf_tensor_file_t *file;
  devbuf_tool_digest_kind kind;
  devbuf_tool_digest *digests;
  sized *order; // tensors, largest first
  size_t count;
  atomic_size_t next;
  atomic_uint_least64_t done;
  atomic_int failed;
  devbuf_status status;
  char message[512];
  pthread_mutex_t lock;
} job;

static void digest_of(devbuf_tool_digest_kind kind, const void *data, size_t size,
                      devbuf_tool_digest *out) {
  if (kind == DEVBUF_TOOL_CHECKSUM) {
    out->checksum = devbuf_tool_checksum(data, size);
    return;
  }
  devbuf_sha256 hash;
  devbuf_sha256_init(&hash);
  devbuf_sha256_update(&hash, data, size);
  devbuf_sha256_final(&hash, out->sha256);
}

#define GUARDED_CHUNK ((size_t)1 << 20)

// A mapped file's tensor hashed through copyout, a chunk at a time: a file cut short
// meanwhile is IO_ERROR, where hashing the mapping in place faulted (SIGBUS). The checksum
// (the load benchmark's) still reads in place: it measures zero-copy reading.
static devbuf_status sha256_of_mapped(devbuf_buffer_t *buffer, devbuf_tool_digest *out) {
  size_t size = devbuf_buffer_size(buffer);
  unsigned char *chunk = malloc(GUARDED_CHUNK);
  if (!chunk) return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no host memory to check a tensor");
  devbuf_sha256 hash;
  devbuf_sha256_init(&hash);
  devbuf_status status = DEVBUF_OK;
  for (size_t at = 0; at < size && status == DEVBUF_OK; at += GUARDED_CHUNK) {
    size_t length = size - at < GUARDED_CHUNK ? size - at : GUARDED_CHUNK;
    devbuf_buffer_t *piece = NULL;
    status = devbuf_buffer_view(buffer, at, length, &piece);
    if (status == DEVBUF_OK) status = devbuf_buffer_copyout(piece, chunk, length);
    if (status == DEVBUF_OK) devbuf_sha256_update(&hash, chunk, length);
    devbuf_buffer_release(piece);
  }
  if (status == DEVBUF_OK) devbuf_sha256_final(&hash, out->sha256);
  free(chunk);
  return status;
}

// The digest of a tensor's bytes, read in place when the CPU can, else copied out.
static devbuf_status tensor_digest(devbuf_buffer_t *buffer, devbuf_tool_digest_kind kind,
                                   devbuf_tool_digest *out) {
  if (kind == DEVBUF_TOOL_SHA256 && devbuf_buffer_is_mapped(buffer))
    return sha256_of_mapped(buffer, out);
  if (devbuf_buffer_is_cpu_accessible(buffer)) {
    const void *data;
    size_t size;
    devbuf_status status = devbuf_buffer_contents_wait(buffer, &data, &size);
    if (status != DEVBUF_OK) return status;
    digest_of(kind, data, size, out);
    return devbuf_buffer_end_access(buffer, data);
  }
  size_t size = devbuf_buffer_size(buffer);
  void *copy = malloc(size ? size : 1);
  if (!copy)
    return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no host memory to check %zu bytes", size);
  devbuf_status status = devbuf_buffer_copyout(buffer, copy, size);
  if (status == DEVBUF_OK) digest_of(kind, copy, size, out);
  free(copy);
  return status;
}

// Takes tensors until none is left; the calling thread also reports progress.
static void work(job *j, void (*progress)(void *context, uint64_t done, uint64_t total),
                 void *context) {
  for (size_t n; !atomic_load(&j->failed) && (n = atomic_fetch_add(&j->next, 1)) < j->count;) {
    size_t index = j->order[n].index;
    devbuf_buffer_t *buffer = devbuf_tensor_file_buffer(j->file, index);
    devbuf_status status = tensor_digest(buffer, j->kind, &j->digests[index]);
    if (status != DEVBUF_OK) {
      pthread_mutex_lock(&j->lock);
      if (!atomic_exchange(&j->failed, 1)) { // the message is thread-local: keep the first
        j->status = status;
        const char *message = devbuf_last_error(),
                   *text = strstr(message, ": "); // after "STATUS: "
        strncpy(j->message, text ? text + 2 : message, sizeof j->message - 1);
      }
      pthread_mutex_unlock(&j->lock);
      break;
    }
    uint64_t done =
        atomic_fetch_add(&j->done, devbuf_buffer_size(buffer)) + devbuf_buffer_size(buffer);
    if (progress) progress(context, done, devbuf_tensor_file_data_size(j->file));
  }
}

static void *worker(void *argument) {
  work(argument, NULL, NULL);
  return NULL;
}

static int larger_first(const void *a, const void *b) {
  const sized *x = a, *y = b;
  return (x->size < y->size) - (x->size > y->size);
}

devbuf_status devbuf_tool_verify(const devbuf_tensor_file_t *file, devbuf_tool_digest_kind kind,
                                 devbuf_tool_digest *digests, unsigned threads,
                                 void (*progress)(void *context, uint64_t done, uint64_t total),
                                 void *context) {
  size_t count = devbuf_tensor_file_count(file);
  if (!threads) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cpus < 1 ? 1 : cpus > 64 ? 64 : (unsigned)cpus;
  }
  job j = {.file = file, .kind = kind, .digests = digests, .count = count, .status = DEVBUF_OK};
  j.order = malloc((count ? count : 1) * sizeof *j.order);
  pthread_t *workers = malloc(threads * sizeof *workers);
  if (!j.order || !workers) {
    free(j.order);
    free(workers);
    return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no memory to verify %zu tensors", count);
  }
  for (size_t i = 0; i < count; i++)
    j.order[i] = (sized){devbuf_buffer_size(devbuf_tensor_file_buffer(file, i)), i};
  qsort(j.order, count, sizeof *j.order, larger_first);
  pthread_mutex_init(&j.lock, NULL);
  unsigned started = 0;
  for (; started + 1 < threads; started++)
    if (pthread_create(&workers[started], NULL, worker, &j) != 0) break;
  work(&j, progress, context);
  for (unsigned i = 0; i < started; i++) pthread_join(workers[i], NULL);
  uint64_t total = devbuf_tensor_file_data_size(file);
  if (progress && !atomic_load(&j.failed)) progress(context, total, total);
  pthread_mutex_destroy(&j.lock);
  free(j.order);
  free(workers);
  if (atomic_load(&j.failed)) return devbuf_set_error(j.status, "%s", j.message);
  return DEVBUF_OK;
}
