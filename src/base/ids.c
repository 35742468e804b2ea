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

// Each thread takes ids in blocks, so that making objects on many threads does not pass one
// counter's cache line between them (ids stay unique, not ordered across threads). A block
// taken before a fork belongs to the parent's process id: the child takes its own.
#define ID_BLOCK 256

static _Thread_local uint64_t next_id, block_end;
static _Thread_local unsigned block_epoch;

uint64_t devbuf__next_id(void) {
  if (DEVBUF_UNLIKELY(next_id == block_end || block_epoch != devbuf__epoch())) {
    next_id = atomic_fetch_add_explicit(&id_counter, ID_BLOCK, memory_order_relaxed);
    block_end = next_id + ID_BLOCK;
    block_epoch = devbuf__epoch();
  }
  return next_id++;
}
