// Load benchmark: a generated 1 GiB safetensors file in the page cache, read three ways in
// one process, alternating run by run:
//   time to first tensor:  devbuf_safetensors_load (zero-copy) vs read() of the whole file
//                          into malloc'd memory, which copying readers must do first;
//   checksum of every tensor on one thread (fresh mapping each run, page faults included)
//                          vs the file's sequential read() bandwidth from the page cache;
//   the checksum itself, each way the CPU runs it, on bytes in cache;
//   end to end (load + checksum on every core, as `devbuf load --verify` does) vs Python
//                          safetensors (safe_open, numpy, every tensor), when a Python with
//                          safetensors and numpy is found.
#include "../tools/checksum.h"
#include "../tools/verify.h"
#include "bench.h"

#include <fcntl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_RUNS 101
#define CHUNK    (1u << 20)

typedef struct first_tensor {
  uint64_t at;
} first_tensor;

static void on_tensor(void *context, size_t index, const devbuf_tensor_info_t *info,
                      devbuf_buffer_t *buffer) {
  (void)info, (void)buffer;
  if (index == 0) ((first_tensor *)context)->at = bench_now_ns();
}

// read() of the whole file: into one allocation (whole), or through one reused chunk.
static int read_file(const char *path, unsigned char *whole, unsigned char *chunk, size_t size) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < size) {
    ssize_t got = read(fd, whole ? whole + done : chunk, whole ? size - done : CHUNK);
    if (got <= 0) break;
    done += (size_t)got;
  }
  close(fd);
  return done == size ? 0 : -1;
}

// Load (zero-copy) and checksum every tensor; returns the nanoseconds of each part.
static int load_and_check(const bench_config *config, const char *path, unsigned threads,
                          double *first_ns, double *check_ns, uint64_t *sink) {
  first_tensor first = {0};
  devbuf_load_options_t options = {.on_tensor = on_tensor, .context = &first};
  devbuf_tensor_file_t *file;
  uint64_t t0 = bench_now_ns();
  if (devbuf_safetensors_load(config->device, path, &options, &file) != DEVBUF_OK) return -1;
  uint64_t t1 = bench_now_ns();
  devbuf_tool_digest *sums = calloc(devbuf_tensor_file_count(file) + 1, sizeof *sums);
  if (!sums ||
      devbuf_tool_verify(file, DEVBUF_TOOL_CHECKSUM, sums, threads, NULL, NULL) != DEVBUF_OK)
    return -1;
  for (size_t i = 0; i < devbuf_tensor_file_count(file); i++) *sink += sums[i].checksum;
  free(sums);
  uint64_t t2 = bench_now_ns();
  devbuf_tensor_file_release(file); // unmaps: the next run faults the pages in again
  *first_ns = (double)(first.at - t0);
  *check_ns = (double)(t2 - t1);
  return 0;
}

// Seconds Python's safetensors takes for every tensor of `path` (negative if unavailable).
static double python_seconds(const char *python, const char *path) {
  char command[1024];
  snprintf(command, sizeof command,
           "%s -c 'import sys, time\n"
           "from safetensors import safe_open\n"
           "t = time.perf_counter()\n"
           "with safe_open(sys.argv[1], framework=\"np\") as f:\n"
           "    n = sum(f.get_tensor(k).nbytes for k in f.keys())\n"
           "print(time.perf_counter() - t)' '%s' 2>/dev/null",
           python, path);
  FILE *pipe = popen(command, "r");
  if (!pipe) return -1;
  double seconds = -1;
  if (fscanf(pipe, "%lf", &seconds) != 1) seconds = -1;
  pclose(pipe);
  return seconds;
}

// GB/s of each way of the checksum over bytes that stay in cache: what the sum costs
// without the memory and the page faults of the load.
static void checksum_in_cache(const bench_config *config, unsigned char *bytes, size_t size) {
  enum { REPEATS = 256 };
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  memset(bytes, 0x5a, size);
  printf("   checksum of %zu KiB in cache:", size >> 10);
  for (unsigned way = 0; way < devbuf_tool_checksum_ways(); way++) {
    double ns[MAX_RUNS];
    uint64_t sink = 0;
    for (int r = 0; r < runs; r++) {
      uint64_t t0 = bench_now_ns();
      for (int i = 0; i < REPEATS; i++) sink += devbuf_tool_checksum_by(way, bytes, size);
      ns[r] = (double)(bench_now_ns() - t0 + (sink & 1)); // keeps the sums
    }
    double gbs = (double)size * REPEATS / bench_median(ns, runs);
    printf("%s %s %.1f GB/s", way ? "," : "", devbuf_tool_checksum_way_name(way), gbs);
    char name[64];
    snprintf(name, sizeof name, "checksum in cache, %s", devbuf_tool_checksum_way_name(way));
    bench_figure("load", name, gbs, "GB/s", -1);
  }
  printf(" (the last is the one used)\n");
}

void bench_load(const bench_config *config) {
  char path[512];
  struct stat info;
  if (!bench_sample_file(config, path, sizeof path)) {
    printf("== load: skipped, no sample model: %s ==\n\n", devbuf_last_error());
    return;
  }
  if (stat(path, &info) != 0) {
    printf("== load: skipped, cannot stat %s: %s ==\n\n", path, strerror(errno));
    return;
  }
  size_t size = (size_t)info.st_size;
  unsigned char *whole = malloc(size), *chunk = malloc(CHUNK);
  if (!whole || !chunk) {
    printf("== load: skipped, no memory for %zu MiB ==\n\n", size >> 20);
    free(whole);
    free(chunk);
    return;
  }
  read_file(path, NULL, chunk, size); // into the page cache
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  double first[MAX_RUNS], check[MAX_RUNS], copy[MAX_RUNS], stream[MAX_RUNS],
      python_ns_runs[MAX_RUNS], total[MAX_RUNS];
  uint64_t sink = 0;
  int python_runs = 0;
  const char *python =
      getenv("DEVBUF_PYTHON") ? getenv("DEVBUF_PYTHON") : "python3"; // with numpy, safetensors
  for (int r = 0; r < runs; r++) {
    uint64_t t0 = bench_now_ns();
    int failed = read_file(path, whole, NULL, size);
    uint64_t t1 = bench_now_ns();
    failed |= read_file(path, NULL, chunk, size);
    uint64_t t2 = bench_now_ns();
    failed |= load_and_check(config, path, 1, &first[r], &check[r], &sink);
    uint64_t t3 = bench_now_ns();
    double unused_first, unused_check;
    failed |= load_and_check(config, path, 0, &unused_first, &unused_check, &sink);
    if (failed) {
      printf("== load: failed: %s ==\n\n", devbuf_last_error());
      free(whole);
      free(chunk);
      return;
    }
    copy[r] = (double)(t1 - t0);
    stream[r] = (double)(t2 - t1);
    total[r] = (double)(bench_now_ns() - t3);
    double seconds = python_seconds(python, path);
    if (seconds > 0) python_ns_runs[python_runs++] = seconds * 1e9;
  }
  double gb = (double)size * 1e-9;
  double first_ns = bench_median(first, runs), copy_ns = bench_median(copy, runs);
  double check_ns = bench_median(check, runs), stream_ns = bench_median(stream, runs);
  double total_ns = bench_median(total, runs);
  printf("== load of a %zu MiB safetensors file from the page cache (checksums %llx) ==\n",
         size >> 20, (unsigned long long)(sink & 0xffff));
  printf("   time to first tensor      %9.3f ms   read() into malloc %9.1f ms  %8.0fx faster  %s "
         "(target <= 1 ms)\n",
         first_ns * 1e-6, copy_ns * 1e-6, copy_ns / first_ns, first_ns <= 1e6 ? "met" : "MISSED");
  printf("   checksum, one thread      %9.2f GB/s  sequential read() %9.2f GB/s  %6.*fx  %s "
         "(target >= 0.9x)\n",
         gb / (check_ns * 1e-9), gb / (stream_ns * 1e-9), bench_decimals(stream_ns / check_ns, 0.9),
         stream_ns / check_ns, stream_ns / check_ns >= 0.9 ? "met" : "MISSED");
  checksum_in_cache(config, chunk, (size_t)256 << 10);
  bench_figure("load", "time to first tensor", first_ns * 1e-6, "ms", first_ns <= 1e6);
  bench_figure("load", "read() of the file into malloc", copy_ns * 1e-6, "ms", -1);
  bench_figure("load", "checksum, one thread", gb / (check_ns * 1e-9), "GB/s", -1);
  bench_figure("load", "sequential read()", gb / (stream_ns * 1e-9), "GB/s", -1);
  bench_figure("load", "checksum against sequential read()", stream_ns / check_ns, "x",
               stream_ns / check_ns >= 0.9);
  bench_figure("load", "end to end, every core", total_ns * 1e-6, "ms", -1);
  if (python_runs) {
    double python_ns = bench_median(python_ns_runs, python_runs);
    bench_figure("load", "Python safetensors, end to end", python_ns * 1e-6, "ms", -1);
    bench_figure("load", "end to end against Python", python_ns / total_ns, "x",
                 python_ns / total_ns >= 5);
    printf("   end to end, every core    %9.1f ms   Python safetensors %9.1f ms  %8.1fx faster  %s "
           "(target >= 5x)\n\n",
           total_ns * 1e-6, python_ns * 1e-6, python_ns / total_ns,
           python_ns / total_ns >= 5 ? "met" : "MISSED");
  } else {
    printf("   end to end, every core    %9.1f ms   Python safetensors: not found (%s lacks "
           "safetensors or numpy; "
           "DEVBUF_PYTHON=build/pyenv/bin/python3 after scripts/python_env.sh)\n\n",
           total_ns * 1e-6, python);
  }
  free(whole);
  free(chunk);
}
