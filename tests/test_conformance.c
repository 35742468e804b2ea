// The conformance suite: what every backend must do the same way, run against the device
// named on the command line (`test_conformance cpu`, `test_conformance opencl:0`); one case
// alone with `--case NAME` (`--list` names them). Where backends differ, the table of
// expectations below says how, and why: no case tests a device's kind. A device that cannot
// be opened is reported as skipped, with the reason.
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static devbuf_device_t *device;
static devbuf_allocator_t *allocator; // the device's own memory

// ---- what each backend does, declared ------------------------------------------------------

typedef enum host_addressed {
  HOST_ADDRESSED_BY_DRIVER, // the CPU addresses the device's own memory where the driver maps it
  HOST_ADDRESSED_ALWAYS,    // the device's own memory is host memory
  HOST_ADDRESSED_NEVER,     // only its host-visible kind is (copies reach the rest)
} host_addressed;

typedef struct unsupported_case {
  const char *name, *why;
} unsupported_case;

typedef struct expectations {
  const char *backend; // the kind's name
  host_addressed own_memory;
  // Its memory is a handle plus an offset (a cl_mem), not an address: it has no device
  // pointer, and different handles are different allocations.
  bool memory_handles;
  // Cases it cannot run, each with the reason: such a case checks instead that the device
  // refuses what it needs, with UNSUPPORTED and a message that says so.
  unsupported_case unsupported[4];
} expectations;

static const expectations table[] = {
    {"cpu", HOST_ADDRESSED_ALWAYS, false, {{NULL, NULL}}},
    {"opencl",
     HOST_ADDRESSED_BY_DRIVER,
     true,
     {{"export_round_trip", "OpenCL has no way to hand memory to another process"}}},
    {"cuda", HOST_ADDRESSED_NEVER, false, {{NULL, NULL}}},
    {"null",
     HOST_ADDRESSED_ALWAYS,
     false,
     {{"export_round_trip",
       "the null backend's memory is private to its process (no raw_export)"}}},
};

// A backend with no row: what nothing declares, the driver decides; every case runs.
static const expectations undeclared = {NULL, HOST_ADDRESSED_BY_DRIVER, false, {{NULL, NULL}}};
static const expectations *expected = &undeclared;

// Why the device cannot run case `name`, or NULL when it can.
static const char *unsupported_because(const char *name) {
  for (size_t i = 0; i < sizeof expected->unsupported / sizeof expected->unsupported[0]; i++)
    if (expected->unsupported[i].name && strcmp(expected->unsupported[i].name, name) == 0)
      return expected->unsupported[i].why;
  return NULL;
}

static devbuf_buffer_t *new_bytes(devbuf_allocator_t *from, size_t size, uint32_t flags) {
  devbuf_buffer_t *buffer = NULL;
  if (devbuf_buffer_allocate(from, DEVBUF_UINT8, &size, 1, flags, &buffer) != DEVBUF_OK) {
    fprintf(stderr, "cannot allocate %zu bytes: %s\n", size, devbuf_last_error());
    exit(1);
  }
  return buffer;
}

static void pattern(unsigned char *bytes, size_t size, unsigned seed) {
  for (size_t i = 0; i < size; i++) bytes[i] = (unsigned char)(i * 31 + seed * 7 + (i >> 8));
}

// Reads a buffer back through a copy (works whether or not the CPU can address it).
static unsigned char *read_back(devbuf_buffer_t *buffer) {
  size_t size = devbuf_buffer_size(buffer);
  unsigned char *bytes = malloc(size + 1);
  CHECK_OK(devbuf_buffer_copyout(buffer, bytes, size));
  return bytes;
}

// How many bytes of `buffer` are not `value`.
static size_t bytes_not(devbuf_buffer_t *buffer, unsigned char value) {
  unsigned char *back = read_back(buffer);
  size_t wrong = 0;
  for (size_t i = 0; i < devbuf_buffer_size(buffer); i++) wrong += back[i] != value;
  free(back);
  return wrong;
}

// Whether two buffers' bytes are apart: where memory is a handle plus offset (OpenCL),
// different handles are different segments.
static bool apart(devbuf_buffer_t *x, devbuf_buffer_t *y) {
  uint64_t x_handle = 0, y_handle = 0;
  size_t x_offset = 0, y_offset = 0;
  CHECK_OK(devbuf_buffer_device_handle(x, &x_handle, &x_offset));
  CHECK_OK(devbuf_buffer_device_handle(y, &y_handle, &y_offset));
  if (expected->memory_handles && x_handle != y_handle) return true;
  uint64_t x_start = x_handle + x_offset, y_start = y_handle + y_offset;
  return x_start + devbuf_buffer_size(x) <= y_start || y_start + devbuf_buffer_size(y) <= x_start;
}

// A caching allocator over the device's raw allocator reuses its memory exactly.
static void test_caching_reuse(void) {
  devbuf_allocator_t *raw = NULL, *counted = NULL, *caching = NULL;
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  CHECK_OK(devbuf_stats_adaptor_create(raw, &counted));
  CHECK_OK(devbuf_caching_allocator_create(counted, NULL, &caching));
  for (int i = 0; i < 2000; i++) {
    devbuf_buffer_t *buffer = new_bytes(caching, 4096, 0);
    devbuf_buffer_release(buffer);
  }
  devbuf_allocator_stats_t raw_stats = stats_of(counted), stats = stats_of(caching);
  CHECK_EQ_U(raw_stats.system_allocs, 1);
  CHECK_EQ_U(stats.active, 0);
  CHECK_EQ_U(stats.segments, 1); // one small segment, all of it cached
  CHECK_EQ_U(stats.reserved, raw_stats.active);
  CHECK_EQ_U(stats.cached, stats.reserved);
  devbuf_allocator_clear_cache(caching);
  CHECK_EQ_U(stats_of(caching).cached, 0);
  CHECK_EQ_U(stats_of(counted).system_frees, 1);
  devbuf_allocator_release(caching);
  devbuf_allocator_release(counted);
  devbuf_allocator_release(raw);
}

static void test_copies(void) {
  enum { SIZE = 1 << 16 };
  unsigned char *source = malloc(SIZE), *back;
  pattern(source, SIZE, 1);
  devbuf_buffer_t *buffer = new_bytes(allocator, SIZE, 0);
  CHECK_OK(devbuf_buffer_copyin(buffer, source, SIZE));
  back = read_back(buffer);
  CHECK(memcmp(back, source, SIZE) == 0);
  free(back);
  // Views at any offset, both ways.
  devbuf_buffer_t *view;
  CHECK_OK(devbuf_buffer_view(buffer, 1001, 3000, &view));
  unsigned char piece[3000];
  CHECK_OK(devbuf_buffer_copyout(view, piece, sizeof piece));
  CHECK(memcmp(piece, source + 1001, sizeof piece) == 0);
  memset(piece, 0xab, sizeof piece);
  CHECK_OK(devbuf_buffer_copyin(view, piece, sizeof piece));
  memset(source + 1001, 0xab, sizeof piece);
  back = read_back(buffer);
  CHECK(memcmp(back, source, SIZE) == 0);
  free(back);
  // Overlapping views of one storage behave like memmove, in both directions.
  devbuf_buffer_t *low, *high;
  CHECK_OK(devbuf_buffer_view(buffer, 0, SIZE - 100, &low));
  CHECK_OK(devbuf_buffer_view(buffer, 100, SIZE - 100, &high));
  CHECK_OK(devbuf_buffer_copy_from(high, low));
  memmove(source + 100, source, SIZE - 100);
  back = read_back(buffer);
  CHECK(memcmp(back, source, SIZE) == 0);
  free(back);
  CHECK_OK(devbuf_buffer_copy_from(low, high));
  memmove(source, source + 100, SIZE - 100);
  back = read_back(buffer);
  CHECK(memcmp(back, source, SIZE) == 0);
  free(back);
  // Across devices, and between the device's two kinds of memory.
  devbuf_device_t *cpu;
  CHECK_OK(devbuf_device_open("cpu", &cpu));
  devbuf_buffer_t *on_cpu = new_bytes(devbuf_device_allocator(cpu), SIZE, 0);
  devbuf_buffer_t *visible =
      new_bytes(devbuf_device_allocator_for(device, DEVBUF_MEMORY_HOST_VISIBLE), SIZE, 0);
  CHECK_OK(devbuf_buffer_copy_from(on_cpu, buffer));
  CHECK_OK(devbuf_buffer_copy_from(visible, on_cpu));
  pattern(source, SIZE, 2);
  CHECK_OK(devbuf_buffer_copyin(on_cpu, source, SIZE));
  CHECK_OK(devbuf_buffer_copy_from(buffer, on_cpu));
  back = read_back(buffer);
  CHECK(memcmp(back, source, SIZE) == 0);
  free(back);
  CHECK_STATUS(devbuf_buffer_copy_from(view, on_cpu), DEVBUF_SIZE_MISMATCH);
  devbuf_buffer_release(visible);
  devbuf_buffer_release(on_cpu);
  devbuf_device_release(cpu);
  devbuf_buffer_release(low);
  devbuf_buffer_release(high);
  devbuf_buffer_release(view);
  devbuf_buffer_release(buffer);
  free(source);
}

static void test_zero_and_lazy(void) {
  devbuf_buffer_t *dirty = new_bytes(allocator, 8192, 0);
  unsigned char ones[8192];
  memset(ones, 0xff, sizeof ones);
  CHECK_OK(devbuf_buffer_copyin(dirty, ones, sizeof ones));
  devbuf_buffer_release(dirty); // its memory is cached, dirty
  devbuf_buffer_t *zeroed = new_bytes(allocator, 8192, DEVBUF_BUFFER_ZERO);
  unsigned char *back = read_back(zeroed);
  size_t nonzero = 0;
  for (size_t i = 0; i < 8192; i++) nonzero += back[i] != 0;
  CHECK_EQ_U(nonzero, 0);
  free(back);
  devbuf_buffer_release(zeroed);
  size_t size = 100;
  devbuf_buffer_t *lazy = NULL;
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_UINT8, &size, 1, 0, &lazy));
  CHECK(!devbuf_buffer_is_allocated(lazy));
  CHECK_OK(devbuf_buffer_copyin(lazy, ones, 100));
  CHECK(devbuf_buffer_is_allocated(lazy));
  devbuf_buffer_release(lazy);
}

// Device memory is host-addressable only where the device's memory is host memory; the
// host-visible kind always is, under the same rules (B4).
static void test_host_access(void) {
  devbuf_buffer_t *own = new_bytes(allocator, 256, 0);
  const void *data;
  size_t size;
  devbuf_status status =
      devbuf_buffer_is_cpu_accessible(own) ? DEVBUF_OK : DEVBUF_NOT_CPU_ACCESSIBLE;
  CHECK(expected->own_memory != HOST_ADDRESSED_ALWAYS || status == DEVBUF_OK);
  CHECK(expected->own_memory != HOST_ADDRESSED_NEVER || status == DEVBUF_NOT_CPU_ACCESSIBLE);
  CHECK_STATUS(devbuf_buffer_contents(own, &data, &size), status);
  if (status == DEVBUF_OK) devbuf_buffer_end_access(own, data);
  uint64_t address, handle;
  size_t offset;
  CHECK_OK(devbuf_buffer_device_handle(own, &handle, &offset));
  if (expected->memory_handles) {
    CHECK_STATUS(devbuf_buffer_device_ptr(own, &address), DEVBUF_UNSUPPORTED);
  } else {
    CHECK_OK(devbuf_buffer_device_ptr(own, &address));
    CHECK(address == handle + offset);
  }
  devbuf_buffer_release(own);

  devbuf_buffer_t *visible =
      new_bytes(devbuf_device_allocator_for(device, DEVBUF_MEMORY_HOST_VISIBLE), 256, 0);
  CHECK(devbuf_buffer_is_cpu_accessible(visible));
  void *writable;
  CHECK_OK(devbuf_buffer_contents_mut(visible, &writable, &size));
  memset(writable, 0x5c, size);
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  unsigned char one = 1;
  CHECK_STATUS(devbuf_queue_fill(queue, visible, &one, 1), DEVBUF_HOST_ACCESS_OPEN);
  CHECK_OK(devbuf_buffer_end_access(visible, writable));
  devbuf_buffer_t *half;
  CHECK_OK(devbuf_buffer_view(visible, 128, 128, &half));
  CHECK_OK(devbuf_queue_fill(queue, half, &one, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_OK(devbuf_buffer_contents(visible, &data, &size));
  const unsigned char *bytes = data;
  CHECK(bytes[0] == 0x5c && bytes[127] == 0x5c && bytes[128] == 1 &&
        bytes[255] == 1); // the device's fill
  devbuf_buffer_end_access(visible, data);
  devbuf_buffer_release(half);
  devbuf_buffer_release(visible);
  devbuf_queue_release(queue);
}

static void test_queue_fill_copy(void) {
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_buffer_t *a = new_bytes(allocator, 4096, 0), *b = new_bytes(allocator, 4096, 0);
  uint32_t word = 0xdeadbeef;
  CHECK_OK(devbuf_queue_fill(queue, a, &word, 4));
  devbuf_buffer_t *tail;
  CHECK_OK(devbuf_buffer_view(a, 4000, 96, &tail));
  unsigned char odd[3] = {1, 2, 3};
  CHECK_OK(devbuf_queue_fill(queue, tail, odd, 3)); // a pattern drivers do not fill natively
  CHECK_OK(devbuf_queue_copy(queue, b, a));
  CHECK_OK(devbuf_queue_finish(queue));
  unsigned char *back = read_back(b);
  uint32_t first;
  memcpy(&first, back, 4);
  CHECK(first == 0xdeadbeef && back[4000] == 1 && back[4001] == 2 && back[4002] == 3 &&
        back[4095] == 3);
  free(back);
  CHECK_STATUS(devbuf_queue_fill(queue, a, odd, 3), DEVBUF_SIZE_MISMATCH);
  devbuf_buffer_t *six;
  CHECK_OK(devbuf_buffer_view(a, 0, 6, &six));
  CHECK_STATUS(devbuf_queue_fill(queue, six, &word, 4), DEVBUF_SIZE_MISMATCH); // a power of two
  CHECK_MESSAGE("4-byte pattern does not divide a 6-byte buffer");
  devbuf_buffer_release(six);
  devbuf_buffer_release(tail);
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
  devbuf_queue_release(queue);
}

// What a host task saw: its uses' addresses and sizes, and the bytes of the first.
typedef struct host_view {
  bool addressed[2];
  size_t sizes[2];
  unsigned char first, last;
} host_view;

// Reads its first use (where the CPU can address it) and writes its second: 5s.
static devbuf_status look_and_write(const devbuf_kernel_args_t *args) {
  host_view *view;
  memcpy(&view, args->scalars, sizeof view);
  for (size_t i = 0; i < 2; i++) {
    view->addressed[i] = args->data[i] != NULL;
    view->sizes[i] = args->sizes[i];
  }
  if (args->data[0]) {
    view->first = ((unsigned char *)args->data[0])[0];
    view->last = ((unsigned char *)args->data[0])[args->sizes[0] - 1];
  }
  if (args->data[1]) memset(args->data[1], 5, args->sizes[1]);
  return DEVBUF_OK;
}

static devbuf_status fail_host_task(const devbuf_kernel_args_t *args) {
  (void)args;
  return devbuf_set_error(DEVBUF_IO_ERROR, "the host task's own failure");
}

// Host work in the queue: after the device work before it on its queue and the
// conflicting work of another queue, before the work after it; device memory comes
// without a host address; its failure fails the queue.
static void test_host_task(void) {
  devbuf_queue_t *producer, *queue;
  CHECK_OK(devbuf_queue_create(device, &producer));
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_allocator_t *visible = devbuf_device_allocator_for(device, DEVBUF_MEMORY_HOST_VISIBLE);
  size_t size = 1 << 20;
  devbuf_buffer_t *input = new_bytes(visible, size, 0), *output = new_bytes(visible, size, 0);
  devbuf_buffer_t *on_device = new_bytes(allocator, 4096, 0), *copy = new_bytes(allocator, size, 0);
  unsigned char three = 3, seven = 7;
  host_view view = {{false, false}, {0, 0}, 0, 0}, *view_address = &view;
  CHECK_OK(devbuf_queue_fill(producer, input, &three, 1)); // another queue writes the input
  devbuf_use_t uses[2] = {{input, DEVBUF_ACCESS_READ}, {output, DEVBUF_ACCESS_WRITE}};
  CHECK_OK(devbuf_queue_fill(queue, output, &seven, 1)); // device work on its own queue
  CHECK_OK(
      devbuf_queue_host_task(queue, look_and_write, uses, 2, &view_address, sizeof view_address));
  CHECK_OK(devbuf_queue_copy(queue, copy, output)); // device work after it sees its writes
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK(view.addressed[0] && view.addressed[1] && view.sizes[0] == size && view.sizes[1] == size);
  CHECK(view.first == 3 && view.last == 3);
  unsigned char *back = read_back(copy);
  size_t fives = 0;
  for (size_t i = 0; i < size; i++) fives += back[i] == 5;
  CHECK_EQ_U(fives, size);
  free(back);

  devbuf_use_t device_uses[2] = {{on_device, DEVBUF_ACCESS_READ}, {on_device, DEVBUF_ACCESS_READ}};
  view = (host_view){{true, true}, {0, 0}, 0, 0};
  CHECK_OK(devbuf_queue_host_task(queue, look_and_write, device_uses, 2, &view_address,
                                  sizeof view_address));
  CHECK_OK(devbuf_queue_finish(queue));
  const void *mapped = NULL;
  bool cpu_addressable = devbuf_buffer_contents(on_device, &mapped, NULL) == DEVBUF_OK;
  if (cpu_addressable) CHECK_OK(devbuf_buffer_end_access(on_device, mapped));
  CHECK(view.addressed[0] == cpu_addressable && view.sizes[0] == 4096);

  const void *open = NULL;
  CHECK_OK(devbuf_buffer_contents(input, &open, NULL)); // a racing host access refuses it
  devbuf_use_t write_input = {input, DEVBUF_ACCESS_WRITE};
  CHECK_STATUS(devbuf_queue_host_task(queue, fail_host_task, &write_input, 1, NULL, 0),
               DEVBUF_HOST_ACCESS_OPEN);
  CHECK_OK(devbuf_buffer_end_access(input, open));
  CHECK_OK(devbuf_queue_host_task(queue, fail_host_task, NULL, 0, NULL, 0));
  CHECK_STATUS(devbuf_queue_finish(queue), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("the host task's own failure");
  CHECK_STATUS(devbuf_queue_host_task(NULL, fail_host_task, NULL, 0, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  devbuf_buffer_release(input);
  devbuf_buffer_release(output);
  devbuf_buffer_release(on_device);
  devbuf_buffer_release(copy);
  devbuf_queue_release(queue);
  devbuf_queue_release(producer);
}

// Work behind an event does not run until the host signals it; two queues order their
// conflicting work (RAW and WAR) and not their disjoint work.
static void test_events_and_hazards(void) {
  devbuf_queue_t *first, *second;
  CHECK_OK(devbuf_queue_create(device, &first));
  CHECK_OK(devbuf_queue_create(device, &second));
  devbuf_event_t *go;
  CHECK_OK(devbuf_event_create(0, &go));
  devbuf_buffer_t *a = new_bytes(allocator, 1024, 0), *b = new_bytes(allocator, 1024, 0);
  unsigned char seven = 7, nine = 9;
  CHECK_OK(devbuf_queue_fill(first, b, &nine, 1));
  CHECK_OK(devbuf_queue_wait(first, go, 1));
  CHECK_OK(devbuf_queue_fill(first, a, &seven, 1)); // held back by the event
  CHECK_OK(devbuf_queue_copy(second, b, a));        // RAW on a: waits for the fill
  CHECK(devbuf_buffer_in_use(a) && devbuf_buffer_in_use(b));
  CHECK_STATUS(devbuf_event_wait(go, 1, 1000000), DEVBUF_TIMEOUT);
  CHECK_OK(devbuf_event_signal(go, 1));
  CHECK_OK(devbuf_queue_finish(second));
  unsigned char *back = read_back(b);
  CHECK(back[0] == 7 && back[1023] == 7);
  free(back);
  // WAR: a copy reads a, then another queue overwrites a: the copy sees the old bytes.
  CHECK_OK(devbuf_queue_wait(first, go, 2));
  CHECK_OK(devbuf_queue_copy(first, b, a));
  CHECK_OK(devbuf_queue_fill(second, a, &nine, 1));
  CHECK_OK(devbuf_event_signal(go, 2));
  CHECK_OK(devbuf_device_synchronize(device));
  back = read_back(b);
  CHECK(back[0] == 7);
  free(back);
  back = read_back(a);
  CHECK(back[0] == 9);
  free(back);
  CHECK(!devbuf_buffer_in_use(a) && !devbuf_buffer_in_use(b));
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
  devbuf_event_release(go);
  devbuf_queue_release(first);
  devbuf_queue_release(second);
}

// Memory released while work uses it is reused by new work in order, and never early.
static void test_release_in_flight(void) {
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_event_t *go;
  CHECK_OK(devbuf_event_create(0, &go));
  devbuf_buffer_t *old = new_bytes(allocator, 65536, 0);
  unsigned char one = 1, two = 2;
  CHECK_OK(devbuf_queue_wait(queue, go, 1));
  CHECK_OK(devbuf_queue_fill(queue, old, &one, 1));
  devbuf_buffer_release(old); // work still pending on it
  devbuf_buffer_t *reused = NULL;
  size_t size = 65536;
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_UINT8, &size, 1, 0, &reused));
  CHECK_OK(devbuf_queue_fill(queue, reused, &two, 1)); // may take the old memory, ordered after
  CHECK_OK(devbuf_event_signal(go, 1));
  unsigned char *back = read_back(reused); // waits for the work
  CHECK(back[0] == 2 && back[65535] == 2);
  free(back);
  devbuf_buffer_release(reused);
  devbuf_event_release(go);
  devbuf_queue_release(queue);
}

// Work on reused memory waits for the previous owner's work, but does not inherit its
// outcome: cancelling the old work leaves the new buffer written and its queue healthy.
static void test_reuse_after_cancel(void) {
  devbuf_queue_t *old_queue, *new_queue;
  CHECK_OK(devbuf_queue_create(device, &old_queue));
  CHECK_OK(devbuf_queue_create(device, &new_queue));
  devbuf_event_t *go;
  CHECK_OK(devbuf_event_create(0, &go));
  size_t size = 65536;
  devbuf_allocator_t *own =
      own_caching_allocator(device); // which block a request gets is then known
  devbuf_buffer_t *old = new_bytes(own, size, 0), *fresh = NULL;
  uint64_t old_address = 0, new_address = 1;
  old_address = place_of(old);
  unsigned char one = 1, two = 2, three = 3;
  CHECK_OK(devbuf_queue_wait(old_queue, go, 1));
  CHECK_OK(devbuf_queue_fill(old_queue, old, &one, 1));
  devbuf_buffer_release(old); // its fill is still queued
  CHECK_OK(devbuf_buffer_new(own, DEVBUF_UINT8, &size, 1, 0, &fresh));
  CHECK_OK(
      devbuf_queue_fill(new_queue, fresh, &two, 1)); // takes the old memory, after the old fill
  new_address = place_of(fresh);
  CHECK(new_address == old_address);
  CHECK_OK(devbuf_queue_cancel(old_queue));
  CHECK_OK(devbuf_queue_finish(new_queue));
  CHECK_OK(devbuf_queue_status(new_queue));
  unsigned char *back = read_back(fresh);
  size_t wrong = 0;
  for (size_t i = 0; i < size; i++) wrong += back[i] != 2;
  CHECK_EQ_U(wrong, 0);
  free(back);
  CHECK_OK(devbuf_queue_fill(new_queue, fresh, &three, 1)); // nothing refused afterwards
  CHECK_OK(devbuf_queue_finish(new_queue));
  back = read_back(fresh);
  CHECK(back[0] == 3 && back[size - 1] == 3);
  free(back);
  devbuf_buffer_release(fresh);
  devbuf_event_release(go);
  devbuf_queue_release(old_queue);
  devbuf_queue_release(new_queue);
  devbuf_allocator_release(own);
}

// A host access to zero bytes covers no bytes: copies, submissions and other accesses
// around its offset go ahead, and only its own handle counts it.
static void test_empty_access(void) {
  devbuf_buffer_t *buffer =
      new_bytes(devbuf_device_allocator_for(device, DEVBUF_MEMORY_HOST_VISIBLE), 256, 0);
  devbuf_buffer_t *empty = NULL, *around = NULL;
  CHECK_OK(devbuf_buffer_view(buffer, 100, 0, &empty));
  CHECK_OK(devbuf_buffer_view(buffer, 64, 64, &around));
  void *nothing = (void *)1;
  size_t size = 1;
  CHECK_OK(devbuf_buffer_contents_mut(empty, &nothing, &size));
  CHECK_EQ_U(size, 0);
  CHECK_EQ_U(devbuf_buffer_open_accesses(empty), 1);
  CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 0);
  CHECK_EQ_U(devbuf_buffer_open_accesses(around), 0);
  unsigned char bytes[256];
  memset(bytes, 0x42, sizeof bytes);
  CHECK_OK(devbuf_buffer_copyin(buffer, bytes, sizeof bytes));
  CHECK_OK(devbuf_buffer_copyout(buffer, bytes, sizeof bytes));
  CHECK_OK(devbuf_buffer_copy_from(around, around));
  void *data = NULL;
  CHECK_OK(devbuf_buffer_contents_mut(around, &data, NULL));
  CHECK_OK(devbuf_buffer_end_access(around, data));
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  unsigned char seven = 7;
  CHECK_OK(devbuf_queue_fill(queue, buffer, &seven, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_OK(devbuf_buffer_copyout(buffer, bytes, sizeof bytes));
  CHECK(bytes[99] == 7 && bytes[100] == 7);
  CHECK_OK(devbuf_buffer_end_access(empty, nothing));
  CHECK_EQ_U(devbuf_buffer_open_accesses(empty), 0);
  devbuf_queue_release(queue);
  devbuf_buffer_release(around);
  devbuf_buffer_release(empty);
  devbuf_buffer_release(buffer);
}

typedef struct watchdog {
  devbuf_event_t *event;
  atomic_bool finished; // the watched call returned
  atomic_bool fired;    // the watchdog had to signal the event
} watchdog;

// Signals the event after a second unless the watched call returned first, so that a call
// that wrongly waits for the event fails the test instead of hanging it.
static void *watchdog_main(void *arg) {
  watchdog *dog = arg;
  for (int i = 0; i < 100 && !atomic_load(&dog->finished); i++) {
    struct timespec pause = {0, 10 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  if (!atomic_load(&dog->finished)) {
    atomic_store(&dog->fired, true);
    devbuf_event_signal(dog->event, 1);
  }
  return NULL;
}

// A first owner of `size` bytes from `own`: filled with 'Z' on `queue` once `gate` reaches 1,
// and released meanwhile (in flight). Where its bytes are.
static uint64_t first_owner_in_flight(devbuf_allocator_t *own, devbuf_queue_t *queue,
                                      devbuf_event_t *gate, size_t size) {
  devbuf_buffer_t *first = new_bytes(own, size, 0);
  uint64_t at = place_of(first);
  unsigned char z = 'Z';
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  CHECK_OK(devbuf_queue_fill(queue, first, &z, 1));
  devbuf_buffer_release(first);
  return at;
}

// Memory reused twice while its first owner's work waits: the second owner used only the
// tail of its bytes, so no work of its own spans the head. A third buffer on the head is
// ordered after the first owner's work all the same (it ran at once, and that work then
// overwrote it).
static void test_reuse_past_an_owner_of_other_bytes(void) {
  devbuf_allocator_t *own = own_caching_allocator(device);
  devbuf_queue_t *q[3];
  for (int i = 0; i < 3; i++) CHECK_OK(devbuf_queue_create(device, &q[i]));
  devbuf_event_t *gate;
  CHECK_OK(devbuf_event_create(0, &gate));
  size_t size = 65536;
  devbuf_buffer_t *second = NULL, *tail = NULL, *third = NULL;
  uint64_t at = first_owner_in_flight(own, q[0], gate, size);
  unsigned char a = 'A', b = 'B';
  CHECK_OK(devbuf_buffer_new(own, DEVBUF_UINT8, &size, 1, 0, &second));
  CHECK_OK(devbuf_buffer_view(second, size - 512, 512, &tail));
  CHECK_OK(devbuf_queue_fill(q[1], tail, &a, 1)); // reuses the first's bytes, after its fill
  CHECK(place_of(second) == at);
  devbuf_buffer_release(tail);
  devbuf_buffer_release(second); // in flight, with no work on its head
  size_t head = size / 2;
  CHECK_OK(devbuf_buffer_new(own, DEVBUF_UINT8, &head, 1, 0, &third));
  CHECK_OK(devbuf_queue_fill(q[2], third, &b, 1));
  CHECK(place_of(third) == at);
  CHECK_OK(devbuf_event_signal(gate, 1));
  for (int i = 0; i < 3; i++) CHECK_OK(devbuf_queue_finish(q[i]));
  CHECK_EQ_U(bytes_not(third, 'B'), 0);
  devbuf_buffer_release(third);
  devbuf_event_release(gate);
  for (int i = 0; i < 3; i++) devbuf_queue_release(q[i]);
  devbuf_allocator_release(own);
}

// The same with an owner in between whose work spans the bytes but is cancelled before it
// runs: it never waited for the first owner's work, so the third buffer must wait for it
// itself (it ran as soon as the cancel retired that work, and the first owner's fill then
// overwrote it).
static void test_reuse_past_a_cancelled_owner(void) {
  devbuf_allocator_t *own = own_caching_allocator(device);
  devbuf_queue_t *q[3];
  for (int i = 0; i < 3; i++) CHECK_OK(devbuf_queue_create(device, &q[i]));
  devbuf_event_t *gate, *hold, *third_done;
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_event_create(0, &hold));
  CHECK_OK(devbuf_event_create(0, &third_done));
  size_t size = 65536;
  devbuf_buffer_t *second = NULL, *third = NULL;
  uint64_t at = first_owner_in_flight(own, q[0], gate, size);
  unsigned char a = 'A', b = 'B';
  CHECK_OK(devbuf_buffer_new(own, DEVBUF_UINT8, &size, 1, 0, &second));
  CHECK_OK(devbuf_queue_wait(q[1], hold, 1));
  CHECK_OK(devbuf_queue_fill(q[1], second, &a, 1)); // all of it, after the first's fill
  CHECK(place_of(second) == at);
  devbuf_buffer_release(second);
  CHECK_OK(devbuf_buffer_new(own, DEVBUF_UINT8, &size, 1, 0, &third));
  CHECK_OK(devbuf_queue_fill(q[2], third, &b, 1));
  CHECK_OK(devbuf_queue_signal(q[2], third_done, 1));
  CHECK(place_of(third) == at);
  CHECK_OK(devbuf_queue_cancel(q[1])); // the spanning fill retires without having run
  (void)devbuf_event_wait(third_done, 1, 200 * 1000 * 1000); // time for a wrong early run
  CHECK_OK(devbuf_event_signal(gate, 1));
  for (int i = 0; i < 3; i++) CHECK_OK(devbuf_queue_finish(q[i]));
  CHECK_EQ_U(bytes_not(third, 'B'), 0);
  devbuf_buffer_release(third);
  devbuf_event_release(gate);
  devbuf_event_release(hold);
  devbuf_event_release(third_done);
  for (int i = 0; i < 3; i++) devbuf_queue_release(q[i]);
  devbuf_allocator_release(own);
}

// copy_from between two views of one storage reads the source and writes the destination,
// nothing else: a read access on the source, an access to the bytes between, or queued work
// on the bytes between neither refuses nor holds it.
static void test_copy_within_storage(void) {
  devbuf_buffer_t *buffer =
      new_bytes(devbuf_device_allocator_for(device, DEVBUF_MEMORY_HOST_VISIBLE), 4096, 0);
  devbuf_buffer_t *src, *middle, *dst;
  CHECK_OK(devbuf_buffer_view(buffer, 0, 1024, &src));
  CHECK_OK(devbuf_buffer_view(buffer, 1024, 2048, &middle));
  CHECK_OK(devbuf_buffer_view(buffer, 3072, 1024, &dst));
  unsigned char bytes[4096];
  pattern(bytes, sizeof bytes, 3);
  CHECK_OK(devbuf_buffer_copyin(buffer, bytes, sizeof bytes));
  const void *reading = NULL;
  CHECK_OK(devbuf_buffer_contents(src, &reading, NULL));
  CHECK_OK(devbuf_buffer_copy_from(dst, src)); // a read access on the source does not refuse it
  void *writing = NULL;
  CHECK_OK(devbuf_buffer_contents_mut(middle, &writing, NULL));
  CHECK_OK(devbuf_buffer_copy_from(dst, src)); // nor an access to the bytes between
  CHECK_STATUS(devbuf_buffer_copy_from(src, dst),
               DEVBUF_HOST_ACCESS_OPEN); // writing a read-open range
  CHECK_OK(devbuf_buffer_end_access(middle, writing));
  CHECK_OK(devbuf_buffer_end_access(src, reading));
  // Work queued on the bytes between, held back by an event: the copy does not wait for it.
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  watchdog dog = {0};
  CHECK_OK(devbuf_event_create(0, &dog.event));
  unsigned char nine = 9;
  CHECK_OK(devbuf_queue_wait(queue, dog.event, 1));
  CHECK_OK(devbuf_queue_fill(queue, middle, &nine, 1));
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, watchdog_main, &dog) == 0);
  CHECK_OK(devbuf_buffer_copy_from(dst, src));
  atomic_store(&dog.finished, true);
  pthread_join(thread, NULL);
  CHECK(!atomic_load(&dog.fired));
  CHECK_OK(devbuf_event_signal(dog.event, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  memcpy(bytes + 3072, bytes, 1024);
  memset(bytes + 1024, 9, 2048);
  unsigned char *back = read_back(buffer);
  CHECK(memcmp(back, bytes, sizeof bytes) == 0);
  free(back);
  devbuf_event_release(dog.event);
  devbuf_queue_release(queue);
  devbuf_buffer_release(src);
  devbuf_buffer_release(middle);
  devbuf_buffer_release(dst);
  devbuf_buffer_release(buffer);
}

// A buffer whose only work was cancelled, on bytes an earlier owner's work still waits to
// write: its release returns at once (it waited for that work, which here only starts once
// the release is back), and the bytes still reach no host allocation before that work ends.
static void test_release_after_cancelled_reuse(void) {
  devbuf_allocator_t *own = own_caching_allocator(device);
  devbuf_queue_t *old_queue, *new_queue;
  CHECK_OK(devbuf_queue_create(device, &old_queue));
  CHECK_OK(devbuf_queue_create(device, &new_queue));
  watchdog dog = {0};
  devbuf_event_t *never;
  CHECK_OK(devbuf_event_create(0, &dog.event));
  CHECK_OK(devbuf_event_create(0, &never));
  size_t size = 65536;
  devbuf_buffer_t *old = new_bytes(own, size, 0), *reused = NULL;
  uint64_t at = place_of(old);
  unsigned char one = 1, two = 2;
  CHECK_OK(devbuf_queue_wait(old_queue, dog.event, 1));
  CHECK_OK(devbuf_queue_fill(old_queue, old, &one, 1));
  devbuf_buffer_release(old); // in flight
  CHECK_OK(devbuf_buffer_new(own, DEVBUF_UINT8, &size, 1, 0, &reused));
  CHECK_OK(devbuf_queue_wait(new_queue, never, 1));
  CHECK_OK(devbuf_queue_fill(new_queue, reused, &two, 1));
  CHECK(place_of(reused) == at);
  CHECK_OK(devbuf_queue_cancel(new_queue));
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, watchdog_main, &dog) == 0);
  devbuf_buffer_release(reused);
  devbuf_buffer_t *host = new_bytes(own, size, 0); // for the host: not those bytes yet
  atomic_store(&dog.finished, true);
  pthread_join(thread, NULL);
  CHECK(!atomic_load(&dog.fired));
  CHECK(place_of(host) != at);
  unsigned char *bytes = malloc(size);
  memset(bytes, 3, size);
  CHECK_OK(devbuf_buffer_copyin(host, bytes, size));
  if (!atomic_load(&dog.fired)) CHECK_OK(devbuf_event_signal(dog.event, 1));
  CHECK_OK(devbuf_queue_finish(old_queue));
  unsigned char *back = read_back(host);
  CHECK(memcmp(back, bytes, size) == 0);
  free(back);
  free(bytes);
  devbuf_buffer_release(host);
  devbuf_event_release(never);
  devbuf_event_release(dog.event);
  devbuf_queue_release(old_queue);
  devbuf_queue_release(new_queue);
  devbuf_allocator_release(own);
}

// A queue held back by an event holds none of the host's calls that give memory back or
// move bytes of other buffers: a driver whose memory release waits for the device (CUDA's
// cuMemFree) would otherwise wait for the signal this thread only gives afterwards.
static void test_held_queue_holds_no_host_call(void) {
  devbuf_allocator_t *own = own_caching_allocator(device);
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  watchdog dog = {0};
  CHECK_OK(devbuf_event_create(0, &dog.event));
  size_t size = 65536;
  devbuf_buffer_t *held = new_bytes(own, size, 0), *other = new_bytes(own, size, 0);
  unsigned char six = 6;
  CHECK_OK(devbuf_queue_wait(queue, dog.event, 1));
  CHECK_OK(devbuf_queue_fill(queue, held, &six, 1));
  struct timespec settle = {0, 20 * 1000 * 1000}; // the worker reaches the wait
  nanosleep(&settle, NULL);
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, watchdog_main, &dog) == 0);
  devbuf_buffer_t *freed = new_bytes(own, 4 << 20, 0);
  devbuf_buffer_release(freed);
  devbuf_allocator_clear_cache(own); // gives the driver back the block just released
  unsigned char *bytes = malloc(size);
  memset(bytes, 4, size);
  CHECK_OK(devbuf_buffer_copyin(other, bytes, size));
  unsigned char *back = read_back(other);
  CHECK(memcmp(back, bytes, size) == 0);
  free(back);
  atomic_store(&dog.finished, true);
  pthread_join(thread, NULL);
  CHECK(!atomic_load(&dog.fired));
  if (!atomic_load(&dog.fired)) CHECK_OK(devbuf_event_signal(dog.event, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  memset(bytes, 6, size);
  back = read_back(held);
  CHECK(memcmp(back, bytes, size) == 0);
  free(back);
  free(bytes);
  devbuf_buffer_release(held);
  devbuf_buffer_release(other);
  devbuf_event_release(dog.event);
  devbuf_queue_release(queue);
  devbuf_allocator_release(own);
}

// B10 after coalescing: a block released while its work waits merges with its free
// neighbour at once. The CPU is never handed those bytes; work that reuses the merged
// bytes from another queue runs only after the released block's work.
static void test_reuse_after_coalescing(void) {
  enum { KIB = 1024, BLOCK = 128 * KIB, FILLER = 256 * KIB };
  devbuf_allocator_t *raw = NULL, *caching = NULL;
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  // A limit keeps the thread bins out: a released block of 128 KiB would wait in one
  // instead of merging with its neighbour.
  devbuf_caching_options_t no_bins = {.max_buffers = 1u << 30};
  CHECK_OK(devbuf_caching_allocator_create(raw, &no_bins, &caching));
  // One 2 MiB small segment, full: A, B, then seven fillers.
  devbuf_buffer_t *a = new_bytes(caching, BLOCK, 0), *b = new_bytes(caching, BLOCK, 0), *fillers[7];
  for (int i = 0; i < 7; i++) fillers[i] = new_bytes(caching, FILLER, 0);
  CHECK_EQ_U(stats_of(caching).segments, 1);
  uint64_t a_place = place_of(a);
  CHECK(place_of(b) == a_place + BLOCK);
  devbuf_queue_t *old_queue, *new_queue;
  CHECK_OK(devbuf_queue_create(device, &old_queue));
  CHECK_OK(devbuf_queue_create(device, &new_queue));
  devbuf_event_t *go, *done;
  CHECK_OK(devbuf_event_create(0, &go));
  CHECK_OK(devbuf_event_create(0, &done));
  unsigned char one = 1, two = 2;
  CHECK_OK(devbuf_queue_wait(old_queue, go, 1));
  CHECK_OK(devbuf_queue_fill(old_queue, a, &one, 1));
  devbuf_buffer_release(a); // in flight: its fill waits for `go`
  devbuf_buffer_release(b); // free: merges with A's bytes
  devbuf_allocator_stats_t s = stats_of(caching);
  CHECK_EQ_U(s.released_in_flight, BLOCK);
  CHECK_EQ_U(s.largest_free_block, BLOCK); // a host request may take B's bytes, not A's
  // The CPU: 192 KiB would fit the merged bytes only over A's, so it gets a new segment.
  devbuf_buffer_t *host = new_bytes(caching, 3 * BLOCK / 2, 0);
  CHECK_EQ_U(stats_of(caching).segments, 2);
  // Work from another queue takes all of the merged bytes, after A's fill.
  size_t size = 2 * BLOCK;
  devbuf_buffer_t *reused = NULL;
  CHECK_OK(devbuf_buffer_new(caching, DEVBUF_UINT8, &size, 1, 0, &reused));
  CHECK_OK(devbuf_queue_fill(new_queue, reused, &two, 1));
  CHECK_OK(devbuf_queue_signal(new_queue, done, 1));
  CHECK(place_of(reused) == a_place);
  CHECK(apart(host, reused));
  struct timespec pause = {0, 50 * 1000 * 1000};
  nanosleep(&pause, NULL);
  CHECK_EQ_U(devbuf_event_value(done), 0); // still waiting for A's fill
  const void *data;
  size_t bytes;
  devbuf_status peek = devbuf_buffer_contents(reused, &data, &bytes);
  CHECK(peek == DEVBUF_IN_USE || peek == DEVBUF_NOT_CPU_ACCESSIBLE); // its own fill is pending
  CHECK_OK(devbuf_event_signal(go, 1));
  CHECK_OK(devbuf_queue_finish(new_queue));
  CHECK_OK(devbuf_queue_finish(old_queue));
  unsigned char *back = read_back(reused);
  size_t wrong = 0;
  for (size_t i = 0; i < size; i++) wrong += back[i] != 2;
  CHECK_EQ_U(wrong, 0);
  free(back);
  CHECK_EQ_U(stats_of(caching).released_in_flight, 0);
  devbuf_buffer_release(reused);
  devbuf_buffer_release(host);
  for (int i = 0; i < 7; i++) devbuf_buffer_release(fillers[i]);
  devbuf_event_release(go);
  devbuf_event_release(done);
  devbuf_queue_release(old_queue);
  devbuf_queue_release(new_queue);
  devbuf_allocator_release(caching);
  devbuf_allocator_release(raw);
}

static void test_cancel(void) {
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_event_t *go, *done;
  CHECK_OK(devbuf_event_create(0, &go));
  CHECK_OK(devbuf_event_create(0, &done));
  devbuf_buffer_t *a = new_bytes(allocator, 256, 0);
  unsigned char five = 5;
  CHECK_OK(devbuf_queue_wait(queue, go, 1));
  CHECK_OK(devbuf_queue_fill(queue, a, &five, 1));
  CHECK_OK(devbuf_queue_signal(queue, done, 1));
  CHECK_OK(devbuf_queue_cancel(queue));
  CHECK_STATUS(devbuf_event_wait(done, 1, UINT64_MAX), DEVBUF_CANCELLED);
  CHECK(!devbuf_buffer_in_use(a));
  CHECK_OK(devbuf_queue_fill(queue, a, &five, 1)); // the queue stays usable
  CHECK_OK(devbuf_queue_finish(queue));
  devbuf_buffer_release(a);
  devbuf_event_release(go);
  devbuf_event_release(done);
  devbuf_queue_release(queue);
}

// ---- buffers shared with another process ----

static const char *self_path; // this program, run again as the importing process

// The importer (a process of its own, started afresh as any user's would be): receives the
// export on `socket`, checks bytes, dtype, shape and storage id, writes its own bytes, lets
// go of the buffer and says so.
static int import_child(int socket, uint64_t storage_id) {
  devbuf_export_t *shared = NULL;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_export_receive(socket, &shared));
  CHECK_OK(devbuf_buffer_import(device, shared, &buffer));
  devbuf_export_free(shared);
  if (!buffer) return 1;
  CHECK_EQ_U(devbuf_buffer_storage_id(buffer), storage_id);
  CHECK(devbuf_buffer_dtype(buffer) == DEVBUF_UINT16 && devbuf_buffer_ndim(buffer) == 2);
  CHECK(devbuf_buffer_shape(buffer)[0] == 64 && devbuf_buffer_shape(buffer)[1] == 2048);
  size_t size = devbuf_buffer_size(buffer);
  unsigned char *written = malloc(size), *back = read_back(buffer);
  pattern(written, size, 5);
  CHECK(memcmp(back, written, size) == 0);
  pattern(written, size, 9);
  CHECK_OK(devbuf_buffer_copyin(buffer, written, size));
  devbuf_buffer_release(buffer);
  free(written);
  free(back);
  char done = check_failures ? 'F' : 'k';
  CHECK(write(socket, &done, 1) == 1);
  return CHECK_EXIT();
}

static pid_t start_import_child(int socket, uint64_t storage_id) {
  char fd_text[16], id_text[32];
  snprintf(fd_text, sizeof fd_text, "%d", socket);
  snprintf(id_text, sizeof id_text, "%llu", (unsigned long long)storage_id);
  pid_t child = fork();
  if (child == 0) {
    execl(self_path, self_path, devbuf_device_spec(device), "--import-child", fd_text, id_text,
          (char *)NULL);
    _exit(127);
  }
  return child;
}

// Export and import: in this process (a second mapping, the same storage id), then in
// another one whose writes this process sees; the memory returns once both let go.
static void test_export_round_trip(void) {
  devbuf_allocator_t *shareable = devbuf_device_allocator_for(device, DEVBUF_MEMORY_SHAREABLE);
  devbuf_export_t *shared = NULL;
  const char *why = unsupported_because("export_round_trip");
  CHECK((why != NULL) == (shareable == NULL)); // it shares exactly when it is declared to
  if (!shareable) {                            // a device that cannot share says why
    devbuf_buffer_t *plain = new_bytes(allocator, 4096, 0);
    CHECK_STATUS(devbuf_buffer_export(plain, &shared), DEVBUF_UNSUPPORTED);
    CHECK_MESSAGE("cannot share memory with other processes");
    CHECK(shared == NULL);
    devbuf_buffer_release(plain);
    printf("     refused: %s\n", devbuf_last_error());
    return;
  }
  devbuf_buffer_t *plain = new_bytes(allocator, 4096, 0);
  CHECK_STATUS(devbuf_buffer_export(plain, &shared), DEVBUF_UNSUPPORTED);
  CHECK_MESSAGE("DEVBUF_MEMORY_SHAREABLE");
  devbuf_buffer_release(plain);

  size_t shape[2] = {64, 2048}, size = 64 * 2048 * 2;
  devbuf_buffer_t *buffer = NULL, *local = NULL, *again = NULL;
  CHECK_OK(devbuf_buffer_allocate(shareable, DEVBUF_UINT16, shape, 2, 0, &buffer));
  unsigned char *bytes = malloc(size), *back;
  pattern(bytes, size, 5);
  CHECK_OK(devbuf_buffer_copyin(buffer, bytes, size));

  CHECK_OK(devbuf_buffer_export(buffer, &shared));
  CHECK(devbuf_export_kind_of(shared) == DEVBUF_EXPORT_BUFFER);
  CHECK_OK(devbuf_buffer_import(device, shared, &local));
  CHECK_STATUS(devbuf_buffer_import(device, shared, &again), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("each export goes once");
  devbuf_export_free(shared);
  CHECK_EQ_U(devbuf_buffer_storage_id(local), devbuf_buffer_storage_id(buffer));
  CHECK(devbuf_buffer_handle_id(local) != devbuf_buffer_handle_id(buffer));
  back = read_back(local);
  CHECK(memcmp(back, bytes, size) == 0);
  free(back);
  CHECK_STATUS(devbuf_buffer_export(local, &shared), DEVBUF_UNSUPPORTED); // not the owner
  CHECK_MESSAGE("imported from process");
  devbuf_buffer_t *view = NULL, *view_import = NULL; // a view travels as a view
  CHECK_OK(devbuf_buffer_view(buffer, 8192, 4096, &view));
  CHECK_OK(devbuf_buffer_export(view, &shared));
  CHECK_OK(devbuf_buffer_import(device, shared, &view_import));
  devbuf_export_free(shared);
  CHECK_EQ_U(devbuf_buffer_size(view_import), 4096);
  CHECK_EQ_U(devbuf_buffer_count(view_import), 2048);
  back = read_back(view_import);
  CHECK(memcmp(back, bytes + 8192, 4096) == 0);
  free(back);
  devbuf_buffer_release(view_import);
  devbuf_buffer_release(view);
  unsigned char seven = 7;
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_fill(queue, local, &seven, 1)); // device work on the second mapping
  CHECK_OK(devbuf_queue_finish(queue));
  devbuf_queue_release(queue);
  back = read_back(buffer);
  size_t sevens = 0;
  for (size_t i = 0; i < size; i++) sevens += back[i] == 7;
  CHECK_EQ_U(sevens, size);
  free(back);
  devbuf_buffer_release(local);

  CHECK_OK(devbuf_buffer_copyin(buffer, bytes, size));
  int sockets[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sockets) == 0);
  pid_t child = start_import_child(sockets[1], devbuf_buffer_storage_id(buffer));
  close(sockets[1]);
  CHECK_OK(devbuf_buffer_export(buffer, &shared));
  CHECK_OK(devbuf_export_send(shared, sockets[0]));
  CHECK_STATUS(devbuf_export_send(shared, sockets[0]), DEVBUF_INVALID_ARGUMENT); // sent once
  devbuf_export_free(shared);
  char done = 0;
  CHECK(read(sockets[0], &done, 1) == 1 && done == 'k');
  int child_status = -1;
  CHECK(waitpid(child, &child_status, 0) == child);
  CHECK(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0);
  close(sockets[0]);
  back = read_back(buffer);
  pattern(bytes, size, 9);
  CHECK(memcmp(back, bytes, size) == 0); // the other process's writes
  free(back);
  devbuf_allocator_stats_t stats;
  devbuf_buffer_release(buffer);
  uint64_t held = 1;
  CHECK_OK(devbuf_export_reclaim(&held));
  CHECK_EQ_U(held, 0); // both importers let go: nothing is kept for them
  CHECK_OK(devbuf_allocator_stats(shareable, &stats));
  CHECK_EQ_U(stats.active, 0);
  free(bytes);
}

// ---- the cases, and running them ---------------------------------------------------------

#define CASE(name) \
  { #name, test_##name }
static const struct {
  const char *name;
  void (*run)(void);
} cases[] = {
    CASE(caching_reuse),
    CASE(copies),
    CASE(zero_and_lazy),
    CASE(host_access),
    CASE(queue_fill_copy),
    CASE(host_task),
    CASE(events_and_hazards),
    CASE(release_in_flight),
    CASE(cancel),
    CASE(reuse_after_cancel),
    CASE(reuse_after_coalescing),
    CASE(reuse_past_an_owner_of_other_bytes),
    CASE(reuse_past_a_cancelled_owner),
    CASE(release_after_cancelled_reuse),
    CASE(held_queue_holds_no_host_call),
    CASE(empty_access),
    CASE(copy_within_storage),
    CASE(export_round_trip),
};
#define CASE_COUNT (sizeof cases / sizeof cases[0])

// Runs one case; its failures name the device and the case ("[opencl:0 copies] CHECK ...").
static void run_case(size_t index, char *label, size_t capacity) {
  snprintf(label, capacity, "%s %s", devbuf_device_spec(device), cases[index].name);
  check_current = label;
  int before = check_failures;
  cases[index].run();
  const char *why = unsupported_because(cases[index].name);
  printf("%s %s%s%s%s\n", check_failures == before ? "ok  " : "FAIL", label,
         why ? " (declared unsupported: " : "", why ? why : "", why ? ")" : "");
}

static int usage(const char *self) {
  fprintf(stderr, "usage: %s [SPEC [--case NAME | --list]]   (SPEC: cpu, opencl:0, ...)\n", self);
  return 2;
}

int main(int argc, char **argv) {
  const char *spec = argc > 1 ? argv[1] : "cpu";
  self_path = argv[0];
  if (argc == 3 && strcmp(argv[2], "--list") == 0) {
    for (size_t i = 0; i < CASE_COUNT; i++) printf("%s\n", cases[i].name);
    return 0;
  }
  const char *only = NULL;
  if (argc == 4 && strcmp(argv[2], "--case") == 0) {
    only = argv[3];
    bool known = false;
    for (size_t i = 0; i < CASE_COUNT; i++) known |= strcmp(cases[i].name, only) == 0;
    if (!known) {
      fprintf(stderr, "no conformance case '%s' (--list names them)\n", only);
      return 2;
    }
  } else if (argc > 2 && !(argc == 5 && strcmp(argv[2], "--import-child") == 0)) {
    return usage(argv[0]);
  }
  if (devbuf_device_open(spec, &device) != DEVBUF_OK) {
    printf("SKIP: %s: %s\n", spec, devbuf_last_error());
    return SKIP_EXIT_CODE;
  }
  allocator = devbuf_device_allocator(device);
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) { // each row names a backend
    bool known = false;
    for (size_t k = 1; k <= devbuf_device_kind_count(); k++)
      known |= strcmp(devbuf_device_kind_name((devbuf_device_kind)k), table[i].backend) == 0;
    if (!known) {
      fprintf(stderr, "the expectations table names '%s', which is no backend of this build\n",
              table[i].backend);
      check_failures++;
    }
  }
  const char *kind = devbuf_device_kind_name(devbuf_device_kind_of(device));
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(table[i].backend, kind) == 0) expected = &table[i];
  if (argc == 5) {
    int status = import_child(atoi(argv[3]), strtoull(argv[4], NULL, 10));
    devbuf_device_release(device);
    return status;
  }
  printf("conformance on %s (%s)%s\n", devbuf_device_spec(device), devbuf_device_name(device),
         expected == &undeclared ? ": no row in the expectations table, every case runs" : "");
  char label[128];
  for (size_t i = 0; i < CASE_COUNT; i++)
    if (!only || strcmp(cases[i].name, only) == 0) run_case(i, label, sizeof label);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
