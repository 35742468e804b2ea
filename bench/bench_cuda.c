// CUDA benchmark (devbuf bench --device cuda:N), side by side in one process:
//   allocation: a cached devbuf buffer (allocate + release) against cuMemAlloc/cuMemFree and
//               against the stream-ordered pool (cuMemAllocAsync/cuMemFreeAsync on one
//               stream, synchronized), 4 KiB to 1 GiB; and PyTorch's caching allocator
//               (torch.empty + del) when python3 has torch;
//   copies:     pinned host to device and back against the driver's own pinned copies, and
//               pageable copyin (devbuf's staging) against pinned and the driver's pageable copy;
//   load:       a weight file onto the device against read() of the file into pinned memory.
#include "bench.h"
#include "devbuf_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#define MAX_RUNS 101

// The driver types and entry points the driver's side of the comparison uses, declared from
// the driver API (so that the benchmark builds without CUDA headers) and taken from the
// driver devbuf loaded (devbuf_cuda.h).
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream, *CUcontext;
#define CUDA_SUCCESS           0
#define CU_STREAM_NON_BLOCKING 1u

typedef struct cuda_driver {
  CUstream stream; // the driver's side's stream-ordered pool
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
  CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*cuMemcpy)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*cuStreamCreate)(CUstream *, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
} cuda_driver;

// False (the message set) when the device's handles or an entry point are missing. Makes
// the device's primary context current on this thread.
static bool driver_open(devbuf_device_t *device, cuda_driver *out) {
  devbuf_cuda_handles_t handles;
  if (devbuf_cuda_device_handles(device, &handles) != DEVBUF_OK) return false;
  *out = (cuda_driver){0};
#define BENCH_RESOLVE_(field, symbol)                                          \
  if (!(*(void **)&out->field = devbuf_cuda_entry_point(symbol))) {            \
    devbuf_set_error(DEVBUF_UNAVAILABLE, "the CUDA driver has no %s", symbol); \
    return false;                                                              \
  }
  BENCH_RESOLVE_(cuCtxSetCurrent, "cuCtxSetCurrent")
  BENCH_RESOLVE_(cuMemAlloc, "cuMemAlloc_v2")
  BENCH_RESOLVE_(cuMemFree, "cuMemFree_v2")
  BENCH_RESOLVE_(cuMemAllocAsync, "cuMemAllocAsync")
  BENCH_RESOLVE_(cuMemFreeAsync, "cuMemFreeAsync")
  BENCH_RESOLVE_(cuMemcpy, "cuMemcpy")
  BENCH_RESOLVE_(cuStreamCreate, "cuStreamCreate")
  BENCH_RESOLVE_(cuStreamDestroy, "cuStreamDestroy_v2")
  BENCH_RESOLVE_(cuStreamSynchronize, "cuStreamSynchronize")
#undef BENCH_RESOLVE_
  CUresult code = out->cuCtxSetCurrent(handles.context);
  if (code == CUDA_SUCCESS) code = out->cuStreamCreate(&out->stream, CU_STREAM_NON_BLOCKING);
  if (code != CUDA_SUCCESS)
    devbuf_set_error(DEVBUF_DEVICE_FAILURE, "the driver's context or stream: %d", code);
  return code == CUDA_SUCCESS;
}

static double time_devbuf(devbuf_allocator_t *allocator, size_t size, size_t iterations) {
  uint64_t start = 0;
  for (size_t i = 0; i <= iterations; i++) {
    if (i == 1) start = bench_now_ns();
    devbuf_buffer_t *buffer;
    if (devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &buffer) != DEVBUF_OK)
      return -1;
    devbuf_buffer_release(buffer);
  }
  return (double)(bench_now_ns() - start) / (double)iterations;
}

static double time_driver(const cuda_driver *cu, size_t size, size_t iterations, bool pool) {
  uint64_t start = 0;
  for (size_t i = 0; i <= iterations; i++) {
    if (i == 1) start = bench_now_ns();
    CUdeviceptr p;
    if (pool) {
      if (cu->cuMemAllocAsync(&p, size, cu->stream) != CUDA_SUCCESS) return -1;
      cu->cuMemFreeAsync(p, cu->stream);
    } else {
      if (cu->cuMemAlloc(&p, size) != CUDA_SUCCESS) return -1;
      cu->cuMemFree(p);
    }
  }
  if (pool) cu->cuStreamSynchronize(cu->stream);
  return (double)(bench_now_ns() - start) / (double)iterations;
}

// ns per torch.empty + del of `size` bytes on cuda:0, or negative without torch.
static double time_torch(size_t size, size_t iterations) {
  char command[700];
  snprintf(command, sizeof command,
           "python3 -c 'import time, torch\n"
           "n = %zu\n"
           "x = torch.empty(n, dtype=torch.uint8, device=\"cuda\"); del x\n"
           "t = time.perf_counter()\n"
           "for _ in range(%zu):\n"
           "    x = torch.empty(n, dtype=torch.uint8, device=\"cuda\"); del x\n"
           "print((time.perf_counter() - t) / %zu * 1e9)' 2>/dev/null",
           size, iterations, iterations);
  FILE *pipe = popen(command, "r");
  double ns = -1;
  if (pipe) {
    if (fscanf(pipe, "%lf", &ns) != 1) ns = -1;
    pclose(pipe);
  }
  return ns;
}

static void bench_cuda_alloc(const bench_config *config, const cuda_driver *cu) {
  static const size_t sizes[] = {4u << 10, 1u << 20, 64u << 20, 1u << 30};
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  printf("== cached allocation + release: ns per pair (targets: >= 100x cuMemAlloc, >= 1x the "
         "pool) ==\n");
  printf("   %9s %10s %12s %8s %12s %8s %10s %8s\n", "size", "devbuf", "cuMemAlloc", "ratio",
         "async pool", "ratio", "torch", "ratio");
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    double ours[MAX_RUNS], plain[MAX_RUNS], pool[MAX_RUNS];
    size_t iterations = sizes[s] >= (64u << 20) ? 200 : 5000;
    for (int r = 0; r < runs; r++) {
      plain[r] = time_driver(cu, sizes[s], iterations / 20 + 1, false);
      pool[r] = time_driver(cu, sizes[s], iterations, true);
      ours[r] = time_devbuf(devbuf_device_allocator(config->device), sizes[s], iterations);
    }
    double a = bench_median(ours, runs), b = bench_median(plain, runs),
           c = bench_median(pool, runs);
    if (a < 0 || b < 0 || c < 0) {
      printf("   %8zuK skipped: %s\n", sizes[s] >> 10,
             devbuf_last_error()[0] ? devbuf_last_error() : "the driver refused");
      continue;
    }
    double t = time_torch(sizes[s], iterations);
    printf("   %8zuK %10.1f %12.1f %7.0fx %12.1f %7.2fx", sizes[s] >> 10, a, b, b / a, c, c / a);
    if (t > 0)
      printf(" %10.1f %7.2fx\n", t, t / a);
    else
      printf(" %10s\n", "n/a");
  }
  printf("\n");
}

static void bench_cuda_copy(const bench_config *config, const cuda_driver *cu) {
  size_t size = (size_t)256 << 20;
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  devbuf_buffer_t *buffer = NULL, *pinned = NULL;
  unsigned char *pageable = malloc(size);
  CUdeviceptr plain = 0;
  if (!pageable || cu->cuMemAlloc(&plain, size) != CUDA_SUCCESS ||
      devbuf_buffer_allocate(devbuf_device_allocator(config->device), DEVBUF_UINT8, &size, 1, 0,
                             &buffer) != DEVBUF_OK ||
      devbuf_buffer_allocate(
          devbuf_device_allocator_for(config->device, DEVBUF_MEMORY_HOST_VISIBLE), DEVBUF_UINT8,
          &size, 1, 0, &pinned) != DEVBUF_OK) {
    printf("== copies: skipped (%s) ==\n\n", devbuf_last_error());
    devbuf_buffer_release(buffer);
    if (plain) cu->cuMemFree(plain);
    free(pageable);
    return;
  }
  void *host;
  devbuf_buffer_unsynchronized_ptr(pinned, &host, NULL);
  memset(host, 1, size);
  memset(pageable, 2, size);
  double driver_in[MAX_RUNS], driver_out[MAX_RUNS], ours_in[MAX_RUNS], ours_out[MAX_RUNS],
      page_in[MAX_RUNS], driver_page_in[MAX_RUNS];
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = bench_now_ns();
    cu->cuMemcpy(plain, (CUdeviceptr)(uintptr_t)host, size);
    uint64_t t1 = bench_now_ns();
    cu->cuMemcpy((CUdeviceptr)(uintptr_t)host, plain, size);
    uint64_t t2 = bench_now_ns();
    devbuf_buffer_copy_from(buffer, pinned);
    uint64_t t3 = bench_now_ns();
    devbuf_buffer_copy_from(pinned, buffer);
    uint64_t t4 = bench_now_ns();
    devbuf_buffer_copyin(buffer, pageable, size);
    uint64_t t5 = bench_now_ns();
    cu->cuMemcpy(plain, (CUdeviceptr)(uintptr_t)pageable, size);
    // From pageable memory the driver returns once the bytes are in its staging buffers, the
    // last DMA maybe still running (on the legacy stream): the copy ends when that does.
    cu->cuStreamSynchronize(NULL);
    uint64_t t6 = bench_now_ns();
    driver_in[r] = (double)(t1 - t0), driver_out[r] = (double)(t2 - t1),
    ours_in[r] = (double)(t3 - t2);
    ours_out[r] = (double)(t4 - t3), page_in[r] = (double)(t5 - t4),
    driver_page_in[r] = (double)(t6 - t5);
  }
  double gb = (double)size * 1e-9;
  double di = bench_median(driver_in, runs), dout = bench_median(driver_out, runs),
         oi = bench_median(ours_in, runs), oo = bench_median(ours_out, runs),
         pi = bench_median(page_in, runs), dpi = bench_median(driver_page_in, runs);
  printf("== copies of 256 MiB: GB/s ==\n");
  bench_figure("cuda", "host->device pinned, against the driver", di / oi, "x", di / oi >= 0.9);
  bench_figure("cuda", "device->host pinned, against the driver", dout / oo, "x", dout / oo >= 0.9);
  bench_figure("cuda", "host->device pageable, against devbuf pinned", oi / pi, "x",
               oi / pi >= 0.8);
  printf("   host->device pinned: driver %7.2f  devbuf %7.2f  %5.2fx (target >= 0.90x)\n",
         gb / (di * 1e-9), gb / (oi * 1e-9), di / oi);
  printf("   device->host pinned: driver %7.2f  devbuf %7.2f  %5.2fx (target >= 0.90x)\n",
         gb / (dout * 1e-9), gb / (oo * 1e-9), dout / oo);
  printf("   host->device pageable copyin %7.2f  %5.2fx of devbuf pinned (target >= 0.80x); the "
         "driver's own "
         "pageable copy %7.2f\n\n",
         gb / (pi * 1e-9), oi / pi, gb / (dpi * 1e-9));
  devbuf_buffer_release(buffer);
  devbuf_buffer_release(pinned);
  cu->cuMemFree(plain);
  free(pageable);
}

// A weight file in the page cache loaded onto the device (read with pread into pinned
// staging, copied to the device) against the same file read() into pinned memory alone:
// what the load costs over the read it cannot avoid.
static void bench_cuda_load(const bench_config *config) {
  char path[512];
  devbuf_buffer_t *pinned = NULL;
  size_t chunk = 8u << 20;
  if (!bench_sample_file(config, path, sizeof path) ||
      devbuf_buffer_allocate(
          devbuf_device_allocator_for(config->device, DEVBUF_MEMORY_HOST_VISIBLE), DEVBUF_UINT8,
          &chunk, 1, 0, &pinned) != DEVBUF_OK) {
    printf("== weight file onto the device: skipped (%s) ==\n\n", devbuf_last_error());
    return;
  }
  void *into = NULL;
  devbuf_buffer_contents_mut(pinned, &into, NULL);
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  double loads[MAX_RUNS], reads[MAX_RUNS];
  uint64_t bytes = 0;
  for (int r = 0; r < runs; r++) {
    devbuf_tensor_file_t *file = NULL;
    uint64_t t0 = bench_now_ns();
    devbuf_status status = devbuf_safetensors_load(config->device, path, NULL, &file);
    uint64_t t1 = bench_now_ns();
    if (status != DEVBUF_OK) {
      printf("== weight file onto the device: skipped (%s) ==\n\n", devbuf_last_error());
      break;
    }
    bytes = devbuf_tensor_file_data_size(file);
    devbuf_tensor_file_release(file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint64_t t2 = bench_now_ns();
    while (fd >= 0 && read(fd, into, chunk) > 0) {
    }
    uint64_t t3 = bench_now_ns();
    if (fd >= 0) close(fd);
    loads[r] = (double)(t1 - t0);
    reads[r] = (double)(t3 - t2);
  }
  devbuf_buffer_end_access(pinned, into);
  devbuf_buffer_release(pinned);
  if (!bytes) return;
  double l = bench_median(loads, runs), d = bench_median(reads, runs), gb = (double)bytes * 1e-9;
  printf("== %llu MiB weight file (page cache) onto the device: GB/s ==\n",
         (unsigned long long)(bytes >> 20));
  printf("   devbuf load %7.2f   read() into pinned memory alone %7.2f   %5.2fx\n\n",
         gb / (l * 1e-9), gb / (d * 1e-9), d / l);
}

void bench_cuda(const bench_config *config) {
  cuda_driver cu;
  if (!driver_open(config->device, &cu)) {
    printf("== cuda: skipped (%s) ==\n\n", devbuf_last_error());
    return;
  }
  if (bench_section_runs(config, "alloc")) bench_cuda_alloc(config, &cu);
  if (bench_section_runs(config, "copy")) bench_cuda_copy(config, &cu);
  if (bench_section_runs(config, "load")) bench_cuda_load(config);
  cu.cuStreamDestroy(cu.stream);
}
