// The one seam through which devbuf allocates host memory for its own bookkeeping.
#include "internal.h"

#include <stdlib.h>

void *devbuf__malloc(size_t size) { return malloc(size); }
void *devbuf__calloc(size_t count, size_t size) { return calloc(count, size); }
void devbuf__free(void *pointer) { free(pointer); }
