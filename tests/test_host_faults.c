// SQLite's out-of-memory loop over devbuf's own host memory: for each workload, fail the 1st
// host allocation, then the 2nd, ... until a run makes no failure happen, once (only that
// allocation fails) and persistently (it and every later one fail). Every failure must come
// out as a clean status with a message (or be absorbed: the workload still succeeds), leave
// no allocation behind, and the next run without faults must work.
#include "check.h"
#include "../src/interop/dlpack_abi.h"
#include "../src/exec/queue.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#ifndef DEVBUF_SCRATCH
#define DEVBUF_SCRATCH "."
#endif

typedef struct fault_state {
  atomic_uint_fast64_t calls;   // allocations asked for since arming
  atomic_uint_fast64_t fail_at; // 0: none fails
  atomic_bool persistent;
  atomic_uint_fast64_t fired;
  atomic_int_fast64_t live; // allocations not yet freed
} fault_state;

static fault_state faults;

static bool should_fail(void) {
  uint64_t fail_at = atomic_load(&faults.fail_at);
  if (!fail_at) return false;
  uint64_t call = atomic_fetch_add(&faults.calls, 1) + 1;
  if (call == fail_at || (call > fail_at && atomic_load(&faults.persistent))) {
    atomic_fetch_add(&faults.fired, 1);
    return true;
  }
  return false;
}

static void *hook_malloc(void *ctx, size_t size) {
  (void)ctx;
  if (should_fail()) return NULL;
  void *p = malloc(size);
  if (p) atomic_fetch_add(&faults.live, 1);
  return p;
}

static void *hook_calloc(void *ctx, size_t count, size_t size) {
  (void)ctx;
  if (should_fail()) return NULL;
  void *p = calloc(count, size);
  if (p) atomic_fetch_add(&faults.live, 1);
  return p;
}

static void *hook_realloc(void *ctx, void *pointer, size_t size) {
  (void)ctx;
  if (should_fail()) return NULL; // the old block stays the caller's
  void *p = realloc(pointer, size);
  if (p && !pointer) atomic_fetch_add(&faults.live, 1);
  return p;
}

static void hook_free(void *ctx, void *pointer) {
  (void)ctx;
  if (pointer) atomic_fetch_sub(&faults.live, 1);
  free(pointer);
}

static void arm(uint64_t fail_at, bool persistent) {
  atomic_store(&faults.calls, 0);
  atomic_store(&faults.fired, 0);
  atomic_store(&faults.persistent, persistent);
  atomic_store(&faults.fail_at, fail_at);
}

static void disarm(void) { atomic_store(&faults.fail_at, 0); }

// Queues' workers finish their last frees just after their queue goes: wait for the count.
// The work items kept for reuse are freed first (how many a run leaves there depends on
// timing).
static int64_t settled_live(int64_t expected) {
  devbuf__work_pool_trim();
  for (int i = 0; i < 2000 && atomic_load(&faults.live) != expected; i++) {
    usleep(500);
    devbuf__work_pool_trim();
  }
  return atomic_load(&faults.live);
}

// ---- workloads: each cleans up whatever it made, whatever failed --------------------------

#define TRY(expr)                             \
  do {                                        \
    if (status == DEVBUF_OK) status = (expr); \
  } while (0)

static devbuf_status buffers_workload(void) {
  devbuf_status status = DEVBUF_OK;
  devbuf_device_t *cpu = NULL;
  devbuf_buffer_t *buffer = NULL, *view = NULL, *shaped = NULL, *copy = NULL;
  float data[256], back[256];
  for (int i = 0; i < 256; i++) data[i] = (float)i;
  size_t shape[] = {16, 16}, flat[] = {256};
  TRY(devbuf_device_open("cpu", &cpu));
  TRY(devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_FLOAT32, shape, 2, 0, &buffer));
  TRY(devbuf_buffer_copyin(buffer, data, sizeof data));
  TRY(devbuf_buffer_view(buffer, 64, 256, &view));
  TRY(devbuf_buffer_reshape(buffer, DEVBUF_FLOAT32, flat, 1, &shaped));
  TRY(devbuf_buffer_new(devbuf_device_allocator(cpu), DEVBUF_FLOAT32, shape, 2, DEVBUF_BUFFER_ZERO,
                        &copy));
  TRY(devbuf_buffer_copy_from(copy, shaped));
  TRY(devbuf_buffer_copyout(copy, back, sizeof back));
  if (status == DEVBUF_OK && memcmp(back, data, sizeof data) != 0) status = DEVBUF_DEVICE_FAILURE;
  const void *contents = NULL;
  TRY(devbuf_buffer_contents(view, &contents, NULL));
  if (contents) CHECK_OK(devbuf_buffer_end_access(view, contents));
  devbuf_buffer_release(copy);
  devbuf_buffer_release(shaped);
  devbuf_buffer_release(view);
  devbuf_buffer_release(buffer);
  devbuf_device_release(cpu);
  return status;
}

static devbuf_status caching_workload(void) {
  devbuf_status status = DEVBUF_OK;
  devbuf_device_t *cpu = NULL;
  devbuf_allocator_t *raw = NULL, *caching = NULL;
  devbuf_memory_t blocks[12];
  size_t count = 0;
  TRY(devbuf_device_open("cpu", &cpu));
  TRY(devbuf_device_raw_allocator(cpu, &raw));
  devbuf_caching_options_t options = {.page_size = 4096};
  TRY(devbuf_caching_allocator_create(raw, &options, &caching));
  static const size_t sizes[] = {100, 5000, 1 << 20, 3 << 20, 12 << 20, 700, 64 << 10, 2 << 20};
  for (size_t i = 0; status == DEVBUF_OK && i < sizeof sizes / sizeof sizes[0]; i++) {
    TRY(devbuf_allocator_alloc(caching, sizes[i], &blocks[count]));
    if (status == DEVBUF_OK) count++;
    if (status == DEVBUF_OK && i % 3 == 2) devbuf_allocator_free(caching, &blocks[--count]);
  }
  devbuf_allocator_snapshot_t *snapshot = NULL;
  TRY(devbuf_allocator_snapshot(caching, &snapshot));
  devbuf_allocator_snapshot_free(snapshot);
  devbuf_allocator_stats_t stats;
  TRY(devbuf_allocator_stats(caching, &stats));
  while (count) devbuf_allocator_free(caching, &blocks[--count]);
  devbuf_allocator_clear_cache(caching);
  devbuf_allocator_release(caching);
  devbuf_allocator_release(raw);
  devbuf_device_release(cpu);
  return status;
}

// Signals an event a little later, from a thread of its own: the submissions before then
// may block until it comes (an allocation for work that finds no host memory to reuse
// in-flight bytes waits for their work instead).
static void *signal_later(void *event) {
  usleep(2000);
  devbuf_event_signal(event, 1);
  return NULL;
}

static devbuf_status queue_workload(void) {
  devbuf_status status = DEVBUF_OK;
  devbuf_device_t *cpu = NULL;
  devbuf_queue_t *queue = NULL, *other = NULL;
  devbuf_event_t *event = NULL;
  devbuf_buffer_t *a = NULL, *b = NULL;
  size_t shape[] = {4096};
  TRY(devbuf_device_open("cpu", &cpu));
  TRY(devbuf_queue_create(cpu, &queue));
  TRY(devbuf_queue_create(cpu, &other));
  TRY(devbuf_event_create(0, &event));
  TRY(devbuf_buffer_new(devbuf_device_allocator(cpu), DEVBUF_INT32, shape, 1, 0, &a));
  TRY(devbuf_buffer_new(devbuf_device_allocator(cpu), DEVBUF_INT32, shape, 1, 0, &b));
  int32_t pattern = 7;
  TRY(devbuf_queue_fill(queue, a, &pattern, sizeof pattern));
  TRY(devbuf_queue_signal(queue, event, 1));
  TRY(devbuf_queue_wait(other, event, 1));
  TRY(devbuf_queue_copy(other, b, a)); // also ordered by the tracker
  // Memory released while its work waits is reused by work of another queue, which then
  // depends on the earlier owner's work.
  devbuf_event_t *hold = NULL;
  devbuf_buffer_t *released = NULL, *reused = NULL;
  size_t big[] = {64 << 10};
  TRY(devbuf_event_create(0, &hold));
  TRY(devbuf_buffer_new(devbuf_device_allocator(cpu), DEVBUF_INT32, big, 1, 0, &released));
  TRY(devbuf_queue_wait(queue, hold, 1));
  TRY(devbuf_queue_fill(queue, released, &pattern, sizeof pattern));
  devbuf_buffer_release(released); // in flight
  pthread_t signaller;
  bool signalling = hold && pthread_create(&signaller, NULL, signal_later, hold) == 0;
  if (hold && !signalling) CHECK_OK(devbuf_event_signal(hold, 1));
  TRY(devbuf_buffer_new(devbuf_device_allocator(cpu), DEVBUF_INT32, big, 1, 0, &reused));
  TRY(devbuf_queue_fill(other, reused, &pattern, sizeof pattern));
  if (signalling) pthread_join(signaller, NULL);
  TRY(devbuf_queue_finish(other));
  TRY(devbuf_queue_finish(queue));
  devbuf_buffer_release(reused);
  devbuf_event_release(hold);
  if (status == DEVBUF_OK) {
    int32_t back[4096];
    status = devbuf_buffer_copyout(b, back, sizeof back);
    if (status == DEVBUF_OK && back[4095] != 7) status = DEVBUF_DEVICE_FAILURE;
  }
  if (queue) devbuf_queue_finish(queue); // whatever was submitted before a failure
  if (other) devbuf_queue_finish(other);
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
  devbuf_event_release(event);
  devbuf_queue_release(other);
  devbuf_queue_release(queue);
  devbuf_device_release(cpu);
  return status;
}

static devbuf_status files_workload(void) {
  devbuf_status status = DEVBUF_OK;
  devbuf_device_t *cpu = NULL;
  devbuf_buffer_t *weights = NULL, *bias = NULL, *mapped = NULL;
  devbuf_tensor_file_t *loaded = NULL, *copied = NULL, *inspected = NULL;
  size_t shape[] = {8, 8}, bias_shape[] = {8};
  char path[512];
  snprintf(path, sizeof path, "%s/host-faults.safetensors", DEVBUF_SCRATCH);
  TRY(devbuf_device_open("cpu", &cpu));
  TRY(devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_FLOAT32, shape, 2,
                             DEVBUF_BUFFER_ZERO, &weights));
  TRY(devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_INT64, bias_shape, 1,
                             DEVBUF_BUFFER_ZERO, &bias));
  if (status == DEVBUF_OK) {
    devbuf_named_buffer_t tensors[] = {{"weights", weights}, {"bias", bias}};
    devbuf_metadata_entry_t metadata[] = {{"format", "pt"}};
    status = devbuf_safetensors_write(path, tensors, 2, metadata, 1);
  }
  TRY(devbuf_safetensors_load(cpu, path, NULL, &loaded));
  devbuf_load_options_t copy = {.flags = DEVBUF_LOAD_COPY};
  TRY(devbuf_safetensors_load(cpu, path, &copy, &copied));
  TRY(devbuf_safetensors_inspect(path, &inspected));
  size_t index = 0;
  TRY(devbuf_tensor_file_find(loaded, "bias", &index));
  TRY(devbuf_buffer_map_file(cpu, path, &mapped));
  devbuf_tensor_file_release(inspected);
  devbuf_tensor_file_release(copied);
  devbuf_tensor_file_release(loaded);
  devbuf_buffer_release(mapped);
  devbuf_buffer_release(bias);
  devbuf_buffer_release(weights);
  devbuf_device_release(cpu);
  return status;
}

static devbuf_status dlpack_workload(void) {
  devbuf_status status = DEVBUF_OK;
  devbuf_device_t *cpu = NULL;
  devbuf_buffer_t *buffer = NULL, *imported = NULL;
  struct DLManagedTensorVersioned *tensor = NULL;
  size_t shape[] = {3, 4};
  TRY(devbuf_device_open("cpu", &cpu));
  TRY(devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_UINT16, shape, 2, 0, &buffer));
  TRY(devbuf_buffer_to_dlpack_versioned(buffer, DEVBUF_DLPACK_READ_ONLY, &tensor));
  if (status == DEVBUF_OK) {
    status = devbuf_buffer_from_dlpack_versioned(tensor, &imported);
    if (status != DEVBUF_OK) tensor->deleter(tensor); // ownership stayed here
  }
  devbuf_buffer_release(imported);
  devbuf_buffer_release(buffer);
  devbuf_device_release(cpu);
  return status;
}

static devbuf_status trace_workload(void) {
  devbuf_status status = DEVBUF_OK;
  devbuf_device_t *cpu = NULL;
  devbuf_allocator_t *raw = NULL, *caching = NULL, *traced = NULL;
  char path[512];
  snprintf(path, sizeof path, "%s/host-faults.trace", DEVBUF_SCRATCH);
  TRY(devbuf_device_open("cpu", &cpu));
  TRY(devbuf_device_raw_allocator(cpu, &raw));
  TRY(devbuf_caching_allocator_create(raw, NULL, &caching));
  TRY(devbuf_trace_adaptor_create(caching, path, &traced));
  devbuf_memory_t a = {0}, b = {0};
  TRY(devbuf_allocator_alloc(traced, 1000, &a));
  TRY(devbuf_allocator_alloc(traced, 3 << 20, &b));
  if (a.size) devbuf_allocator_free(traced, &a);
  if (b.size) devbuf_allocator_free(traced, &b);
  devbuf_allocator_release(traced);
  devbuf_trace_summary_t summary;
  TRY(devbuf_trace_replay(path, caching, &summary));
  if (status == DEVBUF_OK && summary.allocs != 2) status = DEVBUF_FORMAT_ERROR;
  devbuf_allocator_release(caching);
  devbuf_allocator_release(raw);
  devbuf_device_release(cpu);
  return status;
}

// A GPU backend's own bookkeeping (OpenCL on PoCL, CUDA on the stand-in driver).
static const char *gpu_spec;

static devbuf_status gpu_workload(void) {
  devbuf_status status = DEVBUF_OK;
  devbuf_device_t *gpu = NULL;
  devbuf_queue_t *queue = NULL;
  devbuf_buffer_t *a = NULL, *b = NULL;
  size_t shape[] = {1024};
  TRY(devbuf_device_open(gpu_spec, &gpu));
  TRY(devbuf_queue_create(gpu, &queue));
  TRY(devbuf_buffer_new(devbuf_device_allocator(gpu), DEVBUF_INT32, shape, 1, 0, &a));
  TRY(devbuf_buffer_new(devbuf_device_allocator(gpu), DEVBUF_INT32, shape, 1, 0, &b));
  int32_t pattern = 3, back[1024];
  TRY(devbuf_queue_fill(queue, a, &pattern, sizeof pattern));
  TRY(devbuf_queue_copy(queue, b, a));
  TRY(devbuf_queue_finish(queue));
  TRY(devbuf_buffer_copyout(b, back, sizeof back));
  if (status == DEVBUF_OK && back[1023] != 3) status = DEVBUF_DEVICE_FAILURE;
  TRY(devbuf_buffer_copyin(a, back, sizeof back));
  if (queue) devbuf_queue_finish(queue);
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
  devbuf_queue_release(queue);
  devbuf_device_release(gpu);
  return status;
}

// ---- the loop -------------------------------------------------------------------------------

typedef struct workload {
  const char *name;
  devbuf_status (*run)(void);
} workload;

typedef struct run_result {
  const workload *w;
  devbuf_status status;
  char message[512];
} run_result;

static void *run_thread(void *context) {
  run_result *result = context;
  result->status = result->w->run();
  snprintf(result->message, sizeof result->message, "%s", devbuf_last_error());
  return NULL;
}

// Runs a workload on a thread of its own: a thread's caches of devbuf's allocators are freed
// when it exits, so every run ends with the same host memory held.
static devbuf_status run_alone(const workload *w, char *message, size_t capacity) {
  run_result result = {.w = w};
  pthread_t thread;
  if (pthread_create(&thread, NULL, run_thread, &result) != 0) return DEVBUF_UNAVAILABLE;
  pthread_join(thread, NULL);
  snprintf(message, capacity, "%s", result.message);
  return result.status;
}

static void faults_loop(const workload *w, bool persistent) {
  int64_t live = settled_live(atomic_load(&faults.live));
  uint64_t failures = 0, absorbed = 0;
  for (uint64_t n = 1;; n++) {
    char message[512];
    arm(n, persistent);
    devbuf_status status = run_alone(w, message, sizeof message);
    disarm();
    uint64_t fired = atomic_load(&faults.fired);
    int64_t after = settled_live(live);
    if (after != live) {
      fprintf(stderr,
              "%s: failing host allocation %llu%s leaked %lld allocation(s) (status %s: %s)\n",
              w->name, (unsigned long long)n, persistent ? " on" : "", (long long)(after - live),
              devbuf_status_name(status), message);
      check_failures++;
      atomic_store(&faults.live, live); // count the next step on its own
    }
    if (!fired) { // the workload makes fewer than n host allocations: done
      CHECK_OK(status);
      printf("%-9s %s: %llu host allocations, %llu refusals came out as statuses, %llu absorbed\n",
             w->name, persistent ? "persistent" : "once      ", (unsigned long long)(n - 1),
             (unsigned long long)failures, (unsigned long long)absorbed);
      return;
    }
    if (status != DEVBUF_OK) {
      failures++;
      if (!message[0]) {
        fprintf(stderr, "%s: failing host allocation %llu gave %s without a message\n", w->name,
                (unsigned long long)n, devbuf_status_name(status));
        check_failures++;
      }
    } else {
      absorbed++;
    }
    // The next call works.
    devbuf_status again = run_alone(w, message, sizeof message);
    if (again != DEVBUF_OK) {
      fprintf(stderr, "%s: after failing host allocation %llu%s, the next run failed: %s %s\n",
              w->name, (unsigned long long)n, persistent ? " on" : "", devbuf_status_name(again),
              message);
      check_failures++;
    }
    if (n > 100000) {
      fprintf(stderr, "%s: no end to host allocations\n", w->name);
      check_failures++;
      return;
    }
  }
}

static const workload workloads[] = {
    {"buffers", buffers_workload}, {"caching", caching_workload}, {"queue", queue_workload},
    {"files", files_workload},     {"dlpack", dlpack_workload},   {"trace", trace_workload},
};

static void test_every_host_allocation_can_fail(void) {
  for (size_t i = 0; i < sizeof workloads / sizeof workloads[0]; i++) {
    char message[512];
    CHECK_OK(
        run_alone(&workloads[i], message, sizeof message)); // warm: lazily made global state exists
    faults_loop(&workloads[i], false);
    faults_loop(&workloads[i], true);
  }
}

static void test_gpu_backends(void) {
  static const char *specs[] = {"opencl:0", "cuda:0"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    gpu_spec = specs[i];
    workload w = {specs[i], gpu_workload};
    char message[512];
    devbuf_status warm = run_alone(&w, message, sizeof message);
    if (warm == DEVBUF_UNAVAILABLE || warm == DEVBUF_NOT_FOUND) {
      printf("%-9s skipped: %s\n", specs[i], message);
      continue;
    }
    CHECK_OK(warm);
    faults_loop(&w, false);
    faults_loop(&w, true);
  }
}

static void test_hooks_are_checked(void) {
  devbuf_host_memory_hooks_t missing = {
      .malloc = hook_malloc, .calloc = hook_calloc, .realloc = hook_realloc};
  CHECK_STATUS(devbuf_set_host_memory_hooks(&missing), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("free is NULL");
}

int main(void) {
  devbuf_host_memory_hooks_t hooks = {hook_malloc, hook_calloc, hook_realloc, hook_free, NULL};
  if (devbuf_set_host_memory_hooks(&hooks) != DEVBUF_OK) return 1; // before any other call
  RUN(test_hooks_are_checked);
  RUN(test_every_host_allocation_can_fail);
  RUN(test_gpu_backends);
  return CHECK_EXIT();
}
