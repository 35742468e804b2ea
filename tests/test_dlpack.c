// DLPack: exports describe the buffer exactly and hold their storage and host access until
// the deleter; imports are zero-copy, refuse what they cannot represent without taking
// ownership, and call the producer's deleter exactly once, on the last release.
#include "../src/interop/dlpack_abi.h"
#include "check.h"

static devbuf_device_t *device;
static devbuf_allocator_t *allocator;

static devbuf_buffer_t *counting_buffer(devbuf_dtype dtype, const size_t *shape, size_t ndim) {
  devbuf_buffer_t *buffer = NULL;
  if (devbuf_buffer_allocate(allocator, dtype, shape, ndim, 0, &buffer) != DEVBUF_OK) exit(1);
  unsigned char *bytes;
  size_t size;
  devbuf_buffer_contents_mut(buffer, (void **)&bytes, &size);
  for (size_t i = 0; i < size; i++) bytes[i] = (unsigned char)(i * 7 + dtype);
  devbuf_buffer_end_access(buffer, bytes);
  return buffer;
}

static devbuf_status add_one(const devbuf_kernel_args_t *args) {
  (void)args;
  return DEVBUF_OK;
}

static void test_export_describes_buffer(void) {
  size_t shape[2] = {2, 3};
  devbuf_buffer_t *buffer = counting_buffer(DEVBUF_FLOAT32, shape, 2);
  DLManagedTensorVersioned *tensor = NULL;
  CHECK_OK(devbuf_buffer_to_dlpack_versioned(buffer, 0, &tensor));
  if (!tensor) return;
  CHECK(tensor->version.major == 1 && tensor->version.minor >= 1);
  CHECK(tensor->flags == 0);
  const DLTensor *t = &tensor->dl_tensor;
  CHECK(t->device.device_type == DEVBUF_DL_CPU && t->device.device_id == 0);
  CHECK(t->dtype.code == DEVBUF_DL_FLOAT && t->dtype.bits == 32 && t->dtype.lanes == 1);
  CHECK(t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->strides[0] == 3 &&
        t->strides[1] == 1);
  uint64_t address;
  devbuf_buffer_device_ptr(buffer, &address);
  CHECK((uintptr_t)t->data + t->byte_offset == address);
  // The consumer holds a write access: racing work is refused until the deleter runs.
  devbuf_queue_t *queue;
  CHECK_OK(devbuf_queue_create(device, &queue));
  devbuf_use_t use = {buffer, DEVBUF_ACCESS_WRITE};
  CHECK_STATUS(devbuf_queue_submit(queue, add_one, &use, 1, NULL, 0), DEVBUF_HOST_ACCESS_OPEN);
  CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 1);
  // The export keeps the storage alive after the caller lets go.
  devbuf_buffer_release(buffer);
  float *values = (float *)((char *)t->data + t->byte_offset);
  values[5] = 42.0f;
  tensor->deleter(tensor);

  // A view: the byte offset is the view's, and the shape is the view's.
  buffer = counting_buffer(DEVBUF_INT16, (size_t[]){64}, 1);
  devbuf_buffer_t *view;
  CHECK_OK(devbuf_buffer_view(buffer, 32, 16, &view));
  CHECK_OK(devbuf_buffer_to_dlpack_versioned(view, DEVBUF_DLPACK_READ_ONLY, &tensor));
  CHECK(tensor->dl_tensor.byte_offset == 32 && tensor->dl_tensor.shape[0] == 8);
  CHECK(tensor->flags & DEVBUF_DL_FLAG_READ_ONLY);
  // A read-only export lets reading work run, refuses writing work.
  devbuf_use_t read = {view, DEVBUF_ACCESS_READ}, write = {view, DEVBUF_ACCESS_WRITE};
  CHECK_OK(devbuf_queue_submit(queue, add_one, &read, 1, NULL, 0));
  CHECK_STATUS(devbuf_queue_submit(queue, add_one, &write, 1, NULL, 0), DEVBUF_HOST_ACCESS_OPEN);
  CHECK_OK(devbuf_queue_finish(queue));
  tensor->deleter(tensor);
  CHECK_EQ_U(devbuf_buffer_open_accesses(view), 0);
  CHECK_OK(devbuf_queue_submit(queue, add_one, &write, 1, NULL, 0));
  CHECK_OK(devbuf_queue_finish(queue));
  devbuf_queue_release(queue);

  // Legacy tensors have no flags; mapped files export read-only.
  DLManagedTensor *legacy = NULL;
  CHECK_OK(devbuf_buffer_to_dlpack(view, 0, &legacy));
  CHECK(legacy && legacy->dl_tensor.byte_offset == 32 &&
        legacy->dl_tensor.dtype.code == DEVBUF_DL_INT);
  legacy->deleter(legacy);
  devbuf_buffer_t *mapped = NULL;
  CHECK_OK(devbuf_buffer_map_file(
      device, test_data("safetensors/safetensors-cpp/model.safetensors"), &mapped));
  if (!mapped) { // nothing below can run without the file
    devbuf_buffer_release(view);
    devbuf_buffer_release(buffer);
    return;
  }
  CHECK_OK(devbuf_buffer_to_dlpack_versioned(mapped, 0, &tensor));
  CHECK(tensor->flags & DEVBUF_DL_FLAG_READ_ONLY);
  tensor->deleter(tensor);
  legacy = NULL;
  CHECK_STATUS(devbuf_buffer_to_dlpack(mapped, 0, &legacy),
               DEVBUF_READ_ONLY); // it could not say so
  CHECK(legacy == NULL);
  CHECK_STATUS(devbuf_buffer_to_dlpack_versioned(mapped, 1u << 5, &tensor),
               DEVBUF_INVALID_ARGUMENT);
  devbuf_buffer_release(mapped);
  devbuf_buffer_release(view);
  devbuf_buffer_release(buffer);
}

// A producer's tensor over host memory, counting its deleter calls.
typedef struct producer {
  DLManagedTensorVersioned versioned;
  DLManagedTensor legacy;
  int64_t shape[4], strides[4];
  unsigned char bytes[256];
  int deleted;
} producer;

static void producer_delete(DLManagedTensorVersioned *tensor) {
  ((producer *)tensor->manager_ctx)->deleted++;
}
static void producer_delete_legacy(DLManagedTensor *tensor) {
  ((producer *)tensor->manager_ctx)->deleted++;
}

static void producer_init(producer *p) {
  memset(p, 0, sizeof *p);
  for (int i = 0; i < 256; i++) p->bytes[i] = (unsigned char)(255 - i);
  p->shape[0] = 4, p->shape[1] = 8;
  p->strides[0] = 8, p->strides[1] = 1;
  DLTensor t = {.data = p->bytes,
                .device = {DEVBUF_DL_CPU, 0},
                .ndim = 2,
                .dtype = {DEVBUF_DL_UINT, 32, 1},
                .shape = p->shape,
                .strides = p->strides,
                .byte_offset = 64};
  p->versioned = (DLManagedTensorVersioned){{1, 1}, p, producer_delete, 0, t};
  p->legacy = (DLManagedTensor){t, p, producer_delete_legacy};
}

static void test_import_zero_copy(void) {
  producer p;
  producer_init(&p);
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer));
  if (!buffer) return;
  CHECK(devbuf_buffer_dtype(buffer) == DEVBUF_UINT32 && devbuf_buffer_ndim(buffer) == 2);
  CHECK_EQ_U(devbuf_buffer_size(buffer), 128);
  CHECK(devbuf_buffer_allocator(buffer) == NULL && !devbuf_buffer_is_read_only(buffer));
  const void *data;
  CHECK_OK(devbuf_buffer_contents(buffer, &data, NULL));
  CHECK(data == p.bytes + 64); // zero-copy
  devbuf_buffer_end_access(buffer, data);
  CHECK_OK(devbuf_buffer_copyin(buffer, p.bytes, 128)); // writes land in the producer's memory
  CHECK(memcmp(p.bytes + 64, p.bytes, 64) == 0);
  devbuf_buffer_t *view;
  CHECK_OK(devbuf_buffer_view(buffer, 16, 16, &view));
  devbuf_buffer_release(buffer);
  CHECK_EQ_U(p.deleted, 0); // the view still uses it
  devbuf_buffer_release(view);
  CHECK_EQ_U(p.deleted, 1);

  // Read-only producers give read-only buffers; legacy tensors are imported too.
  producer_init(&p);
  p.versioned.flags = DEVBUF_DL_FLAG_READ_ONLY;
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer));
  CHECK(devbuf_buffer_is_read_only(buffer));
  void *write;
  CHECK_STATUS(devbuf_buffer_contents_mut(buffer, &write, NULL), DEVBUF_READ_ONLY);
  devbuf_buffer_release(buffer);
  CHECK_OK(devbuf_buffer_from_dlpack(&p.legacy, &buffer));
  CHECK_EQ_U(devbuf_buffer_size(buffer), 128);
  devbuf_buffer_release(buffer);
  CHECK_EQ_U(p.deleted, 2);

  // Strides may be NULL, and anything on dimensions of size 1 or in empty tensors.
  producer_init(&p);
  p.versioned.dl_tensor.strides = NULL;
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer));
  devbuf_buffer_release(buffer);
  p.shape[0] = 1, p.strides[0] = 12345;
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer));
  devbuf_buffer_release(buffer);
  p.shape[0] = 0, p.strides[1] = 3;
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer));
  CHECK_EQ_U(devbuf_buffer_size(buffer), 0);
  devbuf_buffer_release(buffer);
  CHECK_EQ_U(p.deleted, 3);
}

// Each refusal names the field; the deleter is never called on a refused tensor.
static void test_import_refusals(void) {
  producer p;
  devbuf_buffer_t *buffer = NULL;
#define REFUSED(change, status, phrase)                                               \
  do {                                                                                \
    producer_init(&p);                                                                \
    change;                                                                           \
    CHECK_STATUS(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer), status); \
    CHECK_MESSAGE(phrase);                                                            \
    CHECK(buffer == NULL && p.deleted == 0);                                          \
  } while (0)
  REFUSED(p.versioned.version.major = 2, DEVBUF_UNSUPPORTED, "DLPack version 2.");
  REFUSED(p.versioned.flags = DEVBUF_DL_FLAG_SUBBYTE_PADDED, DEVBUF_UNSUPPORTED, "padded");
  REFUSED(p.versioned.dl_tensor.dtype.lanes = 4, DEVBUF_UNSUPPORTED, "4 lanes");
  REFUSED(p.versioned.dl_tensor.dtype.bits = 24, DEVBUF_UNSUPPORTED, "code 1 with 24 bits");
  REFUSED(p.versioned.dl_tensor.dtype.code = 3, DEVBUF_UNSUPPORTED, "code 3");
  REFUSED(p.strides[0] = 16, DEVBUF_UNSUPPORTED, "strides[0] is 16");
  REFUSED(p.strides[1] = -1, DEVBUF_UNSUPPORTED, "strides[1] is -1");
  REFUSED(p.shape[1] = -8, DEVBUF_INVALID_ARGUMENT, "shape[1] is -8");
  REFUSED(p.versioned.dl_tensor.ndim = 33, DEVBUF_UNSUPPORTED, "ndim 33");
  REFUSED(p.versioned.dl_tensor.ndim = -1, DEVBUF_UNSUPPORTED, "ndim -1");
  REFUSED(p.versioned.dl_tensor.shape = NULL, DEVBUF_INVALID_ARGUMENT, "without a shape");
  REFUSED(p.versioned.dl_tensor.data = NULL, DEVBUF_INVALID_ARGUMENT, "data is NULL");
  REFUSED(p.versioned.dl_tensor.device.device_type = 7, DEVBUF_UNSUPPORTED, "device type 7");
  REFUSED(p.versioned.dl_tensor.device.device_id = 3, DEVBUF_UNSUPPORTED, "no device 3");
  REFUSED(p.versioned.dl_tensor.byte_offset = UINT64_MAX - 8, DEVBUF_OVERFLOW, "overflows");
  REFUSED((p.shape[0] = INT64_MAX, p.shape[1] = 4), DEVBUF_OVERFLOW, "");
  REFUSED(p.versioned.dl_tensor.device.device_type = DEVBUF_DL_CUDA, DEVBUF_UNAVAILABLE, "cuda");
  // Managed memory is a CUDA device's: opening cuda:0 is what fails here.
  REFUSED(p.versioned.dl_tensor.device.device_type = DEVBUF_DL_CUDA_MANAGED, DEVBUF_UNAVAILABLE,
          "cuda");
  // uint32 elements at an address off their alignment: as_array would give a misaligned pointer.
  REFUSED(p.versioned.dl_tensor.byte_offset = 65, DEVBUF_INVALID_ARGUMENT,
          "+ byte_offset 65 is not aligned to the 4 bytes of a uint32 element");
  REFUSED((p.versioned.dl_tensor.dtype = (DLDataType){DEVBUF_DL_COMPLEX, 64, 1},
           p.versioned.dl_tensor.byte_offset = 66),
          DEVBUF_INVALID_ARGUMENT, "not aligned to the 4 bytes of a complex64 element");
#undef REFUSED
  // complex64 is aligned as its parts are (C's float _Complex, numpy's complex64): at 4 mod 8.
  producer_init(&p);
  p.versioned.dl_tensor.dtype = (DLDataType){DEVBUF_DL_COMPLEX, 64, 1};
  p.versioned.dl_tensor.byte_offset = 68;
  p.shape[1] = 4, p.strides[0] = 4;
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer));
  devbuf_buffer_release(buffer);
  CHECK_EQ_U(p.deleted, 1);
  // What counts on the host is the address: a data pointer off by one that the byte offset
  // brings back is aligned.
  producer_init(&p);
  p.versioned.dl_tensor.data = p.bytes + 1;
  p.versioned.dl_tensor.byte_offset = 63;
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer));
  devbuf_buffer_release(buffer);
  CHECK_EQ_U(p.deleted, 1);
  // Pinned host memory of any GPU (kDLCUDAHost, device 1) is host memory: the CPU's.
  producer_init(&p);
  p.versioned.dl_tensor.device = (DLDevice){DEVBUF_DL_CUDA_HOST, 1};
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer));
  CHECK(strcmp(devbuf_device_spec(devbuf_buffer_device(buffer)), "cpu") == 0);
  devbuf_buffer_release(buffer);
  CHECK_EQ_U(p.deleted, 1);
  // The largest extent that fits the signed types is taken as the producer claims it ...
  producer_init(&p);
  p.versioned.dl_tensor.dtype = (DLDataType){DEVBUF_DL_UINT, 8, 1};
  p.shape[0] = 2, p.shape[1] = INT64_C(1) << 61;
  p.strides[0] = INT64_C(1) << 61, p.strides[1] = 1;
  CHECK_OK(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer));
  devbuf_array_t array;
  CHECK_OK(devbuf_buffer_as_array(buffer, DEVBUF_UINT8, &array)); // strides fit int64_t
  CHECK(array.strides[0] == INT64_C(1) << 61 && array.strides[1] == 1);
  CHECK_OK(devbuf_buffer_end_access(buffer, array.data));
  devbuf_buffer_release(buffer);
  CHECK_EQ_U(p.deleted, 1);
  // ... one that does not (2^63 bytes, with or without a byte offset) is refused.
  producer_init(&p);
  p.versioned.dl_tensor.dtype = (DLDataType){DEVBUF_DL_UINT, 8, 1};
  p.versioned.dl_tensor.ndim = 3;
  int64_t huge_shape[3] = {1, INT64_C(1) << 62, 2};
  p.versioned.dl_tensor.shape = huge_shape;
  p.versioned.dl_tensor.strides = NULL;
  buffer = NULL;
  CHECK_STATUS(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer), DEVBUF_OVERFLOW);
  CHECK_MESSAGE("exceeds INT64_MAX");
  CHECK(buffer == NULL && p.deleted == 0);
  producer_init(&p);
  p.versioned.dl_tensor.dtype = (DLDataType){DEVBUF_DL_UINT, 8, 1};
  p.shape[0] = 2, p.shape[1] = INT64_C(1) << 61;
  p.strides[0] = INT64_C(1) << 61, p.strides[1] = 1;
  p.versioned.dl_tensor.byte_offset = (UINT64_C(1) << 62) + 64;
  buffer = NULL;
  CHECK_STATUS(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer), DEVBUF_OVERFLOW);
  CHECK(buffer == NULL && p.deleted == 0);
  producer_init(&p);
  p.versioned.dl_tensor.dtype = (DLDataType){DEVBUF_DL_UINT, 8, 1};
  p.shape[0] = 2, p.shape[1] = INT64_C(1) << 61;
  p.strides[0] = INT64_MIN, p.strides[1] = 1;
  buffer = NULL;
  CHECK_STATUS(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer), DEVBUF_UNSUPPORTED);
  p.versioned.version.major = 9;
  buffer = (devbuf_buffer_t *)&p; // what the caller held: a refusal leaves it (devbuf.h)
  CHECK_STATUS(devbuf_buffer_from_dlpack_versioned(&p.versioned, &buffer), DEVBUF_UNSUPPORTED);
  CHECK(buffer == (devbuf_buffer_t *)&p && p.deleted == 0);
  CHECK_STATUS(devbuf_buffer_from_dlpack_versioned(NULL, &buffer), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_buffer_from_dlpack(NULL, &buffer), DEVBUF_INVALID_ARGUMENT);
  CHECK(buffer == (devbuf_buffer_t *)&p);
}

// devbuf to devbuf through both structures, every dtype: bit-exact, and the export's
// access and storage go when the importer's buffer goes.
static void test_round_trip_every_dtype(void) {
  for (int d = 0; d < DEVBUF_DTYPE_COUNT; d++) {
    size_t shape[3] = {2, 3, 4};
    devbuf_buffer_t *source = counting_buffer((devbuf_dtype)d, shape, 3);
    for (int legacy = 0; legacy < 2; legacy++) {
      devbuf_buffer_t *imported = NULL;
      if (legacy) {
        DLManagedTensor *tensor = NULL;
        // A legacy tensor looks writable: a read access under it would let a consumer's
        // writes race with reading work.
        CHECK_STATUS(devbuf_buffer_to_dlpack(source, DEVBUF_DLPACK_READ_ONLY, &tensor),
                     DEVBUF_INVALID_ARGUMENT);
        CHECK_MESSAGE("cannot carry the flag");
        CHECK(tensor == NULL && devbuf_buffer_open_accesses(source) == 0);
        CHECK_OK(devbuf_buffer_to_dlpack(source, 0, &tensor));
        CHECK_OK(devbuf_buffer_from_dlpack(tensor, &imported));
      } else {
        DLManagedTensorVersioned *tensor = NULL;
        CHECK_OK(devbuf_buffer_to_dlpack_versioned(source, DEVBUF_DLPACK_READ_ONLY, &tensor));
        CHECK_OK(devbuf_buffer_from_dlpack_versioned(tensor, &imported));
        CHECK(devbuf_buffer_is_read_only(imported));
      }
      CHECK(imported && devbuf_buffer_dtype(imported) == (devbuf_dtype)d);
      CHECK_EQ_U(devbuf_buffer_size(imported), devbuf_buffer_size(source));
      const void *a, *b;
      size_t size;
      CHECK_OK(devbuf_buffer_contents(source, &a, &size));
      CHECK_OK(devbuf_buffer_contents(imported, &b, NULL));
      CHECK(a == b); // the same memory
      devbuf_buffer_end_access(source, a);
      devbuf_buffer_end_access(imported, b);
      CHECK_EQ_U(devbuf_buffer_open_accesses(source), 1); // the export's access
      devbuf_buffer_release(imported);
      CHECK_EQ_U(devbuf_buffer_open_accesses(source), 0);
    }
    devbuf_buffer_release(source);
  }
  devbuf_allocator_stats_t stats = stats_of(allocator);
  CHECK_EQ_U(stats.active, 0);
}

int main(void) {
  test_require_data();
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) return 1;
  allocator = devbuf_device_allocator(device);
  RUN(test_export_describes_buffer);
  RUN(test_import_zero_copy);
  RUN(test_import_refusals);
  RUN(test_round_trip_every_dtype);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
