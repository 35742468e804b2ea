// Fault injection (SQLite style): with the Nth, or every Nth, raw allocation failing, a
// randomized workload reports every failure as a status and ends with no leak and
// consistent statistics.
#include "check.h"

typedef struct rig {
  devbuf_device_t *device;
  devbuf_allocator_t *raw, *fault, *caching;
} rig;

static rig rig_open(void) {
  rig r = {0};
  devbuf_allocator_t *backend_raw = NULL;
  CHECK_OK(devbuf_device_open("cpu", &r.device));
  CHECK_OK(devbuf_device_raw_allocator(r.device, &backend_raw));
  CHECK_OK(devbuf_stats_adaptor_create(backend_raw, &r.raw));
  CHECK_OK(devbuf_fault_adaptor_create(r.raw, 0, DEVBUF_FAULT_ONCE, &r.fault));
  devbuf_caching_options_t options = {.cache_limit = 256 * 1024}; // keep evicting: more raw calls
  CHECK_OK(devbuf_caching_allocator_create(r.fault, &options, &r.caching));
  devbuf_allocator_release(backend_raw);
  return r;
}

static void rig_close(rig *r) {
  devbuf_allocator_release(r->caching);
  devbuf_allocator_release(r->fault);
  devbuf_allocator_release(r->raw);
  devbuf_device_release(r->device);
}

static uint64_t next_random(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

// A workload of buffers, views and copies. Returns the number of failures it saw; each
// must be INJECTED_FAULT with a message, and every buffer that exists holds right bytes.
static int workload(rig *r, uint64_t seed, int steps) {
  devbuf_buffer_t *held[16] = {0};
  enum { MOST = 3 << 20 };
  unsigned char *scratch = malloc(MOST);
  int failures = 0;
  for (int step = 0; step < steps; step++) {
    int slot = (int)(next_random(&seed) % 16);
    // Mostly small blocks, which share segments; some large ones, which take their own.
    size_t size = 1 + next_random(&seed) % (next_random(&seed) % 4 == 0 ? MOST : 70000);
    devbuf_status status = DEVBUF_OK;
    switch (next_random(&seed) % 5) {
    case 0: {
      devbuf_buffer_t *buffer = NULL;
      status = devbuf_buffer_allocate(r->caching, DEVBUF_UINT8, &size, 1, 0, &buffer);
      if (status == DEVBUF_OK) {
        devbuf_buffer_release(held[slot]);
        held[slot] = buffer;
        memset(scratch, (int)size & 0xff, size);
        CHECK_OK(devbuf_buffer_copyin(buffer, scratch, size));
      } else {
        CHECK(buffer == NULL);
      }
      break;
    }
    case 1:
      devbuf_buffer_release(held[slot]);
      held[slot] = NULL;
      break;
    case 2: { // a lazy copy: its allocation may fail inside copy_from
      if (!held[slot]) break;
      size_t n = devbuf_buffer_size(held[slot]);
      devbuf_buffer_t *copy = NULL;
      CHECK_OK(devbuf_buffer_new(r->caching, DEVBUF_UINT8, &n, 1, 0, &copy));
      status = devbuf_buffer_copy_from(copy, held[slot]);
      CHECK(devbuf_buffer_is_allocated(copy) == (status == DEVBUF_OK));
      devbuf_buffer_release(copy);
      break;
    }
    case 3: // idle segments go back, so that upstream is asked again
      devbuf_allocator_clear_cache(r->caching);
      break;
    default: { // check the bytes of a held buffer
      if (!held[slot]) break;
      size_t n = devbuf_buffer_size(held[slot]);
      CHECK_OK(devbuf_buffer_copyout(held[slot], scratch, n));
      CHECK(scratch[0] == (unsigned char)(n & 0xff) && scratch[n - 1] == (unsigned char)(n & 0xff));
      break;
    }
    }
    if (status != DEVBUF_OK) {
      failures++;
      CHECK(status == DEVBUF_INJECTED_FAULT);
      CHECK_MESSAGE("injected fault");
    }
  }
  for (int i = 0; i < 16; i++) devbuf_buffer_release(held[i]);
  free(scratch);
  return failures;
}

static void check_balanced(rig *r, int failures) {
  devbuf_allocator_stats_t s = stats_of(r->caching), raw = stats_of(r->raw);
  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.live_buffers, 0);
  CHECK_EQ_U(s.failed_allocs, (uint64_t)failures);
  CHECK_EQ_U(s.failed_allocs, devbuf_fault_adaptor_fired(r->fault));
  CHECK_EQ_U(s.cached, raw.active);
  devbuf_allocator_clear_cache(r->caching);
  CHECK_EQ_U(stats_of(r->raw).active, 0);
  CHECK_EQ_U(stats_of(r->raw).live_buffers, 0);
}

static void test_every_nth_fails(void) {
  const uint64_t periods[] = {2, 3, 5, 7, 11, 13};
  for (size_t i = 0; i < sizeof periods / sizeof periods[0]; i++) {
    rig r = rig_open();
    CHECK_OK(devbuf_fault_adaptor_arm(r.fault, periods[i], DEVBUF_FAULT_EVERY));
    int failures = workload(&r, 0x1234567 + i, 3000);
    CHECK(failures > 0);
    check_balanced(&r, failures);
    rig_close(&r);
  }
}

// SQLite's loop: fail call 1, then 2, ... until a run completes without the fault firing.
static void test_nth_fails_until_none(void) {
  for (uint64_t n = 1;; n++) {
    rig r = rig_open();
    CHECK_OK(
        devbuf_fault_adaptor_arm(r.fault, n, n % 2 ? DEVBUF_FAULT_ONCE : DEVBUF_FAULT_PERSISTENT));
    int failures = workload(&r, 42, 400);
    uint64_t fired = devbuf_fault_adaptor_fired(r.fault);
    check_balanced(&r, failures);
    rig_close(&r);
    if (fired == 0) break;
    if (n > 10000) {
      CHECK(!"the fault kept firing");
      break;
    }
  }
}

// A real training step replayed with every Nth segment allocation failing: each fault is one
// refused request (the replay goes on), nothing leaks, and once the faults stop the same
// replay is refused nothing.
static void test_trace_replay_under_faults(void) {
  const char *trace = test_data("traces/bcrafton-assignment2-systems/memory_snapshot.trace");
  const uint64_t periods[] = {1, 2, 3, 7, 25};
  for (size_t i = 0; i < sizeof periods / sizeof periods[0]; i++) {
    rig r = rig_open();
    CHECK_OK(devbuf_fault_adaptor_arm(r.fault, periods[i], DEVBUF_FAULT_EVERY));
    devbuf_trace_summary_t summary;
    CHECK_OK(devbuf_trace_replay(trace, r.caching, &summary));
    uint64_t fired = devbuf_fault_adaptor_fired(r.fault);
    CHECK(fired > 0);
    CHECK_EQ_U(summary.failed_allocs, fired);
    check_balanced(&r, (int)fired);
    CHECK_OK(devbuf_fault_adaptor_arm(r.fault, 0, DEVBUF_FAULT_ONCE));
    CHECK_OK(devbuf_trace_replay(trace, r.caching, &summary));
    CHECK_EQ_U(summary.failed_allocs, 0);
    CHECK_EQ_U(stats_of(r.caching).active, 0);
    devbuf_allocator_clear_cache(r.caching);
    CHECK_EQ_U(stats_of(r.raw).active, 0);
    rig_close(&r);
  }
}

// The same with growable segments: each fault is a refused mapping, nothing stays mapped.
static void test_growable_replay_under_faults(void) {
  const char *trace = test_data("traces/bcrafton-assignment2-systems/memory_snapshot.trace");
  devbuf_device_t *device = NULL;
  devbuf_allocator_t *raw = NULL, *fault = NULL, *caching = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  CHECK_OK(devbuf_fault_adaptor_create(raw, 0, DEVBUF_FAULT_ONCE, &fault));
  devbuf_caching_options_t options = {.growable = 1};
  CHECK_OK(devbuf_caching_allocator_create(fault, &options, &caching));
  const uint64_t periods[] = {1, 2, 5, 31};
  for (size_t i = 0; i < sizeof periods / sizeof periods[0]; i++) {
    CHECK_OK(devbuf_fault_adaptor_arm(fault, periods[i], DEVBUF_FAULT_EVERY));
    uint64_t fired_before = devbuf_fault_adaptor_fired(fault); // counted over the adaptor's life
    devbuf_trace_summary_t summary;
    CHECK_OK(devbuf_trace_replay(trace, caching, &summary));
    uint64_t fired = devbuf_fault_adaptor_fired(fault) - fired_before;
    CHECK(fired > 0);
    CHECK_EQ_U(summary.failed_allocs, fired);
    CHECK_EQ_U(stats_of(caching).active, 0);
    CHECK_OK(devbuf_fault_adaptor_arm(fault, 0, DEVBUF_FAULT_ONCE));
    CHECK_OK(devbuf_trace_replay(trace, caching, &summary));
    CHECK_EQ_U(summary.failed_allocs, 0);
    devbuf_allocator_clear_cache(caching);
    CHECK_EQ_U(stats_of(caching).reserved, 0);
  }
  devbuf_allocator_release(caching);
  devbuf_allocator_release(fault);
  devbuf_allocator_release(raw);
  devbuf_device_release(device);
}

int main(void) {
  test_require_data();
  RUN(test_every_nth_fails);
  RUN(test_nth_fails_until_none);
  RUN(test_trace_replay_under_faults);
  RUN(test_growable_replay_under_faults);
  return CHECK_EXIT();
}
