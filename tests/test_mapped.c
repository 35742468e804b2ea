// Read-only mapped files (B9): zero-copy, every write refused, alive while any view uses
// them, counted in `mapped`. Reads the shared test data in place.
#include "check.h"

#include <unistd.h>

static devbuf_device_t *device;

static void test_map_shared_file(void) {
  const char *path = test_data("safetensors/burn/mnist.safetensors");
  size_t expected_size = 0;
  unsigned char *expected = test_read_file(path, &expected_size);
  CHECK(expected != NULL && expected_size > 1000000);
  if (!expected) return;
  devbuf_allocator_stats_t before = stats_of(devbuf_device_allocator(device));
  devbuf_buffer_t *file = NULL;
  CHECK_OK(devbuf_buffer_map_file(device, path, &file));
  CHECK(devbuf_buffer_is_mapped(file) && devbuf_buffer_is_read_only(file));
  CHECK(devbuf_buffer_is_allocated(file));
  CHECK_EQ_U(devbuf_buffer_size(file), expected_size);
  CHECK(devbuf_buffer_dtype(file) == DEVBUF_UINT8);
  CHECK(devbuf_buffer_allocator(file) == NULL);
  size_t page = devbuf_device_page_size(device);
  devbuf_allocator_stats_t during = stats_of(devbuf_device_allocator(device));
  CHECK_EQ_U(during.mapped - before.mapped, (expected_size + page - 1) / page * page);
  CHECK_EQ_U(during.active, before.active); // a mapping is not allocated memory
  const void *data;
  size_t size;
  CHECK_OK(devbuf_buffer_contents(file, &data, &size));
  CHECK(size == expected_size && memcmp(data, expected, size) == 0);
  uint64_t address;
  CHECK_OK(devbuf_buffer_device_ptr(file, &address));
  CHECK(address == (uint64_t)(uintptr_t)data && address % page == 0); // zero-copy, page-aligned
  CHECK_OK(devbuf_buffer_end_access(file, data));
  // Every write is refused.
  void *write;
  CHECK_STATUS(devbuf_buffer_contents_mut(file, &write, NULL), DEVBUF_READ_ONLY);
  CHECK_MESSAGE("read-only mapped file");
  CHECK_STATUS(devbuf_buffer_copyin(file, expected, expected_size), DEVBUF_READ_ONLY);
  CHECK_STATUS(devbuf_buffer_unsynchronized_ptr(file, &write, NULL), DEVBUF_READ_ONLY);
  devbuf_array_t array;
  CHECK_STATUS(devbuf_buffer_as_array_mut(file, DEVBUF_UINT8, &array), DEVBUF_READ_ONLY);
  devbuf_buffer_t *tail = NULL, *copy = NULL;
  CHECK_OK(devbuf_buffer_view(file, 8, 64, &tail));
  CHECK_STATUS(devbuf_buffer_copy_from(tail, tail), DEVBUF_READ_ONLY);
  size_t n = 64;
  CHECK_OK(devbuf_buffer_new(devbuf_device_allocator(device), DEVBUF_UINT8, &n, 1, 0, &copy));
  CHECK_OK(devbuf_buffer_copy_from(copy, tail)); // reading out of a mapping is fine
  unsigned char got[64];
  CHECK_OK(devbuf_buffer_copyout(copy, got, 64));
  CHECK(memcmp(got, expected + 8, 64) == 0);
  // A view keeps the mapping alive after the file handle is released.
  devbuf_buffer_release(file);
  CHECK_EQ_U(stats_of(devbuf_device_allocator(device)).mapped, during.mapped);
  CHECK_OK(devbuf_buffer_copyout(tail, got, 64));
  CHECK(memcmp(got, expected + 8, 64) == 0);
  devbuf_buffer_release(tail);
  CHECK_EQ_U(stats_of(devbuf_device_allocator(device)).mapped, before.mapped);
  devbuf_buffer_release(copy);
  free(expected);
}

static void test_mapping_survives_unlink(void) {
  char path[] = "/tmp/devbuf-map-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  const char text[] = "weights that outlive their file";
  CHECK(write(fd, text, sizeof text) == (ssize_t)sizeof text);
  close(fd);
  devbuf_buffer_t *file = NULL;
  CHECK_OK(devbuf_buffer_map_file(device, path, &file));
  unlink(path);
  char got[sizeof text];
  CHECK_OK(devbuf_buffer_copyout(file, got, sizeof got));
  CHECK(strcmp(got, text) == 0);
  devbuf_buffer_release(file);
}

static void test_map_errors_and_empty(void) {
  devbuf_buffer_t *file = NULL;
  CHECK_STATUS(devbuf_buffer_map_file(device, "/nonexistent/weights.safetensors", &file),
               DEVBUF_IO_ERROR);
  CHECK_MESSAGE("/nonexistent/weights.safetensors");
  CHECK_STATUS(devbuf_buffer_map_file(device, "/tmp", &file), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("not a regular file");
  CHECK_STATUS(devbuf_buffer_map_file(device, NULL, &file), DEVBUF_INVALID_ARGUMENT);
  CHECK(file == NULL);
  char path[] = "/tmp/devbuf-empty-XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  CHECK_OK(devbuf_buffer_map_file(device, path, &file));
  CHECK(devbuf_buffer_is_empty(file) && devbuf_buffer_is_mapped(file));
  unlink(path);
  devbuf_buffer_release(file);
}

int main(void) {
  test_require_data();
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) return 1;
  RUN(test_map_shared_file);
  RUN(test_mapping_survives_unlink);
  RUN(test_map_errors_and_empty);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
