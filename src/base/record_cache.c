// Per-thread caches of the records every buffer makes and drops (base.h). A thread's
// cached records go back to the system when the thread exits.
#include "base.h"

#include <stdlib.h>

#define RECORD_CACHE_DEPTH 32

#if defined(__SANITIZE_ADDRESS__)
#define RECORD_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RECORD_CACHE 0
#endif
#endif
#ifndef RECORD_CACHE
#define RECORD_CACHE 1
#endif

typedef struct cached_record {
  struct cached_record *next;
} cached_record;

typedef struct record_cache {
  cached_record *head[DEVBUF__RECORD_KINDS];
  unsigned count[DEVBUF__RECORD_KINDS];
  bool registered; // with the key whose destructor empties the cache at thread exit
} record_cache;

static _Thread_local record_cache cache __attribute__((tls_model("initial-exec")));
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;

static void empty_cache(void *unused) {
  (void)unused;
  for (int k = 0; k < DEVBUF__RECORD_KINDS; k++) {
    while (cache.head[k]) {
      cached_record *next = cache.head[k]->next;
      free(cache.head[k]);
      cache.head[k] = next;
    }
    cache.count[k] = 0;
  }
  cache.registered = false; // a record freed by a later destructor registers (and runs) it again
}

static void make_exit_key(void) { pthread_key_create(&exit_key, empty_cache); }

void *devbuf__record_alloc(devbuf__record_kind kind, size_t size) {
  cached_record *record = RECORD_CACHE ? cache.head[kind] : NULL;
  if (record && !devbuf__host_memory_hooked()) {
    cache.head[kind] = record->next;
    cache.count[kind]--;
    return record;
  }
  return devbuf__malloc(size);
}

void devbuf__record_free(devbuf__record_kind kind, void *record) {
  if (!record) return;
  if (!RECORD_CACHE || devbuf__host_memory_hooked() || cache.count[kind] >= RECORD_CACHE_DEPTH) {
    devbuf__free(record);
    return;
  }
  if (DEVBUF_UNLIKELY(!cache.registered)) { // the key's destructor runs only where it is set
    pthread_once(&exit_key_once, make_exit_key);
    if (pthread_setspecific(exit_key, &cache) != 0) {
      devbuf__free(record);
      return;
    }
    cache.registered = true;
  }
  cached_record *cached = record;
  cached->next = cache.head[kind];
  cache.head[kind] = cached;
  cache.count[kind]++;
}
