// The allocator object: reference counting, the front end that validates calls and
// counts for allocators without statistics of their own, the backend's raw allocator and
// allocators supplied by users.
#include "allocator_hot.h"

#include <string.h>

void devbuf__allocator_init(devbuf_allocator_t *allocator, const devbuf__allocator_ops *ops,
                            devbuf_device_t *device, devbuf__device_link link) {
  devbuf__ref_init(&allocator->refs, 1);
  allocator->ops = ops;
  allocator->device = device;
  allocator->link = link;
  allocator->memory_kind = DEVBUF_MEMORY_DEVICE;
  devbuf__counters *c = &allocator->counters;
  atomic_init(&c->active, 0);
  atomic_init(&c->peak, 0);
  atomic_init(&c->live, 0);
  atomic_init(&c->allocs, 0);
  atomic_init(&c->frees, 0);
  atomic_init(&c->failed, 0);
  atomic_init(&c->calls, 0);
  if (link == DEVBUF__HOLDS_DEVICE) devbuf__device_keep(device);
}

void devbuf__allocator_destroy(devbuf_allocator_t *allocator) {
  devbuf_device_t *device = allocator->device;
  devbuf__device_link link = allocator->link;
  allocator->ops->destroy(allocator);
  if (link == DEVBUF__HOLDS_DEVICE) devbuf__device_drop(device);
}

devbuf_allocator_t *devbuf_allocator_retain(devbuf_allocator_t *allocator) {
  if (!allocator) return NULL;
  if (allocator->link == DEVBUF__EMBEDDED)
    devbuf__device_keep(allocator->device);
  else
    devbuf__ref_retain(&allocator->refs);
  return allocator;
}

void devbuf_allocator_release(devbuf_allocator_t *allocator) {
  if (!allocator) return;
  if (allocator->link == DEVBUF__EMBEDDED) {
    devbuf__device_drop(allocator->device);
    return;
  }
  if (devbuf__ref_drop(&allocator->refs)) devbuf__allocator_destroy(allocator);
}

devbuf_device_t *devbuf_allocator_device(const devbuf_allocator_t *allocator) {
  return allocator ? allocator->device : NULL;
}

const char *devbuf_allocator_kind(const devbuf_allocator_t *allocator) {
  return allocator ? allocator->ops->kind : NULL;
}

// An allocation the front end counts (an allocator without statistics of its own); ordered
// after work where `visit` is set. Apart from the callers, whose own path then needs no frame.
__attribute__((noinline)) static devbuf_status
counted_alloc(devbuf_allocator_t *allocator, size_t size, devbuf__in_flight_visit visit,
              void *context, devbuf_memory_t *out_memory) {
  devbuf__counters *c = &allocator->counters;
  atomic_fetch_add_explicit(&c->calls, 1, memory_order_relaxed);
  devbuf_memory_t memory;
  devbuf_status status =
      visit ? allocator->ops->alloc_ordered(allocator, size, visit, context, &memory)
            : allocator->ops->alloc(allocator, size, &memory);
  if (status != DEVBUF_OK) {
    atomic_fetch_add_explicit(&c->failed, 1, memory_order_relaxed);
    return status;
  }
  uint64_t active =
      atomic_fetch_add_explicit(&c->active, memory.size, memory_order_relaxed) + memory.size;
  devbuf__raise_peak(&c->peak, active);
  atomic_fetch_add_explicit(&c->live, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->allocs, 1, memory_order_relaxed);
  *out_memory = memory;
  return DEVBUF_OK;
}

static inline void count_free(devbuf__counters *c, size_t size) {
  atomic_fetch_sub_explicit(&c->active, size, memory_order_relaxed);
  atomic_fetch_sub_explicit(&c->live, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->frees, 1, memory_order_relaxed);
}

devbuf_status devbuf__allocator_alloc_unbinned(devbuf_allocator_t *allocator, size_t size,
                                               devbuf_memory_t *out_memory) {
  if (allocator->ops->stats) return allocator->ops->alloc(allocator, size, out_memory);
  return counted_alloc(allocator, size, NULL, NULL, out_memory);
}

devbuf_status devbuf_allocator_alloc(devbuf_allocator_t *allocator, size_t size,
                                     devbuf_memory_t *out_memory) {
  if (DEVBUF_UNLIKELY(!allocator || !out_memory))
    return devbuf__null_argument("", "allocator, out_memory",
                                 (const void *[]){allocator, out_memory});
  if (DEVBUF_UNLIKELY(size == 0))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "allocation of 0 bytes (zero-length buffers own no memory)");
  return devbuf__allocator_alloc_known(allocator, size, out_memory);
}

void devbuf__allocator_free_uncached(devbuf_allocator_t *allocator, const devbuf_memory_t *memory) {
  if (!allocator->ops->stats) count_free(&allocator->counters, memory->size); // counted here
  allocator->ops->free(allocator, memory);
}

// Off the free's own path, so that it stays short.
__attribute__((noinline, cold)) static void refuse_free(const devbuf_memory_t *memory) {
  devbuf__error(DEVBUF_INVALID_ARGUMENT,
                "allocator_free: the %zu bytes at %p are not handed out by this allocator now "
                "(freed already?): left alone",
                memory->size, memory->host);
}

// Whether `memory` is a block of a caching allocator that it has not handed out now. Block
// records live as long as their allocator (caching.h), so a token freed twice still names
// one: not handed out, or handed out again, for other bytes (another place or size; only a
// block of the same bytes is the same to this test, as to any allocator's).
static bool not_handed_out(const devbuf_memory_t *memory) {
  const cblock *block = memory->token;
  return !block || atomic_load_explicit(&block->state, memory_order_relaxed) != BLOCK_ACTIVE ||
         block->device != memory->device || block->device_offset != memory->offset ||
         block->size != memory->size;
}

// Any other allocator's free. An adaptor that hands out its upstream's memory (statistics,
// faults) counts what it forwards: memory a caching allocator under it has not handed out now
// is refused first.
__attribute__((noinline)) static void free_other(devbuf_allocator_t *allocator,
                                                 const devbuf_memory_t *memory) {
  const devbuf_allocator_t *source = allocator;
  while (source->ops->passes_memory) source = ((const devbuf__adaptor *)source)->upstream;
  if (source != allocator && source->ops == &devbuf__caching_ops && not_handed_out(memory)) {
    refuse_free(memory);
    return;
  }
  devbuf__allocator_free_uncached(allocator, memory);
}

void devbuf_allocator_free(devbuf_allocator_t *allocator, const devbuf_memory_t *memory) {
  if (!allocator || !memory) return;
  if (DEVBUF_UNLIKELY(allocator->ops != &devbuf__caching_ops)) {
    free_other(allocator, memory);
    return;
  }
  // A caching allocator's block freed twice (or a record never handed out): a second free
  // put a binned block on its own bin, and every later request got that one block.
  if (DEVBUF_UNLIKELY(not_handed_out(memory))) {
    refuse_free(memory);
    return;
  }
  devbuf__allocator_free_known(allocator, memory);
}

// ---- memory released in flight: allocators that can, and adaptors that forward it ----------

// The snapshot an adaptor forwards is its upstream's.
static devbuf_status snapshot_upstream(devbuf_allocator_t *self,
                                       devbuf_allocator_snapshot_t **out) {
  devbuf_allocator_t *upstream = ((devbuf__adaptor *)self)->upstream;
  return upstream->ops->snapshot(upstream, out);
}

// An adaptor holds nothing of its own to give back: the cache is its upstream's.
static void clear_cache_upstream(devbuf_allocator_t *self) {
  devbuf_allocator_clear_cache(((devbuf__adaptor *)self)->upstream);
}

// An adaptor's range in flight is its upstream's: the end of its work goes straight there.
static void fence_done_upstream(devbuf_allocator_t *self, devbuf__in_flight *range) {
  devbuf__allocator_fence_done(((devbuf__adaptor *)self)->upstream, range);
}

void devbuf__adaptor_ops(const devbuf__allocator_ops *kind, const devbuf_allocator_t *upstream,
                         devbuf__allocator_ops *out) {
  *out = *kind;
  if (!upstream->ops->reserve) {
    out->reserve = NULL;
    out->map = NULL;
    out->unmap = NULL;
    out->unreserve = NULL;
  }
  bool in_flight = kind->free_in_flight && upstream->ops->free_in_flight;
  out->free_in_flight = in_flight ? kind->free_in_flight : NULL;
  out->fence_done = in_flight ? fence_done_upstream : NULL;
  out->alloc_ordered = in_flight ? kind->alloc_ordered : NULL;
  out->snapshot = upstream->ops->snapshot ? snapshot_upstream : NULL;
  if (!kind->clear_cache) out->clear_cache = clear_cache_upstream;
}

devbuf_status devbuf__allocator_free_in_flight(devbuf_allocator_t *allocator,
                                               const devbuf_memory_t *memory, void *fence,
                                               devbuf__in_flight **out_range) {
  size_t size = memory->size; // `memory` may be the record that goes with it
  devbuf_status status = allocator->ops->free_in_flight(allocator, memory, fence, out_range);
  if (status == DEVBUF_OK && !allocator->ops->stats) count_free(&allocator->counters, size);
  return status;
}

void devbuf__allocator_fence_done(devbuf_allocator_t *allocator, devbuf__in_flight *range) {
  allocator->ops->fence_done(allocator, range);
}

devbuf_status devbuf__allocator_alloc_ordered(devbuf_allocator_t *allocator, size_t size,
                                              devbuf__in_flight_visit visit, void *context,
                                              devbuf_memory_t *out) {
  if (allocator->ops->stats)
    return allocator->ops->alloc_ordered(allocator, size, visit, context, out);
  return counted_alloc(allocator, size, visit, context, out);
}

devbuf_status devbuf_allocator_stats(devbuf_allocator_t *allocator,
                                     devbuf_allocator_stats_t *out_stats) {
  if (!allocator || !out_stats)
    return devbuf__null_argument("", "allocator, out_stats",
                                 (const void *[]){allocator, out_stats});
  devbuf_allocator_stats_t stats = {0};
  if (allocator->ops->stats) {
    allocator->ops->stats(allocator, &stats);
  } else {
    devbuf__counters *c = &allocator->counters;
    stats.active = atomic_load(&c->active);
    stats.peak = atomic_load(&c->peak);
    stats.live_buffers = atomic_load(&c->live);
    stats.system_allocs = atomic_load(&c->allocs);
    stats.system_frees = atomic_load(&c->frees);
    stats.alloc_calls = atomic_load(&c->calls);
    stats.failed_allocs = atomic_load(&c->failed);
  }
  if (!allocator->ops->stats) { // without a cache, whatever is held is in use
    stats.reserved = stats.active;
    stats.peak_reserved = stats.peak;
    stats.segments = stats.live_buffers;
  }
  stats.mapped = atomic_load(&allocator->device->mapped_bytes);
  *out_stats = stats;
  return DEVBUF_OK;
}

void devbuf_allocator_reset_peak(devbuf_allocator_t *allocator) {
  if (!allocator) return;
  if (allocator->ops->stats) {
    if (allocator->ops->reset_peak) allocator->ops->reset_peak(allocator);
    return;
  }
  atomic_store(&allocator->counters.peak, atomic_load(&allocator->counters.active));
}

void devbuf_allocator_clear_cache(devbuf_allocator_t *allocator) {
  if (allocator && allocator->ops->clear_cache) allocator->ops->clear_cache(allocator);
}

// ---- the backend's raw allocator ----------------------------------------------------------

static devbuf_status raw_alloc(devbuf_allocator_t *self, size_t size, devbuf_memory_t *out) {
  return self->device->backend->raw_alloc(self->device, self->memory_kind, size, out);
}

static void raw_free(devbuf_allocator_t *self, const devbuf_memory_t *memory) {
  self->device->backend->raw_free(self->device, memory);
}

static void plain_destroy(devbuf_allocator_t *self) { devbuf__free(self); }

static devbuf_status raw_reserve(devbuf_allocator_t *self, size_t size, devbuf_memory_t *out) {
  return self->device->backend->raw_reserve(self->device, size, out);
}

static devbuf_status raw_map(devbuf_allocator_t *self, const devbuf_memory_t *reservation,
                             size_t offset, size_t size) {
  return self->device->backend->raw_map(self->device, reservation, offset, size);
}

static void raw_unmap(devbuf_allocator_t *self, const devbuf_memory_t *reservation, size_t offset,
                      size_t size) {
  self->device->backend->raw_unmap(self->device, reservation, offset, size);
}

static void raw_unreserve(devbuf_allocator_t *self, const devbuf_memory_t *reservation) {
  self->device->backend->raw_unreserve(self->device, reservation);
}

static const devbuf__allocator_ops raw_ops = {
    .kind = "raw",
    .alloc = raw_alloc,
    .free = raw_free,
    .destroy = plain_destroy,
};

// The same, for backends (and kinds of memory) that can map memory into reserved addresses.
static const devbuf__allocator_ops raw_mappable_ops = {
    .kind = "raw",
    .alloc = raw_alloc,
    .free = raw_free,
    .destroy = plain_destroy,
    .reserve = raw_reserve,
    .map = raw_map,
    .unmap = raw_unmap,
    .unreserve = raw_unreserve,
};

size_t devbuf__allocator_map_page(const devbuf_allocator_t *allocator) {
  while (allocator->ops->passes_memory) allocator = ((const devbuf__adaptor *)allocator)->upstream;
  return allocator->ops == &raw_mappable_ops ? allocator->device->page_size : 0;
}

devbuf_status devbuf__raw_allocator_create(devbuf_device_t *device, devbuf_memory_kind kind,
                                           bool borrow_device, devbuf_allocator_t **out) {
  devbuf_allocator_t *allocator = devbuf__malloc(sizeof *allocator);
  if (!allocator)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an allocator object");
  bool mappable = device->backend->raw_reserve && kind == DEVBUF_MEMORY_DEVICE;
  devbuf__allocator_init(allocator, mappable ? &raw_mappable_ops : &raw_ops, device,
                         borrow_device ? DEVBUF__BORROWS_DEVICE : DEVBUF__HOLDS_DEVICE);
  allocator->memory_kind = kind;
  *out = allocator;
  return DEVBUF_OK;
}

devbuf_status devbuf_device_raw_allocator(devbuf_device_t *device,
                                          devbuf_allocator_t **out_allocator) {
  if (!device || !out_allocator)
    return devbuf__null_argument("", "device, out_allocator",
                                 (const void *[]){device, out_allocator});
  return devbuf__raw_allocator_create(device, DEVBUF_MEMORY_DEVICE, false, out_allocator);
}

// ---- allocators supplied by users ------------------------------------------------------

typedef struct custom_allocator {
  devbuf_allocator_t base;
  const devbuf_allocator_vtable_t *vtable;
  void *ctx;
} custom_allocator;

// What a user's callback answered, as devbuf reports it: a number that is no status becomes
// INVALID_ARGUMENT naming it, and a failure that set no message gets one (the thread's
// message is cleared before the call, so an older one is never taken for its cause).
static devbuf_status user_failure(devbuf_status status, const char *call, size_t size) {
  if (strcmp(devbuf_status_name(status), "UNKNOWN") == 0)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "user allocator's %s of %zu bytes answered %d, which is no devbuf status",
                         call, size, (int)status);
  if (!devbuf_last_error()[0])
    return devbuf__error(status, "user allocator's %s of %zu bytes failed, saying nothing more",
                         call, size);
  return status;
}

static devbuf_status custom_alloc(devbuf_allocator_t *self, size_t size, devbuf_memory_t *out) {
  custom_allocator *custom = (custom_allocator *)self;
  devbuf_memory_t memory = {0};
  devbuf__clear_error();
  devbuf_status status = custom->vtable->alloc(custom->ctx, size, &memory);
  if (status != DEVBUF_OK) return user_failure(status, "alloc", size);
  if (memory.size < size) {
    custom->vtable->free(custom->ctx, &memory);
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "user allocator returned %zu bytes for a request of %zu", memory.size,
                         size);
  }
  // Where memory is a handle and an offset (OpenCL), the offset starts the sub-buffers that
  // reach kernels, which the driver wants at its base alignment (it failed the queue with
  // CL_MISALIGNED_SUB_BUFFER_OFFSET); elsewhere the addresses are what kernels get.
  const devbuf_device_t *device = self->device;
  size_t alignment = device->memory_handles && device->alignment > 64 ? device->alignment : 64;
  uint64_t place = device->memory_handles ? memory.offset : memory.device;
  bool host_off = (uintptr_t)memory.host % 64 != 0;
  if (place % alignment || host_off) {
    custom->vtable->free(custom->ctx, &memory);
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "user allocator returned memory at %s 0x%llx, not a multiple of %zu "
                         "bytes as %s needs",
                         host_off                 ? "host address"
                         : device->memory_handles ? "offset"
                                                  : "address",
                         host_off ? (unsigned long long)(uintptr_t)memory.host
                                  : (unsigned long long)place,
                         host_off ? (size_t)64 : alignment, device->spec);
  }
  *out = memory;
  return DEVBUF_OK;
}

static void custom_free(devbuf_allocator_t *self, const devbuf_memory_t *memory) {
  custom_allocator *custom = (custom_allocator *)self;
  custom->vtable->free(custom->ctx, memory);
}

static void custom_destroy(devbuf_allocator_t *self) {
  custom_allocator *custom = (custom_allocator *)self;
  if (custom->vtable->destroy) custom->vtable->destroy(custom->ctx);
  devbuf__free(custom);
}

static void custom_clear_cache(devbuf_allocator_t *self) {
  custom_allocator *custom = (custom_allocator *)self;
  if (custom->vtable->clear_cache) custom->vtable->clear_cache(custom->ctx);
}

static devbuf_status custom_reserve(devbuf_allocator_t *self, size_t size, devbuf_memory_t *out) {
  custom_allocator *custom = (custom_allocator *)self;
  devbuf_memory_t reservation = {0};
  devbuf__clear_error();
  devbuf_status status = custom->vtable->reserve(custom->ctx, size, &reservation);
  if (status != DEVBUF_OK) return user_failure(status, "reserve", size);
  *out = reservation;
  return DEVBUF_OK;
}

static devbuf_status custom_map(devbuf_allocator_t *self, const devbuf_memory_t *reservation,
                                size_t offset, size_t size) {
  custom_allocator *custom = (custom_allocator *)self;
  devbuf__clear_error();
  devbuf_status status = custom->vtable->map(custom->ctx, reservation, offset, size);
  return status == DEVBUF_OK ? status : user_failure(status, "map", size);
}

static void custom_unmap(devbuf_allocator_t *self, const devbuf_memory_t *reservation,
                         size_t offset, size_t size) {
  custom_allocator *custom = (custom_allocator *)self;
  custom->vtable->unmap(custom->ctx, reservation, offset, size);
}

static void custom_unreserve(devbuf_allocator_t *self, const devbuf_memory_t *reservation) {
  custom_allocator *custom = (custom_allocator *)self;
  custom->vtable->unreserve(custom->ctx, reservation);
}

static const devbuf__allocator_ops custom_ops = {
    .kind = "custom",
    .alloc = custom_alloc,
    .free = custom_free,
    .destroy = custom_destroy,
    .clear_cache = custom_clear_cache,
};

static const devbuf__allocator_ops custom_mappable_ops = {
    .kind = "custom",
    .alloc = custom_alloc,
    .free = custom_free,
    .destroy = custom_destroy,
    .clear_cache = custom_clear_cache,
    .reserve = custom_reserve,
    .map = custom_map,
    .unmap = custom_unmap,
    .unreserve = custom_unreserve,
};

devbuf_status devbuf_allocator_create(devbuf_device_t *device,
                                      const devbuf_allocator_vtable_t *vtable, void *ctx,
                                      devbuf_allocator_t **out_allocator) {
  if (!device || !vtable || !vtable->alloc || !vtable->free || !out_allocator)
    return devbuf__error(
        DEVBUF_INVALID_ARGUMENT,
        "device, vtable, vtable->alloc, vtable->free and out_allocator are required");
  custom_allocator *custom = devbuf__malloc(sizeof *custom);
  if (!custom) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an allocator object");
  int mapping = !!vtable->reserve + !!vtable->map + !!vtable->unmap + !!vtable->unreserve;
  if (mapping != 0 && mapping != 4) {
    devbuf__free(custom);
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "vtable: reserve, map, unmap and unreserve come all four or none "
                         "(%d given)",
                         mapping);
  }
  devbuf__allocator_init(&custom->base, mapping ? &custom_mappable_ops : &custom_ops, device,
                         DEVBUF__HOLDS_DEVICE);
  custom->vtable = vtable;
  custom->ctx = ctx;
  *out_allocator = &custom->base;
  return DEVBUF_OK;
}

devbuf_status devbuf_allocator_snapshot(devbuf_allocator_t *allocator,
                                        devbuf_allocator_snapshot_t **out_snapshot) {
  if (!allocator || !out_snapshot)
    return devbuf__null_argument("", "allocator, out_snapshot",
                                 (const void *[]){allocator, out_snapshot});
  if (!allocator->ops->snapshot)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "a %s allocator keeps no segments to picture: only caching ones (and "
                         "adaptors over them) do",
                         allocator->ops->kind);
  return allocator->ops->snapshot(allocator, out_snapshot);
}

void devbuf_allocator_snapshot_free(devbuf_allocator_snapshot_t *snapshot) {
  if (snapshot) devbuf__caching_snapshot_free(snapshot);
}
