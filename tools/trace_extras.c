// The figures of trace_extras.h.
#include "trace_extras.h"

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

static double gib(int64_t bytes) { return (double)bytes / (double)(1 << 30); }

static void print_limit(const char *policy, const devbuf_tool_least_limit *limit, FILE *out) {
  if (limit->bytes)
    fprintf(out, "%s %" PRIu64 " bytes (%.3f GiB, %u replays)", policy, limit->bytes,
            gib((int64_t)limit->bytes), limit->replays);
  else
    fprintf(out, "%s none found up to 256 times its unlimited peak", policy);
}

void devbuf_tool_trace_extras_text(const devbuf_tool_trace_extras *extras, FILE *out) {
  const devbuf_snapshot_figures *s = extras->snapshot;
  if (s)
    fprintf(out,
            "PyTorch's caching allocator in this run (the snapshot's events, device 0): peak "
            "reserved %" PRId64 " bytes (%.3f GiB) from the first recorded allocation on, %" PRIu64
            " system allocations (%" PRIu64 " segments held at the start, %" PRIu64
            " made, %" PRIu64 " freed), %" PRId64 " bytes reserved at the end\n",
            s->cca_peak_reserved, gib(s->cca_peak_reserved), s->cca_system_allocs,
            s->segments_at_start, s->cca_segment_allocs, s->cca_segment_frees,
            s->cca_reserved_at_end);
  if (extras->least_limits) {
    fprintf(out, "least memory limit under which nothing is refused: ");
    print_limit("devbuf", &extras->devbuf, out);
    fprintf(out, "; ");
    print_limit("CCA model", &extras->cca, out);
    fprintf(out, "\n");
  }
}

void devbuf_tool_trace_extras_json(const devbuf_tool_trace_extras *extras, FILE *out) {
  const devbuf_snapshot_figures *s = extras->snapshot;
  if (s)
    fprintf(out,
            ", \"snapshot\": {\"device\": 0, \"events\": %" PRIu64
            ", \"cca_peak_reserved_bytes\": %" PRId64 ", \"cca_system_allocs\": %" PRIu64
            ", \"cca_reserved_at_end_bytes\": %" PRId64 ", \"segments_at_start\": %" PRIu64
            ", \"reserved_at_start_bytes\": %" PRId64 ", \"cca_segment_allocs\": %" PRIu64
            ", \"cca_segment_frees\": %" PRIu64 "}",
            s->events, s->cca_peak_reserved, s->cca_system_allocs, s->cca_reserved_at_end,
            s->segments_at_start, s->reserved_at_start, s->cca_segment_allocs,
            s->cca_segment_frees);
  if (extras->least_limits)
    fprintf(out,
            ", \"least_limit_bytes\": {\"devbuf\": %" PRIu64 ", \"cca\": %" PRIu64
            "}, \"least_limit_replays\": {\"devbuf\": %u, \"cca\": %u}",
            extras->devbuf.bytes, extras->cca.bytes, extras->devbuf.replays, extras->cca.replays);
}
