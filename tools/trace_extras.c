// The figures of trace_extras.h.
#include "trace_extras.h"
#include "sizes.h"

#include <inttypes.h>

devbuf_status devbuf_tool_trace_extras_measure(devbuf_device_t *device,
                                               const devbuf_caching_options_t *options,
                                               const char *path, devbuf_tool_trace_extras *extras) {
  devbuf_status status = devbuf_tool_find_least_limit(device, DEVBUF_TOOL_POLICY_DEVBUF, options,
                                                      path, &extras->devbuf);
  if (status == DEVBUF_OK)
    status = devbuf_tool_find_least_limit(device, DEVBUF_TOOL_POLICY_CCA, NULL, path, &extras->cca);
  extras->least_limits = status == DEVBUF_OK;
  return status;
}

// "1.64 GiB (1,763,704,832 bytes)", as print_text writes sizes.
static const char *size_text(int64_t bytes, char *out, size_t capacity) {
  char human[32], exact[32];
  uint64_t value = bytes < 0 ? 0 : (uint64_t)bytes;
  snprintf(
      out, capacity, "%s%s (%s bytes)", bytes < 0 ? "-" : "",
      devbuf_tool_human_size(bytes < 0 ? (uint64_t)0 - (uint64_t)bytes : value, human,
                             sizeof human),
      devbuf_tool_grouped(bytes < 0 ? (uint64_t)0 - (uint64_t)bytes : value, exact, sizeof exact));
  return out;
}

static void print_limit(const char *policy, const devbuf_tool_least_limit *limit, FILE *out) {
  char text[96];
  if (limit->bytes)
    fprintf(out, "  %-10s %s, %u replays\n", policy,
            size_text((int64_t)limit->bytes, text, sizeof text), limit->replays);
  else if (limit->peak_free == 0) // nothing to bisect: every limit, 0 included, refuses nothing
    fprintf(out, "  %-10s 0 bytes: the trace allocates nothing, so any limit works, %u replay%s\n",
            policy, limit->replays, limit->replays == 1 ? "" : "s");
  else
    fprintf(out, "  %-10s none found up to 256 times its unlimited peak\n", policy);
}

void devbuf_tool_trace_extras_text(const devbuf_tool_trace_extras *extras, FILE *out) {
  const devbuf_snapshot_figures *s = extras->snapshot;
  char peak[96], end[96];
  // Where the trace records no allocation (a snapshot of the end state alone), the peak is
  // what CCA held from the start, and the line says so instead of naming no allocation.
  if (s)
    fprintf(out,
            "PyTorch's caching allocator in this run (the snapshot's own events, device %d%s):\n"
            "  peak reserved   %s %s\n"
            "  %" PRIu64 " system allocations (%" PRIu64 " segments held at the start, %" PRIu64
            " made, %" PRIu64 " freed); %s reserved at the end\n",
            extras->cuda_device, s->expandable_segments ? ", expandable segments" : "",
            size_text(s->cca_peak_reserved, peak, sizeof peak),
            s->allocs > s->live_at_start ? "from the first recorded allocation on"
                                         : "from the start (the trace records no allocation)",
            s->cca_system_allocs, s->segments_at_start, s->cca_segment_allocs, s->cca_segment_frees,
            size_text(s->cca_reserved_at_end, end, sizeof end));
  if (extras->least_limits) {
    fprintf(out, "least memory limit under which nothing is refused (bisection over replays):\n");
    print_limit("devbuf", &extras->devbuf, out);
    print_limit("CCA model", &extras->cca, out);
  }
}

void devbuf_tool_trace_extras_json(const devbuf_tool_trace_extras *extras, FILE *out) {
  const devbuf_snapshot_figures *s = extras->snapshot;
  if (s)
    fprintf(out,
            ", \"snapshot\": {\"device\": %d, \"events\": %" PRIu64
            ", \"cca_peak_reserved_bytes\": %" PRId64 ", \"cca_system_allocs\": %" PRIu64
            ", \"cca_reserved_at_end_bytes\": %" PRId64 ", \"segments_at_start\": %" PRIu64
            ", \"reserved_at_start_bytes\": %" PRId64 ", \"cca_segment_allocs\": %" PRIu64
            ", \"cca_segment_frees\": %" PRIu64 ", \"expandable_segments\": %s}",
            extras->cuda_device, s->events, s->cca_peak_reserved, s->cca_system_allocs,
            s->cca_reserved_at_end, s->segments_at_start, s->reserved_at_start,
            s->cca_segment_allocs, s->cca_segment_frees, s->expandable_segments ? "true" : "false");
  if (extras->least_limits)
    fprintf(out,
            ", \"least_limit_bytes\": {\"devbuf\": %" PRIu64 ", \"cca\": %" PRIu64
            "}, \"least_limit_replays\": {\"devbuf\": %u, \"cca\": %u}",
            extras->devbuf.bytes, extras->cca.bytes, extras->devbuf.replays, extras->cca.replays);
}
