// Buffers: what morok-device's and nuvec-gpu's `Buffer` do (lazy, views, ids, reuse,
// zero-init), typed access, item, copies (overlapping views), host access rules, describe,
// and every error path.
#include "check.h"

#include <stdint.h>

static test_allocators t;

static devbuf_buffer_t *make(devbuf_dtype dtype, const size_t *shape, size_t ndim, uint32_t flags) {
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(devbuf_buffer_new(t.caching, dtype, shape, ndim, flags, &buffer));
  return buffer;
}

static void test_new_is_lazy_and_sized(void) {
  size_t shape[] = {2, 3, 4};
  devbuf_buffer_t *buffer = make(DEVBUF_FLOAT32, shape, 3, 0);
  CHECK(!devbuf_buffer_is_allocated(buffer));
  CHECK_EQ_U(devbuf_buffer_size(buffer), 96);
  CHECK_EQ_U(devbuf_buffer_offset(buffer), 0);
  CHECK_EQ_U(devbuf_buffer_count(buffer), 24);
  CHECK_EQ_U(devbuf_buffer_ndim(buffer), 3);
  CHECK_EQ_U(devbuf_buffer_shape(buffer)[2], 4);
  CHECK(devbuf_buffer_dtype(buffer) == DEVBUF_FLOAT32);
  CHECK(devbuf_buffer_allocator(buffer) == t.caching);
  CHECK(!devbuf_buffer_is_empty(buffer));
  CHECK(!devbuf_buffer_in_use(buffer));
  uint64_t address;
  CHECK_STATUS(devbuf_buffer_device_ptr(buffer, &address), DEVBUF_NOT_ALLOCATED);
  CHECK_MESSAGE("no memory yet");
  CHECK(!devbuf_buffer_is_allocated(buffer)); // asking for the pointer allocated nothing
  CHECK_OK(devbuf_buffer_ensure_allocated(buffer));
  CHECK_OK(devbuf_buffer_device_ptr(buffer, &address));
  CHECK(address != 0 && address % 64 == 0);
  devbuf_buffer_release(buffer);
  // Scalars: ndim 0 holds one element.
  devbuf_buffer_t *scalar = make(DEVBUF_INT64, NULL, 0, 0);
  CHECK_EQ_U(devbuf_buffer_size(scalar), 8);
  CHECK_EQ_U(devbuf_buffer_count(scalar), 1);
  devbuf_buffer_release(scalar);
}

static void test_creation_errors(void) {
  devbuf_buffer_t *buffer = NULL;
  size_t huge[] = {SIZE_MAX / 2, 4};
  CHECK_STATUS(devbuf_buffer_new(t.caching, DEVBUF_UINT8, huge, 2, 0, &buffer), DEVBUF_OVERFLOW);
  CHECK_MESSAGE("dimension 1");
  size_t big[] = {SIZE_MAX / 4 + 1};
  CHECK_STATUS(devbuf_buffer_new(t.caching, DEVBUF_FLOAT32, big, 1, 0, &buffer), DEVBUF_OVERFLOW);
  // An extent of 0 empties a shape but not its strides: judged alike in any order.
  size_t empty_first[] = {0, SIZE_MAX, SIZE_MAX}, empty_last[] = {SIZE_MAX, SIZE_MAX, 0};
  CHECK_STATUS(devbuf_buffer_new(t.caching, DEVBUF_UINT8, empty_first, 3, 0, &buffer),
               DEVBUF_OVERFLOW);
  CHECK_STATUS(devbuf_buffer_new(t.caching, DEVBUF_UINT8, empty_last, 3, 0, &buffer),
               DEVBUF_OVERFLOW);
  size_t wide_empty[] = {(size_t)1 << 61, 0, 2};
  CHECK_STATUS(devbuf_buffer_new(t.caching, DEVBUF_FLOAT32, wide_empty, 3, 0, &buffer),
               DEVBUF_OVERFLOW);
  CHECK_MESSAGE("in its strides (it has an extent of 0)");
  size_t fits_empty[] = {(size_t)1 << 40, 0, (size_t)1 << 20};
  CHECK_OK(devbuf_buffer_new(t.caching, DEVBUF_FLOAT32, fits_empty, 3, 0, &buffer));
  CHECK_EQ_U(devbuf_buffer_size(buffer), 0);
  devbuf_buffer_release(buffer);
  buffer = NULL;
  size_t odd[] = {3};
  CHECK_STATUS(devbuf_buffer_new(t.caching, DEVBUF_FLOAT4_E2M1, odd, 1, 0, &buffer),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("whole number of bytes");
  size_t many[DEVBUF_MAX_NDIM + 1];
  for (size_t i = 0; i < DEVBUF_MAX_NDIM + 1; i++) many[i] = 1;
  CHECK_STATUS(devbuf_buffer_new(t.caching, DEVBUF_UINT8, many, DEVBUF_MAX_NDIM + 1, 0, &buffer),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_buffer_new(t.caching, DEVBUF_DTYPE_COUNT, odd, 1, 0, &buffer),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_buffer_new(t.caching, DEVBUF_UINT8, odd, 1, 0x80, &buffer),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_buffer_new(NULL, DEVBUF_UINT8, odd, 1, 0, &buffer), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_buffer_new(t.caching, DEVBUF_UINT8, NULL, 1, 0, &buffer),
               DEVBUF_INVALID_ARGUMENT);
  CHECK(buffer == NULL);
  // An allocation the allocator refuses fails devbuf_buffer_allocate cleanly.
  size_t too_big[] = {(size_t)1 << 60};
  CHECK_STATUS(devbuf_buffer_allocate(t.caching, DEVBUF_UINT8, too_big, 1, 0, &buffer),
               DEVBUF_OUT_OF_MEMORY);
  CHECK(buffer == NULL);
}

static void test_views(void) {
  size_t shape[] = {10};
  devbuf_buffer_t *buffer = make(DEVBUF_FLOAT32, shape, 1, 0); // 40 bytes
  devbuf_buffer_t *view = NULL, *inner = NULL, *bad = NULL;
  CHECK_OK(devbuf_buffer_view(buffer, 4, 16, &view)); // taken before allocation
  CHECK_EQ_U(devbuf_buffer_offset(view), 4);
  CHECK_EQ_U(devbuf_buffer_size(view), 16);
  CHECK_EQ_U(devbuf_buffer_shape(view)[0], 4);
  CHECK(devbuf_buffer_storage_id(view) == devbuf_buffer_storage_id(buffer));
  CHECK(devbuf_buffer_handle_id(view) != devbuf_buffer_handle_id(buffer));
  CHECK_STATUS(devbuf_buffer_view(buffer, 36, 16, &bad), DEVBUF_OUT_OF_RANGE);
  CHECK_MESSAGE("offset 36, size 16");
  CHECK_STATUS(devbuf_buffer_view(buffer, SIZE_MAX, 2, &bad), DEVBUF_OUT_OF_RANGE);
  CHECK_STATUS(devbuf_buffer_view(buffer, 2, SIZE_MAX - 1, &bad), DEVBUF_OUT_OF_RANGE);
  CHECK_STATUS(devbuf_buffer_view(buffer, 2, 8, &bad), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("whole number of float32");
  CHECK_STATUS(devbuf_buffer_view(buffer, 4, 6, &bad), DEVBUF_INVALID_ARGUMENT);
  CHECK(bad == NULL);
  // Composition: a view of a view is relative to it, bounded by it.
  CHECK_OK(devbuf_buffer_view(view, 8, 8, &inner));
  CHECK_EQ_U(devbuf_buffer_offset(inner), 12);
  CHECK_STATUS(devbuf_buffer_view(view, 8, 12, &bad), DEVBUF_OUT_OF_RANGE);
  // Views keep the storage alive; one allocation serves all.
  float values[10];
  for (int i = 0; i < 10; i++) values[i] = (float)i;
  CHECK_OK(devbuf_buffer_copyin(buffer, values, sizeof values));
  devbuf_buffer_release(buffer);
  devbuf_buffer_release(view);
  float got[2] = {0};
  CHECK_OK(devbuf_buffer_copyout(inner, got, sizeof got));
  CHECK(got[0] == 3.0f && got[1] == 4.0f);
  CHECK_EQ_U(stats_of(t.caching).live_buffers, 1);
  devbuf_buffer_release(inner); // the storage goes back exactly once
  CHECK_EQ_U(stats_of(t.caching).live_buffers, 0);
  CHECK_EQ_U(stats_of(t.caching).active, 0);
  // Sub-byte dtypes: whole elements and whole bytes.
  size_t nibbles[] = {8};
  devbuf_buffer_t *f4 = make(DEVBUF_FLOAT4_E2M1, nibbles, 1, 0); // 4 bytes
  CHECK_OK(devbuf_buffer_view(f4, 1, 2, &view));
  CHECK_EQ_U(devbuf_buffer_shape(view)[0], 4);
  devbuf_buffer_release(view);
  devbuf_buffer_release(f4);
  size_t sixes[] = {8};
  devbuf_buffer_t *f6 = make(DEVBUF_FLOAT6_E2M3, sixes, 1, 0); // 6 bytes, 4 elements per 3
  CHECK_OK(devbuf_buffer_view(f6, 3, 3, &view));
  CHECK_EQ_U(devbuf_buffer_shape(view)[0], 4);
  devbuf_buffer_release(view);
  CHECK_STATUS(devbuf_buffer_view(f6, 1, 3, &bad), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_buffer_view(f6, 0, 2, &bad), DEVBUF_INVALID_ARGUMENT);
  devbuf_buffer_release(f6);
}

static void test_reshape(void) {
  size_t shape[] = {4, 4};
  devbuf_buffer_t *buffer = make(DEVBUF_FLOAT32, shape, 2, 0), *other = NULL;
  size_t as_bytes[] = {64};
  CHECK_OK(devbuf_buffer_reshape(buffer, DEVBUF_UINT8, as_bytes, 1, &other));
  CHECK(devbuf_buffer_storage_id(other) == devbuf_buffer_storage_id(buffer));
  devbuf_buffer_release(other);
  other = NULL;
  size_t wrong[] = {10};
  CHECK_STATUS(devbuf_buffer_reshape(buffer, DEVBUF_FLOAT32, wrong, 1, &other),
               DEVBUF_SIZE_MISMATCH);
  CHECK(other == NULL);
  devbuf_buffer_release(buffer);
}

// A typed view of part of a byte buffer in one call: its bytes, dtype and shape.
static void test_view_as(void) {
  size_t bytes[] = {4096 + 6 * 4 + 4};
  devbuf_buffer_t *raw = make(DEVBUF_UINT8, bytes, 1, 0), *outer = NULL, *matrix = NULL,
                  *bad = NULL;
  float values[6] = {1, 2, 3, 4, 5, 6};
  CHECK_OK(devbuf_buffer_view(raw, 4, 4096 + 24, &outer)); // views of views add offsets
  devbuf_buffer_t *place = NULL;
  CHECK_OK(devbuf_buffer_view(outer, 4096, 24, &place));
  CHECK_OK(devbuf_buffer_copyin(place, values, sizeof values));
  devbuf_buffer_release(place);
  size_t shape[] = {2, 3};
  CHECK_OK(devbuf_buffer_view_as(outer, 4096, DEVBUF_FLOAT32, shape, 2, &matrix));
  CHECK(devbuf_buffer_dtype(matrix) == DEVBUF_FLOAT32);
  CHECK_EQ_U(devbuf_buffer_ndim(matrix), 2);
  CHECK_EQ_U(devbuf_buffer_shape(matrix)[0], 2);
  CHECK_EQ_U(devbuf_buffer_shape(matrix)[1], 3);
  CHECK_EQ_U(devbuf_buffer_size(matrix), 24);
  CHECK(devbuf_buffer_storage_id(matrix) == devbuf_buffer_storage_id(raw));
  float got[6] = {0};
  CHECK_OK(devbuf_buffer_copyout(matrix, got, sizeof got));
  CHECK(memcmp(got, values, sizeof got) == 0);
  devbuf_buffer_release(matrix);
  size_t too_big[] = {2, 4};
  CHECK_STATUS(devbuf_buffer_view_as(outer, 4096, DEVBUF_FLOAT32, too_big, 2, &bad),
               DEVBUF_OUT_OF_RANGE);
  CHECK_MESSAGE("view_as(offset 4096, 32 bytes of float32) does not fit a 4120-byte buffer");
  // Whole elements of the view are not enough: the elements' place in the memory must be
  // aligned for them, or as_array would hand out a misaligned float pointer.
  devbuf_buffer_t *odd = NULL;
  CHECK_OK(devbuf_buffer_view(raw, 2, 4096 + 24, &odd));
  CHECK_STATUS(devbuf_buffer_view_as(odd, 4096, DEVBUF_FLOAT32, shape, 2, &bad),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("view_as puts float32 elements at byte 4098 of their memory, not a multiple of "
                "their 4-byte alignment");
  CHECK(bad == NULL);
  devbuf_buffer_t *odd_bytes = NULL;
  CHECK_OK(devbuf_buffer_view(odd, 4096, 24, &odd_bytes));
  CHECK_STATUS(devbuf_buffer_reshape(odd_bytes, DEVBUF_FLOAT32, shape, 2, &bad),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("reshape puts float32 elements at byte 4098");
  size_t as_bytes[] = {24};
  CHECK_OK(devbuf_buffer_reshape(odd_bytes, DEVBUF_INT8, as_bytes, 1, &bad)); // bytes: any place
  devbuf_buffer_release(bad);
  bad = NULL;
  devbuf_buffer_release(odd_bytes);
  devbuf_buffer_release(odd);
  CHECK_STATUS(devbuf_buffer_view_as(outer, SIZE_MAX - 8, DEVBUF_FLOAT32, shape, 2, &bad),
               DEVBUF_OUT_OF_RANGE);
  CHECK_STATUS(devbuf_buffer_view_as(outer, 4094, DEVBUF_FLOAT32, shape, 2, &bad),
               DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("not a whole number of float32 elements");
  size_t huge[] = {SIZE_MAX / 2, 4};
  CHECK_STATUS(devbuf_buffer_view_as(outer, 0, DEVBUF_FLOAT32, huge, 2, &bad), DEVBUF_OVERFLOW);
  CHECK(bad == NULL);
  devbuf_buffer_release(outer);
  devbuf_buffer_release(raw);
}

static void test_reuse_keeps_new_dtype_and_shape(void) {
  size_t shape_a[] = {256};
  devbuf_buffer_t *a = NULL;
  CHECK_OK(devbuf_buffer_allocate(t.caching, DEVBUF_FLOAT32, shape_a, 1, 0, &a));
  uint64_t address_a, address_b;
  CHECK_OK(devbuf_buffer_device_ptr(a, &address_a));
  devbuf_buffer_release(a);
  size_t shape_b[] = {16, 32};
  devbuf_buffer_t *b = NULL;
  CHECK_OK(devbuf_buffer_allocate(t.caching, DEVBUF_INT16, shape_b, 2, 0, &b));
  CHECK_OK(devbuf_buffer_device_ptr(b, &address_b));
  CHECK(address_a == address_b);                 // the cached block was reused ...
  CHECK(devbuf_buffer_dtype(b) == DEVBUF_INT16); // ... with the new buffer's own dtype and shape
  CHECK_EQ_U(devbuf_buffer_ndim(b), 2);
  CHECK_EQ_U(devbuf_buffer_shape(b)[1], 32);
  devbuf_buffer_release(b);
}

static void test_zero_init(void) {
  size_t shape[] = {1000};
  // Dirty a block, release it, and get it back zero-initialised.
  devbuf_buffer_t *dirty = NULL;
  CHECK_OK(devbuf_buffer_allocate(t.caching, DEVBUF_UINT32, shape, 1, 0, &dirty));
  void *data;
  CHECK_OK(devbuf_buffer_contents_mut(dirty, &data, NULL));
  memset(data, 0xAB, 4000);
  CHECK_OK(devbuf_buffer_end_access(dirty, data));
  devbuf_buffer_release(dirty);
  devbuf_buffer_t *clean = make(DEVBUF_UINT32, shape, 1, DEVBUF_BUFFER_ZERO);
  const void *read;
  CHECK_OK(devbuf_buffer_contents(clean, &read, NULL));
  CHECK(read == data); // the very block that was dirtied
  const unsigned char *bytes = read;
  size_t nonzero = 0;
  for (size_t i = 0; i < 4000; i++) nonzero += bytes[i] != 0;
  CHECK_EQ_U(nonzero, 0);
  CHECK_OK(devbuf_buffer_end_access(clean, read));
  devbuf_buffer_release(clean);
}

static void test_host_access(void) {
  size_t shape[] = {8};
  devbuf_buffer_t *buffer = make(DEVBUF_INT32, shape, 1, 0), *left = NULL, *right = NULL;
  CHECK_OK(devbuf_buffer_view(buffer, 0, 16, &left));
  CHECK_OK(devbuf_buffer_view(buffer, 16, 16, &right));
  void *write;
  size_t size = 0;
  CHECK_OK(devbuf_buffer_contents_mut(left, &write, &size)); // allocates on first access
  CHECK(devbuf_buffer_is_allocated(buffer));
  CHECK_EQ_U(size, 16);
  CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 1);
  CHECK_EQ_U(devbuf_buffer_open_accesses(right), 0);
  int32_t values[4] = {1, 2, 3, 4};
  // Copies into bytes with an open access refuse; disjoint bytes do not.
  CHECK_STATUS(devbuf_buffer_copyin(left, values, 16), DEVBUF_HOST_ACCESS_OPEN);
  CHECK_MESSAGE("host write access to bytes [0, 16)");
  CHECK_STATUS(devbuf_buffer_copyout(buffer, values, 32), DEVBUF_HOST_ACCESS_OPEN);
  CHECK_OK(devbuf_buffer_copyin(right, values, 16));
  memcpy(write, values, 16);
  CHECK_STATUS(devbuf_buffer_end_access(right, write),
               DEVBUF_INVALID_ARGUMENT); // not right's access
  CHECK_OK(devbuf_buffer_end_access(left, write));
  CHECK_STATUS(devbuf_buffer_end_access(left, write), DEVBUF_INVALID_ARGUMENT); // already ended
  CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 0);
  // Read accesses allow copyout, refuse copyin.
  const void *read;
  CHECK_OK(devbuf_buffer_contents(buffer, &read, NULL));
  int32_t all[8];
  CHECK_OK(devbuf_buffer_copyout(buffer, all, sizeof all));
  CHECK(all[0] == 1 && all[3] == 4 && all[4] == 1 && all[7] == 4);
  CHECK_STATUS(devbuf_buffer_copyin(right, values, 16), DEVBUF_HOST_ACCESS_OPEN);
  // A handle released with an access open closes it.
  devbuf_buffer_t *extra = NULL;
  CHECK_OK(devbuf_buffer_view(buffer, 0, 32, &extra));
  const void *extra_read;
  CHECK_OK(devbuf_buffer_contents(extra, &extra_read, NULL));
  CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 2);
  devbuf_buffer_release(extra);
  CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 1);
  CHECK_OK(devbuf_buffer_end_access(buffer, read));
  // unsynchronized_ptr opens nothing.
  void *raw;
  CHECK_OK(devbuf_buffer_unsynchronized_ptr(right, &raw, &size));
  CHECK(raw == (char *)write + 16 && size == 16);
  CHECK_EQ_U(devbuf_buffer_open_accesses(buffer), 0);
  devbuf_buffer_release(left);
  devbuf_buffer_release(right);
  devbuf_buffer_release(buffer);
}

static void test_typed_access(void) {
  size_t shape[] = {2, 3};
  devbuf_buffer_t *buffer = make(DEVBUF_FLOAT64, shape, 2, 0);
  devbuf_array_t array;
  CHECK_STATUS(devbuf_buffer_as_array(buffer, DEVBUF_FLOAT32, &array), DEVBUF_TYPE_MISMATCH);
  CHECK_MESSAGE("as float32 of a float64 buffer");
  CHECK_STATUS(devbuf_buffer_as_array(buffer, (devbuf_dtype)99, &array), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("dtype 99");
  CHECK_OK(devbuf_buffer_as_array_mut(buffer, DEVBUF_FLOAT64, &array));
  CHECK_EQ_U(array.ndim, 2);
  CHECK_EQ_U(array.shape[0], 2);
  CHECK_EQ_U(array.shape[1], 3);
  CHECK_EQ_U(array.strides[0], 3);
  CHECK_EQ_U(array.strides[1], 1);
  double *cells = array.data;
  for (size_t i = 0; i < 2; i++)
    for (size_t j = 0; j < 3; j++)
      cells[i * (size_t)array.strides[0] + j * (size_t)array.strides[1]] = (double)(10 * i + j);
  CHECK_OK(devbuf_buffer_end_access(buffer, array.data));
  const void *slice;
  size_t count = 0;
  CHECK_STATUS(devbuf_buffer_as_slice(buffer, DEVBUF_INT64, &slice, &count), DEVBUF_TYPE_MISMATCH);
  CHECK_OK(devbuf_buffer_as_slice(buffer, DEVBUF_FLOAT64, &slice, &count));
  CHECK_EQ_U(count, 6);
  CHECK(((const double *)slice)[4] == 11.0);
  CHECK_OK(devbuf_buffer_end_access(buffer, slice));
  double item;
  CHECK_STATUS(devbuf_buffer_item(buffer, DEVBUF_FLOAT64, &item), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("holds 6");
  devbuf_buffer_t *one = NULL;
  CHECK_OK(devbuf_buffer_view(buffer, 5 * 8, 8, &one));
  CHECK_OK(devbuf_buffer_item(one, DEVBUF_FLOAT64, &item));
  CHECK(item == 12.0);
  CHECK_STATUS(devbuf_buffer_item(one, DEVBUF_INT64, &item), DEVBUF_TYPE_MISMATCH);
  devbuf_buffer_release(one);
  devbuf_buffer_release(buffer);
}

static void test_copies(void) {
  size_t shape[] = {16};
  devbuf_buffer_t *a = make(DEVBUF_UINT8, shape, 1, 0), *b = make(DEVBUF_UINT8, shape, 1, 0);
  unsigned char pattern[16], out[16];
  for (int i = 0; i < 16; i++) pattern[i] = (unsigned char)i;
  CHECK_STATUS(devbuf_buffer_copyin(a, pattern, 15), DEVBUF_SIZE_MISMATCH);
  CHECK_MESSAGE("15 bytes with a 16-byte buffer");
  CHECK_STATUS(devbuf_buffer_copyout(a, out, 17), DEVBUF_SIZE_MISMATCH);
  CHECK_OK(devbuf_buffer_copyin(a, pattern, 16));
  CHECK_OK(devbuf_buffer_copy_from(b, a));
  CHECK_OK(devbuf_buffer_copyout(b, out, 16));
  CHECK(memcmp(out, pattern, 16) == 0);
  // Overlapping views of one storage: forward and backward, like memmove.
  devbuf_buffer_t *low = NULL, *high = NULL;
  CHECK_OK(devbuf_buffer_view(a, 0, 12, &low));
  CHECK_OK(devbuf_buffer_view(a, 4, 12, &high));
  CHECK_OK(devbuf_buffer_copy_from(high, low));
  CHECK_OK(devbuf_buffer_copyout(a, out, 16));
  unsigned char expected[16];
  memcpy(expected, pattern, 16);
  memmove(expected + 4, expected, 12);
  CHECK(memcmp(out, expected, 16) == 0);
  CHECK_OK(devbuf_buffer_copy_from(low, high));
  memmove(expected, expected + 4, 12);
  CHECK_OK(devbuf_buffer_copyout(a, out, 16));
  CHECK(memcmp(out, expected, 16) == 0);
  CHECK_OK(devbuf_buffer_copy_from(a, a)); // a copy onto itself changes nothing
  devbuf_buffer_t *small = NULL;
  CHECK_OK(devbuf_buffer_view(b, 0, 8, &small));
  CHECK_STATUS(devbuf_buffer_copy_from(small, a), DEVBUF_SIZE_MISMATCH);
  CHECK_STATUS(devbuf_buffer_copy_from(a, NULL), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_buffer_copyin(a, NULL, 16), DEVBUF_INVALID_ARGUMENT);
  // A refused copy does nothing else: a lazy buffer stays without memory; so does one that an
  // empty copy touches through an empty view.
  size_t lazy_shape[] = {1 << 20};
  devbuf_buffer_t *lazy = NULL, *nothing = NULL;
  CHECK_OK(devbuf_buffer_new(t.caching, DEVBUF_UINT8, lazy_shape, 1, 0, &lazy));
  CHECK_STATUS(devbuf_buffer_copyin(lazy, NULL, 1 << 20), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("copyin: src is NULL");
  CHECK_STATUS(devbuf_buffer_copyout(lazy, NULL, 1 << 20), DEVBUF_INVALID_ARGUMENT);
  CHECK_OK(devbuf_buffer_view(lazy, 4096, 0, &nothing));
  CHECK_OK(devbuf_buffer_copyin(nothing, out, 0));
  CHECK_OK(devbuf_buffer_copy_from(nothing, nothing));
  CHECK(!devbuf_buffer_is_allocated(lazy));
  devbuf_buffer_release(nothing);
  devbuf_buffer_release(lazy);
  // Copies work across allocators of the device.
  devbuf_buffer_t *other = NULL;
  CHECK_OK(devbuf_buffer_new(devbuf_device_allocator(t.device), DEVBUF_UINT8, shape, 1, 0, &other));
  CHECK_OK(devbuf_buffer_copy_from(other, b));
  CHECK_OK(devbuf_buffer_copyout(other, out, 16));
  CHECK(memcmp(out, pattern, 16) == 0);
  devbuf_buffer_release(other);
  devbuf_buffer_release(small);
  devbuf_buffer_release(low);
  devbuf_buffer_release(high);
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
}

static void test_zero_length(void) {
  size_t shape[] = {0, 5};
  uint64_t calls_before = stats_of(t.caching).alloc_calls;
  devbuf_buffer_t *empty = make(DEVBUF_FLOAT32, shape, 2, 0), *view = NULL, *bad = NULL;
  CHECK(devbuf_buffer_is_empty(empty));
  CHECK_EQ_U(devbuf_buffer_size(empty), 0);
  CHECK_OK(devbuf_buffer_ensure_allocated(empty));
  CHECK(devbuf_buffer_is_allocated(empty));
  CHECK_EQ_U(stats_of(t.caching).alloc_calls, calls_before); // owns no memory
  const void *data = (const void *)1;
  size_t size = 99;
  CHECK_OK(devbuf_buffer_contents(empty, &data, &size));
  CHECK(data == NULL && size == 0);
  CHECK_OK(devbuf_buffer_end_access(empty, data));
  CHECK_OK(devbuf_buffer_copyin(empty, NULL, 0));
  CHECK_OK(devbuf_buffer_copyout(empty, NULL, 0));
  CHECK_OK(devbuf_buffer_view(empty, 0, 0, &view));
  CHECK_STATUS(devbuf_buffer_view(empty, 0, 4, &bad), DEVBUF_OUT_OF_RANGE);
  uint64_t address = 1;
  CHECK_OK(devbuf_buffer_device_ptr(view, &address));
  CHECK(address == 0);
  devbuf_buffer_release(view);
  devbuf_buffer_release(empty);
  // A zero-length view of a real buffer.
  size_t four[] = {4};
  devbuf_buffer_t *real = make(DEVBUF_FLOAT32, four, 1, 0);
  CHECK_OK(devbuf_buffer_view(real, 16, 0, &view));
  CHECK(devbuf_buffer_is_empty(view));
  devbuf_buffer_release(view);
  devbuf_buffer_release(real);
}

static void test_describe_and_retain(void) {
  size_t shape[] = {2, 3};
  devbuf_buffer_t *buffer = make(DEVBUF_BFLOAT16, shape, 2, 0);
  char text[256];
  size_t length = devbuf_buffer_describe(buffer, text, sizeof text);
  CHECK(length == strlen(text));
  CHECK(strstr(text, "dtype=bfloat16") && strstr(text, "shape=[2,3]") && strstr(text, "size=12") &&
        strstr(text, "lazy") && strstr(text, "device=cpu"));
  char tiny[8];
  CHECK_EQ_U(devbuf_buffer_describe(buffer, tiny, sizeof tiny), length); // like snprintf
  CHECK_EQ_U(strlen(tiny), 7);
  CHECK(devbuf_buffer_retain(buffer) == buffer);
  devbuf_buffer_release(buffer);
  CHECK_OK(devbuf_buffer_ensure_allocated(buffer)); // still alive after one release
  devbuf_buffer_describe(buffer, text, sizeof text);
  CHECK(strstr(text, "allocated") != NULL);
  CHECK_OK(devbuf_buffer_synchronize(buffer));
  devbuf_buffer_release(buffer);
  devbuf_buffer_release(NULL); // NULL-safe
  CHECK_EQ_U(stats_of(t.caching).live_buffers, 0);
}

int main(void) {
  t = test_allocators_open(NULL);
  RUN(test_new_is_lazy_and_sized);
  RUN(test_creation_errors);
  RUN(test_views);
  RUN(test_reshape);
  RUN(test_view_as);
  RUN(test_reuse_keeps_new_dtype_and_shape);
  RUN(test_zero_init);
  RUN(test_host_access);
  RUN(test_typed_access);
  RUN(test_copies);
  RUN(test_zero_length);
  RUN(test_describe_and_retain);
  test_allocators_close(&t);
  return CHECK_EXIT();
}
