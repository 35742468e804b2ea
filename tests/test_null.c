// One rule for NULL across the public API (stated in devbuf.h): a function that returns a
// status answers INVALID_ARGUMENT for a NULL handle or a NULL required pointer, naming it;
// a getter answers 0, NULL, false or its documented "none" value; retain and release of
// NULL do nothing. Every public function is called here with NULL in every pointer it
// takes, first with everything else NULL too, then with valid other arguments.
#include "../src/interop/dlpack_abi.h"
#include "check.h"

#include <stdint.h>

#define INVALID(expr) CHECK_STATUS(expr, DEVBUF_INVALID_ARGUMENT)

static devbuf_status noop_kernel(const devbuf_kernel_args_t *args) {
  (void)args;
  return DEVBUF_OK;
}

// Status, dtype and error functions.
static void test_base(void) {
  CHECK(devbuf_status_name(DEVBUF_OK) != NULL && devbuf_status_str(DEVBUF_OK) != NULL);
  CHECK(devbuf_last_error() != NULL);
  uint8_t code = 0, bits = 0; // both outputs are optional
  CHECK_OK(devbuf_dtype_dlpack(DEVBUF_FLOAT32, NULL, NULL));
  CHECK_OK(devbuf_dtype_dlpack(DEVBUF_FLOAT32, &code, NULL));
  CHECK_OK(devbuf_dtype_dlpack(DEVBUF_FLOAT32, NULL, &bits));
  CHECK(bits == 32);
  devbuf_dtype dtype;
  INVALID(devbuf_dtype_from_name(NULL, &dtype));
  INVALID(devbuf_dtype_from_name("float32", NULL));
  INVALID(devbuf_dtype_bytes(DEVBUF_FLOAT32, 4, NULL));
  CHECK(devbuf_set_error(DEVBUF_IO_ERROR, NULL) == DEVBUF_IO_ERROR); // the status name alone
  CHECK(strcmp(devbuf_last_error(), "IO_ERROR") == 0);
}

static void test_devices(devbuf_device_t *cpu) {
  INVALID(devbuf_device_open(NULL, NULL));
  INVALID(devbuf_device_open(NULL, &cpu));
  INVALID(devbuf_device_open("cpu", NULL));
  CHECK(devbuf_device_retain(NULL) == NULL);
  devbuf_device_release(NULL);
  CHECK(devbuf_device_kind_of(NULL) == 0);
  CHECK(devbuf_device_kind_name(devbuf_device_kind_of(NULL)) == NULL); // 0 is no kind
  CHECK(devbuf_device_dlpack_type(NULL) == 0);
  CHECK(devbuf_device_spec(NULL) == NULL);
  CHECK(devbuf_device_name(NULL) == NULL);
  CHECK_EQ_U(devbuf_device_page_size(NULL), 0);
  CHECK(devbuf_device_allocator(NULL) == NULL);
  CHECK(devbuf_device_allocator_for(NULL, DEVBUF_MEMORY_DEVICE) == NULL);
  devbuf_device_info_t info;
  INVALID(devbuf_device_info(NULL, NULL));
  INVALID(devbuf_device_info(NULL, &info));
  INVALID(devbuf_device_info(cpu, NULL));
  INVALID(devbuf_device_synchronize(NULL));
}

static void test_allocator_calls(devbuf_device_t *cpu) {
  devbuf_allocator_t *allocator = devbuf_device_allocator(cpu), *out = NULL;
  devbuf_allocator_vtable_t vtable = {0};
  INVALID(devbuf_allocator_create(NULL, NULL, NULL, NULL));
  INVALID(devbuf_allocator_create(cpu, NULL, NULL, &out));
  INVALID(devbuf_allocator_create(cpu, &vtable, NULL, &out)); // a vtable without functions
  INVALID(devbuf_caching_allocator_create(NULL, NULL, NULL));
  INVALID(devbuf_caching_allocator_create(allocator, NULL, NULL));
  INVALID(devbuf_caching_allocator_set_options(NULL, NULL));
  devbuf_caching_options_t options = {0};
  INVALID(devbuf_caching_allocator_set_options(NULL, &options));
  INVALID(devbuf_caching_allocator_configure(NULL, &options));
  INVALID(devbuf_caching_allocator_configure(allocator, NULL));
  INVALID(devbuf_device_raw_allocator(NULL, NULL));
  INVALID(devbuf_device_raw_allocator(cpu, NULL));
  CHECK(devbuf_allocator_retain(NULL) == NULL);
  devbuf_allocator_release(NULL);
  CHECK(devbuf_allocator_device(NULL) == NULL);
  CHECK(devbuf_allocator_kind(NULL) == NULL);
  devbuf_memory_t memory;
  INVALID(devbuf_allocator_alloc(NULL, 64, NULL));
  INVALID(devbuf_allocator_alloc(NULL, 64, &memory));
  INVALID(devbuf_allocator_alloc(allocator, 64, NULL));
  devbuf_allocator_free(NULL, NULL);
  devbuf_allocator_free(allocator, NULL);
  devbuf_allocator_stats_t stats;
  INVALID(devbuf_allocator_stats(NULL, NULL));
  INVALID(devbuf_allocator_stats(NULL, &stats));
  INVALID(devbuf_allocator_stats(allocator, NULL));
  devbuf_allocator_reset_peak(NULL);
  devbuf_allocator_clear_cache(NULL);
  devbuf_allocator_snapshot_t *snapshot = NULL;
  INVALID(devbuf_allocator_snapshot(NULL, NULL));
  INVALID(devbuf_allocator_snapshot(NULL, &snapshot));
  INVALID(devbuf_allocator_snapshot(allocator, NULL));
  devbuf_allocator_snapshot_free(NULL);
  INVALID(devbuf_stats_adaptor_create(NULL, NULL));
  INVALID(devbuf_stats_adaptor_create(allocator, NULL));
  INVALID(devbuf_trace_adaptor_create(NULL, NULL, NULL));
  INVALID(devbuf_trace_adaptor_create(allocator, NULL, &out));
  INVALID(devbuf_trace_adaptor_create(allocator, "/tmp/devbuf-null.trace", NULL));
  INVALID(devbuf_fault_adaptor_create(NULL, 1, DEVBUF_FAULT_ONCE, NULL));
  INVALID(devbuf_fault_adaptor_create(allocator, 1, DEVBUF_FAULT_ONCE, NULL));
  INVALID(devbuf_fault_adaptor_arm(NULL, 1, DEVBUF_FAULT_ONCE));
  CHECK_EQ_U(devbuf_fault_adaptor_fired(NULL), 0);
  devbuf_trace_summary_t summary;
  INVALID(devbuf_trace_replay(NULL, NULL, NULL));
  INVALID(devbuf_trace_replay(NULL, allocator, &summary));
  INVALID(devbuf_trace_replay("/tmp/x", NULL, &summary));
  INVALID(devbuf_trace_replay("/tmp/x", allocator, NULL));
  INVALID(devbuf_trace_replay_observed(NULL, NULL, NULL, NULL, NULL));
  INVALID(devbuf_trace_replay_observed("/tmp/x", allocator, NULL, NULL, NULL));
}

static void test_buffers(devbuf_device_t *cpu) {
  devbuf_allocator_t *allocator = devbuf_device_allocator(cpu);
  size_t shape[1] = {16};
  devbuf_buffer_t *buffer = NULL, *out = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, shape, 1, 0, &buffer));
  INVALID(devbuf_buffer_new(NULL, DEVBUF_UINT8, NULL, 1, 0, NULL));
  INVALID(devbuf_buffer_new(NULL, DEVBUF_UINT8, shape, 1, 0, &out));
  INVALID(devbuf_buffer_new(allocator, DEVBUF_UINT8, NULL, 1, 0, &out));
  INVALID(devbuf_buffer_new(allocator, DEVBUF_UINT8, shape, 1, 0, NULL));
  INVALID(devbuf_buffer_allocate(NULL, DEVBUF_UINT8, NULL, 1, 0, NULL));
  INVALID(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, shape, 1, 0, NULL));
  INVALID(devbuf_buffer_map_file(NULL, NULL, NULL));
  INVALID(devbuf_buffer_map_file(cpu, NULL, &out));
  INVALID(devbuf_buffer_map_file(cpu, "/tmp", NULL));
  INVALID(devbuf_buffer_view(NULL, 0, 0, NULL));
  INVALID(devbuf_buffer_view(NULL, 0, 0, &out));
  INVALID(devbuf_buffer_view(buffer, 0, 4, NULL));
  CHECK_MESSAGE("INVALID_ARGUMENT: out_view is NULL"); // the one that is, not a list
  INVALID(devbuf_buffer_reshape(NULL, DEVBUF_UINT8, NULL, 1, NULL));
  INVALID(devbuf_buffer_reshape(buffer, DEVBUF_UINT8, NULL, 1, &out));
  INVALID(devbuf_buffer_view_as(NULL, 0, DEVBUF_UINT8, NULL, 0, &out));
  INVALID(devbuf_buffer_view_as(buffer, 0, DEVBUF_UINT8, NULL, 0, NULL));
  INVALID(devbuf_buffer_reshape(buffer, DEVBUF_UINT8, shape, 1, NULL));
  CHECK(out == NULL);
  CHECK(devbuf_buffer_retain(NULL) == NULL);
  devbuf_buffer_release(NULL);
  INVALID(devbuf_buffer_ensure_allocated(NULL));
  CHECK(devbuf_buffer_is_allocated(NULL) == 0);
  CHECK_EQ_U(devbuf_buffer_size(NULL), 0);
  CHECK(devbuf_buffer_is_empty(NULL) == 0); // a getter's NULL answer, as every getter's
  CHECK_EQ_U(devbuf_buffer_offset(NULL), 0);
  CHECK(devbuf_buffer_dtype(NULL) == DEVBUF_DTYPE_COUNT);
  CHECK_EQ_U(devbuf_buffer_ndim(NULL), 0);
  CHECK(devbuf_buffer_shape(NULL) == NULL);
  CHECK_EQ_U(devbuf_buffer_count(NULL), 0);
  CHECK(devbuf_buffer_allocator(NULL) == NULL);
  CHECK(devbuf_buffer_device(NULL) == NULL);
  CHECK_EQ_U(devbuf_buffer_storage_id(NULL), 0);
  CHECK_EQ_U(devbuf_buffer_handle_id(NULL), 0);
  CHECK(devbuf_buffer_is_mapped(NULL) == 0);
  CHECK(devbuf_buffer_is_read_only(NULL) == 0);
  CHECK(devbuf_buffer_is_cpu_accessible(NULL) == 0);
  CHECK(devbuf_buffer_in_use(NULL) == 0);
  CHECK_EQ_U(devbuf_buffer_open_accesses(NULL), 0);
  char text[8];
  CHECK(devbuf_buffer_describe(NULL, NULL, 0) > 0);
  CHECK(devbuf_buffer_describe(NULL, NULL, 64) > 0); // no room given: the length alone
  CHECK(devbuf_buffer_describe(buffer, NULL, 64) > 0);
  CHECK(devbuf_buffer_describe(NULL, text, sizeof text) > 0);
  devbuf_buffer_release(buffer);
}

static void test_host_access(devbuf_device_t *cpu) {
  size_t shape[1] = {4};
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_FLOAT32, shape, 1, 0, &buffer));
  const void *data = NULL;
  void *mutable_data = NULL;
  size_t size = 0;
  INVALID(devbuf_buffer_contents(NULL, NULL, NULL));
  INVALID(devbuf_buffer_contents(NULL, &data, &size));
  INVALID(devbuf_buffer_contents(buffer, NULL, &size));
  INVALID(devbuf_buffer_contents_mut(NULL, NULL, NULL));
  INVALID(devbuf_buffer_contents_mut(buffer, NULL, &size));
  INVALID(devbuf_buffer_contents_wait(NULL, NULL, NULL));
  INVALID(devbuf_buffer_contents_wait(buffer, NULL, NULL));
  INVALID(devbuf_buffer_contents_mut_wait(NULL, NULL, NULL));
  INVALID(devbuf_buffer_contents_mut_wait(buffer, NULL, NULL));
  CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 0); // nothing was opened by the refusals
  CHECK_OK(devbuf_buffer_contents_mut(buffer, &mutable_data, NULL)); // out_size is optional
  CHECK_OK(devbuf_buffer_end_access(buffer, mutable_data));
  INVALID(devbuf_buffer_end_access(NULL, NULL));
  INVALID(devbuf_buffer_end_access(buffer, NULL)); // no access at NULL is open
  devbuf_array_t array;
  INVALID(devbuf_buffer_as_array(NULL, DEVBUF_FLOAT32, NULL));
  INVALID(devbuf_buffer_as_array(buffer, DEVBUF_FLOAT32, NULL));
  INVALID(devbuf_buffer_as_array(NULL, DEVBUF_FLOAT32, &array));
  INVALID(devbuf_buffer_as_array_mut(NULL, DEVBUF_FLOAT32, NULL));
  INVALID(devbuf_buffer_as_array_mut(buffer, DEVBUF_FLOAT32, NULL));
  INVALID(devbuf_buffer_as_slice(NULL, DEVBUF_FLOAT32, NULL, NULL));
  INVALID(devbuf_buffer_as_slice(buffer, DEVBUF_FLOAT32, NULL, NULL));
  INVALID(devbuf_buffer_item(NULL, DEVBUF_FLOAT32, NULL));
  INVALID(devbuf_buffer_item(buffer, DEVBUF_FLOAT32, NULL));
  float values[4];
  INVALID(devbuf_buffer_copyin(NULL, NULL, 0));
  INVALID(devbuf_buffer_copyin(NULL, values, sizeof values));
  INVALID(devbuf_buffer_copyin(buffer, NULL, sizeof values));
  INVALID(devbuf_buffer_copyout(NULL, NULL, 0));
  INVALID(devbuf_buffer_copyout(buffer, NULL, sizeof values));
  // A NULL pointer answers for itself first, whatever else is wrong with the call (a size or
  // a dtype that does not match answered instead).
  INVALID(devbuf_buffer_copyin(buffer, NULL, sizeof values - 1));
  CHECK_MESSAGE("src is NULL");
  INVALID(devbuf_buffer_copyout(buffer, NULL, sizeof values + 1));
  CHECK_MESSAGE("dst is NULL");
  INVALID(devbuf_buffer_as_array(buffer, DEVBUF_INT8, NULL));
  CHECK_MESSAGE("out_array is NULL");
  INVALID(devbuf_buffer_as_slice(buffer, DEVBUF_INT8, NULL, NULL));
  CHECK_MESSAGE("out_data is NULL");
  INVALID(devbuf_buffer_item(buffer, DEVBUF_INT8, NULL));
  CHECK_MESSAGE("out_value is NULL");
  INVALID(devbuf_buffer_copy_from(NULL, NULL));
  INVALID(devbuf_buffer_copy_from(buffer, NULL));
  INVALID(devbuf_buffer_copy_from(NULL, buffer));
  INVALID(devbuf_buffer_synchronize(NULL));
  INVALID(devbuf_buffer_wait(NULL));
  uint64_t address;
  INVALID(devbuf_buffer_device_ptr(NULL, NULL));
  INVALID(devbuf_buffer_device_ptr(NULL, &address));
  INVALID(devbuf_buffer_device_ptr(buffer, NULL));
  size_t offset;
  INVALID(devbuf_buffer_device_handle(NULL, &address, &offset));
  INVALID(devbuf_buffer_device_handle(buffer, NULL, &offset));
  INVALID(devbuf_buffer_device_handle(buffer, &address, NULL));
  INVALID(devbuf_buffer_unsynchronized_ptr(NULL, NULL, NULL));
  INVALID(devbuf_buffer_unsynchronized_ptr(buffer, NULL, NULL));
  CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 0);
  devbuf_buffer_release(buffer);
}

static void test_queues_and_events(devbuf_device_t *cpu) {
  devbuf_event_t *event = NULL;
  devbuf_queue_t *queue = NULL;
  INVALID(devbuf_event_create(0, NULL));
  CHECK(devbuf_event_retain(NULL) == NULL);
  devbuf_event_release(NULL);
  INVALID(devbuf_event_signal(NULL, 1));
  INVALID(devbuf_event_wait(NULL, 1, 0));
  CHECK_EQ_U(devbuf_event_value(NULL), 0);
  INVALID(devbuf_event_status(NULL));
  INVALID(devbuf_queue_create(NULL, NULL));
  INVALID(devbuf_queue_create(NULL, &queue));
  INVALID(devbuf_queue_create(cpu, NULL));
  CHECK_MESSAGE("INVALID_ARGUMENT: out_queue is NULL");
  CHECK(devbuf_queue_retain(NULL) == NULL);
  devbuf_queue_release(NULL);
  CHECK(devbuf_queue_device(NULL) == NULL);
  CHECK_OK(devbuf_queue_create(cpu, &queue));
  CHECK_OK(devbuf_event_create(0, &event));
  INVALID(devbuf_queue_submit(NULL, NULL, NULL, 0, NULL, 0));
  INVALID(devbuf_queue_submit(queue, NULL, NULL, 0, NULL, 0));
  INVALID(devbuf_queue_submit(queue, noop_kernel, NULL, 1, NULL, 0));
  INVALID(devbuf_queue_submit(queue, noop_kernel, NULL, 0, NULL, 4));
  devbuf_use_t use = {NULL, DEVBUF_ACCESS_READ};
  INVALID(devbuf_queue_submit(queue, noop_kernel, &use, 1, NULL, 0));
  devbuf_program_t *program = NULL;
  INVALID(devbuf_program_build(NULL, NULL, NULL, NULL));
  INVALID(devbuf_program_build(cpu, NULL, NULL, &program));
  INVALID(devbuf_program_build(cpu, "x", NULL, NULL));
  CHECK(devbuf_program_retain(NULL) == NULL);
  devbuf_program_release(NULL);
  devbuf_launch_t launch = {.dims = 1, .global = {1}};
  INVALID(devbuf_queue_launch(NULL, NULL, NULL, NULL, NULL, 0, NULL, 0));
  INVALID(devbuf_queue_launch(queue, NULL, "k", &launch, NULL, 0, NULL, 0));
  INVALID(devbuf_queue_fill(NULL, NULL, NULL, 0));
  INVALID(devbuf_queue_fill(queue, NULL, "x", 1));
  INVALID(devbuf_queue_copy(NULL, NULL, NULL));
  INVALID(devbuf_queue_copy(queue, NULL, NULL));
  INVALID(devbuf_queue_signal(NULL, NULL, 1));
  INVALID(devbuf_queue_signal(NULL, event, 1));
  INVALID(devbuf_queue_signal(queue, NULL, 1));
  INVALID(devbuf_queue_wait(NULL, NULL, 1));
  INVALID(devbuf_queue_wait(queue, NULL, 1));
  INVALID(devbuf_queue_finish(NULL));
  INVALID(devbuf_queue_cancel(NULL));
  INVALID(devbuf_queue_status(NULL));
  CHECK_OK(devbuf_queue_finish(queue)); // the refusals queued nothing
  devbuf_queue_release(queue);
  devbuf_event_release(event);
}

static void test_files(devbuf_device_t *cpu) {
  devbuf_tensor_file_t *file = NULL;
  INVALID(devbuf_safetensors_load(NULL, NULL, NULL, NULL));
  INVALID(devbuf_safetensors_load(cpu, NULL, NULL, &file));
  CHECK_MESSAGE("INVALID_ARGUMENT: safetensors_load: path is NULL");
  INVALID(devbuf_safetensors_load(cpu, "/tmp/x", NULL, NULL));
  INVALID(devbuf_safetensors_inspect(NULL, NULL));
  INVALID(devbuf_safetensors_inspect(NULL, &file));
  INVALID(devbuf_safetensors_inspect("/tmp/x", NULL));
  INVALID(devbuf_safetensors_parse(NULL, 0, NULL));
  INVALID(devbuf_safetensors_parse(NULL, 16, &file));
  INVALID(devbuf_safetensors_parse("12345678", 8, NULL));
  CHECK(file == NULL);
  devbuf_tensor_file_release(NULL);
  CHECK_EQ_U(devbuf_tensor_file_count(NULL), 0);
  devbuf_tensor_info_t info;
  INVALID(devbuf_tensor_file_info(NULL, 0, NULL));
  INVALID(devbuf_tensor_file_info(NULL, 0, &info));
  size_t index;
  INVALID(devbuf_tensor_file_find(NULL, NULL, NULL));
  INVALID(devbuf_tensor_file_find(NULL, "w", &index));
  CHECK(devbuf_tensor_file_buffer(NULL, 0) == NULL);
  CHECK_EQ_U(devbuf_tensor_file_metadata_count(NULL), 0);
  const char *key, *value;
  INVALID(devbuf_tensor_file_metadata(NULL, 0, NULL, NULL));
  INVALID(devbuf_tensor_file_metadata(NULL, 0, &key, &value));
  CHECK(devbuf_tensor_file_metadata_get(NULL, NULL) == NULL);
  CHECK(devbuf_tensor_file_metadata_get(NULL, "k") == NULL);
  CHECK_EQ_U(devbuf_tensor_file_header_size(NULL), 0);
  CHECK_EQ_U(devbuf_tensor_file_data_size(NULL), 0);
  // A real table: NULL outputs and names.
  CHECK_OK(devbuf_safetensors_parse("\x02\0\0\0\0\0\0\0{}", 10, &file));
  INVALID(devbuf_tensor_file_info(file, 0, NULL));
  INVALID(devbuf_tensor_file_find(file, NULL, &index));
  INVALID(devbuf_tensor_file_find(file, "w", NULL));
  INVALID(devbuf_tensor_file_metadata(file, 0, NULL, NULL));
  CHECK(devbuf_tensor_file_metadata_get(file, NULL) == NULL);
  devbuf_tensor_file_release(file);
  INVALID(devbuf_safetensors_write(NULL, NULL, 0, NULL, 0));
  INVALID(devbuf_safetensors_write("/tmp/devbuf-null.safetensors", NULL, 1, NULL, 0));
  INVALID(devbuf_safetensors_write("/tmp/devbuf-null.safetensors", NULL, 0, NULL, 1));
  devbuf_named_buffer_t unnamed = {NULL, NULL};
  INVALID(devbuf_safetensors_write("/tmp/devbuf-null.safetensors", &unnamed, 1, NULL, 0));
  devbuf_metadata_entry_t keyless = {NULL, NULL};
  INVALID(devbuf_safetensors_write("/tmp/devbuf-null.safetensors", NULL, 0, &keyless, 1));
}

static void test_dlpack(devbuf_device_t *cpu) {
  size_t shape[1] = {4};
  devbuf_buffer_t *buffer = NULL, *out = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_FLOAT32, shape, 1, 0, &buffer));
  DLManagedTensorVersioned *versioned = NULL;
  DLManagedTensor *legacy = NULL;
  INVALID(devbuf_buffer_to_dlpack_versioned(NULL, 0, NULL));
  INVALID(devbuf_buffer_to_dlpack_versioned(NULL, 0, &versioned));
  INVALID(devbuf_buffer_to_dlpack_versioned(buffer, 0, NULL));
  INVALID(devbuf_buffer_to_dlpack(NULL, 0, NULL));
  INVALID(devbuf_buffer_to_dlpack(NULL, 0, &legacy));
  INVALID(devbuf_buffer_to_dlpack(buffer, 0, NULL));
  CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 0); // a refused export holds nothing
  INVALID(devbuf_buffer_from_dlpack_versioned(NULL, NULL));
  INVALID(devbuf_buffer_from_dlpack_versioned(NULL, &out));
  INVALID(devbuf_buffer_from_dlpack(NULL, NULL));
  INVALID(devbuf_buffer_from_dlpack(NULL, &out));
  CHECK_OK(devbuf_buffer_to_dlpack_versioned(buffer, 0, &versioned));
  INVALID(devbuf_buffer_from_dlpack_versioned(versioned, NULL)); // the tensor stays the caller's
  versioned->deleter(versioned);
  devbuf_buffer_release(buffer);
}

// `out_` parameters are written only on success (devbuf.h): a refused call leaves the
// caller's variable as it was, so a handle it held before is not lost.
#define UNTOUCHED(type, call_with_out)     \
  do {                                     \
    type out = (type)(uintptr_t)0x5e5e;    \
    CHECK(call_with_out != DEVBUF_OK);     \
    CHECK(out == (type)(uintptr_t)0x5e5e); \
  } while (0)

static void test_outputs_untouched_on_failure(devbuf_device_t *cpu) {
  size_t shape[1] = {4}, huge[2] = {SIZE_MAX / 2, 4};
  devbuf_allocator_t *allocator = devbuf_device_allocator(cpu);
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, shape, 1, 0, &buffer));
  UNTOUCHED(devbuf_device_t *, devbuf_device_open("no-such-device", &out));
  UNTOUCHED(devbuf_buffer_t *, devbuf_buffer_allocate(allocator, DEVBUF_FLOAT32, huge, 2, 0, &out));
  UNTOUCHED(devbuf_buffer_t *, devbuf_buffer_new(allocator, DEVBUF_FLOAT32, huge, 2, 0, &out));
  UNTOUCHED(devbuf_buffer_t *, devbuf_buffer_view(buffer, 8, 64, &out));
  UNTOUCHED(devbuf_buffer_t *, devbuf_buffer_view_as(buffer, 1, DEVBUF_FLOAT32, shape, 1, &out));
  UNTOUCHED(devbuf_buffer_t *, devbuf_buffer_reshape(buffer, DEVBUF_FLOAT64, shape, 1, &out));
  UNTOUCHED(devbuf_buffer_t *, devbuf_buffer_map_file(cpu, "/no/such/file", &out));
  UNTOUCHED(devbuf_program_t *, devbuf_program_build(cpu, "kernel", NULL, &out));
  UNTOUCHED(devbuf_tensor_file_t *, devbuf_safetensors_parse("short", 5, &out));
  UNTOUCHED(devbuf_tensor_file_t *, devbuf_safetensors_inspect("/no/such/file", &out));
  UNTOUCHED(devbuf_tensor_file_t *, devbuf_safetensors_load(cpu, "/no/such/file", NULL, &out));
  UNTOUCHED(devbuf_export_t *, devbuf_buffer_export(buffer, &out)); // not shareable memory
  UNTOUCHED(devbuf_export_t *, devbuf_export_receive(-1, &out));
  UNTOUCHED(DLManagedTensorVersioned *, devbuf_buffer_to_dlpack_versioned(buffer, ~0u, &out));
  UNTOUCHED(DLManagedTensor *, devbuf_buffer_to_dlpack(buffer, ~0u, &out));
  DLManagedTensorVersioned future = {.version = {99, 0}};
  UNTOUCHED(devbuf_buffer_t *, devbuf_buffer_from_dlpack_versioned(&future, &out));
  devbuf_buffer_release(buffer);
}

// RUN for the tests that take the device.
#define RUN_WITH(test, device)                                                   \
  do {                                                                           \
    check_current = #test;                                                       \
    int check_before_ = check_failures;                                          \
    test(device);                                                                \
    printf("%s %s\n", check_failures == check_before_ ? "ok  " : "FAIL", #test); \
  } while (0)

int main(void) {
  devbuf_device_t *cpu = NULL;
  if (devbuf_device_open("cpu", &cpu) != DEVBUF_OK) return 1;
  RUN(test_base);
  RUN_WITH(test_devices, cpu);
  RUN_WITH(test_allocator_calls, cpu);
  RUN_WITH(test_buffers, cpu);
  RUN_WITH(test_host_access, cpu);
  RUN_WITH(test_queues_and_events, cpu);
  RUN_WITH(test_files, cpu);
  RUN_WITH(test_dlpack, cpu);
  RUN_WITH(test_outputs_untouched_on_failure, cpu);
  devbuf_device_release(cpu);
  return CHECK_EXIT();
}
