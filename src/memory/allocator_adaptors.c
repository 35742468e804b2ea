// Allocator adaptors: statistics and fault injection. Each wraps an upstream
// allocator and is itself an allocator. (The trace adaptor has its own file.)
#include "memory.h"

typedef devbuf__adaptor wrapper;

static devbuf_status pass_alloc(devbuf_allocator_t *self, size_t size, devbuf_memory_t *out) {
  return devbuf_allocator_alloc(((wrapper *)self)->upstream, size, out);
}

static void pass_free(devbuf_allocator_t *self, const devbuf_memory_t *memory) {
  devbuf_allocator_free(((wrapper *)self)->upstream, memory);
}

static devbuf_status pass_free_in_flight(devbuf_allocator_t *self, const devbuf_memory_t *memory,
                                         void *fence, devbuf__in_flight **out_range) {
  return devbuf__allocator_free_in_flight(((wrapper *)self)->upstream, memory, fence, out_range);
}

static devbuf_status pass_alloc_ordered(devbuf_allocator_t *self, size_t size,
                                        devbuf__in_flight_visit visit, void *context,
                                        devbuf_memory_t *out) {
  return devbuf__allocator_alloc_ordered(((wrapper *)self)->upstream, size, visit, context, out);
}

static void wrapper_destroy(devbuf_allocator_t *self) {
  devbuf_allocator_release(((wrapper *)self)->upstream);
  devbuf__free(self);
}

// Allocates a wrapper of `size` bytes (a wrapper or a struct that starts with one).
static devbuf_status wrapper_create(devbuf_allocator_t *upstream, const devbuf__allocator_ops *ops,
                                    size_t size, wrapper **out) {
  if (!upstream)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s adaptor: upstream is NULL", ops->kind);
  wrapper *self = devbuf__calloc(1, size);
  if (!self)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a %s adaptor", ops->kind);
  devbuf__adaptor_ops(ops, upstream, &self->ops);
  devbuf__allocator_init(&self->base, &self->ops, upstream->device, DEVBUF__HOLDS_DEVICE);
  self->base.memory_kind = upstream->memory_kind;
  self->upstream = devbuf_allocator_retain(upstream);
  *out = self;
  return DEVBUF_OK;
}

// ---- statistics: the front end counts every call of an allocator without its own ----

static const devbuf__allocator_ops stats_ops = {
    .kind = "stats",
    .passes_memory = true,
    .alloc = pass_alloc,
    .free = pass_free,
    .destroy = wrapper_destroy,
    .free_in_flight = pass_free_in_flight,
    .alloc_ordered = pass_alloc_ordered,
};

devbuf_status devbuf_stats_adaptor_create(devbuf_allocator_t *upstream,
                                          devbuf_allocator_t **out_allocator) {
  if (!out_allocator) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "out_allocator is NULL");
  wrapper *self = NULL;
  devbuf_status status = wrapper_create(upstream, &stats_ops, sizeof *self, &self);
  if (status == DEVBUF_OK) *out_allocator = &self->base;
  return status;
}

// ---- fault injection ------------------------------------------------------------------

typedef struct fault_adaptor {
  wrapper wrapped;
  atomic_uint_least64_t calls;   // allocations seen since arming
  atomic_uint_least64_t fail_at; // 1-based call number to fail; 0: never
  atomic_int mode;               // devbuf_fault_mode
  atomic_uint_least64_t fired;
} fault_adaptor;

// INJECTED_FAULT when this call is one to fail.
static devbuf_status fault_check(fault_adaptor *self, size_t size) {
  uint64_t call = atomic_fetch_add(&self->calls, 1) + 1;
  uint64_t fail_at = atomic_load(&self->fail_at);
  int mode = atomic_load(&self->mode);
  bool fails =
      fail_at && (mode == DEVBUF_FAULT_EVERY
                      ? call % fail_at == 0
                      : call == fail_at || (call > fail_at && mode == DEVBUF_FAULT_PERSISTENT));
  if (fails) {
    atomic_fetch_add(&self->fired, 1);
    return devbuf__error(DEVBUF_INJECTED_FAULT, "injected fault: allocation %llu of %zu bytes",
                         (unsigned long long)call, size);
  }
  return DEVBUF_OK;
}

static devbuf_status fault_alloc(devbuf_allocator_t *base, size_t size, devbuf_memory_t *out) {
  devbuf_status status = fault_check((fault_adaptor *)base, size);
  return status == DEVBUF_OK ? pass_alloc(base, size, out) : status;
}

static devbuf_status fault_alloc_ordered(devbuf_allocator_t *base, size_t size,
                                         devbuf__in_flight_visit visit, void *context,
                                         devbuf_memory_t *out) {
  devbuf_status status = fault_check((fault_adaptor *)base, size);
  return status == DEVBUF_OK ? pass_alloc_ordered(base, size, visit, context, out) : status;
}

// Over an upstream that maps memory into reserved addresses, mapping counts as an
// allocation call (and fails like one); the rest passes through.
static devbuf_status pass_reserve(devbuf_allocator_t *self, size_t size, devbuf_memory_t *out) {
  devbuf_allocator_t *upstream = ((wrapper *)self)->upstream;
  return upstream->ops->reserve(upstream, size, out);
}

static devbuf_status fault_map(devbuf_allocator_t *base, const devbuf_memory_t *reservation,
                               size_t offset, size_t size) {
  devbuf_status status = fault_check((fault_adaptor *)base, size);
  if (status != DEVBUF_OK) return status;
  devbuf_allocator_t *upstream = ((wrapper *)base)->upstream;
  return upstream->ops->map(upstream, reservation, offset, size);
}

static void pass_unmap(devbuf_allocator_t *self, const devbuf_memory_t *reservation, size_t offset,
                       size_t size) {
  devbuf_allocator_t *upstream = ((wrapper *)self)->upstream;
  upstream->ops->unmap(upstream, reservation, offset, size);
}

static void pass_unreserve(devbuf_allocator_t *self, const devbuf_memory_t *reservation) {
  devbuf_allocator_t *upstream = ((wrapper *)self)->upstream;
  upstream->ops->unreserve(upstream, reservation);
}

static const devbuf__allocator_ops fault_ops = {
    .kind = "fault",
    .passes_memory = true,
    .alloc = fault_alloc,
    .free = pass_free,
    .destroy = wrapper_destroy,
    .reserve = pass_reserve,
    .map = fault_map,
    .unmap = pass_unmap,
    .unreserve = pass_unreserve,
    .free_in_flight = pass_free_in_flight,
    .alloc_ordered = fault_alloc_ordered,
};

static bool is_fault_adaptor(const devbuf_allocator_t *allocator) {
  return allocator && allocator->ops->alloc == fault_alloc;
}

devbuf_status devbuf_fault_adaptor_create(devbuf_allocator_t *upstream, uint64_t fail_at,
                                          devbuf_fault_mode mode,
                                          devbuf_allocator_t **out_allocator) {
  if (!out_allocator || (unsigned)mode > DEVBUF_FAULT_EVERY)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "fault adaptor: out_allocator is NULL or mode %d is unknown", (int)mode);
  fault_adaptor *self = NULL;
  devbuf_status status = wrapper_create(upstream, &fault_ops, sizeof *self, (wrapper **)&self);
  if (status != DEVBUF_OK) return status;
  atomic_init(&self->calls, 0);
  atomic_init(&self->fail_at, fail_at);
  atomic_init(&self->mode, (int)mode);
  atomic_init(&self->fired, 0);
  *out_allocator = &self->wrapped.base;
  return DEVBUF_OK;
}

devbuf_status devbuf_fault_adaptor_arm(devbuf_allocator_t *allocator, uint64_t fail_at,
                                       devbuf_fault_mode mode) {
  if (!is_fault_adaptor(allocator) || (unsigned)mode > DEVBUF_FAULT_EVERY)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "fault_adaptor_arm needs a fault adaptor and a known mode (got %d)",
                         (int)mode);
  fault_adaptor *self = (fault_adaptor *)allocator;
  atomic_store(&self->fail_at, 0);
  atomic_store(&self->calls, 0);
  atomic_store(&self->mode, (int)mode);
  atomic_store(&self->fail_at, fail_at);
  return DEVBUF_OK;
}

uint64_t devbuf_fault_adaptor_fired(const devbuf_allocator_t *allocator) {
  if (!is_fault_adaptor(allocator)) return 0;
  return atomic_load(&((fault_adaptor *)allocator)->fired);
}
