// Buffers of a device's own allocator, which devbuf_buffer_allocate and
// devbuf_buffer_release serve without a call when the thread has everything at hand: each
// case here is one where they must hand over to the general way instead (a view or a
// retain alive, an open host access, full thread bins and record cache, a thread that has
// never asked, a release on another thread, a lazy or empty buffer, zeroed memory, a device
// released first), checked by what a program sees: the bytes, and the allocator's live
// buffers and active bytes back where they started.
#include "check.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

static devbuf_device_t *device;
static devbuf_allocator_t *allocator;

static devbuf_buffer_t *allocate(size_t bytes, uint32_t flags) {
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &bytes, 1, flags, &buffer));
  return buffer;
}

static unsigned char *bytes_of(devbuf_buffer_t *buffer) {
  void *data = NULL;
  CHECK_OK(devbuf_buffer_unsynchronized_ptr(buffer, &data, NULL));
  return data;
}

// Writes `seed`-derived bytes over the buffer; whether they are still there.
static void fill(devbuf_buffer_t *buffer, size_t size, unsigned seed) {
  unsigned char *data = bytes_of(buffer);
  for (size_t i = 0; i < size; i++) data[i] = (unsigned char)(seed * 31 + i * 7);
}
static bool holds(devbuf_buffer_t *buffer, size_t size, unsigned seed) {
  const unsigned char *data = bytes_of(buffer);
  for (size_t i = 0; i < size; i++)
    if (data[i] != (unsigned char)(seed * 31 + i * 7)) return false;
  return true;
}

typedef struct figures {
  uint64_t live, active;
} figures;
static figures figures_now(void) {
  devbuf_allocator_stats_t stats = stats_of(allocator);
  return (figures){stats.live_buffers, stats.active};
}
#define CHECK_BACK_TO(before)                 \
  do {                                        \
    figures now_ = figures_now();             \
    CHECK_EQ_U(now_.live, (before).live);     \
    CHECK_EQ_U(now_.active, (before).active); \
  } while (0)

// Allocate, write, release, many times over: each buffer holds what was written to it and
// the allocator ends where it began.
static void test_steady_cycles(void) {
  figures before = figures_now();
  for (unsigned i = 0; i < 20000; i++) {
    size_t size = (size_t)64 << (i % 8); // 64 B .. 8 KiB
    devbuf_buffer_t *buffer = allocate(size, 0);
    fill(buffer, size, i);
    CHECK(holds(buffer, size, i));
    CHECK_EQ_U(devbuf_buffer_size(buffer), size);
    devbuf_buffer_release(buffer);
  }
  CHECK_BACK_TO(before);
}

// More buffers alive at once than a thread's bins and record cache keep: every one has
// bytes of its own, and all go back.
static void test_more_than_the_caches_keep(void) {
  enum { COUNT = 3000, SIZE = 4096 };
  static devbuf_buffer_t *buffers[COUNT];
  figures before = figures_now();
  for (unsigned round = 0; round < 3; round++) {
    for (unsigned i = 0; i < COUNT; i++) {
      buffers[i] = allocate(SIZE, 0);
      fill(buffers[i], SIZE, i + round);
    }
    CHECK_EQ_U(figures_now().live, before.live + COUNT);
    unsigned intact = 0;
    for (unsigned i = 0; i < COUNT; i++) intact += holds(buffers[i], SIZE, i + round);
    CHECK_EQ_U(intact, COUNT);
    for (unsigned i = 0; i < COUNT; i++)
      devbuf_buffer_release(buffers[round % 2 ? i : COUNT - 1 - i]);
    CHECK_BACK_TO(before);
  }
}

// A view, a retain or an open host access keeps the memory when the first handle goes:
// buffers made in between do not get its bytes.
static void test_what_keeps_the_memory(void) {
  enum { SIZE = 4096 };
  figures before = figures_now();
  for (int way = 0; way < 3; way++) {
    devbuf_buffer_t *buffer = allocate(SIZE, 0);
    fill(buffer, SIZE, 5);
    devbuf_buffer_t *keeper = NULL;
    void *data = NULL;
    if (way == 0) CHECK_OK(devbuf_buffer_view(buffer, 0, SIZE, &keeper));
    if (way == 1) keeper = devbuf_buffer_retain(buffer);
    if (way == 2) { // the access closes with the handle; the memory goes with it
      CHECK_OK(devbuf_buffer_contents_mut(buffer, &data, NULL));
      devbuf_buffer_release(buffer);
      CHECK_BACK_TO(before);
      continue;
    }
    devbuf_buffer_release(buffer);
    CHECK_EQ_U(figures_now().live, before.live + 1);
    devbuf_buffer_t *others[64];
    for (unsigned i = 0; i < 64; i++) {
      others[i] = allocate(SIZE, 0);
      fill(others[i], SIZE, 100 + i);
    }
    CHECK(holds(keeper, SIZE, 5));
    for (unsigned i = 0; i < 64; i++) devbuf_buffer_release(others[i]);
    devbuf_buffer_release(keeper);
    CHECK_BACK_TO(before);
  }
}

// Lazy, empty and zeroed buffers.
static void test_lazy_empty_and_zeroed(void) {
  figures before = figures_now();
  size_t bytes = 4096;
  devbuf_buffer_t *lazy = NULL;
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_UINT8, &bytes, 1, 0, &lazy));
  CHECK(!devbuf_buffer_is_allocated(lazy));
  devbuf_buffer_release(lazy);
  CHECK_BACK_TO(before);
  devbuf_buffer_t *empty = allocate(0, 0);
  CHECK_EQ_U(devbuf_buffer_size(empty), 0);
  devbuf_buffer_release(empty);
  CHECK_BACK_TO(before);
  for (int i = 0; i < 3; i++) { // dirty blocks in the bins first, then zeroed ones
    devbuf_buffer_t *dirty = allocate(bytes, 0);
    fill(dirty, bytes, 9);
    devbuf_buffer_release(dirty);
    devbuf_buffer_t *zeroed = allocate(bytes, DEVBUF_BUFFER_ZERO);
    const unsigned char *data = bytes_of(zeroed);
    size_t nonzero = 0;
    for (size_t j = 0; j < bytes; j++) nonzero += data[j] != 0;
    CHECK_EQ_U(nonzero, 0);
    devbuf_buffer_release(zeroed);
  }
  CHECK_BACK_TO(before);
}

static void *cycle_on_new_thread(void *arg) {
  (void)arg;
  for (unsigned i = 0; i < 500; i++) { // the first calls find nothing at hand
    devbuf_buffer_t *buffer = allocate(4096, 0);
    fill(buffer, 4096, i);
    CHECK(holds(buffer, 4096, i));
    devbuf_buffer_release(buffer);
  }
  return NULL;
}

static void *release_all(void *arg) {
  devbuf_buffer_t **buffers = arg;
  for (unsigned i = 0; i < 256; i++) {
    CHECK(holds(buffers[i], 1024, i));
    devbuf_buffer_release(buffers[i]);
  }
  return NULL;
}

// Threads that never asked before, one after another, and buffers made on one thread and
// released on another.
static void test_threads(void) {
  figures before = figures_now();
  for (int i = 0; i < 8; i++) {
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, cycle_on_new_thread, NULL) == 0);
    pthread_join(thread, NULL);
  }
  CHECK_BACK_TO(before);
  static devbuf_buffer_t *buffers[256];
  for (int round = 0; round < 4; round++) {
    for (unsigned i = 0; i < 256; i++) {
      buffers[i] = allocate(1024, 0);
      fill(buffers[i], 1024, i);
    }
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, release_all, buffers) == 0);
    pthread_join(thread, NULL);
    CHECK_BACK_TO(before);
  }
}

// Under a memory limit the thread bins hold nothing: every buffer goes the general way, a
// refusal names the request, and the buffers made before it are intact.
static void test_under_a_limit(void) {
  figures before = figures_now();
  devbuf_caching_options_t limited = {.memory_limit = 64u << 20};
  CHECK_OK(devbuf_caching_allocator_set_options(allocator, &limited));
  devbuf_buffer_t *buffers[8];
  for (unsigned i = 0; i < 8; i++) {
    buffers[i] = allocate(4u << 20, 0);
    fill(buffers[i], 4096, i);
  }
  size_t too_much = 128u << 20;
  devbuf_buffer_t *refused = NULL;
  CHECK_STATUS(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &too_much, 1, 0, &refused),
               DEVBUF_OUT_OF_MEMORY);
  CHECK(refused == NULL);
  CHECK_MESSAGE("134217728");
  CHECK_EQ_U(figures_now().live, before.live + 8);
  for (unsigned i = 0; i < 8; i++) {
    CHECK(holds(buffers[i], 4096, i));
    devbuf_buffer_release(buffers[i]);
  }
  devbuf_caching_options_t unlimited = {0};
  CHECK_OK(devbuf_caching_allocator_set_options(allocator, &unlimited));
  CHECK_BACK_TO(before);
}

// The device released while its buffers live (the test's only reference to it: "cpu" opens
// the one CPU device): they work on, and the last one's release ends the device (the
// sanitizer suites see a leak or a use after free otherwise). Runs last.
static void test_device_released_first(void) {
  devbuf_buffer_t *buffers[16];
  for (unsigned i = 0; i < 16; i++) {
    buffers[i] = allocate(4096, 0);
    fill(buffers[i], 4096, i);
  }
  devbuf_device_release(device);
  device = NULL;
  for (unsigned i = 0; i < 16; i++) {
    CHECK(holds(buffers[i], 4096, i));
    devbuf_buffer_release(buffers[i]);
  }
  // Gone with its last buffer: "cpu" opens a new device, whose allocator holds nothing yet.
  devbuf_device_t *again = NULL;
  CHECK_OK(devbuf_device_open("cpu", &again));
  if (again) {
    devbuf_allocator_stats_t stats;
    CHECK_OK(devbuf_allocator_stats(devbuf_device_allocator(again), &stats));
    CHECK_EQ_U(stats.reserved, 0);
    devbuf_device_release(again);
  }
}

int main(void) {
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) {
    fprintf(stderr, "cannot open the CPU device: %s\n", devbuf_last_error());
    return 1;
  }
  allocator = devbuf_device_allocator(device);
  RUN(test_steady_cycles);
  RUN(test_more_than_the_caches_keep);
  RUN(test_what_keeps_the_memory);
  RUN(test_lazy_empty_and_zeroed);
  RUN(test_threads);
  RUN(test_under_a_limit);
  RUN(test_device_released_first);
  return CHECK_EXIT();
}
