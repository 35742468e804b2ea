// Model-based stress of queues and the hazard tracker: threads run random operations
// (work that writes, adds and copies views on random shared queues; host reads and writes;
// releases and lazy re-creation, which reuse memory with work still pending; waits) and
// compare every byte the host reads with a sequential model of what the bytes must be.
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define THREADS        4
#define OPS_PER_THREAD 250000 // 1,000,000 in all
#define BUFFERS        4
#define BYTES          256
#define QUEUES         3

static devbuf_device_t *device;
static devbuf_queue_t *queues[QUEUES];
static atomic_ullong mismatches, failures, reused_in_flight;

static devbuf_status set_kernel(const devbuf_kernel_args_t *args) {
  memset(args->data[0], *(const unsigned char *)args->scalars, args->sizes[0]);
  return DEVBUF_OK;
}

static devbuf_status add_kernel(const devbuf_kernel_args_t *args) {
  unsigned char *dst = args->data[0];
  const unsigned char *src = args->data[1];
  for (size_t i = 0; i < args->sizes[0]; i++) dst[i] = (unsigned char)(dst[i] + src[i]);
  return DEVBUF_OK;
}

typedef struct model {
  devbuf_buffer_t *buffer[BUFFERS];
  unsigned char bytes[BUFFERS][BYTES];
  bool known[BUFFERS][BYTES]; // a fresh buffer's bytes are unknown until written
  uint64_t rng;
} model;

static uint64_t next_random(model *m) {
  m->rng ^= m->rng << 13;
  m->rng ^= m->rng >> 7;
  m->rng ^= m->rng << 17;
  return m->rng;
}

static void failed(const char *what) {
  atomic_fetch_add(&failures, 1);
  fprintf(stderr, "model: %s failed: %s\n", what, devbuf_last_error());
}

static devbuf_buffer_t *fresh(void) {
  devbuf_buffer_t *buffer = NULL;
  size_t size = BYTES;
  if (devbuf_buffer_new(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &buffer) !=
      DEVBUF_OK)
    failed("new");
  return buffer;
}

// A random view [offset, offset + length) of 1 to BYTES bytes.
static void random_range(model *m, size_t *offset, size_t *length) {
  *offset = next_random(m) % BYTES;
  *length = 1 + next_random(m) % (BYTES - *offset);
}

static devbuf_buffer_t *view(devbuf_buffer_t *buffer, size_t offset, size_t length) {
  devbuf_buffer_t *result = NULL;
  if (devbuf_buffer_view(buffer, offset, length, &result) != DEVBUF_OK) failed("view");
  return result;
}

static void compare(model *m, int b, size_t offset, const unsigned char *got, size_t length) {
  for (size_t i = 0; i < length; i++) {
    if (m->known[b][offset + i] && got[i] != m->bytes[b][offset + i]) {
      if (atomic_fetch_add(&mismatches, 1) < 5)
        fprintf(stderr, "model: buffer %d byte %zu is %u, expected %u\n", b, offset + i, got[i],
                m->bytes[b][offset + i]);
    }
  }
}

static void operation(model *m) {
  int b = (int)(next_random(m) % BUFFERS);
  devbuf_queue_t *queue = queues[next_random(m) % QUEUES];
  size_t offset, length;
  random_range(m, &offset, &length);
  switch (next_random(m) % 9) {
  case 0:
  case 1: { // work: set a view to a value
    unsigned char value = (unsigned char)next_random(m);
    devbuf_buffer_t *v = view(m->buffer[b], offset, length);
    devbuf_use_t use = {v, DEVBUF_ACCESS_WRITE};
    if (devbuf_queue_submit(queue, set_kernel, &use, 1, &value, 1) != DEVBUF_OK)
      failed("submit set");
    devbuf_buffer_release(v);
    memset(&m->bytes[b][offset], value, length);
    memset(&m->known[b][offset], 1, length);
    break;
  }
  case 2:
  case 3: { // work: add a view of another buffer into a view of this one
    int source = (int)((b + 1 + next_random(m) % (BUFFERS - 1)) % BUFFERS);
    size_t source_offset = next_random(m) % (BYTES - length + 1);
    devbuf_buffer_t *dst = view(m->buffer[b], offset, length),
                    *src = view(m->buffer[source], source_offset, length);
    devbuf_use_t uses[2] = {{dst, DEVBUF_ACCESS_READ_WRITE}, {src, DEVBUF_ACCESS_READ}};
    bool copy = next_random(m) % 2;
    devbuf_status status = copy ? devbuf_queue_copy(queue, dst, src)
                                : devbuf_queue_submit(queue, add_kernel, uses, 2, NULL, 0);
    if (status != DEVBUF_OK) failed(copy ? "copy" : "submit add");
    for (size_t i = 0; i < length; i++) {
      unsigned char s = m->bytes[source][source_offset + i];
      m->bytes[b][offset + i] = copy ? s : (unsigned char)(m->bytes[b][offset + i] + s);
      m->known[b][offset + i] =
          m->known[source][source_offset + i] && (copy || m->known[b][offset + i]);
    }
    devbuf_buffer_release(dst);
    devbuf_buffer_release(src);
    break;
  }
  case 4: { // host read of a view (waits for the work that writes it)
    devbuf_buffer_t *v = view(m->buffer[b], offset, length);
    const void *data = NULL;
    if (devbuf_buffer_contents_wait(v, &data, NULL) != DEVBUF_OK) {
      failed("contents_wait");
    } else {
      compare(m, b, offset, data, length);
      devbuf_buffer_end_access(v, data);
    }
    devbuf_buffer_release(v);
    break;
  }
  case 5: { // host write of a view (waits for all work on it)
    devbuf_buffer_t *v = view(m->buffer[b], offset, length);
    void *data = NULL;
    if (devbuf_buffer_contents_mut_wait(v, &data, NULL) != DEVBUF_OK) {
      failed("contents_mut_wait");
    } else {
      unsigned char value = (unsigned char)next_random(m);
      memset(data, value, length);
      devbuf_buffer_end_access(v, data);
      memset(&m->bytes[b][offset], value, length);
      memset(&m->known[b][offset], 1, length);
    }
    devbuf_buffer_release(v);
    break;
  }
  case 6: { // copyout of the whole buffer
    unsigned char got[BYTES];
    if (devbuf_buffer_copyout(m->buffer[b], got, BYTES) != DEVBUF_OK)
      failed("copyout");
    else
      compare(m, b, 0, got, BYTES);
    break;
  }
  case 7: // release with work maybe in flight; the next buffer is lazy and may reuse memory
    if (devbuf_buffer_in_use(m->buffer[b])) atomic_fetch_add(&reused_in_flight, 1);
    devbuf_buffer_release(m->buffer[b]);
    m->buffer[b] = fresh();
    memset(m->known[b], 0, BYTES);
    break;
  default: // wait for the buffer's work
    if (devbuf_buffer_wait(m->buffer[b]) != DEVBUF_OK) failed("wait");
    if (devbuf_buffer_in_use(m->buffer[b])) failed("in_use after wait");
    break;
  }
}

static void *worker(void *arg) {
  model *m = calloc(1, sizeof *m);
  m->rng = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 7);
  for (int b = 0; b < BUFFERS; b++) m->buffer[b] = fresh();
  for (int op = 0; op < OPS_PER_THREAD; op++) operation(m);
  for (int b = 0; b < BUFFERS; b++) { // a last full check
    unsigned char got[BYTES];
    if (devbuf_buffer_copyout(m->buffer[b], got, BYTES) == DEVBUF_OK) compare(m, b, 0, got, BYTES);
    devbuf_buffer_release(m->buffer[b]);
  }
  free(m);
  return NULL;
}

static void test_model(void) {
  for (int q = 0; q < QUEUES; q++) CHECK_OK(devbuf_queue_create(device, &queues[q]));
  pthread_t threads[THREADS];
  for (size_t i = 0; i < THREADS; i++) pthread_create(&threads[i], NULL, worker, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
  for (int q = 0; q < QUEUES; q++) {
    CHECK_OK(devbuf_queue_finish(queues[q]));
    devbuf_queue_release(queues[q]);
  }
  CHECK_EQ_U(atomic_load(&failures), 0);
  CHECK_EQ_U(atomic_load(&mismatches), 0);
  CHECK(atomic_load(&reused_in_flight) > 0); // the run did release buffers with work in flight
  devbuf_allocator_stats_t s = stats_of(devbuf_device_allocator(device));
  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.live_buffers, 0);
  printf(
      "model: %d operations, %llu releases with work in flight, 0 mismatches expected, %llu seen\n",
      THREADS * OPS_PER_THREAD, (unsigned long long)atomic_load(&reused_in_flight),
      (unsigned long long)atomic_load(&mismatches));
}

int main(void) {
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) return 1;
  RUN(test_model);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
