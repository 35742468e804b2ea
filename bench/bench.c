// devbuf bench: runs every benchmark section side by side with the system's allocators and
// memcpy in one process, and prints tables of medians and ratios.
#include "bench.h"
#include "../tools/sample_model.h"
#include "../tools/sizes.h"
#include "commands.h"
#include "printable.h"
#include "usage.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

// ---- figures for --json ----------------------------------------------------------------

typedef struct figure {
  char section[16], name[256], unit[16]; // names carry trace paths
  double value;
  int target_met;
} figure;

static figure *figures;
static size_t figure_count, figure_capacity;

void bench_figure(const char *section, const char *name, double value, const char *unit,
                  int target_met) {
  if (figure_count == figure_capacity) {
    size_t capacity = figure_capacity ? 2 * figure_capacity : 256;
    figure *grown = realloc(figures, capacity * sizeof *grown);
    if (!grown) return;
    figures = grown;
    figure_capacity = capacity;
  }
  figure *f = &figures[figure_count++];
  snprintf(f->section, sizeof f->section, "%s", section);
  snprintf(f->name, sizeof f->name, "%s", name);
  snprintf(f->unit, sizeof f->unit, "%s", unit);
  f->value = value;
  f->target_met = target_met;
}

static void print_figures(FILE *out, const bench_config *config) {
  fprintf(out, "{\"device\": ");
  devbuf_tool_json_string(devbuf_device_spec(config->device), out);
  fprintf(out, ", \"runs\": %d, \"statistic\": \"median\", \"figures\": [", config->runs);
  for (size_t i = 0; i < figure_count; i++) {
    const figure *f = &figures[i];
    fprintf(out, "%s\n  {\"section\": \"%s\", \"name\": ", i ? "," : "", f->section);
    devbuf_tool_json_string(f->name, out);
    if (isfinite(f->value)) // JSON has no inf or nan: a ratio over a zero reference is null
      fprintf(out, ", \"value\": %.6g, \"unit\": \"%s\"", f->value, f->unit);
    else
      fprintf(out, ", \"value\": null, \"unit\": \"%s\"", f->unit);
    if (f->target_met >= 0) fprintf(out, ", \"target_met\": %s", f->target_met ? "true" : "false");
    fprintf(out, "}");
  }
  fprintf(out, "%s]}\n", figure_count ? "\n" : "");
  free(figures);
  figures = NULL;
  figure_count = figure_capacity = 0;
}

void bench_size_label(size_t size, char *out, size_t capacity) {
  if (size >= (1 << 20))
    snprintf(out, capacity, "%zu MiB", size >> 20);
  else if (size >= 1024)
    snprintf(out, capacity, "%zu KiB", size >> 10);
  else
    snprintf(out, capacity, "%zu B", size);
}

uint64_t bench_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

// Written once per process under $TMPDIR, opened, and unlinked at once: the benchmarks
// (and the Python child they start) read it through /proc/<pid>/fd/<fd> while this process
// lives, and nothing is left behind when it ends, however it ends.
bool bench_sample_file(const bench_config *config, char *path, size_t capacity) {
  static char open_path[64];
  if (open_path[0]) {
    snprintf(path, capacity, "%s", open_path);
    return true;
  }
  const char *folder = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
  size_t target = config->quick ? (size_t)256 << 20 : (size_t)1 << 30;
  char written[512];
  snprintf(written, sizeof written, "%s/devbuf-bench-XXXXXX", folder);
  int fd = mkstemp(written);
  if (fd < 0)
    return devbuf_set_error(DEVBUF_IO_ERROR, "cannot create a file in %s: %s", folder,
                            strerror(errno)) == DEVBUF_OK;
  close(fd);
  printf("(writing a %zu MiB sample model, removed when the benchmark ends)\n", target >> 20);
  bool ok = devbuf_tool_write_sample(written, target) == DEVBUF_OK;
  fd = ok ? open(written, O_RDONLY | O_CLOEXEC) : -1;
  if (ok && fd < 0)
    devbuf_set_error(DEVBUF_IO_ERROR, "cannot open %s: %s", written, strerror(errno));
  unlink(written);
  if (fd < 0) return false;
  snprintf(open_path, sizeof open_path, "/proc/%d/fd/%d", (int)getpid(), fd);
  snprintf(path, capacity, "%s", open_path);
  return true;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(double *values, int count) {
  qsort(values, (size_t)count, sizeof *values, compare_double);
  return count % 2 ? values[count / 2] : (values[count / 2 - 1] + values[count / 2]) / 2;
}

void bench_touch(volatile unsigned char *p, size_t size) {
  for (size_t offset = 0; offset < size; offset += 4096) p[offset] = (unsigned char)offset;
  p[size - 1] = 1;
}

// jemalloc's and mimalloc's own functions, found in their libraries loaded with
// RTLD_LOCAL, so that loading them never replaces the process's malloc. jemalloc's are its
// malloc and free, the fast path a program linked with it or preloading it gets: its
// mallocx and dallocx take a general path, about twice the time, which made jemalloc look
// slower than devbuf where it is faster (docs/allocator.md).

// Through pointers, so the compiler cannot fold a malloc/free pair away.
static void *(*volatile glibc_malloc)(size_t) = malloc;
static void (*volatile glibc_free)(void *) = free;
static void *glibc_alloc(size_t size) { return glibc_malloc(size); }
static void glibc_release(void *pointer) { glibc_free(pointer); }

void bench_find_mallocs(bench_malloc out[BENCH_MALLOC_COUNT]) {
  out[BENCH_GLIBC] = (bench_malloc){"glibc", glibc_alloc, glibc_release, NULL};
  static char je_missing[160];
  out[BENCH_JEMALLOC] = (bench_malloc){"jemalloc", NULL, NULL, "libjemalloc.so.2 not installed"};
  out[BENCH_MIMALLOC] = (bench_malloc){"mimalloc", NULL, NULL, "libmimalloc.so.2 not installed"};
  void *je = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!je) {
    const char *why = dlerror();
    if (why && !strstr(why, "No such file")) {
      snprintf(je_missing, sizeof je_missing, "%s", why);
      out[BENCH_JEMALLOC].missing = je_missing;
    }
  } else {
    void *(*je_malloc)(size_t);
    void (*je_free)(void *);
    *(void **)&je_malloc = dlsym(je, "malloc"); // the library's own: it is searched first
    *(void **)&je_free = dlsym(je, "free");
    if (je_malloc && je_malloc == malloc) // preloaded: the glibc column measures it
      out[BENCH_JEMALLOC].missing = "jemalloc is the process's malloc (preloaded)";
    else if (je_malloc && je_free)
      out[BENCH_JEMALLOC] = (bench_malloc){"jemalloc", je_malloc, je_free, NULL};
  }
  void *mi = dlopen("libmimalloc.so.2", RTLD_NOW | RTLD_LOCAL);
  if (mi) {
    void *(*mi_malloc)(size_t);
    void (*mi_free)(void *);
    *(void **)&mi_malloc = dlsym(mi, "mi_malloc");
    *(void **)&mi_free = dlsym(mi, "mi_free");
    if (mi_malloc && mi_free)
      out[BENCH_MIMALLOC] = (bench_malloc){"mimalloc", mi_malloc, mi_free, NULL};
  }
}

bool bench_section_runs(const bench_config *config, const char *name) {
  return !config->only || strcmp(config->only, name) == 0;
}

// The sections each kind of device measures, as its message lists them: --only and
// --traces are refused where they would be ignored.
static const char *device_sections(devbuf_device_kind kind) {
  if (kind == DEVBUF_DEVICE_OPENCL) return "alloc, copy, queue";
  if (kind == DEVBUF_DEVICE_CUDA) return "alloc, copy, load";
  return "alloc, copy, threads, queue, load, traces, share";
}

static bool measures(const char *sections, const char *section) {
  size_t length = strlen(section);
  for (const char *at = strstr(sections, section); at; at = strstr(at + 1, section))
    if ((at == sections || at[-1] == ' ') && (at[length] == ',' || at[length] == '\0')) return true;
  return false;
}

static bool known_section(const char *name) {
  static const char *const sections[] = {"alloc", "copy",   "threads", "queue",
                                         "load",  "traces", "share"};
  for (size_t i = 0; i < sizeof sections / sizeof *sections; i++)
    if (strcmp(name, sections[i]) == 0) return true;
  return false;
}

int devbuf_cmd_bench(int argc, char **argv) {
  bench_config config = {.runs = 5};
  bool runs_given = false; // --runs holds, before or after --quick
  const char *spec = "cpu", *only = NULL, *only_option = NULL;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    char safe[256];
    if (devbuf_tool_wants_help(argv[i])) return devbuf_tool_help("bench");
    if (strcmp(argv[i], "--quick") == 0) {
      config.quick = 1;
      if (!runs_given) config.runs = 3;
    } else if (strcmp(argv[i], "--device") == 0) {
      if (++i == argc)
        return devbuf_tool_misuse("bench", "--device needs a device, such as cpu or opencl:0");
      spec = argv[i];
    } else if (strcmp(argv[i], "--runs") == 0) {
      long runs;
      int misuse = devbuf_tool_count_option("bench", "--runs", i + 1 < argc ? argv[++i] : NULL, 1,
                                            101, &runs);
      if (misuse) return misuse;
      config.runs = (int)runs;
      runs_given = true;
    } else if (strcmp(argv[i], "--only") == 0) {
      if (i + 1 == argc || !known_section(argv[i + 1]))
        return devbuf_tool_misuse(
            "bench", "--only takes alloc, copy, threads, queue, load, traces or share, not '%s'",
            devbuf_tool_printable(i + 1 < argc ? argv[i + 1] : "", safe, sizeof safe));
      only = argv[++i];
      only_option = "--only";
    } else if (strcmp(argv[i], "--traces") == 0) {
      if (++i == argc) return devbuf_tool_misuse("bench", "--traces needs a folder of traces");
      config.traces = argv[i];
      struct stat folder; // a folder named on purpose that is not there is a mistake, not a skip
      bool found = stat(config.traces, &folder) == 0;
      if (!found || !S_ISDIR(folder.st_mode))
        return devbuf_tool_misuse("bench", "--traces needs a folder of traces: '%s': %s",
                                  devbuf_tool_printable(config.traces, safe, sizeof safe),
                                  found ? "not a folder" : strerror(errno));
    } else if (strcmp(argv[i], "--load") == 0) {
      only = "load";
      only_option = "--load";
    } else if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else {
      return devbuf_tool_unexpected("bench", argv[i], " (bench takes options only)");
    }
  }
  int opened = devbuf_tool_open_device("bench", spec, &config.device);
  if (opened) return opened;
  config.only = only;
  const char *sections = device_sections(devbuf_device_kind_of(config.device));
  char safe_spec[256];
  int misuse = 0;
  if (only && !measures(sections, only))
    misuse = devbuf_tool_misuse("bench", "%s%s%s: %s measures no such section (it measures %s)",
                                only_option, only_option[2] == 'o' ? " " : "",
                                only_option[2] == 'o' ? only : "",
                                DEVBUF_PRINTABLE(spec, safe_spec), sections);
  else if (config.traces && !measures(sections, "traces"))
    misuse = devbuf_tool_misuse("bench", "--traces: %s measures no traces (it measures %s)",
                                DEVBUF_PRINTABLE(spec, safe_spec), sections);
  else if (config.traces && only && strcmp(only, "traces") != 0)
    misuse = devbuf_tool_misuse(
        "bench", "--traces is for the traces section, which %s%s%s leaves out", only_option,
        only_option[2] == 'o' ? " " : "", only_option[2] == 'o' ? only : "");
  if (misuse) {
    devbuf_device_release(config.device);
    return misuse;
  }
  // With --json the text goes nowhere and one object of every figure goes to stdout.
  FILE *json_out = NULL;
  if (json) {
    fflush(stdout);
    int saved = dup(STDOUT_FILENO), null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    json_out = saved >= 0 ? fdopen(saved, "w") : NULL;
    if (!json_out || null_fd < 0 || dup2(null_fd, STDOUT_FILENO) < 0) {
      fprintf(stderr, "devbuf bench: cannot set stdout aside for --json\n");
      return 1;
    }
    close(null_fd);
  }
  printf("devbuf bench on %s (%s); every figure is the median of %d runs\n\n",
         devbuf_device_spec(config.device), devbuf_device_name(config.device), config.runs);
  int unreplayed = 0, code = 0;
  if (devbuf_device_kind_of(config.device) == DEVBUF_DEVICE_OPENCL) {
    bench_opencl(&config);
  } else if (devbuf_device_kind_of(config.device) == DEVBUF_DEVICE_CUDA) {
    bench_cuda(&config);
  } else {
    if (bench_section_runs(&config, "alloc")) bench_alloc(&config);
    if (bench_section_runs(&config, "copy")) bench_copy(&config);
    if (bench_section_runs(&config, "threads")) bench_threads(&config);
    if (bench_section_runs(&config, "queue")) bench_queue(&config);
    if (bench_section_runs(&config, "load")) bench_load(&config);
    if (bench_section_runs(&config, "traces")) unreplayed = bench_traces(&config);
    if (bench_section_runs(&config, "share")) bench_share(&config);
  }
  if (unreplayed) { // each said on stderr as it came: --json would leave them out unseen
    fprintf(stderr, "devbuf bench: %d trace row%s or figures could not be measured\n", unreplayed,
            unreplayed == 1 ? "" : "s");
    code = 1;
  }
  if (json_out) {
    fflush(stdout);
    print_figures(json_out, &config);
    // A document that did not reach stdout (a full disk, a closed pipe) is a failure.
    bool written = fflush(json_out) == 0 && !ferror(json_out);
    int error = errno;
    if (fclose(json_out) != 0 && written) written = false, error = errno;
    if (!written) {
      fprintf(stderr, "devbuf: cannot write the output: %s\n", strerror(error));
      code = 1;
    }
  }
  devbuf_device_release(config.device);
  return code;
}
