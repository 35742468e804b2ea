// Finds the OpenCL ICD loader at run time (libOpenCL.so.1, or DEVBUF_OPENCL_LIBRARY) and
// resolves every entry point devbuf uses, once per process. Without it, opencl:N answers
// UNAVAILABLE with the reason, and nothing else changes.
#include "opencl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static devbuf__opencl_api api;
static char load_failure[300]; // empty once loaded
static void *library;          // once loaded

static void load(void) {
  const char *path = getenv("DEVBUF_OPENCL_LIBRARY");
  if (!path || !*path) path = "libOpenCL.so.1";
  void *loaded = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!loaded) {
    snprintf(load_failure, sizeof load_failure, "cannot load the OpenCL ICD loader %s: %s", path,
             dlerror());
    return;
  }
#define DEVBUF_OPENCL_RESOLVE_(ret, name, params)                                             \
  api.name = (ret(*) params)dlsym(loaded, #name);                                             \
  if (!api.name) {                                                                            \
    snprintf(load_failure, sizeof load_failure, "%s lacks %s (OpenCL 1.2 is required)", path, \
             #name);                                                                          \
    dlclose(loaded);                                                                          \
    return;                                                                                   \
  }
  DEVBUF_OPENCL_FUNCTIONS(DEVBUF_OPENCL_RESOLVE_)
#undef DEVBUF_OPENCL_RESOLVE_
  library = loaded;
  // The library stays loaded for the life of the process: drivers keep threads in it.
}

const devbuf__opencl_api *devbuf__opencl_load(const char **out_reason) {
  pthread_once(&load_once, load);
  *out_reason = load_failure;
  return load_failure[0] ? NULL : &api;
}

void *devbuf__opencl_symbol(const char *name) {
  pthread_once(&load_once, load);
  return library ? dlsym(library, name) : NULL;
}
