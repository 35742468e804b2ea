// Queues, events and hazard tracking on the CPU backend. Work is held back with
// host-signalled events, never with sleeps, so every check is deterministic (the one test
// that pauses does so to make a worker sleep, and its checks hold at any timing).
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

static devbuf_device_t *device;
static devbuf_allocator_t *allocator;

static devbuf_buffer_t *floats(size_t count) {
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &count, 1, DEVBUF_BUFFER_ZERO, &buffer));
  return buffer;
}

static float read_float(devbuf_buffer_t *buffer, size_t index) {
  float value = -1;
  devbuf_buffer_t *one = NULL;
  if (devbuf_buffer_view(buffer, index * 4, 4, &one) == DEVBUF_OK)
    devbuf_buffer_copyout(one, &value, 4);
  devbuf_buffer_release(one);
  return value;
}

// data[0] (written) = data[1] (read) * scale + add, elementwise; scalars {scale, add}.
static devbuf_status axpb(const devbuf_kernel_args_t *args) {
  const float *scalars = args->scalars;
  float *out = args->data[0];
  const float *in = args->data[args->count > 1 ? 1 : 0];
  for (size_t i = 0; i < args->sizes[0] / 4; i++) out[i] = in[i] * scalars[0] + scalars[1];
  return DEVBUF_OK;
}

static atomic_int kernel_runs;
static devbuf_status count_runs(const devbuf_kernel_args_t *args) {
  (void)args;
  atomic_fetch_add(&kernel_runs, 1);
  return DEVBUF_OK;
}

static devbuf_status failing_kernel(const devbuf_kernel_args_t *args) {
  return devbuf_set_error(DEVBUF_DEVICE_FAILURE, "kernel found %zu bad values", args->count + 41);
}

static devbuf_status submit_axpb(devbuf_queue_t *queue, devbuf_buffer_t *out, devbuf_buffer_t *in,
                                 float scale, float add) {
  float scalars[2] = {scale, add};
  devbuf_use_t uses[2] = {{out, DEVBUF_ACCESS_WRITE}, {in, DEVBUF_ACCESS_READ}};
  return devbuf_queue_submit(queue, axpb, uses, in ? 2 : 1, scalars, sizeof scalars);
}

// ---- events ---------------------------------------------------------------------------

static void test_event_holds_work(void) {
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  atomic_store(&kernel_runs, 0);
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  CHECK_OK(devbuf_queue_submit(queue, count_runs, NULL, 0, NULL, 0));
  CHECK_STATUS(devbuf_event_wait(gate, 1, 1000000), DEVBUF_TIMEOUT); // 1 ms: nothing signals it
  CHECK_MESSAGE("below 1");
  CHECK_EQ_U(atomic_load(&kernel_runs), 0); // held back
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_EQ_U(atomic_load(&kernel_runs), 1); // and then runs
  CHECK_OK(devbuf_event_wait(gate, 1, 0));  // a value already reached returns at once
  CHECK_OK(devbuf_event_wait(gate, 0, 0));
  CHECK_STATUS(devbuf_event_wait(gate, 2, 0), DEVBUF_TIMEOUT);
  CHECK_STATUS(devbuf_event_signal(gate, 0), DEVBUF_INVALID_ARGUMENT); // timelines only grow
  // A queue signals; the host and another queue wait for it.
  devbuf_queue_t *other = NULL;
  devbuf_event_t *done = NULL;
  CHECK_OK(devbuf_queue_create(device, &other));
  CHECK_OK(devbuf_event_create(5, &done));
  CHECK_OK(devbuf_queue_wait(queue, gate, 2));
  CHECK_OK(devbuf_queue_signal(queue, done, 7));
  CHECK_OK(devbuf_queue_wait(other, done, 7));
  CHECK_OK(devbuf_queue_submit(other, count_runs, NULL, 0, NULL, 0));
  CHECK_EQ_U(devbuf_event_value(done), 5);
  CHECK_OK(devbuf_event_signal(gate, 2));
  CHECK_OK(devbuf_event_wait(done, 7, UINT64_MAX));
  CHECK_OK(devbuf_queue_finish(other));
  CHECK_EQ_U(atomic_load(&kernel_runs), 2);
  CHECK_EQ_U(devbuf_event_value(done), 7);
  devbuf_event_release(done);
  devbuf_event_release(gate);
  devbuf_queue_release(other);
  devbuf_queue_release(queue);
}

// ---- host access while work is in flight ----------------------------------------------

typedef struct waiter_args {
  devbuf_buffer_t *buffer;
  bool write;
  devbuf_status status;
  float first;
} waiter_args;

static void *blocking_access(void *arg) {
  waiter_args *w = arg;
  void *data = NULL;
  w->status = w->write ? devbuf_buffer_contents_mut_wait(w->buffer, &data, NULL)
                       : devbuf_buffer_contents_wait(w->buffer, (const void **)&data, NULL);
  if (w->status == DEVBUF_OK) {
    w->first = *(float *)data;
    devbuf_buffer_end_access(w->buffer, data);
  }
  return NULL;
}

static void test_host_access_rules(void) {
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  devbuf_buffer_t *buffer = floats(8), *left = NULL, *right = NULL, *middle = NULL,
                  *source = floats(4);
  CHECK_OK(devbuf_buffer_view(buffer, 0, 16, &left));
  CHECK_OK(devbuf_buffer_view(buffer, 16, 16, &right));
  CHECK_OK(devbuf_buffer_view(buffer, 8, 16, &middle)); // overlaps both
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  CHECK_OK(submit_axpb(queue, left, source, 1, 3)); // writes left = 3, reads source
  const void *read = NULL;
  void *write = NULL;
  CHECK(devbuf_buffer_in_use(buffer) && devbuf_buffer_in_use(left) && devbuf_buffer_in_use(middle));
  CHECK(!devbuf_buffer_in_use(right));
  CHECK_STATUS(devbuf_buffer_contents(left, &read, NULL), DEVBUF_IN_USE);
  CHECK_MESSAGE("submitted work writes them");
  CHECK_STATUS(devbuf_buffer_contents(middle, &read, NULL), DEVBUF_IN_USE);
  CHECK_STATUS(devbuf_buffer_contents_mut(buffer, &write, NULL), DEVBUF_IN_USE);
  CHECK_OK(devbuf_buffer_contents_mut(right, &write, NULL)); // disjoint: allowed
  CHECK_OK(devbuf_buffer_end_access(right, write));
  // The source is only read: reading it is allowed, writing it is not.
  CHECK_OK(devbuf_buffer_contents(source, &read, NULL));
  CHECK_OK(devbuf_buffer_end_access(source, read));
  CHECK_STATUS(devbuf_buffer_contents_mut(source, &write, NULL), DEVBUF_IN_USE);
  devbuf_array_t array;
  CHECK_STATUS(devbuf_buffer_as_array(left, DEVBUF_FLOAT32, &array), DEVBUF_IN_USE);
  // Blocking variants return once the work completes, with its result.
  pthread_t reader, writer;
  waiter_args read_args = {left, false, DEVBUF_INVALID_ARGUMENT, 0};
  waiter_args write_args = {source, true, DEVBUF_INVALID_ARGUMENT, 0};
  pthread_create(&reader, NULL, blocking_access, &read_args);
  pthread_create(&writer, NULL, blocking_access, &write_args);
  CHECK_OK(devbuf_event_signal(gate, 1));
  pthread_join(reader, NULL);
  pthread_join(writer, NULL);
  CHECK_OK(read_args.status);
  CHECK(read_args.first == 3.0f);
  CHECK_OK(write_args.status);
  CHECK_OK(devbuf_buffer_wait(buffer));
  CHECK(!devbuf_buffer_in_use(buffer));
  // HOST_ACCESS_OPEN: an open host access refuses racing work, not disjoint work.
  CHECK_OK(devbuf_buffer_contents_mut(left, &write, NULL));
  CHECK_STATUS(submit_axpb(queue, middle, NULL, 1, 1), DEVBUF_HOST_ACCESS_OPEN);
  CHECK_MESSAGE("host write access to bytes [0, 16)");
  CHECK_STATUS(submit_axpb(queue, right, left, 1, 1),
               DEVBUF_HOST_ACCESS_OPEN);           // reading it races too
  CHECK_OK(submit_axpb(queue, right, NULL, 0, 9)); // disjoint
  CHECK_OK(devbuf_buffer_end_access(left, write));
  CHECK_OK(devbuf_buffer_contents(left, &read, NULL));
  CHECK_OK(submit_axpb(queue, right, left, 1, 1)); // reading under a read access is fine
  CHECK_STATUS(submit_axpb(queue, left, NULL, 1, 1), DEVBUF_HOST_ACCESS_OPEN);
  CHECK_OK(devbuf_buffer_end_access(left, read));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK(read_float(buffer, 4) == 4.0f); // right = left (3) * 1 + 1
  // Copies wait for work instead of racing with it.
  CHECK_OK(devbuf_queue_wait(queue, gate, 2));
  CHECK_OK(submit_axpb(queue, right, NULL, 0, 7));
  float got[4] = {0};
  CHECK_OK(devbuf_event_signal(gate, 2));
  CHECK_OK(devbuf_buffer_copyout(right, got, sizeof got)); // waits for the write
  CHECK(got[0] == 7.0f && got[3] == 7.0f);
  devbuf_buffer_release(left);
  devbuf_buffer_release(right);
  devbuf_buffer_release(middle);
  devbuf_buffer_release(source);
  devbuf_buffer_release(buffer);
  devbuf_event_release(gate);
  devbuf_queue_release(queue);
}

// ---- tracking across queues --------------------------------------------------------------

static void test_cross_queue_ordering(void) {
  devbuf_queue_t *a = NULL, *b = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_queue_create(device, &a));
  CHECK_OK(devbuf_queue_create(device, &b));
  CHECK_OK(devbuf_event_create(0, &gate));
  devbuf_buffer_t *x = floats(1024), *y = floats(1024), *low = NULL, *high = NULL;
  CHECK_OK(devbuf_buffer_view(y, 0, 2048, &low));
  CHECK_OK(devbuf_buffer_view(y, 2048, 2048, &high));
  CHECK_OK(devbuf_queue_wait(a, gate, 1));
  CHECK_OK(submit_axpb(a, x, NULL, 0, 5)); // a: x = 5 (held back)
  CHECK_OK(submit_axpb(b, y, x, 2, 0));    // b: y = 2x, read after write: must wait for a
  CHECK(devbuf_buffer_in_use(y));
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(b));
  CHECK(read_float(y, 0) == 10.0f && read_float(y, 1023) == 10.0f);
  // Write after read: a writes x while b still reads it (b held back).
  CHECK_OK(devbuf_queue_wait(b, gate, 2));
  CHECK_OK(submit_axpb(b, y, x, 1, 0));    // b: y = x (reads the 5s)
  CHECK_OK(submit_axpb(a, x, NULL, 0, 6)); // a: x = 6 must wait for b's read
  CHECK_OK(devbuf_event_signal(gate, 2));
  CHECK_OK(devbuf_queue_finish(a));
  CHECK_OK(devbuf_queue_finish(b));
  CHECK(read_float(y, 7) == 5.0f && read_float(x, 7) == 6.0f);
  // Disjoint views never wait for each other: b's write to `high` runs while a's write to
  // `low` is held back.
  CHECK_OK(devbuf_queue_wait(a, gate, 3));
  CHECK_OK(submit_axpb(a, low, NULL, 0, 1));
  CHECK_OK(submit_axpb(b, high, NULL, 0, 2));
  CHECK_OK(devbuf_queue_finish(b)); // returns although a is still held
  CHECK(devbuf_buffer_in_use(low) && !devbuf_buffer_in_use(high));
  CHECK_OK(devbuf_event_signal(gate, 3));
  CHECK_OK(devbuf_queue_finish(a));
  CHECK(read_float(y, 0) == 1.0f && read_float(y, 512) == 2.0f);
  // The device waits for everything.
  CHECK_OK(devbuf_queue_wait(a, gate, 4));
  CHECK_OK(submit_axpb(a, x, NULL, 0, 8));
  CHECK_OK(devbuf_event_signal(gate, 4));
  CHECK_OK(devbuf_buffer_synchronize(x));
  CHECK(!devbuf_buffer_in_use(x) && read_float(x, 3) == 8.0f);
  devbuf_buffer_release(low);
  devbuf_buffer_release(high);
  devbuf_buffer_release(x);
  devbuf_buffer_release(y);
  devbuf_event_release(gate);
  devbuf_queue_release(a);
  devbuf_queue_release(b);
}

// ---- release while in flight (B10) ------------------------------------------------------

static void test_release_in_flight_and_reuse(void) {
  devbuf_allocator_t *device_allocator = allocator;
  allocator = own_caching_allocator(device); // which block a request gets is then known
  devbuf_queue_t *a = NULL, *b = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_queue_create(device, &a));
  CHECK_OK(devbuf_queue_create(device, &b));
  CHECK_OK(devbuf_event_create(0, &gate));
  size_t n = 4096;
  devbuf_buffer_t *old = floats(n), *result = floats(n);
  uint64_t old_address = 0, new_address = 0;
  CHECK_OK(devbuf_buffer_device_ptr(old, &old_address));
  devbuf_allocator_stats_t before = stats_of(allocator);
  CHECK_OK(devbuf_queue_wait(a, gate, 1));
  CHECK_OK(submit_axpb(a, old, NULL, 0, 4));   // old = 4 (held back)
  CHECK_OK(submit_axpb(a, result, old, 1, 0)); // result = old
  devbuf_buffer_release(old);                  // in flight: back to the cache at once
  devbuf_allocator_stats_t after = stats_of(allocator);
  CHECK_EQ_U(after.active, before.active - n * 4);
  CHECK_EQ_U(after.cached, before.cached + n * 4);
  CHECK_EQ_U(after.live_buffers, before.live_buffers - 1);
  // A plain CPU allocation never receives memory that work still uses.
  devbuf_buffer_t *plain = NULL;
  uint64_t plain_address = 0;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &n, 1, 0, &plain));
  CHECK_OK(devbuf_buffer_device_ptr(plain, &plain_address));
  CHECK(plain_address != old_address);
  // A buffer for work on another queue reuses the memory, ordered after the old work.
  devbuf_buffer_t *reused = NULL;
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_FLOAT32, &n, 1, 0, &reused));
  CHECK_OK(submit_axpb(b, reused, NULL, 0, 9)); // write after the old write and read
  CHECK_OK(devbuf_buffer_device_ptr(reused, &new_address));
  CHECK(new_address == old_address);
  CHECK(devbuf_buffer_in_use(reused));
  // The CPU waits for the old work before it touches the reused memory.
  CHECK_OK(devbuf_event_signal(gate, 1));
  const void *data = NULL;
  CHECK_OK(devbuf_buffer_contents_wait(reused, &data, NULL));
  CHECK(((const float *)data)[0] == 9.0f && ((const float *)data)[n - 1] == 9.0f);
  CHECK_OK(devbuf_buffer_end_access(reused, data));
  CHECK_OK(devbuf_queue_finish(a));
  CHECK(read_float(result, 0) == 4.0f &&
        read_float(result, n - 1) == 4.0f); // old work saw its own data
  // Released again with work pending on the same queue: reused by that queue at once.
  CHECK_OK(devbuf_queue_wait(b, gate, 2));
  CHECK_OK(submit_axpb(b, reused, NULL, 0, 1));
  devbuf_buffer_release(reused);
  devbuf_buffer_t *again = NULL;
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_FLOAT32, &n, 1, 0, &again));
  CHECK_OK(submit_axpb(b, again, NULL, 0, 2));
  CHECK_OK(devbuf_buffer_device_ptr(again, &new_address));
  CHECK(new_address == old_address);
  CHECK_OK(devbuf_event_signal(gate, 2));
  CHECK_OK(devbuf_queue_finish(b));
  CHECK(read_float(again, 10) == 2.0f);
  // When the work completes with nobody reusing it, the memory is plain cache again.
  CHECK_OK(devbuf_queue_wait(a, gate, 3));
  CHECK_OK(submit_axpb(a, again, NULL, 0, 3));
  devbuf_buffer_release(again);
  CHECK_OK(devbuf_event_signal(gate, 3));
  CHECK_OK(devbuf_queue_finish(a));
  devbuf_allocator_stats_t idle = stats_of(allocator);
  CHECK_EQ_U(idle.live_buffers,
             before.live_buffers); // result and plain: as before old was released
  devbuf_buffer_release(plain);
  devbuf_buffer_release(result);
  devbuf_event_release(gate);
  devbuf_queue_release(a);
  devbuf_queue_release(b);
  devbuf_allocator_release(allocator);
  allocator = device_allocator;
}

// A block that is its whole segment (above 10 MiB) goes in flight, is taken for work on
// another queue, and once that work is done and it is released it waits parked in the
// thread (a debug build checks that none of its bytes is in flight then): a plain CPU
// allocation of its size takes it, and writes it, with no new memory.
static void test_in_flight_whole_segment_then_parked(void) {
  devbuf_allocator_t *device_allocator = allocator;
  allocator = own_caching_allocator(device);
  devbuf_queue_t *a = NULL, *b = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_queue_create(device, &a));
  CHECK_OK(devbuf_queue_create(device, &b));
  CHECK_OK(devbuf_event_create(0, &gate));
  size_t n = (size_t)4 << 20; // 16 MiB of floats
  devbuf_buffer_t *old = floats(n);
  uint64_t old_address = 0, address = 0;
  CHECK_OK(devbuf_buffer_device_ptr(old, &old_address));
  CHECK_OK(devbuf_queue_wait(a, gate, 1));
  CHECK_OK(submit_axpb(a, old, NULL, 0, 4));
  devbuf_buffer_release(old); // in flight
  devbuf_buffer_t *reused = NULL;
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_FLOAT32, &n, 1, 0, &reused));
  CHECK_OK(submit_axpb(b, reused, NULL, 0, 9)); // ordered after the old write
  CHECK_OK(devbuf_buffer_device_ptr(reused, &address));
  CHECK(address == old_address);
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(a));
  CHECK_OK(devbuf_queue_finish(b));
  CHECK(read_float(reused, n - 1) == 9.0f);
  devbuf_buffer_release(reused); // its work is done: parked
  CHECK_EQ_U(stats_of(allocator).released_in_flight, 0);
  devbuf_allocator_snapshot_t *snapshot = NULL;
  CHECK_OK(devbuf_allocator_snapshot(allocator, &snapshot));
  CHECK(snapshot && snapshot->segment_count == 1 && snapshot->segments[0].block_count == 1 &&
        snapshot->segments[0].blocks[0].state == DEVBUF_BLOCK_THREAD_CACHED);
  devbuf_allocator_snapshot_free(snapshot);
  devbuf_buffer_t *plain = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &n, 1, 0, &plain));
  CHECK_OK(devbuf_buffer_device_ptr(plain, &address));
  CHECK(address == old_address);
  CHECK_EQ_U(stats_of(allocator).system_allocs, 1);
  float *data = NULL;
  CHECK_OK(devbuf_buffer_unsynchronized_ptr(plain, (void **)&data, NULL));
  for (size_t i = 0; data && i < n; i++) data[i] = (float)i;
  CHECK(read_float(plain, n - 1) == (float)(n - 1));
  devbuf_buffer_release(plain);
  devbuf_event_release(gate);
  devbuf_queue_release(a);
  devbuf_queue_release(b);
  devbuf_allocator_release(allocator);
  allocator = device_allocator;
}

// An adaptor over a caching allocator forwards release in flight and ordered allocation:
// wrapping a cache for statistics, a trace or fault injection keeps the reuse (and its
// snapshot). The adaptor
// counts the in-flight release as a free and the ordered allocation as an allocation; the
// trace records them as its "f" and "a" lines.
static void test_adaptors_keep_in_flight_reuse(void) {
  char trace_path[] = "/tmp/devbuf-test-adaptor-trace-XXXXXX";
  int trace_fd = mkstemp(trace_path);
  CHECK(trace_fd >= 0);
  close(trace_fd);
  for (int kind = 0; kind < 3; kind++) {
    devbuf_allocator_t *caching = own_caching_allocator(device), *adaptor = NULL;
    if (kind == 0) CHECK_OK(devbuf_stats_adaptor_create(caching, &adaptor));
    if (kind == 1) CHECK_OK(devbuf_trace_adaptor_create(caching, trace_path, &adaptor));
    if (kind == 2) CHECK_OK(devbuf_fault_adaptor_create(caching, 0, DEVBUF_FAULT_ONCE, &adaptor));
    if (!adaptor) {
      devbuf_allocator_release(caching);
      continue;
    }
    devbuf_queue_t *queue = NULL;
    devbuf_event_t *gate = NULL;
    CHECK_OK(devbuf_queue_create(device, &queue));
    CHECK_OK(devbuf_event_create(0, &gate));
    size_t n = 16384;
    devbuf_buffer_t *old = NULL, *reused = NULL;
    CHECK_OK(devbuf_buffer_allocate(adaptor, DEVBUF_UINT8, &n, 1, 0, &old));
    uint64_t old_address = 0, new_address = 0;
    CHECK_OK(devbuf_buffer_device_ptr(old, &old_address));
    unsigned char one = 1, two = 2;
    CHECK_OK(devbuf_queue_wait(queue, gate, 1));
    CHECK_OK(devbuf_queue_fill(queue, old, &one, 1)); // held back
    devbuf_buffer_release(old);                       // in flight, through the adaptor
    CHECK_EQ_U(stats_of(caching).released_in_flight, n);
    if (kind == 0) CHECK_EQ_U(stats_of(adaptor).active, 0); // the adaptor counted a free
    CHECK_OK(devbuf_buffer_new(adaptor, DEVBUF_UINT8, &n, 1, 0, &reused));
    CHECK_OK(devbuf_queue_fill(queue, reused, &two, 1)); // takes the old bytes, ordered after
    CHECK_OK(devbuf_buffer_device_ptr(reused, &new_address));
    CHECK(new_address == old_address);
    if (kind == 0) CHECK_EQ_U(stats_of(adaptor).active, n);
    CHECK_OK(devbuf_event_signal(gate, 1));
    CHECK_OK(devbuf_queue_finish(queue));
    CHECK_EQ_U(stats_of(caching).released_in_flight, 0);
    const void *data = NULL;
    CHECK_OK(devbuf_buffer_contents(reused, &data, NULL));
    CHECK(((const unsigned char *)data)[0] == 2 && ((const unsigned char *)data)[n - 1] == 2);
    CHECK_OK(devbuf_buffer_end_access(reused, data));
    devbuf_allocator_snapshot_t *picture = NULL; // the cache's, through the adaptor
    CHECK_OK(devbuf_allocator_snapshot(adaptor, &picture));
    CHECK(picture && picture->segment_count == 1 && picture->segments[0].size >= n);
    devbuf_allocator_snapshot_free(picture);
    devbuf_buffer_release(reused);
    devbuf_event_release(gate);
    devbuf_queue_release(queue);
    devbuf_allocator_release(adaptor);
    devbuf_allocator_release(caching);
    if (kind == 1) { // the trace: allocated, freed (in flight), allocated again, freed
      FILE *file = fopen(trace_path, "r");
      char text[256] = "";
      size_t got = file ? fread(text, 1, sizeof text - 1, file) : 0;
      if (file) fclose(file);
      text[got] = '\0';
      CHECK(strcmp(text, "# devbuf trace 1\na 1 16384\nf 1\na 2 16384\nf 2\n") == 0);
    }
  }
  unlink(trace_path);
}

static devbuf_status fails_with_io_error(const devbuf_kernel_args_t *args) {
  (void)args;
  return devbuf_set_error(DEVBUF_IO_ERROR, "the disk went away");
}

// A failure that leads to another carries its cause: a queue's failure names the queue and
// its device, then the failed work's own message; an event it was to signal says the same;
// an allocation that fails names the size and the device, then the allocator's refusal.
static void test_failures_carry_their_cause(void) {
  devbuf_queue_t *first = NULL, *second = NULL;
  CHECK_OK(devbuf_queue_create(device, &first));
  CHECK_OK(devbuf_queue_create(device, &second));
  devbuf_event_t *done = NULL, *gate = NULL;
  CHECK_OK(devbuf_event_create(0, &done));
  CHECK_OK(devbuf_event_create(0, &gate));
  // The failure waits behind the gate until the signal is queued after it: a queue that has
  // failed already refuses the signal (with the same cause), and nothing would raise `done`.
  CHECK_OK(devbuf_queue_wait(second, gate, 1));
  CHECK_OK(devbuf_queue_host_task(second, fails_with_io_error, NULL, 0, NULL, 0));
  CHECK_OK(devbuf_queue_signal(second, done, 1));
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_STATUS(devbuf_queue_finish(second), DEVBUF_IO_ERROR);
  const char *message = devbuf_last_error();
  // The second queue made on the device since `first`: its number is one more.
  CHECK(strncmp(message, "IO_ERROR: queue ", 16) == 0);
  CHECK_MESSAGE(" on cpu failed: IO_ERROR: the disk went away");
  unsigned first_number = 0, second_number = 0;
  CHECK(sscanf(message, "IO_ERROR: queue %u", &second_number) == 1);
  CHECK_OK(devbuf_queue_host_task(first, fails_with_io_error, NULL, 0, NULL, 0));
  CHECK_STATUS(devbuf_queue_finish(first), DEVBUF_IO_ERROR);
  CHECK(sscanf(devbuf_last_error(), "IO_ERROR: queue %u", &first_number) == 1);
  CHECK_EQ_U(second_number, first_number + 1);
  CHECK_STATUS(devbuf_event_wait(done, 1, UINT64_MAX), DEVBUF_IO_ERROR);
  CHECK_MESSAGE(" on cpu failed: IO_ERROR: the disk went away");

  devbuf_caching_options_t limit = {.memory_limit = 1 << 20};
  devbuf_allocator_t *raw = NULL, *limited = NULL;
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  CHECK_OK(devbuf_caching_allocator_create(raw, &limit, &limited));
  size_t size = (size_t)64 << 20;
  devbuf_buffer_t *big = NULL;
  CHECK_STATUS(devbuf_buffer_allocate(limited, DEVBUF_UINT8, &size, 1, 0, &big),
               DEVBUF_OUT_OF_MEMORY);
  const char *expected = "OUT_OF_MEMORY: allocating 64 MiB on cpu: OUT_OF_MEMORY: requested";
  CHECK(strncmp(devbuf_last_error(), expected, strlen(expected)) == 0);
  devbuf_allocator_release(limited);
  devbuf_allocator_release(raw);
  devbuf_event_release(done);
  devbuf_event_release(gate);
  devbuf_queue_release(first);
  devbuf_queue_release(second);
}

// Bytes that went through two owners while their work is held back. The second owner took
// the first half of the first's bytes, and so waits for the first owner's work on that
// half; the first owner's later work on the other half it does not wait for. A third
// owner of all the bytes waits for that too, not only for the second owner's work.
static void test_reuse_through_two_owners(void) {
  devbuf_allocator_t *device_allocator = allocator;
  allocator = own_caching_allocator(device);
  devbuf_queue_t *q[3] = {NULL, NULL, NULL};
  for (int i = 0; i < 3; i++) CHECK_OK(devbuf_queue_create(device, &q[i]));
  devbuf_event_t *gate = NULL, *third_done = NULL;
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_event_create(0, &third_done));
  size_t whole = 8192, half = 4096;
  devbuf_buffer_t *first = NULL, *first_half = NULL, *second_half = NULL, *second = NULL,
                  *third = NULL;
  uint64_t at[3] = {0, 0, 0};
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_FLOAT32, &whole, 1, 0, &first));
  CHECK_OK(devbuf_buffer_view(first, 0, half * 4, &first_half));
  CHECK_OK(devbuf_buffer_view(first, half * 4, half * 4, &second_half));
  CHECK_OK(devbuf_queue_wait(q[0], gate, 1));
  CHECK_OK(submit_axpb(q[0], first_half, NULL, 0, 4));
  CHECK_OK(devbuf_queue_wait(q[0], gate, 2));
  CHECK_OK(submit_axpb(q[0], second_half, NULL, 0, 5));
  CHECK_OK(devbuf_buffer_device_ptr(first, &at[0]));
  devbuf_buffer_release(first_half);
  devbuf_buffer_release(second_half);
  devbuf_buffer_release(first);
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_FLOAT32, &half, 1, 0, &second));
  CHECK_OK(submit_axpb(q[1], second, NULL, 0, 9)); // after the first half's write
  CHECK_OK(devbuf_buffer_device_ptr(second, &at[1]));
  devbuf_buffer_release(second);
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_FLOAT32, &whole, 1, 0, &third));
  CHECK_OK(submit_axpb(q[2], third, NULL, 0, 7)); // after every write before it
  CHECK_OK(devbuf_queue_signal(q[2], third_done, 1));
  CHECK_OK(devbuf_buffer_device_ptr(third, &at[2]));
  CHECK(at[1] == at[0] && at[2] == at[0]);
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(q[1])); // the second owner's work is done ...
  CHECK_STATUS(devbuf_event_wait(third_done, 1, 50 * 1000 * 1000), DEVBUF_TIMEOUT); // ... not yet
  CHECK_OK(devbuf_event_signal(gate, 2));
  float values[8192];
  CHECK_OK(devbuf_buffer_copyout(third, values, sizeof values));
  size_t wrong = 0;
  for (size_t i = 0; i < whole; i++) wrong += values[i] != 7.0f;
  CHECK_EQ_U(wrong, 0);
  devbuf_buffer_release(third);
  for (int i = 0; i < 3; i++) CHECK_OK(devbuf_queue_finish(q[i]));
  devbuf_event_release(third_done);
  devbuf_event_release(gate);
  for (int i = 0; i < 3; i++) devbuf_queue_release(q[i]);
  devbuf_allocator_release(allocator);
  allocator = device_allocator;
}

// A chain of kernels over memory released and reused while earlier work is pending.
static uint32_t chain_checksum(void) {
  devbuf_queue_t *q[2] = {NULL, NULL};
  CHECK_OK(devbuf_queue_create(device, &q[0]));
  CHECK_OK(devbuf_queue_create(device, &q[1]));
  size_t n = 1000;
  devbuf_buffer_t *current = floats(n);
  CHECK_OK(submit_axpb(q[0], current, NULL, 0, 1));
  for (int step = 0; step < 40; step++) {
    devbuf_buffer_t *next = NULL;
    CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_FLOAT32, &n, 1, 0, &next));
    CHECK_OK(submit_axpb(q[step % 2], next, current, 1.5f, (float)step));
    devbuf_buffer_release(current); // pending: the next step's buffer may reuse it
    current = next;
  }
  float values[1000];
  CHECK_OK(devbuf_buffer_copyout(current, values, sizeof values));
  uint32_t hash = 2166136261u;
  const unsigned char *bytes = (const unsigned char *)values;
  for (size_t i = 0; i < sizeof values; i++) hash = (hash ^ bytes[i]) * 16777619u;
  devbuf_buffer_release(current);
  devbuf_queue_release(q[0]);
  devbuf_queue_release(q[1]);
  return hash;
}

static void test_determinism(void) {
  uint32_t first = chain_checksum();
  // The expected value, computed on the host the same way.
  float expected[1000];
  for (size_t i = 0; i < 1000; i++) {
    expected[i] = 1;
    for (int step = 0; step < 40; step++) expected[i] = expected[i] * 1.5f + (float)step;
  }
  uint32_t hash = 2166136261u;
  const unsigned char *bytes = (const unsigned char *)expected;
  for (size_t i = 0; i < sizeof expected; i++) hash = (hash ^ bytes[i]) * 16777619u;
  CHECK_EQ_U(first, hash);
  for (int run = 0; run < 99; run++) CHECK_EQ_U(chain_checksum(), first);
}

// ---- failures ------------------------------------------------------------------------

static void test_failure_propagation(void) {
  devbuf_queue_t *queue = NULL, *other = NULL;
  devbuf_event_t *gate = NULL, *after = NULL, *waiting = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_create(device, &other));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_event_create(0, &after));
  CHECK_OK(devbuf_event_create(0, &waiting));
  devbuf_buffer_t *x = floats(16), *y = floats(16);
  atomic_store(&kernel_runs, 0);
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  devbuf_use_t use = {x, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(queue, failing_kernel, &use, 1, NULL, 0));
  CHECK_OK(devbuf_queue_submit(queue, count_runs, NULL, 0, NULL, 0)); // queued behind: never runs
  CHECK_OK(devbuf_queue_signal(queue, after, 1));
  CHECK_OK(submit_axpb(other, y, x, 1, 0)); // depends on the failing write
  CHECK_OK(devbuf_queue_signal(other, waiting, 1));
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_STATUS(devbuf_event_wait(after, 1, UINT64_MAX), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("kernel found 42 bad values");
  CHECK_STATUS(devbuf_queue_finish(queue), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("kernel found 42 bad values");
  CHECK_STATUS(devbuf_queue_status(queue), DEVBUF_DEVICE_FAILURE);
  CHECK_STATUS(devbuf_event_status(after), DEVBUF_DEVICE_FAILURE);
  CHECK_EQ_U(atomic_load(&kernel_runs), 0);
  // Later work is refused with the original cause; nothing was queued.
  CHECK_STATUS(devbuf_queue_submit(queue, count_runs, NULL, 0, NULL, 0), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("kernel found 42 bad values");
  // The dependent work on the other queue fails too rather than read what the kernel left,
  // and says why: the first queue's failure, its root cause at the end.
  CHECK_STATUS(devbuf_event_wait(waiting, 1, UINT64_MAX), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("waits for failed: queue ");
  CHECK_MESSAGE("kernel found 42 bad values");
  CHECK_STATUS(devbuf_queue_finish(other), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("kernel found 42 bad values");
  CHECK(!devbuf_buffer_in_use(x) && !devbuf_buffer_in_use(y)); // nothing hangs on
  devbuf_buffer_release(x);
  devbuf_buffer_release(y);
  devbuf_event_release(gate);
  devbuf_event_release(after);
  devbuf_event_release(waiting);
  devbuf_queue_release(queue);
  devbuf_queue_release(other);
}

// Work of another queue that reads what a cancelled fill would have written, or waits for an
// event a cancelled queue would have signalled, fails with CANCELLED naming why (it said
// DEVICE_FAILURE, "(CANCELLED)", or that the queue was cancelled, of a queue never
// cancelled), and stops its queue; the cancelled queue stays usable.
static void test_cancel_reaches_dependent_work(void) {
  for (int through_event = 0; through_event < 2; through_event++) {
    devbuf_queue_t *cancelled = NULL, *dependent = NULL;
    devbuf_event_t *gate = NULL, *done = NULL;
    CHECK_OK(devbuf_queue_create(device, &cancelled));
    CHECK_OK(devbuf_queue_create(device, &dependent));
    CHECK_OK(devbuf_event_create(0, &gate));
    CHECK_OK(devbuf_event_create(0, &done));
    devbuf_buffer_t *x = floats(16), *y = floats(16);
    float one = 1.0f;
    CHECK_OK(devbuf_queue_wait(cancelled, gate, 1));
    if (through_event) {
      CHECK_OK(devbuf_queue_signal(cancelled, done, 1));
      CHECK_OK(devbuf_queue_wait(dependent, done, 1));
    } else {
      CHECK_OK(devbuf_queue_fill(cancelled, x, &one, sizeof one));
      CHECK_OK(devbuf_queue_copy(dependent, y, x)); // reads what the fill would write
    }
    CHECK_OK(devbuf_queue_cancel(cancelled));
    CHECK_STATUS(devbuf_queue_finish(dependent), DEVBUF_CANCELLED);
    CHECK_MESSAGE(through_event ? " was cancelled before this signal ran"
                                : "waits for was cancelled before it ran");
    CHECK(!strstr(devbuf_last_error(), "DEVICE_FAILURE"));
    CHECK_OK(devbuf_queue_status(cancelled));
    CHECK_OK(devbuf_queue_fill(cancelled, x, &one, sizeof one));
    CHECK_OK(devbuf_queue_finish(cancelled));
    devbuf_buffer_release(x);
    devbuf_buffer_release(y);
    devbuf_event_release(gate);
    devbuf_event_release(done);
    devbuf_queue_release(cancelled);
    devbuf_queue_release(dependent);
  }
}

// Work that waited for a failed item tells the cause also when the failed item's queue was
// released and is gone by the time the work runs: the item keeps its cause.
static void test_failure_cause_outlives_its_queue(void) {
  devbuf_queue_t *failing = NULL, *later = NULL;
  devbuf_event_t *start = NULL, *hold = NULL;
  CHECK_OK(devbuf_queue_create(device, &failing));
  CHECK_OK(devbuf_queue_create(device, &later));
  CHECK_OK(devbuf_event_create(0, &start));
  CHECK_OK(devbuf_event_create(0, &hold));
  devbuf_buffer_t *x = floats(16), *y = floats(16);
  CHECK_OK(devbuf_queue_wait(failing, start, 1));
  devbuf_use_t use = {x, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(failing, failing_kernel, &use, 1, NULL, 0));
  CHECK_OK(devbuf_queue_wait(later, hold, 1));
  CHECK_OK(submit_axpb(later, y, x, 1, 0)); // depends on the failing write
  CHECK_OK(devbuf_event_signal(start, 1));
  CHECK_STATUS(devbuf_queue_finish(failing), DEVBUF_DEVICE_FAILURE);
  devbuf_queue_release(failing); // drained: gone now
  CHECK_OK(devbuf_event_signal(hold, 1));
  CHECK_STATUS(devbuf_queue_finish(later), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("waits for failed: queue ");
  CHECK_MESSAGE("kernel found 42 bad values");
  devbuf_buffer_release(x);
  devbuf_buffer_release(y);
  devbuf_event_release(start);
  devbuf_event_release(hold);
  devbuf_queue_release(later);
}

// Memory released while a kernel that will fail still uses it is reused by work on another
// queue: that work waits for the kernel (ordering), but the kernel's failure stays with its
// own queue and events. The new buffer is written and its queue goes on.
static void test_reuse_does_not_inherit_failure(void) {
  devbuf_allocator_t *device_allocator = allocator;
  allocator = own_caching_allocator(device);
  devbuf_queue_t *old_queue = NULL, *new_queue = NULL;
  devbuf_event_t *gate = NULL, *old_done = NULL;
  CHECK_OK(devbuf_queue_create(device, &old_queue));
  CHECK_OK(devbuf_queue_create(device, &new_queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_event_create(0, &old_done));
  size_t n = 1024;
  devbuf_buffer_t *old = floats(n), *fresh = NULL;
  uint64_t old_address = 0, new_address = 0;
  CHECK_OK(devbuf_buffer_device_ptr(old, &old_address));
  CHECK_OK(devbuf_queue_wait(old_queue, gate, 1));
  devbuf_use_t use = {old, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(old_queue, failing_kernel, &use, 1, NULL, 0));
  CHECK_OK(devbuf_queue_signal(old_queue, old_done, 1));
  devbuf_buffer_release(old); // in flight
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_FLOAT32, &n, 1, 0, &fresh));
  CHECK_OK(submit_axpb(new_queue, fresh, NULL, 0, 6)); // takes the old memory, after the kernel
  CHECK_OK(devbuf_buffer_device_ptr(fresh, &new_address));
  CHECK(new_address == old_address);
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_STATUS(devbuf_event_wait(old_done, 1, UINT64_MAX), DEVBUF_DEVICE_FAILURE);
  CHECK_STATUS(devbuf_queue_finish(old_queue),
               DEVBUF_DEVICE_FAILURE); // the failure is the old queue's
  CHECK_OK(devbuf_queue_finish(new_queue));
  CHECK_OK(devbuf_queue_status(new_queue));
  CHECK(read_float(fresh, 0) == 6.0f && read_float(fresh, n - 1) == 6.0f);
  CHECK_OK(submit_axpb(new_queue, fresh, NULL, 0, 7)); // the new queue goes on
  CHECK_OK(devbuf_queue_finish(new_queue));
  CHECK(read_float(fresh, 5) == 7.0f);
  devbuf_buffer_release(fresh);
  devbuf_event_release(gate);
  devbuf_event_release(old_done);
  devbuf_queue_release(old_queue);
  devbuf_queue_release(new_queue);
  devbuf_allocator_release(allocator);
  allocator = device_allocator;
}

// Cancel retires the items it drops after the one that is running. Memory released with
// both queued is reused by work of another queue that waits only for the newest item of
// each queue (a dropped one here): that work must not start while the older, running item
// still writes the bytes.
static atomic_bool writer_started, writer_may_end, writer_ended, writer_ended_before_reuse;

static devbuf_status slow_writer(const devbuf_kernel_args_t *args) {
  atomic_store(&writer_started, true);
  while (!atomic_load(&writer_may_end)) nanosleep(&(struct timespec){0, 1000000}, NULL);
  ((float *)args->data[0])[0] = 7.0f;
  atomic_store(&writer_ended, true);
  return DEVBUF_OK;
}

static devbuf_status reuser(const devbuf_kernel_args_t *args) {
  atomic_store(&writer_ended_before_reuse, atomic_load(&writer_ended));
  ((float *)args->data[0])[0] = 9.0f;
  return DEVBUF_OK;
}

static void *cancel_on_thread(void *queue) { return (void *)(intptr_t)devbuf_queue_cancel(queue); }

static void test_cancel_retires_after_the_running_item(void) {
  devbuf_allocator_t *own = own_caching_allocator(device); // which block a request gets is known
  devbuf_queue_t *old_queue = NULL, *new_queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &old_queue));
  CHECK_OK(devbuf_queue_create(device, &new_queue));
  devbuf_event_t *dropped = NULL;
  CHECK_OK(devbuf_event_create(0, &dropped));
  size_t n = 1024;
  devbuf_buffer_t *old = NULL, *fresh = NULL;
  CHECK_OK(devbuf_buffer_allocate(own, DEVBUF_FLOAT32, &n, 1, 0, &old));
  uint64_t old_address = 0, new_address = 0;
  CHECK_OK(devbuf_buffer_device_ptr(old, &old_address));
  devbuf_use_t use = {old, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(old_queue, slow_writer, &use, 1, NULL, 0));
  // Once the writer runs, so that the next two wait in the FIFO, not in the worker's batch.
  while (!atomic_load(&writer_started)) nanosleep(&(struct timespec){0, 100000}, NULL);
  CHECK_OK(submit_axpb(old_queue, old, NULL, 0, 4));    // dropped by the cancel
  CHECK_OK(devbuf_queue_signal(old_queue, dropped, 1)); // dropped too: tells when
  devbuf_buffer_release(old);                           // in flight
  CHECK_OK(devbuf_buffer_new(own, DEVBUF_FLOAT32, &n, 1, 0, &fresh));
  use = (devbuf_use_t){fresh, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(new_queue, reuser, &use, 1, NULL, 0));
  CHECK_OK(devbuf_buffer_device_ptr(fresh, &new_address));
  CHECK(new_address == old_address); // the bytes are reused, after the dropped item only
  pthread_t canceller;
  CHECK(pthread_create(&canceller, NULL, cancel_on_thread, old_queue) == 0);
  CHECK_STATUS(devbuf_event_wait(dropped, 1, 10000000000ull), DEVBUF_CANCELLED);
  // Work let go with the dropped item would run now, long before the writer ends.
  nanosleep(&(struct timespec){0, 50000000}, NULL);
  atomic_store(&writer_may_end, true);
  void *cancelled = NULL;
  pthread_join(canceller, &cancelled);
  CHECK_EQ_U((uintptr_t)cancelled, DEVBUF_OK);
  CHECK_OK(devbuf_queue_finish(new_queue));
  CHECK(atomic_load(&writer_ended_before_reuse));
  CHECK(read_float(fresh, 0) == 9.0f);
  CHECK_OK(devbuf_queue_status(old_queue)); // usable again
  devbuf_buffer_release(fresh);
  devbuf_event_release(dropped);
  devbuf_queue_release(old_queue);
  devbuf_queue_release(new_queue);
  devbuf_allocator_release(own);
}

// Two cancels at once, each holding items it dropped while the same item runs: each waits
// for that item only, not for the other's items, and nothing they dropped runs.
static atomic_int cancels_returned;

static void *cancel_and_say(void *queue_and_event) {
  void **both = queue_and_event;
  devbuf_status status = devbuf_queue_cancel(both[0]);
  if (atomic_fetch_add(&cancels_returned, 1) == 1) devbuf_event_signal(both[1], 1); // the second
  return (void *)(intptr_t)status;
}

static void test_cancels_at_once_hold_no_one_up(void) {
  atomic_store(&writer_started, false);
  atomic_store(&writer_may_end, false);
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_event_t *dropped[2] = {NULL, NULL}, *returned = NULL;
  CHECK_OK(devbuf_event_create(0, &returned));
  devbuf_buffer_t *x = floats(16);
  devbuf_use_t use = {x, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(queue, slow_writer, &use, 1, NULL, 0));
  while (!atomic_load(&writer_started)) nanosleep(&(struct timespec){0, 100000}, NULL);
  int runs_before = atomic_load(&kernel_runs);
  pthread_t cancellers[2];
  void *args[2] = {queue, returned};
  for (int c = 0; c < 2; c++) { // each cancel takes an item and a signal of its own
    CHECK_OK(devbuf_event_create(0, &dropped[c]));
    CHECK_OK(devbuf_queue_submit(queue, count_runs, &use, 1, NULL, 0));
    CHECK_OK(devbuf_queue_signal(queue, dropped[c], 1));
    CHECK(pthread_create(&cancellers[c], NULL, cancel_and_say, args) == 0);
    CHECK_STATUS(devbuf_event_wait(dropped[c], 1, 10000000000ull), DEVBUF_CANCELLED);
  }
  atomic_store(&writer_may_end, true);
  devbuf_status both = devbuf_event_wait(returned, 1, 10000000000ull);
  CHECK_OK(both);                // both returned: no hang
  if (both != DEVBUF_OK) return; // the cancels stay stuck: the test has failed
  for (int c = 0; c < 2; c++) {
    void *status = NULL;
    pthread_join(cancellers[c], &status);
    CHECK_EQ_U((uintptr_t)status, DEVBUF_OK);
    devbuf_event_release(dropped[c]);
  }
  CHECK_EQ_U(atomic_load(&kernel_runs), runs_before);
  CHECK(read_float(x, 0) == 7.0f); // the running item's write, and no other
  CHECK_OK(devbuf_queue_status(queue));
  devbuf_buffer_release(x);
  devbuf_event_release(returned);
  devbuf_queue_release(queue);
}

static void test_destroy_and_cancel_with_pending_work(void) {
  devbuf_event_t *gate = NULL, *done = NULL;
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_event_create(0, &done));
  devbuf_buffer_t *x = floats(64);
  // Released with work pending: the work still runs once the gate opens.
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  CHECK_OK(submit_axpb(queue, x, NULL, 0, 11));
  CHECK_OK(devbuf_queue_signal(queue, done, 1));
  devbuf_queue_release(queue);
  CHECK(devbuf_buffer_in_use(x));
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_event_wait(done, 1, UINT64_MAX));
  CHECK_OK(devbuf_buffer_wait(x));
  CHECK(read_float(x, 63) == 11.0f);
  // Cancelled: the held work never runs, its events fail with CANCELLED, the queue lives on.
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_wait(queue, gate, 2));
  CHECK_OK(submit_axpb(queue, x, NULL, 0, 12));
  CHECK_OK(devbuf_queue_signal(queue, done, 2));
  CHECK_OK(devbuf_queue_cancel(queue));
  CHECK_STATUS(devbuf_event_wait(done, 2, UINT64_MAX), DEVBUF_CANCELLED);
  CHECK(!devbuf_buffer_in_use(x));
  CHECK(read_float(x, 0) == 11.0f);
  CHECK_OK(devbuf_queue_status(queue));
  CHECK_OK(submit_axpb(queue, x, NULL, 0, 13));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK(read_float(x, 0) == 13.0f);
  devbuf_queue_release(queue);
  devbuf_buffer_release(x);
  devbuf_event_release(gate);
  devbuf_event_release(done);
}

typedef struct delayed_signal {
  devbuf_event_t *event;
  uint64_t value;
} delayed_signal;

static void *signal_later(void *arg) {
  const delayed_signal *d = arg;
  usleep(20000);
  devbuf_event_signal(d->event, d->value);
  return NULL;
}

// devbuf_device_synchronize returns once the work of every queue of the device has retired,
// held work included (its counts of submitted and retired items, several queues at once).
static void test_device_synchronize_waits_for_every_queue(void) {
  devbuf_queue_t *queues[2] = {NULL, NULL};
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_event_create(0, &gate));
  devbuf_buffer_t *x = floats(16), *y = floats(16);
  for (int q = 0; q < 2; q++) {
    CHECK_OK(devbuf_queue_create(device, &queues[q]));
    CHECK_OK(devbuf_queue_wait(queues[q], gate, 1));
  }
  for (int i = 0; i < 100; i++) {
    CHECK_OK(submit_axpb(queues[0], x, NULL, 0, (float)i));
    CHECK_OK(submit_axpb(queues[1], y, NULL, 0, (float)(1000 + i)));
  }
  delayed_signal later = {gate, 1};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, signal_later, &later) == 0);
  CHECK_OK(devbuf_device_synchronize(device));
  CHECK(!devbuf_buffer_in_use(x) && !devbuf_buffer_in_use(y));
  CHECK(read_float(x, 15) == 99.0f);
  CHECK(read_float(y, 15) == 1099.0f);
  pthread_join(thread, NULL);
  CHECK_OK(devbuf_device_synchronize(device)); // nothing pending: returns at once
  for (int q = 0; q < 2; q++) devbuf_queue_release(queues[q]);
  devbuf_buffer_release(x);
  devbuf_buffer_release(y);
  devbuf_event_release(gate);
}

// ---- bounded queues ---------------------------------------------------------------------

typedef struct held_submission {
  devbuf_queue_t *queue;
  devbuf_buffer_t *buffer;
  atomic_int state; // 0 submitting, 1 returned OK, 2 returned an error
} held_submission;

static void *submit_one(void *arg) {
  held_submission *s = arg;
  devbuf_status status = submit_axpb(s->queue, s->buffer, NULL, 0, 8);
  atomic_store(&s->state, status == DEVBUF_OK ? 1 : 2);
  return NULL;
}

static devbuf_status submit_to_own_queue(const devbuf_kernel_args_t *args) {
  devbuf_queue_t *queue = *(devbuf_queue_t *const *)args->scalars;
  return devbuf_queue_host_task(queue, count_runs, NULL, 0, NULL, 0);
}

static atomic_long produced, consumed, most_held;
static devbuf_status consume(const devbuf_kernel_args_t *args) {
  (void)args;
  long held = atomic_load(&produced) - atomic_fetch_add(&consumed, 1);
  for (long seen = atomic_load(&most_held); held > seen;)
    if (atomic_compare_exchange_weak(&most_held, &seen, held)) break;
  return DEVBUF_OK;
}

// A full queue holds submissions back until its worker retires items, or refuses them when
// set to; its own kernels and host tasks are refused, never left waiting on themselves.
static void test_bounded_queue(void) {
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  devbuf_buffer_t *buffer = floats(16);
  CHECK_STATUS(devbuf_queue_set_depth(queue, 4, 1u << 5), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_queue_set_depth(NULL, 4, 0), DEVBUF_INVALID_ARGUMENT);

  CHECK_OK(devbuf_queue_set_depth(queue, 4, DEVBUF_QUEUE_FULL_REFUSES));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1)); // held back: 4 items in all
  for (int i = 0; i < 3; i++) CHECK_OK(submit_axpb(queue, buffer, NULL, 0, (float)i));
  CHECK_STATUS(submit_axpb(queue, buffer, NULL, 0, 5), DEVBUF_TIMEOUT);
  CHECK_MESSAGE("is full (4 items submitted and not retired, its depth 4)");
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK(read_float(buffer, 0) == 2.0f);             // the refused item never ran
  CHECK_OK(submit_axpb(queue, buffer, NULL, 0, 6)); // room again

  // Waiting: the fifth submission returns once the gate lets the first items retire.
  CHECK_OK(devbuf_queue_set_depth(queue, 4, 0));
  CHECK_OK(devbuf_queue_wait(queue, gate, 2));
  for (int i = 0; i < 3; i++) CHECK_OK(submit_axpb(queue, buffer, NULL, 0, 7));
  held_submission s = {queue, buffer, 0};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, submit_one, &s) == 0);
  CHECK_STATUS(devbuf_event_wait(gate, 2, 30 * 1000 * 1000), DEVBUF_TIMEOUT); // 30 ms
  CHECK_EQ_U(atomic_load(&s.state), 0);                                       // still waiting
  CHECK_OK(devbuf_event_signal(gate, 2));
  pthread_join(thread, NULL);
  CHECK_EQ_U(atomic_load(&s.state), 1);
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK(read_float(buffer, 0) == 8.0f);

  // A submitter waiting for room goes on once the depth is raised, and is refused once the
  // queue is set to refuse, while nothing retires.
  for (int refuse = 0; refuse < 2; refuse++) {
    CHECK_OK(devbuf_queue_set_depth(queue, 4, 0));
    CHECK_OK(devbuf_queue_wait(queue, gate, 3 + (uint64_t)refuse));
    for (int i = 0; i < 3; i++) CHECK_OK(submit_axpb(queue, buffer, NULL, 0, 7));
    held_submission waiting = {queue, buffer, 0};
    CHECK(pthread_create(&thread, NULL, submit_one, &waiting) == 0);
    CHECK_STATUS(devbuf_event_wait(gate, 3 + (uint64_t)refuse, 30 * 1000 * 1000), DEVBUF_TIMEOUT);
    CHECK_EQ_U(atomic_load(&waiting.state), 0);
    CHECK_OK(
        devbuf_queue_set_depth(queue, refuse ? 4 : 100, refuse ? DEVBUF_QUEUE_FULL_REFUSES : 0));
    for (int ms = 0; ms < 5000 && atomic_load(&waiting.state) == 0; ms++) // the gate stays shut
      devbuf_event_wait(gate, 3 + (uint64_t)refuse, 1000 * 1000);
    CHECK_EQ_U(atomic_load(&waiting.state), (refuse ? 2 : 1));
    CHECK_OK(devbuf_event_signal(gate, 3 + (uint64_t)refuse));
    pthread_join(thread, NULL);
    CHECK_OK(devbuf_queue_finish(queue));
  }

  // The queue's own host task submitting to it when it is full: refused.
  CHECK_OK(devbuf_queue_set_depth(queue, 1, 0));
  atomic_store(&kernel_runs, 0);
  CHECK_OK(devbuf_queue_host_task(queue, submit_to_own_queue, NULL, 0, &queue, sizeof queue));
  CHECK_STATUS(devbuf_queue_finish(queue), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("a submission to its own full queue called from a kernel or host task");
  CHECK_EQ_U(atomic_load(&kernel_runs), 0);
  devbuf_queue_release(queue);

  // A producer far ahead of its worker: never more than the depth queued at once.
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_set_depth(queue, 64, 0));
  atomic_store(&produced, 0);
  atomic_store(&consumed, 0);
  atomic_store(&most_held, 0);
  for (int i = 0; i < 20000; i++) {
    CHECK_OK(devbuf_queue_submit(queue, consume, NULL, 0, NULL, 0));
    atomic_fetch_add(&produced, 1);
  }
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_EQ_U(atomic_load(&consumed), 20000);
  CHECK(atomic_load(&most_held) <= 64);
  devbuf_queue_release(queue);
  devbuf_buffer_release(buffer);
  devbuf_event_release(gate);
}

static void test_submission_errors(void) {
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_buffer_t *x = floats(4), *y = floats(8);
  devbuf_use_t bad_access = {x, (devbuf_access)0};
  CHECK_STATUS(devbuf_queue_submit(queue, count_runs, &bad_access, 1, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  devbuf_use_t no_buffer = {NULL, DEVBUF_ACCESS_READ};
  CHECK_STATUS(devbuf_queue_submit(queue, count_runs, &no_buffer, 1, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_queue_submit(queue, NULL, NULL, 0, NULL, 0), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("the kernel is NULL");
  CHECK_STATUS(devbuf_queue_submit(queue, count_runs, NULL, 2, NULL, 0), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("uses is NULL (2 uses");
  // Counts past what one work item holds, named, before a use or scalar is read.
  CHECK_STATUS(devbuf_queue_submit(queue, count_runs, &no_buffer, (size_t)1 << 40, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("1099511627776 uses");
  CHECK_STATUS(devbuf_queue_host_task(queue, count_runs, NULL, 0, &no_buffer, (size_t)1 << 33),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("8589934592 bytes of scalars");
  CHECK_STATUS(devbuf_queue_copy(queue, x, y), DEVBUF_SIZE_MISMATCH);
  float pattern[3] = {1, 2, 3};
  CHECK_STATUS(devbuf_queue_fill(queue, x, pattern, sizeof pattern), DEVBUF_SIZE_MISMATCH);
  // A pattern as long as the buffer (kept past the item's inline room), then a short one.
  float whole[8] = {8, 7, 6, 5, 4, 3, 2, 1};
  CHECK_OK(devbuf_queue_fill(queue, y, whole, sizeof whole));
  CHECK_OK(devbuf_queue_finish(queue));
  for (size_t i = 0; i < 8; i++) CHECK(read_float(y, i) == whole[i]);
  CHECK_OK(devbuf_queue_fill(queue, y, pattern, 8)); // 1, 2, 1, 2, ...
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK(read_float(y, 6) == 1.0f && read_float(y, 7) == 2.0f);
  devbuf_buffer_t *low = NULL, *high = NULL;
  CHECK_OK(devbuf_buffer_view(y, 0, 24, &low));
  CHECK_OK(devbuf_buffer_view(y, 8, 24, &high));
  CHECK_OK(devbuf_queue_copy(queue, high, low)); // overlapping views: like memmove
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK(read_float(y, 2) == 1.0f && read_float(y, 3) == 2.0f && read_float(y, 7) == 2.0f);
  CHECK_OK(devbuf_queue_status(queue));
  devbuf_buffer_release(low);
  devbuf_buffer_release(high);
  devbuf_buffer_release(x);
  devbuf_buffer_release(y);
  devbuf_queue_release(queue);
}

// Two threads submit to two queues, each item writing the same two buffers, in opposite
// orders: every item must wait for the other queue's earlier ones, no two may wait for
// each other, and no increment may be lost.
static devbuf_status increment_both(const devbuf_kernel_args_t *args) {
  ((float *)args->data[0])[0] += 1;
  ((float *)args->data[1])[0] += 1;
  return DEVBUF_OK;
}

typedef struct submitter_args {
  devbuf_queue_t *queue;
  devbuf_buffer_t *first, *second;
  int items;
  devbuf_status status;
} submitter_args;

static void *submitter(void *arg) {
  submitter_args *a = arg;
  devbuf_use_t uses[2] = {{a->first, DEVBUF_ACCESS_READ_WRITE},
                          {a->second, DEVBUF_ACCESS_READ_WRITE}};
  a->status = DEVBUF_OK;
  for (int i = 0; i < a->items && a->status == DEVBUF_OK; i++)
    a->status = devbuf_queue_submit(a->queue, increment_both, uses, 2, NULL, 0);
  return NULL;
}

static void test_concurrent_submitters(void) {
  devbuf_queue_t *q0 = NULL, *q1 = NULL;
  CHECK_OK(devbuf_queue_create(device, &q0));
  CHECK_OK(devbuf_queue_create(device, &q1));
  devbuf_buffer_t *x = floats(1), *y = floats(1);
  submitter_args a = {q0, x, y, 20000, DEVBUF_OK}, b = {q1, y, x, 20000, DEVBUF_OK};
  pthread_t ta, tb;
  pthread_create(&ta, NULL, submitter, &a);
  pthread_create(&tb, NULL, submitter, &b);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  CHECK_OK(a.status);
  CHECK_OK(b.status);
  CHECK_OK(devbuf_queue_finish(q0));
  CHECK_OK(devbuf_queue_finish(q1));
  CHECK(read_float(x, 0) == 40000.0f);
  CHECK(read_float(y, 0) == 40000.0f);
  devbuf_buffer_release(x);
  devbuf_buffer_release(y);
  devbuf_queue_release(q0);
  devbuf_queue_release(q1);
}

// One batch of work over more buffers than the worker removes tracker by tracker (a queue's
// items held behind a gate, then taken together): kernels over eleven storages, two of them
// views of one, some handles released while their work waits. Every value follows a
// sequential model, no buffer is left in use, and the memory released in flight comes back
// as plain cache once the batch retires.
static void test_batch_over_many_buffers(void) {
  enum { STORAGES = 10, HANDLES = STORAGES + 2, KERNELS = 48, N = 64 };
  devbuf_allocator_t *device_allocator = allocator;
  allocator = own_caching_allocator(device);
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  devbuf_buffer_t *handles[HANDLES] = {NULL};
  for (int h = 0; h < STORAGES; h++) handles[h] = floats(N);
  devbuf_buffer_t *halved = floats(2 * N); // two views: one tracker for both
  CHECK_OK(devbuf_buffer_view(halved, 0, N * 4, &handles[STORAGES]));
  CHECK_OK(devbuf_buffer_view(halved, N * 4, N * 4, &handles[STORAGES + 1]));
  devbuf_buffer_release(halved);
  float model[HANDLES] = {0}; // every element of a handle holds the same value
  bool released[HANDLES] = {false};
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  for (int k = 0; k < KERNELS; k++) {
    int out = (k * 5) % HANDLES, in = (k * 7 + 3) % HANDLES;
    float add = (float)(k % 5 + 1);
    CHECK_OK(submit_axpb(queue, handles[out], in == out ? NULL : handles[in], 1, add));
    model[out] = model[in] + add;
  }
  for (int h = 0; h < HANDLES; h += 4) { // 0, 4, 8 and one of the views
    devbuf_buffer_release(handles[h]);
    released[h] = true;
  }
  CHECK(stats_of(allocator).released_in_flight > 0);
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  for (int h = 0; h < HANDLES; h++) {
    if (released[h]) continue;
    CHECK(!devbuf_buffer_in_use(handles[h]));
    CHECK(read_float(handles[h], 0) == model[h] && read_float(handles[h], N - 1) == model[h]);
  }
  CHECK_EQ_U(stats_of(allocator).released_in_flight, 0);
  for (int h = 0; h < HANDLES; h++)
    if (!released[h]) devbuf_buffer_release(handles[h]);
  devbuf_event_release(gate);
  devbuf_queue_release(queue);
  devbuf_allocator_release(allocator);
  allocator = device_allocator;
}

// Submissions race the worker's sleep: the first one after the worker went idle wakes it,
// the others see that one did (src/exec/submit.c), and devbuf_queue_finish may run the
// queue on the calling thread meanwhile, so that the woken worker finds nothing it may take
// and sleeps again. A wake lost on the way leaves the last signal unrun, and the wait for it
// times out. The pauses only make the worker asleep when work comes (it sleeps at once
// while work comes back later than its spin): every check holds at any timing.
typedef struct finisher_args {
  devbuf_queue_t *queue;
  atomic_bool stop;
  devbuf_status status;
} finisher_args;

static void *keep_finishing(void *arg) {
  finisher_args *a = arg;
  a->status = DEVBUF_OK;
  while (!atomic_load(&a->stop) && a->status == DEVBUF_OK)
    a->status = devbuf_queue_finish(a->queue);
  return NULL;
}

static void test_wakes_are_never_lost(void) {
  enum { QUEUES = 16, FINISHED = 4, BURST = 16, PAUSE_US = 300 };
  bool lost = false;
  for (int q = 0; q < QUEUES && !lost; q++) {
    devbuf_queue_t *queue = NULL;
    devbuf_event_t *done = NULL;
    CHECK_OK(devbuf_queue_create(device, &queue));
    CHECK_OK(devbuf_event_create(0, &done));
    if (!queue || !done) return;
    atomic_store(&kernel_runs, 0);
    for (int i = 0; i < FINISHED; i++) { // the finish may run the task before the worker wakes
      usleep(PAUSE_US);
      CHECK_OK(devbuf_queue_host_task(queue, count_runs, NULL, 0, NULL, 0));
      CHECK_OK(devbuf_queue_finish(queue));
    }
    finisher_args finisher = {queue, false, DEVBUF_OK};
    pthread_t thread;
    bool finishes = q % 2 == 1; // half the queues with a thread finishing all along
    if (finishes) pthread_create(&thread, NULL, keep_finishing, &finisher);
    usleep(PAUSE_US);
    for (int i = 0; i < BURST; i++)
      CHECK_OK(devbuf_queue_host_task(queue, count_runs, NULL, 0, NULL, 0));
    CHECK_OK(devbuf_queue_signal(queue, done, 1));
    devbuf_status reached = devbuf_event_wait(done, 1, 5000000000ull);
    CHECK_OK(reached);
    lost = reached != DEVBUF_OK;
    atomic_store(&finisher.stop, true);
    if (finishes) {
      pthread_join(thread, NULL);
      CHECK_OK(finisher.status);
    }
    CHECK_OK(devbuf_queue_finish(queue));
    CHECK_EQ_U(atomic_load(&kernel_runs), FINISHED + BURST);
    devbuf_event_release(done);
    devbuf_queue_release(queue);
  }
}

// A kernel's scalars are its parameters' struct: aligned as malloc aligns, whatever the
// counts of uses and scalar bytes (pooled items and made-to-size ones), for kernels and
// host tasks alike. The kernel answers which were not.
static atomic_int misaligned;
static devbuf_status check_scalars_alignment(const devbuf_kernel_args_t *args) {
  if ((uintptr_t)args->scalars % _Alignof(max_align_t)) atomic_fetch_add(&misaligned, 1);
  return DEVBUF_OK;
}

static void test_scalars_are_aligned(void) {
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_buffer_t *buffers[6];
  devbuf_use_t uses[6];
  for (int i = 0; i < 6; i++) {
    buffers[i] = floats(4);
    uses[i] = (devbuf_use_t){buffers[i], DEVBUF_ACCESS_READ};
  }
  _Alignas(max_align_t) unsigned char scalars[200] = {0};
  static const size_t sizes[] = {1, 8, 16, 24, 64, 100, 200};
  int submitted = 0;
  for (size_t use_count = 0; use_count <= 6; use_count++)
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      CHECK_OK(
          devbuf_queue_submit(queue, check_scalars_alignment, uses, use_count, scalars, sizes[s]));
      CHECK_OK(devbuf_queue_host_task(queue, check_scalars_alignment, uses, use_count, scalars,
                                      sizes[s]));
      submitted += 2;
    }
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_EQ_U(atomic_load(&misaligned), 0);
  CHECK(submitted == 98);
  for (int i = 0; i < 6; i++) devbuf_buffer_release(buffers[i]);
  devbuf_queue_release(queue);
}

int main(void) {
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) return 1;
  allocator = devbuf_device_allocator(device);
  RUN(test_event_holds_work);
  RUN(test_host_access_rules);
  RUN(test_cross_queue_ordering);
  RUN(test_release_in_flight_and_reuse);
  RUN(test_adaptors_keep_in_flight_reuse);
  RUN(test_in_flight_whole_segment_then_parked);
  RUN(test_failures_carry_their_cause);
  RUN(test_reuse_through_two_owners);
  RUN(test_determinism);
  RUN(test_failure_propagation);
  RUN(test_failure_cause_outlives_its_queue);
  RUN(test_cancel_reaches_dependent_work);
  RUN(test_reuse_does_not_inherit_failure);
  RUN(test_destroy_and_cancel_with_pending_work);
  RUN(test_cancel_retires_after_the_running_item);
  RUN(test_cancels_at_once_hold_no_one_up);
  RUN(test_device_synchronize_waits_for_every_queue);
  RUN(test_submission_errors);
  RUN(test_concurrent_submitters);
  RUN(test_wakes_are_never_lost);
  RUN(test_batch_over_many_buffers);
  RUN(test_bounded_queue);
  RUN(test_scalars_are_aligned);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
