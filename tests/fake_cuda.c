// A stand-in for libcuda.so.1 that runs on the CPU, so that the CUDA backend's own logic
// (streams, events, ordering, memory kinds, copies, failures) is exercised on machines
// without a GPU: tests load it through DEVBUF_CUDA_LIBRARY. It is not a GPU emulator.
// Device memory is host memory; each stream is a thread that runs its commands in order,
// later than they are enqueued, so that a missing wait shows up as a wrong result; kernels
// are C functions found by name (the tests' kernels and devbuf's built-ins). A kernel
// named "fault" poisons the context as a device fault does: every call fails from then on.
// Launches are held to the driver's limits on blocks and grids, and to each kernel's own
// threads per block (add_one_bounded takes 128, as its __launch_bounds__ says on a GPU).
// Only what devbuf calls is here, with the driver API's signatures.
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;

enum {
  OK = 0,
  INVALID_VALUE = 1,
  OUT_OF_MEMORY = 2,
  NOT_FOUND = 500,
  NOT_READY = 600,
  INVALID_PTX = 218,
  INVALID_CONTEXT = 201,
  ILLEGAL_ADDRESS = 700,
  LAUNCH_OUT_OF_RESOURCES = 701,
};

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; // memory accounting, the fault
static size_t capacity, allocated;
static CUresult sticky; // the fault every call returns once a kernel faulted

static CUresult failed(void) {
  pthread_mutex_lock(&lock);
  CUresult result = sticky;
  pthread_mutex_unlock(&lock);
  return result;
}

// ---- memory: each block remembers its size, so that frees can be accounted -------------

typedef struct block {
  size_t size;
  size_t pad[7]; // 64-byte header: what follows is 64-byte aligned like malloc's largest
} block;

// Ranges the driver knows (allocations and registered host memory), for cuPointerGetAttribute.
typedef struct range {
  uintptr_t start;
  size_t size;
  struct range *next;
} range;
static range *known; // under lock

static void know(const void *p, size_t size) {
  range *r = malloc(sizeof *r);
  if (!r) return;
  *r = (range){(uintptr_t)p, size, NULL};
  pthread_mutex_lock(&lock);
  r->next = known;
  known = r;
  pthread_mutex_unlock(&lock);
}

static bool forget(const void *p) {
  pthread_mutex_lock(&lock);
  range *found = NULL;
  for (range **link = &known; *link; link = &(*link)->next)
    if ((*link)->start == (uintptr_t)p) {
      found = *link;
      *link = found->next;
      break;
    }
  pthread_mutex_unlock(&lock);
  free(found);
  return found != NULL;
}

static CUresult alloc_block(size_t size, void **out) {
  if (size == 0) return INVALID_VALUE;
  pthread_mutex_lock(&lock);
  bool fits = size <= capacity - allocated;
  if (fits) allocated += size;
  pthread_mutex_unlock(&lock);
  if (!fits) return OUT_OF_MEMORY;
  block *b = NULL;
  if (posix_memalign((void **)&b, 256, sizeof(block) + size) != 0) {
    pthread_mutex_lock(&lock);
    allocated -= size;
    pthread_mutex_unlock(&lock);
    return OUT_OF_MEMORY;
  }
  b->size = size;
  memset(b + 1, 0xa5, size); // not zero: code that forgets to clear memory shows it
  *out = b + 1;
  know(b + 1, size);
  return OK;
}

static CUresult free_block(void *address) {
  if (!address) return OK;
  block *b = (block *)address - 1;
  if (!forget(address)) return INVALID_VALUE;
  pthread_mutex_lock(&lock);
  allocated -= b->size;
  pthread_mutex_unlock(&lock);
  free(b);
  return OK;
}

// ---- streams: a thread per stream runs its commands in order ----------------------------

// The user's handle and every queued command that names the event hold a reference: the
// driver lets an event be destroyed while a stream still waits for it.
typedef struct event {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  uint64_t recorded, completed; // generations: a record is complete once its command ran
  size_t refs;                  // under lock
} event;

static void event_unref(event *e) {
  pthread_mutex_lock(&e->lock);
  bool last = --e->refs == 0;
  pthread_mutex_unlock(&e->lock);
  if (!last) return;
  pthread_cond_destroy(&e->changed);
  pthread_mutex_destroy(&e->lock);
  free(e);
}

typedef enum kind { COPY, SET, KERNEL, RECORD, WAIT_EVENT, HOST_FUNC } kind;

typedef struct function function;

typedef struct command {
  kind kind;
  void *dst;
  const void *src;
  size_t size, count;
  uint32_t value;
  event *event;
  uint64_t generation;
  const function *function;
  unsigned threads;     // along x: the index the kernels read
  unsigned long repeat; // the grid's threads along y and z, each running the x range again
  unsigned char params[128];
  void (*host)(void *);
  void *host_data;
  struct command *next;
} command;

typedef struct stream {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  command *head, *tail;
  bool busy, stop;
  pthread_t thread;
  struct stream *next_stream; // under streams_lock
} stream;

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static stream *streams; // every live stream

struct function {
  const char *name;
  size_t param_count;
  size_t offsets[6], sizes[6];
  void (*run)(const unsigned char *params, unsigned thread, unsigned threads);
  int max_threads; // per block (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK); 0: the device's 1024
};

static void run_command(command *c);

static void *stream_main(void *arg) {
  stream *s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->changed, &s->lock);
    if (!s->head) break;
    command *c = s->head;
    s->busy = true;
    pthread_mutex_unlock(&s->lock);
    struct timespec later = {0, 20000}; // commands run a little after they were enqueued
    nanosleep(&later, NULL);
    run_command(c);
    if (c->event) event_unref(c->event);
    pthread_mutex_lock(&s->lock);
    s->head = c->next;
    if (!s->head) s->tail = NULL;
    s->busy = false;
    free(c);
    pthread_cond_broadcast(&s->changed);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static void complete_event(event *e, uint64_t generation) {
  pthread_mutex_lock(&e->lock);
  if (generation > e->completed) e->completed = generation;
  pthread_cond_broadcast(&e->changed);
  pthread_mutex_unlock(&e->lock);
}

static void run_command(command *c) {
  if (failed() && c->kind != RECORD) return; // after a fault nothing runs; events still complete
  switch (c->kind) {
  case COPY:
    memmove(c->dst, c->src, c->size);
    break;
  case SET:
    for (size_t i = 0; i < c->count; i++) memcpy((char *)c->dst + i * c->size, &c->value, c->size);
    break;
  case KERNEL: // the kernels index along x only: threads along y and z repeat the same work
    for (unsigned long r = 0; r < c->repeat; r++)
      for (unsigned t = 0; t < c->threads; t++) c->function->run(c->params, t, c->threads);
    break;
  case RECORD:
    complete_event(c->event, c->generation);
    break;
  case WAIT_EVENT:
    pthread_mutex_lock(&c->event->lock);
    while (c->event->completed < c->generation)
      pthread_cond_wait(&c->event->changed, &c->event->lock);
    pthread_mutex_unlock(&c->event->lock);
    break;
  case HOST_FUNC:
    c->host(c->host_data);
    break;
  }
}

static command *new_command(kind what) {
  command *c = calloc(1, sizeof *c);
  if (c) c->kind = what;
  return c;
}

// The legacy stream (NULL) runs commands at once.
static CUresult enqueue(stream *s, command *c) {
  if (!c) return OUT_OF_MEMORY;
  if (!s) {
    run_command(c);
    if (c->event) event_unref(c->event);
    free(c);
    return OK;
  }
  pthread_mutex_lock(&s->lock);
  if (s->tail)
    s->tail->next = c;
  else
    s->head = c;
  s->tail = c;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  return OK;
}

static void drain(stream *s) {
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  while (s->head) pthread_cond_wait(&s->changed, &s->lock);
  pthread_mutex_unlock(&s->lock);
}

// What the driver does in cuMemFree, cuMemFreeHost and cuMemUnmap ("may perform implicit
// synchronization"): they return once every stream's work is done, so a stream held back
// by anything the caller itself would release later holds that caller for good.
static void drain_every_stream(void) {
  pthread_mutex_lock(&streams_lock);
  for (stream *s = streams; s; s = s->next_stream) drain(s);
  pthread_mutex_unlock(&streams_lock);
}

// ---- kernels ------------------------------------------------------------------------------

static uint64_t u64_at(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static void scale(const unsigned char *p, unsigned i, unsigned threads) {
  (void)threads; // (float *out, const float *in, float factor, u64 n)
  float factor;
  memcpy(&factor, p + 16, 4);
  if (i < u64_at(p + 24))
    ((float *)(uintptr_t)u64_at(p))[i] = ((const float *)(uintptr_t)u64_at(p + 8))[i] * factor;
}

static void add_one(const unsigned char *p, unsigned i, unsigned threads) {
  (void)threads; // (int *data, u64 n)
  if (i < u64_at(p + 8)) ((int *)(uintptr_t)u64_at(p))[i] += 1;
}

// devbuf's fill (src/cuda_builtins.cu): (unsigned char *dst, u64 size, pattern { 64 bytes },
// unsigned pattern_size); 16 bytes a thread, striding over the grid.
static void devbuf_fill(const unsigned char *p, unsigned t, unsigned threads) {
  unsigned char *dst = (unsigned char *)(uintptr_t)u64_at(p);
  uint64_t size = u64_at(p + 8);
  unsigned pattern_size;
  memcpy(&pattern_size, p + 80, 4);
  if (pattern_size == 0 || pattern_size > 64) return;
  for (uint64_t start = (uint64_t)t * 16; start < size; start += (uint64_t)threads * 16)
    for (uint64_t i = start; i < size && i < start + 16; i++) dst[i] = p[16 + i % pattern_size];
}

static void fault(const unsigned char *p, unsigned t, unsigned threads) {
  (void)threads;
  (void)p;
  if (t) return;
  pthread_mutex_lock(&lock);
  sticky = ILLEGAL_ADDRESS;
  pthread_mutex_unlock(&lock);
}

static const function functions[] = {
    {"scale", 4, {0, 8, 16, 24}, {8, 8, 4, 8}, scale, 0},
    {"add_one", 2, {0, 8}, {8, 8}, add_one, 0},
    {"devbuf_fill", 4, {0, 8, 16, 80}, {8, 8, 64, 4}, devbuf_fill, 0},
    {"fault", 1, {0}, {8}, fault, 0},
    {"add_one_bounded", 2, {0, 8}, {8, 8}, add_one, 128},
};

// ---- the driver API ------------------------------------------------------------------------

static const struct {
  CUresult code;
  const char *name;
} names[] = {{OK, "CUDA_SUCCESS"},
             {INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
             {OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
             {NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
             {NOT_READY, "CUDA_ERROR_NOT_READY"},
             {INVALID_PTX, "CUDA_ERROR_INVALID_PTX"},
             {INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
             {ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"},
             {LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"}};

EXPORT CUresult cuGetErrorName(CUresult code, const char **out) {
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].code == code) {
      *out = names[i].name;
      return OK;
    }
  *out = NULL;
  return INVALID_VALUE;
}

EXPORT CUresult cuInit(unsigned flags) {
  (void)flags;
  const char *mib = getenv("DEVBUF_FAKE_CUDA_MIB");
  pthread_mutex_lock(&lock);
  capacity = (size_t)(mib ? strtoull(mib, NULL, 10) : 512) << 20;
  pthread_mutex_unlock(&lock);
  return OK;
}

EXPORT CUresult cuDriverGetVersion(int *out) {
  *out = 13000;
  return OK;
}

EXPORT CUresult cuDeviceGetCount(int *out) {
  *out = 1;
  return OK;
}

EXPORT CUresult cuDeviceGet(int *out, int index) {
  *out = index;
  return index == 0 ? OK : INVALID_VALUE;
}

EXPORT CUresult cuDeviceGetName(char *out, int size, int device) {
  (void)device;
  snprintf(out, (size_t)size, "devbuf fake CUDA device");
  return OK;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *out, int device) {
  (void)device;
  *out = capacity;
  return OK;
}

EXPORT CUresult cuDeviceGetAttribute(int *out, int which, int device) {
  (void)device;
  switch (which) {
  case 41:  // unified addressing
  case 83:  // managed memory
  case 103: // memory exported as POSIX descriptors
    *out = 1;
    break;
  case 102: // virtual memory management: FAKE_CUDA_NO_VMM stands in for a GPU without it
    *out = !getenv("FAKE_CUDA_NO_VMM");
    break;
  case 75: // compute capability
    *out = 9;
    break;
  default:
    *out = 0;
  }
  return OK;
}

EXPORT CUresult cuDeviceGetUuid_v2(unsigned char *out, int device) {
  for (int i = 0; i < 16; i++) out[i] = (unsigned char)(0xd0 + device + i);
  return OK;
}

static int context_token;

EXPORT CUresult cuDevicePrimaryCtxRetain(void **out, int device) {
  (void)device;
  *out = &context_token;
  return OK;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(int device) {
  (void)device;
  return OK;
}

// The calling thread's current context, as the driver keeps it: the device's primary one, a
// context of the program's own (fake_cuda_foreign_context: a test's stand-in for one the
// CUDA runtime or another library made current), or none. Memory, streams, events and
// modules are made only in the device's one, as the driver makes them in the current one.
static int foreign_token;
static _Thread_local void *current_context;

EXPORT void *fake_cuda_foreign_context(void) { return &foreign_token; }

EXPORT CUresult cuCtxSetCurrent(void *context) {
  if (context && context != &context_token && context != &foreign_token) return INVALID_CONTEXT;
  current_context = context;
  return OK;
}

EXPORT CUresult cuCtxGetCurrent(void **out) {
  *out = current_context;
  return OK;
}

static bool in_device_context(void) { return current_context == &context_token; }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *out, size_t size) {
  if (!in_device_context()) return INVALID_CONTEXT;
  void *p = NULL;
  CUresult code = failed() ? failed() : alloc_block(size, &p);
  *out = (CUdeviceptr)(uintptr_t)p;
  return code;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr address) {
  if (!in_device_context()) return INVALID_CONTEXT;
  drain_every_stream();
  return free_block((void *)(uintptr_t)address);
}

EXPORT CUresult cuMemAllocHost_v2(void **out, size_t size) {
  if (!in_device_context()) return INVALID_CONTEXT;
  return failed() ? failed() : alloc_block(size, out);
}

EXPORT CUresult cuMemFreeHost(void *address) {
  if (!in_device_context()) return INVALID_CONTEXT;
  drain_every_stream();
  return free_block(address);
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *out, void *host, unsigned flags) {
  (void)flags;
  *out = (CUdeviceptr)(uintptr_t)host;
  return OK;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *out, size_t size, unsigned flags) {
  if (!in_device_context()) return INVALID_CONTEXT;
  (void)flags;
  return cuMemAlloc_v2(out, size);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *out, size_t size, void *s) {
  drain(s);
  return cuMemAlloc_v2(out, size);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr address, void *s) {
  drain(s); // ordered on its stream only
  return free_block((void *)(uintptr_t)address);
}

// ---- virtual memory management: reserved addresses are host addresses with no access;
// a physical allocation counts against the capacity and is host memory once mapped ------

#define GRANULARITY ((size_t)2 << 20)

// Physical allocations asked for with a POSIX descriptor handle (or imported from one) are
// memory files, mapped shared: another process that imports the descriptor sees the bytes.
typedef struct physical {
  size_t size;
  uintptr_t mapped_at; // 0 while unmapped
  int fd;              // -1: anonymous memory of the reservation itself
  bool imported;       // counts against no capacity: its exporter's memory
  struct physical *next;
} physical;
#define POSIX_FD_HANDLE 1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
#define NOT_SUPPORTED   801
static physical *physicals; // under lock: every physical allocation, for cuMemUnmap to find

EXPORT CUresult cuMemGetAllocationGranularity(size_t *out, const void *prop, int option) {
  (void)prop, (void)option;
  *out = GRANULARITY;
  return OK;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *out, size_t size, size_t alignment,
                                    CUdeviceptr hint, unsigned long long flags) {
  if (!in_device_context()) return INVALID_CONTEXT;
  (void)hint, (void)flags;
  if (!size || size % GRANULARITY || alignment % GRANULARITY) return INVALID_VALUE;
  if (failed()) return failed();
  void *base = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return OUT_OF_MEMORY;
  know(base, size);
  *out = (CUdeviceptr)(uintptr_t)base;
  return OK;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr base, size_t size) {
  if (!forget((void *)(uintptr_t)base)) return INVALID_VALUE;
  munmap((void *)(uintptr_t)base, size);
  return OK;
}

static void add_physical(physical *p, unsigned long long *out) {
  pthread_mutex_lock(&lock);
  p->next = physicals;
  physicals = p;
  pthread_mutex_unlock(&lock);
  *out = (unsigned long long)(uintptr_t)p;
}

EXPORT CUresult cuMemCreate(unsigned long long *out, size_t size, const void *prop,
                            unsigned long long flags) {
  if (!in_device_context()) return INVALID_CONTEXT;
  (void)flags;
  if (!size || size % GRANULARITY || !prop) return INVALID_VALUE;
  int handle_types = ((const int *)prop)[1]; // requestedHandleTypes
  if (handle_types & ~POSIX_FD_HANDLE) return NOT_SUPPORTED;
  if (failed()) return failed();
  pthread_mutex_lock(&lock);
  bool fits = size <= capacity - allocated;
  if (fits) allocated += size;
  pthread_mutex_unlock(&lock);
  physical *p = fits ? calloc(1, sizeof *p) : NULL;
  if (!p) {
    if (fits) {
      pthread_mutex_lock(&lock);
      allocated -= size;
      pthread_mutex_unlock(&lock);
    }
    return OUT_OF_MEMORY;
  }
  p->size = size;
  p->fd = -1;
  if (handle_types == POSIX_FD_HANDLE) {
    p->fd = memfd_create("fake-cuda-shareable", MFD_CLOEXEC);
    if (p->fd < 0 || ftruncate(p->fd, (off_t)size) != 0) {
      if (p->fd >= 0) close(p->fd);
      pthread_mutex_lock(&lock);
      allocated -= size;
      pthread_mutex_unlock(&lock);
      free(p);
      return OUT_OF_MEMORY;
    }
  }
  add_physical(p, out);
  return OK;
}

EXPORT CUresult cuMemExportToShareableHandle(void *out, unsigned long long handle, int type,
                                             unsigned long long flags) {
  physical *p = (physical *)(uintptr_t)handle;
  if (!out || !p || flags) return INVALID_VALUE;
  if (type != POSIX_FD_HANDLE || p->fd < 0) return NOT_SUPPORTED; // created without the type
  if (failed()) return failed();
  int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return OUT_OF_MEMORY;
  *(int *)out = fd;
  return OK;
}

EXPORT CUresult cuMemImportFromShareableHandle(unsigned long long *out, void *os_handle, int type) {
  int fd = (int)(intptr_t)os_handle;
  struct stat info;
  if (!out || type != POSIX_FD_HANDLE || fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) ||
      info.st_size <= 0 || (size_t)info.st_size % GRANULARITY)
    return INVALID_VALUE;
  if (failed()) return failed();
  physical *p = calloc(1, sizeof *p);
  if (!p) return OUT_OF_MEMORY;
  p->size = (size_t)info.st_size;
  p->imported = true;
  p->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0); // the caller may close its descriptor at once
  if (p->fd < 0) {
    free(p);
    return OUT_OF_MEMORY;
  }
  add_physical(p, out);
  return OK;
}

EXPORT CUresult cuMemRelease(unsigned long long handle) {
  if (!in_device_context()) return INVALID_CONTEXT;
  physical *p = (physical *)(uintptr_t)handle;
  pthread_mutex_lock(&lock);
  physical **link = &physicals;
  while (*link && *link != p) link = &(*link)->next;
  bool ok =
      *link && !p->mapped_at; // the driver would keep it until unmapped; devbuf never asks that
  if (ok) {
    *link = p->next;
    if (!p->imported) allocated -= p->size;
  }
  pthread_mutex_unlock(&lock);
  if (!ok) return INVALID_VALUE;
  if (p->fd >= 0) close(p->fd);
  free(p);
  return OK;
}

EXPORT CUresult cuMemMap(CUdeviceptr at, size_t size, size_t offset, unsigned long long handle,
                         unsigned long long flags) {
  if (!in_device_context()) return INVALID_CONTEXT;
  (void)flags;
  physical *p = (physical *)(uintptr_t)handle;
  if (!p || p->mapped_at || offset || size != p->size || at % GRANULARITY) return INVALID_VALUE;
  if (p->fd >= 0) { // the memory file's pages, where the reservation's were
    if (mmap((void *)(uintptr_t)at, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd,
             0) == MAP_FAILED)
      return INVALID_VALUE;
  } else {
    if (mprotect((void *)(uintptr_t)at, size, PROT_READ | PROT_WRITE) != 0) return INVALID_VALUE;
    memset((void *)(uintptr_t)at, 0xa5, size); // not zero, like cuMemAlloc here
  }
  pthread_mutex_lock(&lock);
  p->mapped_at = at;
  pthread_mutex_unlock(&lock);
  return OK;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr at, size_t size, const void *desc, size_t count) {
  (void)at, (void)size;
  return desc && count ? OK : INVALID_VALUE;
}

// Unmaps whole mappings only (what devbuf does; the driver allows more).
EXPORT CUresult cuMemUnmap(CUdeviceptr at, size_t size) {
  if (!in_device_context()) return INVALID_CONTEXT;
  drain_every_stream();
  size_t unmapped = 0;
  bool files = false;
  pthread_mutex_lock(&lock);
  for (physical *p = physicals; p; p = p->next)
    if (p->mapped_at >= at && p->mapped_at + p->size <= at + size) {
      unmapped += p->size;
      p->mapped_at = 0;
      files = files || p->fd >= 0;
    }
  pthread_mutex_unlock(&lock);
  if (unmapped != size) return INVALID_VALUE;
  if (files) // the reservation's own pages come back in place of the file's
    return mmap((void *)(uintptr_t)at, size, PROT_NONE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED
               ? INVALID_VALUE
               : OK;
  if (madvise((void *)(uintptr_t)at, size, MADV_DONTNEED) != 0 ||
      mprotect((void *)(uintptr_t)at, size, PROT_NONE) != 0)
    return INVALID_VALUE;
  return OK;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  pthread_mutex_lock(&lock);
  *free_bytes = capacity - allocated;
  *total = capacity;
  pthread_mutex_unlock(&lock);
  return OK;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) {
  (void)flags;
  if (!p || !size) return INVALID_VALUE;
  know(p, size);
  return OK;
}

EXPORT CUresult cuMemHostUnregister(void *p) { return forget(p) ? OK : INVALID_VALUE; }

EXPORT CUresult cuPointerGetAttribute(void *out, int attribute, CUdeviceptr p) {
  if (attribute != 2) return INVALID_VALUE; // memory type only
  bool found = false;
  pthread_mutex_lock(&lock);
  for (range *r = known; r && !found; r = r->next) found = p >= r->start && p - r->start < r->size;
  pthread_mutex_unlock(&lock);
  if (!found) return INVALID_VALUE; // pageable memory the driver does not know
  *(unsigned *)out = 2;
  return OK;
}

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t size, void *s) {
  if (!in_device_context()) return INVALID_CONTEXT;
  if (failed()) return failed();
  command *c = new_command(COPY);
  if (c) {
    c->dst = (void *)(uintptr_t)dst;
    c->src = (const void *)(uintptr_t)src;
    c->size = size;
  }
  return enqueue(s, c);
}

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t size) {
  return cuMemcpyAsync(dst, src, size, NULL);
}

static CUresult set(CUdeviceptr dst, uint32_t value, size_t width, size_t count, void *s) {
  if (failed()) return failed();
  if (dst % width) return INVALID_VALUE;
  command *c = new_command(SET);
  if (c) {
    c->dst = (void *)(uintptr_t)dst;
    c->value = value;
    c->size = width;
    c->count = count;
  }
  return enqueue(s, c);
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  return set(dst, value, 1, count, NULL);
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, void *s) {
  if (!in_device_context()) return INVALID_CONTEXT;
  return set(dst, value, 1, count, s);
}
EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, void *s) {
  if (!in_device_context()) return INVALID_CONTEXT;
  return set(dst, value, 2, count, s);
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t count, void *s) {
  if (!in_device_context()) return INVALID_CONTEXT;
  return set(dst, value, 4, count, s);
}

EXPORT CUresult cuStreamCreate(stream **out, unsigned flags) {
  if (!in_device_context()) return INVALID_CONTEXT;
  (void)flags;
  stream *s = calloc(1, sizeof *s);
  if (!s) return OUT_OF_MEMORY;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->changed, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    free(s);
    return OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&streams_lock);
  s->next_stream = streams;
  streams = s;
  pthread_mutex_unlock(&streams_lock);
  *out = s;
  return OK;
}

EXPORT CUresult cuStreamDestroy_v2(stream *s) {
  if (!in_device_context()) return INVALID_CONTEXT;
  if (!s) return INVALID_VALUE;
  pthread_mutex_lock(&streams_lock);
  for (stream **at = &streams; *at; at = &(*at)->next_stream)
    if (*at == s) {
      *at = s->next_stream;
      break;
    }
  pthread_mutex_unlock(&streams_lock);
  pthread_mutex_lock(&s->lock);
  s->stop = true; // what is queued still runs, as with the driver
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->changed);
  pthread_mutex_destroy(&s->lock);
  free(s);
  return OK;
}

EXPORT CUresult cuStreamSynchronize(stream *s) {
  drain(s);
  return failed();
}

EXPORT CUresult cuEventCreate(event **out, unsigned flags) {
  if (!in_device_context()) return INVALID_CONTEXT;
  (void)flags;
  event *e = calloc(1, sizeof *e);
  if (!e) return OUT_OF_MEMORY;
  pthread_mutex_init(&e->lock, NULL);
  pthread_cond_init(&e->changed, NULL);
  e->refs = 1;
  *out = e;
  return OK;
}

EXPORT CUresult cuEventDestroy_v2(event *e) {
  if (!e) return INVALID_VALUE;
  event_unref(e);
  return OK;
}

EXPORT CUresult cuEventRecord(event *e, stream *s) {
  if (failed()) return failed();
  command *c = new_command(RECORD);
  if (!c) return OUT_OF_MEMORY;
  pthread_mutex_lock(&e->lock);
  c->event = e;
  c->generation = ++e->recorded;
  e->refs++;
  pthread_mutex_unlock(&e->lock);
  return enqueue(s, c);
}

EXPORT CUresult cuEventQuery(event *e) {
  pthread_mutex_lock(&e->lock);
  bool done = e->completed >= e->recorded;
  pthread_mutex_unlock(&e->lock);
  return failed() ? failed() : done ? OK : NOT_READY;
}

EXPORT CUresult cuEventSynchronize(event *e) {
  pthread_mutex_lock(&e->lock);
  uint64_t target = e->recorded;
  while (e->completed < target) pthread_cond_wait(&e->changed, &e->lock);
  pthread_mutex_unlock(&e->lock);
  return failed();
}

EXPORT CUresult cuStreamWaitEvent(stream *s, event *e, unsigned flags) {
  (void)flags;
  if (failed()) return failed();
  command *c = new_command(WAIT_EVENT);
  if (!c) return OUT_OF_MEMORY;
  pthread_mutex_lock(&e->lock);
  c->event = e;
  c->generation = e->recorded;
  e->refs++;
  pthread_mutex_unlock(&e->lock);
  return enqueue(s, c);
}

EXPORT CUresult cuLaunchHostFunc(stream *s, void (*host)(void *), void *data) {
  if (failed()) return failed();
  command *c = new_command(HOST_FUNC);
  if (c) {
    c->host = host;
    c->host_data = data;
  }
  return enqueue(s, c);
}

// A module is any image; its functions are the ones above.
static int module_token;

EXPORT CUresult cuModuleLoadData(void **out, const void *image) {
  if (!in_device_context()) return INVALID_CONTEXT;
  if (!image) return INVALID_VALUE;
  *out = &module_token;
  return failed();
}

// PTX text (it starts with a comment or .version) with the instruction "bogus" fails as
// the JIT compiler fails, its log in the caller's buffer (CU_JIT_ERROR_LOG_BUFFER: 5, its
// size: 6).
EXPORT CUresult cuModuleLoadDataEx(void **out, const void *image, unsigned count, int *options,
                                   void **values) {
  if (!in_device_context()) return INVALID_CONTEXT;
  if (!image) return INVALID_VALUE;
  const char *text = image, *bogus = NULL;
  if (strncmp(text, "//", 2) == 0 || strncmp(text, ".version", 8) == 0)
    bogus = strstr(text, "bogus");
  if (!bogus) return cuModuleLoadData(out, image);
  char *log = NULL;
  size_t log_size = 0;
  for (unsigned i = 0; i < count; i++) {
    if (options[i] == 5) log = values[i];
    if (options[i] == 6) log_size = (size_t)(uintptr_t)values[i];
  }
  int line = 1;
  for (const char *c = text; c < bogus; c++) line += *c == '\n';
  if (log && log_size)
    snprintf(log, log_size,
             "ptxas application ptx input, line %d; error   : Unknown instruction 'bogus'\nptxas "
             "fatal   : Ptx assembly aborted due to errors\n",
             line);
  return INVALID_PTX;
}

EXPORT CUresult cuModuleUnload(void *module) {
  return module == &module_token ? OK : INVALID_VALUE;
}

EXPORT CUresult cuModuleGetFunction(const function **out, void *module, const char *name) {
  if (!in_device_context()) return INVALID_CONTEXT;
  if (module != &module_token) return INVALID_VALUE;
  for (size_t i = 0; i < sizeof functions / sizeof functions[0]; i++)
    if (strcmp(functions[i].name, name) == 0) {
      *out = &functions[i];
      return OK;
    }
  return NOT_FOUND;
}

EXPORT CUresult cuFuncGetParamInfo(const function *f, size_t index, size_t *offset, size_t *size) {
  if (!in_device_context()) return INVALID_CONTEXT;
  if (index >= f->param_count) return INVALID_VALUE;
  *offset = f->offsets[index];
  *size = f->sizes[index];
  return OK;
}

static int threads_per_block(const function *f) { return f->max_threads ? f->max_threads : 1024; }

EXPORT CUresult cuFuncGetAttribute(int *out, int attribute, const function *f) {
  if (!in_device_context()) return INVALID_CONTEXT;
  if (!out || !f || attribute != 0) return INVALID_VALUE; // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
  *out = threads_per_block(f);
  return OK;
}

// The driver's limits (compute capability 9.0, as cuDeviceGetAttribute says): blocks of at
// most 1024 x 1024 x 64 threads and 1024 in all, grids of 2^31 - 1 x 65535 x 65535 blocks;
// a block past the kernel's own limit runs out of resources.
EXPORT CUresult cuLaunchKernel(const function *f, unsigned gx, unsigned gy, unsigned gz,
                               unsigned bx, unsigned by, unsigned bz, unsigned shared, stream *s,
                               void **params, void **extra) {
  if (!in_device_context()) return INVALID_CONTEXT;
  (void)shared;
  (void)extra;
  if (failed()) return failed();
  // (The stand-in also counts a launch's threads along x in 32 bits, as its kernels do.)
  if (!gx || !gy || !gz || !bx || !by || !bz || gx > 0x7fffffffu || gy > 65535 || gz > 65535 ||
      bx > 1024 || by > 1024 || bz > 64 || bx * by * bz > 1024 || (uint64_t)gx * bx > UINT32_MAX ||
      !params)
    return INVALID_VALUE;
  if (bx * by * bz > (unsigned)threads_per_block(f)) return LAUNCH_OUT_OF_RESOURCES;
  command *c = new_command(KERNEL);
  if (!c) return OUT_OF_MEMORY;
  c->function = f;
  c->threads = gx * bx;
  c->repeat = (unsigned long)gy * by * gz * bz;
  for (size_t i = 0; i < f->param_count; i++)
    memcpy(c->params + f->offsets[i], params[i], f->sizes[i]);
  return enqueue(s, c);
}
