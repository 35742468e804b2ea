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

_Thread_local devbuf__id_block devbuf__ids __attribute__((tls_model("initial-exec")));

// A block of ids taken before a fork belongs to the parent's process id: the child takes
// its own.
#define ID_BLOCK 256

uint64_t devbuf__next_ids_slow(uint64_t count) {
  devbuf__id_block *ids = &devbuf__ids;
  if (ids->end - ids->next < count || ids->epoch != devbuf__epoch()) {
    ids->next = atomic_fetch_add_explicit(&id_counter, ID_BLOCK, memory_order_relaxed);
    ids->end = ids->next + ID_BLOCK;
    ids->epoch = devbuf__epoch();
  }
  uint64_t first = ids->next;
  ids->next += count;
  return first;
}

uint64_t devbuf__next_id(void) { return devbuf__next_ids_slow(1); }
