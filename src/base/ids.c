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

#define INITIAL_EXEC __attribute__((tls_model("initial-exec"))) // no call to reach them
static _Thread_local uint64_t next_id INITIAL_EXEC, block_end INITIAL_EXEC;
static _Thread_local unsigned block_epoch INITIAL_EXEC;

static uint64_t take_ids(uint64_t count) {
  if (DEVBUF_UNLIKELY(block_end - next_id < count || block_epoch != devbuf__epoch())) {
    next_id = atomic_fetch_add_explicit(&id_counter, ID_BLOCK, memory_order_relaxed);
    block_end = next_id + ID_BLOCK;
    block_epoch = devbuf__epoch();
  }
  uint64_t first = next_id;
  next_id += count;
  return first;
}

uint64_t devbuf__next_id(void) { return take_ids(1); }

uint64_t devbuf__next_id_pair(void) { return take_ids(2); }

_Thread_local unsigned devbuf__thread_number INITIAL_EXEC;
static atomic_uint thread_numbers;

unsigned devbuf__thread_number_slow(void) {
  unsigned number = atomic_fetch_add_explicit(&thread_numbers, 1, memory_order_relaxed) + 1;
  if (number == 0) number = atomic_fetch_add_explicit(&thread_numbers, 1, memory_order_relaxed) + 1;
  devbuf__thread_number = number;
  return number;
}
