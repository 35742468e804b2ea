// The C snapshot reader outside the tool, for check_snapshot_reader.py:
//   snapshot_convert FILE [--frames N] [--device N]   the trace on stdout (exit 1: a message)
//   snapshot_convert --truncations FILE               every proper prefix of FILE refused with
//                                                     a message, every byte of it replaced by
//                                                     0x00, 0x7f, 0x80 and 0xff refused or
//                                                     converted: exit 0, or 1 naming a prefix
//                                                     that was accepted
#include "pickle_reader.h"
#include "snapshot_reader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char *read_file(const char *path, size_t *out_size) {
  FILE *file = fopen(path, "rb");
  if (!file) return NULL;
  unsigned char *data = NULL;
  size_t size = 0, capacity = 0;
  for (;;) {
    if (size == capacity) {
      capacity = capacity ? capacity * 2 : 65536;
      unsigned char *grown = realloc(data, capacity);
      if (!grown) break;
      data = grown;
    }
    size_t got = fread(data + size, 1, capacity - size, file);
    if (!got) break;
    size += got;
  }
  fclose(file);
  *out_size = size;
  return data ? data : malloc(1);
}

static int convert_to(FILE *out, const unsigned char *data, size_t size, const char *source,
                      int device, int frames, char *message, size_t capacity) {
  devbuf_snapshot_figures figures;
  return devbuf_snapshot_convert(data, size, source, device, frames, out, &figures, message,
                                 capacity);
}

static int truncations(const char *path) {
  size_t size;
  unsigned char *data = read_file(path, &size);
  FILE *sink = fopen("/dev/null", "w");
  if (!data || !sink) {
    fprintf(stderr, "snapshot_convert: cannot read %s\n", path);
    return 2;
  }
  char message[512];
  int failures = 0;
  for (size_t length = 0; length < size; length++) {
    unsigned char *prefix = malloc(length ? length : 1); // exactly `length` bytes, for ASan
    memcpy(prefix, data, length);
    if (convert_to(sink, prefix, length, path, 0, 8, message, sizeof message) == 0 || !message[0]) {
      fprintf(stderr, "the first %zu bytes of %s were %s\n", length, path,
              message[0] ? "accepted" : "refused without a message");
      failures++;
    }
    free(prefix);
  }
  static const unsigned char replacements[] = {0x00, 0x7f, 0x80, 0xff};
  size_t converted = 0;
  for (size_t at = 0; at < size; at++) {
    for (size_t k = 0; k < sizeof replacements; k++) {
      unsigned char *copy = malloc(size);
      memcpy(copy, data, size);
      copy[at] = replacements[k];
      if (convert_to(sink, copy, size, path, 0, 8, message, sizeof message) == 0)
        converted++;
      else if (!message[0]) {
        fprintf(stderr, "byte %zu of %s as 0x%02x: refused without a message\n", at, path,
                replacements[k]);
        failures++;
      }
      free(copy);
    }
  }
  printf("%s: %zu prefixes refused, %zu of %zu one-byte changes converted\n", path, size, converted,
         size * sizeof replacements);
  fclose(sink);
  free(data);
  return failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--truncations") == 0) return truncations(argv[2]);
  int frames = DEVBUF_SNAPSHOT_DEFAULT_FRAMES, device = 0;
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--frames") == 0 && i + 1 < argc)
      frames = atoi(argv[++i]);
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
      device = atoi(argv[++i]);
    else
      path = argv[i];
  }
  size_t size;
  unsigned char *data = path ? read_file(path, &size) : NULL;
  if (!data) {
    fprintf(stderr,
            "usage: snapshot_convert FILE [--frames N] [--device N] | --truncations FILE\n");
    return 2;
  }
  char message[1024];
  int status = convert_to(stdout, data, size, path, device, frames, message, sizeof message);
  free(data);
  if (status) fprintf(stderr, "snapshot_convert: %s: %s\n", path, message);
  return status ? 1 : 0;
}
