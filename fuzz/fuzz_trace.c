// libFuzzer target: any bytes as a trace for devbuf_trace_replay, played against devbuf's
// caching allocator (page, growable segments and memory limit chosen by the first byte) or the
// tool's model of PyTorch's, over an upstream that holds no memory and counts what it lends.
// The replay either refuses with a message or plays the trace through. Along the way every
// block tiles its segment, what the allocator says it reserves is what the upstream lent, and
// a memory limit is never passed; at the end nothing is active, and clear_cache gives every
// byte back.
#include "counting_upstream.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const uint64_t pages[4] = {4096, 65536, 2u << 20, 1u << 30};

typedef struct replay_check {
  devbuf_allocator_t *allocator;
  const devbuf_counting_upstream *counts;
  uint64_t limit;
  bool devbuf_policy;
  unsigned records;
} replay_check;

static void check_tiling(devbuf_allocator_t *allocator) {
  devbuf_allocator_snapshot_t *snapshot = NULL;
  if (devbuf_allocator_snapshot(allocator, &snapshot) != DEVBUF_OK) abort();
  for (size_t s = 0; s < snapshot->segment_count; s++) {
    const devbuf_snapshot_segment_t *segment = &snapshot->segments[s];
    uint64_t at = 0;
    for (size_t b = 0; b < segment->block_count; b++) {
      if (segment->blocks[b].offset != at || segment->blocks[b].size == 0) abort();
      at += segment->blocks[b].size;
    }
    if (at != segment->size) abort();
  }
  devbuf_allocator_snapshot_free(snapshot);
}

static void after_record(void *context, uint64_t id, uint64_t size, int refused) {
  (void)id, (void)size, (void)refused;
  replay_check *check = context;
  if (check->limit && check->counts->held > check->limit) abort();
  if (!check->devbuf_policy) return;
  devbuf_allocator_stats_t stats;
  devbuf_allocator_stats(check->allocator, &stats);
  if (stats.reserved != check->counts->held) abort();
  if (check->records++ % 16 == 0) check_tiling(check->allocator);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static devbuf_device_t *cpu;
  if (!cpu && devbuf_device_open("cpu", &cpu) != DEVBUF_OK) abort();
  if (size < 1) return 0;
  uint8_t choice = data[0];
  data++, size--;
  int fd = memfd_create("fuzz-trace", MFD_CLOEXEC);
  if (fd < 0 || (size && write(fd, data, size) != (ssize_t)size)) abort();
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);

  bool devbuf_policy = !(choice & 0x20);
  devbuf_caching_options_t options = {.page_size = pages[choice & 3],
                                      .growable = (choice >> 2) & 1};
  // A limit of 1 to 64 MiB, where most fuzzed traces run into it.
  if (choice & 0x08) options.memory_limit = (uint64_t)((choice >> 6) * 21 + 1) << 20;
  if (!devbuf_policy) options.page_size = 2u << 20;
  devbuf_counting_upstream counts = {0};
  devbuf_allocator_t *allocator = NULL;
  devbuf_status status = devbuf_tool_counting_policy(
      cpu, devbuf_policy ? DEVBUF_TOOL_POLICY_DEVBUF : DEVBUF_TOOL_POLICY_CCA, &options, &counts,
      &allocator);
  if (status != DEVBUF_OK) abort();
  replay_check check = {allocator, &counts, options.memory_limit, devbuf_policy, 0};
  devbuf_trace_summary_t summary;
  status = devbuf_trace_replay_observed(path, allocator, after_record, &check, &summary);
  if (status != DEVBUF_OK && status != DEVBUF_FORMAT_ERROR && status != DEVBUF_UNSUPPORTED) abort();
  if (status != DEVBUF_OK && devbuf_last_error()[0] == '\0') abort();
  devbuf_allocator_stats_t stats;
  devbuf_allocator_stats(allocator, &stats);
  if (stats.active != 0) abort(); // the replay frees what it played, refused or not
  if (devbuf_policy) check_tiling(allocator);
  devbuf_allocator_clear_cache(allocator); // either policy: every segment is free by now
  if (counts.held != 0) abort();
  devbuf_allocator_release(allocator);
  if (counts.held != 0) abort();
  close(fd);
  return 0;
}
