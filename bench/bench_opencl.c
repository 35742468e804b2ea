// OpenCL benchmark (devbuf bench --device opencl:N), side by side with the driver in one
// process, alternating run by run:
//   allocation: a cached devbuf buffer (allocate + release) against clCreateBuffer +
//               clReleaseMemObject, at 4 KiB, 1 MiB and 64 MiB, in steady state;
//   copies:     devbuf copyin/copyout of 256 MiB of device memory against blocking
//               clEnqueueWriteBuffer/ReadBuffer of the same bytes;
//   queues:     small fills through a devbuf queue against the driver's own queue.
#include "bench.h"
#include "devbuf_opencl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RUNS 101

// The OpenCL types and entry points the driver's side of the comparison uses, declared from
// the specification (so that the benchmark builds without OpenCL headers) and taken from
// the library devbuf loaded (devbuf_opencl.h).
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_bitfield;
typedef void *cl_mem, *cl_command_queue, *cl_event, *cl_context, *cl_device_id;
#define CL_SUCCESS        0
#define CL_TRUE           1u
#define CL_MEM_READ_WRITE ((cl_bitfield)1)

typedef struct opencl_driver {
  cl_context context;
  cl_device_id device;
  cl_command_queue queue; // the driver's side's blocking copies
  cl_mem (*clCreateBuffer)(cl_context, cl_bitfield, size_t, void *, cl_int *);
  cl_int (*clReleaseMemObject)(cl_mem);
  cl_command_queue (*clCreateCommandQueue)(cl_context, cl_device_id, cl_bitfield, cl_int *);
  cl_int (*clReleaseCommandQueue)(cl_command_queue);
  cl_int (*clEnqueueWriteBuffer)(cl_command_queue, cl_mem, cl_uint, size_t, size_t, const void *,
                                 cl_uint, const cl_event *, cl_event *);
  cl_int (*clEnqueueReadBuffer)(cl_command_queue, cl_mem, cl_uint, size_t, size_t, void *, cl_uint,
                                const cl_event *, cl_event *);
  cl_int (*clEnqueueFillBuffer)(cl_command_queue, cl_mem, const void *, size_t, size_t, size_t,
                                cl_uint, const cl_event *, cl_event *);
  cl_int (*clWaitForEvents)(cl_uint, const cl_event *);
  cl_int (*clReleaseEvent)(cl_event);
  cl_int (*clFinish)(cl_command_queue);
} opencl_driver;

// False (the message set) when the device's handles or an entry point are missing.
static bool driver_open(devbuf_device_t *device, opencl_driver *out) {
  devbuf_opencl_handles_t handles;
  if (devbuf_opencl_device_handles(device, &handles) != DEVBUF_OK) return false;
  *out = (opencl_driver){.context = handles.context, .device = handles.device};
#define BENCH_RESOLVE_(name)                                                     \
  if (!(*(void **)&out->name = devbuf_opencl_entry_point(#name))) {              \
    devbuf_set_error(DEVBUF_UNAVAILABLE, "the OpenCL library has no %s", #name); \
    return false;                                                                \
  }
  BENCH_RESOLVE_(clCreateBuffer)
  BENCH_RESOLVE_(clReleaseMemObject)
  BENCH_RESOLVE_(clCreateCommandQueue)
  BENCH_RESOLVE_(clReleaseCommandQueue)
  BENCH_RESOLVE_(clEnqueueWriteBuffer)
  BENCH_RESOLVE_(clEnqueueReadBuffer)
  BENCH_RESOLVE_(clEnqueueFillBuffer)
  BENCH_RESOLVE_(clWaitForEvents)
  BENCH_RESOLVE_(clReleaseEvent)
  BENCH_RESOLVE_(clFinish)
#undef BENCH_RESOLVE_
  cl_int code = CL_SUCCESS;
  out->queue = out->clCreateCommandQueue(out->context, out->device, 0, &code);
  if (!out->queue) devbuf_set_error(DEVBUF_DEVICE_FAILURE, "clCreateCommandQueue: %d", (int)code);
  return out->queue != NULL;
}

static double time_devbuf(devbuf_allocator_t *allocator, size_t size, size_t iterations) {
  uint64_t start = 0;
  for (size_t i = 0; i <= iterations; i++) {
    if (i == 1) start = bench_now_ns(); // cycle 0 fills the cache
    devbuf_buffer_t *buffer;
    if (devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK)
      return -1;
    devbuf_buffer_release(buffer);
  }
  return (double)(bench_now_ns() - start) / (double)iterations;
}

// The driver's pair; with `back`, a 4-byte blocking write first makes drivers that
// allocate lazily (PoCL does) really back the buffer, as a cached devbuf buffer already is.
static double time_driver(const opencl_driver *cl, size_t size, size_t iterations, bool back) {
  uint32_t word = 1;
  uint64_t start = bench_now_ns();
  for (size_t i = 0; i < iterations; i++) {
    cl_int code;
    cl_mem mem = cl->clCreateBuffer(cl->context, CL_MEM_READ_WRITE, size, NULL, &code);
    if (!mem) return -1;
    if (back &&
        cl->clEnqueueWriteBuffer(cl->queue, mem, CL_TRUE, size - 4, 4, &word, 0, NULL, NULL))
      return -1;
    cl->clReleaseMemObject(mem);
  }
  return (double)(bench_now_ns() - start) / (double)iterations;
}

static void bench_opencl_alloc(const bench_config *config, const opencl_driver *cl) {
  static const size_t sizes[] = {4096, 1 << 20, 64 << 20};
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  size_t iterations = config->quick ? 2000 : 20000;
  printf("== cached allocation + release vs clCreateBuffer + clReleaseMemObject: ns per pair "
         "(target >= 100x faster) ==\n");
  printf("   %9s %10s %14s %8s %18s %8s\n", "size", "devbuf", "driver (lazy)", "ratio",
         "driver (backed)", "ratio");
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    double ours[MAX_RUNS], lazy[MAX_RUNS], backed[MAX_RUNS];
    for (int r = 0; r < runs; r++) {
      lazy[r] = time_driver(cl, sizes[s], iterations / 10 + 1, false);
      backed[r] = time_driver(cl, sizes[s], iterations / 100 + 1, true);
      ours[r] = time_devbuf(devbuf_device_allocator(config->device), sizes[s], iterations);
    }
    double a = bench_median(ours, runs), b = bench_median(lazy, runs),
           c = bench_median(backed, runs);
    if (a < 0 || b < 0 || c < 0) {
      printf("   %9zu failed: %s\n", sizes[s], devbuf_last_error());
      continue;
    }
    printf("   %8zuK %10.1f %14.1f %7.1fx %18.1f %7.0fx  %s\n", sizes[s] >> 10, a, b, b / a, c,
           c / a, c / a >= 100 ? "met (backed)" : "MISSED");
  }
  printf(
      "   (lazy: the driver only creates a handle; backed: plus a 4-byte write, after which the\n"
      "    memory exists, as the memory of a cached devbuf buffer already does)\n");
  printf("\n");
}

static void bench_opencl_copy(const bench_config *config, const opencl_driver *cl) {
  size_t size = config->quick ? (size_t)64 << 20 : (size_t)256 << 20;
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  unsigned char *host = malloc(size);
  devbuf_buffer_t *buffer = NULL;
  cl_int code = CL_SUCCESS;
  cl_mem plain = cl->clCreateBuffer(cl->context, CL_MEM_READ_WRITE, size, NULL, &code);
  if (!host || !plain ||
      devbuf_buffer_allocate(devbuf_device_allocator(config->device), DEVBUF_UINT8, &size, 1, 0,
                             &buffer) != DEVBUF_OK) {
    printf("== copies: skipped, no memory for %zu MiB (%s) ==\n\n", size >> 20,
           devbuf_last_error());
    free(host);
    if (plain) cl->clReleaseMemObject(plain);
    return;
  }
  memset(host, 3, size);
  // Every byte of both device buffers is written once before timing.
  cl->clEnqueueWriteBuffer(cl->queue, plain, CL_TRUE, 0, size, host, 0, NULL, NULL);
  devbuf_buffer_copyin(buffer, host, size);
  double in[MAX_RUNS], out[MAX_RUNS], write[MAX_RUNS], read[MAX_RUNS];
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = bench_now_ns();
    cl->clEnqueueWriteBuffer(cl->queue, plain, CL_TRUE, 0, size, host, 0, NULL, NULL);
    uint64_t t1 = bench_now_ns();
    devbuf_buffer_copyin(buffer, host, size);
    uint64_t t2 = bench_now_ns();
    cl->clEnqueueReadBuffer(cl->queue, plain, CL_TRUE, 0, size, host, 0, NULL, NULL);
    uint64_t t3 = bench_now_ns();
    devbuf_buffer_copyout(buffer, host, size);
    uint64_t t4 = bench_now_ns();
    write[r] = (double)(t1 - t0), in[r] = (double)(t2 - t1), read[r] = (double)(t3 - t2),
    out[r] = (double)(t4 - t3);
  }
  double gib = (double)size / (1 << 30);
  double w = bench_median(write, runs), i = bench_median(in, runs), rd = bench_median(read, runs),
         o = bench_median(out, runs);
  printf("== copies of %zu MiB: GiB/s (x the driver's own; target >= 0.95x) ==\n", size >> 20);
  bench_figure("opencl", "devbuf copyin", gib / (i * 1e-9), "GiB/s", -1);
  bench_figure("opencl", "devbuf copyin against clEnqueueWriteBuffer", w / i, "x", -1);
  bench_figure("opencl", "devbuf copyout", gib / (o * 1e-9), "GiB/s", -1);
  bench_figure("opencl", "devbuf copyout against clEnqueueReadBuffer", rd / o, "x", -1);
  printf("   clEnqueueWriteBuffer %7.2f   devbuf copyin  %7.2f  %5.2fx  %s\n", gib / (w * 1e-9),
         gib / (i * 1e-9), w / i, w / i >= 0.95 ? "met" : "MISSED");
  printf("   clEnqueueReadBuffer  %7.2f   devbuf copyout %7.2f  %5.2fx  %s\n\n", gib / (rd * 1e-9),
         gib / (o * 1e-9), rd / o, rd / o >= 0.95 ? "met" : "MISSED");
  devbuf_buffer_release(buffer);
  cl->clReleaseMemObject(plain);
  free(host);
}

// Small fills on one queue: what a work item costs devbuf (enqueue, completion callback,
// retirement), against the driver with a wait after each fill and with one wait at the end.
static void bench_opencl_queue(const bench_config *config, const opencl_driver *cl) {
  enum { ITEMS = 2000 };
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  size_t size = 4096;
  devbuf_buffer_t *buffer = NULL;
  devbuf_queue_t *queue = NULL;
  cl_int code = CL_SUCCESS;
  cl_mem plain = cl->clCreateBuffer(cl->context, CL_MEM_READ_WRITE, size, NULL, &code);
  cl_command_queue own = cl->clCreateCommandQueue(cl->context, cl->device, 0, &code);
  if (!plain || !own ||
      devbuf_buffer_allocate(devbuf_device_allocator(config->device), DEVBUF_UINT8, &size, 1, 0,
                             &buffer) != DEVBUF_OK ||
      devbuf_queue_create(config->device, &queue) != DEVBUF_OK) {
    printf("== queue: skipped (%s) ==\n\n", devbuf_last_error());
    if (plain) cl->clReleaseMemObject(plain);
    if (own) cl->clReleaseCommandQueue(own);
    devbuf_buffer_release(buffer);
    return;
  }
  uint32_t pattern = 7;
  double ours[MAX_RUNS], waited[MAX_RUNS], pipelined[MAX_RUNS];
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < ITEMS; i++) {
      cl_event done;
      cl->clEnqueueFillBuffer(own, plain, &pattern, 4, 0, size, 0, NULL, &done);
      cl->clWaitForEvents(1, &done);
      cl->clReleaseEvent(done);
    }
    uint64_t t1 = bench_now_ns();
    for (int i = 0; i < ITEMS; i++)
      cl->clEnqueueFillBuffer(own, plain, &pattern, 4, 0, size, 0, NULL, NULL);
    cl->clFinish(own);
    uint64_t t2 = bench_now_ns();
    for (int i = 0; i < ITEMS; i++) devbuf_queue_fill(queue, buffer, &pattern, 4);
    devbuf_queue_finish(queue);
    uint64_t t3 = bench_now_ns();
    waited[r] = (double)(t1 - t0) / ITEMS, pipelined[r] = (double)(t2 - t1) / ITEMS,
    ours[r] = (double)(t3 - t2) / ITEMS;
  }
  double a = bench_median(ours, runs), b = bench_median(waited, runs),
         c = bench_median(pipelined, runs);
  printf("== %d fills of 4 KiB on one queue: us per item ==\n", ITEMS);
  printf("   driver, a wait after each   %8.1f\n", b * 1e-3);
  printf("   driver, one wait at the end %8.1f\n", c * 1e-3);
  printf("   devbuf queue                %8.1f  %5.2fx the waited driver, %5.2fx the pipelined "
         "one\n\n",
         a * 1e-3, a / b, a / c);
  devbuf_queue_release(queue);
  devbuf_buffer_release(buffer);
  cl->clReleaseCommandQueue(own);
  cl->clReleaseMemObject(plain);
}

void bench_opencl(const bench_config *config) {
  opencl_driver cl;
  if (!driver_open(config->device, &cl)) {
    printf("== opencl: skipped (%s) ==\n\n", devbuf_last_error());
    return;
  }
  if (bench_section_runs(config, "alloc")) bench_opencl_alloc(config, &cl);
  if (bench_section_runs(config, "copy")) bench_opencl_copy(config, &cl);
  if (bench_section_runs(config, "queue")) bench_opencl_queue(config, &cl);
  cl.clReleaseCommandQueue(cl.queue);
}
