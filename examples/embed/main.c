// devbuf-embed: sentence embeddings of all-MiniLM-L6-v2 on devbuf queues.
//
//   devbuf-embed --model DIR [--device SPEC] [--batch N] [--json] FILE|-
//
// Reads one UTF-8 sentence per line of FILE (or standard input), embeds each (384 floats,
// L2-normalised mean of the last hidden states) and prints one embedding per line, or one
// JSON document with --json. Every byte of the model and the activations lives in devbuf
// buffers on the device; every operation is a kernel on a devbuf queue (docs/embed.md).
// Exit status: 0, 1 on an error (one line on stderr), 2 on a usage error.
#include "batch.h"
#include "kernels.h"
#include "model.h"
#include "tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage_text[] =
    "usage: devbuf-embed --model DIR [--device SPEC] [--batch N] [--json] FILE|-\n"
    "  --model DIR    the model folder (model.safetensors, tokenizer.json, vocab.txt)\n"
    "  --device SPEC  cpu (the default), opencl:N or cuda:N\n"
    "  --batch N      sentences per batch (default 32, at most 4096)\n"
    "  --json         one JSON document: texts, token ids, embeddings, memory, seconds\n"
    "  FILE           one UTF-8 sentence per line; - reads standard input\n";

typedef struct options {
  const char *model, *device, *input;
  size_t batch;
  bool json, empty, verbose;
  unsigned threads;      // CPU kernels: 1 or 2
  uint64_t memory_limit; // of the device allocator (0: none)
} options;

static int usage(const char *problem) {
  if (problem) fprintf(stderr, "devbuf-embed: %s\n", problem);
  fputs(usage_text, stderr);
  return 2;
}

static bool parse_size(const char *text, uint64_t low, uint64_t high, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  if (errno || end == text || *end || text[0] == '-' || value < low || value > high) return false;
  *out = value;
  return true;
}

// 0: parsed; 2: a usage error (printed); -1: --help (printed).
static int parse(int argc, char **argv, options *o) {
  *o = (options){.device = "cpu", .batch = 32, .threads = 2};
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    const char *value = NULL;
    const char *names[] = {"--model", "--device", "--batch", "--threads", "--memory-limit"};
    for (size_t n = 0; n < sizeof names / sizeof *names; n++) {
      size_t len = strlen(names[n]);
      if (strncmp(arg, names[n], len) == 0 && (arg[len] == '=' || arg[len] == 0)) {
        if (arg[len] == '=') {
          value = arg + len + 1;
        } else if (i + 1 < argc) {
          value = argv[++i];
        } else {
          fprintf(stderr, "devbuf-embed: %s needs a value\n", names[n]);
          return usage(NULL);
        }
        arg = names[n];
        break;
      }
    }
    uint64_t number;
    if (strcmp(arg, "--model") == 0 && value) {
      o->model = value;
    } else if (strcmp(arg, "--device") == 0 && value) {
      o->device = value;
    } else if (strcmp(arg, "--batch") == 0 && value) {
      if (!parse_size(value, 1, 4096, &number)) return usage("--batch takes 1 to 4096");
      o->batch = (size_t)number;
    } else if (strcmp(arg, "--threads") == 0 && value) { // diagnostic: CPU kernels' threads
      if (!parse_size(value, 1, 2, &number)) return usage("--threads takes 1 or 2");
      o->threads = (unsigned)number;
    } else if (strcmp(arg, "--memory-limit") == 0 && value) { // diagnostic: bytes
      if (!parse_size(value, 1, UINT64_MAX, &number)) return usage("--memory-limit takes bytes");
      o->memory_limit = number;
    } else if (strcmp(arg, "--json") == 0) {
      o->json = true;
    } else if (strcmp(arg, "--empty-kernels") == 0) { // diagnostic: devbuf's own cost
      o->empty = true;
    } else if (strcmp(arg, "--verbose") == 0) { // diagnostic: a line per batch on stderr
      o->verbose = true;
    } else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      fputs(usage_text, stdout);
      return -1;
    } else if (arg[0] == '-' && arg[1] != 0) {
      fprintf(stderr, "devbuf-embed: unknown option '%s'\n", arg);
      return usage(NULL);
    } else if (o->input) {
      return usage("one input FILE only");
    } else {
      o->input = arg;
    }
  }
  if (!o->model) return usage("--model DIR is required");
  if (!o->input) return usage("an input FILE (or -) is required");
  return 0;
}

// ---- input ---------------------------------------------------------------------------------

typedef struct text {
  char *bytes;
  size_t size;
} text;

static int read_all(const char *path, text *out, char *err, size_t err_size) {
  bool is_stdin = strcmp(path, "-") == 0;
  FILE *f = is_stdin ? stdin : fopen(path, "rb");
  if (!f) {
    snprintf(err, err_size, "cannot read '%s': %s", path, strerror(errno));
    return -1;
  }
  size_t size = 0, capacity = 1 << 16;
  char *bytes = malloc(capacity);
  while (bytes) {
    if (size == capacity) {
      char *grown = realloc(bytes, capacity * 2);
      if (!grown) { // no memory for the rest: refused, never cut short
        free(bytes);
        bytes = NULL;
        break;
      }
      bytes = grown, capacity *= 2;
    }
    size_t got = fread(bytes + size, 1, capacity - size, f);
    size += got;
    if (got == 0) break;
  }
  int failed = !bytes ? ENOMEM : ferror(f) ? (errno ? errno : EIO) : 0;
  if (!is_stdin) fclose(f);
  if (failed) {
    snprintf(err, err_size, "cannot read '%s': %s", is_stdin ? "standard input" : path,
             strerror(failed));
    free(bytes);
    return -1;
  }
  out->bytes = bytes;
  out->size = size;
  return 0;
}

typedef struct line {
  const char *text;
  size_t length;
} line;

// Lines split at '\n'; a last line without one counts, an empty input has none.
static line *split_lines(const text *in, size_t *out_count) {
  size_t count = 0;
  for (size_t i = 0; i < in->size; i++) count += in->bytes[i] == '\n';
  if (in->size && in->bytes[in->size - 1] != '\n') count++;
  line *lines = malloc((count ? count : 1) * sizeof *lines);
  if (!lines) return NULL;
  size_t n = 0, start = 0;
  for (size_t i = 0; i <= in->size && n < count; i++) {
    if (i == in->size || in->bytes[i] == '\n') {
      lines[n++] = (line){in->bytes + start, i - start};
      start = i + 1;
    }
  }
  *out_count = count;
  return lines;
}

// ---- output --------------------------------------------------------------------------------

// A JSON string of UTF-8 text: control characters escaped, each maximal ill-formed
// subsequence (Unicode 15, 3.9) replaced by U+FFFD.
static void json_string(FILE *out, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  putc('"', out);
  for (size_t i = 0; i < n;) {
    unsigned char c = u[i];
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        putc('\\', out), putc(c, out);
      } else if (c >= 0x20) {
        putc(c, out);
      } else {
        const char *named = c == '\n'   ? "\\n"
                            : c == '\t' ? "\\t"
                            : c == '\r' ? "\\r"
                            : c == '\b' ? "\\b"
                            : c == '\f' ? "\\f"
                                        : NULL;
        if (named)
          fputs(named, out);
        else
          fprintf(out, "\\u%04x", c);
      }
      i++;
      continue;
    }
    // The length of the sequence c starts, and the range its second byte must be in.
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      length = 2;
    else if (c >= 0xE0 && c <= 0xEF)
      length = 3, low = c == 0xE0 ? 0xA0 : 0x80, high = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
      length = 4, low = c == 0xF0 ? 0x90 : 0x80, high = c == 0xF4 ? 0x8F : 0xBF;
    size_t good = length ? 1 : 0; // bytes of the sequence that are right so far
    while (good && good < length && i + good < n) {
      unsigned char next = u[i + good];
      if (good == 1 ? next < low || next > high : next < 0x80 || next > 0xBF) break;
      good++;
    }
    if (length && good == length) {
      fwrite(u + i, 1, length, out);
      i += length;
    } else {
      fputs("\xEF\xBF\xBD", out); // U+FFFD for the maximal subpart (at least its first byte)
      i += good ? good : 1;
    }
  }
  putc('"', out);
}

static void put_float(FILE *out, float value, bool json) {
  if (json && !isfinite(value))
    fputs("null", out);
  else
    fprintf(out, "%.9g", value);
}

static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// --verbose: the device allocator's segments at the end, with the bytes each has in use.
static void print_segments(devbuf_allocator_t *allocator) {
  devbuf_allocator_snapshot_t *snapshot = NULL;
  if (devbuf_allocator_snapshot(allocator, &snapshot) != DEVBUF_OK) return;
  for (size_t i = 0; i < snapshot->segment_count; i++) {
    const devbuf_snapshot_segment_t *g = &snapshot->segments[i];
    uint64_t active = 0, largest_free = 0;
    for (size_t b = 0; b < g->block_count; b++) {
      const devbuf_snapshot_block_t *block = &g->blocks[b];
      if (block->state == DEVBUF_BLOCK_ACTIVE) active += block->size;
      if (block->state != DEVBUF_BLOCK_ACTIVE && block->size > largest_free)
        largest_free = block->size;
    }
    fprintf(stderr, "segment %llu (%s): %llu bytes, %zu blocks, %llu active, largest free %llu\n",
            (unsigned long long)g->serial, g->pool, (unsigned long long)g->size, g->block_count,
            (unsigned long long)active, (unsigned long long)largest_free);
  }
  devbuf_allocator_snapshot_free(snapshot);
}

// ---- the run -------------------------------------------------------------------------------

static int fail(const char *what, const char *message) {
  fprintf(stderr, "devbuf-embed: %s%s%s\n", what ? what : "", what ? ": " : "", message);
  return 1;
}

// A devbuf failure: device out of memory says so; the message names the rest.
static int devbuf_fail(devbuf_status status, const char *what) {
  char message[1024];
  snprintf(message, sizeof message, "%s%s",
           status == DEVBUF_OUT_OF_MEMORY ? "device out of memory: " : "", devbuf_last_error());
  return fail(what, message);
}

int main(int argc, char **argv) {
  options o;
  int parsed = parse(argc, argv, &o);
  if (parsed) return parsed < 0 ? 0 : parsed;
  static char out_buffer[1 << 20];
  setvbuf(stdout, out_buffer, _IOFBF, sizeof out_buffer);

  char err[1024];
  int code = 1;
  text input = {NULL, 0};
  line *lines = NULL;
  size_t line_count = 0;
  embed_tokenizer_t *tokenizer = NULL;
  devbuf_device_t *device = NULL;
  embed_model_t *model = NULL;
  embed_exec_t x = {0};
  bool cpu_started = false;
  int32_t *ids = NULL;
  size_t *offsets = NULL, *counts = NULL;
  float *embeddings = NULL;
  devbuf_status status;

  if (read_all(o.input, &input, err, sizeof err) != 0) return fail(NULL, err);
  if (!(lines = split_lines(&input, &line_count))) {
    code = fail(NULL, "no memory for the input's lines");
    goto done;
  }
  if (embed_model_folder(o.model, err, sizeof err) != 0 ||
      embed_tokenizer_load(o.model, &tokenizer, err, sizeof err) != 0) {
    code = fail(NULL, err);
    goto done;
  }
  // Every id the tokenizer gives must be a row of the embedding matrix, and a vocabulary of
  // another size is another model's: its ids would pick the wrong rows.
  size_t id_count = embed_tokenizer_id_count(tokenizer);
  if (id_count != EMBED_VOCAB) {
    snprintf(err, sizeof err,
             "model folder '%s': the tokenizer gives %zu ids (vocab.txt's lines, and added "
             "tokens past them) where the model's embedding matrix has %d rows: a tokenizer of "
             "another model",
             o.model, id_count, EMBED_VOCAB);
    code = fail(NULL, err);
    goto done;
  }
  if ((status = devbuf_device_open(o.device, &device)) != DEVBUF_OK) {
    code = devbuf_fail(status, NULL); // the message names the spec
    goto done;
  }
  // On the CPU the activations are the allocator's only memory (the weights are the mapped
  // file) and a working set of a few MiB is far from a whole number of 2 MiB segments:
  // growable segments map what the blocks reach. Devices hold the weights in the same
  // allocator, so their plain segments stay within a few percent of what is active.
  devbuf_caching_options_t policy = {
      .memory_limit = o.memory_limit,
      .growable = devbuf_device_kind_of(device) == DEVBUF_DEVICE_CPU,
  };
  if ((status = devbuf_caching_allocator_configure(devbuf_device_allocator(device), &policy)) !=
      DEVBUF_OK) {
    code = devbuf_fail(status, devbuf_device_spec(device));
    goto done;
  }
  if (embed_model_load(device, o.model, &model, err, sizeof err) != 0) {
    code = fail(NULL, err);
    goto done;
  }

  bool cpu = devbuf_device_kind_of(device) == DEVBUF_DEVICE_CPU;
  x.device = device;
  x.empty = o.empty;
  x.k = cpu ? &embed_cpu_kernels : &embed_device_kernels;
  x.staging = cpu ? NULL : devbuf_device_allocator_for(device, DEVBUF_MEMORY_HOST_VISIBLE);
  cpu_started = cpu;
  if ((status = devbuf_queue_create(device, &x.compute)) != DEVBUF_OK ||
      (status = devbuf_queue_create(device, &x.upload)) != DEVBUF_OK ||
      (status = cpu ? embed_cpu_start(o.threads) : embed_device_program(&x)) != DEVBUF_OK) {
    code = devbuf_fail(status, devbuf_device_spec(device));
    goto done;
  }
  if (o.verbose && cpu)
    fprintf(stderr, "OpenBLAS core %s; %u threads per kernel\n", embed_cpu_blas_core(), o.threads);

  // Tokens of every sentence first: batches are made of sentences of similar lengths.
  double start = seconds_now();
  size_t used = 0, capacity = 1 << 16; // ids (grown as sentences come)
  ids = malloc(capacity * sizeof *ids);
  offsets = malloc((line_count ? line_count : 1) * sizeof *offsets);
  counts = malloc((line_count ? line_count : 1) * sizeof *counts);
  embeddings = malloc((line_count ? line_count : 1) * EMBED_HIDDEN * sizeof *embeddings);
  if (!ids || !offsets || !counts || !embeddings) {
    code = fail(NULL, "no memory for the sentences");
    goto done;
  }
  for (size_t i = 0; i < line_count; i++) {
    if (capacity - used < EMBED_MAX_TOKENS) {
      int32_t *grown = realloc(ids, capacity * 2 * sizeof *ids);
      if (!grown) {
        code = fail(NULL, "no memory for the token ids");
        goto done;
      }
      ids = grown, capacity *= 2;
    }
    if (embed_tokenizer_encode(tokenizer, lines[i].text, lines[i].length, ids + used,
                               model->max_tokens, &counts[i], err, sizeof err) != 0) {
      char what[64];
      snprintf(what, sizeof what, "line %zu", i + 1);
      code = fail(what, err);
      goto done;
    }
    offsets[i] = used;
    used += counts[i];
  }
  embed_sequences_t seqs = {ids, offsets, counts, line_count};
  embed_memory_t memory;
  status = embed_batches(model, &x, &seqs, o.batch, o.verbose, embeddings, &memory);
  double seconds = seconds_now() - start;
  if (status != DEVBUF_OK) {
    code = devbuf_fail(status, devbuf_device_spec(device));
    goto done;
  }
  if (o.verbose)
    fprintf(stderr,
            "%zu sentences in %.3f s (%.1f/s); peak reserved %llu, peak active %llu (x%.3f), "
            "system allocs %llu (%llu after the first batch); weights %llu bytes%s\n",
            line_count, seconds, seconds > 0 ? (double)line_count / seconds : 0.0,
            (unsigned long long)memory.peak_reserved, (unsigned long long)memory.peak_active,
            memory.peak_active ? (double)memory.peak_reserved / (double)memory.peak_active : 0.0,
            (unsigned long long)memory.system_allocs, (unsigned long long)memory.allocs_after_one,
            (unsigned long long)model->weight_bytes,
            model->zero_copy ? ", zero-copy views of the mapped file" : "");

  if (o.verbose) print_segments(devbuf_device_allocator(device));
  // A weight that is NaN or infinite spreads to every sentence: say so, print nothing.
  for (size_t i = 0; i < line_count * EMBED_HIDDEN; i++) {
    if (isfinite(embeddings[i])) continue;
    snprintf(err, sizeof err,
             "line %zu: its embedding holds %f: the model's weights are not all finite numbers",
             i / EMBED_HIDDEN + 1, (double)embeddings[i]);
    code = fail(NULL, err);
    goto done;
  }

  FILE *out = stdout;
  if (o.json) {
    fputs("{\"device\": ", out);
    json_string(out, devbuf_device_spec(device), strlen(devbuf_device_spec(device)));
    fputs(", \"sentences\": [", out);
  }
  for (size_t i = 0; i < line_count; i++) {
    const float *e = embeddings + i * EMBED_HIDDEN;
    if (o.json) {
      fputs(i ? ", {\"text\": " : "{\"text\": ", out);
      json_string(out, lines[i].text, lines[i].length);
      fputs(", \"ids\": [", out);
      for (size_t t = 0; t < counts[i]; t++)
        fprintf(out, t ? ", %d" : "%d", (int)ids[offsets[i] + t]);
      fputs("], \"embedding\": [", out);
    }
    for (size_t c = 0; c < EMBED_HIDDEN; c++) {
      if (c) fputs(o.json ? ", " : " ", out);
      put_float(out, e[c], o.json);
    }
    fputs(o.json ? "]}" : "\n", out);
  }
  if (o.json)
    fprintf(out,
            "],\n \"memory\": {\"peak_reserved\": %llu, \"peak_active\": %llu, "
            "\"system_allocs\": %llu}, \"seconds\": %.6f}\n",
            (unsigned long long)memory.peak_reserved, (unsigned long long)memory.peak_active,
            (unsigned long long)memory.system_allocs, seconds);
  code = fflush(out) == 0 && !ferror(out) ? 0 : fail(NULL, "cannot write the output");

done:
  // Only here, at the end, does anything wait for the queues: their work must be over
  // before the kernels' threads stop and the buffers they use go.
  if (x.compute) devbuf_queue_finish(x.compute);
  if (x.upload) devbuf_queue_finish(x.upload);
  devbuf_queue_release(x.compute);
  devbuf_queue_release(x.upload);
  if (cpu_started) embed_cpu_stop();
  devbuf_program_release(x.program);
  embed_model_free(model);
  devbuf_device_release(device);
  embed_tokenizer_free(tokenizer);
  free(ids);
  free(offsets);
  free(counts);
  free(embeddings);
  free(lines);
  free(input.bytes);
  return code;
}
