// The debug validators (a build with DEVBUF_DEBUG_CHECKS, as the sanitizer suites are):
// memory handed out and taken back carries poison bytes, and a broken invariant of the
// caching allocator, the hazard tracker or a queue aborts with its name instead of going on.
#include "check.h"

#include "../src/core/hazard.h"
#include "../src/exec/queue.h"
#include "../src/memory/caching/caching.h"

#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

#if DEVBUF_DEBUG_CHECKS
static devbuf_allocator_t *own_cpu_caching(devbuf_allocator_t **out_raw) {
  devbuf_device_t *cpu = NULL;
  devbuf_allocator_t *raw = NULL, *caching = NULL;
  CHECK_OK(devbuf_device_open("cpu", &cpu));
  CHECK_OK(devbuf_device_raw_allocator(cpu, &raw));
  devbuf_caching_options_t options = {.page_size = 4096,
                                      .memory_limit = 64 << 20}; // limits: no thread bins
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &caching));
  devbuf_device_release(cpu);
  *out_raw = raw;
  return caching;
}

static bool all_bytes(const void *data, size_t size, unsigned char byte) {
  const unsigned char *p = data;
  for (size_t i = 0; i < size; i++)
    if (p[i] != byte) return false;
  return true;
}

static void test_poison_over_handed_out_and_released_memory(void) {
  devbuf_allocator_t *raw = NULL, *caching = own_cpu_caching(&raw);
  devbuf_memory_t a = {0}, b = {0};
  CHECK_OK(devbuf_allocator_alloc(caching, 8192, &a));
  CHECK(all_bytes(a.host, a.size, POISON_HANDED_OUT));
  memset(a.host, 0x11, a.size);
  void *kept = a.host; // the cache still holds these bytes after the free
  devbuf_allocator_free(caching, &a);
  CHECK(all_bytes(kept, 8192, POISON_RELEASED));
  CHECK_OK(devbuf_allocator_alloc(caching, 8192, &b));
  CHECK(b.host == kept);
  CHECK(all_bytes(b.host, b.size, POISON_HANDED_OUT)); // not the 0x11 written before
  devbuf_allocator_free(caching, &b);
  devbuf_allocator_release(caching);
  devbuf_allocator_release(raw);
}

static void test_broken_invariants_abort(void) {
  fflush(NULL);
  int pipe_ends[2];
  CHECK(pipe(pipe_ends) == 0);
  pid_t child = fork();
  if (child == 0) {
    dup2(pipe_ends[1], STDERR_FILENO);
    devbuf_allocator_t *raw = NULL, *caching = own_cpu_caching(&raw);
    devbuf_memory_t a = {0}, b = {0};
    devbuf_allocator_alloc(caching, 4096, &a);
    devbuf_allocator_alloc(caching, 4096, &b);
    ((cblock *)a.token)->size += 512; // the blocks no longer tile their segment
    devbuf_allocator_snapshot_t *snapshot = NULL;
    devbuf_allocator_snapshot(caching, &snapshot); // validates first
    _exit(0);                                      // not reached
  }
  close(pipe_ends[1]);
  char text[512] = {0};
  size_t used = 0;
  ssize_t got;
  while (used < sizeof text - 1 &&
         (got = read(pipe_ends[0], text + used, sizeof text - 1 - used)) > 0)
    used += (size_t)got;
  close(pipe_ends[0]);
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  CHECK(strstr(text, "caching allocator invariant broken: segment") != NULL);
}

// Runs `body` in a child whose stderr comes back in `text`; true if it died of SIGABRT.
static bool aborts(void (*body)(void), char *text, size_t capacity) {
  fflush(NULL);
  int pipe_ends[2];
  if (pipe(pipe_ends) != 0) return false;
  pid_t child = fork();
  if (child == 0) {
    dup2(pipe_ends[1], STDERR_FILENO);
    body();
    _exit(0);
  }
  close(pipe_ends[1]);
  size_t used = 0;
  ssize_t got;
  while (used < capacity - 1 && (got = read(pipe_ends[0], text + used, capacity - 1 - used)) > 0)
    used += (size_t)got;
  text[used] = '\0';
  close(pipe_ends[0]);
  int status = 0;
  return waitpid(child, &status, 0) == child && WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void fence_noop(devbuf__fence *fence) { (void)fence; }
static const devbuf__fence_ops noop_ops = {fence_noop, fence_noop};

static void corrupt_a_hazard_record(void) {
  devbuf__hazard *hazard = devbuf__hazard_create();
  static struct fenced_record { // as in a work item: the record finds the fence by its distance
    devbuf__fence fence;
    devbuf__record record;
  } item;
  item.fence = (devbuf__fence){.ops = &noop_ops, .queue = (devbuf_queue_t *)(uintptr_t)0x1000};
  devbuf__ref_init(&item.fence.refs, 1);
  item.record = (devbuf__record){.fence_distance = offsetof(struct fenced_record, record),
                                 .offset = 64,
                                 .size = 64,
                                 .write = true};
  devbuf__dep *deps = NULL;
  uint32_t count = 0, capacity = 0;
  devbuf__hazard_add(hazard, &item.record, item.fence.queue, &deps, &count, &capacity);
  item.record.size = 4096;                     // now outside the range its list covers
  devbuf__hazard_remove(hazard, &item.record); // validates first
}

static void test_broken_hazard_records_abort(void) {
  char text[512];
  CHECK(aborts(corrupt_a_hazard_record, text, sizeof text));
  CHECK(strstr(text, "hazard tracker invariant broken: a record lies outside the range") != NULL);
}

// A work item whose use is tracked by a record that is not its own, as the worker takes it;
// and one that retires with its record still in a tracker.
static devbuf__work *item_with_a_foreign_record(void) {
  devbuf_device_t *cpu = NULL;
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_device_open("cpu", &cpu));
  CHECK_OK(devbuf_queue_create(cpu, &queue));
  devbuf__work *work = devbuf__work_new(queue, DEVBUF__WORK_FILL, 1, 4);
  devbuf__work_operands(work)[0] = (devbuf__operand){.offset = 0, .size = 64};
  work->uses[0].record = (devbuf__record){.segment = (devbuf__segment *)(uintptr_t)0x1000,
                                          .fence_distance = 8, // never dereferenced
                                          .offset = 0,
                                          .size = 64};
  return work;
}

static void take_a_corrupted_item(void) {
  devbuf__work *work = item_with_a_foreign_record();
  devbuf__queue_validate_taken(work->fence.queue, &work, 1);
}

static void retire_a_tracked_item(void) {
  devbuf__work *work = item_with_a_foreign_record();
  devbuf__queue_validate_retiring(work->fence.queue, &work, 1);
}

static void test_broken_queue_items_abort(void) {
  char text[512];
  CHECK(aborts(take_a_corrupted_item, text, sizeof text));
  CHECK(strstr(text, "queue invariant broken: a use is tracked by another item's record") != NULL);
  CHECK(aborts(retire_a_tracked_item, text, sizeof text));
  CHECK(strstr(text,
               "queue invariant broken: a retiring item's use still has its record in a tracker") !=
        NULL);
}
#endif

int main(void) {
#if !DEVBUF_DEBUG_CHECKS
  printf("SKIP: built without DEVBUF_DEBUG_CHECKS (the sanitizer suites of scripts/test.sh build "
         "with it)\n");
  return SKIP_EXIT_CODE;
#else
  RUN(test_poison_over_handed_out_and_released_memory);
  RUN(test_broken_invariants_abort);
  RUN(test_broken_hazard_records_abort);
  RUN(test_broken_queue_items_abort);
  return CHECK_EXIT();
#endif
}
