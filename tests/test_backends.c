// The registry of backends: every kind the build has, by number and name; each backend's
// table whole (and the check that says so, shown a table with gaps); and the null backend,
// which is a folder and a registry entry, doing what it declares and refusing the rest.
#include "../src/backend/backend.h"
#include "check.h"

static void test_kinds(void) {
  size_t count = devbuf_device_kind_count();
  CHECK(count >= 4); // the tests' build has the null backend too
  CHECK(strcmp(devbuf_device_kind_name(DEVBUF_DEVICE_CPU), "cpu") == 0);
  CHECK(strcmp(devbuf_device_kind_name(DEVBUF_DEVICE_OPENCL), "opencl") == 0);
  CHECK(strcmp(devbuf_device_kind_name(DEVBUF_DEVICE_CUDA), "cuda") == 0);
  CHECK(devbuf_device_kind_name((devbuf_device_kind)0) == NULL);
  CHECK(devbuf_device_kind_name((devbuf_device_kind)(count + 1)) == NULL);
  size_t nulls = 0;
  for (size_t kind = 1; kind <= count; kind++) {
    const char *name = devbuf_device_kind_name((devbuf_device_kind)kind);
    CHECK(name && strlen(name) > 0);
    nulls += strcmp(name, "null") == 0;
    const devbuf__backend_entry *entry = devbuf__backend_of_kind((devbuf_device_kind)kind);
    CHECK(entry && devbuf__backend_named(name, strlen(name)) == entry);
    char why[160] = "";
    CHECK(devbuf__backend_table_check(name, entry->backend, why, sizeof why));
    if (why[0]) fprintf(stderr, "%s\n", why);
  }
  CHECK_EQ_U(nulls, 1);
  // A spec of no kind names every kind there is.
  devbuf_device_t *device = NULL;
  CHECK_STATUS(devbuf_device_open("tpu:0", &device), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("expected cpu, opencl:N, cuda:N, null");
}

// The check refuses a table that fills part of a group, lacks a required entry, has what
// needs an enqueue without one, or declares no DLPack type; its message names the gap.
static void test_table_check(void) {
  char why[160];
  devbuf__backend table = devbuf__backend_cpu;
  table.raw_unmap = NULL;
  CHECK(!devbuf__backend_table_check("broken", &table, why, sizeof why));
  CHECK(strstr(why, "backend broken sets part of its address-space entries but not raw_unmap"));
  table = devbuf__backend_null;
  table.zero = NULL;
  CHECK(!devbuf__backend_table_check("broken", &table, why, sizeof why));
  CHECK(strstr(why, "has no zero, which every backend must have"));
  table = devbuf__backend_null;
  table.enqueue = NULL;
  table.runs_c_kernels = true;
  CHECK(!devbuf__backend_table_check("broken", &table, why, sizeof why));
  CHECK(strstr(why, "has runs_c_kernels but no enqueue"));
  table = devbuf__backend_null;
  table.dlpack_device_type = 0;
  CHECK(!devbuf__backend_table_check("broken", &table, why, sizeof why));
  CHECK(strstr(why, "declares no DLPack device type"));
  table = devbuf__backend_null;
  table.enqueue = NULL; // no queues at all is a whole table
  CHECK(devbuf__backend_table_check("queueless", &table, why, sizeof why));
}

static devbuf_status noop_kernel(const devbuf_kernel_args_t *args) {
  (void)args;
  return DEVBUF_OK;
}

static void test_null_device(void) {
  devbuf_device_t *device = NULL, *again = NULL;
  CHECK_OK(devbuf_device_open("null", &device));
  CHECK_OK(devbuf_device_open("null:0", &again));
  CHECK(device == again);
  devbuf_device_release(again);
  CHECK_STATUS(devbuf_device_open("null:1", &again), DEVBUF_UNAVAILABLE);
  CHECK_MESSAGE("null:1 does not exist");
  CHECK(strcmp(devbuf_device_spec(device), "null") == 0);
  CHECK(strcmp(devbuf_device_kind_name(devbuf_device_kind_of(device)), "null") == 0);
  CHECK(devbuf_device_dlpack_type(device) == 1); // host memory: kDLCPU
  devbuf_device_info_t info;
  CHECK_OK(devbuf_device_info(device, &info));
  CHECK_EQ_U(info.capabilities, DEVBUF_CAN_QUEUE);
  CHECK(info.host_unified);
  CHECK(devbuf_device_allocator_for(device, DEVBUF_MEMORY_SHAREABLE) == NULL);

  // Host memory the CPU reads, filled and copied by the queue.
  devbuf_allocator_t *allocator = devbuf_device_allocator(device);
  size_t size = 1000;
  devbuf_buffer_t *a = NULL, *b = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, 0, &a));
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &size, 1, DEVBUF_BUFFER_ZERO, &b));
  devbuf_queue_t *queue = NULL;
  CHECK_OK(devbuf_queue_create(device, &queue));
  unsigned char odd[3] = {7, 8, 9};
  CHECK_STATUS(devbuf_queue_fill(queue, a, odd, 3), DEVBUF_SIZE_MISMATCH); // 1000 % 3
  devbuf_buffer_t *head = NULL;
  CHECK_OK(devbuf_buffer_view(a, 0, 999, &head));
  CHECK_OK(devbuf_queue_fill(queue, head, odd, 3));
  CHECK_OK(devbuf_queue_copy(queue, b, a));
  CHECK_OK(devbuf_queue_finish(queue));
  const void *data = NULL;
  size_t got = 0;
  CHECK_OK(devbuf_buffer_contents(b, &data, &got));
  const unsigned char *bytes = data;
  CHECK(got == 1000 && bytes[0] == 7 && bytes[1] == 8 && bytes[998] == 9);
  devbuf_buffer_end_access(b, data);

  // Kernels are refused: C kernels, programs; and so is sharing memory.
  devbuf_use_t use = {a, DEVBUF_ACCESS_READ_WRITE};
  CHECK_STATUS(devbuf_queue_submit(queue, noop_kernel, &use, 1, NULL, 0), DEVBUF_UNSUPPORTED);
  CHECK_MESSAGE("null runs no kernels");
  devbuf_program_t *program = NULL;
  CHECK_STATUS(devbuf_program_build(device, "kernel void k() {}", NULL, &program),
               DEVBUF_UNSUPPORTED);
  devbuf_export_t *shared = NULL;
  CHECK_STATUS(devbuf_buffer_export(a, &shared), DEVBUF_UNSUPPORTED);
  devbuf_queue_release(queue);
  devbuf_buffer_release(head);
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
  devbuf_device_release(device);
}

int main(void) {
  RUN(test_kinds);
  RUN(test_table_check);
  RUN(test_null_device);
  return CHECK_EXIT();
}
