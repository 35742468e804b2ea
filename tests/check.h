// A tiny test harness: CHECK macros that report and count failures, RUN to call a test,
// SKIP_ALL to exit with ctest's skip code and a reason.
#ifndef DEVBUF_CHECK_H
#define DEVBUF_CHECK_H

#include "devbuf.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures;
static const char *check_current = "";

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: [%s] CHECK failed: %s\n", __FILE__, __LINE__, check_current, #cond); \
      check_failures++;                                                                            \
    }                                                                                              \
  } while (0)

#define CHECK_EQ_U(a, b)                                                                         \
  do {                                                                                           \
    unsigned long long check_a_ = (unsigned long long)(a), check_b_ = (unsigned long long)(b);   \
    if (check_a_ != check_b_) {                                                                  \
      fprintf(stderr, "%s:%d: [%s] CHECK failed: %s == %s (%llu vs %llu)\n", __FILE__, __LINE__, \
              check_current, #a, #b, check_a_, check_b_);                                        \
      check_failures++;                                                                          \
    }                                                                                            \
  } while (0)

#define CHECK_STATUS(expr, expected)                                                            \
  do {                                                                                          \
    devbuf_status check_s_ = (expr);                                                            \
    if (check_s_ != (expected)) {                                                               \
      fprintf(stderr, "%s:%d: [%s] %s returned %s, expected %s (%s)\n", __FILE__, __LINE__,     \
              check_current, #expr, devbuf_status_name(check_s_), devbuf_status_name(expected), \
              devbuf_last_error());                                                             \
      check_failures++;                                                                         \
    }                                                                                           \
  } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, DEVBUF_OK)

// The last error message contains `needle`.
#define CHECK_MESSAGE(needle)                                                                     \
  do {                                                                                            \
    if (!strstr(devbuf_last_error(), (needle))) {                                                 \
      fprintf(stderr, "%s:%d: [%s] message '%s' lacks '%s'\n", __FILE__, __LINE__, check_current, \
              devbuf_last_error(), (needle));                                                     \
      check_failures++;                                                                           \
    }                                                                                             \
  } while (0)

#define RUN(test)                                                                \
  do {                                                                           \
    check_current = #test;                                                       \
    int check_before_ = check_failures;                                          \
    test();                                                                      \
    printf("%s %s\n", check_failures == check_before_ ? "ok  " : "FAIL", #test); \
  } while (0)

#define CHECK_EXIT() \
  (check_failures ? (fprintf(stderr, "%d check(s) failed\n", check_failures), 1) : 0)

#define SKIP_EXIT_CODE 77

// Where a buffer's bytes are: its memory's handle (an address, or a cl_mem) plus offset.
static inline uint64_t place_of(devbuf_buffer_t *buffer) {
  uint64_t handle = 0;
  size_t offset = 0;
  CHECK_OK(devbuf_buffer_device_handle(buffer, &handle, &offset));
  return handle + offset;
}

// A caching allocator over a counting raw allocator, so tests see system calls exactly.
typedef struct test_allocators {
  devbuf_device_t *device;
  devbuf_allocator_t *raw;     // stats adaptor over the CPU raw allocator
  devbuf_allocator_t *caching; // caching allocator over `raw`
} test_allocators;

static inline test_allocators test_allocators_open(const devbuf_caching_options_t *options) {
  test_allocators t = {0};
  devbuf_allocator_t *backend_raw = NULL;
  if (devbuf_device_open("cpu", &t.device) != DEVBUF_OK ||
      devbuf_device_raw_allocator(t.device, &backend_raw) != DEVBUF_OK ||
      devbuf_stats_adaptor_create(backend_raw, &t.raw) != DEVBUF_OK ||
      devbuf_caching_allocator_create(t.raw, options, &t.caching) != DEVBUF_OK) {
    fprintf(stderr, "cannot set up allocators: %s\n", devbuf_last_error());
    exit(1);
  }
  devbuf_allocator_release(backend_raw);
  return t;
}

static inline void test_allocators_close(test_allocators *t) {
  devbuf_allocator_release(t->caching);
  devbuf_allocator_release(t->raw);
  devbuf_device_release(t->device);
}

// A caching allocator of a test's own over `device`'s raw memory: which free block serves a
// request is then known (the device's allocator holds what earlier tests left, some of it
// in other threads' bins). NULL if it cannot be made.
static inline devbuf_allocator_t *own_caching_allocator(devbuf_device_t *device) {
  devbuf_allocator_t *raw = NULL, *caching = NULL;
  if (devbuf_device_raw_allocator(device, &raw) == DEVBUF_OK)
    devbuf_caching_allocator_create(raw, NULL, &caching);
  devbuf_allocator_release(raw);
  return caching;
}

static inline devbuf_allocator_stats_t stats_of(devbuf_allocator_t *allocator) {
  devbuf_allocator_stats_t stats;
  if (devbuf_allocator_stats(allocator, &stats) != DEVBUF_OK) memset(&stats, 0xff, sizeof stats);
  return stats;
}

// The `--expect-unavailable PHRASE` mode of a backend's test: opening `spec` must answer
// UNAVAILABLE with PHRASE in the message. Returns the exit code.
static inline int check_expect_unavailable(const char *spec, const char *phrase) {
  devbuf_device_t *device = NULL;
  CHECK_STATUS(devbuf_device_open(spec, &device), DEVBUF_UNAVAILABLE);
  CHECK_MESSAGE(phrase);
  printf("%s\n", devbuf_last_error());
  return CHECK_EXIT();
}

// A CPU kernel: every uint32 of its first buffer becomes the uint32 of its scalars.
static inline devbuf_status test_set_words(const devbuf_kernel_args_t *args) {
  uint32_t value;
  memcpy(&value, args->scalars, sizeof value);
  uint32_t *words = args->data[0];
  for (size_t i = 0; i < args->sizes[0] / sizeof *words; i++) words[i] = value;
  return DEVBUF_OK;
}

// Descriptors this process has open (leak checks compare two counts).
static inline size_t test_open_descriptors(void) {
  size_t count = 0;
  DIR *folder = opendir("/proc/self/fd");
  if (!folder) return 0;
  while (readdir(folder)) count++;
  closedir(folder);
  return count;
}

// The whole file at `path` in malloc'd memory (NULL if it cannot be read); caller frees.
static inline unsigned char *test_read_file(const char *path, size_t *out_size) {
  FILE *file = fopen(path, "rb");
  if (!file) return NULL;
  fseek(file, 0, SEEK_END);
  long size = ftell(file);
  fseek(file, 0, SEEK_SET);
  unsigned char *bytes = size >= 0 ? malloc((size_t)size + 1) : NULL;
  if (bytes && fread(bytes, 1, (size_t)size, file) != (size_t)size) {
    free(bytes);
    bytes = NULL;
  }
  fclose(file);
  *out_size = bytes ? (size_t)size : 0;
  return bytes;
}

// The folder of real files from other projects (tests/data): $DEVBUF_TESTDATA when set (the
// skip-path check points it at a missing folder), else the one the build names.
static inline const char *test_data_dir(void) {
#ifdef DEVBUF_TESTDATA
  const char *from_build = DEVBUF_TESTDATA;
#else
  const char *from_build = "tests/data";
#endif
  const char *from_environment = getenv("DEVBUF_TESTDATA");
  return from_environment && from_environment[0] ? from_environment : from_build;
}

// `relative` inside the test data folder; each call's result lives until the 8th call after.
static inline const char *test_data(const char *relative) {
  static char paths[8][1024];
  static unsigned next;
  char *path = paths[next++ % 8];
  snprintf(path, sizeof paths[0], "%s/%s", test_data_dir(), relative);
  return path;
}

// Exits with the skip code, saying why, when the test data folder is not there.
static inline void test_require_data(void) {
  FILE *probe = fopen(test_data("README.md"), "r");
  if (probe) {
    fclose(probe);
    return;
  }
  printf("SKIP: the test data folder %s is missing (it ships in the repository as tests/data)\n",
         test_data_dir());
  exit(SKIP_EXIT_CODE);
}

#endif
