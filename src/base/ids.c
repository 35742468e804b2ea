// Ids of the library's objects (storages, buffer handles, caching allocators): one counter
// for all, so that no two objects of any kind share an id within a process. The process id
// sits above the count (bits 40 and up), so that a storage another process imports keeps
// its exporter's id without meeting the importer's own; a forked child starts afresh under
// its own process id.
#include "base.h"

#include <unistd.h>

static atomic_uint_least64_t id_counter = 1;

static void seed_with_process(void) {
  atomic_store(&id_counter, ((uint64_t)(uint32_t)getpid() << 40) + 1);
}

__attribute__((constructor)) static void ids_init(void) {
  seed_with_process();
  pthread_atfork(NULL, NULL, seed_with_process);
}

uint64_t devbuf__next_id(void) {
  return atomic_fetch_add_explicit(&id_counter, 1, memory_order_relaxed);
}
