// The caching allocator's segments, exactly: which segments a sequence of requests
// reserves, how blocks split and coalesce, what the limits give back, and that the
// statistics and the snapshot say so after every step.
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define MiB ((size_t)1 << 20)

static devbuf_caching_options_t cpu_page = {.page_size = 4096};

static char state_letter(devbuf_block_state state) {
  switch (state) {
  case DEVBUF_BLOCK_ACTIVE:
    return 'A';
  case DEVBUF_BLOCK_FREE:
    return 'F';
  case DEVBUF_BLOCK_IN_FLIGHT:
    return 'I';
  case DEVBUF_BLOCK_THREAD_CACHED:
    return 'T';
  case DEVBUF_BLOCK_UNMAPPED:
    return 'U';
  }
  return '?';
}

// The snapshot as text: "small 2097152: A1048576 F1048576 | large ..." (A active, F free,
// I in flight, T thread-cached, U unmapped), segments in creation order.
static void render(devbuf_allocator_t *caching, char *out, size_t capacity) {
  devbuf_allocator_snapshot_t *snapshot = NULL;
  CHECK_OK(devbuf_allocator_snapshot(caching, &snapshot));
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; snapshot && i < snapshot->segment_count; i++) {
    const devbuf_snapshot_segment_t *segment = &snapshot->segments[i];
    used += (size_t)snprintf(out + used, capacity - used, "%s%s %llu:", i ? " | " : "",
                             segment->pool, (unsigned long long)segment->size);
    uint64_t next_offset = 0;
    for (size_t b = 0; b < segment->block_count; b++) {
      const devbuf_snapshot_block_t *block = &segment->blocks[b];
      CHECK_EQ_U(block->offset, next_offset); // blocks tile the segment
      next_offset = block->offset + block->size;
      used += (size_t)snprintf(out + used, capacity - used, " %c%llu", state_letter(block->state),
                               (unsigned long long)block->size);
    }
    CHECK_EQ_U(next_offset, segment->size);
  }
  devbuf_allocator_snapshot_free(snapshot);
}

#define CHECK_PICTURE(caching, expected)                                                     \
  do {                                                                                       \
    char picture_[4096];                                                                     \
    render((caching), picture_, sizeof picture_);                                            \
    if (strcmp(picture_, (expected)) != 0) {                                                 \
      fprintf(stderr, "%s:%d: snapshot\n  is       %s\n  expected %s\n", __FILE__, __LINE__, \
              picture_, (expected));                                                         \
      check_failures++;                                                                      \
    }                                                                                        \
  } while (0)

static devbuf_memory_t alloc_ok(devbuf_allocator_t *caching, size_t size) {
  devbuf_memory_t memory = {0};
  CHECK_OK(devbuf_allocator_alloc(caching, size, &memory));
  return memory;
}

// The first cases: small requests share a small segment; freeing gives one extent;
// a freed large block serves smaller requests by splitting.
static void test_share_coalesce_split(void) {
  // A limit keeps the thread bins out, which would hold a released 1 MiB block back from
  // its neighbours (test_power_of_two_bins).
  devbuf_caching_options_t no_bins = cpu_page;
  no_bins.max_buffers = 1u << 30;
  test_allocators t = test_allocators_open(&no_bins);
  devbuf_memory_t first = alloc_ok(t.caching, MiB);
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.system_allocs, 1);
  CHECK_EQ_U(s.reserved, 2 * MiB);
  CHECK_EQ_U(s.segments, 1);
  CHECK_EQ_U(s.largest_free_block, MiB);
  CHECK_PICTURE(t.caching, "small 2097152: A1048576 F1048576");
  devbuf_memory_t second = alloc_ok(t.caching, MiB);
  CHECK_EQ_U(stats_of(t.caching).system_allocs, 1);
  CHECK((char *)second.host == (char *)first.host + MiB);
  CHECK_PICTURE(t.caching, "small 2097152: A1048576 A1048576");
  CHECK_EQ_U(stats_of(t.caching).largest_free_block, 0);
  devbuf_allocator_free(t.caching, &first);
  CHECK_PICTURE(t.caching, "small 2097152: F1048576 A1048576");
  devbuf_allocator_free(t.caching, &second);
  CHECK_PICTURE(t.caching, "small 2097152: F2097152");
  s = stats_of(t.caching);
  CHECK_EQ_U(s.largest_free_block, MiB); // a larger request goes to the large pool

  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.cached, 2 * MiB);

  // Above 10 MiB a request gets a segment of its own; freed, it serves smaller ones.
  devbuf_memory_t big = alloc_ok(t.caching, 16 * MiB);
  CHECK_PICTURE(t.caching, "small 2097152: F2097152 | large 16777216: A16777216");
  devbuf_allocator_free(t.caching, &big);
  devbuf_memory_t twelve = alloc_ok(t.caching, 12 * MiB), three = alloc_ok(t.caching, 3 * MiB);
  CHECK_PICTURE(t.caching, "small 2097152: F2097152 | large 16777216: A12582912 A3145728 F1048576");
  s = stats_of(t.caching);
  CHECK_EQ_U(s.system_allocs, 2);
  CHECK_EQ_U(s.cache_hits, 3); // the second 1 MiB, the 12 MiB and the 3 MiB
  CHECK_EQ_U(s.active, 15 * MiB);
  CHECK_EQ_U(s.reserved, 18 * MiB);
  devbuf_allocator_free(t.caching, &twelve);
  // A 13 MiB request does not fit the 12 MiB hole: a new segment, rounded to 2 MiB as
  // PyTorch's are (a slightly larger request later fits it; here 1 MiB stays free).
  devbuf_memory_t thirteen = alloc_ok(t.caching, 13 * MiB);
  CHECK_PICTURE(
      t.caching,
      "small 2097152: F2097152 | large 16777216: F12582912 A3145728 F1048576 | large 14680064: "
      "A13631488 F1048576");
  devbuf_allocator_free(t.caching, &three); // coalesces with both neighbours
  CHECK_PICTURE(t.caching, "small 2097152: F2097152 | large 16777216: F16777216 | large 14680064: "
                           "A13631488 F1048576");
  devbuf_allocator_free(t.caching, &thirteen);
  CHECK_EQ_U(stats_of(t.caching).system_frees, 0);
  devbuf_allocator_clear_cache(t.caching);
  s = stats_of(t.caching);
  CHECK_EQ_U(s.system_frees, 3);
  CHECK_EQ_U(s.reserved, 0);
  CHECK_PICTURE(t.caching, "");
  test_allocators_close(&t);
}

// Sizes above 1 MiB and below 10 MiB share 20 MiB segments.
static void test_medium_segments(void) {
  test_allocators t = test_allocators_open(&cpu_page);
  devbuf_memory_t blocks[5];
  for (int i = 0; i < 5; i++) blocks[i] = alloc_ok(t.caching, 4 * MiB);
  CHECK_PICTURE(t.caching, "large 20971520: A4194304 A4194304 A4194304 A4194304 A4194304");
  devbuf_memory_t sixth = alloc_ok(t.caching, 4 * MiB);
  CHECK_PICTURE(
      t.caching,
      "large 20971520: A4194304 A4194304 A4194304 A4194304 A4194304 | large 20971520: A4194304 "
      "F16777216");
  devbuf_allocator_free(t.caching, &blocks[1]);
  devbuf_allocator_free(t.caching, &blocks[2]);
  // 8 MiB fits the merged hole of the first segment (best fit: smaller than the 16 MiB rest).
  devbuf_memory_t eight = alloc_ok(t.caching, 8 * MiB);
  CHECK((char *)eight.host == (char *)blocks[1].host);
  CHECK_EQ_U(stats_of(t.caching).system_allocs, 2);
  devbuf_allocator_free(t.caching, &eight);
  devbuf_allocator_free(t.caching, &sixth);
  for (int i = 0; i < 5; i++)
    if (i != 1 && i != 2) devbuf_allocator_free(t.caching, &blocks[i]);
  CHECK_PICTURE(t.caching, "large 20971520: F20971520 | large 20971520: F20971520");
  devbuf_allocator_clear_cache(t.caching);

  // The bound is PyTorch's: below 10 MiB (as rounded) a request shares 20 MiB segments, from
  // 10 MiB on it gets its own (a 10 MiB block in a 20 MiB segment strands the other half
  // wherever nothing else of the medium sizes comes: on real runs devbuf then needed more
  // memory than PyTorch's allocator to fit).
  devbuf_memory_t ten = alloc_ok(t.caching, 10 * MiB),
                  rounds_up = alloc_ok(t.caching, 10 * MiB - 100),
                  below = alloc_ok(t.caching, 10 * MiB - 512);
  CHECK_PICTURE(t.caching,
                "large 10485760: A10485760 | large 10485760: A10485760 | large 20971520: "
                "A10485248 F10486272");
  devbuf_allocator_free(t.caching, &below);
  devbuf_allocator_free(t.caching, &rounds_up);
  devbuf_allocator_free(t.caching, &ten);
  test_allocators_close(&t);
}

static void *alloc_and_free_64(void *caching) {
  devbuf_memory_t memory = alloc_ok(caching, 64 * MiB);
  devbuf_allocator_free(caching, &memory);
  return memory.host;
}

// A released block above the bins (more than 1 MiB) that is a whole segment waits parked
// in its thread: the thread's next request of that size takes it with no lock; another
// size, another thread's need of memory, a clear and new limits send it to its pool; a part
// of a segment and a block under a limit never park.
static void test_parked_blocks(void) {
  test_allocators t = test_allocators_open(&cpu_page);
  devbuf_memory_t big = alloc_ok(t.caching, 64 * MiB);
  devbuf_allocator_free(t.caching, &big);
  CHECK_PICTURE(t.caching, "large 67108864: T67108864");
  devbuf_allocator_stats_t before = stats_of(t.caching);
  CHECK_EQ_U(before.active, 0);
  CHECK_EQ_U(before.live_buffers, 0);
  devbuf_memory_t again = alloc_ok(t.caching, 64 * MiB - 100); // rounds to the parked size
  CHECK(again.host == big.host);
  devbuf_allocator_stats_t after = stats_of(t.caching);
  CHECK_EQ_U(after.cache_hits, before.cache_hits + 1);
  CHECK_EQ_U(after.system_allocs, 1);
  CHECK_EQ_U(after.active, 64 * MiB);
  devbuf_allocator_free(t.caching, &again);

  // Another thread's request takes the parked block before any new memory.
  pthread_t other;
  void *host = NULL;
  CHECK(pthread_create(&other, NULL, alloc_and_free_64, t.caching) == 0);
  pthread_join(other, &host);
  CHECK(host == big.host);
  CHECK_EQ_U(stats_of(t.caching).system_allocs, 1);

  // Another size: the parked block (if this thread has one) goes to the pool, whose best
  // fit splits the one free block.
  devbuf_memory_t parked_here = alloc_ok(t.caching, 64 * MiB);
  devbuf_allocator_free(t.caching, &parked_here);
  devbuf_memory_t half = alloc_ok(t.caching, 32 * MiB);
  CHECK(half.host == big.host);
  CHECK_PICTURE(t.caching, "large 67108864: A33554432 F33554432");
  devbuf_allocator_free(t.caching, &half);
  CHECK_PICTURE(t.caching, "large 67108864: F67108864");
  parked_here = alloc_ok(t.caching, 64 * MiB);
  devbuf_allocator_free(t.caching, &parked_here);
  devbuf_allocator_clear_cache(t.caching);
  CHECK_PICTURE(t.caching, "");
  parked_here = alloc_ok(t.caching, 64 * MiB);
  devbuf_allocator_free(t.caching, &parked_here);

  // A cache limit sends it to its pool, and the idle segment back; under it nothing parks.
  devbuf_caching_options_t limited = cpu_page;
  limited.cache_limit = 1;
  CHECK_OK(devbuf_caching_allocator_set_options(t.caching, &limited));
  CHECK_PICTURE(t.caching, "");
  devbuf_memory_t under_limit = alloc_ok(t.caching, 16 * MiB);
  devbuf_allocator_free(t.caching, &under_limit);
  CHECK_PICTURE(t.caching, "");
  CHECK_OK(devbuf_caching_allocator_set_options(t.caching, &cpu_page));
  test_allocators_close(&t);
}

// Until the first free, medium segments grow with the pool (fewer system allocations for
// what a program keeps); under a memory limit they stay 20 MiB, as PyTorch's do, since the
// larger segments' tails are what made requests fail near a limit. Under a limit sizes
// round to 512 bytes too, not to whole pages: no thread bin would take them.
static void test_segments_under_a_limit(void) {
  devbuf_allocator_stats_t free_run, limited;
  for (int with_limit = 0; with_limit < 2; with_limit++) {
    devbuf_caching_options_t options = cpu_page;
    options.memory_limit = with_limit ? 1024 * MiB : 0;
    test_allocators t = test_allocators_open(&options);
    devbuf_memory_t blocks[40];
    for (int i = 0; i < 40; i++) blocks[i] = alloc_ok(t.caching, 8 * MiB);
    (with_limit ? &limited : &free_run)[0] = stats_of(t.caching);
    for (int i = 0; i < 40; i++) devbuf_allocator_free(t.caching, &blocks[i]);
    // 5,000 bytes: two 4 KiB pages where thread bins may take the block, else 5,120.
    devbuf_memory_t odd = alloc_ok(t.caching, 5000);
    CHECK_EQ_U(stats_of(t.caching).active, with_limit ? 5120 : 8192);
    devbuf_allocator_free(t.caching, &odd);
    test_allocators_close(&t);
  }
  CHECK_EQ_U(limited.system_allocs, 20); // two 8 MiB blocks per 20 MiB segment
  CHECK_EQ_U(limited.reserved, 400 * MiB);
  CHECK(free_run.system_allocs < limited.system_allocs);
  CHECK(free_run.reserved >= 320 * MiB && free_run.reserved <= limited.reserved);
}

// The worked orders of the issue: 8 x 16 MiB then 4 x 32 MiB, and the reverse.
static void test_worked_orders(void) {
  test_allocators t = test_allocators_open(&cpu_page);
  devbuf_memory_t blocks[8];
  for (int i = 0; i < 8; i++) blocks[i] = alloc_ok(t.caching, 16 * MiB);
  for (int i = 0; i < 8; i++) devbuf_allocator_free(t.caching, &blocks[i]);
  // Separate 16 MiB segments never merge: each 32 MiB request needs its own.
  for (int i = 0; i < 4; i++) blocks[i] = alloc_ok(t.caching, 32 * MiB);
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.reserved, 256 * MiB);
  CHECK_EQ_U(s.system_allocs, 12);
  CHECK_EQ_U(s.segments, 12);
  for (int i = 0; i < 4; i++) devbuf_allocator_free(t.caching, &blocks[i]);
  test_allocators_close(&t);

  t = test_allocators_open(&cpu_page);
  for (int i = 0; i < 4; i++) blocks[i] = alloc_ok(t.caching, 32 * MiB);
  for (int i = 0; i < 4; i++) devbuf_allocator_free(t.caching, &blocks[i]);
  // Each 32 MiB segment splits into two 16 MiB blocks.
  for (int i = 0; i < 8; i++) blocks[i] = alloc_ok(t.caching, 16 * MiB);
  s = stats_of(t.caching);
  CHECK_EQ_U(s.reserved, 128 * MiB);
  CHECK_EQ_U(s.system_allocs, 4);
  CHECK_EQ_U(s.active, 128 * MiB);
  CHECK(s.fragmentation == 0.0);
  CHECK_PICTURE(t.caching,
                "large 33554432: A16777216 A16777216 | large 33554432: A16777216 A16777216 | large "
                "33554432: A16777216 A16777216 | large 33554432: A16777216 A16777216");
  for (int i = 0; i < 8; i++) devbuf_allocator_free(t.caching, &blocks[i]);
  test_allocators_close(&t);
}

// Limits give back whole idle segments, the longest idle first; a loop that fits under the
// memory limit makes no system allocation after its first pass.
static void test_limits_give_back_idle_segments(void) {
  test_allocators t = test_allocators_open(&cpu_page);
  devbuf_memory_t blocks[4];
  size_t sizes[4] = {11 * MiB, 12 * MiB, 13 * MiB, 14 * MiB};
  for (int i = 0; i < 4; i++) blocks[i] = alloc_ok(t.caching, sizes[i]);
  int order[4] = {2, 0, 3, 1}; // idle longest: blocks[2]'s segment
  for (int i = 0; i < 4; i++) devbuf_allocator_free(t.caching, &blocks[order[i]]);
  devbuf_caching_options_t options = cpu_page;
  // Segments of 12, 12, 14 and 14 MiB (rounded to 2 MiB): 52 MiB cached.
  options.cache_limit = 40 * MiB; // the 13 MiB block's segment goes
  CHECK_OK(devbuf_caching_allocator_set_options(t.caching, &options));
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.cached, 38 * MiB);
  CHECK_EQ_U(s.system_frees, 1);
  options.cache_limit = 20 * MiB; // then the 11 MiB one, then the 14 MiB one
  CHECK_OK(devbuf_caching_allocator_set_options(t.caching, &options));
  s = stats_of(t.caching);
  CHECK_EQ_U(s.cached, 12 * MiB);
  CHECK_EQ_U(s.system_frees, 3);
  CHECK_PICTURE(t.caching, "large 12582912: F12582912");
  test_allocators_close(&t);

  options = cpu_page;
  options.memory_limit = 64 * MiB;
  t = test_allocators_open(&options);
  uint64_t after_first_pass = 0;
  for (int pass = 0; pass < 5; pass++) {
    devbuf_memory_t held[12];
    for (int i = 0; i < 12; i++)
      held[i] = alloc_ok(t.caching, (size_t)(1 + i % 5) * MiB + 4096 * (size_t)i);
    for (int i = 0; i < 12; i += 2) devbuf_allocator_free(t.caching, &held[i]);
    devbuf_memory_t big = alloc_ok(t.caching, 20 * MiB);
    devbuf_allocator_free(t.caching, &big);
    for (int i = 1; i < 12; i += 2) devbuf_allocator_free(t.caching, &held[i]);
    if (pass == 0) after_first_pass = stats_of(t.caching).system_allocs;
  }
  s = stats_of(t.caching);
  CHECK_EQ_U(s.system_allocs, after_first_pass);
  CHECK_EQ_U(s.system_frees, 0);
  CHECK(s.reserved <= 64 * MiB);
  test_allocators_close(&t);
}

// Over the memory limit: idle segments go first, then the request is refused with every
// figure that explains why.
static void test_memory_limit(void) {
  devbuf_caching_options_t options = cpu_page;
  options.memory_limit = 40 * MiB;
  test_allocators t = test_allocators_open(&options);
  devbuf_memory_t a = alloc_ok(t.caching, 15 * MiB), b = alloc_ok(t.caching, 15 * MiB), c;
  devbuf_memory_t small = alloc_ok(t.caching, 100);   // a 2 MiB small segment still fits
  CHECK_EQ_U(stats_of(t.caching).reserved, 34 * MiB); // 15 MiB blocks in 16 MiB segments
  devbuf_memory_t medium = alloc_ok(t.caching, 5 * MiB);
  CHECK_EQ_U(stats_of(t.caching).reserved, 40 * MiB); // its segment shrank to 6 MiB, not 20
  CHECK_STATUS(devbuf_allocator_alloc(t.caching, 12 * MiB, &c), DEVBUF_OUT_OF_MEMORY);
  CHECK_MESSAGE(
      "requested 12582912 bytes (12582912 rounded) with 36700672 bytes active, 5242368 cached, 0 "
      "released "
      "in flight, a largest free block of 2096640 bytes and a memory limit of 41943040 bytes");
  CHECK_EQ_U(stats_of(t.caching).failed_allocs, 1);
  // With b and the medium block freed, neither hole holds 20 MiB: both idle segments go
  // back, the one idle longer first, to make room.
  devbuf_allocator_free(t.caching, &b);
  devbuf_allocator_free(t.caching, &medium);
  c = alloc_ok(t.caching, 20 * MiB);
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.system_frees, 2);
  CHECK_EQ_U(s.reserved, 38 * MiB);
  CHECK_PICTURE(t.caching, "large 16777216: A15728640 F1048576 | small 2097152: A512 F2096640 | "
                           "large 20971520: A20971520");
  devbuf_allocator_free(t.caching, &a);
  devbuf_allocator_free(t.caching, &c);
  devbuf_allocator_free(t.caching, &small);
  test_allocators_close(&t);
}

// At the memory limit, a request whose pool has no room takes the other pool's free bytes
// rather than giving an idle segment back only to make another (churn).
static void test_no_churn_at_the_limit(void) {
  devbuf_caching_options_t options = cpu_page;
  options.memory_limit = 15 * MiB;
  test_allocators t = test_allocators_open(&options);
  devbuf_memory_t big = alloc_ok(t.caching, 15 * MiB);
  devbuf_allocator_free(t.caching, &big); // idle, and the limit is reached
  devbuf_memory_t small = alloc_ok(t.caching, 100);
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.system_allocs, 1);
  CHECK_EQ_U(s.system_frees, 0);
  CHECK_PICTURE(t.caching, "large 15728640: A512 F15728128");
  devbuf_allocator_free(t.caching, &small);
  test_allocators_close(&t);

  // Idle segments are not given back for a request that would be refused anyway.
  options.memory_limit = 20 * MiB;
  t = test_allocators_open(&options);
  devbuf_memory_t x = alloc_ok(t.caching, 12 * MiB), y = alloc_ok(t.caching, 4 * MiB), z;
  CHECK_EQ_U(stats_of(t.caching).reserved, 20 * MiB); // y's segment: the 8 MiB the limit left
  devbuf_allocator_free(t.caching, &y);
  CHECK_STATUS(devbuf_allocator_alloc(t.caching, 16 * MiB, &z), DEVBUF_OUT_OF_MEMORY);
  CHECK_EQ_U(stats_of(t.caching).system_frees, 0);
  y = alloc_ok(t.caching, 6 * MiB); // still there to serve this
  CHECK_EQ_U(stats_of(t.caching).system_allocs, 2);
  devbuf_allocator_free(t.caching, &x);
  devbuf_allocator_free(t.caching, &y);
  test_allocators_close(&t);
}

// Freed small blocks wait in the thread's bins (without limits), where they cannot merge.
// Before a request gets a new segment the bins go back to the pools: two freed 64 KiB
// neighbours then serve a 128 KiB request in the full segment.
static void test_thread_bins_before_new_memory(void) {
  test_allocators t = test_allocators_open(&cpu_page);
  devbuf_memory_t blocks[32];
  for (int i = 0; i < 32; i++) blocks[i] = alloc_ok(t.caching, 64 << 10);
  devbuf_allocator_free(t.caching, &blocks[0]);
  devbuf_allocator_free(t.caching, &blocks[1]);
  char expected[1024] = "small 2097152: T65536 T65536";
  for (int i = 2; i < 32; i++) strcat(expected, " A65536");
  CHECK_PICTURE(t.caching, expected);
  devbuf_memory_t pair = alloc_ok(t.caching, 128 << 10);
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK_EQ_U(s.system_allocs, 1);
  CHECK_EQ_U(s.reserved, 2 * MiB);
  CHECK(pair.host == blocks[0].host);
  devbuf_allocator_free(t.caching, &pair);
  for (int i = 2; i < 32; i++) devbuf_allocator_free(t.caching, &blocks[i]);
  test_allocators_close(&t);
}

// Stacked on a user's allocator, the caching allocator follows the device's segment policy.
static void test_over_any_upstream(void) {
  test_allocators t = test_allocators_open(NULL);
  devbuf_allocator_t *outer = NULL;
  CHECK_OK(devbuf_caching_allocator_create(t.caching, &cpu_page, &outer)); // a cache over a cache
  devbuf_memory_t memory = alloc_ok(outer, 1000);
  CHECK_EQ_U(stats_of(outer).reserved, 2 * MiB);
  CHECK_EQ_U(stats_of(t.caching).active, 2 * MiB); // the outer segment is one inner block
  devbuf_allocator_free(outer, &memory);
  devbuf_allocator_release(outer);
  CHECK_EQ_U(stats_of(t.caching).active, 0);
  devbuf_caching_options_t growable = {.growable = 1};
  devbuf_allocator_t *refused = NULL;
  CHECK_STATUS(devbuf_caching_allocator_create(t.raw, &growable, &refused), DEVBUF_UNSUPPORTED);
  CHECK_MESSAGE("a stats allocator on cpu cannot");
  CHECK(refused == NULL);
  devbuf_allocator_snapshot_t *snapshot = NULL;
  CHECK_STATUS(devbuf_allocator_snapshot(t.raw, &snapshot), DEVBUF_UNSUPPORTED);
  CHECK_MESSAGE("only caching ones");
  CHECK(snapshot == NULL);
  test_allocators_close(&t);
}

static devbuf_status half_alloc(void *ctx, size_t size, devbuf_memory_t *out) {
  (void)ctx, (void)size, (void)out;
  return DEVBUF_OUT_OF_MEMORY;
}
static void half_free(void *ctx, const devbuf_memory_t *memory) { (void)ctx, (void)memory; }
static devbuf_status half_reserve(void *ctx, size_t size, devbuf_memory_t *out) {
  (void)ctx, (void)size, (void)out;
  return DEVBUF_OUT_OF_MEMORY;
}

// Growable segments over the CPU's reserved addresses: each pool one segment, mapped as its
// highest block needs (2 MiB at least), its free end unmapped at clear_cache and under the
// memory limit.
// The peak of reserved bytes: exact across segments made and given back, and reset to what
// is reserved now by reset_peak.
static void test_peak_reserved(void) {
  test_allocators t = test_allocators_open(&cpu_page);
  devbuf_memory_t a = alloc_ok(t.caching, 12 * MiB), b = alloc_ok(t.caching, 30 * MiB);
  uint64_t both = stats_of(t.caching).reserved;
  CHECK(both >= 42 * MiB);
  devbuf_allocator_free(t.caching, &b);
  devbuf_allocator_clear_cache(t.caching); // b's segment goes back
  devbuf_allocator_stats_t s = stats_of(t.caching);
  CHECK(s.reserved < both);
  CHECK_EQ_U(s.peak_reserved, both);
  devbuf_allocator_reset_peak(t.caching);
  CHECK_EQ_U(stats_of(t.caching).peak_reserved, s.reserved);
  devbuf_allocator_free(t.caching, &a);
  CHECK_EQ_U(stats_of(t.raw).peak_reserved, stats_of(t.raw).peak); // no cache: what is held
  test_allocators_close(&t);
}

// Snapshots taken while other threads allocate from a growable allocator (a block is handed
// out before its memory is mapped): every segment's blocks still tile it exactly.
static devbuf_allocator_t *racing_allocator;
static atomic_bool racing_stop;
static void *grow_and_shrink(void *seed) {
  unsigned state = (unsigned)(uintptr_t)seed;
  devbuf_memory_t held[16] = {{0}};
  while (!atomic_load(&racing_stop)) {
    state = state * 1103515245u + 12345u;
    size_t slot = (state >> 8) % 16, size = ((state >> 12) % 64 + 1) * 4096;
    if (held[slot].size) devbuf_allocator_free(racing_allocator, &held[slot]);
    held[slot].size = 0;
    if ((state >> 20) % 64 == 0) devbuf_allocator_clear_cache(racing_allocator); // map again
    if (devbuf_allocator_alloc(racing_allocator, size, &held[slot]) != DEVBUF_OK)
      held[slot].size = 0;
  }
  for (int i = 0; i < 16; i++)
    if (held[i].size) devbuf_allocator_free(racing_allocator, &held[i]);
  return NULL;
}

static void test_growable_snapshot_while_allocating(void) {
  devbuf_device_t *device = NULL;
  devbuf_allocator_t *raw = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  devbuf_caching_options_t options = cpu_page;
  options.growable = 1;
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &racing_allocator));
  atomic_store(&racing_stop, false);
  pthread_t threads[2];
  for (uintptr_t i = 0; i < 2; i++)
    pthread_create(&threads[i], NULL, grow_and_shrink, (void *)(i + 1));
  size_t broken = 0;
  for (int round = 0; round < 200000; round++) { // the window is short: one in ~30000 sees it
    devbuf_allocator_snapshot_t *snapshot = NULL;
    if (devbuf_allocator_snapshot(racing_allocator, &snapshot) != DEVBUF_OK) continue;
    for (size_t i = 0; i < snapshot->segment_count; i++) {
      const devbuf_snapshot_segment_t *segment = &snapshot->segments[i];
      uint64_t next = 0;
      for (size_t b = 0; b < segment->block_count; b++) {
        if (segment->blocks[b].offset != next) broken++;
        next = segment->blocks[b].offset + segment->blocks[b].size;
      }
      if (next != segment->size) broken++;
    }
    devbuf_allocator_snapshot_free(snapshot);
    for (volatile int spin = 0; spin < 2000; spin++) { // let the allocating threads run
    }
  }
  atomic_store(&racing_stop, true);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  CHECK_EQ_U(broken, 0);
  devbuf_allocator_release(racing_allocator);
  devbuf_allocator_release(raw);
  devbuf_device_release(device);
}

// Under a limit, a growable segment's step past its block stops at the limit: blocks that
// fit are handed out up to the last page (a step of a 32nd of what is mapped once refused a
// 64 KiB block with 9.7 MiB of 10 mapped).
static void test_growable_fills_its_limit(void) {
  devbuf_device_t *device = NULL;
  devbuf_allocator_t *raw = NULL, *caching = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_device_raw_allocator(device, &raw)); // a stats allocator cannot map
  devbuf_caching_options_t options = cpu_page;
  options.growable = 1;
  options.memory_limit = 10 * MiB;
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &caching));
  if (!caching) return;
  enum { MOST = 200 };
  devbuf_memory_t blocks[MOST];
  size_t count = 0;
  while (count < MOST && devbuf_allocator_alloc(caching, 64 * 1024, &blocks[count]) == DEVBUF_OK)
    count++;
  CHECK_EQ_U(count, 10 * MiB / (64 * 1024));
  CHECK(stats_of(caching).reserved <= 10 * MiB);
  for (size_t i = 0; i < count; i++) devbuf_allocator_free(caching, &blocks[i]);
  devbuf_allocator_release(caching);
  // A growable segment made for a request the limit refuses maps nothing: its picture has no
  // block (and the snapshot made no pointer from a NULL array of blocks).
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &caching));
  devbuf_memory_t refused;
  CHECK_STATUS(devbuf_allocator_alloc(caching, 20 * MiB, &refused), DEVBUF_OUT_OF_MEMORY);
  devbuf_allocator_snapshot_t *snapshot = NULL;
  CHECK_OK(devbuf_allocator_snapshot(caching, &snapshot));
  if (snapshot) {
    CHECK_EQ_U(snapshot->segment_count, 1);
    for (size_t i = 0; i < snapshot->segment_count; i++) {
      CHECK_EQ_U(snapshot->segments[i].size, 0);
      CHECK_EQ_U(snapshot->segments[i].block_count, 0);
      CHECK(snapshot->segments[i].blocks == NULL);
    }
    devbuf_allocator_snapshot_free(snapshot);
  }
  devbuf_allocator_release(caching);
  devbuf_allocator_release(raw);
  devbuf_device_release(device);
}

static void test_growable_segments(void) {
  devbuf_device_t *device = NULL;
  devbuf_allocator_t *raw = NULL, *caching = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  devbuf_caching_options_t options = cpu_page;
  options.growable = 1;
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &caching));
  devbuf_memory_t small = alloc_ok(caching, 1000), big = alloc_ok(caching, 30 * MiB);
  memset(small.host, 1, small.size); // memory stands behind both
  memset(big.host, 2, big.size);
  devbuf_allocator_stats_t s = stats_of(caching);
  CHECK_EQ_U(s.reserved, 30 * MiB + 4096); // the small pool maps a page: what its block reaches
  CHECK_EQ_U(s.segments, 2);
  CHECK_EQ_U(s.system_allocs, 2);
  CHECK_PICTURE(caching, "small 4096: A1024 F3072 | large 31457280: A31457280");
  devbuf_memory_t next = alloc_ok(caching, 5 * MiB); // the large segment grows by 5 MiB
  memset(next.host, 3, next.size);
  CHECK((char *)next.host == (char *)big.host + 30 * MiB);
  CHECK_EQ_U(stats_of(caching).reserved, 35 * MiB + 4096);
  devbuf_allocator_free(caching, &big);
  CHECK_PICTURE(caching, "small 4096: A1024 F3072 | large 36700160: F31457280 A5242880");
  devbuf_memory_t again = alloc_ok(caching, 20 * MiB); // from the hole: nothing mapped
  CHECK_EQ_U(stats_of(caching).system_allocs, 3);
  devbuf_allocator_free(caching, &again);
  devbuf_allocator_free(caching, &next);
  devbuf_allocator_clear_cache(caching); // the large segment's free pages go, in one call
  s = stats_of(caching);
  CHECK_EQ_U(s.reserved, 4096);
  CHECK_EQ_U(s.system_frees, 1);
  CHECK_PICTURE(caching, "small 4096: A1024 F3072 | large 0:");
  devbuf_allocator_free(caching, &small);
  devbuf_allocator_release(caching);

  // At a memory limit: mapping what does not fit first unmaps other segments' free ends.
  options.memory_limit = 8 * MiB;
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &caching));
  devbuf_memory_t a = alloc_ok(caching, 3 * MiB), b = alloc_ok(caching, 3 * MiB), c;
  devbuf_memory_t tiny = alloc_ok(caching, 100); // maps a page for the small pool
  devbuf_allocator_free(caching, &tiny);
  CHECK_EQ_U(stats_of(caching).reserved, 6 * MiB + 4096);
  CHECK_STATUS(devbuf_allocator_alloc(caching, 4 * MiB, &c), DEVBUF_OUT_OF_MEMORY);
  CHECK_MESSAGE("requested 4194304 bytes (4194304 rounded) with 6291456 bytes active");
  CHECK_EQ_U(stats_of(caching).reserved, 6 * MiB); // the small pool's free page went, trying
  devbuf_allocator_free(caching, &b);
  c = alloc_ok(caching, 4 * MiB); // b's bytes, and 1 MiB more mapped
  CHECK((char *)c.host == (char *)b.host);
  memset(c.host, 4, c.size);
  CHECK_EQ_U(stats_of(caching).reserved, 7 * MiB);
  devbuf_allocator_free(caching, &a);
  devbuf_allocator_free(caching, &c);
  devbuf_allocator_release(caching);
  devbuf_allocator_release(raw);
  // A user's allocator gives all four address-space calls or none.
  static const devbuf_allocator_vtable_t half = {
      .alloc = half_alloc, .free = half_free, .reserve = half_reserve};
  devbuf_allocator_t *user = NULL;
  CHECK_STATUS(devbuf_allocator_create(device, &half, NULL, &user), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("all four or none (1 given)");
  devbuf_device_release(device);
}

// Released blocks of exactly 128 KiB .. 1 MiB stay in the thread's bins, one of each size:
// Free pages in the interior of a growable segment go back too: under a limit, whatever
// part of a mapping they are; and without one, before mapping would take the segment over
// 1/50 above the most its blocks ever used. What stays mapped keeps its bytes.
static void test_growable_holes_go_back(void) {
  devbuf_device_t *device = NULL;
  devbuf_allocator_t *raw = NULL, *caching = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  devbuf_caching_options_t options = cpu_page;
  options.growable = 1;
  for (int with_limit = 0; with_limit < 2; with_limit++) {
    CHECK_OK(devbuf_caching_allocator_create(raw, &options, &caching));
    devbuf_memory_t a = alloc_ok(caching, 8 * MiB), b = alloc_ok(caching, 8 * MiB);
    devbuf_memory_t c = alloc_ok(caching, 8 * MiB);
    memset(a.host, 1, a.size);
    memset(c.host, 3, c.size);
    CHECK_EQ_U(stats_of(caching).reserved, 24 * MiB);
    devbuf_allocator_free(caching, &b);
    devbuf_memory_t d;
    if (with_limit) {
      devbuf_caching_options_t limited = options;
      limited.memory_limit = 20 * MiB; // b's pages go, though mapped beside a's and c's
      CHECK_OK(devbuf_caching_allocator_set_options(caching, &limited));
      CHECK_EQ_U(stats_of(caching).reserved, 16 * MiB);
      CHECK_PICTURE(caching, "large 25165824: A8388608 U8388608 A8388608");
      d = alloc_ok(caching, 4 * MiB); // into the hole: only its own pages are mapped
      CHECK((char *)d.host == (char *)a.host + 8 * MiB);
      CHECK_EQ_U(stats_of(caching).reserved, 20 * MiB);
      CHECK_PICTURE(caching, "large 25165824: A8388608 A4194304 U4194304 A8388608");
    } else {
      // 12 MiB does not fit the hole: mapping it past c would hold 36 MiB for 28 in use,
      // so the hole goes back first.
      d = alloc_ok(caching, 12 * MiB);
      CHECK_EQ_U(stats_of(caching).reserved, 28 * MiB);
      CHECK_PICTURE(caching, "large 37748736: A8388608 U8388608 A8388608 A12582912");
    }
    CHECK_EQ_U(stats_of(caching).system_frees, 1);
    memset(d.host, 4, d.size);
    for (size_t i = 0; i < a.size; i += 4096)
      CHECK(((unsigned char *)a.host)[i] == 1 && ((unsigned char *)c.host)[i] == 3);
    devbuf_allocator_free(caching, &a);
    devbuf_allocator_free(caching, &c);
    devbuf_allocator_free(caching, &d);
    devbuf_allocator_release(caching);
  }
  devbuf_allocator_release(raw);
  devbuf_device_release(device);
}

// the next request of that size takes it back without a lock; a second goes to the pool.
static void test_power_of_two_bins(void) {
  test_allocators t = test_allocators_open(&cpu_page);
  devbuf_memory_t first = alloc_ok(t.caching, MiB), second = alloc_ok(t.caching, MiB);
  devbuf_allocator_free(t.caching, &first);
  devbuf_allocator_free(t.caching, &second);
  CHECK_PICTURE(t.caching, "small 2097152: T1048576 F1048576");
  uint64_t hits = stats_of(t.caching).cache_hits;
  devbuf_memory_t again = alloc_ok(t.caching, MiB - 100); // rounds to the binned size
  CHECK((char *)again.host == (char *)first.host);
  CHECK_EQ_U(stats_of(t.caching).cache_hits, hits + 1);
  devbuf_allocator_free(t.caching, &again);
  devbuf_memory_t odd = alloc_ok(t.caching, 3 * MiB / 4); // no bin: from the pool
  CHECK((char *)odd.host == (char *)second.host);
  devbuf_allocator_free(t.caching, &odd);
  test_allocators_close(&t);
}

// A device's own allocator takes growable segments before its first allocation, and only
// then; the steps it maps grow with it, so that a working set of any size is held within a
// 32nd of what its blocks reach.
static void test_configure(void) {
  devbuf_device_t *device = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  devbuf_allocator_t *own = devbuf_device_allocator(device);
  devbuf_caching_options_t growable = {.growable = 1};
  CHECK_OK(devbuf_caching_allocator_configure(own, &growable));
  devbuf_memory_t first = alloc_ok(own, 1000);
  CHECK_EQ_U(stats_of(own).reserved, 4096);
  CHECK_STATUS(devbuf_caching_allocator_configure(own, &growable), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("holds 1 segments and 1 live allocations");
  devbuf_allocator_free(own, &first);
  devbuf_caching_options_t other_page = {.page_size = 65536};
  CHECK_STATUS(devbuf_caching_allocator_configure(own, &other_page), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("page_size 65536: this allocator's page is 4096");
  CHECK_STATUS(devbuf_caching_allocator_configure(devbuf_device_allocator(device), NULL),
               DEVBUF_INVALID_ARGUMENT);

  devbuf_allocator_t *raw = NULL, *plain = NULL;
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  CHECK_STATUS(devbuf_caching_allocator_configure(raw, &growable), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("needs a caching allocator");
  CHECK_OK(devbuf_caching_allocator_create(raw, &cpu_page, &plain));
  CHECK_OK(devbuf_caching_allocator_configure(plain, &growable));
  // 64 KiB blocks up to 64 MiB: a page-rounded need at first, then steps of a 32nd.
  enum { COUNT = 1024 };
  static devbuf_memory_t blocks[COUNT];
  for (int i = 0; i < COUNT; i++) {
    blocks[i] = alloc_ok(plain, 64 * 1024);
    devbuf_allocator_stats_t now = stats_of(plain);
    CHECK(now.reserved <= now.active + now.active / 32 + 4096);
  }
  devbuf_allocator_stats_t full = stats_of(plain);
  CHECK_EQ_U(full.segments, 1);
  CHECK(full.system_allocs > 64 && full.system_allocs < 160); // 2 MiB steps: 32; pages: 1024
  for (int i = 0; i < COUNT; i++) devbuf_allocator_free(plain, &blocks[i]);
  devbuf_allocator_release(plain);

  static const devbuf_allocator_vtable_t no_mapping = {.alloc = half_alloc, .free = half_free};
  devbuf_allocator_t *user = NULL, *over_user = NULL;
  CHECK_OK(devbuf_allocator_create(device, &no_mapping, NULL, &user));
  CHECK_OK(devbuf_caching_allocator_create(user, NULL, &over_user));
  CHECK_STATUS(devbuf_caching_allocator_configure(over_user, &growable), DEVBUF_UNSUPPORTED);
  CHECK_MESSAGE("a custom allocator on cpu cannot");
  devbuf_caching_options_t limit = {.memory_limit = 1 << 20};
  CHECK_OK(devbuf_caching_allocator_configure(over_user, &limit)); // plain options: as set_options
  devbuf_memory_t refused;
  CHECK_STATUS(devbuf_allocator_alloc(over_user, 2 << 20, &refused), DEVBUF_OUT_OF_MEMORY);
  CHECK_MESSAGE("a memory limit of 1048576");
  devbuf_allocator_release(over_user);
  devbuf_allocator_release(user);
  devbuf_allocator_release(raw);
  devbuf_device_release(device);
}

int main(void) {
  RUN(test_configure); // first: the device's own allocator is still untouched

  RUN(test_share_coalesce_split);
  RUN(test_power_of_two_bins);
  RUN(test_medium_segments);
  RUN(test_parked_blocks);
  RUN(test_segments_under_a_limit);
  RUN(test_worked_orders);
  RUN(test_limits_give_back_idle_segments);
  RUN(test_memory_limit);
  RUN(test_no_churn_at_the_limit);
  RUN(test_thread_bins_before_new_memory);
  RUN(test_over_any_upstream);
  RUN(test_growable_segments);
  RUN(test_growable_fills_its_limit);
  RUN(test_growable_holes_go_back);
  RUN(test_peak_reserved);
  RUN(test_growable_snapshot_while_allocating);
  return CHECK_EXIT();
}
