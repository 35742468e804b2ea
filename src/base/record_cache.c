// Per-thread caches of the records every buffer makes and drops (base.h, whose inline
// functions take and give back cached records): what they cannot do. A thread's cached
// records go back to the system when the thread exits.
#include "base.h"

#include <stdlib.h>

_Thread_local devbuf__record_cache devbuf__records __attribute__((tls_model("initial-exec")));
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;

static void empty_cache(void *unused) {
  (void)unused;
  for (int k = 0; k < DEVBUF__RECORD_KINDS; k++) {
    while (devbuf__records.head[k]) {
      void *next = *(void **)devbuf__records.head[k];
      free(devbuf__records.head[k]);
      devbuf__records.head[k] = next;
    }
    devbuf__records.count[k] = 0;
  }
  devbuf__records.registered = false; // a record freed by a later destructor registers it again
}

static void make_exit_key(void) { pthread_key_create(&exit_key, empty_cache); }

void *devbuf__record_alloc_slow(devbuf__record_kind kind, size_t size) {
  (void)kind;
  return devbuf__malloc(size);
}

void devbuf__record_free_slow(devbuf__record_kind kind, void *record) {
  if (!record) return;
  if (!DEVBUF__RECORD_CACHE ||
      atomic_load_explicit(&devbuf__host_hooks_set, memory_order_relaxed) ||
      devbuf__records.count[kind] >= DEVBUF__RECORD_CACHE_DEPTH) {
    devbuf__free(record);
    return;
  }
  // The first record a thread keeps: the key's destructor runs only where it is set.
  pthread_once(&exit_key_once, make_exit_key);
  if (pthread_setspecific(exit_key, &devbuf__records) != 0) {
    devbuf__free(record);
    return;
  }
  devbuf__records.registered = true;
  devbuf__record_free(kind, record);
}
