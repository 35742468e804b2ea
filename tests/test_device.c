// Device specs: cpu opens (once per spec), opencl:N and cuda:N parse and answer
// UNAVAILABLE with a reason, malformed specs are refused.
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
  RUN(test_unavailable_devices);
  RUN(test_malformed_specs);
  return CHECK_EXIT();
}
