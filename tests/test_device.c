// Device specs: cpu opens (once per spec), opencl:N and cuda:N parse and answer
// UNAVAILABLE with a reason, malformed specs are refused; buffers hold their device, also
// against its last reference going on another thread at once. Run under TSan.
#include "check.h"

#include <pthread.h>

static void test_open_cpu(void) {
  devbuf_device_t *a = NULL, *b = NULL;
  CHECK_OK(devbuf_device_open("cpu", &a));
  CHECK_OK(devbuf_device_open("cpu:0", &b));
  CHECK(a == b); // one device (and one caching allocator) per spec
  CHECK(devbuf_device_kind_of(a) == DEVBUF_DEVICE_CPU);
  CHECK(strcmp(devbuf_device_spec(a), "cpu") == 0);
  CHECK(strlen(devbuf_device_name(a)) > 0);
  size_t page = devbuf_device_page_size(a);
  CHECK(page >= 4096 && (page & (page - 1)) == 0);
  devbuf_allocator_t *allocator = devbuf_device_allocator(a);
  CHECK(allocator && strcmp(devbuf_allocator_kind(allocator), "caching") == 0);
  CHECK(devbuf_allocator_device(allocator) == a);
  CHECK_OK(devbuf_device_synchronize(a));
  devbuf_device_info_t info;
  CHECK_OK(devbuf_device_info(a, &info));
  CHECK(info.processor == DEVBUF_PROCESSOR_CPU && info.host_unified);
  devbuf_device_release(b);
  devbuf_device_release(a);
}

static void test_allocator_keeps_device_alive(void) {
  devbuf_device_t *device = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  devbuf_allocator_t *allocator = devbuf_allocator_retain(devbuf_device_allocator(device));
  devbuf_device_release(device); // the allocator reference keeps the device
  devbuf_buffer_t *buffer = NULL;
  size_t shape[] = {16};
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, shape, 1, 0, &buffer));
  devbuf_allocator_release(allocator); // now the buffer keeps it
  CHECK(strcmp(devbuf_device_spec(devbuf_buffer_device(buffer)), "cpu") == 0);
  devbuf_buffer_release(buffer);
}

static uint64_t system_allocations_of(devbuf_device_t *device) {
  devbuf_allocator_stats_t stats;
  CHECK_OK(devbuf_allocator_stats(devbuf_device_allocator(device), &stats));
  return stats.system_allocs; // a fresh allocator has made none
}

static void *release_buffer(void *buffer) {
  devbuf_buffer_release(buffer);
  return NULL;
}

// Buffers hold their device without its reference count: the device's last reference going
// leaves it alive while a buffer holds it (opening the spec again finds it, with what its
// allocator did), and the last hold going, on another thread than the one that took it,
// destroys it (opening again makes a new device: a fresh allocator that has done nothing).
static void test_buffers_hold_the_device(void) {
  size_t shape[] = {1024};
  devbuf_device_t *device = NULL, *again = NULL;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_FLOAT32, shape, 1, 0,
                                  &buffer));
  uint64_t made = system_allocations_of(device);
  CHECK(made >= 1);
  devbuf_device_release(device); // the buffer holds it
  CHECK_OK(devbuf_device_open("cpu", &again));
  CHECK(again == device && system_allocations_of(again) == made); // the same device, alive
  devbuf_device_release(again);
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, release_buffer, buffer) == 0);
  pthread_join(thread, NULL); // the last hold went there: the device went with it
  CHECK_OK(devbuf_device_open("cpu", &again));
  CHECK(system_allocations_of(again) == 0);
  devbuf_device_release(again);
}

// The device's last reference and its buffers' holds going at once, on more threads than
// have a counter line of their own (the rest share one), and on new threads each round, that
// take over the lines of the last round's exited ones with their counts: each round the
// device goes once, when the last of them goes, and never before (the sanitizer suites would
// see a buffer's device used after it went). Opening the spec again makes a fresh device.
#define HOLDERS      20
#define HOLD_ROUNDS  25
#define HELD_BUFFERS 6

static pthread_barrier_t holders_ready;
static devbuf_device_t *held_device;

static void *hold_then_release(void *unused) {
  (void)unused;
  devbuf_buffer_t *buffers[HELD_BUFFERS] = {0};
  size_t shape[] = {64};
  for (int i = 0; i < HELD_BUFFERS; i++)
    CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(held_device), DEVBUF_FLOAT32, shape, 1,
                                    0, &buffers[i]));
  pthread_barrier_wait(&holders_ready); // every hold is taken; then all go at once
  for (int i = 0; i < HELD_BUFFERS; i++) devbuf_buffer_release(buffers[i]);
  return NULL;
}

static void test_holds_and_the_last_reference_race(void) {
  CHECK_OK(devbuf_device_open("cpu", &held_device));
  for (int round = 0; round < HOLD_ROUNDS; round++) {
    CHECK(system_allocations_of(held_device) == 0); // a fresh device
    pthread_t threads[HOLDERS];
    CHECK(pthread_barrier_init(&holders_ready, NULL, HOLDERS + 1) == 0);
    for (int i = 0; i < HOLDERS; i++)
      CHECK(pthread_create(&threads[i], NULL, hold_then_release, NULL) == 0);
    pthread_barrier_wait(&holders_ready);
    devbuf_device_release(held_device);
    for (int i = 0; i < HOLDERS; i++) pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&holders_ready);
    CHECK_OK(devbuf_device_open("cpu", &held_device));
  }
  devbuf_device_release(held_device);
}

// Backends not built (cuda), and devices that do not exist (there are never 57 OpenCL
// devices here; with no OpenCL at all the reason differs but the status is the same).
static void test_unavailable_devices(void) {
  const char *specs[] = {"opencl:57", "cuda:0", "cuda:3"};
  for (size_t i = 0; i < 3; i++) {
    devbuf_device_t *device = NULL;
    CHECK_STATUS(devbuf_device_open(specs[i], &device), DEVBUF_UNAVAILABLE);
    CHECK_MESSAGE(specs[i]);
    CHECK(device == NULL);
  }
  devbuf_device_t *device = NULL;
  CHECK_STATUS(devbuf_device_open("cpu:1", &device), DEVBUF_UNAVAILABLE);
  CHECK_MESSAGE("cpu:1");
}

static void test_malformed_specs(void) {
  const char *bad[] = {"",    "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "opencl:99999999999",
                       "CPU", "cpu0"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    devbuf_device_t *device = NULL;
    CHECK_STATUS(devbuf_device_open(bad[i], &device), DEVBUF_INVALID_ARGUMENT);
    CHECK(device == NULL);
  }
  CHECK_STATUS(devbuf_device_open(NULL, NULL), DEVBUF_INVALID_ARGUMENT);
}

int main(void) {
  RUN(test_open_cpu);
  RUN(test_allocator_keeps_device_alive);
  RUN(test_buffers_hold_the_device);
  RUN(test_holds_and_the_last_reference_race);
  RUN(test_unavailable_devices);
  RUN(test_malformed_specs);
  return CHECK_EXIT();
}
