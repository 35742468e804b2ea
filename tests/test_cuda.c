// What only the CUDA backend does: device facts, the three memory kinds and their host
// access, 2 MiB granularity, kernels from the fatbin nvcc built, blocks past CUDA's or the
// kernel's limits refused at submission, a refused launch failing its queue. With
// `--expect-unavailable REASON`, it checks instead that cuda:0 answers UNAVAILABLE naming REASON
// (no driver; the toolkit's stub library).
#include "check.h"
#include "devbuf_cuda.h"
#include "../src/interop/dlpack_abi.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#ifdef DEVBUF_TEST_FATBIN
extern const unsigned char devbuf_test_fatbin[], devbuf_test_ptx[];
#endif

static devbuf_device_t *device;

// Internal (the tests link the library's objects): why devbuf's kernels are not loaded.
const char *devbuf__cuda_builtins_failure(devbuf_device_t *device);

static void test_device_facts(void) {
  devbuf_device_info_t info;
  CHECK_OK(devbuf_device_info(device, &info));
  CHECK(strstr(info.version, "CUDA") != NULL && info.global_memory > 0);
  CHECK(info.processor == DEVBUF_PROCESSOR_GPU);
  CHECK_EQ_U(devbuf_device_page_size(device), 2u << 20);
  CHECK(devbuf_device_kind_of(device) == DEVBUF_DEVICE_CUDA);
}

static void test_memory_kinds(void) {
  devbuf_memory_kind kinds[3] = {DEVBUF_MEMORY_DEVICE, DEVBUF_MEMORY_HOST_VISIBLE,
                                 DEVBUF_MEMORY_MANAGED};
  for (int k = 0; k < 3; k++) {
    devbuf_allocator_t *allocator = devbuf_device_allocator_for(device, kinds[k]);
    CHECK(allocator != NULL);
    if (!allocator) continue;
    size_t size = 1000;
    devbuf_buffer_t *buffer = NULL;
    CHECK_OK(
        devbuf_buffer_allocate(allocator, DEVBUF_INT32, &size, 1, DEVBUF_BUFFER_ZERO, &buffer));
    int32_t values[1000], back[1000];
    for (int i = 0; i < 1000; i++) values[i] = i * 3;
    CHECK_OK(devbuf_buffer_copyin(buffer, values, sizeof values));
    CHECK_OK(devbuf_buffer_copyout(buffer, back, sizeof back));
    CHECK(memcmp(values, back, sizeof back) == 0);
    const void *data;
    devbuf_status expected =
        kinds[k] == DEVBUF_MEMORY_DEVICE ? DEVBUF_NOT_CPU_ACCESSIBLE : DEVBUF_OK;
    CHECK_STATUS(devbuf_buffer_contents(buffer, &data, NULL), expected);
    if (expected == DEVBUF_OK) {
      CHECK(((const int32_t *)data)[999] == 2997);
      devbuf_buffer_end_access(buffer, data);
    }
    devbuf_buffer_release(buffer);
  }
}

// DLPack exports say which CUDA memory they carry: kDLCUDA for device memory, kDLCUDAHost
// for pinned host memory and kDLCUDAManaged for managed memory, at the address devbuf
// hands out, which the CPU reads for the last two. Imported back, pinned memory is the
// CPU's and managed memory cuda:0's, over the same bytes.
static void test_dlpack_device_types(void) {
  static const struct {
    devbuf_memory_kind kind;
    int32_t type;
    const char *import_spec;
  } cases[3] = {{DEVBUF_MEMORY_DEVICE, DEVBUF_DL_CUDA, "cuda:0"},
                {DEVBUF_MEMORY_HOST_VISIBLE, DEVBUF_DL_CUDA_HOST, "cpu"},
                {DEVBUF_MEMORY_MANAGED, DEVBUF_DL_CUDA_MANAGED, "cuda:0"}};
  for (int k = 0; k < 3; k++) {
    size_t size = 1000;
    devbuf_buffer_t *buffer = NULL, *imported = NULL;
    CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator_for(device, cases[k].kind),
                                    DEVBUF_INT32, &size, 1, 0, &buffer));
    if (!buffer) continue;
    int32_t values[1000], back[1000];
    for (int i = 0; i < 1000; i++) values[i] = i * 7 + k;
    CHECK_OK(devbuf_buffer_copyin(buffer, values, sizeof values));
    DLManagedTensorVersioned *tensor = NULL;
    CHECK_OK(devbuf_buffer_to_dlpack_versioned(buffer, 0, &tensor));
    if (!tensor) {
      devbuf_buffer_release(buffer);
      continue;
    }
    const DLTensor *t = &tensor->dl_tensor;
    CHECK_EQ_U(t->device.device_type, cases[k].type);
    CHECK_EQ_U(t->device.device_id, 0);
    uint64_t address = 0;
    CHECK_OK(devbuf_buffer_device_ptr(buffer, &address));
    const int32_t *data = (const int32_t *)((const char *)t->data + t->byte_offset);
    CHECK((uintptr_t)data == address);
    if (cases[k].type != DEVBUF_DL_CUDA) // memory the CPU addresses: the consumer reads it
      CHECK(memcmp(data, values, sizeof values) == 0);
    CHECK_OK(devbuf_buffer_from_dlpack_versioned(tensor, &imported));
    if (imported) {
      CHECK(strcmp(devbuf_device_spec(devbuf_buffer_device(imported)), cases[k].import_spec) == 0);
      CHECK_OK(devbuf_buffer_copyout(imported, back, sizeof back));
      CHECK(memcmp(back, values, sizeof back) == 0);
      devbuf_buffer_release(imported); // the export's deleter: its access ends
    }
    CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 0);
    // For consumers that take kDLCUDA alone (PyTorch): the same address as device memory.
    CHECK_OK(devbuf_buffer_to_dlpack_versioned(buffer, DEVBUF_DLPACK_AS_DEVICE, &tensor));
    if (tensor) {
      CHECK_EQ_U(tensor->dl_tensor.device.device_type, DEVBUF_DL_CUDA);
      CHECK((uintptr_t)tensor->dl_tensor.data + tensor->dl_tensor.byte_offset == address);
      tensor->deleter(tensor);
    }
    CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 0);
    devbuf_buffer_release(buffer);
  }
}

// Blocks round to 512 bytes; segments above 10 MiB to 2 MiB pages: 12 MiB + 1 takes a
// 14 MiB segment, whose rest a 1.5 MiB request then reuses.
static void test_granularity(void) {
  devbuf_allocator_t *allocator = devbuf_device_allocator(device);
  devbuf_allocator_clear_cache(allocator);
  devbuf_allocator_stats_t before = stats_of(allocator);
  size_t size = (12u << 20) + 1;
  devbuf_buffer_t *buffer = NULL, *second = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &buffer));
  CHECK_EQ_U(stats_of(allocator).active - before.active, (12u << 20) + 512);
  CHECK_EQ_U(stats_of(allocator).reserved - before.reserved, 14u << 20);
  size = (3u << 20) / 2;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &second));
  CHECK_EQ_U(stats_of(allocator).system_allocs, before.system_allocs + 1);
  devbuf_buffer_release(second);
  devbuf_buffer_release(buffer);
  size = 13u << 20; // the whole segment again, coalesced
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &buffer));
  CHECK_EQ_U(stats_of(allocator).system_allocs, before.system_allocs + 1);
  devbuf_buffer_release(buffer);
}

static void test_kernels(void) {
#ifndef DEVBUF_TEST_FATBIN
  printf("     (kernels skipped: this build had no nvcc)\n");
#else
  devbuf_program_t *program = NULL;
  CHECK_OK(devbuf_program_build(device, (const char *)devbuf_test_fatbin, NULL, &program));
  if (!program) return;
  enum { N = 4096 };
  size_t shape = N;
  devbuf_allocator_t *allocator = devbuf_device_allocator(device);
  devbuf_buffer_t *in = NULL, *out = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &shape, 1, 0, &in));
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &shape, 1, DEVBUF_BUFFER_ZERO, &out));
  static float values[N], back[N];
  for (int i = 0; i < N; i++) values[i] = (float)i;
  CHECK_OK(devbuf_buffer_copyin(in, values, sizeof values));
  devbuf_buffer_t *in_half, *out_half; // views at 256-byte multiples
  CHECK_OK(devbuf_buffer_view(in, N / 2 * sizeof(float), N / 2 * sizeof(float), &in_half));
  CHECK_OK(devbuf_buffer_view(out, N / 2 * sizeof(float), N / 2 * sizeof(float), &out_half));
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  float factor = 2.0f;
  unsigned long long n = N / 2;
  devbuf_use_t uses[2] = {{out_half, DEVBUF_ACCESS_WRITE}, {in_half, DEVBUF_ACCESS_READ}};
  devbuf_arg_t args[2] = {{&factor, sizeof factor}, {&n, sizeof n}};
  devbuf_launch_t launch = {1, {N / 2, 1, 1}, {0, 0, 0}};
  CHECK_OK(devbuf_queue_launch(queue, program, "scale", &launch, uses, 2, args, 2));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_OK(devbuf_buffer_copyout(out, back, sizeof back));
  size_t wrong = 0;
  for (int i = 0; i < N; i++) wrong += back[i] != (i < N / 2 ? 0.0f : 2.0f * (float)i);
  CHECK_EQ_U(wrong, 0);
  CHECK_STATUS(devbuf_queue_launch(queue, program, "absent", &launch, uses, 2, args, 2),
               DEVBUF_NOT_FOUND);
  // A scalar of another size than the kernel's parameter (4 bytes for its 8-byte count: the
  // driver would read 4 more) fails the launch's queue, naming both sizes.
  devbuf_queue_t *sized = NULL;
  CHECK_OK(devbuf_queue_create(device, &sized));
  unsigned n32 = N / 2;
  devbuf_arg_t short_args[2] = {{&factor, sizeof factor}, {&n32, sizeof n32}};
  CHECK_OK(devbuf_queue_launch(sized, program, "scale", &launch, uses, 2, short_args, 2));
  CHECK_STATUS(devbuf_queue_finish(sized), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("takes 8 bytes as argument 3; the launch gives 4 (scalar 1)");
  devbuf_queue_release(sized);
  // A launch no GPU can run (a block of 2^20 threads) is refused at submission, naming the
  // sizes, and the queue goes on.
  devbuf_launch_t huge = {1, {1u << 20, 1, 1}, {1u << 20, 0, 0}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "scale", &huge, uses, 2, args, 2),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("1048576 threads");
  CHECK_OK(devbuf_queue_finish(queue));
  devbuf_queue_release(queue);
  devbuf_buffer_release(in_half);
  devbuf_buffer_release(out_half);
  devbuf_buffer_release(in);
  devbuf_buffer_release(out);
  devbuf_program_release(program);
#endif
}

// Fills of every pattern width: the driver's memsets (1, 2, 4 bytes), devbuf's fill kernel
// (other widths up to 64 bytes) and host staging (wider), on a view at an odd offset.
static void test_fill_patterns(void) {
  size_t widths[] = {1, 2, 3, 4, 8, 12, 16, 64, 96};
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
    size_t width = widths[w], count = 100 * width + 7 * width, size = count + 1;
    devbuf_buffer_t *buffer = NULL, *view = NULL;
    CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1,
                                    DEVBUF_BUFFER_ZERO, &buffer));
    CHECK_OK(devbuf_buffer_view(buffer, 1, count, &view));
    unsigned char pattern[96], back[1 + 107 * 96];
    for (size_t i = 0; i < width; i++) pattern[i] = (unsigned char)(w * 31 + i + 1);
    CHECK_OK(devbuf_queue_fill(queue, view, pattern, width));
    CHECK_OK(devbuf_queue_finish(queue));
    CHECK_OK(devbuf_buffer_copyout(buffer, back, size));
    size_t wrong = back[0] != 0;
    for (size_t i = 0; i < count; i++) wrong += back[1 + i] != pattern[i % width];
    if (wrong) printf("     a %zu-byte pattern: %zu wrong bytes\n", width, wrong);
    CHECK_EQ_U(wrong, 0);
    devbuf_buffer_release(view);
    devbuf_buffer_release(buffer);
  }
  devbuf_queue_release(queue);
#ifdef DEVBUF_TEST_BUILTINS
  // Built with nvcc: the 3- and 12-byte patterns ran devbuf's fill kernel, not the host
  // staging that stands in where the driver refuses it (the bytes alone cannot tell).
  const char *failure = devbuf__cuda_builtins_failure(device);
  if (failure) printf("     devbuf's CUDA kernels did not load: %s\n", failure);
  CHECK(failure == NULL);
#endif
}

// What the device cannot do in one call goes through the host a piece at a time, not the
// whole range at once: an overlapping copy of 20 MiB (the driver promises no memmove), both
// ways, and a fill of 3 MiB with a 96-byte pattern (longer than devbuf's kernel takes).
static _Atomic size_t largest_host_allocation;

static void note_size(size_t size) {
  size_t seen = largest_host_allocation;
  while (size > seen && !atomic_compare_exchange_weak(&largest_host_allocation, &seen, size)) {
  }
}
static void *counting_malloc(void *ctx, size_t size) {
  (void)ctx;
  note_size(size);
  return malloc(size);
}
static void *counting_calloc(void *ctx, size_t count, size_t size) {
  (void)ctx;
  note_size(count * size);
  return calloc(count, size);
}
static void *counting_realloc(void *ctx, void *pointer, size_t size) {
  (void)ctx;
  note_size(size);
  return realloc(pointer, size);
}
static void plain_free(void *ctx, void *pointer) { (void)ctx, free(pointer); }

static void test_staged_pieces(void) {
  size_t size = 20u << 20, shift = (3u << 20) + 5;
  unsigned char *expect = malloc(size), *back = malloc(size);
  devbuf_buffer_t *buffer = NULL, *low = NULL, *high = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &buffer));
  for (size_t i = 0; i < size; i++) expect[i] = (unsigned char)(i * 13 + (i >> 16));
  CHECK_OK(devbuf_buffer_copyin(buffer, expect, size));
  CHECK_OK(devbuf_buffer_view(buffer, 0, size - shift, &low));
  CHECK_OK(devbuf_buffer_view(buffer, shift, size - shift, &high));
  // No other thread is in devbuf here (no queue): the hooks may change.
  devbuf_host_memory_hooks_t counting = {counting_malloc, counting_calloc, counting_realloc,
                                         plain_free, NULL};
  CHECK_OK(devbuf_set_host_memory_hooks(&counting));
  CHECK_OK(devbuf_buffer_copy_from(high, low)); // moving up: back to front
  memmove(expect + shift, expect, size - shift);
  CHECK_OK(devbuf_buffer_copyout(buffer, back, size));
  CHECK(memcmp(back, expect, size) == 0);
  CHECK_OK(devbuf_buffer_copy_from(low, high)); // moving down: front to back
  CHECK_OK(devbuf_set_host_memory_hooks(NULL));
  CHECK(largest_host_allocation <= (8u << 20)); // a piece, not the 17 MiB moved
  memmove(expect, expect + shift, size - shift);
  CHECK_OK(devbuf_buffer_copyout(buffer, back, size));
  CHECK(memcmp(back, expect, size) == 0);
  devbuf_buffer_release(high);
  devbuf_buffer_release(low);
  unsigned char pattern[96];
  for (size_t i = 0; i < sizeof pattern; i++) pattern[i] = (unsigned char)(200 - i);
  size_t count = (3u << 20) / sizeof pattern * sizeof pattern;
  devbuf_buffer_t *view = NULL;
  CHECK_OK(devbuf_buffer_view(buffer, 7, count, &view));
  // Counted from before the queue's worker starts until after it has gone.
  largest_host_allocation = 0;
  CHECK_OK(devbuf_set_host_memory_hooks(&counting));
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_fill(queue, view, pattern, sizeof pattern));
  CHECK_OK(devbuf_queue_finish(queue));
  devbuf_queue_release(queue);
  CHECK_OK(devbuf_set_host_memory_hooks(NULL));
  CHECK(largest_host_allocation <= (64u << 10)); // a stretch, not the 3 MiB filled
  for (size_t i = 0; i < count; i++) expect[7 + i] = pattern[i % sizeof pattern];
  CHECK_OK(devbuf_buffer_copyout(buffer, back, size));
  CHECK(memcmp(back, expect, size) == 0);
  devbuf_buffer_release(view);
  devbuf_buffer_release(buffer);
  free(back);
  free(expect);
}

// Large copies from and to pageable memory go through the pinned staging pair in 8 MiB
// pieces: an odd size over several pieces, into and out of a view at an offset.
static void test_staged_copies(void) {
  size_t size = (20u << 20) + 13, total = size + 256;
  unsigned char *in = malloc(size), *out = malloc(size);
  devbuf_buffer_t *buffer = NULL, *view = NULL;
  CHECK(in && out);
  if (!in || !out) goto done;
  for (size_t i = 0; i < size; i++) in[i] = (unsigned char)(i * 7 + i / 4096);
  CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &total, 1,
                                  DEVBUF_BUFFER_ZERO, &buffer));
  CHECK_OK(devbuf_buffer_view(buffer, 256, size, &view));
  if (!view) goto done;
  CHECK_OK(devbuf_buffer_copyin(view, in, size));
  memset(out, 0, size);
  CHECK_OK(devbuf_buffer_copyout(view, out, size));
  CHECK(memcmp(in, out, size) == 0);
  devbuf_buffer_t *head_view = NULL; // the bytes before the view stay untouched
  unsigned char head[256];
  CHECK_OK(devbuf_buffer_view(buffer, 0, sizeof head, &head_view));
  CHECK_OK(devbuf_buffer_copyout(head_view, head, sizeof head));
  devbuf_buffer_release(head_view);
  size_t nonzero = 0;
  for (size_t i = 0; i < sizeof head; i++) nonzero += head[i] != 0;
  CHECK_EQ_U(nonzero, 0);
done:
  devbuf_buffer_release(view);
  devbuf_buffer_release(buffer);
  free(in);
  free(out);
}

// A weight file written from device buffers and loaded back onto the device (read from the
// file into pinned staging, then copied to the device).
static void test_weight_file_round_trip(void) {
  size_t big_count = (3u << 20) + 5, small_count = 1000;
  float *big = malloc(big_count * sizeof *big);
  int8_t small[1000];
  CHECK(big != NULL);
  if (!big) return;
  for (size_t i = 0; i < big_count; i++) big[i] = (float)i * 0.5f;
  for (size_t i = 0; i < small_count; i++) small[i] = (int8_t)(i % 251);
  devbuf_allocator_t *allocator = devbuf_device_allocator(device);
  devbuf_buffer_t *buffers[2] = {NULL, NULL};
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &big_count, 1, 0, &buffers[0]));
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_INT8, &small_count, 1, 0, &buffers[1]));
  CHECK_OK(devbuf_buffer_copyin(buffers[0], big, big_count * sizeof *big));
  CHECK_OK(devbuf_buffer_copyin(buffers[1], small, sizeof small));
  char path[64];
  snprintf(path, sizeof path, "/tmp/devbuf-test-cuda-%d.safetensors", (int)getpid());
  devbuf_named_buffer_t tensors[2] = {{"big", buffers[0]}, {"small", buffers[1]}};
  CHECK_OK(devbuf_safetensors_write(path, tensors, 2, NULL, 0));
  {
    devbuf_tensor_file_t *file = NULL;
    CHECK_OK(devbuf_safetensors_load(device, path, NULL, &file));
    CHECK(file && devbuf_tensor_file_count(file) == 2);
    for (size_t i = 0; file && i < devbuf_tensor_file_count(file); i++) {
      devbuf_tensor_info_t info;
      devbuf_tensor_file_info(file, i, &info);
      devbuf_buffer_t *buffer = devbuf_tensor_file_buffer(file, i);
      CHECK(devbuf_buffer_device(buffer) == device && !devbuf_buffer_is_cpu_accessible(buffer));
      bool is_big = strcmp(info.name, "big") == 0;
      size_t bytes = is_big ? big_count * sizeof *big : sizeof small;
      CHECK_EQ_U(devbuf_buffer_size(buffer), bytes);
      unsigned char *back = malloc(bytes);
      CHECK_OK(devbuf_buffer_copyout(buffer, back, bytes));
      if (memcmp(back, is_big ? (const void *)big : (const void *)small, bytes) != 0)
        printf("     tensor '%s' differs\n", info.name);
      CHECK(memcmp(back, is_big ? (const void *)big : (const void *)small, bytes) == 0);
      free(back);
    }
    devbuf_tensor_file_release(file);
  }
  remove(path);
  devbuf_buffer_release(buffers[0]);
  devbuf_buffer_release(buffers[1]);
  free(big);
}

// Copies between backends: a CPU buffer to cuda:0, on to opencl:0 where there is one (both
// sides device memory: through a host bounce buffer), and back to the CPU.
static void test_copies_across_backends(void) {
  size_t size = (3u << 20) + 5;
  devbuf_device_t *cpu = NULL, *opencl = NULL;
  CHECK_OK(devbuf_device_open("cpu", &cpu));
  if (devbuf_device_open("opencl:0", &opencl) != DEVBUF_OK) {
    printf("     (no opencl:0 here: cuda:0 and the CPU only)\n");
    opencl = NULL;
  }
  devbuf_buffer_t *source = NULL, *on_cuda = NULL, *on_opencl = NULL, *back = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_UINT8, &size, 1, 0, &source));
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &on_cuda));
  CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_UINT8, &size, 1,
                                  DEVBUF_BUFFER_ZERO, &back));
  if (opencl)
    CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(opencl), DEVBUF_UINT8, &size, 1, 0,
                                    &on_opencl));
  void *data = NULL;
  CHECK_OK(devbuf_buffer_contents_mut(source, &data, NULL));
  if (data) {
    for (size_t i = 0; i < size; i++) ((unsigned char *)data)[i] = (unsigned char)(i % 253);
    devbuf_buffer_end_access(source, data);
  }
  CHECK_OK(devbuf_buffer_copy_from(on_cuda, source));
  if (on_opencl) {
    CHECK_OK(devbuf_buffer_copy_from(on_opencl, on_cuda));
    CHECK_OK(devbuf_buffer_copy_from(back, on_opencl));
  } else {
    CHECK_OK(devbuf_buffer_copy_from(back, on_cuda));
  }
  const void *a = NULL, *b = NULL;
  CHECK_OK(devbuf_buffer_contents(source, &a, NULL));
  CHECK_OK(devbuf_buffer_contents(back, &b, NULL));
  CHECK(a && b && memcmp(a, b, size) == 0);
  if (a) devbuf_buffer_end_access(source, a);
  if (b) devbuf_buffer_end_access(back, b);
  devbuf_buffer_release(source);
  devbuf_buffer_release(on_cuda);
  devbuf_buffer_release(on_opencl);
  devbuf_buffer_release(back);
  devbuf_device_release(opencl);
  devbuf_device_release(cpu);
}

// A caching allocator over device memory with an 8 MiB limit: within it memory is reused,
// past it OUT_OF_MEMORY names the limit; the driver never sees the refused request.
static void test_memory_limit(void) {
  devbuf_allocator_t *raw = NULL, *limited = NULL;
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  devbuf_caching_options_t options = {.memory_limit = 8u << 20};
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &limited));
  devbuf_allocator_release(raw);
  if (!limited) return;
  size_t six = 6u << 20, four = 4u << 20;
  devbuf_buffer_t *first = NULL, *second = NULL;
  CHECK_OK(devbuf_buffer_allocate(limited, DEVBUF_UINT8, &six, 1, 0, &first));
  CHECK_STATUS(devbuf_buffer_allocate(limited, DEVBUF_UINT8, &four, 1, 0, &second),
               DEVBUF_OUT_OF_MEMORY);
  CHECK(strstr(devbuf_last_error(), "limit") != NULL);
  CHECK(second == NULL);
  devbuf_buffer_release(first);
  CHECK_OK(
      devbuf_buffer_allocate(limited, DEVBUF_UINT8, &four, 1, 0, &second)); // the cache makes room
  devbuf_buffer_release(second);
  devbuf_allocator_release(limited);
}

// Growable segments on the driver's virtual memory management: a pool is one segment that
// maps 2 MiB pages as it grows; a block may span two mappings; clear_cache unmaps them.
static void test_growable_segments(void) {
  devbuf_allocator_t *raw = NULL, *growable = NULL;
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  // A page the device cannot map in (4 KiB, where CUDA maps 2 MiB) is refused at once, not
  // at every map; so is turning growable on later over such a page.
  devbuf_caching_options_t small_pages = {.page_size = 4096, .growable = 1};
  devbuf_allocator_t *refused = NULL, *plain = NULL;
  CHECK_STATUS(devbuf_caching_allocator_create(raw, &small_pages, &refused),
               DEVBUF_INVALID_ARGUMENT);
  CHECK(refused == NULL && strstr(devbuf_last_error(), "multiples of 2097152 bytes"));
  small_pages.growable = 0;
  CHECK_OK(devbuf_caching_allocator_create(raw, &small_pages, &plain));
  small_pages.growable = 1;
  CHECK_STATUS(devbuf_caching_allocator_configure(plain, &small_pages), DEVBUF_INVALID_ARGUMENT);
  devbuf_allocator_release(plain);
  devbuf_caching_options_t options = {.growable = 1};
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &growable));
  devbuf_allocator_release(raw);
  size_t three = 3u << 20, five = 5u << 20;
  devbuf_buffer_t *a = NULL, *b = NULL;
  CHECK_OK(devbuf_buffer_allocate(growable, DEVBUF_UINT8, &three, 1, 0, &a));
  CHECK_OK(devbuf_buffer_allocate(growable, DEVBUF_UINT8, &five, 1, 0, &b)); // over the 4 MiB line
  devbuf_allocator_stats_t s = stats_of(growable);
  CHECK_EQ_U(s.reserved, 8u << 20);
  CHECK_EQ_U(s.system_allocs, 2);
  uint64_t a_address = 0, b_address = 0;
  CHECK_OK(devbuf_buffer_device_ptr(a, &a_address));
  CHECK_OK(devbuf_buffer_device_ptr(b, &b_address));
  CHECK(b_address == a_address + three);
  unsigned char *pattern = malloc(five), *back = malloc(five);
  for (size_t i = 0; i < five; i++) pattern[i] = (unsigned char)(i * 7 + (i >> 12));
  CHECK_OK(devbuf_buffer_copyin(b, pattern, five));
  CHECK_OK(devbuf_buffer_copyout(b, back, five));
  CHECK(memcmp(pattern, back, five) == 0);
  free(pattern);
  free(back);
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
  devbuf_allocator_clear_cache(growable); // both mappings' pages go in one call
  s = stats_of(growable);
  CHECK_EQ_U(s.reserved, 0);
  CHECK_EQ_U(s.system_frees, 1);
  devbuf_allocator_release(growable);
}

// A page in the middle of one mapping goes back alone (each page is its own physical
// allocation), and the pages beside it keep their bytes; mapped again, it serves anew.
static void test_growable_partial_unmap(void) {
  devbuf_allocator_t *raw = NULL, *growable = NULL;
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  devbuf_caching_options_t options = {.growable = 1};
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &growable));
  size_t mib = 1u << 20, a_size = 3 * mib / 2, b_size = 3 * mib, again_size = 2 * mib;
  devbuf_buffer_t *a = NULL, *b = NULL, *c = NULL, *again = NULL;
  // All from the large pool's segment: a maps [0, 2) MiB, b [2, 6) in one call, c none.
  CHECK_OK(devbuf_buffer_allocate(growable, DEVBUF_UINT8, &a_size, 1, 0, &a));
  CHECK_OK(devbuf_buffer_allocate(growable, DEVBUF_UINT8, &b_size, 1, 0, &b));
  CHECK_OK(devbuf_buffer_allocate(growable, DEVBUF_UINT8, &a_size, 1, 0, &c));
  CHECK_EQ_U(stats_of(growable).reserved, 6 * mib);
  CHECK_EQ_U(stats_of(growable).system_allocs, 2);
  unsigned char *pattern = malloc(again_size), *back = malloc(again_size);
  for (size_t i = 0; i < again_size; i++) pattern[i] = (unsigned char)(i * 13 + (i >> 11));
  CHECK_OK(devbuf_buffer_copyin(c, pattern, a_size));
  devbuf_buffer_release(b);
  options.memory_limit = 5 * mib; // b's one whole page, [2, 4) MiB, goes back
  CHECK_OK(devbuf_caching_allocator_set_options(growable, &options));
  CHECK_EQ_U(stats_of(growable).reserved, 4 * mib);
  CHECK_EQ_U(stats_of(growable).system_frees, 1);
  CHECK_OK(devbuf_buffer_copyout(c, back, a_size)); // in [4, 6) MiB, mapped with that page
  CHECK(memcmp(pattern, back, a_size) == 0);
  options.memory_limit = 0;
  CHECK_OK(devbuf_caching_allocator_set_options(growable, &options));
  CHECK_OK(devbuf_buffer_allocate(growable, DEVBUF_UINT8, &again_size, 1, 0, &again));
  CHECK_EQ_U(stats_of(growable).reserved, 6 * mib); // the page mapped anew
  CHECK_OK(devbuf_buffer_copyin(again, pattern, again_size));
  CHECK_OK(devbuf_buffer_copyout(again, back, again_size));
  CHECK(memcmp(pattern, back, again_size) == 0);
  free(pattern);
  free(back);
  devbuf_buffer_release(a);
  devbuf_buffer_release(c);
  devbuf_buffer_release(again);
  devbuf_allocator_release(growable);
  devbuf_allocator_release(raw);
}

// How many of the first `size` bytes of `buffer` are not `value` (all of them if it cannot be
// read).
static size_t bytes_not(devbuf_buffer_t *buffer, size_t size, unsigned char value) {
  unsigned char *back = malloc(size);
  size_t wrong = size;
  if (back && devbuf_buffer_copyout(buffer, back, size) == DEVBUF_OK)
    for (size_t i = wrong = 0; i < size; i++) wrong += back[i] != value;
  free(back);
  return wrong;
}

// Memory released while work on stream 1 still writes it, reused at once by work on
// stream 2: the device address is the same, and stream 2's fill waits for stream 1's
// (held back by an event), so the last value is stream 2's.
static void test_stream_aware_reuse(void) {
  devbuf_allocator_t *allocator =
      own_caching_allocator(device); // which block a request gets is known
  devbuf_queue_t *first, *second;
  CHECK_OK(devbuf_queue_create(device, &first));
  CHECK_OK(devbuf_queue_create(device, &second));
  devbuf_event_t *go;
  CHECK_OK(devbuf_event_create(0, &go));
  size_t size = 1u << 20;
  devbuf_buffer_t *old = NULL, *reused = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &old));
  uint64_t old_address = 0, reused_address = 0;
  CHECK_OK(devbuf_buffer_device_ptr(old, &old_address));
  unsigned char one = 1, two = 2;
  CHECK_OK(devbuf_queue_wait(first, go, 1));
  CHECK_OK(devbuf_queue_fill(first, old, &one, 1));
  devbuf_buffer_release(old); // its fill is still held back
  CHECK_OK(devbuf_buffer_new(allocator, DEVBUF_UINT8, &size, 1, 0,
                             &reused));                 // memory comes with its first use
  CHECK_OK(devbuf_queue_fill(second, reused, &two, 1)); // takes the old memory, after the old fill
  CHECK_OK(devbuf_buffer_device_ptr(reused, &reused_address));
  CHECK(reused_address == old_address);
  CHECK_OK(devbuf_event_signal(go, 1));
  CHECK_OK(devbuf_queue_finish(second));
  CHECK_EQ_U(bytes_not(reused, size, 2), 0);
  devbuf_buffer_release(reused);
  devbuf_event_release(go);
  devbuf_queue_release(first);
  devbuf_queue_release(second);
  devbuf_allocator_release(allocator);
}

// Work on one stream behind a run of work on another (fewer items than a queue enqueues at
// once): the dependency is usually enqueued and still running when the second queue takes
// its item, so the second stream waits for the first one's event on the device
// (cuStreamWaitEvent), else the worker waits on the host; the copy sees the last fill.
static void test_cross_stream_wait(void) {
  devbuf_allocator_t *allocator = devbuf_device_allocator(device);
  devbuf_queue_t *first, *second;
  CHECK_OK(devbuf_queue_create(device, &first));
  CHECK_OK(devbuf_queue_create(device, &second));
  size_t size = 1u << 16;
  devbuf_buffer_t *a = NULL, *b = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &a));
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &b));
  for (int i = 0; i < 40; i++) {
    unsigned char value = (unsigned char)i;
    CHECK_OK(devbuf_queue_fill(first, a, &value, 1));
  }
  CHECK_OK(devbuf_queue_copy(second, b, a));
  CHECK_OK(devbuf_queue_finish(second));
  CHECK_EQ_U(bytes_not(b, size, 39), 0);
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
  devbuf_queue_release(first);
  devbuf_queue_release(second);
}

// Pinned and managed memory are CPU-accessible, under B4: while device work writes a
// buffer, reading and writing it from the host are refused (IN_USE); the waiting forms wait.
static void test_host_access_under_work(void) {
  devbuf_memory_kind kinds[2] = {DEVBUF_MEMORY_HOST_VISIBLE, DEVBUF_MEMORY_MANAGED};
  for (int k = 0; k < 2; k++) {
    devbuf_allocator_t *allocator = devbuf_device_allocator_for(device, kinds[k]);
    if (!allocator) continue;
    devbuf_queue_t *queue;
    CHECK_OK(devbuf_queue_create(device, &queue));
    devbuf_event_t *go;
    CHECK_OK(devbuf_event_create(0, &go));
    size_t size = 4096;
    devbuf_buffer_t *buffer = NULL;
    CHECK_OK(
        devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, DEVBUF_BUFFER_ZERO, &buffer));
    unsigned char seven = 7;
    CHECK_OK(devbuf_queue_wait(queue, go, 1));
    CHECK_OK(devbuf_queue_fill(queue, buffer, &seven, 1));
    const void *data = NULL;
    void *mutable_data = NULL;
    CHECK_STATUS(devbuf_buffer_contents(buffer, &data, NULL), DEVBUF_IN_USE);
    CHECK_STATUS(devbuf_buffer_contents_mut(buffer, &mutable_data, NULL), DEVBUF_IN_USE);
    CHECK(devbuf_buffer_in_use(buffer));
    CHECK_OK(devbuf_event_signal(go, 1));
    CHECK_OK(devbuf_buffer_contents_wait(buffer, &data, NULL));
    if (data) {
      CHECK(((const unsigned char *)data)[0] == 7 && ((const unsigned char *)data)[4095] == 7);
      devbuf_buffer_end_access(buffer, data);
    }
    devbuf_buffer_release(buffer);
    devbuf_event_release(go);
    devbuf_queue_release(queue);
  }
}

// A user kernel loaded from PTX text (the driver compiles it for this GPU).
static void test_kernel_from_ptx(void) {
#ifndef DEVBUF_TEST_FATBIN
  printf("     (PTX skipped: this build had no nvcc)\n");
#else
  CHECK(strstr((const char *)devbuf_test_ptx, ".entry add_one") != NULL);
  devbuf_program_t *program = NULL;
  CHECK_OK(devbuf_program_build(device, (const char *)devbuf_test_ptx, NULL, &program));
  if (!program) return;
  enum { N = 3000 };
  size_t shape = N;
  devbuf_buffer_t *data = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_INT32, &shape, 1, 0, &data));
  static int32_t values[N];
  for (int i = 0; i < N; i++) values[i] = i;
  CHECK_OK(devbuf_buffer_copyin(data, values, sizeof values));
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  unsigned long long n = N;
  devbuf_use_t use = {data, DEVBUF_ACCESS_READ_WRITE};
  devbuf_arg_t arg = {&n, sizeof n};
  devbuf_launch_t launch = {1, {N, 1, 1}, {0, 0, 0}};
  CHECK_OK(devbuf_queue_launch(queue, program, "add_one", &launch, &use, 1, &arg, 1));
  CHECK_OK(devbuf_queue_launch(queue, program, "add_one", &launch, &use, 1, &arg, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_OK(devbuf_buffer_copyout(data, values, sizeof values));
  size_t wrong = 0;
  for (int i = 0; i < N; i++) wrong += values[i] != i + 2;
  CHECK_EQ_U(wrong, 0);
  devbuf_queue_release(queue);
  devbuf_buffer_release(data);
  devbuf_program_release(program);
#endif
}

// Blocks the driver would refuse at enqueue (failing the whole queue) are refused at
// submission, naming the block, its threads in all and the limit it passes: more than 1024
// threads, more than 64 along z, more than the kernel's own limit (add_one_bounded's
// __launch_bounds__(128)). 2-D and 3-D blocks within the limits run; where the local sizes
// are 0 a kernel of 128 threads gets blocks of 128, not 256.
static void test_launch_limits(void) {
#ifndef DEVBUF_TEST_FATBIN
  printf("     (launch limits skipped: this build had no nvcc)\n");
#else
  devbuf_program_t *program = NULL;
  CHECK_OK(devbuf_program_build(device, (const char *)devbuf_test_fatbin, NULL, &program));
  if (!program) return;
  enum { N = 3000 };
  size_t shape = N;
  devbuf_allocator_t *allocator = devbuf_device_allocator(device);
  devbuf_buffer_t *in = NULL, *out = NULL, *data = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &shape, 1, 0, &in));
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &shape, 1, 0, &out));
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_INT32, &shape, 1, DEVBUF_BUFFER_ZERO, &data));
  static float values[N], back[N];
  for (int i = 0; i < N; i++) values[i] = (float)i;
  CHECK_OK(devbuf_buffer_copyin(in, values, sizeof values));
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  float factor = 3.0f;
  unsigned long long n = N;
  devbuf_use_t uses[2] = {{out, DEVBUF_ACCESS_WRITE}, {in, DEVBUF_ACCESS_READ}};
  devbuf_arg_t args[2] = {{&factor, sizeof factor}, {&n, sizeof n}};
  // Within the limits: 2-D blocks of 8 x 4 x 1 and 3-D blocks of 8 x 2 x 64 (1024 in all).
  // scale indexes along x only, so the threads along y and z write the same values again.
  devbuf_launch_t flat = {2, {N, 4, 1}, {8, 4, 0}}, deep = {3, {N, 2, 64}, {8, 2, 64}};
  CHECK_OK(devbuf_queue_launch(queue, program, "scale", &flat, uses, 2, args, 2));
  CHECK_OK(devbuf_queue_launch(queue, program, "scale", &deep, uses, 2, args, 2));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_OK(devbuf_buffer_copyout(out, back, sizeof back));
  size_t wrong = 0;
  for (int i = 0; i < N; i++) wrong += back[i] != 3.0f * (float)i;
  CHECK_EQ_U(wrong, 0);
  // More than 1024 threads in a block, each dimension within its own limit.
  devbuf_launch_t wide = {2, {1024, 32, 1}, {64, 32, 0}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "scale", &wide, uses, 2, args, 2),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("kernel 'scale': a block of 64 x 32 x 1 threads (2048 in all), more than CUDA "
                "launches in a block: 1024");
  // More than 64 threads along z, 128 in all.
  devbuf_launch_t tall = {3, {N, 1, 128}, {1, 1, 128}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "scale", &tall, uses, 2, args, 2),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("a block of 1 x 1 x 128 threads (128 in all), more than CUDA launches along z: 64");
  // Blocks of 256 threads: add_one runs them, add_one_bounded takes at most 128.
  devbuf_use_t use = {data, DEVBUF_ACCESS_READ_WRITE};
  devbuf_arg_t count = {&n, sizeof n};
  devbuf_launch_t of_256 = {1, {2560, 1, 1}, {256, 0, 0}};
  CHECK_OK(devbuf_queue_launch(queue, program, "add_one", &of_256, &use, 1, &count, 1));
  CHECK_STATUS(devbuf_queue_launch(queue, program, "add_one_bounded", &of_256, &use, 1, &count, 1),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("kernel 'add_one_bounded': a block of 256 x 1 x 1 threads (256 in all), more "
                "than the kernel's limit (its registers or __launch_bounds__): 128");
  // Local sizes of 0: blocks of the kernel's 128 threads, 24 of them cover 3000 items.
  devbuf_launch_t chosen = {1, {N, 1, 1}, {0, 0, 0}};
  CHECK_OK(devbuf_queue_launch(queue, program, "add_one_bounded", &chosen, &use, 1, &count, 1));
  CHECK_OK(devbuf_queue_finish(queue)); // none of the refusals failed the queue
  static int32_t counts[N];
  CHECK_OK(devbuf_buffer_copyout(data, counts, sizeof counts));
  wrong = 0;
  for (int i = 0; i < N; i++) wrong += counts[i] != (i < 2560 ? 2 : 1);
  CHECK_EQ_U(wrong, 0);
  devbuf_queue_release(queue);
  devbuf_buffer_release(data);
  devbuf_buffer_release(in);
  devbuf_buffer_release(out);
  devbuf_program_release(program);
#endif
}

// PTX the compiler refuses: the error names the line, from the compiler's own log.
static void test_ptx_error_log(void) {
  static const char broken[] = ".version 7.0\n"
                               ".target sm_50\n"
                               ".address_size 64\n"
                               ".visible .entry broken()\n"
                               "{\n"
                               "  bogus.instruction;\n"
                               "  ret;\n"
                               "}\n";
  devbuf_program_t *program = NULL;
  CHECK_STATUS(devbuf_program_build(device, broken, NULL, &program), DEVBUF_DEVICE_FAILURE);
  CHECK(program == NULL);
  const char *error = devbuf_last_error();
  CHECK(strstr(error, "line 6") != NULL && strchr(error, '\n') == NULL);
  if (!strstr(error, "line 6")) printf("     the error: %s\n", error);
}

static void test_oversize(void) {
  devbuf_device_info_t info;
  devbuf_device_info(device, &info);
  size_t size = (size_t)info.global_memory * 2;
  devbuf_buffer_t *buffer = NULL;
  CHECK_STATUS(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &buffer),
      DEVBUF_OUT_OF_MEMORY);
  CHECK(buffer == NULL);
}

// A device fault fails the queue it ran on with the driver's cause, and what was queued
// behind it; the context is poisoned, so this runs alone (--fault), last in its process.
static void test_device_fault(void) {
#ifndef DEVBUF_TEST_FATBIN
  printf("     (fault skipped: this build had no nvcc)\n");
#else
  devbuf_program_t *program = NULL;
  CHECK_OK(devbuf_program_build(device, (const char *)devbuf_test_fatbin, NULL, &program));
  if (!program) return;
  size_t size = 4096;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &buffer));
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_event_t *after, *go; // go holds the queue until everything is submitted
  CHECK_OK(devbuf_event_create(0, &after));
  CHECK_OK(devbuf_event_create(0, &go));
  unsigned char one = 1;
  unsigned long long nowhere = 8;
  devbuf_arg_t arg = {&nowhere, sizeof nowhere};
  devbuf_launch_t launch = {1, {1, 1, 1}, {1, 0, 0}};
  CHECK_OK(devbuf_queue_wait(queue, go, 1));
  CHECK_OK(devbuf_queue_fill(queue, buffer, &one, 1));
  CHECK_OK(devbuf_queue_launch(queue, program, "fault", &launch, NULL, 0, &arg, 1));
  CHECK_OK(devbuf_queue_fill(queue, buffer, &one, 1));
  CHECK_OK(devbuf_queue_signal(queue, after, 1));
  CHECK_OK(devbuf_event_signal(go, 1));
  CHECK_STATUS(devbuf_event_wait(after, 1, 60000000000ull), DEVBUF_DEVICE_FAILURE);
  CHECK_STATUS(devbuf_queue_finish(queue), DEVBUF_DEVICE_FAILURE);
  CHECK(strstr(devbuf_last_error(), "CUDA_ERROR_ILLEGAL_ADDRESS") != NULL);
  CHECK_STATUS(devbuf_queue_fill(queue, buffer, &one, 1),
               DEVBUF_DEVICE_FAILURE); // refused with the cause
  CHECK(strstr(devbuf_last_error(), "CUDA_ERROR_ILLEGAL_ADDRESS") != NULL);
  devbuf_event_release(after);
  devbuf_event_release(go);
  devbuf_queue_release(queue);
  devbuf_buffer_release(buffer);
  devbuf_program_release(program);
#endif
}

// The handles of devbuf_cuda.h are the driver's own: the driver's functions take them, and
// work the caller enqueues on a queue's stream once the queue has finished sees what its
// work wrote.
static void test_native_handles(void) {
  devbuf_cuda_handles_t handles;
  CHECK_OK(devbuf_cuda_device_handles(device, &handles));
  CHECK(handles.context != NULL);
  int (*set_current)(void *);
  int (*copy_async)(unsigned long long, unsigned long long, size_t, void *);
  int (*synchronize)(void *);
  *(void **)&set_current = devbuf_cuda_entry_point("cuCtxSetCurrent");
  *(void **)&copy_async = devbuf_cuda_entry_point("cuMemcpyAsync");
  *(void **)&synchronize = devbuf_cuda_entry_point("cuStreamSynchronize");
  CHECK(set_current && copy_async && synchronize);
  CHECK(devbuf_cuda_entry_point("cuNoSuchFunction") == NULL &&
        devbuf_cuda_entry_point(NULL) == NULL);
  if (!set_current || !copy_async || !synchronize) return;
  CHECK(set_current(handles.context) == 0);
  devbuf_queue_t *queue = NULL, *other = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_queue_create(device, &other));
  void *stream = NULL, *other_stream = NULL;
  CHECK_OK(devbuf_cuda_queue_stream(queue, &stream));
  CHECK_OK(devbuf_cuda_queue_stream(other, &other_stream));
  CHECK(stream && other_stream && stream != other_stream);
  size_t size = 1 << 16;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT32, &size, 1, 0, &buffer));
  uint64_t address = 0;
  CHECK_OK(devbuf_buffer_device_ptr(buffer, &address));
  uint32_t pattern = 0x5eed5eedu, *back = calloc(size, sizeof *back);
  CHECK_OK(devbuf_queue_fill(queue, buffer, &pattern, sizeof pattern));
  // The worker enqueues on its own time: the order goes through the host.
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK(copy_async((unsigned long long)(uintptr_t)back, address, size * 4, stream) == 0);
  CHECK(synchronize(stream) == 0);
  size_t matching = 0;
  for (size_t i = 0; i < size; i++) matching += back[i] == pattern;
  CHECK_EQ_U(matching, size);
  free(back);
  devbuf_buffer_release(buffer);
  devbuf_device_t *cpu = NULL;
  CHECK_OK(devbuf_device_open("cpu", &cpu));
  CHECK_STATUS(devbuf_cuda_device_handles(cpu, &handles), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("cpu is not a CUDA device");
  CHECK_STATUS(devbuf_cuda_queue_stream(NULL, &stream), DEVBUF_INVALID_ARGUMENT);
  devbuf_device_release(cpu);
  devbuf_queue_release(other);
  devbuf_queue_release(queue);
}

// The driver library devbuf loaded (a handle the caller closes), as its loader names it.
static void *loaded_driver(void) {
  const char *path = getenv("DEVBUF_CUDA_LIBRARY");
  return dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
}

// The stand-in driver's handle when the tests run on it (NULL on a real driver).
static void *fake_driver(void) {
  void *driver = loaded_driver();
  if (driver && !dlsym(driver, "fake_cuda_foreign_context")) dlclose(driver), driver = NULL;
  return driver;
}

// A GPU whose driver has the virtual memory entry points but not the support (some virtual
// GPUs; the stand-in driver's FAKE_CUDA_NO_VMM): growable segments give way to plain ones
// instead of failing every map.
static void test_growable_without_vmm(void) {
  void *driver = fake_driver();
  if (!driver) {
    printf("     (skipped: needs the stand-in driver to take the support away)\n");
    return;
  }
  setenv("FAKE_CUDA_NO_VMM", "1", 1); // read when the device opens: no one else holds it
  devbuf_device_t *without = NULL;
  CHECK_OK(devbuf_device_open("cuda:0", &without));
  devbuf_allocator_t *raw = NULL, *growable = NULL;
  CHECK_OK(devbuf_device_raw_allocator(without, &raw));
  devbuf_caching_options_t options = {.growable = 1};
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &growable));
  devbuf_allocator_release(raw);
  size_t three = 3u << 20;
  devbuf_buffer_t *a = NULL;
  CHECK_OK(devbuf_buffer_allocate(growable, DEVBUF_UINT8, &three, 1, 0, &a));
  devbuf_allocator_stats_t s = stats_of(growable);
  CHECK_EQ_U(s.reserved, 20u << 20); // a plain 20 MiB segment, where growable maps 4 MiB
  CHECK_EQ_U(s.system_allocs, 1);
  devbuf_buffer_release(a);
  devbuf_allocator_release(growable);
  devbuf_device_release(without);
  unsetenv("FAKE_CUDA_NO_VMM");
  dlclose(driver);
}

// ---- the caller's current context ----------------------------------------------------------

typedef int (*context_get_fn)(void **);
typedef int (*context_set_fn)(void *);
static context_get_fn context_get;
static context_set_fn context_set;

// Every kind of call devbuf makes into the driver, from this thread: the device opened and
// closed (no other thread holds it), memory of each kind, copies, a queue with a copy and a
// fill, a growable segment mapped and unmapped.
static void use_the_device(void) {
  devbuf_device_t *other = NULL;
  CHECK_OK(devbuf_device_open("cuda:0", &other));
  devbuf_memory_kind kinds[3] = {DEVBUF_MEMORY_DEVICE, DEVBUF_MEMORY_HOST_VISIBLE,
                                 DEVBUF_MEMORY_MANAGED};
  for (int k = 0; k < 3; k++) {
    size_t size = 4096;
    devbuf_buffer_t *buffer = NULL, *copy = NULL;
    unsigned char bytes[4096], back[4096];
    memset(bytes, 7 + k, sizeof bytes);
    CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator_for(other, kinds[k]), DEVBUF_UINT8,
                                    &size, 1, DEVBUF_BUFFER_ZERO, &buffer));
    CHECK_OK(devbuf_buffer_copyin(buffer, bytes, sizeof bytes));
    CHECK_OK(
        devbuf_buffer_allocate(devbuf_device_allocator(other), DEVBUF_UINT8, &size, 1, 0, &copy));
    devbuf_queue_t *queue = NULL;
    CHECK_OK(devbuf_queue_create(other, &queue));
    CHECK_OK(devbuf_queue_copy(queue, copy, buffer));
    uint32_t pattern = 0x01020304u;
    CHECK_OK(devbuf_queue_fill(queue, buffer, &pattern, sizeof pattern));
    CHECK_OK(devbuf_queue_finish(queue));
    CHECK_OK(devbuf_buffer_copyout(copy, back, sizeof back));
    CHECK(memcmp(back, bytes, sizeof back) == 0);
    devbuf_queue_release(queue);
    devbuf_buffer_release(copy);
    devbuf_buffer_release(buffer);
  }
  devbuf_caching_options_t options = {.growable = 1};
  devbuf_allocator_t *raw = NULL, *growable = NULL;
  CHECK_OK(devbuf_device_raw_allocator(other, &raw));
  CHECK_OK(devbuf_caching_allocator_create(raw, &options, &growable));
  devbuf_allocator_release(raw);
  devbuf_memory_t memory;
  if (growable && devbuf_allocator_alloc(growable, 3u << 20, &memory) == DEVBUF_OK) {
    devbuf_allocator_free(growable, &memory);
    devbuf_allocator_clear_cache(growable);
  } else {
    CHECK(false);
  }
  devbuf_allocator_release(growable);
  devbuf_device_release(other);
}

static void *with_context(void *context) {
  if (context_set(context) != 0) return "cannot set the context";
  use_the_device();
  void *after = (void *)1;
  return context_get(&after) == 0 && after == context ? NULL : "devbuf changed the context";
}

// The CUDA runtime reads the thread's current context as its current device: devbuf puts
// back whatever was current (none, or a context of the program's own), on each thread.
static void test_caller_context_kept(void) {
  void *driver = loaded_driver();
  CHECK(driver != NULL);
  if (!driver) return;
  context_get = (context_get_fn)(uintptr_t)dlsym(driver, "cuCtxGetCurrent");
  context_set = (context_set_fn)(uintptr_t)dlsym(driver, "cuCtxSetCurrent");
  // The fake driver has a stand-in for a context of the program's own; the real one is
  // checked with none current.
  void *(*foreign)(void) = (void *(*)(void))(uintptr_t)dlsym(driver, "fake_cuda_foreign_context");
  void *contexts[2] = {NULL, foreign ? foreign() : NULL};
  for (int c = 0; c < (foreign ? 2 : 1); c++) {
    pthread_t thread;
    void *failure = "no thread";
    if (pthread_create(&thread, NULL, with_context, contexts[c]) == 0)
      pthread_join(thread, &failure);
    if (failure)
      printf("     with %s current: %s\n", c ? "another context" : "no context",
             (const char *)failure);
    CHECK(failure == NULL);
  }
  dlclose(driver);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--expect-unavailable") == 0)
    return check_expect_unavailable("cuda:0", argv[2]);
  bool fault = argc == 2 && strcmp(argv[1], "--fault") == 0;
  if (devbuf_device_open("cuda:0", &device) != DEVBUF_OK) {
    printf("SKIP: %s\n", devbuf_last_error());
    return SKIP_EXIT_CODE;
  }
  printf("on %s (%s)\n", devbuf_device_spec(device), devbuf_device_name(device));
  if (fault) {
    RUN(test_device_fault);
  } else {
    RUN(test_device_facts);
    RUN(test_memory_kinds);
    RUN(test_dlpack_device_types);
    RUN(test_granularity);
    RUN(test_kernels);
    RUN(test_kernel_from_ptx);
    RUN(test_launch_limits);
    RUN(test_ptx_error_log);
    RUN(test_fill_patterns);
    RUN(test_staged_copies);
    RUN(test_staged_pieces);
    RUN(test_weight_file_round_trip);
    RUN(test_copies_across_backends);
    RUN(test_memory_limit);
    RUN(test_growable_segments);
    RUN(test_growable_partial_unmap);
    RUN(test_stream_aware_reuse);
    RUN(test_cross_stream_wait);
    RUN(test_host_access_under_work);
    RUN(test_oversize);
    RUN(test_native_handles);
  }
  devbuf_device_release(device);
  if (!fault) { // last: each opens and closes the device itself
    RUN(test_growable_without_vmm);
    RUN(test_caller_context_kept);
  }
  return CHECK_EXIT();
}
