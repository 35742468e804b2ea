// The bisection of least_limit.h.
#include "least_limit.h"

#include <stdbool.h>

// One replay under `limit` (0: none): whether it refused anything, its peaks.
static devbuf_status replay_under(devbuf_device_t *device, devbuf_tool_policy policy,
                                  const devbuf_caching_options_t *options, const char *path,
                                  uint64_t limit, devbuf_tool_least_limit *progress,
                                  bool *out_refused, uint64_t *out_peak_held,
                                  uint64_t *out_peak_live) {
  devbuf_caching_options_t limited = options ? *options : (devbuf_caching_options_t){0};
  limited.memory_limit = limit;
  devbuf_counting_upstream counts = {0};
  devbuf_allocator_t *allocator = NULL;
  devbuf_trace_summary_t summary = {0};
  devbuf_status status = devbuf_tool_counting_policy(device, policy, &limited, &counts, &allocator);
  if (status == DEVBUF_OK) status = devbuf_trace_replay(path, allocator, &summary);
  devbuf_allocator_release(allocator);
  progress->replays++;
  *out_refused = summary.failed_allocs != 0;
  if (out_peak_held) *out_peak_held = counts.peak_held;
  if (out_peak_live) *out_peak_live = summary.peak_live_bytes;
  return status;
}

devbuf_status devbuf_tool_find_least_limit(devbuf_device_t *device, devbuf_tool_policy policy,
                                           const devbuf_caching_options_t *options,
                                           const char *path, devbuf_tool_least_limit *out) {
  *out = (devbuf_tool_least_limit){0};
  bool refused;
  uint64_t peak_live = 0;
  devbuf_status status =
      replay_under(device, policy, options, path, 0, out, &refused, &out->peak_free, &peak_live);
  if (status != DEVBUF_OK || out->peak_free == 0) return status; // nothing to hold
  // Below what the program has live at once every policy refuses; at the unlimited peak,
  // none should (a policy that still does gets more room, doubling).
  uint64_t low = peak_live ? peak_live - 1 : 0, high = out->peak_free;
  for (int tries = 0;; tries++) {
    status = replay_under(device, policy, options, path, high, out, &refused, NULL, NULL);
    if (status != DEVBUF_OK) return status;
    if (!refused) break;
    if (tries == 8 || high > UINT64_MAX / 2) { // no limit found: report the unlimited peak
      out->bytes = 0;
      return DEVBUF_OK;
    }
    low = high;
    high *= 2;
  }
  while (high - low > 1) {
    uint64_t middle = low + (high - low) / 2;
    status = replay_under(device, policy, options, path, middle, out, &refused, NULL, NULL);
    if (status != DEVBUF_OK) return status;
    *(refused ? &low : &high) = middle;
  }
  out->bytes = high;
  return DEVBUF_OK;
}
