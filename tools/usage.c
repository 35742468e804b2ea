// The usage texts of usage.h.
#include "usage.h"
#include "devbuf.h"
#include "printable.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct usage_entry {
  const char *command, *text;
} usage_entry;

static const usage_entry entries[] = {
    {"info", "devbuf info [--json]\n"
             "  the devices this build can open, and why the others cannot\n"},
    {"inspect",
     "devbuf inspect FILE [--json]\n"
     "  the tensors of a safetensors file: name, dtype, shape, bytes, offsets; metadata\n"},
    {"load",
     "devbuf load [FILE] [--device SPEC] [--copy] [--verify] [--expect DIGESTS] [--json]\n"
     "  loads a safetensors file into buffers on SPEC (default cpu), timed; without FILE, a\n"
     "  sample model written once to the user's cache folder\n"
     "  --copy     writable copies instead of zero-copy views of the mapped file\n"
     "  --verify   the SHA-256 of every tensor's bytes, as lines 'DIGEST  NAME'\n"
     "  --expect   compares with a saved list of such lines (exit 1 naming the tensors that\n"
     "             differ or are missing); implies --verify\n"
     "  --json     one JSON object on stdout instead of the text\n"},
    {"sample", "devbuf sample FILE [--mib N | --size SIZE]\n"
               "  writes a sample model, a file of exactly N MiB (default 64) or SIZE (such as\n"
               "  512MiB or 2G; K, M, G and T are 1024-based, with or without B or iB)\n"},
    {"bench",
     "devbuf bench [--quick] [--runs N] [--device SPEC] [--only "
     "alloc|copy|threads|queue|load|traces|share]\n"
     "             [--load] [--traces DIR] [--json]\n"
     "  benchmarks, side by side with malloc, memcpy, read() and Python; every figure is the\n"
     "  median of N runs (default 5, 1 to 101); --json: one object of every figure instead;\n"
     "  traces: the allocation traces of DIR (default tests/data/traces) against PyTorch's "
     "figures\n"
     "  --only: one section the device measures (opencl: alloc, copy, queue; cuda: alloc, copy,\n"
     "  load); --traces: for the traces section, on cpu\n"},
    {"trace",
     "devbuf trace replay FILE [--device SPEC] [--page SIZE] [--memory-limit SIZE]\n"
     "                          [--growable | --no-growable] [--policy devbuf|cca] [--passes N]\n"
     "                          [--least-limit] [--json] [--cuda-device N]\n"
     "       devbuf trace view FILE -o PAGE.html [--device SPEC] [--page SIZE]\n"
     "                          [--memory-limit SIZE] [--cuda-device N]\n"
     "  FILE: a devbuf trace, or a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot),\n"
     "  read by a restricted unpickler that runs nothing; --cuda-device: whose allocations of\n"
     "  a snapshot of several GPUs (default 0)\n"
     "  replay: plays the allocations against a caching allocator with SPEC's segment policy\n"
     "  (default cpu; --page: another page for segments, such as CUDA's 2MiB) over an\n"
     "  upstream that counts bytes and holds no memory; prints peak requested and reserved\n"
     "  bytes, system allocations and frees, refusals (and, from a snapshot, what PyTorch's\n"
     "  allocator reserved in that run); --growable: growable segments (each pool one segment\n"
     "  that maps memory as it grows; the default for a snapshot of a run with PyTorch's\n"
     "  expandable segments, which --no-growable turns off); --policy cca: a model of PyTorch's\n"
     "  CUDA caching allocator with its defaults instead of devbuf's; --passes: replays N times\n"
     "  into the same cache, every figure over all N passes, and says what each pass allocated\n"
     "  from the system and refused; --least-limit: the smallest memory limit under which each\n"
     "  policy refuses nothing (always for snapshots);\n"
     "  sizes are bytes or take a unit: 4096, 64KiB, 512MiB, 2G (1024-based, with or without B)\n"
     "  view: devbuf's policy and PyTorch's side by side on one self-contained HTML page: live\n"
     "  bytes stacked by allocation, reserved bytes, refusals; hover (with a snapshot's stack\n"
     "  frames), zoom, and each segment's blocks at a clicked moment\n"},
};

static const char tool_text[] =
    "usage: devbuf <command> [options]      (devbuf <command> --help for one command)\n"
    "  info                 devices this build can open, and why others cannot\n"
    "  inspect FILE         the tensors of a safetensors file\n"
    "  load [FILE]          load a safetensors file into buffers, timed; --verify digests every "
    "tensor\n"
    "  sample FILE          write a sample model\n"
    "  bench                benchmarks, side by side with malloc/memcpy/read and Python\n"
    "  trace replay FILE    replay an allocation trace against a caching allocator\n"
    "  trace view FILE      draw it as an HTML page\n"
    "  help [COMMAND]       this text, or one command's\n"
    "  --version            the tool's version\n";

const char *devbuf_tool_usage(const char *command) {
  for (size_t i = 0; command && i < sizeof entries / sizeof *entries; i++)
    if (strcmp(entries[i].command, command) == 0) return entries[i].text;
  return tool_text;
}

bool devbuf_tool_wants_help(const char *arg) {
  return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

int devbuf_tool_help(const char *command) {
  const char *text = devbuf_tool_usage(command);
  printf("%s%s", text == tool_text ? "" : "usage: ", text);
  return 0;
}

int devbuf_tool_misuse(const char *command, const char *format, ...) {
  va_list args;
  va_start(args, format);
  fprintf(stderr, "devbuf%s%s: ", command[0] ? " " : "", command);
  vfprintf(stderr, format, args);
  va_end(args);
  const char *text = devbuf_tool_usage(command);
  fprintf(stderr, "\n%s%s", text == tool_text ? "" : "usage: ", text);
  return 2;
}

int devbuf_tool_unexpected(const char *command, const char *arg, const char *note) {
  char safe[256];
  bool option = arg[0] == '-' && arg[1];
  return devbuf_tool_misuse(command, "%s '%s'%s", option ? "unknown option" : "unexpected argument",
                            DEVBUF_PRINTABLE(arg, safe), option || !note ? "" : note);
}

int devbuf_tool_open_device(const char *command, const char *spec, devbuf_device_t **out_device) {
  devbuf_status status = devbuf_device_open(spec, out_device);
  if (status == DEVBUF_OK) return 0;
  char message[1024];
  DEVBUF_PRINTABLE(devbuf_last_error(), message);
  if (status == DEVBUF_INVALID_ARGUMENT) return devbuf_tool_misuse(command, "%s", message);
  fprintf(stderr, "devbuf %s: %s\n", command, message);
  return 1;
}
