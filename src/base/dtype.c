// Data types: names, sizes in bits, DLPack codes, safetensors names.
#include "base.h"

#include <string.h>

typedef struct dtype_info {
  const char *safetensors_name;
  uint8_t bits, dlpack_code, dlpack_bits;
} dtype_info;

static const dtype_info dtype_table[DEVBUF_DTYPE_COUNT] = {
#define DEVBUF_DTYPE_INFO_(id, nbits, code, dlbits, st) \
  [DEVBUF_##                                            \
      id] = {.safetensors_name = st, .bits = nbits, .dlpack_code = code, .dlpack_bits = dlbits},
    DEVBUF_DTYPE_TABLE(DEVBUF_DTYPE_INFO_)
#undef DEVBUF_DTYPE_INFO_
};

// Lower-case names, kept apart from the X-table so that the header stays one line a type.
static const char *const dtype_names[DEVBUF_DTYPE_COUNT] = {
    [DEVBUF_BOOL] = "bool",
    [DEVBUF_INT8] = "int8",
    [DEVBUF_INT16] = "int16",
    [DEVBUF_INT32] = "int32",
    [DEVBUF_INT64] = "int64",
    [DEVBUF_UINT8] = "uint8",
    [DEVBUF_UINT16] = "uint16",
    [DEVBUF_UINT32] = "uint32",
    [DEVBUF_UINT64] = "uint64",
    [DEVBUF_FLOAT16] = "float16",
    [DEVBUF_BFLOAT16] = "bfloat16",
    [DEVBUF_FLOAT32] = "float32",
    [DEVBUF_FLOAT64] = "float64",
    [DEVBUF_COMPLEX64] = "complex64",
    [DEVBUF_FLOAT8_E4M3] = "float8_e4m3",
    [DEVBUF_FLOAT8_E5M2] = "float8_e5m2",
    [DEVBUF_FLOAT8_E8M0] = "float8_e8m0",
    [DEVBUF_FLOAT8_E4M3FNUZ] = "float8_e4m3fnuz",
    [DEVBUF_FLOAT8_E5M2FNUZ] = "float8_e5m2fnuz",
    [DEVBUF_FLOAT6_E2M3] = "float6_e2m3",
    [DEVBUF_FLOAT6_E3M2] = "float6_e3m2",
    [DEVBUF_FLOAT4_E2M1] = "float4_e2m1",
};

const uint8_t devbuf__dtype_whole_bytes[DEVBUF_DTYPE_COUNT] = {
#define DEVBUF_DTYPE_BYTES_(id, nbits, code, dlbits, st) \
  [DEVBUF_##id] = (nbits) % 8 ? 0 : (nbits) / 8,
    DEVBUF_DTYPE_TABLE(DEVBUF_DTYPE_BYTES_)
#undef DEVBUF_DTYPE_BYTES_
};

static bool dtype_valid(devbuf_dtype dtype) { return (unsigned)dtype < DEVBUF_DTYPE_COUNT; }

const char *devbuf_dtype_name(devbuf_dtype dtype) {
  return dtype_valid(dtype) ? dtype_names[dtype] : NULL;
}

unsigned devbuf_dtype_bits(devbuf_dtype dtype) {
  return dtype_valid(dtype) ? dtype_table[dtype].bits : 0;
}

const char *devbuf_dtype_safetensors_name(devbuf_dtype dtype) {
  return dtype_valid(dtype) ? dtype_table[dtype].safetensors_name : NULL;
}

devbuf_status devbuf_dtype_dlpack(devbuf_dtype dtype, uint8_t *out_code, uint8_t *out_bits) {
  if (!dtype_valid(dtype))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "unknown dtype %d", (int)dtype);
  if (out_code) *out_code = dtype_table[dtype].dlpack_code;
  if (out_bits) *out_bits = dtype_table[dtype].dlpack_bits;
  return DEVBUF_OK;
}

devbuf_status devbuf_dtype_from_name(const char *name, devbuf_dtype *out_dtype) {
  if (!name || !out_dtype) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "NULL name or out_dtype");
  for (int i = 0; i < DEVBUF_DTYPE_COUNT; i++) {
    if (strcmp(name, dtype_names[i]) == 0 || strcmp(name, dtype_table[i].safetensors_name) == 0) {
      *out_dtype = (devbuf_dtype)i;
      return DEVBUF_OK;
    }
  }
  return devbuf__error(DEVBUF_NOT_FOUND, "no dtype is named '%.64s'", name);
}

devbuf_status devbuf_dtype_bytes(devbuf_dtype dtype, size_t count, size_t *out_bytes) {
  if (!out_bytes) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dtype_bytes: out_bytes is NULL");
  if (!dtype_valid(dtype))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "unknown dtype %d", (int)dtype);
  size_t bits = dtype_table[dtype].bits, group_bytes; // 8 elements take `bits` bytes
  if (bits % 8 == 0) {
    if (devbuf__mul_overflows(count, bits / 8, out_bytes))
      return devbuf__error(DEVBUF_OVERFLOW, "%zu elements of %s overflow size_t bytes", count,
                           dtype_names[dtype]);
    return DEVBUF_OK;
  }
  // Whole groups of 8 elements are whole bytes: counted apart from the rest, the bytes
  // overflow only where they do not fit, not where the bits would.
  size_t rest_bits = (count % 8) * bits;
  if (rest_bits % 8 != 0)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%zu elements of %s (%zu bits each) end %zu bits into a byte: not a "
                         "whole number of bytes",
                         count, dtype_names[dtype], bits, rest_bits % 8);
  if (devbuf__mul_overflows(count / 8, bits, &group_bytes) ||
      group_bytes > SIZE_MAX - rest_bits / 8)
    return devbuf__error(DEVBUF_OVERFLOW,
                         "%zu elements of %s (%zu bits each) overflow size_t bytes", count,
                         dtype_names[dtype], bits);
  *out_bytes = group_bytes + rest_bits / 8;
  return DEVBUF_OK;
}

devbuf_status devbuf__shape_bytes(devbuf_dtype dtype, const size_t *shape, size_t ndim,
                                  size_t *out_bytes, size_t *out_count) {
  if (!dtype_valid(dtype))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "unknown dtype %d", (int)dtype);
  if (ndim > DEVBUF_MAX_NDIM)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "ndim %zu exceeds DEVBUF_MAX_NDIM (%d)", ndim,
                         DEVBUF_MAX_NDIM);
  if (ndim > 0 && !shape)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "shape is NULL with ndim %zu", ndim);
  // `span`: the product of the extents other than 0. Strides reach it even where an extent
  // of 0 leaves no element, so a shape is judged by it whatever the order of its extents.
  size_t span = 1;
  bool empty = false;
  for (size_t i = 0; i < ndim; i++) {
    if (shape[i] == 0) {
      empty = true;
    } else if (devbuf__mul_overflows(span, shape[i], &span)) {
      return devbuf__error(DEVBUF_OVERFLOW, "shape overflows size_t at dimension %zu (extent %zu)",
                           i, shape[i]);
    }
  }
  // Strides (devbuf_array_t, DLPack) and file offsets are signed 64-bit: every element
  // index, stride and byte offset of a buffer must fit them.
  unsigned __int128 span_bits = (unsigned __int128)span * dtype_table[dtype].bits;
  if (span > (uint64_t)INT64_MAX || span_bits / 8 > (uint64_t)INT64_MAX)
    return devbuf__error(
        DEVBUF_OVERFLOW, "shape of %zu elements (%llu bytes) exceeds INT64_MAX%s", span,
        (unsigned long long)(span_bits / 8 > UINT64_MAX ? UINT64_MAX : span_bits / 8),
        empty ? " in its strides (it has an extent of 0)" : "");
  size_t count = empty ? 0 : span, bytes = 0;
  devbuf_status status = devbuf_dtype_bytes(dtype, count, &bytes);
  if (status != DEVBUF_OK) return status;
  if (out_bytes) *out_bytes = bytes;
  if (out_count) *out_count = count;
  return DEVBUF_OK;
}
