// Ids of the library's objects (storages, buffer handles, caching allocators): one counter
// for all, so that no two objects of any kind share an id within a process.
#include "base.h"

static atomic_uint_least64_t id_counter = 1;

uint64_t devbuf__next_id(void) {
  return atomic_fetch_add_explicit(&id_counter, 1, memory_order_relaxed);
}
