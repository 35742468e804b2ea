// devbuf load [FILE] [--device SPEC] [--verify] [--copy]: a safetensors file into buffers,
// timed; with --verify, a checksum of every tensor (on every core). Without FILE, the build's sample model.
#include "commands.h"
#include "devbuf.h"
#include "printable.h"
#include "sample_model.h"
#include "verify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef DEVBUF_SAMPLE_MODEL
#define DEVBUF_SAMPLE_MODEL "sample-model.safetensors"
#endif
#define SAMPLE_BYTES (64u << 20)

static double seconds_now(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

// A one-line bar on stderr, redrawn in place; only on a terminal.
typedef struct progress {
  int enabled;
  const char *label;
  int last_percent;
} progress;

static void progress_show(progress *bar, double fraction) {
  if (!bar->enabled) return;
  int percent = (int)(fraction * 100.0 + 0.5);
  if (percent == bar->last_percent) return;
  bar->last_percent = percent;
  int filled = percent * 30 / 100;
  fprintf(stderr, "\r%-9s [%.*s%*s] %3d%%", bar->label, filled, "##############################", 30 - filled, "",
          percent);
  if (percent == 100) fputc('\n', stderr);
  fflush(stderr);
}

typedef struct load_watch {
  double start, first_tensor;
  uint64_t bytes_done, bytes_total;
  progress bar;
} load_watch;

static void on_tensor(void *context, size_t index, const devbuf_tensor_info_t *info, devbuf_buffer_t *buffer) {
  (void)buffer;
  load_watch *watch = context;
  if (index == 0) watch->first_tensor = seconds_now();
  watch->bytes_done += info->end - info->begin;
  progress_show(&watch->bar, watch->bytes_total ? (double)watch->bytes_done / (double)watch->bytes_total : 1.0);
}

static void on_verified(void *context, uint64_t done, uint64_t total) {
  progress_show(context, total ? (double)done / (double)total : 1.0);
}

static int ensure_sample(const char *path) {
  struct stat info;
  if (stat(path, &info) == 0) return 0;
  char safe_path[1024];
  printf("writing a sample model (%u MiB) to %s\n", SAMPLE_BYTES >> 20, DEVBUF_PRINTABLE(path, safe_path));
  if (devbuf_tool_write_sample(path, SAMPLE_BYTES) != DEVBUF_OK) {
    devbuf_tool_report("load: cannot write the sample model", path);
    return 1;
  }
  return 0;
}

static int usage(void) {
  fprintf(stderr, "usage: devbuf load [FILE] [--device SPEC] [--verify] [--copy]\n");
  return 2;
}

int devbuf_cmd_load(int argc, char **argv) {
  const char *path = NULL, *spec = "cpu";
  int verify = 0, copy = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--verify") == 0)
      verify = 1;
    else if (strcmp(argv[i], "--copy") == 0)
      copy = 1;
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
      spec = argv[++i];
    else if (!path && argv[i][0] != '-')
      path = argv[i];
    else
      return usage();
  }
  if (!path) {
    path = DEVBUF_SAMPLE_MODEL;
    if (ensure_sample(path) != 0) return 1;
  }
  devbuf_device_t *device;
  if (devbuf_device_open(spec, &device) != DEVBUF_OK) {
    devbuf_tool_report("load", NULL);
    return 1;
  }
  int terminal = isatty(STDERR_FILENO);
  load_watch watch = {.bar = {terminal, "loading", -1}};
  devbuf_tensor_file_t *header;
  if (devbuf_safetensors_inspect(path, &header) == DEVBUF_OK) { // for the bar's total only
    watch.bytes_total = devbuf_tensor_file_data_size(header);
    devbuf_tensor_file_release(header);
  }
  devbuf_load_options_t options = {.flags = copy ? DEVBUF_LOAD_COPY : 0, .on_tensor = on_tensor, .context = &watch};
  devbuf_tensor_file_t *file;
  watch.start = seconds_now();
  if (devbuf_safetensors_load(device, path, &options, &file) != DEVBUF_OK) {
    if (terminal) fputc('\n', stderr);
    devbuf_tool_report("load", path);
    devbuf_device_release(device);
    return 1;
  }
  double loaded = seconds_now();
  size_t count = devbuf_tensor_file_count(file);
  uint64_t bytes = devbuf_tensor_file_data_size(file);
  int zero_copy = count && devbuf_buffer_is_mapped(devbuf_tensor_file_buffer(file, 0));
  char safe_path[1024];
  printf("loaded %zu tensors, %.1f MiB, from %s onto %s (%s)\n", count, (double)bytes / (1 << 20),
         DEVBUF_PRINTABLE(path, safe_path),
         devbuf_device_spec(device), zero_copy ? "zero-copy views of one read-only mapping" : "copies");
  if (count)
    printf("  first tensor after %.3f ms; all after %.3f ms\n", (watch.first_tensor - watch.start) * 1e3,
           (loaded - watch.start) * 1e3);
  if (!zero_copy && loaded > watch.start)
    printf("  %.2f GB/s\n", (double)bytes / (loaded - watch.start) * 1e-9);

  int failed = 0;
  if (verify) {
    uint64_t *sums = calloc(count ? count : 1, sizeof *sums);
    progress bar = {terminal, "verifying", -1};
    double start = seconds_now();
    if (!sums || devbuf_tool_verify(file, sums, 0, on_verified, &bar) != DEVBUF_OK) {
      if (sums)
        devbuf_tool_report("load: verify", NULL);
      else
        fprintf(stderr, "devbuf load: verify: out of memory\n");
      failed = 1;
    }
    double took = seconds_now() - start;
    if (!failed && sums) {
      printf("  checksummed %.1f MiB in %.3f ms: %.2f GB/s; end to end %.3f ms\n", (double)bytes / (1 << 20),
             took * 1e3, took > 0 ? (double)bytes / took * 1e-9 : 0.0, (seconds_now() - watch.start) * 1e3);
      printf("  %-16s  %-5s %-18s %s\n", "checksum", "dtype", "shape", "name");
      for (size_t i = 0; i < count; i++) {
        devbuf_tensor_info_t info;
        devbuf_tensor_file_info(file, i, &info);
        char shape[64], name[256];
        devbuf_tool_shape_text(info.shape, info.ndim, ",", shape, sizeof shape);
        printf("  %016llx  %-5s %-18s %s\n", (unsigned long long)sums[i], devbuf_dtype_safetensors_name(info.dtype),
               shape, devbuf_tool_printable(info.name, name, sizeof name));
      }
    }
    free(sums);
  }
  devbuf_tensor_file_release(file);
  devbuf_device_release(device);
  return failed;
}
