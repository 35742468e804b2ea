// The counting upstream of counting_upstream.h.
#include "counting_upstream.h"
#include "cca_model.h"

#include <stdbool.h>
#include <string.h>

#define FAKE_BASE      ((uint64_t)1 << 40) // far from anything real, aligned to every page size
#define FAKE_ALIGNMENT ((uint64_t)2 << 20)

// Takes the next `size` bytes of fake addresses; false (an error set) once they would pass
// 2^62: addresses are never reused, and a replay of huge requests must not wrap them.
static bool take_addresses(devbuf_counting_upstream *counts, size_t size, uint64_t *out) {
  if (!counts->next_address) counts->next_address = FAKE_BASE;
  uint64_t span = ((uint64_t)size + FAKE_ALIGNMENT - 1) & ~(FAKE_ALIGNMENT - 1);
  if (size > ((uint64_t)1 << 62) || span > ((uint64_t)1 << 62) - counts->next_address) {
    devbuf_set_error(DEVBUF_OUT_OF_MEMORY,
                     "the replay's fake address space is spent: %zu more bytes after %llu", size,
                     (unsigned long long)(counts->next_address - FAKE_BASE));
    return false;
  }
  *out = counts->next_address;
  counts->next_address += span;
  return true;
}

static devbuf_status counting_alloc(void *context, size_t size, devbuf_memory_t *out) {
  devbuf_counting_upstream *counts = context;
  uint64_t address;
  if (!take_addresses(counts, size, &address)) return DEVBUF_OUT_OF_MEMORY;
  counts->held += size;
  if (counts->held > counts->peak_held) counts->peak_held = counts->held;
  counts->allocs++;
  *out = (devbuf_memory_t){
      .host = NULL, .device = address, .size = size}; // no memory: the CPU may not touch it
  if (counts->on_segment) counts->on_segment(counts->observer_context, address, size, 0);
  return DEVBUF_OK;
}

static void counting_free(void *context, const devbuf_memory_t *memory) {
  devbuf_counting_upstream *counts = context;
  counts->held -= memory->size;
  counts->frees++;
  if (counts->on_segment)
    counts->on_segment(counts->observer_context, memory->device, memory->size, 1);
}

// Growable segments: addresses cost nothing; mapped ranges count as held.
static devbuf_status counting_reserve(void *context, size_t size, devbuf_memory_t *out) {
  devbuf_counting_upstream *counts = context;
  uint64_t address;
  if (!take_addresses(counts, size, &address)) return DEVBUF_OUT_OF_MEMORY;
  *out = (devbuf_memory_t){
      .host = NULL, .device = address, .size = size}; // no memory: the CPU may not touch it
  return DEVBUF_OK;
}

static devbuf_status counting_map(void *context, const devbuf_memory_t *reservation, size_t offset,
                                  size_t size) {
  (void)reservation, (void)offset;
  devbuf_counting_upstream *counts = context;
  counts->held += size;
  if (counts->held > counts->peak_held) counts->peak_held = counts->held;
  counts->allocs++;
  return DEVBUF_OK;
}

static void counting_unmap(void *context, const devbuf_memory_t *reservation, size_t offset,
                           size_t size) {
  (void)reservation, (void)offset;
  devbuf_counting_upstream *counts = context;
  counts->held -= size;
  counts->frees++;
}

static void counting_unreserve(void *context, const devbuf_memory_t *reservation) {
  (void)context, (void)reservation;
}

static const devbuf_allocator_vtable_t counting_vtable = {.alloc = counting_alloc,
                                                          .free = counting_free,
                                                          .reserve = counting_reserve,
                                                          .map = counting_map,
                                                          .unmap = counting_unmap,
                                                          .unreserve = counting_unreserve};

int devbuf_tool_policy_named(const char *name, devbuf_tool_policy *out_policy) {
  if (strcmp(name, "devbuf") == 0)
    *out_policy = DEVBUF_TOOL_POLICY_DEVBUF;
  else if (strcmp(name, "cca") == 0)
    *out_policy = DEVBUF_TOOL_POLICY_CCA;
  else
    return 0;
  return 1;
}

const char *devbuf_tool_policy_name(devbuf_tool_policy policy) {
  return policy == DEVBUF_TOOL_POLICY_CCA ? "cca" : "devbuf";
}

devbuf_status devbuf_tool_counting_policy(devbuf_device_t *device, devbuf_tool_policy policy,
                                          const devbuf_caching_options_t *options,
                                          devbuf_counting_upstream *counts,
                                          devbuf_allocator_t **out_allocator) {
  *counts = (devbuf_counting_upstream){.on_segment = counts->on_segment,
                                       .observer_context = counts->observer_context};
  devbuf_allocator_t *upstream = NULL;
  devbuf_status status = devbuf_allocator_create(device, &counting_vtable, counts, &upstream);
  if (status == DEVBUF_OK && policy == DEVBUF_TOOL_POLICY_CCA)
    status =
        devbuf_tool_cca_model_create(upstream, options ? options->memory_limit : 0, out_allocator);
  else if (status == DEVBUF_OK)
    status = devbuf_caching_allocator_create(upstream, options, out_allocator);
  devbuf_allocator_release(upstream);
  return status;
}

devbuf_status devbuf_tool_counting_caching(devbuf_device_t *device,
                                           const devbuf_caching_options_t *options,
                                           devbuf_counting_upstream *counts,
                                           devbuf_allocator_t **out_caching) {
  *counts = (devbuf_counting_upstream){0};
  return devbuf_tool_counting_policy(device, DEVBUF_TOOL_POLICY_DEVBUF, options, counts,
                                     out_caching);
}
