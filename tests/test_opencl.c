// What only the OpenCL backend does: device facts, the size limit of one allocation,
// programs (built once, the build log on failure), kernels over views, a refused launch
// failing its queue like a failing kernel. With `--expect-unavailable REASON`, it checks
// instead that opencl:0 answers UNAVAILABLE naming REASON (run with no ICD loader, or with
// an empty vendors folder).
#include "../src/interop/dlpack_abi.h"
#include "check.h"
#include "devbuf_opencl.h"

#include <stdint.h>
#include <unistd.h>

static devbuf_device_t *device;

static const char *source =
    "__kernel void scale(__global float *out, __global const float *in, float factor) {\n"
    "  size_t i = get_global_id(0);\n"
    "  out[i] = in[i] * factor;\n"
    "}\n"
    "__kernel void add_one(__global int *data) { data[get_global_id(0)] += 1; }\n"
    "__kernel void ignore(__global int *unused) { }\n";

static devbuf_status cpu_kernel(const devbuf_kernel_args_t *args) {
  (void)args;
  return DEVBUF_OK;
}

static void test_device_facts(void) {
  devbuf_device_info_t info;
  CHECK_OK(devbuf_device_info(device, &info));
  CHECK(strstr(info.version, "OpenCL") != NULL);
  CHECK(info.processor == DEVBUF_PROCESSOR_CPU || info.processor == DEVBUF_PROCESSOR_GPU ||
        info.processor == DEVBUF_PROCESSOR_ACCELERATOR);
  if (strstr(info.version, "PoCL")) CHECK(info.processor == DEVBUF_PROCESSOR_CPU); // its CPU device
  CHECK(info.global_memory > 0 && info.max_allocation > 0 &&
        info.max_allocation <= info.global_memory);
  CHECK(info.alignment >= 1 && (info.alignment & (info.alignment - 1)) == 0);
  CHECK(devbuf_device_kind_of(device) == DEVBUF_DEVICE_OPENCL);
  CHECK(devbuf_device_allocator_for(device, DEVBUF_MEMORY_HOST_VISIBLE) !=
        devbuf_device_allocator(device));
}

static void test_oversize_allocation(void) {
  devbuf_device_info_t info;
  devbuf_device_info(device, &info);
  size_t size = (size_t)info.max_allocation + 4096;
  devbuf_buffer_t *buffer = NULL;
  CHECK_STATUS(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &buffer),
      DEVBUF_OUT_OF_MEMORY);
  char expected[64];
  snprintf(expected, sizeof expected, "at most %llu bytes",
           (unsigned long long)info.max_allocation);
  CHECK_MESSAGE(expected);
  CHECK(buffer == NULL);
}

static void test_device_memory_is_not_host_memory(void) {
  size_t size = 64;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_FLOAT32, &size, 1, 0,
                                  &buffer));
  const void *data;
  void *writable;
  CHECK_STATUS(devbuf_buffer_contents(buffer, &data, NULL), DEVBUF_NOT_CPU_ACCESSIBLE);
  CHECK_MESSAGE("opencl:0");
  CHECK_STATUS(devbuf_buffer_contents_mut(buffer, &writable, NULL), DEVBUF_NOT_CPU_ACCESSIBLE);
  devbuf_array_t array;
  CHECK_STATUS(devbuf_buffer_as_array(buffer, DEVBUF_FLOAT32, &array), DEVBUF_NOT_CPU_ACCESSIBLE);
  CHECK_STATUS(devbuf_buffer_unsynchronized_ptr(buffer, &writable, NULL),
               DEVBUF_NOT_CPU_ACCESSIBLE);
  devbuf_buffer_release(buffer);
}

static void test_programs_and_kernels(void) {
  devbuf_program_t *program = NULL, *again = NULL;
  CHECK_OK(devbuf_program_build(device, source, NULL, &program));
  CHECK_OK(devbuf_program_build(device, source, NULL, &again)); // from the cache
  if (!program || !again) return;
  enum { N = 1024 };
  size_t shape = 2 * N;
  devbuf_buffer_t *in = NULL, *out = NULL;
  devbuf_allocator_t *allocator = devbuf_device_allocator(device);
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &shape, 1, 0, &in));
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, &shape, 1, DEVBUF_BUFFER_ZERO, &out));
  float values[2 * N];
  for (int i = 0; i < 2 * N; i++) values[i] = (float)i;
  CHECK_OK(devbuf_buffer_copyin(in, values, sizeof values));
  // The second halves, as views: the kernel sees each view as a buffer of its own.
  devbuf_buffer_t *in_half, *out_half;
  CHECK_OK(devbuf_buffer_view(in, N * sizeof(float), N * sizeof(float), &in_half));
  CHECK_OK(devbuf_buffer_view(out, N * sizeof(float), N * sizeof(float), &out_half));
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  float factor = 0.5f;
  devbuf_use_t uses[2] = {{out_half, DEVBUF_ACCESS_WRITE}, {in_half, DEVBUF_ACCESS_READ}};
  devbuf_arg_t args[1] = {{&factor, sizeof factor}};
  devbuf_launch_t launch = {1, {N, 1, 1}, {0, 0, 0}};
  CHECK_OK(devbuf_queue_launch(queue, again, "scale", &launch, uses, 2, args, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  float back[2 * N];
  CHECK_OK(devbuf_buffer_copyout(out, back, sizeof back));
  size_t wrong = 0;
  for (int i = 0; i < 2 * N; i++) wrong += back[i] != (i < N ? 0.0f : (float)i * 0.5f);
  CHECK_EQ_U(wrong, 0);

  // Refusals at submission: an unknown kernel, a misaligned view, bad sizes.
  CHECK_STATUS(devbuf_queue_launch(queue, program, "absent", &launch, uses, 2, args, 1),
               DEVBUF_NOT_FOUND);
  CHECK_MESSAGE("absent");
  devbuf_buffer_t *odd;
  CHECK_OK(devbuf_buffer_view(in, 4, 16, &odd));
  devbuf_use_t odd_use = {odd, DEVBUF_ACCESS_READ_WRITE};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "add_one", &launch, &odd_use, 1, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("multiples of");
  devbuf_launch_t uneven = {1, {100, 1, 1}, {64, 0, 0}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "add_one", &uneven, uses, 1, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_queue_submit(queue, cpu_kernel, uses, 1, NULL, 0), DEVBUF_UNSUPPORTED);
  // Arguments whose sizes add up past what a work item holds (and past size_t), or more of
  // them than it holds, are refused before any of their bytes are read.
  devbuf_arg_t huge[2] = {{&factor, SIZE_MAX / 2 + 2}, {&factor, SIZE_MAX / 2 + 2}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "scale", &launch, uses, 2, huge, 2),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("argument 0 of");
  CHECK_STATUS(devbuf_queue_launch(queue, program, "scale", &launch, uses, 2, huge, SIZE_MAX / 4),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("arguments, more than");
  devbuf_buffer_release(odd);

  // Arguments that are not what the kernel declares are refused before the driver sees them:
  // too few (its kernel object served earlier launches, whose values it still holds), a
  // scalar where it takes a buffer (PoCL would take its bytes for a cl_mem and crash), a
  // buffer where it takes a number.
  CHECK_STATUS(devbuf_queue_launch(queue, program, "scale", &launch, uses, 2, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("kernel 'scale' takes 3 arguments; the launch gives 2");
  uint64_t garbage = 0x4141414141414141u;
  devbuf_arg_t as_scalars[2] = {{&garbage, 8}, {&factor, sizeof factor}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "scale", &launch, uses, 1, as_scalars, 2),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("argument 1 of kernel 'scale' is a buffer");
  devbuf_use_t three[3] = {uses[0], uses[1], {in, DEVBUF_ACCESS_READ}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "scale", &launch, three, 3, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("argument 2 of kernel 'scale' is a scalar; the launch gives a buffer");
  // Grids a driver cannot count: more work items than a size_t holds, more work-groups than
  // PoCL counts (it aborted), local sizes given for some dimensions only.
  devbuf_launch_t vast = {3, {(size_t)1 << 32, (size_t)1 << 32, 1 << 8}, {0, 0, 0}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "add_one", &vast, uses, 1, NULL, 0),
               DEVBUF_OVERFLOW);
  devbuf_launch_t many = {2, {(size_t)1 << 32, (size_t)1 << 20, 1}, {16, 1, 0}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "add_one", &many, uses, 1, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("work-groups");
  devbuf_launch_t chosen = {2, {(size_t)1 << 40, (size_t)1 << 20, 1}, {0, 0, 0}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "add_one", &chosen, uses, 1, NULL, 0),
               DEVBUF_INVALID_ARGUMENT); // even in the largest groups the driver can make
  CHECK_MESSAGE("work-groups even in the largest groups the driver can choose, 4096 x 1 x 1");
  // A prime number of work items, the driver choosing: it can only make groups of one, more
  // than PoCL counts (it ran work items several times, or skipped the last ones).
  devbuf_launch_t prime = {1, {4294968317u, 1, 1}, {0, 0, 0}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "add_one", &prime, uses, 1, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("4294968317 work-groups even in the largest groups the driver can choose, 1 x");
  // 2^33 work items divide into groups the driver can make few enough of: submitted (behind
  // an event, then cancelled: nothing runs).
  devbuf_event_t *never = NULL;
  CHECK_OK(devbuf_event_create(0, &never));
  devbuf_queue_t *held = NULL;
  CHECK_OK(devbuf_queue_create(device, &held));
  CHECK_OK(devbuf_queue_wait(held, never, 1));
  devbuf_launch_t even = {1, {(size_t)1 << 33, 1, 1}, {0, 0, 0}};
  CHECK_OK(devbuf_queue_launch(held, program, "add_one", &even, uses, 1, NULL, 0));
  CHECK_OK(devbuf_queue_cancel(held));
  devbuf_queue_release(held);
  devbuf_event_release(never);
  // Groups larger than the device runs (the driver refused them only once the queue ran
  // them, failing it): in one dimension, and all dimensions together.
  devbuf_launch_t wide = {1, {1 << 16, 1, 1}, {1 << 16, 0, 0}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "add_one", &wide, uses, 1, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("local size 65536 in dimension 0 is more than the device runs");
  devbuf_launch_t cube = {3, {64, 64, 64}, {64, 64, 2}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "add_one", &cube, uses, 1, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("8192 work items, more than the kernel runs in one group");
  devbuf_launch_t partial = {2, {64, 64, 1}, {0, 16, 0}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "add_one", &partial, uses, 1, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("local sizes all 0");

  // A launch the driver refuses (a scalar of the wrong size) fails the queue with its cause;
  // what was queued behind it never runs, and its events fail too.
  devbuf_event_t *go, *after;
  CHECK_OK(devbuf_event_create(0, &go));
  CHECK_OK(devbuf_event_create(0, &after));
  CHECK_OK(devbuf_queue_wait(queue, go, 1)); // hold the launch back until all is queued
  devbuf_arg_t short_factor = {&factor, 2};
  CHECK_OK(devbuf_queue_launch(queue, program, "scale", &launch, uses, 2, &short_factor, 1));
  CHECK_OK(devbuf_queue_signal(queue, after, 1));
  CHECK_OK(devbuf_event_signal(go, 1));
  CHECK_STATUS(devbuf_event_wait(after, 1, 60000000000ull), DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("kernel 'scale' argument 2 (scalar 0, 2 bytes)");
  CHECK_STATUS(devbuf_queue_finish(queue), DEVBUF_DEVICE_FAILURE);
  CHECK_STATUS(devbuf_queue_launch(queue, program, "scale", &launch, uses, 2, args, 1),
               DEVBUF_DEVICE_FAILURE);
  CHECK(!devbuf_buffer_in_use(out));
  devbuf_event_release(go);
  devbuf_event_release(after);
  devbuf_queue_release(queue);
  devbuf_buffer_release(in_half);
  devbuf_buffer_release(out_half);
  devbuf_buffer_release(in);
  devbuf_buffer_release(out);
  devbuf_program_release(program);
  devbuf_program_release(again);
}

// Kernels that take an image or a sampler: a launch passes buffers and scalars only, so it
// is refused at submission (a buffer taken for an image, or a scalar for a sampler, crashed
// PoCL on the worker).
static void test_opaque_arguments_refused(void) {
  static const char opaque_source[] =
      "__kernel void image_in(read_only image2d_t image, __global float4 *out) {\n"
      "  out[0] = read_imagef(image, (int2)(0, 0));\n"
      "}\n"
      "__kernel void sampled(__global float *out, sampler_t sampler) { out[0] = 1.0f; }\n"
      "typedef struct { float r; } image_pixel;\n" // a user's type named like an image type
      "__kernel void pixels(__global image_pixel *p, image_pixel value) { p[0] = value; }\n";
  devbuf_program_t *program = NULL;
  CHECK_OK(devbuf_program_build(device, opaque_source, NULL, &program));
  if (!program) return;
  size_t size = 256;
  devbuf_buffer_t *a = NULL, *b = NULL;
  CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &a));
  CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &b));
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_launch_t one = {1, {1, 1, 1}, {0, 0, 0}};
  devbuf_use_t uses[2] = {{a, DEVBUF_ACCESS_READ}, {b, DEVBUF_ACCESS_WRITE}};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "image_in", &one, uses, 2, NULL, 0),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("argument 0 of kernel 'image_in' is a driver object (an image");
  uint64_t sampler_bits = 0x10;
  devbuf_arg_t as_scalar = {&sampler_bits, sizeof sampler_bits};
  CHECK_STATUS(devbuf_queue_launch(queue, program, "sampled", &one, &uses[1], 1, &as_scalar, 1),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("argument 1 of kernel 'sampled' is a driver object (an image");
  float red = 0.5f;
  devbuf_arg_t pixel = {&red, sizeof red};
  CHECK_OK(devbuf_queue_launch(queue, program, "pixels", &one, &uses[1], 1, &pixel, 1));
  CHECK_OK(devbuf_queue_finish(queue)); // nothing reached the driver: the queue is healthy
  devbuf_queue_release(queue);
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
  devbuf_program_release(program);
}

// A user allocator that hands out blocks of one cl_mem: an offset the device's alignment
// does not divide is refused when it is handed out (views of it reach kernels as
// sub-buffers, which the driver refused only once the queue ran the launch).
static devbuf_memory_t arena;
static size_t arena_offset;
static devbuf_status arena_alloc(void *ctx, size_t size, devbuf_memory_t *out) {
  (void)ctx;
  if (size > arena.size - arena_offset) return DEVBUF_OUT_OF_MEMORY;
  *out = (devbuf_memory_t){
      .device = arena.device, .offset = arena.offset + arena_offset, .size = size};
  return DEVBUF_OK;
}
static void arena_free(void *ctx, const devbuf_memory_t *memory) { (void)ctx, (void)memory; }
static const devbuf_allocator_vtable_t arena_vtable = {.alloc = arena_alloc, .free = arena_free};

static void test_user_allocator_alignment(void) {
  devbuf_allocator_t *raw = NULL, *user = NULL;
  CHECK_OK(devbuf_device_raw_allocator(device, &raw));
  CHECK_OK(devbuf_allocator_alloc(raw, 1 << 20, &arena));
  CHECK_OK(devbuf_allocator_create(device, &arena_vtable, NULL, &user));
  devbuf_device_info_t info;
  CHECK_OK(devbuf_device_info(device, &info));
  size_t shape = 4096;
  devbuf_buffer_t *buffer = NULL;
  arena_offset = 64;
  if (info.alignment > 64) {
    CHECK_STATUS(devbuf_buffer_allocate(user, DEVBUF_UINT8, &shape, 1, 0, &buffer),
                 DEVBUF_INVALID_ARGUMENT);
    CHECK_MESSAGE("offset 0x40");
  }
  arena_offset = info.alignment;
  CHECK_OK(devbuf_buffer_allocate(user, DEVBUF_UINT8, &shape, 1, 0, &buffer));
  devbuf_buffer_release(buffer);
  devbuf_allocator_release(user);
  devbuf_allocator_free(raw, &arena);
  devbuf_allocator_release(raw);
}

static void test_build_failure_carries_the_log(void) {
  devbuf_program_t *program = NULL;
  CHECK_STATUS(devbuf_program_build(device, "__kernel void broken(__global int *x) { x[0] = ; }",
                                    NULL, &program),
               DEVBUF_DEVICE_FAILURE);
  CHECK_MESSAGE("build log");
  CHECK_MESSAGE("error");
  CHECK(program == NULL);
  devbuf_device_t *cpu;
  CHECK_OK(devbuf_device_open("cpu", &cpu));
  CHECK_STATUS(devbuf_program_build(cpu, source, NULL, &program), DEVBUF_UNSUPPORTED);
  devbuf_device_release(cpu);
}

// A zero-length view is passed as NULL (nothing keeps its memory): even once the memory has
// gone back to the driver, the launch runs.
static void test_zero_length_view_launch(void) {
  devbuf_program_t *program = NULL;
  CHECK_OK(devbuf_program_build(device, source, NULL, &program));
  if (!program) return;
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_event_t *go;
  CHECK_OK(devbuf_event_create(0, &go));
  size_t size = 4096;
  devbuf_allocator_t *allocator = devbuf_device_allocator(device);
  devbuf_buffer_t *buffer = NULL, *empty = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_INT32, &size, 1, 0, &buffer));
  CHECK_OK(devbuf_buffer_view(buffer, 4096, 0, &empty));
  devbuf_use_t use = {empty, DEVBUF_ACCESS_READ};
  devbuf_launch_t launch = {1, {1, 1, 1}, {0, 0, 0}};
  CHECK_OK(devbuf_queue_wait(queue, go, 1));
  CHECK_OK(devbuf_queue_launch(queue, program, "ignore", &launch, &use, 1, NULL, 0));
  devbuf_buffer_release(empty);
  devbuf_buffer_release(buffer);
  devbuf_allocator_clear_cache(allocator);
  CHECK_OK(devbuf_event_signal(go, 1));
  CHECK_OK(devbuf_queue_finish(queue));
  devbuf_event_release(go);
  devbuf_queue_release(queue);
  devbuf_program_release(program);
}

static void test_dlpack_of_device_memory(void) {
  size_t size = 16;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_INT32, &size, 1, 0, &buffer));
  DLManagedTensorVersioned *tensor = NULL;
  CHECK_OK(devbuf_buffer_to_dlpack_versioned(buffer, 0, &tensor));
  devbuf_buffer_t *imported = NULL;
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(
      tensor, &imported)); // an opencl tensor comes back to opencl:0
  CHECK(imported && devbuf_buffer_device(imported) == device &&
        !devbuf_buffer_is_cpu_accessible(imported));
  int32_t values[16] = {1, 2, 3}, back[16];
  CHECK_OK(devbuf_buffer_copyin(imported, values, sizeof values));
  CHECK_OK(devbuf_buffer_copyout(buffer, back, sizeof back));
  CHECK(back[2] == 3);
  devbuf_buffer_release(imported);
  devbuf_buffer_release(buffer);
  // Host-visible memory of an OpenCL device is still an OpenCL tensor: its data is the cl_mem.
  CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator_for(device, DEVBUF_MEMORY_HOST_VISIBLE),
                                  DEVBUF_INT32, &size, 1, 0, &buffer));
  CHECK_OK(devbuf_buffer_copyin(buffer, values, sizeof values));
  CHECK_OK(devbuf_buffer_to_dlpack_versioned(buffer, 0, &tensor));
  uint64_t handle;
  size_t offset;
  CHECK_OK(devbuf_buffer_device_handle(buffer, &handle, &offset));
  CHECK(tensor->dl_tensor.device.device_type == DEVBUF_DL_OPENCL &&
        tensor->dl_tensor.data == (void *)(uintptr_t)handle);
  CHECK_EQ_U(tensor->dl_tensor.byte_offset, offset);
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(tensor, &imported));
  CHECK_OK(devbuf_buffer_copyout(imported, back, sizeof back)); // a cl_mem the driver accepts
  CHECK(back[2] == 3);
  devbuf_buffer_release(imported);
  devbuf_buffer_release(buffer);
}

// A weight file on a device the CPU cannot read from: staged copies, equal to the file.
static void test_safetensors_onto_the_device(void) {
  const char *path = test_data("safetensors/burn/mnist.safetensors");
  devbuf_tensor_file_t *file = NULL;
  CHECK_OK(devbuf_safetensors_load(device, path, NULL, &file));
  size_t size;
  unsigned char *expected = test_read_file(path, &size);
  CHECK(file && expected && devbuf_tensor_file_count(file) == 20);
  for (size_t i = 0; file && expected && i < devbuf_tensor_file_count(file); i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(file, i, &info);
    devbuf_buffer_t *buffer = devbuf_tensor_file_buffer(file, i);
    CHECK(devbuf_buffer_device(buffer) == device && !devbuf_buffer_is_cpu_accessible(buffer));
    size_t bytes = devbuf_buffer_size(buffer);
    unsigned char *back = malloc(bytes + 1);
    CHECK_OK(devbuf_buffer_copyout(buffer, back, bytes));
    CHECK(memcmp(back, expected + info.file_offset, bytes) == 0);
    free(back);
  }
  free(expected);
  devbuf_tensor_file_release(file);
  // 6-bit elements come 4 to 3 bytes: the staged pieces of one larger than a piece must hold
  // whole elements (pieces of 8 MiB were refused as views).
  char six_path[] = "/tmp/devbuf-six-XXXXXX";
  close(mkstemp(six_path));
  size_t count = (size_t)12 << 20, bytes = count / 4 * 3; // 9 MiB
  devbuf_buffer_t *host = NULL;
  devbuf_device_t *cpu = NULL;
  CHECK_OK(devbuf_device_open("cpu", &cpu));
  CHECK_OK(devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_FLOAT6_E2M3, &count, 1, 0,
                                  &host));
  unsigned char *pattern = malloc(bytes), *back = malloc(bytes);
  for (size_t i = 0; pattern && i < bytes; i++) pattern[i] = (unsigned char)(i * 7 + i / 4099);
  CHECK_OK(devbuf_buffer_copyin(host, pattern, bytes));
  devbuf_named_buffer_t six = {"six", host};
  CHECK_OK(devbuf_safetensors_write(six_path, &six, 1, NULL, 0));
  CHECK_OK(devbuf_safetensors_load(device, six_path, NULL, &file));
  CHECK_OK(devbuf_buffer_copyout(devbuf_tensor_file_buffer(file, 0), back, bytes));
  CHECK(pattern && back && memcmp(pattern, back, bytes) == 0);
  free(pattern);
  free(back);
  devbuf_tensor_file_release(file);
  devbuf_buffer_release(host);
  devbuf_device_release(cpu);
  unlink(six_path);
}

static int deleted_tensors;
static void count_deletion(DLManagedTensorVersioned *self) {
  (void)self;
  deleted_tensors++;
}

// A DLPack tensor of `count` int32 over a cl_mem the caller made.
static DLManagedTensorVersioned cl_mem_tensor(void *mem, int64_t *count) {
  DLManagedTensorVersioned tensor = {.version = {1, 0}, .deleter = count_deletion};
  tensor.dl_tensor = (DLTensor){.data = mem,
                                .device = {DEVBUF_DL_OPENCL, 0},
                                .ndim = 1,
                                .dtype = {DEVBUF_DL_INT, 32, 1},
                                .shape = count};
  return tensor;
}

// A cl_mem handed over through DLPack is checked before anything uses it: smaller than the
// tensor, or of another context, it is refused (a kernel wrote past it and crashed PoCL); a
// sub-buffer is used through its parent, so that views of it reach kernels too.
static void test_foreign_cl_mem(void) {
  devbuf_opencl_handles_t handles;
  CHECK_OK(devbuf_opencl_device_handles(device, &handles));
  void *(*create_buffer)(void *, uint64_t, size_t, void *, int32_t *);
  void *(*create_sub_buffer)(void *, uint64_t, uint32_t, const void *, int32_t *);
  void *(*create_context)(const intptr_t *, uint32_t, void *const *, void *, void *, int32_t *);
  int32_t (*release_mem)(void *), (*release_context)(void *);
  *(void **)&create_buffer = devbuf_opencl_entry_point("clCreateBuffer");
  *(void **)&create_sub_buffer = devbuf_opencl_entry_point("clCreateSubBuffer");
  *(void **)&create_context = devbuf_opencl_entry_point("clCreateContext");
  *(void **)&release_mem = devbuf_opencl_entry_point("clReleaseMemObject");
  *(void **)&release_context = devbuf_opencl_entry_point("clReleaseContext");
  if (!create_buffer || !create_sub_buffer || !create_context || !release_mem || !release_context)
    return;
  int32_t code = 0;
  void *small = create_buffer(handles.context, 1 /* READ_WRITE */, 64, NULL, &code);
  void *other_context = create_context(NULL, 1, &handles.device, NULL, NULL, &code);
  void *elsewhere = other_context ? create_buffer(other_context, 1, 4096, NULL, &code) : NULL;
  void *parent = create_buffer(handles.context, 1, 8192, NULL, &code);
  size_t region[2] = {4096, 4096};
  void *sub = parent ? create_sub_buffer(parent, 0, 0x1220 /* REGION */, region, &code) : NULL;
  CHECK(small && elsewhere && parent && sub);
  if (!small || !elsewhere || !parent || !sub) return;
  int64_t count = 1024;
  devbuf_buffer_t *imported = NULL;
  DLManagedTensorVersioned too_big = cl_mem_tensor(small, &count);
  CHECK_STATUS(devbuf_buffer_from_dlpack_versioned(&too_big, &imported), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("holds 64 bytes; the tensor needs 4096");
  DLManagedTensorVersioned foreign = cl_mem_tensor(elsewhere, &count);
  CHECK_STATUS(devbuf_buffer_from_dlpack_versioned(&foreign, &imported), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("another OpenCL context");
  CHECK_EQ_U(deleted_tensors, 0); // refused tensors stay the caller's

  DLManagedTensorVersioned part = cl_mem_tensor(sub, &count);
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(&part, &imported));
  int32_t zeros[1024] = {0}, back[1024];
  CHECK_OK(devbuf_buffer_copyin(imported, zeros, sizeof zeros));
  devbuf_buffer_t *view = NULL;
  CHECK_OK(devbuf_buffer_view(imported, 512, 1024, &view));
  devbuf_program_t *program = NULL;
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_program_build(device, source, NULL, &program));
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_use_t use = {view, DEVBUF_ACCESS_READ_WRITE};
  devbuf_launch_t launch = {1, {256, 1, 1}, {0, 0, 0}};
  CHECK_OK(devbuf_queue_launch(queue, program, "add_one", &launch, &use, 1, NULL, 0));
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK_OK(devbuf_buffer_copyout(imported, back, sizeof back));
  size_t wrong = 0;
  for (int i = 0; i < 1024; i++) wrong += back[i] != (i >= 128 && i < 384);
  CHECK_EQ_U(wrong, 0);
  devbuf_queue_release(queue);
  devbuf_program_release(program);
  devbuf_buffer_release(view);
  devbuf_buffer_release(imported);
  CHECK_EQ_U(deleted_tensors, 1);
  release_mem(sub), release_mem(parent), release_mem(small), release_mem(elsewhere);
  release_context(other_context);
}

// The handles of devbuf_opencl.h are the driver's own: OpenCL answers about them, and a
// command the caller enqueues on a queue's cl_command_queue once the queue has finished
// sees what its work wrote.
static void test_native_handles(void) {
  devbuf_opencl_handles_t handles;
  CHECK_OK(devbuf_opencl_device_handles(device, &handles));
  CHECK(handles.platform && handles.device && handles.context);
  int32_t (*get_context_info)(void *, uint32_t, size_t, void *, size_t *);
  int32_t (*get_queue_info)(void *, uint32_t, size_t, void *, size_t *);
  int32_t (*read_buffer)(void *, void *, uint32_t, size_t, size_t, void *, uint32_t, const void *,
                         void *);
  *(void **)&get_context_info = devbuf_opencl_entry_point("clGetContextInfo");
  *(void **)&get_queue_info = devbuf_opencl_entry_point("clGetCommandQueueInfo");
  *(void **)&read_buffer = devbuf_opencl_entry_point("clEnqueueReadBuffer");
  CHECK(get_context_info && get_queue_info && read_buffer);
  CHECK(devbuf_opencl_entry_point("clNoSuchFunction") == NULL &&
        devbuf_opencl_entry_point(NULL) == NULL);
  if (!get_context_info || !get_queue_info || !read_buffer) return;
  void *devices[4] = {NULL};
  CHECK(get_context_info(handles.context, 0x1081 /* CL_CONTEXT_DEVICES */, sizeof devices, devices,
                         NULL) == 0);
  CHECK(devices[0] == handles.device);

  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  void *command_queue = NULL, *context = NULL;
  CHECK_OK(devbuf_opencl_queue_handle(queue, &command_queue));
  CHECK(get_queue_info(command_queue, 0x1090 /* CL_QUEUE_CONTEXT */, sizeof context, &context,
                       NULL) == 0);
  CHECK(context == handles.context);
  size_t size = 1 << 16;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT32, &size, 1, 0, &buffer));
  uint32_t pattern = 0x5eed5eedu, *back = calloc(size, sizeof *back);
  uint64_t mem = 0;
  size_t offset = 0;
  CHECK_OK(devbuf_buffer_device_handle(buffer, &mem, &offset));
  CHECK_OK(devbuf_queue_fill(queue, buffer, &pattern, sizeof pattern));
  // The worker enqueues on its own time: the order goes through the host.
  CHECK_OK(devbuf_queue_finish(queue));
  CHECK(read_buffer(command_queue, (void *)(uintptr_t)mem, 1 /* blocking */, offset, size * 4, back,
                    0, NULL, NULL) == 0);
  size_t matching = 0;
  for (size_t i = 0; i < size; i++) matching += back[i] == pattern;
  CHECK_EQ_U(matching, size);
  free(back);
  devbuf_buffer_release(buffer);

  devbuf_device_t *cpu = NULL;
  devbuf_queue_t *cpu_queue = NULL;
  CHECK_OK(devbuf_device_open("cpu", &cpu));
  CHECK_STATUS(devbuf_opencl_device_handles(cpu, &handles), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("cpu is not an OpenCL device");
  CHECK_OK(devbuf_queue_create(cpu, &cpu_queue));
  CHECK_STATUS(devbuf_opencl_queue_handle(cpu_queue, &command_queue), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_opencl_queue_handle(NULL, &command_queue), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_opencl_device_handles(device, NULL), DEVBUF_INVALID_ARGUMENT);
  devbuf_queue_release(cpu_queue);
  devbuf_device_release(cpu);
  devbuf_queue_release(queue);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--expect-unavailable") == 0) {
    // "No platform" can only be told apart where there is an ICD loader to ask.
    if (strcmp(argv[2], "found no platform") == 0 &&
        devbuf_device_open("opencl:0", &device) == DEVBUF_UNAVAILABLE &&
        strstr(devbuf_last_error(), "cannot load the OpenCL ICD loader")) {
      printf("SKIP: no ICD loader on this machine, so no empty platform list to check (%s)\n",
             devbuf_last_error());
      return SKIP_EXIT_CODE;
    }
    if (device) devbuf_device_release(device);
    device = NULL;
    return check_expect_unavailable("opencl:0", argv[2]);
  }
  if (devbuf_device_open("opencl:0", &device) != DEVBUF_OK) {
    printf("SKIP: %s\n", devbuf_last_error());
    return SKIP_EXIT_CODE;
  }
  test_require_data();
  RUN(test_device_facts);
  RUN(test_oversize_allocation);
  RUN(test_device_memory_is_not_host_memory);
  RUN(test_programs_and_kernels);
  RUN(test_build_failure_carries_the_log);
  RUN(test_opaque_arguments_refused);
  RUN(test_user_allocator_alignment);
  RUN(test_zero_length_view_launch);
  RUN(test_dlpack_of_device_memory);
  RUN(test_safetensors_onto_the_device);
  RUN(test_native_handles);
  RUN(test_foreign_cl_mem);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
