// The one seam through which devbuf allocates host memory for its own bookkeeping (with the
// program's hooks, when it set them), and the library's lock initialisation.
#include "base.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static devbuf_host_memory_hooks_t hooks;
atomic_bool devbuf__host_hooks_set; // read on every call: libc's functions unless set

devbuf_status devbuf_set_host_memory_hooks(const devbuf_host_memory_hooks_t *new_hooks) {
  if (!new_hooks) {
    atomic_store(&devbuf__host_hooks_set, false);
    return DEVBUF_OK;
  }
  if (!new_hooks->malloc || !new_hooks->calloc || !new_hooks->realloc || !new_hooks->free)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "host memory hooks need malloc, calloc, realloc and free (%s is NULL)",
                         !new_hooks->malloc    ? "malloc"
                         : !new_hooks->calloc  ? "calloc"
                         : !new_hooks->realloc ? "realloc"
                                               : "free");
  atomic_store(&devbuf__host_hooks_set,
               false); // no call uses `hooks` while it changes (single-threaded by contract)
  hooks = *new_hooks;
  atomic_store(&devbuf__host_hooks_set, true);
  return DEVBUF_OK;
}

void *devbuf__malloc(size_t size) {
  return atomic_load_explicit(&devbuf__host_hooks_set, memory_order_acquire)
             ? hooks.malloc(hooks.ctx, size)
             : malloc(size);
}
void *devbuf__calloc(size_t count, size_t size) {
  return atomic_load_explicit(&devbuf__host_hooks_set, memory_order_acquire)
             ? hooks.calloc(hooks.ctx, count, size)
             : calloc(count, size);
}
void *devbuf__realloc(void *pointer, size_t size) {
  return atomic_load_explicit(&devbuf__host_hooks_set, memory_order_acquire)
             ? hooks.realloc(hooks.ctx, pointer, size)
             : realloc(pointer, size);
}
void devbuf__free(void *pointer) {
  if (atomic_load_explicit(&devbuf__host_hooks_set, memory_order_acquire))
    hooks.free(hooks.ctx, pointer);
  else
    free(pointer);
}

#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
static pthread_mutexattr_t adaptive;
static pthread_once_t adaptive_once = PTHREAD_ONCE_INIT;

static void make_adaptive(void) {
  pthread_mutexattr_init(&adaptive);
  pthread_mutexattr_settype(&adaptive, PTHREAD_MUTEX_ADAPTIVE_NP);
}

void devbuf__mutex_init(pthread_mutex_t *mutex) {
  pthread_once(&adaptive_once, make_adaptive);
  pthread_mutex_init(mutex, &adaptive);
}
#else
void devbuf__mutex_init(pthread_mutex_t *mutex) { pthread_mutex_init(mutex, NULL); }
#endif

void devbuf__cond_init_monotonic(pthread_cond_t *cond) {
  pthread_condattr_t attributes;
  pthread_condattr_init(&attributes);
  pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
  pthread_cond_init(cond, &attributes);
  pthread_condattr_destroy(&attributes);
}

// The allocation's own address sits just before the lines, for the free.
void *devbuf__calloc_lines(size_t size) {
  size_t whole_lines = (size + DEVBUF__CACHE_LINE - 1) & ~(size_t)(DEVBUF__CACHE_LINE - 1);
  if (whole_lines < size || whole_lines > SIZE_MAX - DEVBUF__CACHE_LINE - sizeof(void *))
    return NULL;
  char *allocation = devbuf__calloc(1, whole_lines + DEVBUF__CACHE_LINE + sizeof allocation);
  if (!allocation) return NULL;
  uintptr_t first = ((uintptr_t)allocation + sizeof allocation + DEVBUF__CACHE_LINE - 1) &
                    ~(uintptr_t)(DEVBUF__CACHE_LINE - 1);
  char *lines = allocation + (first - (uintptr_t)allocation);
  memcpy(lines - sizeof allocation, &allocation, sizeof allocation);
  return lines;
}

void devbuf__free_lines(void *pointer) {
  if (!pointer) return;
  char *allocation;
  memcpy(&allocation, (char *)pointer - sizeof allocation, sizeof allocation);
  devbuf__free(allocation);
}
