// The caching allocator: the statistics morok-device's and nuvec-gpu's `Buffer` report,
// rounding, lazy allocation, the buffer-count limit; user allocators; the statistics, trace
// and fault adaptors (segments: test_segments.c).
#include "check.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static size_t page;

static devbuf_buffer_t *bytes_buffer(devbuf_allocator_t *allocator, size_t size) {
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &buffer));
  return buffer;
}

#define SMALL_SEGMENT ((size_t)2 << 20)

static void test_steady_state(void) {
  test_allocators t = test_allocators_open(NULL);
  for (int i = 0; i < 10000; i++) devbuf_buffer_release(bytes_buffer(t.caching, 4096));
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.system_allocs, 1);
  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.cached, SMALL_SEGMENT); // the small segment that served it
  CHECK_EQ_U(s.reserved, SMALL_SEGMENT);
  CHECK_EQ_U(s.segments, 1);
  CHECK_EQ_U(s.cache_hits, 9999);
  CHECK_EQ_U(s.live_buffers, 0);
  CHECK_EQ_U(stats_of(t.raw).system_allocs, 1); // the raw allocator saw one call, too
  test_allocators_close(&t);
}

// A loop that fits under a memory limit with less room left than a page: its small request
// takes a free block of the large pool, not an idle segment given back and made again on
// every pass (the room was compared with the request's bytes, not a segment's pages).
static void loop_of_three(devbuf_allocator_t *allocator, bool then_small) {
  devbuf_memory_t x, y, z, w;
  CHECK_OK(devbuf_allocator_alloc(allocator, 24u << 20, &x));
  CHECK_OK(devbuf_allocator_alloc(allocator, 24u << 20, &y));
  CHECK_OK(devbuf_allocator_alloc(allocator, (1u << 20) + 1, &z));
  devbuf_allocator_free(allocator, &y);
  devbuf_allocator_free(allocator, &z);
  devbuf_allocator_free(allocator, &x);
  if (!then_small) return;
  CHECK_OK(devbuf_allocator_alloc(allocator, 256, &w));
  devbuf_allocator_free(allocator, &w);
}

static void test_no_churn_with_less_than_a_page_of_room(void) {
  devbuf_caching_options_t options = {.memory_limit = (uint64_t)1 << 40}; // no burst
  test_allocators measure = test_allocators_open(&options);
  loop_of_three(measure.caching, false);
  uint64_t needed = stats_of(measure.caching).reserved;
  test_allocators_close(&measure);
  options.memory_limit = needed + 3276;
  test_allocators t = test_allocators_open(&options);
  loop_of_three(t.caching, true);
  devbuf_allocator_stats_t first = stats_of(t.caching);
  for (int pass = 0; pass < 3; pass++) loop_of_three(t.caching, true);
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(first.system_frees, 0);
  CHECK_EQ_U(s.system_allocs, first.system_allocs);
  CHECK_EQ_U(s.system_frees, 0);
  test_allocators_close(&t);
}

// largest_free_block is a request the cache serves with no system call: not the small pool's
// 2 MiB block (a request over 1 MiB goes to the large pool), not bytes released in flight,
// not a growable block's unmapped pages nor mapped pieces apart.
static void serves_largest_without_the_system(devbuf_allocator_t *allocator) {
  devbuf_allocator_stats_t before = stats_of(allocator);
  CHECK(before.largest_free_block > 0);
  devbuf_memory_t memory;
  CHECK_OK(devbuf_allocator_alloc(allocator, before.largest_free_block, &memory));
  CHECK_EQ_U(stats_of(allocator).system_allocs, before.system_allocs);
  devbuf_allocator_free(allocator, &memory);
}

// A caching allocator with growable segments over the CPU's raw allocator (a statistics
// adaptor cannot map memory into reserved addresses).
typedef struct growable_allocators {
  devbuf_device_t *device;
  devbuf_allocator_t *raw, *caching;
} growable_allocators;

static growable_allocators growable_open(void) {
  growable_allocators g = {0};
  devbuf_caching_options_t growable = {.growable = 1};
  CHECK_OK(devbuf_device_open("cpu", &g.device));
  CHECK_OK(devbuf_device_raw_allocator(g.device, &g.raw));
  CHECK_OK(devbuf_caching_allocator_create(g.raw, &growable, &g.caching));
  return g;
}

static void growable_close(growable_allocators *g) {
  devbuf_allocator_release(g->caching);
  devbuf_allocator_release(g->raw);
  devbuf_device_release(g->device);
}

static devbuf_status nothing(const devbuf_kernel_args_t *args) {
  (void)args;
  return DEVBUF_OK;
}

static void test_largest_free_block(void) {
  test_allocators t = test_allocators_open(NULL);
  devbuf_memory_t memory, pieces[4];
  CHECK_OK(devbuf_allocator_alloc(t.caching, 768 << 10, &memory));
  devbuf_allocator_free(t.caching, &memory); // an idle small segment of 2 MiB
  CHECK_EQ_U(stats_of(t.caching).largest_free_block, 1 << 20);
  serves_largest_without_the_system(t.caching);
  // A block that is its whole segment waits parked in its thread, out of the pools (it read
  // 0, or here the small pool's 1 MiB).
  CHECK_OK(devbuf_allocator_alloc(t.caching, 30 << 20, &memory));
  devbuf_allocator_free(t.caching, &memory);
  CHECK_EQ_U(stats_of(t.caching).largest_free_block, 30 << 20);
  serves_largest_without_the_system(t.caching);
  devbuf_allocator_clear_cache(t.caching);
  // 1.5 MiB of a 20 MiB segment released while work waits to use it.
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_queue_create(t.device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  devbuf_buffer_t *held = bytes_buffer(t.caching, 1536 << 10);
  devbuf_use_t use = {held, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(queue, nothing, &use, 1, NULL, 0));
  devbuf_buffer_release(held);
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.released_in_flight, 1536 << 10);
  CHECK_EQ_U(s.largest_free_block, (20 << 20) - (1536 << 10));
  serves_largest_without_the_system(t.caching);
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  devbuf_queue_release(queue);
  devbuf_event_release(gate);
  test_allocators_close(&t);
  // Growable: free, unmapped, free pages in one free block.
  growable_allocators g = growable_open();
  devbuf_allocator_t *growing = g.caching;
  for (int i = 0; i < 4; i++) CHECK_OK(devbuf_allocator_alloc(growing, 65536, &pieces[i]));
  devbuf_allocator_free(growing, &pieces[1]);
  devbuf_allocator_clear_cache(growing); // its pages go: a hole
  devbuf_allocator_free(growing, &pieces[0]);
  devbuf_allocator_free(growing, &pieces[2]);
  CHECK_EQ_U(stats_of(growing).largest_free_block, 65536);
  serves_largest_without_the_system(growing);
  devbuf_allocator_free(growing, &pieces[3]);
  // Growable and in flight: the mapped stretch a host request could take has no byte in
  // flight (the two longest runs, taken apart, promised all 2 MiB).
  devbuf_allocator_clear_cache(growing);
  CHECK_OK(devbuf_queue_create(g.device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  held = bytes_buffer(growing, 2 << 20);
  use = (devbuf_use_t){held, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(queue, nothing, &use, 1, NULL, 0));
  devbuf_buffer_release(held);
  s = stats_of(growing);
  CHECK_EQ_U(s.released_in_flight, 2 << 20);
  CHECK(s.largest_free_block < s.reserved - s.released_in_flight + 1);
  if (s.largest_free_block) serves_largest_without_the_system(growing);
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  devbuf_queue_release(queue);
  devbuf_event_release(gate);
  // Growable: a free block whose first pages went back (while the work of the bytes after
  // them ran) and whose mapped stretch comes after. A request goes to the block's start
  // (where it keeps the most of the block in one piece) and maps pages there: nothing is
  // served without the system.
  devbuf_allocator_clear_cache(growing);
  devbuf_buffer_t *first = bytes_buffer(growing, 16384), *middle = bytes_buffer(growing, 16384),
                  *last = bytes_buffer(growing, 16384);
  CHECK_OK(devbuf_queue_create(g.device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  use = (devbuf_use_t){middle, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(queue, nothing, &use, 1, NULL, 0));
  devbuf_buffer_release(middle); // in flight: its pages stay
  devbuf_buffer_release(first);
  devbuf_allocator_clear_cache(growing); // the first block's pages go
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_EQ_U(stats_of(growing).largest_free_block, 0);
  devbuf_allocator_stats_t before = stats_of(growing);
  CHECK_OK(devbuf_allocator_alloc(growing, 16384, &memory));
  CHECK(stats_of(growing).system_allocs > before.system_allocs);
  devbuf_allocator_free(growing, &memory);
  devbuf_buffer_release(last);
  devbuf_queue_release(queue);
  devbuf_event_release(gate);
  // Growable and in flight: a free block of 1 MiB, 768 KiB of it in flight, then a mapped
  // free block of 1.5 MiB. A request of 1 MiB finds no room in the first and takes the
  // second: served with no system call.
  devbuf_allocator_clear_cache(growing);
  CHECK_OK(devbuf_queue_create(g.device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  size_t sizes[6] = {768 << 10, 256 << 10, 64 << 10, 1 << 20, 512 << 10, 64 << 10};
  devbuf_buffer_t *parts[6];
  for (int i = 0; i < 6; i++) parts[i] = bytes_buffer(growing, sizes[i]);
  use = (devbuf_use_t){parts[0], DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(queue, nothing, &use, 1, NULL, 0));
  for (int i = 0; i < 6; i++)
    if (i != 2 && i != 5) devbuf_buffer_release(parts[i]); // the first in flight
  CHECK_EQ_U(stats_of(growing).largest_free_block, 1 << 20);
  serves_largest_without_the_system(growing);
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  devbuf_buffer_release(parts[2]);
  devbuf_buffer_release(parts[5]);
  devbuf_queue_release(queue);
  devbuf_event_release(gate);
  growable_close(&g);
  // A large segment's free tail under the small pool's top serves no request: a request
  // of its size goes to the small pool, which has no segment yet.
  t = test_allocators_open(NULL);
  CHECK_OK(devbuf_allocator_alloc(t.caching, (11 << 20) + 512, &memory));
  CHECK_EQ_U(stats_of(t.caching).largest_free_block, 0);
  devbuf_allocator_free(t.caching, &memory);
  test_allocators_close(&t);
}

// Bytes released in flight again and again while the work that uses them waits (each new
// owner's work ordered after the last): released_in_flight counts them once, as part of
// what is cached.
static void test_released_in_flight_counted_once(void) {
  test_allocators t = test_allocators_open(NULL);
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_queue_create(t.device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  size_t size = 300000;
  uint64_t first_place = 0;
  for (int i = 0; i < 8; i++) {
    devbuf_buffer_t *buffer = NULL;
    CHECK_OK(devbuf_buffer_new(t.caching, DEVBUF_UINT8, &size, 1, 0, &buffer));
    devbuf_use_t use = {buffer, DEVBUF_ACCESS_WRITE};
    CHECK_OK(devbuf_queue_submit(queue, nothing, &use, 1, NULL, 0)); // allocates, ordered
    uint64_t place = 0;
    CHECK_OK(devbuf_buffer_device_ptr(buffer, &place));
    if (i == 0) first_place = place;
    CHECK(place == first_place); // the same bytes each time
    devbuf_buffer_release(buffer);
    devbuf_allocator_stats_t s = stats_of(t.caching);
    CHECK_EQ_U(s.released_in_flight, 300032);
    CHECK(s.released_in_flight <= s.cached);
  }
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_EQ_U(stats_of(t.caching).released_in_flight, 0);
  devbuf_queue_release(queue);
  devbuf_event_release(gate);
  test_allocators_close(&t);
}

// Small requests round to 512 bytes (whole pages from one page to 16) and share one small
// segment: every figure follows.
static void test_exact_stats(void) {
  test_allocators t = test_allocators_open(NULL);
  devbuf_buffer_t *small = bytes_buffer(t.caching, 1000);
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.active, 1024);
  CHECK_EQ_U(s.peak, 1024);
  CHECK_EQ_U(s.live_buffers, 1);
  CHECK_EQ_U(s.reserved, SMALL_SEGMENT);
  devbuf_buffer_t *large = bytes_buffer(t.caching, page + 1);
  s = stats_of(t.caching);
  CHECK_EQ_U(s.active, 1024 + 2 * page);
  CHECK_EQ_U(s.peak, 1024 + 2 * page);
  CHECK_EQ_U(s.system_allocs, 1); // the same segment
  CHECK_EQ_U(s.cached, SMALL_SEGMENT - 1024 - 2 * page);
  devbuf_buffer_release(large);
  s = stats_of(t.caching);
  CHECK_EQ_U(s.active, 1024);
  CHECK_EQ_U(s.cached, SMALL_SEGMENT - 1024);
  CHECK_EQ_U(s.peak, 1024 + 2 * page);
  CHECK(s.fragmentation > 0.99 && s.fragmentation < 1.0);
  devbuf_allocator_reset_peak(t.caching);
  CHECK_EQ_U(stats_of(t.caching).peak, 1024);
  devbuf_buffer_release(small);
  s = stats_of(t.caching);
  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.cached, SMALL_SEGMENT);
  CHECK_EQ_U(s.live_buffers, 0);
  devbuf_allocator_clear_cache(t.caching);
  s = stats_of(t.caching);
  CHECK_EQ_U(s.cached, 0);
  CHECK_EQ_U(s.reserved, 0);
  CHECK_EQ_U(s.segments, 0);
  CHECK_EQ_U(s.system_frees, 1);
  CHECK(s.fragmentation == 0.0);
  CHECK_EQ_U(stats_of(t.raw).active, 0); // everything went back to the system
  test_allocators_close(&t);
}

static void test_lazy_allocation(void) {
  test_allocators t = test_allocators_open(NULL);
  size_t shape[] = {10, 10};
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_buffer_new(t.caching, DEVBUF_FLOAT32, shape, 2, 0, &buffer));
  CHECK(!devbuf_buffer_is_allocated(buffer));
  CHECK_EQ_U(stats_of(t.caching).alloc_calls, 0);
  CHECK_OK(devbuf_buffer_ensure_allocated(buffer));
  CHECK(devbuf_buffer_is_allocated(buffer));
  CHECK_OK(devbuf_buffer_ensure_allocated(buffer));
  CHECK_EQ_U(stats_of(t.caching).alloc_calls, 1);
  CHECK_EQ_U(stats_of(t.caching).active, 512);
  devbuf_buffer_release(buffer);
  test_allocators_close(&t);
}

static void test_buffer_count_limit(void) {
  devbuf_caching_options_t options = {.max_buffers = 3};
  test_allocators t = test_allocators_open(&options);
  devbuf_buffer_t *buffers[3];
  for (int i = 0; i < 3; i++) buffers[i] = bytes_buffer(t.caching, 64);
  devbuf_buffer_t *extra = NULL;
  size_t size = 64;
  CHECK_STATUS(devbuf_buffer_allocate(t.caching, DEVBUF_UINT8, &size, 1, 0, &extra),
               DEVBUF_OUT_OF_MEMORY);
  CHECK_MESSAGE("3 buffers live and a buffer-count limit of 3");
  CHECK(extra == NULL);
  devbuf_buffer_release(buffers[0]);
  buffers[0] = bytes_buffer(t.caching, 64);
  CHECK_EQ_U(stats_of(t.caching).live_buffers, 3);
  for (int i = 0; i < 3; i++) devbuf_buffer_release(buffers[i]);
  CHECK_EQ_U(stats_of(t.caching).live_buffers, 0);
  test_allocators_close(&t);
}

static void test_page_size_option(void) {
  devbuf_caching_options_t options = {.page_size = 2u << 20};
  test_allocators t = test_allocators_open(&options);
  devbuf_memory_t big, small;
  CHECK_OK(devbuf_allocator_alloc(t.caching, 30000000, &big)); // a segment of its own, whole pages
  CHECK_EQ_U(big.size, 30000128);
  CHECK_EQ_U(stats_of(t.caching).reserved, 15u << 21);
  CHECK_OK(devbuf_allocator_alloc(t.caching, 5000, &small)); // 512-byte granules below the page
  CHECK_EQ_U(small.size, 5120);
  devbuf_allocator_free(t.caching, &big);
  devbuf_allocator_free(t.caching, &small);
  devbuf_allocator_t *caching = NULL;
  const uint64_t bad[] = {1000, 2048, (uint64_t)3 << 20, (uint64_t)1 << 31};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    options.page_size = bad[i];
    CHECK_STATUS(devbuf_caching_allocator_create(t.raw, &options, &caching),
                 DEVBUF_INVALID_ARGUMENT);
    CHECK_MESSAGE("page_size");
  }
  CHECK(caching == NULL);
  test_allocators_close(&t);
}

// Sizes around every bin and power of two, on every page size: each request gets at least
// its bytes, and blocks alive at once never overlap, whatever the bins held before (a
// 64 KiB request on 2 MiB pages once took a released 32 KiB block from its bin).
static int by_address(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const devbuf_memory_t *)a)->host,
            y = (uintptr_t)((const devbuf_memory_t *)b)->host;
  return (x > y) - (x < y);
}

static void test_sizes_near_every_bin(void) {
  static const uint64_t pages[] = {4096, 8192, 16384, 32768, 65536, 2u << 20};
  size_t sizes[128], count = 0;
  for (unsigned k = 9; k <= 21; k++)
    for (int d = -1; d <= 1; d++) sizes[count++] = ((size_t)1 << k) + (size_t)(ptrdiff_t)d;
  for (size_t c = 3; c <= 96; c += 31) sizes[count++] = c * 512 + 1; // between classes
  test_allocators t = test_allocators_open(NULL);
  for (size_t p = 0; p < sizeof pages / sizeof *pages; p++) {
    devbuf_caching_options_t options = {.page_size = pages[p]};
    devbuf_allocator_t *caching = NULL;
    CHECK_OK(devbuf_caching_allocator_create(t.raw, &options, &caching));
    if (!caching) continue;
    devbuf_memory_t live[128];
    for (int round = 0; round < 3; round++) { // the bins hold every size after the first
      for (size_t i = 0; i < count; i++) {
        size_t want = sizes[round == 1 ? count - 1 - i : i];
        CHECK_OK(devbuf_allocator_alloc(caching, want, &live[i]));
        CHECK(live[i].size >= want);
        unsigned char *bytes = live[i].host;
        bytes[0] = 1;
        bytes[want - 1] = 2;
      }
      devbuf_memory_t sorted[128];
      memcpy(sorted, live, count * sizeof *live);
      qsort(sorted, count, sizeof *sorted, by_address);
      size_t overlaps = 0;
      for (size_t i = 1; i < count; i++)
        overlaps += (char *)sorted[i - 1].host + sorted[i - 1].size > (char *)sorted[i].host;
      if (overlaps)
        fprintf(stderr, "  page %llu: %zu overlaps\n", (unsigned long long)pages[p], overlaps);
      CHECK_EQ_U(overlaps, 0);
      for (size_t i = 0; i < count; i++) devbuf_allocator_free(caching, &live[i]);
    }
    CHECK_EQ_U(stats_of(caching).live_buffers, 0);
    devbuf_allocator_release(caching);
  }
  test_allocators_close(&t);
}

// A thread's later key destructor allocates and frees after devbuf's own destructor gave the
// thread's bins back: the block must not stay in a cache nobody owns, where clear_cache
// cannot reach it.
static pthread_key_t late_key;
static devbuf_allocator_t *late_allocator;
static devbuf_memory_t late_block;

static void free_late(void *unused) {
  (void)unused;
  devbuf_allocator_free(late_allocator, &late_block);
  devbuf_memory_t again; // an allocation adopts a cache for the thread once more
  if (devbuf_allocator_alloc(late_allocator, 4096, &again) == DEVBUF_OK)
    devbuf_allocator_free(late_allocator, &again);
}

static void *allocate_then_exit(void *unused) {
  (void)unused;
  if (devbuf_allocator_alloc(late_allocator, 4096, &late_block) == DEVBUF_OK)
    pthread_setspecific(late_key, &late_block); // its destructor runs after devbuf's
  return NULL;
}

static void test_block_freed_by_a_later_destructor(void) {
  test_allocators t = test_allocators_open(NULL);
  late_allocator = t.caching;
  devbuf_memory_t first;
  CHECK_OK(devbuf_allocator_alloc(t.caching, 256, &first)); // devbuf's key exists before ours
  devbuf_allocator_free(t.caching, &first);
  CHECK(pthread_key_create(&late_key, free_late) == 0);
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, allocate_then_exit, NULL) == 0);
  pthread_join(thread, NULL);
  devbuf_allocator_clear_cache(t.caching);
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.live_buffers, 0);
  CHECK_EQ_U(s.reserved, 0); // nothing stranded in an exited thread's bins
  pthread_key_delete(late_key);
  test_allocators_close(&t);
}

// A block freed twice after its record went (merged into a neighbour, or with its segment
// given back by clear_cache) and was taken again for other bytes: the second free read freed
// memory (ASan: heap-use-after-free) or freed the other, live block, whose bytes the next
// request of its size then got as well.
static void test_double_free_after_the_record_went(void) {
  test_allocators t = test_allocators_open(NULL);
  for (int round = 0; round < 2; round++) {
    devbuf_memory_t a, b, c, d, e;
    CHECK_OK(devbuf_allocator_alloc(t.caching, 3 << 20, &a));
    CHECK_OK(devbuf_allocator_alloc(t.caching, 3 << 20, &b)); // after a, in a's segment
    devbuf_allocator_free(t.caching, &a);
    devbuf_allocator_free(t.caching, &b); // merges into a's block: b's record goes
    if (round == 1) devbuf_allocator_clear_cache(t.caching);  // and then a's, with the segment
    CHECK_OK(devbuf_allocator_alloc(t.caching, 5 << 20, &c)); // records taken again
    CHECK_OK(devbuf_allocator_alloc(t.caching, 1 << 20, &d));
    devbuf_set_error(DEVBUF_OK, "%s", "none");
    devbuf_allocator_free(t.caching, &b);
    CHECK_MESSAGE("freed already");
    devbuf_set_error(DEVBUF_OK, "%s", "none");
    devbuf_allocator_free(t.caching, &a);
    CHECK_MESSAGE("freed already");
    CHECK_EQ_U(stats_of(t.caching).live_buffers, 2);
    CHECK_OK(devbuf_allocator_alloc(t.caching, 5 << 20, &e));
    CHECK(e.host != c.host);
    devbuf_allocator_free(t.caching, &e);
    devbuf_allocator_free(t.caching, &c);
    devbuf_allocator_free(t.caching, &d);
    CHECK_EQ_U(stats_of(t.caching).live_buffers, 0);
  }
  test_allocators_close(&t);
}

// Creates the file `path` names (a mkstemp template), empty, for a trace to go to.
static void make_temp_file(char *path) {
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
}
// A block freed twice, and a record never handed out, are left alone with an error: the bins
// stay sound (a second free once put a binned block on its own bin, and every later request
// got that one block).
static void test_double_free_is_refused(void) {
  test_allocators t = test_allocators_open(NULL);
  const size_t sizes[] = {256, 4096, 1 << 20, 16 << 20}; // binned, and through the pools
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    devbuf_memory_t a, b, c;
    CHECK_OK(devbuf_allocator_alloc(t.caching, sizes[i], &a));
    devbuf_allocator_free(t.caching, &a);
    devbuf_set_error(DEVBUF_OK, "%s", "none");
    devbuf_allocator_free(t.caching, &a);
    CHECK_MESSAGE("freed already");
    CHECK_OK(devbuf_allocator_alloc(t.caching, sizes[i], &b));
    CHECK_OK(devbuf_allocator_alloc(t.caching, sizes[i], &c));
    CHECK(b.host != c.host);
    devbuf_allocator_free(t.caching, &b);
    devbuf_allocator_free(t.caching, &c);
  }
  devbuf_memory_t never = {0};
  devbuf_allocator_free(t.caching, &never);
  CHECK_MESSAGE("not handed out");
  CHECK_EQ_U(stats_of(t.caching).live_buffers, 0);
  // Through a statistics adaptor: refused before the adaptor counts it (its counters wrapped).
  devbuf_allocator_t *counted = NULL;
  CHECK_OK(devbuf_stats_adaptor_create(t.caching, &counted));
  devbuf_memory_t d;
  CHECK_OK(devbuf_allocator_alloc(counted, 1000, &d));
  devbuf_allocator_free(counted, &d);
  devbuf_allocator_free(counted, &d);
  CHECK_MESSAGE("freed already");
  devbuf_allocator_stats_t s = stats_of(counted);
  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.live_buffers, 0);
  CHECK_EQ_U(s.system_frees, 1);
  devbuf_allocator_release(counted);
  // Through a trace adaptor over memory that keeps no record of its own (the raw allocator):
  // the adaptor's record of the first free was gone when the second read it.
  char path[] = "/tmp/devbuf-trace-XXXXXX";
  make_temp_file(path);
  devbuf_allocator_t *traced = NULL;
  CHECK_OK(devbuf_trace_adaptor_create(t.raw, path, &traced));
  uint64_t frees_before = stats_of(t.raw).system_frees;
  devbuf_memory_t e, f;
  CHECK_OK(devbuf_allocator_alloc(traced, 1000, &e));
  CHECK_OK(devbuf_allocator_alloc(traced, 2000, &f));
  devbuf_memory_t forged = f;
  forged.host = e.host; // another allocation's number with this one's address
  devbuf_allocator_free(traced, &forged);
  CHECK_MESSAGE("not handed out by this adaptor");
  devbuf_allocator_free(traced, &e);
  devbuf_set_error(DEVBUF_OK, "%s", "none");
  devbuf_allocator_free(traced, &e);
  CHECK_MESSAGE("freed already");
  devbuf_allocator_free(traced, &f);
  CHECK_EQ_U(stats_of(t.raw).system_frees - frees_before, 2);
  devbuf_allocator_release(traced); // closes the file
  char text[128] = {0};
  FILE *file = fopen(path, "r");
  CHECK(file != NULL);
  if (file) {
    CHECK(fread(text, 1, sizeof text - 1, file) > 0);
    fclose(file);
  }
  CHECK(strcmp(text, "# devbuf trace 1\na 1 1000\na 2 2000\nf 1\nf 2\n") == 0);
  unlink(path);
  test_allocators_close(&t);
}

static void test_zero_and_huge_requests(void) {
  test_allocators t = test_allocators_open(NULL);
  devbuf_memory_t memory;
  CHECK_STATUS(devbuf_allocator_alloc(t.caching, 0, &memory), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_allocator_alloc(t.caching, SIZE_MAX - 10, &memory), DEVBUF_OUT_OF_MEMORY);
  CHECK_STATUS(devbuf_allocator_alloc(t.caching, (size_t)1 << 62, &memory), DEVBUF_OUT_OF_MEMORY);
  CHECK_MESSAGE("bytes");
  // Too large to round to whole pages: said so, not taken for a limit's refusal.
  CHECK_STATUS(devbuf_allocator_alloc(t.caching, SIZE_MAX - 511, &memory), DEVBUF_OUT_OF_MEMORY);
  CHECK_MESSAGE("too large to round to whole");
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.live_buffers, 0);
  CHECK_EQ_U(s.failed_allocs, 3);
  CHECK_EQ_U(s.peak_reserved, 0); // the system refused them: nothing was ever held
  test_allocators_close(&t);
  // The same on growable segments, whose pages are mapped as blocks need them.
  growable_allocators g = growable_open();
  devbuf_allocator_t *growing = g.caching;
  CHECK_OK(devbuf_allocator_alloc(growing, 1 << 20, &memory));
  devbuf_allocator_free(growing, &memory);
  uint64_t held = stats_of(growing).peak_reserved;
  CHECK(held >= 1 << 20);
  CHECK_STATUS(devbuf_allocator_alloc(growing, (size_t)1 << 45, &memory), DEVBUF_OUT_OF_MEMORY);
  CHECK_EQ_U(stats_of(growing).peak_reserved, held);
  growable_close(&g);
}

// ---- user allocators and adaptors -------------------------------------------------------

typedef struct counting_ctx {
  int allocs, frees, destroyed, clears;
  char arena[8][256] __attribute__((aligned(64)));
  int used[8];
} counting_ctx;

static devbuf_status counting_alloc(void *ctx, size_t size, devbuf_memory_t *out) {
  counting_ctx *c = ctx;
  if (size > 256)
    return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "arena blocks hold 256 bytes, not %zu", size);
  for (int i = 0; i < 8; i++) {
    if (c->used[i]) continue;
    c->used[i] = 1;
    c->allocs++;
    out->host = c->arena[i];
    out->device = (uint64_t)(uintptr_t)c->arena[i];
    out->size = 256;
    out->token = &c->used[i];
    return DEVBUF_OK;
  }
  return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "arena full");
}

static void counting_free(void *ctx, const devbuf_memory_t *memory) {
  counting_ctx *c = ctx;
  *(int *)memory->token = 0;
  c->frees++;
}

static void counting_destroy(void *ctx) { ((counting_ctx *)ctx)->destroyed++; }

static void counting_clear_cache(void *ctx) { ((counting_ctx *)ctx)->clears++; }

static const devbuf_allocator_vtable_t counting_vtable = {.alloc = counting_alloc,
                                                          .free = counting_free,
                                                          .destroy = counting_destroy,
                                                          .clear_cache = counting_clear_cache};

static void test_user_allocator(void) {
  devbuf_device_t *device;
  CHECK_OK(devbuf_device_open("cpu", &device));
  counting_ctx ctx = {0};
  devbuf_allocator_t *user = NULL;
  CHECK_OK(devbuf_allocator_create(device, &counting_vtable, &ctx, &user));
  CHECK(strcmp(devbuf_allocator_kind(user), "custom") == 0);
  devbuf_buffer_t *buffer = NULL;
  size_t shape[] = {4, 8};
  CHECK_OK(devbuf_buffer_allocate(user, DEVBUF_FLOAT64, shape, 2, DEVBUF_BUFFER_ZERO, &buffer));
  CHECK_EQ_U(ctx.allocs, 1);
  double values[32];
  CHECK_OK(devbuf_buffer_copyout(buffer, values, sizeof values));
  CHECK(values[0] == 0.0 && values[31] == 0.0);
  devbuf_buffer_t *too_big = NULL;
  shape[0] = 100;
  CHECK_STATUS(devbuf_buffer_allocate(user, DEVBUF_FLOAT64, shape, 2, 0, &too_big),
               DEVBUF_OUT_OF_MEMORY);
  CHECK_MESSAGE("arena blocks hold 256 bytes");
  devbuf_allocator_stats_t s = stats_of(user);
  CHECK_EQ_U(s.active, 256);
  CHECK_EQ_U(s.failed_allocs, 1);
  // clear_cache reaches the user's own, through an adaptor too.
  devbuf_allocator_t *counted = NULL;
  CHECK_OK(devbuf_stats_adaptor_create(user, &counted));
  devbuf_allocator_clear_cache(user);
  devbuf_allocator_clear_cache(counted);
  CHECK_EQ_U(ctx.clears, 2);
  devbuf_allocator_release(counted);
  devbuf_allocator_release(user); // the buffer still holds it
  CHECK_EQ_U(ctx.destroyed, 0);
  devbuf_buffer_release(buffer);
  CHECK_EQ_U(ctx.frees, 1);
  CHECK_EQ_U(ctx.destroyed, 1);
  devbuf_device_release(device);
}

// A user allocator that answers what `mode` says: 0 memory with no host address, 1 a failure
// without a message, 2 a number that is no status, 3 memory 8 bytes past an alignment.
static int odd_mode;
static _Alignas(64) unsigned char odd_arena[4096 + 64];
static devbuf_status odd_alloc(void *ctx, size_t size, devbuf_memory_t *out) {
  (void)ctx;
  if (odd_mode == 1) return DEVBUF_OUT_OF_MEMORY;
  if (odd_mode == 2) return (devbuf_status)12345;
  if (odd_mode == 3) {
    *out = (devbuf_memory_t){
        .host = odd_arena + 8, .device = (uintptr_t)(odd_arena + 8), .size = 4096};
    return size <= 4096 ? DEVBUF_OK : DEVBUF_OUT_OF_MEMORY;
  }
  *out = (devbuf_memory_t){.host = NULL, .device = 4096, .size = size};
  return DEVBUF_OK;
}
static void odd_free(void *ctx, const devbuf_memory_t *memory) { (void)ctx, (void)memory; }
static const devbuf_allocator_vtable_t odd_vtable = {.alloc = odd_alloc, .free = odd_free};

// Addresses without memory serve devbuf_allocator_alloc (a replay's address space) but no
// buffer, which the CPU would write (zeroing crashed); a failure says which call failed even
// when the user's code said nothing, and never passes an older message off as its cause.
static void test_odd_user_allocator(void) {
  devbuf_device_t *device;
  CHECK_OK(devbuf_device_open("cpu", &device));
  devbuf_allocator_t *user = NULL, *cached = NULL;
  CHECK_OK(devbuf_allocator_create(device, &odd_vtable, NULL, &user));
  CHECK_OK(devbuf_caching_allocator_create(user, NULL, &cached));
  odd_mode = 0;
  devbuf_memory_t memory;
  CHECK_OK(devbuf_allocator_alloc(user, 1000, &memory));
  devbuf_allocator_free(user, &memory);
  size_t shape[] = {1000};
  devbuf_buffer_t *buffer = (devbuf_buffer_t *)&buffer;
  devbuf_allocator_t *both[2] = {user, cached};
  for (int i = 0; i < 2; i++) {
    CHECK_STATUS(
        devbuf_buffer_allocate(both[i], DEVBUF_FLOAT32, shape, 1, DEVBUF_BUFFER_ZERO, &buffer),
        DEVBUF_INVALID_ARGUMENT);
    CHECK_MESSAGE("without a host address on cpu");
    CHECK_STATUS(devbuf_buffer_allocate(both[i], DEVBUF_FLOAT32, shape, 1, 0, &buffer),
                 DEVBUF_INVALID_ARGUMENT);
    CHECK(buffer == (devbuf_buffer_t *)&buffer);
    CHECK_EQ_U(stats_of(both[i]).active, 0); // given back
  }
  odd_mode = 1;
  devbuf_allocator_alloc(user, 0, &memory); // an older message, about something else
  CHECK_STATUS(devbuf_allocator_alloc(user, 1000, &memory), DEVBUF_OUT_OF_MEMORY);
  CHECK_MESSAGE("user allocator's alloc of 1000 bytes failed, saying nothing more");
  CHECK(!strstr(devbuf_last_error(), "0 bytes (zero-length"));
  odd_mode = 2;
  CHECK_STATUS(devbuf_allocator_alloc(user, 1000, &memory), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("answered 12345, which is no devbuf status");
  odd_mode = 3; // the header asks for 64 bytes: refused, not handed on
  CHECK_STATUS(devbuf_allocator_alloc(user, 1000, &memory), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("not a multiple of 64 bytes as cpu needs");
  devbuf_allocator_release(cached);
  devbuf_allocator_release(user);
  devbuf_device_release(device);
}

static void test_fault_adaptor(void) {
  devbuf_device_t *device;
  devbuf_allocator_t *raw, *fault;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  CHECK_OK(devbuf_fault_adaptor_create(raw, 3, DEVBUF_FAULT_ONCE, &fault));
  devbuf_memory_t m[8];
  devbuf_status expected[6] = {DEVBUF_OK, DEVBUF_OK, DEVBUF_INJECTED_FAULT,
                               DEVBUF_OK, DEVBUF_OK, DEVBUF_OK};
  for (int i = 0; i < 6; i++) {
    CHECK_STATUS(devbuf_allocator_alloc(fault, 64, &m[i]), expected[i]);
    if (expected[i] == DEVBUF_OK) devbuf_allocator_free(fault, &m[i]);
  }
  CHECK_EQ_U(devbuf_fault_adaptor_fired(fault), 1);
  CHECK_OK(devbuf_fault_adaptor_arm(fault, 2, DEVBUF_FAULT_PERSISTENT));
  CHECK_OK(devbuf_allocator_alloc(fault, 64, &m[0]));
  CHECK_STATUS(devbuf_allocator_alloc(fault, 64, &m[1]), DEVBUF_INJECTED_FAULT);
  CHECK_STATUS(devbuf_allocator_alloc(fault, 64, &m[1]), DEVBUF_INJECTED_FAULT);
  devbuf_allocator_free(fault, &m[0]);
  CHECK_OK(devbuf_fault_adaptor_arm(fault, 3, DEVBUF_FAULT_EVERY));
  int failures = 0;
  for (int i = 0; i < 9; i++) {
    devbuf_memory_t x;
    if (devbuf_allocator_alloc(fault, 64, &x) == DEVBUF_OK)
      devbuf_allocator_free(fault, &x);
    else
      failures++;
  }
  CHECK_EQ_U(failures, 3);
  CHECK_STATUS(devbuf_fault_adaptor_arm(raw, 1, DEVBUF_FAULT_ONCE), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_fault_adaptor_arm(fault, 1, (devbuf_fault_mode)7), DEVBUF_INVALID_ARGUMENT);
  CHECK_EQ_U(stats_of(fault).active, 0);
  devbuf_allocator_release(fault);
  devbuf_allocator_release(raw);
  devbuf_device_release(device);
}

static void write_file(const char *path, const char *text) {
  FILE *file = fopen(path, "w");
  CHECK(file != NULL);
  if (!file) return;
  fputs(text, file);
  fclose(file);
}

typedef struct observed {
  char text[256];
  size_t used;
} observed;

static void observe(void *context, uint64_t id, uint64_t size, int refused) {
  observed *seen = context;
  seen->used += (size_t)snprintf(seen->text + seen->used, sizeof seen->text - seen->used,
                                 "%c%llu:%llu%s ", size ? 'a' : 'f', (unsigned long long)id,
                                 (unsigned long long)size, refused ? "!" : "");
}

static void test_trace_and_replay(void) {
  char path[] = "/tmp/devbuf-trace-XXXXXX";
  make_temp_file(path);
  test_allocators t = test_allocators_open(NULL);
  devbuf_allocator_t *trace = NULL;
  CHECK_OK(devbuf_trace_adaptor_create(t.caching, path, &trace));
  devbuf_buffer_t *a = bytes_buffer(trace, 1000), *b = bytes_buffer(trace, 5000),
                  *c = bytes_buffer(trace, 70000);
  devbuf_buffer_release(b);
  devbuf_buffer_t *d = bytes_buffer(trace, 100);
  devbuf_buffer_release(a);
  devbuf_buffer_release(c);
  devbuf_buffer_release(d);
  devbuf_allocator_release(trace); // closes the file
  // Replay against a fresh caching allocator: same calls, same peak.
  test_allocators target = test_allocators_open(NULL);
  devbuf_trace_summary_t summary;
  CHECK_OK(devbuf_trace_replay(path, target.caching, &summary));
  CHECK_EQ_U(summary.allocs, 4);
  CHECK_EQ_U(summary.frees, 4);
  CHECK_EQ_U(summary.leaked, 0);
  CHECK_EQ_U(summary.failed_allocs, 0);
  CHECK_EQ_U(summary.peak_live_bytes, 1000 + 5000 + 70000);
  devbuf_allocator_stats_t s = stats_of(target.caching);
  CHECK_EQ_U(s.alloc_calls, 4);
  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.peak, 1024 + 2 * page + 70144);
  // Hostile traces are refused with the line.
  struct {
    const char *text;
    const char *needle;
  } bad[] = {
      {"", "empty"},
      {"a 1 10\n", "does not start with"},
      {"# devbuf trace 1\na 1 10\nf 2\n", "line 3"},
      {"# devbuf trace 1\na 1 10\na 1 10\n", "line 3"},
      {"# devbuf trace 1\na 1 0\n", "line 2"},
      {"# devbuf trace 1\nz 1\n", "line 2"},
      {"# devbuf trace 1\na 99999999999999 8\n", "the next allocation is number 1"},
      // Memory follows what the trace holds: ids far ahead of the count reserve nothing.
      {"# devbuf trace 1\na 100000000 16\n", "allocation 100000000 of 16 bytes"},
      {"# devbuf trace 1\na 4294967296 16\n", "the next allocation is number 1"},
      {"# devbuf trace 1\na 1 8\na 3 8\n", "the next allocation is number 2"},
      {"# devbuf trace 1\na 1 8\nf 1\nf 1\n", "line 4: free of allocation 1 that is not live"},
      // 0 marks the table's empty slots, whose memory is a freed allocation's: freeing it again
      // made a double free that PyTorch's model took (a use after free in its pools).
      {"# devbuf trace 1\na 1 8\nf 1\nf 0\n", "line 4: free of allocation 0 that is not live"},
      {"# devbuf trace 1\nf 0\n", "line 2: free of allocation 0 that is not live"},
      {"# devbuf trace 1\na 1 8 junk\n", "line 2"},
      // Numbers are digits: no sign (sscanf read "-4096" as 2^64 - 4096), no overflow.
      {"# devbuf trace 1\na 1 -4096\nf 1\n", "line 2 is not a record"},
      {"# devbuf trace 1\na 1 +8\n", "line 2 is not a record"},
      {"# devbuf trace 1\na 1 18446744073709551616\n", "line 2 is not a record"},
      {"# devbuf trace 1\nf -1\n", "line 2 is not a record"},
      {"# devbuf trace 1\na 1 140737488355329\n", "past the 140737488355328"},
      {"# devbuf trace 12\na 1 8\n", "does not start with"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_file(path, bad[i].text);
    CHECK_STATUS(devbuf_trace_replay(path, target.caching, &summary), DEVBUF_FORMAT_ERROR);
    CHECK_MESSAGE(bad[i].needle);
  }
  CHECK_EQ_U(stats_of(target.caching).active, 0); // a refused trace frees what it made
  // A line of 255 characters is one; of 256, refused.
  char long_line[512];
  snprintf(long_line, sizeof long_line, "# devbuf trace 1\n#%0254d\na 1 8\nf 1\n", 0);
  write_file(path, long_line);
  CHECK_OK(devbuf_trace_replay(path, target.caching, &summary));
  snprintf(long_line, sizeof long_line, "# devbuf trace 1\n#%0255d\na 1 8\nf 1\n", 0);
  write_file(path, long_line);
  CHECK_STATUS(devbuf_trace_replay(path, target.caching, &summary), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("line 2 is longer than 255 characters");
  // A trace that never frees: the replay frees it and reports the leak.
  write_file(path, "# devbuf trace 1\na 1 64\na 2 64\nf 1\n");
  CHECK_OK(devbuf_trace_replay(path, target.caching, &summary));
  CHECK_EQ_U(summary.leaked, 1);
  CHECK_STATUS(devbuf_trace_replay("/nonexistent/trace", target.caching, &summary),
               DEVBUF_IO_ERROR);
  // The observer hears every record in order, refusals included.
  write_file(path, "# devbuf trace 1\na 1 64\na 2 1000000000000\nf 1\nf 2\n");
  devbuf_caching_options_t limited = {.memory_limit = 1 << 20};
  test_allocators small = test_allocators_open(&limited);
  observed seen = {.used = 0};
  CHECK_OK(devbuf_trace_replay_observed(path, small.caching, observe, &seen, &summary));
  CHECK(strcmp(seen.text, "a1:64 a2:1000000000000! f1:0 f2:0! ") == 0);
  CHECK_EQ_U(summary.failed_allocs, 1);
  test_allocators_close(&small);
  // Many allocations, few live at once: the live table stays small and every free finds its
  // allocation after the table's entries moved (growth, removals that shift later entries).
  FILE *many = fopen(path, "w");
  CHECK(many != NULL);
  if (many) {
    fputs("# devbuf trace 1\n", many);
    for (unsigned id = 1; id <= 200000; id++) {
      fprintf(many, "a %u %u\n", id, 1 + id % 5000);
      if (id > 3000) fprintf(many, "f %u\n", id - 3000);
    }
    fclose(many);
    CHECK_OK(devbuf_trace_replay(path, target.caching, &summary));
    CHECK_EQ_U(summary.allocs, 200000);
    CHECK_EQ_U(summary.frees, 197000);
    CHECK_EQ_U(summary.leaked, 3000);
  }
  unlink(path);
  test_allocators_close(&target);
  test_allocators_close(&t);
}

// A clear_cache made through a trace adaptor reaches its cache and is recorded ("# E"); the
// replay makes it there too, as it does a "# E" of a PyTorch run, where its allocator gave its
// cached segments back (empty_cache(), or a retry after the GPU ran out of memory).
static void test_cache_clears_recorded_and_replayed(void) {
  char path[] = "/tmp/devbuf-trace-XXXXXX";
  make_temp_file(path);
  test_allocators t = test_allocators_open(NULL);
  devbuf_allocator_t *trace = NULL;
  CHECK_OK(devbuf_trace_adaptor_create(t.caching, path, &trace));
  devbuf_buffer_release(bytes_buffer(trace, 65536));
  CHECK(stats_of(t.caching).cached > 0);
  devbuf_allocator_clear_cache(trace);
  CHECK_EQ_U(stats_of(t.caching).cached, 0);
  devbuf_buffer_release(bytes_buffer(trace, 65536));
  devbuf_allocator_release(trace);
  char text[256] = "";
  FILE *file = fopen(path, "r");
  CHECK(file != NULL);
  if (file) {
    text[fread(text, 1, sizeof text - 1, file)] = '\0';
    fclose(file);
  }
  CHECK(strcmp(text, "# devbuf trace 1\na 1 65536\nf 1\n# E\na 2 65536\nf 2\n") == 0);
  // Replayed: the segment goes back at "# E" and the second allocation takes a new one.
  test_allocators target = test_allocators_open(NULL);
  devbuf_trace_summary_t summary;
  CHECK_OK(devbuf_trace_replay(path, target.caching, &summary));
  CHECK_EQ_U(summary.cache_clears, 1);
  devbuf_allocator_stats_t s = stats_of(target.caching);
  CHECK_EQ_U(s.system_allocs, 2);
  CHECK_EQ_U(s.system_frees, 1);
  // Only the exact line clears; "# Ex" or "#E" are comments, as before.
  write_file(path, "# devbuf trace 1\na 1 65536\nf 1\n# Ex\n#E\n# E \na 2 65536\nf 2\n");
  CHECK_OK(devbuf_trace_replay(path, target.caching, &summary));
  CHECK_EQ_U(summary.cache_clears, 0);
  CHECK_EQ_U(stats_of(target.caching).system_allocs, 2); // both from the cache
  // A "# E" right after another finds nothing to give back: the allocator is not called
  // again (a user allocator's clear may cost it a walk of its blocks), yet each counts.
  devbuf_device_t *device = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  counting_ctx counted = {0};
  devbuf_allocator_t *user = NULL;
  CHECK_OK(devbuf_allocator_create(device, &counting_vtable, &counted, &user));
  write_file(path,
             "# devbuf trace 1\n# E\n# E\na 1 100\nf 1\n# E\n# t 5\n# E\na 2 100\n# E\nf 2\n");
  CHECK_OK(devbuf_trace_replay(path, user, &summary));
  CHECK_EQ_U(summary.cache_clears, 5);
  CHECK_EQ_U(counted.clears, 3);
  devbuf_allocator_release(user);
  devbuf_device_release(device);
  unlink(path);
  test_allocators_close(&target);
  test_allocators_close(&t);
}

// Growable segments: a clear unmaps every whole free page, however the pages came to be
// mapped and whatever was unmapped before. A clear looks only at the free blocks that may
// still hold pages (it must not walk the blocks in use); these check that a free block comes
// back on that list when a step maps into it again, and stays on it while work in flight
// keeps its pages.
static void test_growable_clears_reach_every_free_page(void) {
  growable_allocators g = growable_open();
  devbuf_memory_t big[8], first, freed, last;
  for (int i = 0; i < 8; i++) CHECK_OK(devbuf_allocator_alloc(g.caching, 1 << 20, &big[i]));
  // Past 8 MiB mapped, a block maps a step of 256 KiB beyond itself, into the free tail.
  CHECK_OK(devbuf_allocator_alloc(g.caching, 4096, &first));
  uint64_t with_step = stats_of(g.caching).reserved;
  devbuf_allocator_clear_cache(g.caching);
  uint64_t without = stats_of(g.caching).reserved;
  CHECK(with_step - without >= (128 << 10)); // the step went back
  // 100 KiB (no thread bin's size) freed: its pages and its step are the free tail's. 300 KiB
  // then takes its place, and mapping the rest would pass the most ever used by over 1/50:
  // the tail's pages go back first (its record leaves the list), then a step maps into the
  // tail again.
  CHECK_OK(devbuf_allocator_alloc(g.caching, 100 << 10, &freed));
  devbuf_allocator_free(g.caching, &freed);
  CHECK_OK(devbuf_allocator_alloc(g.caching, 300 << 10, &last));
  CHECK(stats_of(g.caching).reserved - without >= (300 << 10) + (128 << 10));
  devbuf_allocator_clear_cache(g.caching);
  CHECK_EQ_U(stats_of(g.caching).reserved - without, 300 << 10);
  // A block released while work may still use it keeps its pages through a clear, and gives
  // them back at the first clear after the work is done.
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *gate = NULL;
  CHECK_OK(devbuf_queue_create(g.device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  devbuf_buffer_t *held = bytes_buffer(g.caching, 256 << 10);
  devbuf_use_t use = {held, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(queue, nothing, &use, 1, NULL, 0));
  devbuf_buffer_release(held);
  devbuf_allocator_clear_cache(g.caching);
  CHECK_EQ_U(stats_of(g.caching).released_in_flight, 256 << 10);
  CHECK(stats_of(g.caching).reserved - without >= (300 << 10) + (256 << 10)); // its pages stay
  CHECK_OK(devbuf_event_signal(gate, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_EQ_U(stats_of(g.caching).released_in_flight, 0);
  devbuf_allocator_clear_cache(g.caching);
  CHECK_EQ_U(stats_of(g.caching).reserved - without, 300 << 10);
  devbuf_queue_release(queue);
  devbuf_event_release(gate);
  devbuf_allocator_free(g.caching, &first);
  devbuf_allocator_free(g.caching, &last);
  for (int i = 0; i < 8; i++) devbuf_allocator_free(g.caching, &big[i]);
  devbuf_allocator_clear_cache(g.caching);
  CHECK_EQ_U(stats_of(g.caching).reserved, 0);
  growable_close(&g);
}

int main(void) {
  page = (size_t)sysconf(_SC_PAGESIZE);
  RUN(test_steady_state);
  RUN(test_exact_stats);
  RUN(test_no_churn_with_less_than_a_page_of_room);
  RUN(test_largest_free_block);
  RUN(test_released_in_flight_counted_once);
  RUN(test_lazy_allocation);
  RUN(test_buffer_count_limit);
  RUN(test_page_size_option);
  RUN(test_sizes_near_every_bin);
  RUN(test_block_freed_by_a_later_destructor);
  RUN(test_double_free_is_refused);
  RUN(test_double_free_after_the_record_went);
  RUN(test_zero_and_huge_requests);
  RUN(test_user_allocator);
  RUN(test_odd_user_allocator);
  RUN(test_fault_adaptor);
  RUN(test_trace_and_replay);
  RUN(test_cache_clears_recorded_and_replayed);
  RUN(test_growable_clears_reach_every_free_page);
  return CHECK_EXIT();
}
