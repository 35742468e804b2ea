// Finds the CUDA driver at run time (libcuda.so.1, or DEVBUF_CUDA_LIBRARY), resolves every
// entry point by its versioned name and initialises it, once per process. The toolkit's
// stub library, which answers CUDA_ERROR_STUB_LIBRARY, counts as no driver.
#include "cuda_backend.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static devbuf__cuda_api api;
static char load_failure[300]; // empty once loaded
static void *library;          // once loaded and initialised

static void load(void) {
  const char *path = getenv("DEVBUF_CUDA_LIBRARY");
  if (!path || !*path) path = "libcuda.so.1";
  void *loaded = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!loaded) {
    snprintf(load_failure, sizeof load_failure, "cannot load the CUDA driver %s: %s", path,
             dlerror());
    return;
  }
#define DEVBUF_CUDA_RESOLVE_(ret, field, symbol, params)                           \
  api.field = (ret(*) params)dlsym(loaded, symbol);                                \
  if (!api.field) {                                                                \
    snprintf(load_failure, sizeof load_failure,                                    \
             "%s lacks %s (a CUDA 11.0 or newer driver is needed)", path, symbol); \
    dlclose(loaded);                                                               \
    return;                                                                        \
  }
  DEVBUF_CUDA_FUNCTIONS(DEVBUF_CUDA_RESOLVE_)
#undef DEVBUF_CUDA_RESOLVE_
  api.cuFuncGetParamInfo =
      (CUresult(*)(CUfunction, size_t, size_t *, size_t *))dlsym(loaded, "cuFuncGetParamInfo");
  // Virtual memory management: every entry point, or none of them.
  *(void **)&api.cuMemAddressReserve = dlsym(loaded, "cuMemAddressReserve");
  *(void **)&api.cuMemAddressFree = dlsym(loaded, "cuMemAddressFree");
  *(void **)&api.cuMemCreate = dlsym(loaded, "cuMemCreate");
  *(void **)&api.cuMemRelease = dlsym(loaded, "cuMemRelease");
  *(void **)&api.cuMemMap = dlsym(loaded, "cuMemMap");
  *(void **)&api.cuMemUnmap = dlsym(loaded, "cuMemUnmap");
  *(void **)&api.cuMemSetAccess = dlsym(loaded, "cuMemSetAccess");
  *(void **)&api.cuMemGetAllocationGranularity = dlsym(loaded, "cuMemGetAllocationGranularity");
  *(void **)&api.cuMemExportToShareableHandle = dlsym(loaded, "cuMemExportToShareableHandle");
  *(void **)&api.cuMemImportFromShareableHandle = dlsym(loaded, "cuMemImportFromShareableHandle");
  *(void **)&api.cuDeviceGetUuid = dlsym(loaded, "cuDeviceGetUuid_v2");
  if (!api.cuMemAddressReserve || !api.cuMemAddressFree || !api.cuMemCreate || !api.cuMemRelease ||
      !api.cuMemMap || !api.cuMemUnmap || !api.cuMemSetAccess || !api.cuMemGetAllocationGranularity)
    api.cuMemAddressReserve = NULL; // the marker the backend tests
  CUresult code = api.cuInit(0);
  if (code == CUDA_ERROR_STUB_LIBRARY) {
    snprintf(load_failure, sizeof load_failure,
             "%s is the CUDA toolkit's stub library (CUDA_ERROR_STUB_LIBRARY): no NVIDIA driver is "
             "installed",
             path);
  } else if (code == CUDA_ERROR_NO_DEVICE) {
    snprintf(load_failure, sizeof load_failure,
             "the CUDA driver found no device (CUDA_ERROR_NO_DEVICE)");
  } else if (code != CUDA_SUCCESS) {
    const char *name = NULL;
    api.cuGetErrorName(code, &name);
    snprintf(load_failure, sizeof load_failure, "cuInit failed: %s (%d)",
             name ? name : "unknown error", code);
  }
  if (!load_failure[0]) library = loaded;
  // The library stays loaded for the life of the process: the driver keeps threads in it.
}

const devbuf__cuda_api *devbuf__cuda_load(const char **out_reason) {
  pthread_once(&load_once, load);
  *out_reason = load_failure;
  return load_failure[0] ? NULL : &api;
}

void *devbuf__cuda_symbol(const char *name) {
  pthread_once(&load_once, load);
  return library ? dlsym(library, name) : NULL;
}
