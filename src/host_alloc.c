// The one seam through which devbuf allocates host memory for its own bookkeeping, and the
// library's lock initialisation.
#include "internal.h"

#include <stdlib.h>

void *devbuf__malloc(size_t size) { return malloc(size); }
void *devbuf__calloc(size_t count, size_t size) { return calloc(count, size); }
void *devbuf__realloc(void *pointer, size_t size) { return realloc(pointer, size); }
void devbuf__free(void *pointer) { free(pointer); }

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
