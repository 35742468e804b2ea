// OpenCL benchmark (devbuf bench --device opencl:N), side by side with the driver in one
// process, alternating run by run:
//   allocation: a cached devbuf buffer (allocate + release) against clCreateBuffer +
//               clReleaseMemObject, at 4 KiB, 1 MiB and 64 MiB, in steady state;
//   copies:     devbuf copyin/copyout of 256 MiB of device memory against blocking
//               clEnqueueWriteBuffer/ReadBuffer of the same bytes;
//   queues:     small fills through a devbuf queue against the driver's own queue.
#include "../src/backend/opencl/opencl.h"
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RUNS 101

static double time_devbuf(devbuf_allocator_t *allocator, size_t size, size_t iterations) {
  uint64_t start = 0;
  for (size_t i = 0; i <= iterations; i++) {
    if (i == 1) start = bench_now_ns(); // cycle 0 fills the cache
    devbuf_buffer_t *buffer;
    if (devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK) return -1;
    devbuf_buffer_release(buffer);
  }
  return (double)(bench_now_ns() - start) / (double)iterations;
}

// The driver's pair; with `back`, a 4-byte blocking write first makes drivers that
// allocate lazily (PoCL does) really back the buffer, as a cached devbuf buffer already is.
static double time_driver(const devbuf__opencl_device *cl, size_t size, size_t iterations, bool back) {
  uint32_t word = 1;
  uint64_t start = bench_now_ns();
  for (size_t i = 0; i < iterations; i++) {
    cl_int code;
    cl_mem mem = cl->cl->clCreateBuffer(cl->context, CL_MEM_READ_WRITE, size, NULL, &code);
    if (!mem) return -1;
    if (back && cl->cl->clEnqueueWriteBuffer(cl->transfers, mem, CL_TRUE, size - 4, 4, &word, 0, NULL, NULL)) return -1;
    cl->cl->clReleaseMemObject(mem);
  }
  return (double)(bench_now_ns() - start) / (double)iterations;
}

static void bench_opencl_alloc(const bench_config *config, const devbuf__opencl_device *cl) {
  static const size_t sizes[] = {4096, 1 << 20, 64 << 20};
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  size_t iterations = config->quick ? 2000 : 20000;
  printf("== cached allocation + release vs clCreateBuffer + clReleaseMemObject: ns per pair "
         "(target >= 100x faster) ==\n");
  printf("   %9s %10s %14s %8s %18s %8s\n", "size", "devbuf", "driver (lazy)", "ratio", "driver (backed)", "ratio");
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    double ours[MAX_RUNS], lazy[MAX_RUNS], backed[MAX_RUNS];
    for (int r = 0; r < runs; r++) {
      lazy[r] = time_driver(cl, sizes[s], iterations / 10 + 1, false);
      backed[r] = time_driver(cl, sizes[s], iterations / 100 + 1, true);
      ours[r] = time_devbuf(devbuf_device_allocator(config->device), sizes[s], iterations);
    }
    double a = bench_median(ours, runs), b = bench_median(lazy, runs), c = bench_median(backed, runs);
    if (a < 0 || b < 0 || c < 0) {
      printf("   %9zu failed: %s\n", sizes[s], devbuf_last_error());
      continue;
    }
    printf("   %8zuK %10.1f %14.1f %7.1fx %18.1f %7.0fx  %s\n", sizes[s] >> 10, a, b, b / a, c, c / a,
           c / a >= 100 ? "met (backed)" : "MISSED");
  }
  printf("   (lazy: the driver only creates a handle; backed: plus a 4-byte write, after which the\n"
         "    memory exists, as the memory of a cached devbuf buffer already does)\n");
  printf("\n");
}

static void bench_opencl_copy(const bench_config *config, const devbuf__opencl_device *cl) {
  size_t size = config->quick ? (size_t)64 << 20 : (size_t)256 << 20;
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  unsigned char *host = malloc(size);
  devbuf_buffer_t *buffer = NULL;
  cl_int code = CL_SUCCESS;
  cl_mem plain = cl->cl->clCreateBuffer(cl->context, CL_MEM_READ_WRITE, size, NULL, &code);
  if (!host || !plain ||
      devbuf_buffer_allocate(devbuf_device_allocator(config->device), DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK) {
    printf("== copies: skipped, no memory for %zu MiB (%s) ==\n\n", size >> 20, devbuf_last_error());
    free(host);
    if (plain) cl->cl->clReleaseMemObject(plain);
    return;
  }
  memset(host, 3, size);
  // Every byte of both device buffers is written once before timing.
  cl->cl->clEnqueueWriteBuffer(cl->transfers, plain, CL_TRUE, 0, size, host, 0, NULL, NULL);
  devbuf_buffer_copyin(buffer, host, size);
  double in[MAX_RUNS], out[MAX_RUNS], write[MAX_RUNS], read[MAX_RUNS];
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = bench_now_ns();
    cl->cl->clEnqueueWriteBuffer(cl->transfers, plain, CL_TRUE, 0, size, host, 0, NULL, NULL);
    uint64_t t1 = bench_now_ns();
    devbuf_buffer_copyin(buffer, host, size);
    uint64_t t2 = bench_now_ns();
    cl->cl->clEnqueueReadBuffer(cl->transfers, plain, CL_TRUE, 0, size, host, 0, NULL, NULL);
    uint64_t t3 = bench_now_ns();
    devbuf_buffer_copyout(buffer, host, size);
    uint64_t t4 = bench_now_ns();
    write[r] = (double)(t1 - t0), in[r] = (double)(t2 - t1), read[r] = (double)(t3 - t2), out[r] = (double)(t4 - t3);
  }
  double gib = (double)size / (1 << 30);
  double w = bench_median(write, runs), i = bench_median(in, runs), rd = bench_median(read, runs),
         o = bench_median(out, runs);
  printf("== copies of %zu MiB: GiB/s (x the driver's own; target >= 0.95x) ==\n", size >> 20);
  bench_figure("opencl", "devbuf copyin", gib / (i * 1e-9), "GiB/s", -1);
  bench_figure("opencl", "devbuf copyin against clEnqueueWriteBuffer", w / i, "x", -1);
  bench_figure("opencl", "devbuf copyout", gib / (o * 1e-9), "GiB/s", -1);
  bench_figure("opencl", "devbuf copyout against clEnqueueReadBuffer", rd / o, "x", -1);
  printf("   clEnqueueWriteBuffer %7.2f   devbuf copyin  %7.2f  %5.2fx  %s\n", gib / (w * 1e-9), gib / (i * 1e-9), w / i,
         w / i >= 0.95 ? "met" : "MISSED");
  printf("   clEnqueueReadBuffer  %7.2f   devbuf copyout %7.2f  %5.2fx  %s\n\n", gib / (rd * 1e-9), gib / (o * 1e-9),
         rd / o, rd / o >= 0.95 ? "met" : "MISSED");
  devbuf_buffer_release(buffer);
  cl->cl->clReleaseMemObject(plain);
  free(host);
}

// Small fills on one queue: what a work item costs devbuf (enqueue, completion callback,
// retirement), against the driver with a wait after each fill and with one wait at the end.
static void bench_opencl_queue(const bench_config *config, const devbuf__opencl_device *cl) {
  enum { ITEMS = 2000 };
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  size_t size = 4096;
  devbuf_buffer_t *buffer = NULL;
  devbuf_queue_t *queue = NULL;
  cl_int code = CL_SUCCESS;
  cl_mem plain = cl->cl->clCreateBuffer(cl->context, CL_MEM_READ_WRITE, size, NULL, &code);
  cl_command_queue own = cl->cl->clCreateCommandQueue(cl->context, cl->id, 0, &code);
  if (!plain || !own || devbuf_buffer_allocate(devbuf_device_allocator(config->device), DEVBUF_UINT8, &size, 1, 0,
                                               &buffer) != DEVBUF_OK ||
      devbuf_queue_create(config->device, &queue) != DEVBUF_OK) {
    printf("== queue: skipped (%s) ==\n\n", devbuf_last_error());
    if (plain) cl->cl->clReleaseMemObject(plain);
    if (own) cl->cl->clReleaseCommandQueue(own);
    devbuf_buffer_release(buffer);
    return;
  }
  uint32_t pattern = 7;
  double ours[MAX_RUNS], waited[MAX_RUNS], pipelined[MAX_RUNS];
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < ITEMS; i++) {
      cl_event done;
      cl->cl->clEnqueueFillBuffer(own, plain, &pattern, 4, 0, size, 0, NULL, &done);
      cl->cl->clWaitForEvents(1, &done);
      cl->cl->clReleaseEvent(done);
    }
    uint64_t t1 = bench_now_ns();
    for (int i = 0; i < ITEMS; i++) cl->cl->clEnqueueFillBuffer(own, plain, &pattern, 4, 0, size, 0, NULL, NULL);
    cl->cl->clFinish(own);
    uint64_t t2 = bench_now_ns();
    for (int i = 0; i < ITEMS; i++) devbuf_queue_fill(queue, buffer, &pattern, 4);
    devbuf_queue_finish(queue);
    uint64_t t3 = bench_now_ns();
    waited[r] = (double)(t1 - t0) / ITEMS, pipelined[r] = (double)(t2 - t1) / ITEMS, ours[r] = (double)(t3 - t2) / ITEMS;
  }
  double a = bench_median(ours, runs), b = bench_median(waited, runs), c = bench_median(pipelined, runs);
  printf("== %d fills of 4 KiB on one queue: us per item ==\n", ITEMS);
  printf("   driver, a wait after each   %8.1f\n", b * 1e-3);
  printf("   driver, one wait at the end %8.1f\n", c * 1e-3);
  printf("   devbuf queue                %8.1f  %5.2fx the waited driver, %5.2fx the pipelined one\n\n", a * 1e-3,
         a / b, a / c);
  devbuf_queue_release(queue);
  devbuf_buffer_release(buffer);
  cl->cl->clReleaseCommandQueue(own);
  cl->cl->clReleaseMemObject(plain);
}

void bench_opencl(const bench_config *config) {
  const devbuf__opencl_device *cl = devbuf__opencl_of(config->device);
  bench_opencl_alloc(config, cl);
  bench_opencl_copy(config, cl);
  bench_opencl_queue(config, cl);
}
