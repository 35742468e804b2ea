// devbuf load [FILE] [--device SPEC] [--copy] [--verify] [--expect DIGESTS] [--json]: a
// safetensors file into buffers, timed; with --verify, the SHA-256 of every tensor (on every
// core), compared with a saved list with --expect. Without FILE, a sample model in the
// user's cache folder.
#include "commands.h"
#include "devbuf.h"
#include "digest_list.h"
#include "printable.h"
#include "sample_model.h"
#include "sha256.h"
#include "usage.h"
#include "verify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
  fprintf(stderr, "\r%-9s [%.*s%*s] %3d%%", bar->label, filled, "##############################",
          30 - filled, "", percent);
  if (percent == 100) fputc('\n', stderr);
  fflush(stderr);
}

typedef struct load_watch {
  double start, first_tensor;
  uint64_t bytes_done, bytes_total;
  progress bar;
} load_watch;

static void on_tensor(void *context, size_t index, const devbuf_tensor_info_t *info,
                      devbuf_buffer_t *buffer) {
  (void)buffer;
  load_watch *watch = context;
  if (index == 0) watch->first_tensor = seconds_now();
  watch->bytes_done += info->end - info->begin;
  progress_show(&watch->bar,
                watch->bytes_total ? (double)watch->bytes_done / (double)watch->bytes_total : 1.0);
}

static void on_verified(void *context, uint64_t done, uint64_t total) {
  progress_show(context, total ? (double)done / (double)total : 1.0);
}

// The sample model without FILE: $XDG_CACHE_HOME/devbuf (or ~/.cache/devbuf), written once.
static int sample_path(char *path, size_t capacity, int quiet) {
  const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char folder[900];
  int length;
  if (cache && cache[0] == '/')
    length = snprintf(folder, sizeof folder, "%s/devbuf", cache);
  else if (home && home[0] == '/')
    length = snprintf(folder, sizeof folder, "%s/.cache/devbuf", home);
  else
    return devbuf_tool_misuse("load",
                              "without FILE the sample model goes to $XDG_CACHE_HOME or $HOME, and "
                              "neither is set: name a FILE");
  if (length < 0 || (size_t)length >= sizeof folder) // cut short, it would name another folder
    return devbuf_tool_misuse("load",
                              "without FILE the sample model goes to $XDG_CACHE_HOME or $HOME, "
                              "whose path is too long here (%d bytes): name a FILE",
                              length);
  char parent[900];
  snprintf(parent, sizeof parent, "%.*s", (int)(strrchr(folder, '/') - folder), folder);
  mkdir(parent, 0755);
  if (mkdir(folder, 0755) != 0 && errno != EEXIST) {
    char safe[1024];
    fprintf(stderr, "devbuf load: cannot make %s: %s\n", DEVBUF_PRINTABLE(folder, safe),
            strerror(errno));
    return 1;
  }
  snprintf(path, capacity, "%s/sample-model.safetensors", folder);
  struct stat info;
  if (stat(path, &info) == 0) return 0;
  char safe_path[1024];
  if (!quiet)
    printf("writing a sample model (%u MiB) to %s\n", SAMPLE_BYTES >> 20,
           DEVBUF_PRINTABLE(path, safe_path));
  if (devbuf_tool_write_sample(path, SAMPLE_BYTES) != DEVBUF_OK) {
    devbuf_tool_report("load: cannot write the sample model", path);
    return 1;
  }
  return 0;
}

typedef struct load_request {
  const char *path, *spec, *expect;
  int verify, copy, json;
} load_request;

// 0 to go on, PARSE_HELP when the usage was asked for (and printed), else 2 (a mistake).
#define PARSE_HELP (-1)
static int parse(int argc, char **argv, load_request *out) {
  *out = (load_request){.spec = "cpu"};
  for (int i = 1; i < argc; i++) {
    if (devbuf_tool_wants_help(argv[i])) return devbuf_tool_help("load") == 0 ? PARSE_HELP : 1;
    if (strcmp(argv[i], "--verify") == 0) {
      out->verify = 1;
    } else if (strcmp(argv[i], "--copy") == 0) {
      out->copy = 1;
    } else if (strcmp(argv[i], "--json") == 0) {
      out->json = 1;
    } else if (strcmp(argv[i], "--device") == 0 || strcmp(argv[i], "--expect") == 0) {
      if (i + 1 == argc) return devbuf_tool_misuse("load", "%s needs a value", argv[i]);
      if (argv[i][2] == 'd')
        out->spec = argv[++i];
      else
        out->expect = argv[++i];
    } else if (!out->path && argv[i][0] != '-') {
      out->path = argv[i];
    } else {
      return devbuf_tool_unexpected("load", argv[i], " (one FILE only)");
    }
  }
  if (out->expect) out->verify = 1;
  return 0;
}

typedef struct load_result {
  devbuf_tensor_file_t *file;
  double start, first_tensor, loaded, verify_seconds;
  devbuf_tool_digest *digests; // with --verify
  size_t differ, missing, unexpected;
} load_result;

static void print_digest_text(const devbuf_tensor_file_t *file, const devbuf_tool_digest *digests) {
  printf("  SHA-256 of every tensor's bytes (DIGEST  NAME, as sha256sum prints them):\n");
  for (size_t i = 0; i < devbuf_tensor_file_count(file); i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(file, i, &info);
    char hex[65], name[1024];
    devbuf_sha256_hex(digests[i].sha256, hex);
    // Whole, however long: --expect reads these lines back (an escaped byte takes 4).
    size_t whole = 4 * strlen(info.name) + 1;
    char *long_name = whole > sizeof name ? malloc(whole) : NULL;
    printf("  %s  %s\n", hex,
           long_name ? devbuf_tool_printable(info.name, long_name, whole)
                     : DEVBUF_PRINTABLE(info.name, name));
    free(long_name);
  }
}

// Reads the --expect list before anything is loaded, so that a missing or malformed list
// fails at once: 0, or 1 after saying why.
static int read_expected(const char *path, devbuf_digest_list *list) {
  char why[256], safe[1024];
  if (!devbuf_digest_list_read(path, list, why, sizeof why)) {
    fprintf(stderr, "devbuf load: cannot read the digests in %s: %s\n",
            DEVBUF_PRINTABLE(path, safe), why);
    return 1;
  }
  if (list->count == 0) {
    fprintf(stderr,
            "devbuf load: %s holds no digest line ('<64 hex digits>  NAME', as load --verify "
            "prints them)\n",
            DEVBUF_PRINTABLE(path, safe));
    return 1;
  }
  return 0;
}

// Compares the digests with the expected list: counts and names what differs on stderr.
static int compare_expected(devbuf_digest_list *list, const devbuf_tensor_file_t *file,
                            load_result *result) {
  for (size_t i = 0; i < devbuf_tensor_file_count(file); i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(file, i, &info);
    char hex[65], name[1024];
    devbuf_sha256_hex(result->digests[i].sha256, hex);
    DEVBUF_PRINTABLE(info.name, name);
    devbuf_digest_entry *entry = devbuf_digest_list_find(list, info.name);
    if (!entry) {
      result->unexpected++;
      fprintf(stderr, "devbuf load: tensor '%s' is not in the expected list\n", name);
    } else {
      entry->seen = true;
      if (strcmp(entry->hex, hex) != 0) {
        result->differ++;
        fprintf(stderr, "devbuf load: tensor '%s' differs: expected %s, got %s\n", name, entry->hex,
                hex);
      }
    }
  }
  for (size_t i = 0; i < list->count; i++) {
    if (list->entries[i].seen) continue;
    result->missing++;
    char name[1024];
    fprintf(stderr, "devbuf load: tensor '%s' of the expected list is not in the file\n",
            DEVBUF_PRINTABLE(list->entries[i].name, name));
  }
  return result->differ || result->missing || result->unexpected ? 1 : 0;
}

static void print_text(const load_request *request, devbuf_device_t *device,
                       const load_result *result) {
  size_t count = devbuf_tensor_file_count(result->file);
  uint64_t bytes = devbuf_tensor_file_data_size(result->file);
  int zero_copy = count && devbuf_buffer_is_mapped(devbuf_tensor_file_buffer(result->file, 0));
  char safe_path[1024];
  printf("loaded %zu tensors, %.1f MiB, from %s onto %s (%s)\n", count, (double)bytes / (1 << 20),
         DEVBUF_PRINTABLE(request->path, safe_path), devbuf_device_spec(device),
         zero_copy ? "zero-copy views of one read-only mapping" : "copies");
  if (count)
    printf("  first tensor after %.3f ms; all after %.3f ms\n",
           (result->first_tensor - result->start) * 1e3, (result->loaded - result->start) * 1e3);
  if (!zero_copy && result->loaded > result->start)
    printf("  read at %.2f GB/s\n", (double)bytes / (result->loaded - result->start) * 1e-9);
  if (!result->digests) return;
  printf("  hashed %.1f MiB in %.3f ms: %.2f GB/s; end to end %.3f ms\n", (double)bytes / (1 << 20),
         result->verify_seconds * 1e3,
         result->verify_seconds > 0 ? (double)bytes / result->verify_seconds * 1e-9 : 0.0,
         (result->loaded - result->start + result->verify_seconds) * 1e3);
  print_digest_text(result->file, result->digests);
  if (request->expect)
    printf("  expected digests: %zu differ, %zu missing from the file, %zu not in the list\n",
           result->differ, result->missing, result->unexpected);
}

static void print_json(const load_request *request, devbuf_device_t *device,
                       const load_result *result) {
  const devbuf_tensor_file_t *file = result->file;
  size_t count = devbuf_tensor_file_count(file);
  uint64_t bytes = devbuf_tensor_file_data_size(file);
  int zero_copy = count && devbuf_buffer_is_mapped(devbuf_tensor_file_buffer(file, 0));
  printf("{\"file\": ");
  devbuf_tool_json_string(request->path, stdout);
  printf(", \"device\": ");
  devbuf_tool_json_string(devbuf_device_spec(device), stdout);
  printf(", \"zero_copy\": %s, \"tensors\": %zu, \"bytes\": %llu, \"first_tensor_ms\": %.3f, "
         "\"load_ms\": %.3f",
         zero_copy ? "true" : "false", count, (unsigned long long)bytes,
         count ? (result->first_tensor - result->start) * 1e3 : 0.0,
         (result->loaded - result->start) * 1e3);
  if (result->digests) {
    printf(", \"verify_ms\": %.3f, \"digests\": [", result->verify_seconds * 1e3);
    for (size_t i = 0; i < count; i++) {
      devbuf_tensor_info_t info;
      devbuf_tensor_file_info(file, i, &info);
      char hex[65];
      devbuf_sha256_hex(result->digests[i].sha256, hex);
      printf("%s\n  {\"name\": ", i ? "," : "");
      devbuf_tool_json_string(info.name, stdout);
      printf(", \"dtype\": \"%s\", \"shape\": [", devbuf_dtype_safetensors_name(info.dtype));
      for (size_t d = 0; d < info.ndim; d++) printf(d ? ", %zu" : "%zu", info.shape[d]);
      printf("], \"sha256\": \"%s\"}", hex);
    }
    printf("%s]", count ? "\n" : "");
  }
  if (request->expect)
    printf(", \"expected\": {\"differ\": %zu, \"missing\": %zu, \"unexpected\": %zu}",
           result->differ, result->missing, result->unexpected);
  printf("}\n");
}

int devbuf_cmd_load(int argc, char **argv) {
  load_request request;
  int parsed = parse(argc, argv, &request);
  if (parsed) return parsed == PARSE_HELP ? 0 : parsed;
  devbuf_digest_list expected = {NULL, 0};
  if (request.expect && read_expected(request.expect, &expected)) return 1;
  char sample[1024];
  if (!request.path) {
    int made = sample_path(sample, sizeof sample, request.json);
    if (made) {
      devbuf_digest_list_free(&expected);
      return made;
    }
    request.path = sample;
  }
  devbuf_device_t *device;
  int opened = devbuf_tool_open_device("load", request.spec, &device);
  if (opened) {
    devbuf_digest_list_free(&expected);
    return opened;
  }
  int terminal = isatty(STDERR_FILENO);
  load_watch watch = {.bar = {terminal, "loading", -1}};
  devbuf_tensor_file_t *header;
  if (devbuf_safetensors_inspect(request.path, &header) == DEVBUF_OK) { // for the bar's total only
    watch.bytes_total = devbuf_tensor_file_data_size(header);
    devbuf_tensor_file_release(header);
  }
  devbuf_load_options_t options = {
      .flags = request.copy ? DEVBUF_LOAD_COPY : 0, .on_tensor = on_tensor, .context = &watch};
  load_result result = {0};
  watch.start = result.start = seconds_now();
  if (devbuf_safetensors_load(device, request.path, &options, &result.file) != DEVBUF_OK) {
    if (terminal) fputc('\n', stderr);
    devbuf_tool_report("load", request.path);
    devbuf_device_release(device);
    devbuf_digest_list_free(&expected);
    return 1;
  }
  result.loaded = seconds_now();
  result.first_tensor = watch.first_tensor;
  int failed = 0;
  if (request.verify) {
    size_t count = devbuf_tensor_file_count(result.file);
    result.digests = calloc(count ? count : 1, sizeof *result.digests);
    progress bar = {terminal, "verifying", -1};
    double start = seconds_now();
    if (!result.digests || devbuf_tool_verify(result.file, DEVBUF_TOOL_SHA256, result.digests, 0,
                                              on_verified, &bar) != DEVBUF_OK) {
      if (result.digests)
        devbuf_tool_report("load: verify", NULL);
      else
        fprintf(stderr, "devbuf load: verify: out of memory\n");
      free(result.digests);
      result.digests = NULL;
      failed = 1;
    }
    result.verify_seconds = seconds_now() - start;
    if (!failed && request.expect) failed = compare_expected(&expected, result.file, &result);
  }
  if (!failed || result.digests)
    (request.json ? print_json : print_text)(&request, device, &result);
  free(result.digests);
  devbuf_digest_list_free(&expected);
  devbuf_tensor_file_release(result.file);
  devbuf_device_release(device);
  return failed;
}
