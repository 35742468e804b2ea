// The caching allocator against a model, from four threads at once: over a million random
// allocations and frees with the sizes of a real PyTorch trace, some freed by another
// thread than the one that allocated them. At checkpoints every thread stops and the
// model is compared with the allocator: no two live blocks overlap, each is an active block
// of the snapshot inside its segment, and the statistics are exact. The upstream hands out
// addresses only (nothing is ever touched), so sizes of hundreds of MiB cost nothing.
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

enum { THREADS = 4, OPS_PER_THREAD = 262144, CHECK_EVERY = 32768, MAX_LIVE = 48, MAILBOX = 64 };

// ---- an upstream of addresses -----------------------------------------------------------

typedef struct address_space {
  atomic_uint_least64_t next, held;
} address_space;

static devbuf_status space_alloc(void *context, size_t size, devbuf_memory_t *out) {
  address_space *space = context;
  uint64_t span = (size + ((uint64_t)2 << 20) - 1) & ~(((uint64_t)2 << 20) - 1);
  uint64_t address = atomic_fetch_add(&space->next, span);
  atomic_fetch_add(&space->held, size);
  *out = (devbuf_memory_t){.host = NULL, .device = address, .size = size};
  return DEVBUF_OK;
}

static void space_free(void *context, const devbuf_memory_t *memory) {
  atomic_fetch_sub(&((address_space *)context)->held, memory->size);
}

static devbuf_status space_reserve(void *context, size_t size, devbuf_memory_t *out) {
  address_space *space = context;
  *out =
      (devbuf_memory_t){.host = NULL, .device = atomic_fetch_add(&space->next, size), .size = size};
  return DEVBUF_OK;
}

static devbuf_status space_map(void *context, const devbuf_memory_t *reservation, size_t offset,
                               size_t size) {
  (void)reservation, (void)offset;
  atomic_fetch_add(&((address_space *)context)->held, size);
  return DEVBUF_OK;
}

static void space_unmap(void *context, const devbuf_memory_t *reservation, size_t offset,
                        size_t size) {
  (void)reservation, (void)offset;
  atomic_fetch_sub(&((address_space *)context)->held, size);
}

static void space_unreserve(void *context, const devbuf_memory_t *reservation) {
  (void)context, (void)reservation;
}

static const devbuf_allocator_vtable_t space_vtable = {.alloc = space_alloc,
                                                       .free = space_free,
                                                       .reserve = space_reserve,
                                                       .map = space_map,
                                                       .unmap = space_unmap,
                                                       .unreserve = space_unreserve};

// ---- the workload -----------------------------------------------------------------------

static size_t *sizes;
static size_t size_count;
static devbuf_allocator_t *caching;
static pthread_barrier_t barrier;

typedef struct worker {
  devbuf_memory_t live[MAX_LIVE];
  size_t live_count;
  uint64_t seed;
  uint64_t refused;
} worker;

static worker workers[THREADS];
static pthread_mutex_t mailbox_lock = PTHREAD_MUTEX_INITIALIZER;
static devbuf_memory_t mailbox[MAILBOX]; // blocks handed to whichever thread frees them
static size_t mailbox_count;

static uint64_t next_random(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static void load_sizes(void) {
  FILE *trace = fopen(test_data("traces/bcrafton-assignment2-systems/memory_snapshot.trace"), "r");
  CHECK(trace != NULL);
  if (!trace) exit(1);
  size_t capacity = 4096;
  sizes = malloc(capacity * sizeof *sizes);
  char line[256];
  while (fgets(line, sizeof line, trace)) {
    unsigned long long id, size;
    if (sscanf(line, "a %llu %llu", &id, &size) != 2) continue;
    if (size_count == capacity) sizes = realloc(sizes, (capacity *= 2) * sizeof *sizes);
    sizes[size_count++] = (size_t)size;
  }
  fclose(trace);
  CHECK(size_count > 1000);
}

static int by_address(const void *a, const void *b) {
  uint64_t x = ((const devbuf_memory_t *)a)->device, y = ((const devbuf_memory_t *)b)->device;
  return (x > y) - (x < y);
}

// Every thread is stopped: the model and the allocator must agree exactly.
static void check_against_model(void) {
  size_t count = mailbox_count;
  for (int t = 0; t < THREADS; t++) count += workers[t].live_count;
  devbuf_memory_t *all = malloc((count + 1) * sizeof *all);
  size_t n = 0;
  uint64_t active = 0;
  for (int t = 0; t < THREADS; t++)
    for (size_t i = 0; i < workers[t].live_count; i++) all[n++] = workers[t].live[i];
  for (size_t i = 0; i < mailbox_count; i++) all[n++] = mailbox[i];
  qsort(all, n, sizeof *all, by_address);
  size_t overlaps = 0;
  for (size_t i = 0; i < n; i++) {
    active += all[i].size;
    if (i + 1 < n && all[i].device + all[i].size > all[i + 1].device) overlaps++;
  }
  CHECK_EQ_U(overlaps, 0);
  devbuf_allocator_snapshot_t *snapshot = NULL;
  CHECK_OK(devbuf_allocator_snapshot(caching, &snapshot));
  uint64_t reserved = 0;
  size_t missing = 0;
  for (size_t s = 0; s < snapshot->segment_count; s++) {
    reserved += snapshot->segments[s].size;
    for (size_t b = 0; b < snapshot->segments[s].block_count; b++) // growable: what is mapped
      if (snapshot->segments[s].blocks[b].state == DEVBUF_BLOCK_UNMAPPED)
        reserved -= snapshot->segments[s].blocks[b].size;
  }
  for (size_t i = 0; i < n; i++) { // each live block is an active block of its segment
    bool found = false;
    for (size_t s = 0; s < snapshot->segment_count && !found; s++) {
      const devbuf_snapshot_segment_t *segment = &snapshot->segments[s];
      if (all[i].device < segment->device ||
          all[i].device + all[i].size > segment->device + segment->size)
        continue;
      for (size_t b = 0; b < segment->block_count && !found; b++)
        found = segment->blocks[b].offset == all[i].device - segment->device &&
                segment->blocks[b].size == all[i].size &&
                segment->blocks[b].state == DEVBUF_BLOCK_ACTIVE;
    }
    missing += !found;
  }
  CHECK_EQ_U(missing, 0);
  devbuf_allocator_stats_t s = stats_of(caching);
  CHECK_EQ_U(s.active, active);
  CHECK_EQ_U(s.live_buffers, n);
  CHECK_EQ_U(s.reserved, reserved);
  CHECK_EQ_U(s.segments, snapshot->segment_count);
  CHECK_EQ_U(s.cached, reserved - active);
  devbuf_allocator_snapshot_free(snapshot);
  free(all);
}

static void step(worker *w) {
  uint64_t r = next_random(&w->seed);
  if (w->live_count && (w->live_count == MAX_LIVE || r % 100 < 45)) {
    size_t i = (size_t)(next_random(&w->seed) % w->live_count);
    devbuf_memory_t memory = w->live[i];
    w->live[i] = w->live[--w->live_count];
    pthread_mutex_lock(&mailbox_lock);
    bool hand_over = r % 100 < 5 && mailbox_count < MAILBOX;
    if (hand_over) mailbox[mailbox_count++] = memory;
    pthread_mutex_unlock(&mailbox_lock);
    if (!hand_over) devbuf_allocator_free(caching, &memory);
    return;
  }
  if (r % 100 < 50) { // free a block another thread allocated
    pthread_mutex_lock(&mailbox_lock);
    bool have = mailbox_count > 0;
    devbuf_memory_t memory = have ? mailbox[--mailbox_count] : (devbuf_memory_t){0};
    pthread_mutex_unlock(&mailbox_lock);
    if (have) devbuf_allocator_free(caching, &memory);
    return;
  }
  // Mostly the trace's sizes; some tiny ones for the thread bins.
  size_t size = r % 100 < 70 ? sizes[next_random(&w->seed) % size_count]
                             : 1 + (size_t)(next_random(&w->seed) % 8192);
  devbuf_memory_t memory;
  if (devbuf_allocator_alloc(caching, size, &memory) == DEVBUF_OK)
    w->live[w->live_count++] = memory;
  else
    w->refused++;
}

static void *run_worker(void *arg) {
  worker *w = arg;
  for (int op = 1; op <= OPS_PER_THREAD; op++) {
    step(w);
    if (w == &workers[0] && op % 4096 == 0)
      devbuf_allocator_clear_cache(caching); // races the others

    if (op % CHECK_EVERY == 0) {
      if (pthread_barrier_wait(&barrier) == PTHREAD_BARRIER_SERIAL_THREAD) check_against_model();
      pthread_barrier_wait(&barrier);
    }
  }
  return NULL;
}

static void run_model(const devbuf_caching_options_t *options) {
  devbuf_device_t *device = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  address_space space = {.next = (uint64_t)1 << 40};
  devbuf_allocator_t *upstream = NULL;
  CHECK_OK(devbuf_allocator_create(device, &space_vtable, &space, &upstream));
  CHECK_OK(devbuf_caching_allocator_create(upstream, options, &caching));
  pthread_barrier_init(&barrier, NULL, THREADS);
  pthread_t threads[THREADS];
  for (int t = 0; t < THREADS; t++) {
    workers[t] = (worker){.seed = 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1)};
    pthread_create(&threads[t], NULL, run_worker, &workers[t]);
  }
  for (int t = 0; t < THREADS; t++) pthread_join(threads[t], NULL);
  pthread_barrier_destroy(&barrier);
  check_against_model();
  uint64_t refused = 0;
  for (int t = 0; t < THREADS; t++) {
    refused += workers[t].refused;
    for (size_t i = 0; i < workers[t].live_count; i++)
      devbuf_allocator_free(caching, &workers[t].live[i]);
  }
  while (mailbox_count) devbuf_allocator_free(caching, &mailbox[--mailbox_count]);
  devbuf_allocator_stats_t s = stats_of(caching);
  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.live_buffers, 0);
  CHECK_EQ_U(s.failed_allocs, refused);
  if (options && options->growable) { // a request may map more than one interior gap
    CHECK(s.cache_hits + refused <= s.alloc_calls);
    CHECK(s.alloc_calls <= s.cache_hits + s.system_allocs + refused);
  } else {
    CHECK_EQ_U(s.alloc_calls, s.cache_hits + s.system_allocs + refused);
  }
  devbuf_allocator_clear_cache(caching);
  CHECK_EQ_U(stats_of(caching).reserved, 0);
  CHECK_EQ_U(atomic_load(&space.held), 0); // nothing leaked upstream
  CHECK(s.system_frees > 0);
  CHECK(!options || !options->memory_limit || refused > 0);
  printf("  %llu refused, %llu system allocations, %llu frees\n", (unsigned long long)refused,
         (unsigned long long)s.system_allocs, (unsigned long long)s.system_frees);
  devbuf_allocator_release(caching);
  devbuf_allocator_release(upstream);
  devbuf_device_release(device);
}

static void test_four_threads(void) { run_model(NULL); }

// Under a memory limit the thread bins are off, idle segments go back all the time and some
// requests are refused.
static void test_four_threads_at_a_limit(void) {
  devbuf_caching_options_t options = {.memory_limit = (uint64_t)1 << 30};
  run_model(&options);
}

// Growable segments: one per pool and shard, mapped and unmapped at their ends meanwhile.
static void test_four_threads_growable(void) {
  devbuf_caching_options_t options = {.growable = 1};
  run_model(&options);
}

// A buffer-count limit of two with two threads that each hold one block at most: nothing is
// ever refused. (A check counted another thread's block twice, between its hand-out and
// its admission's end, and a thread's releases read after its hand-outs made its count
// wrap: thousands of refusals, messages naming 2^64 - 52 live buffers.)
typedef struct one_at_a_time {
  devbuf_allocator_t *allocator;
  int refused;
  char message[512];
} one_at_a_time;

static void *hold_one_at_a_time(void *arg) {
  one_at_a_time *run = arg;
  for (int i = 0; i < 100000; i++) {
    devbuf_memory_t memory;
    if (devbuf_allocator_alloc(run->allocator, 256, &memory) != DEVBUF_OK) {
      if (!run->refused++) snprintf(run->message, sizeof run->message, "%s", devbuf_last_error());
      continue;
    }
    devbuf_allocator_free(run->allocator, &memory);
  }
  return NULL;
}

static void test_buffer_count_limit_between_threads(void) {
  devbuf_device_t *device = NULL;
  devbuf_allocator_t *raw = NULL, *limited = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  devbuf_caching_options_t options = {.max_buffers = 2};
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &limited));
  one_at_a_time runs[2] = {{limited, 0, ""}, {limited, 0, ""}};
  pthread_t threads[2];
  for (int i = 0; i < 2; i++)
    CHECK(pthread_create(&threads[i], NULL, hold_one_at_a_time, &runs[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  for (int i = 0; i < 2; i++) {
    if (runs[i].refused)
      fprintf(stderr, "refused %d times: %s\n", runs[i].refused, runs[i].message);
    CHECK_EQ_U(runs[i].refused, 0);
  }
  devbuf_memory_t a, b, c;
  CHECK_OK(devbuf_allocator_alloc(limited, 256, &a));
  CHECK_OK(devbuf_allocator_alloc(limited, 256, &b));
  CHECK_STATUS(devbuf_allocator_alloc(limited, 256, &c), DEVBUF_OUT_OF_MEMORY);
  CHECK_MESSAGE("bytes active, "); // the figures of every refusal, then the limit
  CHECK_MESSAGE("and 2 buffers live and a buffer-count limit of 2");
  devbuf_allocator_free(limited, &a);
  devbuf_allocator_free(limited, &b);
  devbuf_allocator_release(limited);
  devbuf_allocator_release(raw);
  devbuf_device_release(device);
}

int main(void) {
  RUN(test_buffer_count_limit_between_threads);
  test_require_data();
  load_sizes();
  RUN(test_four_threads);
  RUN(test_four_threads_at_a_limit);
  RUN(test_four_threads_growable);
  free(sizes);
  return CHECK_EXIT();
}
