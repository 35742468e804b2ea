// Read-only mapped files (B9): zero-copy, every write refused, alive while any view uses
// them, counted in `mapped`. Reads the shared test data in place.
#include "check.h"

#include <signal.h>
#include <sys/wait.h>
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
  // A file made up as it is read: its size (0 here) says nothing of what it holds.
  CHECK_STATUS(devbuf_buffer_map_file(device, "/proc/self/status", &file), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("a file of proc, made up as it is read");
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

// An 8 KiB file of 0xab, mapped; its path is in `path` (mkstemp's template).
static devbuf_buffer_t *map_pattern_file(char *path) {
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  unsigned char bytes[8192];
  memset(bytes, 0xab, sizeof bytes);
  CHECK(write(fd, bytes, sizeof bytes) == (ssize_t)sizeof bytes);
  close(fd);
  devbuf_buffer_t *file = NULL;
  CHECK_OK(devbuf_buffer_map_file(device, path, &file));
  return file;
}

// A file cut inside a page faults nowhere: the rest of that page reads as zeros. Every read
// devbuf makes of the lost bytes (copyout, copy_from, a queued copy) answers IO_ERROR all
// the same, naming where the file ends now; bytes before the cut still read.
static void test_cut_inside_a_page(void) {
  char path[] = "/tmp/devbuf-cut-XXXXXX";
  devbuf_buffer_t *file = map_pattern_file(path), *tail = NULL, *head = NULL, *copy = NULL;
  if (!file) return;
  CHECK_OK(devbuf_buffer_view(file, 4096, 4096, &tail));
  CHECK_OK(devbuf_buffer_view(file, 0, 4096, &head));
  CHECK(truncate(path, 4096 + 10) == 0);
  unsigned char out[4096];
  CHECK_STATUS(devbuf_buffer_copyout(tail, out, sizeof out), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("now ends at 4106");
  size_t size = 4096;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &copy));
  CHECK_STATUS(devbuf_buffer_copy_from(copy, tail), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("truncated while mapped");
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_copy(queue, copy, tail));
  CHECK_STATUS(devbuf_queue_finish(queue), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("now ends at 4106");
  devbuf_queue_release(queue);
  CHECK_OK(devbuf_buffer_copyout(head, out, sizeof out)); // before the cut: still the file's
  CHECK(out[0] == 0xab && out[4095] == 0xab);
  // item reads its element apart: the caller's value stays as it was, not the zeros read.
  devbuf_buffer_t *lost = NULL;
  CHECK_OK(devbuf_buffer_view_as(file, 4096 + 20, DEVBUF_FLOAT32, NULL, 0, &lost));
  float value = 42.0f;
  CHECK_STATUS(devbuf_buffer_item(lost, DEVBUF_FLOAT32, &value), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("item: ");
  CHECK(value == 42.0f);
  devbuf_buffer_release(lost);
  // Written to a weight file: read as copyout reads it (the zeros after the cut were written,
  // and OK returned), then once the whole page is gone (the source to blame, not the target).
  char target[] = "/tmp/devbuf-cut-out-XXXXXX";
  close(mkstemp(target));
  devbuf_named_buffer_t tensor = {"tail", tail};
  CHECK_STATUS(devbuf_safetensors_write(target, &tensor, 1, NULL, 0), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("now ends at 4106");
  CHECK(truncate(path, 0) == 0);
  CHECK_STATUS(devbuf_safetensors_write(target, &tensor, 1, NULL, 0), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("truncated while mapped");
  unlink(target);
  unlink(path);
  devbuf_buffer_release(copy);
  devbuf_buffer_release(head);
  devbuf_buffer_release(tail);
  devbuf_buffer_release(file);
}

// In a process of its own (devbuf installs its guard after the disposition is set): SIGBUS
// at `disposition`, a guarded read, then a SIGBUS another process sends, then a read of a
// file cut under its mapping. 0 when that read answered IO_ERROR.
static int sent_sigbus_child(void (*disposition)(int)) {
  signal(SIGBUS, disposition);
  char path[] = "/tmp/devbuf-sent-XXXXXX";
  devbuf_buffer_t *file = map_pattern_file(path);
  unsigned char out[8192];
  int result = !file || devbuf_buffer_copyout(file, out, sizeof out) != DEVBUF_OK ? 1 : 0;
  if (result == 0) {
    kill(getpid(), SIGBUS);
    if (disposition == SIG_DFL) result = 5; // still alive: the signal was swallowed
  }
  if (result == 0)
    result = truncate(path, 0) != 0                                            ? 3
             : devbuf_buffer_copyout(file, out, sizeof out) == DEVBUF_IO_ERROR ? 0
                                                                               : 2;
  unlink(path);
  devbuf_buffer_release(file);
  devbuf_device_release(device);
  return result;
}

static const char *self_path;

static int run_child(const char *disposition) {
  pid_t child = fork();
  if (child == 0) {
    execl(self_path, self_path, "sent-sigbus", disposition, (char *)NULL);
    _exit(4);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// A SIGBUS sent by another process is no fault of a guarded read: by default it ends the
// process, as it does without devbuf; ignored, it is ignored. Either way devbuf's guard stays
// for the reads that follow (it went, and a cut file then took the process down).
static void test_sent_sigbus(void) {
  CHECK_EQ_U(run_child("default"), 128 + SIGBUS);
  CHECK_EQ_U(run_child("ignore"), 0);
}

int main(int argc, char **argv) {
  self_path = argv[0];
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) return 1;
  if (argc == 3 && strcmp(argv[1], "sent-sigbus") == 0)
    return sent_sigbus_child(strcmp(argv[2], "ignore") == 0 ? SIG_IGN : SIG_DFL);
  test_require_data();
  RUN(test_map_shared_file);
  RUN(test_mapping_survives_unlink);
  RUN(test_map_errors_and_empty);
  RUN(test_cut_inside_a_page);
  RUN(test_sent_sigbus);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
