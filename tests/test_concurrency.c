// Concurrency: racing lazy allocation (one system allocation), and a 4-thread stress of
// random alloc/release/view/copy with buffers handed between threads. Run under TSan.
#include "check.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#define RACERS 8
#define ROUNDS 200

static test_allocators t;
static pthread_barrier_t barrier;
static devbuf_buffer_t *shared_buffer;
static uint64_t seen_address[RACERS];

static void *racer(void *arg) {
  size_t index = (size_t)arg;
  for (int round = 0; round < ROUNDS; round++) {
    pthread_barrier_wait(&barrier); // shared_buffer is fresh and lazy
    if (devbuf_buffer_ensure_allocated(shared_buffer) != DEVBUF_OK ||
        devbuf_buffer_device_ptr(shared_buffer, &seen_address[index]) != DEVBUF_OK)
      seen_address[index] = 0;
    pthread_barrier_wait(&barrier); // main checks and replaces the buffer
    pthread_barrier_wait(&barrier);
  }
  return NULL;
}

// Each round races on a fresh lazy buffer of a fresh allocator: exactly one allocation
// call and one system allocation, and every thread sees the same memory.
static void test_racing_ensure_allocated(void) {
  pthread_t threads[RACERS];
  pthread_barrier_init(&barrier, NULL, RACERS + 1);
  size_t size = 3 * 4096;
  t = test_allocators_open(NULL);
  CHECK_OK(devbuf_buffer_new(t.caching, DEVBUF_UINT8, &size, 1, 0, &shared_buffer));
  for (size_t i = 0; i < RACERS; i++) pthread_create(&threads[i], NULL, racer, (void *)i);
  for (int round = 0; round < ROUNDS; round++) {
    pthread_barrier_wait(&barrier);
    pthread_barrier_wait(&barrier);
    CHECK_EQ_U(stats_of(t.caching).alloc_calls, 1);
    CHECK_EQ_U(stats_of(t.raw).system_allocs, 1);
    for (int i = 1; i < RACERS; i++)
      CHECK(seen_address[i] == seen_address[0] && seen_address[0] != 0);
    devbuf_buffer_release(shared_buffer);
    test_allocators_close(&t);
    t = test_allocators_open(NULL);
    CHECK_OK(devbuf_buffer_new(t.caching, DEVBUF_UINT8, &size, 1, 0, &shared_buffer));
    pthread_barrier_wait(&barrier);
  }
  for (int i = 0; i < RACERS; i++) pthread_join(threads[i], NULL);
  devbuf_buffer_release(shared_buffer);
  pthread_barrier_destroy(&barrier);
  test_allocators_close(&t);
}

// ---- stress -------------------------------------------------------------------------

#define STRESS_THREADS 4
#define STRESS_OPS     100000
#define SLOTS          64
#define HELD           8

static _Atomic(devbuf_buffer_t *) exchange[SLOTS];
static atomic_int stress_errors;

static uint64_t next_random(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static size_t random_size(uint64_t *rng) {
  switch (next_random(rng) % 4) {
  case 0:
    return 1 + next_random(rng) % 256;
  case 1:
    return 1 + next_random(rng) % 4096;
  case 2:
    return 4096 + next_random(rng) % (64 * 1024);
  default:
    return 1 + next_random(rng) % 600000;
  }
}

// Every buffer's bytes are its storage id's low byte: a wrong reuse shows up as a wrong byte.
static unsigned char tag_of(devbuf_buffer_t *buffer) {
  return (unsigned char)(devbuf_buffer_storage_id(buffer) * 31u);
}

static void stress_error(const char *what) {
  atomic_fetch_add(&stress_errors, 1);
  fprintf(stderr, "stress: %s (%s)\n", what, devbuf_last_error());
}

static void verify(devbuf_buffer_t *buffer, unsigned char *scratch) {
  size_t size = devbuf_buffer_size(buffer);
  if (devbuf_buffer_copyout(buffer, scratch, size) != DEVBUF_OK) return stress_error("copyout");
  unsigned char tag = tag_of(buffer);
  for (size_t i = 0; i < size; i++)
    if (scratch[i] != tag) return stress_error("a buffer's bytes changed under it");
}

static devbuf_buffer_t *fresh(uint64_t *rng, unsigned char *scratch) {
  size_t size = random_size(rng);
  devbuf_buffer_t *buffer = NULL;
  if (devbuf_buffer_allocate(t.caching, DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK) {
    stress_error("allocate");
    return NULL;
  }
  memset(scratch, tag_of(buffer), size);
  if (devbuf_buffer_copyin(buffer, scratch, size) != DEVBUF_OK) stress_error("copyin");
  return buffer;
}

static void *stress_worker(void *arg) {
  uint64_t rng = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 1);
  unsigned char *scratch = malloc(600000);
  devbuf_buffer_t *held[HELD] = {0};
  for (int op = 0; op < STRESS_OPS; op++) {
    size_t slot = next_random(&rng) % HELD;
    devbuf_buffer_t **mine = &held[slot];
    switch (next_random(&rng) % 6) {
    case 0: // allocate (replacing what the slot held)
    case 1:
      devbuf_buffer_release(*mine);
      *mine = fresh(&rng, scratch);
      break;
    case 2: // release
      if (*mine) verify(*mine, scratch);
      devbuf_buffer_release(*mine);
      *mine = NULL;
      break;
    case 3: { // view: replace the buffer with a view of its second half
      if (!*mine || devbuf_buffer_size(*mine) < 2) break;
      size_t size = devbuf_buffer_size(*mine), half = size / 2;
      devbuf_buffer_t *view = NULL;
      if (devbuf_buffer_view(*mine, half, size - half, &view) != DEVBUF_OK) {
        stress_error("view");
        break;
      }
      devbuf_buffer_release(*mine);
      *mine = view;
      verify(view, scratch);
      break;
    }
    case 4: { // copy into a new buffer of the same tag pattern
      if (!*mine) break;
      size_t size = devbuf_buffer_size(*mine);
      devbuf_buffer_t *copy = NULL;
      if (devbuf_buffer_new(t.caching, DEVBUF_UINT8, &size, 1, 0, &copy) != DEVBUF_OK) {
        stress_error("new");
        break;
      }
      if (devbuf_buffer_copy_from(copy, *mine) != DEVBUF_OK) stress_error("copy_from");
      if (devbuf_buffer_copyout(copy, scratch, size) != DEVBUF_OK) stress_error("copyout of copy");
      unsigned char tag = tag_of(*mine);
      for (size_t i = 0; i < size; i++)
        if (scratch[i] != tag) {
          stress_error("copy_from produced other bytes");
          break;
        }
      devbuf_buffer_release(copy);
      break;
    }
    default: { // hand the buffer to another thread through the exchange
      devbuf_buffer_t *got = atomic_exchange(&exchange[next_random(&rng) % SLOTS], *mine);
      *mine = got;
      if (got) verify(got, scratch);
      break;
    }
    }
  }
  for (int i = 0; i < HELD; i++) devbuf_buffer_release(held[i]);
  free(scratch);
  return NULL;
}

static void test_stress(void) {
  t = test_allocators_open(NULL);
  pthread_t threads[STRESS_THREADS];
  for (size_t i = 0; i < STRESS_THREADS; i++)
    pthread_create(&threads[i], NULL, stress_worker, (void *)i);
  for (int i = 0; i < STRESS_THREADS; i++) pthread_join(threads[i], NULL);
  for (int i = 0; i < SLOTS; i++) devbuf_buffer_release(atomic_exchange(&exchange[i], NULL));
  CHECK_EQ_U(atomic_load(&stress_errors), 0);
  devbuf_allocator_stats_t s = stats_of(t.caching), raw = stats_of(t.raw);
  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.live_buffers, 0);
  CHECK_EQ_U(s.cached, raw.active); // every byte upstream holds is in the cache
  CHECK_EQ_U(s.system_allocs - s.system_frees, raw.live_buffers);
  CHECK(s.cache_hits > s.system_allocs); // the cache did its job
  CHECK_EQ_U(s.failed_allocs, 0);
  devbuf_allocator_clear_cache(t.caching);
  CHECK_EQ_U(stats_of(t.raw).active, 0);
  printf("stress: %llu calls, %llu cache hits, %llu system allocations\n",
         (unsigned long long)s.alloc_calls, (unsigned long long)s.cache_hits,
         (unsigned long long)s.system_allocs);
  test_allocators_close(&t);
}

// ---- limits under threads -------------------------------------------------------------

#define LIMIT_THREADS 4
#define LIMIT_OPS     40000

static atomic_bool limits_done;

// Random allocation and release straight on the caching allocator: with limits set every
// release goes to the shared pool, where other threads evict and free blocks.
static void *limited_worker(void *arg) {
  uint64_t rng = 0xD1B54A32D192ED03ull * ((uintptr_t)arg + 1);
  devbuf_memory_t held[HELD];
  bool live[HELD] = {false};
  for (int op = 0; op < LIMIT_OPS; op++) {
    size_t slot = next_random(&rng) % HELD;
    if (live[slot]) {
      devbuf_allocator_free(t.caching, &held[slot]);
      live[slot] = false;
    } else {
      live[slot] = devbuf_allocator_alloc(t.caching, random_size(&rng), &held[slot]) == DEVBUF_OK;
    }
  }
  for (int i = 0; i < HELD; i++)
    if (live[i]) devbuf_allocator_free(t.caching, &held[i]);
  return NULL;
}

// Changes the limits and clears the cache while the workers run.
static void *limit_changer(void *arg) {
  (void)arg;
  for (unsigned round = 0; !atomic_load(&limits_done); round++) {
    devbuf_caching_options_t options = {.cache_limit = (uint64_t)(64 + round % 7 * 96) << 10,
                                        .memory_limit = round % 3 ? 0 : (uint64_t)64 << 20};
    devbuf_caching_allocator_set_options(t.caching, &options);
    if (round % 5 == 0) devbuf_allocator_clear_cache(t.caching);
    sched_yield();
  }
  return NULL;
}

// Blocks that other threads evict are never touched after they are handed to the cache
// (ASan and TSan check it), and the figures add up when everything is back.
static void test_limits_under_threads(void) {
  devbuf_caching_options_t options = {.cache_limit = 128 << 10};
  t = test_allocators_open(&options);
  atomic_store(&limits_done, false);
  pthread_t workers[LIMIT_THREADS], changer;
  for (size_t i = 0; i < LIMIT_THREADS; i++)
    pthread_create(&workers[i], NULL, limited_worker, (void *)i);
  pthread_create(&changer, NULL, limit_changer, NULL);
  for (int i = 0; i < LIMIT_THREADS; i++) pthread_join(workers[i], NULL);
  atomic_store(&limits_done, true);
  pthread_join(changer, NULL);
  devbuf_allocator_stats_t s = stats_of(t.caching), raw = stats_of(t.raw);
  CHECK_EQ_U(s.active, 0);
  CHECK_EQ_U(s.live_buffers, 0);
  CHECK_EQ_U(s.cached, raw.active);
  CHECK_EQ_U(s.system_allocs - s.system_frees, raw.live_buffers);
  devbuf_allocator_clear_cache(t.caching);
  CHECK_EQ_U(stats_of(t.raw).active, 0);
  test_allocators_close(&t);
}

int main(void) {
  RUN(test_racing_ensure_allocated);
  RUN(test_stress);
  RUN(test_limits_under_threads);
  return CHECK_EXIT();
}
