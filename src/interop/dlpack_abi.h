// The DLPack 1.1 data structures (https://dmlc.github.io/dlpack/latest/c_api.html), written
// from the specification: the binary layout every producer and consumer agrees on. The
// struct tags match the official dlpack.h, whose users pass these to devbuf's functions.
// Tests include this file to play the other side of an exchange.
#ifndef DEVBUF_DLPACK_ABI_H
#define DEVBUF_DLPACK_ABI_H

#include <stdint.h>

#define DEVBUF_DLPACK_MAJOR 1
#define DEVBUF_DLPACK_MINOR 1

// Device types devbuf maps to its own devices.
enum {
  DEVBUF_DL_CPU = 1,
  DEVBUF_DL_CUDA = 2,
  DEVBUF_DL_CUDA_HOST = 3,
  DEVBUF_DL_OPENCL = 4,
  DEVBUF_DL_CUDA_MANAGED = 13,
};

// Type codes (DLDataTypeCode); devbuf's dtype table carries the code of each dtype.
enum {
  DEVBUF_DL_INT = 0,
  DEVBUF_DL_UINT = 1,
  DEVBUF_DL_FLOAT = 2,
  DEVBUF_DL_BFLOAT = 4,
  DEVBUF_DL_COMPLEX = 5,
  DEVBUF_DL_BOOL = 6,
};

// Flags of DLManagedTensorVersioned.
#define DEVBUF_DL_FLAG_READ_ONLY      (UINT64_C(1) << 0)
#define DEVBUF_DL_FLAG_IS_COPIED      (UINT64_C(1) << 1)
#define DEVBUF_DL_FLAG_SUBBYTE_PADDED (UINT64_C(1) << 2)

typedef struct {
  uint32_t major, minor;
} DLPackVersion;

typedef struct {
  int32_t device_type; // a C enum in dlpack.h: the same size and values
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; // in elements; NULL means compact row-major
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

#endif
