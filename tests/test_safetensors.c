// safetensors: files written by other projects load zero-copy and bit-exact; every hostile
// file of the corpus is refused by every entry point with the expected status and message;
// the writer round-trips every dtype, lays tensors out aligned, and replaces files
// atomically.
#include "check.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef DEVBUF_CORPUS
#error "DEVBUF_CORPUS must name the tests' corpus folder"
#endif

static devbuf_device_t *device;
static char scratch[64]; // a private folder for written files

static const char *const shared_files[] = {
    "burn/batch_norm2d.safetensors",
    "burn/boolean.safetensors",
    "burn/buffer.safetensors",
    "burn/complex_nested.safetensors",
    "burn/conv1d.safetensors",
    "burn/conv2d.safetensors",
    "burn/conv_transpose1d.safetensors",
    "burn/conv_transpose2d.safetensors",
    "burn/embedding.safetensors",
    "burn/enum_depthwise_false.safetensors",
    "burn/enum_depthwise_true.safetensors",
    "burn/group_norm.safetensors",
    "burn/integer.safetensors",
    "burn/key_remap.safetensors",
    "burn/key_remap_chained.safetensors",
    "burn/layer_norm.safetensors",
    "burn/linear.safetensors",
    "burn/linear_with_bias.safetensors",
    "burn/missing_module_field.safetensors",
    "burn/mnist.safetensors",
    "burn/non_contiguous_indexes.safetensors",
    "safetensors-cpp/model.safetensors",
};

// Every tensor of a real file: a read-only view inside one page-aligned mapping, with the
// file's own bytes at the header's offsets.
static void check_shared_file(const char *relative) {
  char path[512];
  snprintf(path, sizeof path, "%s/safetensors/%s", test_data_dir(), relative);
  size_t file_size;
  unsigned char *expected = test_read_file(path, &file_size);
  CHECK(expected != NULL);
  if (!expected) return;
  devbuf_tensor_file_t *file = NULL;
  CHECK_OK(devbuf_safetensors_load(device, path, NULL, &file));
  if (!file) {
    fprintf(stderr, "  file %s\n", relative);
    free(expected);
    return;
  }
  CHECK(devbuf_tensor_file_count(file) > 0);
  CHECK_EQ_U(8 + devbuf_tensor_file_header_size(file) + devbuf_tensor_file_data_size(file),
             file_size);
  const unsigned char *base = NULL;
  for (size_t i = 0; i < devbuf_tensor_file_count(file); i++) {
    devbuf_tensor_info_t info;
    CHECK_OK(devbuf_tensor_file_info(file, i, &info));
    devbuf_buffer_t *buffer = devbuf_tensor_file_buffer(file, i);
    CHECK(buffer && devbuf_buffer_dtype(buffer) == info.dtype &&
          devbuf_buffer_ndim(buffer) == info.ndim);
    CHECK_EQ_U(devbuf_buffer_size(buffer), info.end - info.begin);
    CHECK(devbuf_buffer_is_read_only(buffer) && devbuf_buffer_is_mapped(buffer));
    const void *data;
    size_t size;
    CHECK_OK(devbuf_buffer_contents(buffer, &data, &size));
    if (size) {
      const unsigned char *mapping = (const unsigned char *)data - info.file_offset;
      if (!base) base = mapping;
      CHECK(mapping == base); // one mapping for the whole file
      CHECK(memcmp(data, expected + info.file_offset, size) == 0);
    }
    CHECK_OK(devbuf_buffer_end_access(buffer, data));
    void *write;
    CHECK_STATUS(devbuf_buffer_contents_mut(buffer, &write, NULL), DEVBUF_READ_ONLY);
    size_t found;
    CHECK_OK(devbuf_tensor_file_find(file, info.name, &found));
    CHECK_EQ_U(found, i);
  }
  CHECK(base && (uintptr_t)base % (uintptr_t)devbuf_device_page_size(device) == 0);
  // inspect and parse give the same table without reading tensors into buffers
  devbuf_tensor_file_t *inspected = NULL, *parsed = NULL;
  CHECK_OK(devbuf_safetensors_inspect(path, &inspected));
  CHECK_OK(devbuf_safetensors_parse(expected, file_size, &parsed));
  CHECK_EQ_U(devbuf_tensor_file_count(inspected), devbuf_tensor_file_count(file));
  CHECK_EQ_U(devbuf_tensor_file_count(parsed), devbuf_tensor_file_count(file));
  CHECK(devbuf_tensor_file_buffer(inspected, 0) == NULL);
  for (size_t i = 0; inspected && parsed && i < devbuf_tensor_file_count(file); i++) {
    devbuf_tensor_info_t a, b, c;
    devbuf_tensor_file_info(file, i, &a);
    devbuf_tensor_file_info(inspected, i, &b);
    devbuf_tensor_file_info(parsed, i, &c);
    CHECK(strcmp(a.name, b.name) == 0 && strcmp(a.name, c.name) == 0);
    CHECK(a.begin == b.begin && a.end == c.end && a.dtype == b.dtype && a.ndim == c.ndim);
  }
  devbuf_tensor_file_release(inspected);
  devbuf_tensor_file_release(parsed);
  devbuf_tensor_file_release(file);
  free(expected);
}

static void test_shared_files(void) {
  for (size_t i = 0; i < sizeof shared_files / sizeof *shared_files; i++)
    check_shared_file(shared_files[i]);
}

// What the files are known to hold (their READMEs and writers).
static void test_shared_file_contents(void) {
  devbuf_tensor_file_t *file = NULL;
  CHECK_OK(devbuf_safetensors_load(device, test_data("safetensors/burn/mnist.safetensors"), NULL,
                                   &file));
  CHECK_EQ_U(devbuf_tensor_file_count(file), 20);
  size_t f32 = 0, i64 = 0;
  for (size_t i = 0; i < devbuf_tensor_file_count(file); i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(file, i, &info);
    f32 += info.dtype == DEVBUF_FLOAT32;
    i64 += info.dtype == DEVBUF_INT64;
    if (info.dtype == DEVBUF_INT64) CHECK_EQ_U(info.ndim, 0); // num_batches_tracked scalars
  }
  CHECK(f32 > 0 && i64 > 0 && f32 + i64 == 20);
  devbuf_tensor_file_release(file);

  CHECK_OK(devbuf_safetensors_load(
      device, test_data("safetensors/safetensors-cpp/model.safetensors"), NULL, &file));
  CHECK_EQ_U(devbuf_tensor_file_count(file), 2);
  for (size_t i = 0; i < devbuf_tensor_file_count(file); i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(file, i, &info);
    CHECK(info.dtype == DEVBUF_FLOAT64);
  }
  devbuf_tensor_file_release(file);
  file = NULL;
  CHECK_STATUS(devbuf_safetensors_load(
                   device, test_data("safetensors/safetensors-cpp/bad_abuse_attempt_1.safetensors"),
                   NULL, &file),
               DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE("runs past the end of the 88-byte file");
  CHECK(file == NULL);
}

static devbuf_status status_named(const char *name) {
  for (int s = 0; s <= DEVBUF_CANCELLED; s++)
    if (strcmp(devbuf_status_name((devbuf_status)s), name) == 0) return (devbuf_status)s;
  return (devbuf_status)-1;
}

// Every hostile file is refused by load, inspect and parse alike.
static void test_hostile_corpus(void) {
  FILE *expect = fopen(DEVBUF_CORPUS "/safetensors/expect.txt", "r");
  CHECK(expect != NULL);
  if (!expect) return;
  char line[512];
  size_t checked = 0;
  while (fgets(line, sizeof line, expect)) {
    if (line[0] == '#') continue;
    line[strcspn(line, "\n")] = '\0';
    char *name = strtok(line, " ");
    char *status_text = strtok(NULL, " ");
    char *phrase = strtok(NULL, "");
    if (!name || !status_text || !phrase) continue;
    devbuf_status expected = status_named(status_text);
    char path[512];
    snprintf(path, sizeof path, "%s/safetensors/%s", DEVBUF_CORPUS, name);
    check_current = name;
    devbuf_tensor_file_t *file = NULL;
    CHECK_STATUS(devbuf_safetensors_load(device, path, NULL, &file), expected);
    CHECK_MESSAGE(phrase);
    CHECK(file == NULL);
    CHECK_STATUS(devbuf_safetensors_inspect(path, &file), expected);
    CHECK_MESSAGE(phrase);
    size_t size;
    unsigned char *bytes = test_read_file(path, &size);
    CHECK(bytes != NULL);
    CHECK_STATUS(devbuf_safetensors_parse(bytes ? bytes : (unsigned char *)"", size, &file),
                 expected);
    CHECK_MESSAGE(phrase);
    // Every prefix of a hostile file is refused too, and nothing reads past it.
    for (size_t cut = 0; bytes && cut < size && cut < 4096; cut += 1 + cut / 16) {
      unsigned char *prefix = malloc(cut ? cut : 1);
      memcpy(prefix, bytes, cut);
      devbuf_status status = devbuf_safetensors_parse(prefix, cut, &file);
      CHECK(status != DEVBUF_OK || file != NULL);
      devbuf_tensor_file_release(file);
      file = NULL;
      free(prefix);
    }
    free(bytes);
    checked++;
  }
  fclose(expect);
  check_current = "test_hostile_corpus";
  // Every corpus file is listed.
  size_t files = 0;
  DIR *folder = opendir(DEVBUF_CORPUS "/safetensors");
  for (struct dirent *entry; folder && (entry = readdir(folder));)
    files += strstr(entry->d_name, ".safetensors") != NULL;
  if (folder) closedir(folder);
  CHECK_EQ_U(files, checked);
  CHECK(checked >= 40);
}

// A tensor's bytes: a deterministic pattern of `seed`.
static void fill_pattern(unsigned char *bytes, size_t size, unsigned seed) {
  uint32_t x = 2166136261u ^ seed;
  for (size_t i = 0; i < size; i++) {
    x = x * 16777619u + 12345u;
    bytes[i] = (unsigned char)(x >> 24);
  }
}

static devbuf_buffer_t *pattern_buffer(devbuf_dtype dtype, const size_t *shape, size_t ndim,
                                       unsigned seed) {
  devbuf_buffer_t *buffer = NULL;
  if (devbuf_buffer_allocate(devbuf_device_allocator(device), dtype, shape, ndim, 0, &buffer) !=
      DEVBUF_OK) {
    fprintf(stderr, "cannot allocate: %s\n", devbuf_last_error());
    exit(1);
  }
  size_t size = devbuf_buffer_size(buffer);
  unsigned char *bytes = malloc(size ? size : 1);
  fill_pattern(bytes, size, seed);
  CHECK_OK(devbuf_buffer_copyin(buffer, bytes, size));
  free(bytes);
  return buffer;
}

static int buffers_equal(devbuf_buffer_t *a, devbuf_buffer_t *b) {
  size_t size = devbuf_buffer_size(a);
  if (size != devbuf_buffer_size(b) || devbuf_buffer_dtype(a) != devbuf_buffer_dtype(b) ||
      devbuf_buffer_ndim(a) != devbuf_buffer_ndim(b))
    return 0;
  if (devbuf_buffer_ndim(a) && memcmp(devbuf_buffer_shape(a), devbuf_buffer_shape(b),
                                      devbuf_buffer_ndim(a) * sizeof(size_t)) != 0)
    return 0;
  unsigned char *x = malloc(size + 1), *y = malloc(size + 1);
  int equal = devbuf_buffer_copyout(a, x, size) == DEVBUF_OK &&
              devbuf_buffer_copyout(b, y, size) == DEVBUF_OK && memcmp(x, y, size) == 0;
  free(x);
  free(y);
  return equal;
}

// Every dtype, scalars, empty tensors and unicode names survive a write and a load bit-exact.
static void test_write_round_trip(void) {
  enum { TENSORS = DEVBUF_DTYPE_COUNT + 3 };
  devbuf_named_buffer_t tensors[TENSORS];
  char names[TENSORS][32];
  for (int d = 0; d < DEVBUF_DTYPE_COUNT; d++) {
    size_t shape[2] = {3, 8}; // 24 elements: whole bytes for 4- and 6-bit types
    snprintf(names[d], sizeof names[d], "layer.%s", devbuf_dtype_name((devbuf_dtype)d));
    tensors[d] =
        (devbuf_named_buffer_t){names[d], pattern_buffer((devbuf_dtype)d, shape, 2, (unsigned)d)};
  }
  size_t empty_shape[2] = {0, 5};
  tensors[DEVBUF_DTYPE_COUNT] =
      (devbuf_named_buffer_t){"empty", pattern_buffer(DEVBUF_FLOAT32, empty_shape, 2, 90)};
  tensors[DEVBUF_DTYPE_COUNT + 1] =
      (devbuf_named_buffer_t){"scalar", pattern_buffer(DEVBUF_INT64, NULL, 0, 91)};
  size_t odd_shape[1] = {3};
  tensors[DEVBUF_DTYPE_COUNT + 2] =
      (devbuf_named_buffer_t){"\xc3\xa9t\xc3\xa9 \"quoted\"\\\t\xf0\x9f\x98\x80",
                              pattern_buffer(DEVBUF_UINT8, odd_shape, 1, 92)};
  devbuf_metadata_entry_t metadata[] = {{"format", "pt"},
                                        {"note", "line\nbreak \"q\" \xe2\x82\xac"}};
  char path[128];
  snprintf(path, sizeof path, "%s/round.safetensors", scratch);
  CHECK_OK(devbuf_safetensors_write(path, tensors, TENSORS, metadata, 2));

  devbuf_tensor_file_t *file = NULL;
  CHECK_OK(devbuf_safetensors_load(device, path, NULL, &file));
  CHECK_EQ_U(devbuf_tensor_file_count(file), TENSORS);
  CHECK_EQ_U((8 + devbuf_tensor_file_header_size(file)) % 8, 0);
  for (size_t i = 0; i < TENSORS; i++) {
    size_t index = SIZE_MAX;
    CHECK_OK(devbuf_tensor_file_find(file, tensors[i].name, &index));
    devbuf_buffer_t *loaded = devbuf_tensor_file_buffer(file, index);
    CHECK(loaded && buffers_equal(loaded, tensors[i].buffer));
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(file, index, &info);
    unsigned bytes = devbuf_dtype_bits(info.dtype) / 8;
    if (bytes) CHECK_EQ_U(info.file_offset % bytes, 0); // aligned to its element
  }
  CHECK_EQ_U(devbuf_tensor_file_metadata_count(file), 2);
  CHECK(devbuf_tensor_file_metadata_get(file, "note") &&
        strcmp(devbuf_tensor_file_metadata_get(file, "note"), metadata[1].value) == 0);
  const char *key, *value;
  CHECK_OK(devbuf_tensor_file_metadata(file, 0, &key, &value));
  CHECK(strcmp(key, "format") == 0 && strcmp(value, "pt") == 0);
  CHECK_STATUS(devbuf_tensor_file_metadata(file, 2, &key, &value), DEVBUF_OUT_OF_RANGE);
  size_t index;
  CHECK_STATUS(devbuf_tensor_file_find(file, "absent", &index), DEVBUF_NOT_FOUND);
  CHECK_MESSAGE("no tensor named 'absent'");

  // Buffers outlive the table, and the file itself.
  devbuf_tensor_file_find(file, "scalar", &index);
  devbuf_buffer_t *kept = devbuf_buffer_retain(devbuf_tensor_file_buffer(file, index));
  devbuf_tensor_file_release(file);
  CHECK_EQ_U(unlink(path), 0);
  CHECK(buffers_equal(kept, tensors[DEVBUF_DTYPE_COUNT + 1].buffer));
  devbuf_buffer_release(kept);
  for (size_t i = 0; i < TENSORS; i++) devbuf_buffer_release(tensors[i].buffer);
}

typedef struct seen_tensors {
  size_t calls, last_index;
  int in_order;
} seen_tensors;

static void on_tensor(void *context, size_t index, const devbuf_tensor_info_t *info,
                      devbuf_buffer_t *buffer) {
  seen_tensors *seen = context;
  seen->in_order &= index == seen->calls && buffer != NULL && info->name != NULL;
  seen->calls++;
}

// DEVBUF_LOAD_COPY gives writable buffers from the allocator, equal to the file's bytes.
static void test_load_copies(void) {
  const char *path = test_data("safetensors/burn/mnist.safetensors");
  devbuf_tensor_file_t *mapped = NULL, *copied = NULL;
  seen_tensors seen = {.in_order = 1};
  devbuf_load_options_t options = {
      .flags = DEVBUF_LOAD_COPY, .on_tensor = on_tensor, .context = &seen};
  CHECK_OK(devbuf_safetensors_load(device, path, NULL, &mapped));
  CHECK_OK(devbuf_safetensors_load(device, path, &options, &copied));
  CHECK_EQ_U(seen.calls, devbuf_tensor_file_count(copied));
  CHECK(seen.in_order);
  for (size_t i = 0; copied && i < devbuf_tensor_file_count(copied); i++) {
    devbuf_buffer_t *copy = devbuf_tensor_file_buffer(copied, i);
    CHECK(!devbuf_buffer_is_read_only(copy) && !devbuf_buffer_is_mapped(copy));
    CHECK(devbuf_buffer_allocator(copy) == devbuf_device_allocator(device));
    CHECK(buffers_equal(copy, devbuf_tensor_file_buffer(mapped, i)));
  }
  devbuf_load_options_t bad = {.flags = 1u << 7};
  devbuf_tensor_file_t *file;
  CHECK_STATUS(devbuf_safetensors_load(device, path, &bad, &file), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_safetensors_load(device, "/nonexistent/x.safetensors", NULL, &file),
               DEVBUF_IO_ERROR);
  CHECK_MESSAGE("/nonexistent/x.safetensors");
  devbuf_tensor_file_release(mapped);
  devbuf_tensor_file_release(copied);
}

// Loads only the tensors whose names hold a substring.
static int named_like(void *context, size_t index, const devbuf_tensor_info_t *info) {
  (void)index;
  return strstr(info->name, (const char *)context) != NULL;
}

// `select` leaves tensors out (no buffer, no bytes read); DEVBUF_LOAD_ONE_ALLOCATION puts
// the copies of those loaded in one allocation, each aligned, equal to the file's bytes.
static void test_load_selected_in_one_allocation(void) {
  const char *path = test_data("safetensors/burn/mnist.safetensors");
  devbuf_tensor_file_t *all = NULL, *some = NULL, *packed = NULL;
  CHECK_OK(devbuf_safetensors_load(device, path, NULL, &all));
  size_t count = devbuf_tensor_file_count(all), weights = 0;
  for (size_t i = 0; i < count; i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(all, i, &info);
    weights += strstr(info.name, "weight") != NULL;
  }
  CHECK(weights > 1 && weights < count); // the file has weights and other tensors
  devbuf_load_options_t options = {.select = named_like, .context = "weight"};
  CHECK_OK(devbuf_safetensors_load(device, path, &options, &some)); // zero-copy views
  options.flags = DEVBUF_LOAD_COPY | DEVBUF_LOAD_ONE_ALLOCATION;
  devbuf_allocator_t *allocator = devbuf_device_allocator(device);
  uint64_t before = stats_of(allocator).live_buffers;
  CHECK_OK(devbuf_safetensors_load(device, path, &options, &packed));
  CHECK_EQ_U(stats_of(allocator).live_buffers, before + 1); // one allocation for them all
  size_t loaded = 0;
  uint64_t storage = 0;
  for (size_t i = 0; i < count; i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(all, i, &info);
    bool wanted = strstr(info.name, "weight") != NULL;
    devbuf_buffer_t *view = devbuf_tensor_file_buffer(some, i);
    devbuf_buffer_t *copy = devbuf_tensor_file_buffer(packed, i);
    CHECK(wanted ? view && copy : !view && !copy);
    if (!wanted) continue;
    loaded++;
    CHECK(devbuf_buffer_is_mapped(view) && !devbuf_buffer_is_mapped(copy));
    CHECK(buffers_equal(copy, devbuf_tensor_file_buffer(all, i)));
    uint64_t address = 0;
    CHECK_OK(devbuf_buffer_device_ptr(copy, &address));
    CHECK_EQ_U(address % 64, 0);
    if (!storage) storage = devbuf_buffer_storage_id(copy);
    CHECK(devbuf_buffer_storage_id(copy) == storage);
  }
  CHECK_EQ_U(loaded, weights);
  devbuf_tensor_file_release(packed);
  CHECK_EQ_U(stats_of(allocator).live_buffers, before);
  devbuf_tensor_file_release(some);
  devbuf_tensor_file_release(all);
}

// Tensors of 6-bit elements in one allocation: each begins at a whole number of its elements
// (a multiple of 3 bytes as well as of the alignment), after tensors of other sizes.
static void test_six_bit_tensors_in_one_allocation(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/six.safetensors", scratch);
  size_t one = 1, four = 4, eight = 8, shape[2] = {3, 4};
  devbuf_buffer_t *u = pattern_buffer(DEVBUF_UINT8, &one, 1, 1),
                  *f = pattern_buffer(DEVBUF_FLOAT6_E2M3, &four, 1, 2),
                  *g = pattern_buffer(DEVBUF_FLOAT6_E3M2, &eight, 1, 3),
                  *h = pattern_buffer(DEVBUF_FLOAT6_E2M3, shape, 2, 4);
  devbuf_named_buffer_t tensors[] = {{"a", u}, {"b", f}, {"c", g}, {"d", h}};
  CHECK_OK(devbuf_safetensors_write(path, tensors, 4, NULL, 0));
  devbuf_load_options_t options = {.flags = DEVBUF_LOAD_COPY | DEVBUF_LOAD_ONE_ALLOCATION};
  devbuf_tensor_file_t *file = NULL;
  CHECK_OK(devbuf_safetensors_load(device, path, &options, &file));
  for (size_t i = 0; file && i < 4; i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(file, i, &info);
    devbuf_buffer_t *loaded = devbuf_tensor_file_buffer(file, i);
    CHECK(buffers_equal(loaded, tensors[info.name[0] - 'a'].buffer));
    CHECK_EQ_U(devbuf_buffer_offset(loaded) % 64, 0);
    if (devbuf_dtype_bits(devbuf_buffer_dtype(loaded)) == 6) // 4 elements to 3 bytes
      CHECK_EQ_U(devbuf_buffer_offset(loaded) % 3, 0);
  }
  devbuf_tensor_file_release(file);
  devbuf_buffer_release(u);
  devbuf_buffer_release(f);
  devbuf_buffer_release(g);
  devbuf_buffer_release(h);
  unlink(path);
}

// A tensor that work keeps rewriting is written whole, as it stood at one moment: no fill
// lands between the pieces it is written in (each piece was a copyout of its own, and a
// 24 MiB tensor came out half of one fill, half of the next).
typedef struct refiller {
  devbuf_queue_t *queue;
  devbuf_buffer_t *buffer;
  atomic_bool stop;
} refiller;

static void *refill(void *arg) {
  refiller *r = arg;
  for (unsigned char value = 1; !atomic_load(&r->stop); value = value == 1 ? 2 : 1) {
    (void)devbuf_queue_fill(r->queue, r->buffer, &value, 1); // refused while it is read
    (void)devbuf_queue_finish(r->queue);
    struct timespec pause = {0, 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  return NULL;
}

static void test_write_while_work_rewrites(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/rewritten.safetensors", scratch);
  size_t size = (size_t)24 << 20;
  refiller r = {.stop = false};
  CHECK_OK(devbuf_queue_create(device, &r.queue));
  CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1,
                                  DEVBUF_BUFFER_ZERO, &r.buffer));
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, refill, &r) == 0);
  devbuf_named_buffer_t tensor = {"t", r.buffer};
  for (int round = 0; round < 3; round++) {
    CHECK_OK(devbuf_safetensors_write(path, &tensor, 1, NULL, 0));
    size_t file_size = 0;
    unsigned char *bytes = test_read_file(path, &file_size);
    CHECK(bytes && file_size > size);
    if (!bytes || file_size <= size) continue;
    const unsigned char *data = bytes + file_size - size;
    size_t differ = 0;
    for (size_t i = 0; i < size; i++) differ += data[i] != data[0];
    CHECK_EQ_U(differ, 0);
    free(bytes);
  }
  atomic_store(&r.stop, true);
  pthread_join(thread, NULL);
  devbuf_buffer_release(r.buffer);
  devbuf_queue_release(r.queue);
  unlink(path);
}

static size_t files_in_scratch(void) {
  size_t count = 0;
  DIR *folder = opendir(scratch);
  for (struct dirent *entry; folder && (entry = readdir(folder));)
    count += strcmp(entry->d_name, ".") != 0 &&
             strcmp(entry->d_name, "..") != 0; // temporaries start with '.'
  if (folder) closedir(folder);
  return count;
}

// Refused arguments leave nothing behind; a write that fails half-way leaves the old file
// whole and no temporary file.
// Writes a safetensors file by hand: `header` padded with spaces to `header_size` bytes, then
// `data`.
static void write_raw(const char *path, const char *header, size_t header_size, const void *data,
                      size_t data_size) {
  FILE *out = fopen(path, "wb");
  CHECK(out != NULL);
  if (!out) return;
  unsigned char prefix[8];
  for (int i = 0; i < 8; i++) prefix[i] = (unsigned char)((uint64_t)header_size >> (8 * i));
  fwrite(prefix, 1, 8, out);
  fwrite(header, 1, strlen(header), out);
  for (size_t i = strlen(header); i < header_size; i++) fputc(' ', out);
  if (data_size) fwrite(data, 1, data_size, out);
  fclose(out);
}

// A file written without padding puts a tensor off its element's alignment: the zero-copy
// load hands it out in aligned memory of its own, with the file's values; its aligned
// neighbour stays a view. Format errors name the file.
static void test_misaligned_tensors_and_named_errors(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/misaligned.safetensors", scratch);
  const char *header = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}";
  size_t header_size = strlen(header);
  while ((8 + header_size) % 4 != 1) header_size++; // `a` at an odd offset
  unsigned char data[11];
  const float values[2] = {1.5f, -2.0f};
  memcpy(data, values, 8);
  memcpy(data + 8, "xyz", 3);
  write_raw(path, header, header_size, data, sizeof data);
  devbuf_tensor_file_t *file = NULL;
  CHECK_OK(devbuf_safetensors_load(device, path, NULL, &file));
  if (!file) return;
  const float *a = NULL;
  const unsigned char *b = NULL;
  CHECK_OK(devbuf_buffer_contents(devbuf_tensor_file_buffer(file, 0), (const void **)&a, NULL));
  CHECK_OK(devbuf_buffer_contents(devbuf_tensor_file_buffer(file, 1), (const void **)&b, NULL));
  if (a && b) {
    CHECK((uintptr_t)a % 4 == 0);
    CHECK(a[0] == 1.5f && a[1] == -2.0f);
    CHECK(memcmp(b, "xyz", 3) == 0);
  }
  devbuf_buffer_end_access(devbuf_tensor_file_buffer(file, 0), a);
  devbuf_buffer_end_access(devbuf_tensor_file_buffer(file, 1), b);
  devbuf_tensor_file_release(file);
  // A header that is not JSON: every entry point names the file.
  write_raw(path, "{\"a\":", 6, NULL, 0);
  devbuf_load_options_t copy = {.flags = DEVBUF_LOAD_COPY};
  CHECK_STATUS(devbuf_safetensors_load(device, path, NULL, &file), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE(path);
  CHECK_STATUS(devbuf_safetensors_load(device, path, &copy, &file), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE(path);
  CHECK_STATUS(devbuf_safetensors_inspect(path, &file), DEVBUF_FORMAT_ERROR);
  CHECK_MESSAGE(path);
  // JSON lets blanks come before the object, and the reference reads such a header.
  write_raw(path, " \r\n\t{\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 64,
            "hi", 2);
  CHECK_OK(devbuf_safetensors_load(device, path, NULL, &file));
  char hi[2] = {0};
  CHECK_OK(devbuf_buffer_copyout(devbuf_tensor_file_buffer(file, 0), hi, 2));
  CHECK(memcmp(hi, "hi", 2) == 0);
  devbuf_tensor_file_release(file);
}

static void test_write_errors_and_atomicity(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/atomic.safetensors", scratch);
  size_t shape[1] = {1000};
  devbuf_buffer_t *good = pattern_buffer(DEVBUF_FLOAT32, shape, 1, 7);
  devbuf_named_buffer_t one[] = {{"w", good}};
  CHECK_OK(devbuf_safetensors_write(path, one, 1, NULL, 0));
  size_t before_size;
  unsigned char *before = test_read_file(path, &before_size);
  size_t files = files_in_scratch();

  devbuf_named_buffer_t twice[] = {{"w", good}, {"w", good}};
  CHECK_STATUS(devbuf_safetensors_write(path, twice, 2, NULL, 0), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("tensor 'w' is given twice");
  devbuf_named_buffer_t reserved[] = {{"__metadata__", good}};
  CHECK_STATUS(devbuf_safetensors_write(path, reserved, 1, NULL, 0), DEVBUF_INVALID_ARGUMENT);
  devbuf_named_buffer_t bad_name[] = {{"w\xff", good}};
  CHECK_STATUS(devbuf_safetensors_write(path, bad_name, 1, NULL, 0), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("not valid UTF-8");
  devbuf_named_buffer_t no_buffer[] = {{"w", NULL}};
  CHECK_STATUS(devbuf_safetensors_write(path, no_buffer, 1, NULL, 0), DEVBUF_INVALID_ARGUMENT);
  devbuf_metadata_entry_t same_key[] = {{"k", "1"}, {"k", "2"}};
  CHECK_STATUS(devbuf_safetensors_write(path, one, 1, same_key, 2), DEVBUF_INVALID_ARGUMENT);
  // Among many keys, the first and the last the same.
  enum { MANY_KEYS = 20000 };
  devbuf_metadata_entry_t *many = calloc(MANY_KEYS, sizeof *many);
  char(*keys)[16] = calloc(MANY_KEYS, sizeof *keys);
  if (many && keys) {
    for (int i = 0; i < MANY_KEYS; i++) {
      snprintf(keys[i], sizeof keys[i], "key%d", i == MANY_KEYS - 1 ? 0 : i);
      many[i] = (devbuf_metadata_entry_t){keys[i], ""};
    }
    CHECK_STATUS(devbuf_safetensors_write(path, one, 1, many, MANY_KEYS), DEVBUF_INVALID_ARGUMENT);
    CHECK_MESSAGE("metadata key 'key0' is given twice");
    snprintf(keys[MANY_KEYS - 1], sizeof keys[0], "last");
    CHECK_OK(devbuf_safetensors_write(path, one, 1, many, MANY_KEYS));
    CHECK_OK(devbuf_safetensors_write(path, one, 1, NULL, 0)); // as it was
  }
  free(many);
  free(keys);
  CHECK_STATUS(devbuf_safetensors_write("/nonexistent-folder/x.safetensors", one, 1, NULL, 0),
               DEVBUF_IO_ERROR);
  // A FIFO (or a device node) in the target's place is not replaced by the new file.
  char fifo[160];
  snprintf(fifo, sizeof fifo, "%s/a-fifo", scratch);
  CHECK(mkfifo(fifo, 0600) == 0);
  CHECK_STATUS(devbuf_safetensors_write(fifo, one, 1, NULL, 0), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("is not a regular file (a FIFO): refusing to replace it");
  struct stat kept;
  CHECK(lstat(fifo, &kept) == 0 && S_ISFIFO(kept.st_mode));
  unlink(fifo);

  // The second tensor's memory cannot be allocated: the write fails after the first.
  devbuf_allocator_t *failing = NULL;
  CHECK_OK(devbuf_fault_adaptor_create(devbuf_device_allocator(device), 1, DEVBUF_FAULT_PERSISTENT,
                                       &failing));
  devbuf_buffer_t *lazy = NULL;
  CHECK_OK(devbuf_buffer_new(failing, DEVBUF_FLOAT32, shape, 1, 0, &lazy));
  devbuf_named_buffer_t half[] = {{"a", good}, {"b", lazy}};
  CHECK_STATUS(devbuf_safetensors_write(path, half, 2, NULL, 0), DEVBUF_INJECTED_FAULT);
  size_t after_size;
  unsigned char *after = test_read_file(path, &after_size);
  CHECK(after && before && after_size == before_size && memcmp(after, before, before_size) == 0);
  CHECK_EQ_U(files_in_scratch(), files); // no temporary file left
  // A tensor under an open write access may be half written: refused, as copyout refuses it.
  void *writing = NULL;
  CHECK_OK(devbuf_buffer_contents_mut(good, &writing, NULL));
  CHECK_STATUS(devbuf_safetensors_write(path, one, 1, NULL, 0), DEVBUF_HOST_ACCESS_OPEN);
  CHECK_OK(devbuf_buffer_end_access(good, writing));
  free(after);
  after = test_read_file(path, &after_size);
  CHECK(after && before && after_size == before_size && memcmp(after, before, before_size) == 0);
  CHECK_EQ_U(files_in_scratch(), files);
  struct stat info;
  CHECK(stat(path, &info) == 0 && (info.st_mode & 0777) != 0600); // the umask's mode, not mkstemp's
  free(before);
  free(after);
  devbuf_buffer_release(lazy);
  devbuf_allocator_release(failing);
  devbuf_buffer_release(good);
  unlink(path);
}

// Rewriting a file keeps its permissions; a new file follows the umask; a target whose name
// is as long as the system allows is written (the temporary name does not grow with it).
static void test_write_permissions_and_long_names(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/private.safetensors", scratch);
  size_t shape[1] = {16};
  devbuf_buffer_t *good = pattern_buffer(DEVBUF_UINT8, shape, 1, 3);
  devbuf_named_buffer_t one[] = {{"w", good}};
  mode_t old_mask = umask(022);
  CHECK_OK(devbuf_safetensors_write(path, one, 1, NULL, 0));
  struct stat info;
  CHECK(stat(path, &info) == 0 && (info.st_mode & 07777) == 0644);
  CHECK(chmod(path, 0600) == 0);
  CHECK_OK(devbuf_safetensors_write(path, one, 1, NULL, 0));
  CHECK(stat(path, &info) == 0 && (info.st_mode & 07777) == 0600);
  CHECK(chmod(path, 0640) == 0);
  CHECK_OK(devbuf_safetensors_write(path, one, 1, NULL, 0));
  CHECK(stat(path, &info) == 0 && (info.st_mode & 07777) == 0640);
  unlink(path);
  umask(077);
  CHECK_OK(devbuf_safetensors_write(path, one, 1, NULL, 0));
  CHECK(stat(path, &info) == 0 && (info.st_mode & 07777) == 0600);
  unlink(path);
  umask(old_mask);
  size_t files = files_in_scratch();
  char name[256];
  memset(name, 'n', 255 - strlen(".safetensors"));
  snprintf(name + 255 - strlen(".safetensors"), sizeof name - (255 - strlen(".safetensors")),
           ".safetensors");
  CHECK_EQ_U(strlen(name), 255);
  snprintf(path, sizeof path, "%s/%s", scratch, name);
  CHECK_OK(devbuf_safetensors_write(path, one, 1, NULL, 0));
  devbuf_tensor_file_t *file = NULL;
  CHECK_OK(devbuf_safetensors_load(device, path, NULL, &file));
  CHECK_EQ_U(devbuf_tensor_file_count(file), 1);
  devbuf_tensor_file_release(file);
  CHECK_EQ_U(files_in_scratch(), files + 1); // the file, and no temporary beside it
  unlink(path);
  devbuf_buffer_release(good);
}

// Every file entry point refuses what is not a regular file at once: a FIFO with no
// writer (which a plain open() would wait on forever), a character device, a folder.
static void test_special_files(void) {
  char fifo[128];
  snprintf(fifo, sizeof fifo, "%s/fifo", scratch);
  CHECK(mkfifo(fifo, 0600) == 0);
  alarm(30); // a hang fails the test instead of stopping the suite
  const char *paths[] = {fifo, "/dev/null", scratch};
  const char *kinds[] = {"is a FIFO", "is a character device", "is a folder"};
  devbuf_allocator_t *raw = NULL;
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  for (int i = 0; i < 3; i++) {
    devbuf_tensor_file_t *file = NULL;
    devbuf_buffer_t *buffer = NULL;
    devbuf_trace_summary_t summary;
    devbuf_load_options_t copy = {.flags = DEVBUF_LOAD_COPY};
    CHECK_STATUS(devbuf_safetensors_inspect(paths[i], &file), DEVBUF_IO_ERROR);
    CHECK_MESSAGE(kinds[i]);
    CHECK_STATUS(devbuf_safetensors_load(device, paths[i], NULL, &file), DEVBUF_IO_ERROR);
    CHECK_MESSAGE(kinds[i]);
    CHECK_STATUS(devbuf_safetensors_load(device, paths[i], &copy, &file), DEVBUF_IO_ERROR);
    CHECK_MESSAGE(kinds[i]);
    CHECK_STATUS(devbuf_buffer_map_file(device, paths[i], &buffer), DEVBUF_IO_ERROR);
    CHECK_MESSAGE(kinds[i]);
    CHECK_STATUS(devbuf_trace_replay(paths[i], raw, &summary), DEVBUF_IO_ERROR);
    CHECK_MESSAGE(kinds[i]);
    CHECK(file == NULL && buffer == NULL);
  }
  alarm(0);
  devbuf_allocator_release(raw);
  unlink(fifo);
}

static void truncate_after_first(void *context, size_t index, const devbuf_tensor_info_t *info,
                                 devbuf_buffer_t *buffer) {
  (void)info;
  (void)buffer;
  if (index == 0) CHECK(truncate((const char *)context, 100) == 0);
}

// A weight file truncated or rewritten under a loaded model never takes the process down:
// devbuf's reads of a zero-copy tensor whose file shrank report IO_ERROR, a copying load
// that finds the file shorter than its header said reports IO_ERROR, and copies are immune
// to later changes of the file.
static void test_file_changed_under_load(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/changing.safetensors", scratch);
  size_t shape[1] = {1 << 18};
  devbuf_buffer_t *a = pattern_buffer(DEVBUF_FLOAT32, shape, 1, 1),
                  *b = pattern_buffer(DEVBUF_FLOAT32, shape, 1, 2);
  devbuf_named_buffer_t tensors[] = {{"a", a}, {"b", b}};
  CHECK_OK(devbuf_safetensors_write(path, tensors, 2, NULL, 0));
  size_t bytes = shape[0] * 4;
  unsigned char *out = malloc(bytes);
  devbuf_tensor_file_t *mapped = NULL, *copied = NULL;
  devbuf_load_options_t copy = {.flags = DEVBUF_LOAD_COPY};
  CHECK_OK(devbuf_safetensors_load(device, path, NULL, &mapped));
  CHECK_OK(devbuf_safetensors_load(device, path, &copy, &copied));
  if (!mapped || !copied || !out) return;
  devbuf_buffer_t *zero_copy = devbuf_tensor_file_buffer(mapped, 1),
                  *own = devbuf_tensor_file_buffer(copied, 1);
  CHECK_OK(devbuf_buffer_copyout(zero_copy, out, bytes)); // pages are in memory now
  CHECK(truncate(path, 0) == 0);                          // what cp, torch.save or save_file do
  CHECK_STATUS(devbuf_buffer_copyout(zero_copy, out, bytes), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("truncated while mapped");
  devbuf_buffer_t *target = NULL;
  CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_FLOAT32, shape, 1, 0,
                                  &target));
  CHECK_STATUS(devbuf_buffer_copy_from(target, zero_copy), DEVBUF_IO_ERROR);
  // A queue's copy reads the shrunk mapping on the worker: the work fails, not the process.
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_copy(queue, target, zero_copy));
  CHECK_STATUS(devbuf_queue_finish(queue), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("truncated while mapped");
  devbuf_queue_release(queue);
  CHECK(buffers_equal(own, b)); // the copy kept the file's old bytes
  devbuf_buffer_release(target);
  devbuf_tensor_file_release(mapped);
  devbuf_tensor_file_release(copied);
  // A copying load during which the file shrinks.
  CHECK_OK(devbuf_safetensors_write(path, tensors, 2, NULL, 0));
  devbuf_load_options_t shrinking = {
      .flags = DEVBUF_LOAD_COPY, .on_tensor = truncate_after_first, .context = path};
  devbuf_tensor_file_t *file = (devbuf_tensor_file_t *)&file;
  CHECK_STATUS(devbuf_safetensors_load(device, path, &shrinking, &file), DEVBUF_IO_ERROR);
  CHECK_MESSAGE("shorter than it was");
  CHECK(file == (devbuf_tensor_file_t *)&file); // a refusal leaves the caller's variable
  file = NULL;
  // A fault outside devbuf's own reads (the caller's pointer into the shrunk mapping) still
  // reaches the process as before: devbuf's handler passes it on.
  CHECK_OK(devbuf_safetensors_write(path, tensors, 2, NULL, 0));
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) {
    devbuf_tensor_file_t *model = NULL;
    if (devbuf_safetensors_load(device, path, NULL, &model) != DEVBUF_OK) _exit(41);
    devbuf_buffer_t *tensor = devbuf_tensor_file_buffer(model, 1);
    if (devbuf_buffer_copyout(tensor, out, bytes) != DEVBUF_OK) _exit(41); // installs the handler
    int quiet = open("/dev/null", O_WRONLY);
    if (quiet >= 0) dup2(quiet, 2); // a sanitizer's report of the fault is expected
    if (truncate(path, 0) != 0) _exit(41);
    const volatile unsigned char *data = NULL;
    if (devbuf_buffer_contents(tensor, (const void **)&data, NULL) != DEVBUF_OK) _exit(41);
    unsigned sum = 0;
    for (size_t i = 0; i < bytes; i += 4096) sum += data[i];
    _exit(sum == 12345 ? 43 : 42); // reached only if the fault was swallowed
  }
  int child_status = 0;
  CHECK(waitpid(child, &child_status, 0) == child);
  bool killed = WIFSIGNALED(child_status) && WTERMSIG(child_status) == SIGBUS;
  bool reported =
      WIFEXITED(child_status) && WEXITSTATUS(child_status) != 0 && WEXITSTATUS(child_status) < 41;
  CHECK(killed || reported); // reported: a sanitizer's own handler took it
  free(out);
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
  unlink(path);
}

// The load takes its memory from an allocator the caller gives: every allocation it makes
// fails in turn (once, then from there on), each time with a clean status and nothing left
// behind, and the load works once faults stop.
static void test_load_with_faults(void) {
  const char *path = test_data("safetensors/burn/mnist.safetensors");
  devbuf_allocator_t *faults = NULL;
  CHECK_OK(
      devbuf_fault_adaptor_create(devbuf_device_allocator(device), 0, DEVBUF_FAULT_ONCE, &faults));
  devbuf_load_options_t options = {.allocator = faults};
  devbuf_tensor_file_t *file = NULL;
  CHECK_OK(devbuf_safetensors_load(device, path, &options, &file));
  size_t count = devbuf_tensor_file_count(file);
  CHECK(count > 1);
  devbuf_tensor_file_release(file);
  for (int mode = 0; mode < 2; mode++) {
    for (uint64_t n = 1; n <= count; n++) {
      CHECK_OK(
          devbuf_fault_adaptor_arm(faults, n, mode ? DEVBUF_FAULT_PERSISTENT : DEVBUF_FAULT_ONCE));
      file = (devbuf_tensor_file_t *)&file;
      CHECK_STATUS(devbuf_safetensors_load(device, path, &options, &file), DEVBUF_INJECTED_FAULT);
      CHECK(file == (devbuf_tensor_file_t *)&file);
      CHECK_EQ_U(stats_of(faults).active, 0);
    }
  }
  CHECK_OK(devbuf_fault_adaptor_arm(faults, 0, DEVBUF_FAULT_ONCE));
  CHECK_OK(devbuf_safetensors_load(device, path, &options, &file));
  CHECK_EQ_U(devbuf_tensor_file_count(file), count);
  devbuf_tensor_file_release(file);
  devbuf_device_t *other = NULL;
  devbuf_allocator_t *elsewhere = NULL;
  if (devbuf_device_open("cpu", &other) ==
      DEVBUF_OK) { // the same device: fine; a raw one of it too
    CHECK_OK(devbuf_device_raw_allocator(other, &elsewhere));
    options.allocator = elsewhere;
    CHECK_OK(devbuf_safetensors_load(device, path, &options, &file));
    devbuf_tensor_file_release(file);
    devbuf_allocator_release(elsewhere);
    devbuf_device_release(other);
  }
  devbuf_allocator_release(faults);
}

// An empty table is a valid file ("{}" padded), and so is metadata alone.
static void test_empty_files(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/empty.safetensors", scratch);
  CHECK_OK(devbuf_safetensors_write(path, NULL, 0, NULL, 0));
  devbuf_tensor_file_t *file = NULL;
  CHECK_OK(devbuf_safetensors_load(device, path, NULL, &file));
  CHECK_EQ_U(devbuf_tensor_file_count(file), 0);
  devbuf_tensor_file_release(file);
  devbuf_metadata_entry_t metadata[] = {{"only", "metadata"}};
  CHECK_OK(devbuf_safetensors_write(path, NULL, 0, metadata, 1));
  CHECK_OK(devbuf_safetensors_inspect(path, &file));
  CHECK(strcmp(devbuf_tensor_file_metadata_get(file, "only"), "metadata") == 0);
  devbuf_tensor_file_release(file);
  unlink(path);
}

int main(void) {
  test_require_data();
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) return 1;
  snprintf(scratch, sizeof scratch, "/tmp/devbuf-safetensors-XXXXXX");
  if (!mkdtemp(scratch)) return 1;
  RUN(test_shared_files);
  RUN(test_shared_file_contents);
  RUN(test_hostile_corpus);
  RUN(test_write_round_trip);
  RUN(test_load_copies);
  RUN(test_load_selected_in_one_allocation);
  RUN(test_six_bit_tensors_in_one_allocation);
  RUN(test_write_while_work_rewrites);
  RUN(test_write_errors_and_atomicity);
  RUN(test_empty_files);
  RUN(test_special_files);
  RUN(test_file_changed_under_load);
  RUN(test_load_with_faults);
  RUN(test_write_permissions_and_long_names);
  RUN(test_misaligned_tensors_and_named_errors);
  rmdir(scratch);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
