// DLPack interop: buffers leave as DLManagedTensor(Versioned) holding their storage and a
// host access; foreign tensors arrive as buffers whose last release calls the producer's
// deleter.
#include "dlpack_abi.h"
#include "../core/core.h"

#include <stdio.h>
#include <string.h>

// ---- export ------------------------------------------------------------------------------

// One allocation holds the tensor handed out and everything it points to.
typedef struct export_record {
  union {
    DLManagedTensorVersioned versioned;
    DLManagedTensor legacy;
  } tensor;
  devbuf_buffer_t *buffer; // a handle of our own keeps the storage alive
  const void *access;      // the host access to end, or NULL
  int64_t shape[DEVBUF_MAX_NDIM], strides[DEVBUF_MAX_NDIM];
} export_record;

static void export_finish(export_record *record) {
  if (record->access) devbuf_buffer_end_access(record->buffer, record->access);
  devbuf_buffer_release(record->buffer);
  devbuf__free(record);
}

static void delete_versioned(DLManagedTensorVersioned *tensor) {
  if (tensor) export_finish(tensor->manager_ctx);
}

static void delete_legacy(DLManagedTensor *tensor) {
  if (tensor) export_finish(tensor->manager_ctx);
}

// DLPack's device type of the storage's memory: the device's, except that CUDA memory the
// CPU addresses has types of its own, pinned host memory kDLCUDAHost and managed memory
// kDLCUDAManaged; as kDLCUDA, consumers would take pinned memory for device memory.
static int32_t export_device_type(const devbuf__storage *storage, uint32_t flags) {
  int32_t type = devbuf_device_dlpack_type(storage->device);
  if (type != DEVBUF_DL_CUDA || !storage->allocator || (flags & DEVBUF_DLPACK_AS_DEVICE))
    return type; // imports: device memory; AS_DEVICE: the consumer takes kDLCUDA alone
  switch (storage->allocator->memory_kind) {
  case DEVBUF_MEMORY_HOST_VISIBLE:
    return DEVBUF_DL_CUDA_HOST;
  case DEVBUF_MEMORY_MANAGED:
    return DEVBUF_DL_CUDA_MANAGED;
  default:
    return type;
  }
}

// Fills the DLTensor of `record` for `buffer`, opening the host access it holds.
static devbuf_status export_fill(devbuf_buffer_t *buffer, uint32_t flags, export_record *record,
                                 DLTensor *out, bool *out_read_only) {
  if (!buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dlpack export: buffer is NULL");
  uint32_t known = DEVBUF_DLPACK_READ_ONLY | DEVBUF_DLPACK_AS_DEVICE;
  if (flags & ~known)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dlpack export: unknown flags 0x%x",
                         flags & ~known);
  devbuf_status status = devbuf_buffer_ensure_allocated(buffer);
  if (status != DEVBUF_OK) return status;
  devbuf__storage *storage = buffer->storage;
  bool read_only = (flags & DEVBUF_DLPACK_READ_ONLY) || storage->read_only;
  bool host = devbuf__storage_host_accessible(storage);
  if (host && buffer->size) {
    if (read_only) {
      status = devbuf_buffer_contents_wait(buffer, &record->access, NULL);
    } else {
      void *data = NULL;
      status = devbuf_buffer_contents_mut_wait(buffer, &data, NULL);
      record->access = data;
    }
    if (status != DEVBUF_OK) return status;
  }
  record->buffer = devbuf_buffer_retain(buffer);
  uint8_t code, bits;
  devbuf_dtype_dlpack(buffer->dtype, &code, &bits);
  int64_t stride = 1;
  for (size_t d = buffer->ndim; d-- > 0;) {
    record->shape[d] = (int64_t)buffer->shape[d];
    record->strides[d] = stride;
    stride *= (int64_t)buffer->shape[d];
  }
  // DLPack wants the allocation's address with the view's offset apart.
  *out = (DLTensor){
      // A device tensor's data is the driver's handle (a cl_mem), even for memory the CPU
      // can also address: that is what consumers of the device type expect.
      .data = storage->device->host_accessible ? storage->memory.host
                                               : (void *)(uintptr_t)storage->memory.device,
      .device = {export_device_type(storage, flags), storage->device->index},
      .ndim = (int32_t)buffer->ndim,
      .dtype = {code, bits, 1},
      .shape = record->shape,
      .strides = record->strides,
      .byte_offset =
          storage->memory.offset + buffer->offset, // a block of a segment's cl_mem on OpenCL
  };
  *out_read_only = read_only;
  return DEVBUF_OK;
}

// A record with its tensor (the versioned or the legacy one) filled in for `buffer`.
static devbuf_status export_new(devbuf_buffer_t *buffer, uint32_t flags, bool versioned,
                                export_record **out_record, bool *out_read_only) {
  *out_record = NULL;
  if (!versioned && buffer && buffer->storage->read_only)
    return devbuf__error(DEVBUF_READ_ONLY,
                         "dlpack export: buffer %llu is read-only and a legacy DLManagedTensor "
                         "cannot say so; use devbuf_buffer_to_dlpack_versioned",
                         (unsigned long long)buffer->handle_id);
  // A read access under a tensor that looks writable: a consumer that writes races with
  // the reading work the access lets in.
  if (!versioned && (flags & DEVBUF_DLPACK_READ_ONLY))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "dlpack export: DEVBUF_DLPACK_READ_ONLY asked of a legacy "
                         "DLManagedTensor, which cannot carry the flag; use "
                         "devbuf_buffer_to_dlpack_versioned");
  export_record *record = devbuf__calloc(1, sizeof *record);
  if (!record)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "dlpack export: no host memory for a tensor record");
  DLTensor *tensor =
      versioned ? &record->tensor.versioned.dl_tensor : &record->tensor.legacy.dl_tensor;
  devbuf_status status = export_fill(buffer, flags, record, tensor, out_read_only);
  if (status != DEVBUF_OK) {
    devbuf__free(record);
    return status;
  }
  *out_record = record;
  return DEVBUF_OK;
}

devbuf_status devbuf_buffer_to_dlpack_versioned(devbuf_buffer_t *buffer, uint32_t flags,
                                                struct DLManagedTensorVersioned **out_tensor) {
  if (!out_tensor)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dlpack export: out_tensor is NULL");
  export_record *record;
  bool read_only = false;
  devbuf_status status = export_new(buffer, flags, true, &record, &read_only);
  if (status != DEVBUF_OK) return status;
  DLManagedTensorVersioned *tensor = &record->tensor.versioned;
  tensor->version = (DLPackVersion){DEVBUF_DLPACK_MAJOR, DEVBUF_DLPACK_MINOR};
  tensor->manager_ctx = record;
  tensor->deleter = delete_versioned;
  tensor->flags = read_only ? DEVBUF_DL_FLAG_READ_ONLY : 0;
  *out_tensor = tensor;
  return DEVBUF_OK;
}

devbuf_status devbuf_buffer_to_dlpack(devbuf_buffer_t *buffer, uint32_t flags,
                                      struct DLManagedTensor **out_tensor) {
  if (!out_tensor)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dlpack export: out_tensor is NULL");
  export_record *record;
  bool read_only = false;
  devbuf_status status = export_new(buffer, flags, false, &record, &read_only);
  if (status != DEVBUF_OK) return status;
  record->tensor.legacy.manager_ctx = record;
  record->tensor.legacy.deleter = delete_legacy;
  *out_tensor = &record->tensor.legacy;
  return DEVBUF_OK;
}

// ---- import ------------------------------------------------------------------------------

static void release_versioned(devbuf__storage *storage) {
  DLManagedTensorVersioned *tensor = storage->external;
  if (tensor->deleter) tensor->deleter(tensor);
}

static void release_legacy(devbuf__storage *storage) {
  DLManagedTensor *tensor = storage->external;
  if (tensor->deleter) tensor->deleter(tensor);
}

// A producer's tensor: its memory goes back through the tensor's deleter.
static const devbuf__storage_kind import_versioned = {
    .name = "DLPack import",
    .give_back = release_versioned,
};
static const devbuf__storage_kind import_legacy = {
    .name = "DLPack import",
    .give_back = release_legacy,
};

static devbuf_status import_dtype(DLDataType type, devbuf_dtype *out) {
  if (type.lanes != 1)
    return devbuf__error(DEVBUF_UNSUPPORTED, "dlpack import: %u lanes per element; devbuf reads 1",
                         (unsigned)type.lanes);
  for (int d = 0; d < DEVBUF_DTYPE_COUNT; d++) {
    uint8_t code, bits;
    devbuf_dtype_dlpack((devbuf_dtype)d, &code, &bits);
    if (code == type.code && bits == type.bits) {
      *out = (devbuf_dtype)d;
      return DEVBUF_OK;
    }
  }
  return devbuf__error(DEVBUF_UNSUPPORTED,
                       "dlpack import: no devbuf dtype has DLPack code %u with %u bits",
                       (unsigned)type.code, (unsigned)type.bits);
}

// The device of the first backend in the registry whose memory is of DLPack's type.
static devbuf_status import_device(DLDevice where, devbuf_device_t **out) {
  // Pinned host memory (of any GPU): the CPU reads it directly.
  if (where.device_type == DEVBUF_DL_CUDA_HOST) where = (DLDevice){DEVBUF_DL_CPU, 0};
  // Managed memory: the device addresses it as its own; devbuf takes it for device memory,
  // reached from the host by copies, as it cannot tell where the driver has migrated it.
  int32_t type = where.device_type == DEVBUF_DL_CUDA_MANAGED ? DEVBUF_DL_CUDA : where.device_type;
  const devbuf__backend_entry *entry = devbuf__backend_of_dlpack_type(type);
  if (!entry)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "dlpack import: device type %d (id %d) is not one devbuf opens",
                         (int)where.device_type, (int)where.device_id);
  if (where.device_id < 0 || (entry->backend->one_device && where.device_id != 0))
    return devbuf__error(DEVBUF_UNSUPPORTED, "dlpack import: device type %d has no device %d",
                         (int)where.device_type, (int)where.device_id);
  char spec[48];
  snprintf(spec, sizeof spec, "%s:%d", entry->name, (int)where.device_id);
  return devbuf_device_open(spec, out);
}

// Checks `tensor` and wraps its memory; on success the storage owns the producer's tensor.
static devbuf_status import_tensor(const DLTensor *tensor, bool read_only,
                                   const devbuf__storage_kind *kind, void *managed,
                                   devbuf_buffer_t **out_buffer) {
  if (!out_buffer)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dlpack import: out_buffer is NULL");
  if (tensor->ndim < 0 || tensor->ndim > DEVBUF_MAX_NDIM)
    return devbuf__error(DEVBUF_UNSUPPORTED, "dlpack import: ndim %d outside 0..%d",
                         (int)tensor->ndim, DEVBUF_MAX_NDIM);
  if (tensor->ndim && !tensor->shape)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dlpack import: ndim %d without a shape",
                         (int)tensor->ndim);
  devbuf_dtype dtype = DEVBUF_UINT8;
  devbuf_status status = import_dtype(tensor->dtype, &dtype);
  if (status != DEVBUF_OK) return status;
  size_t shape[DEVBUF_MAX_NDIM];
  bool empty = false;
  for (int32_t d = 0; d < tensor->ndim; d++) {
    if (tensor->shape[d] < 0)
      return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dlpack import: shape[%d] is %lld", (int)d,
                           (long long)tensor->shape[d]);
    shape[d] = (size_t)tensor->shape[d];
    empty |= shape[d] == 0;
  }
  size_t bytes;
  status = devbuf__shape_bytes(dtype, shape, (size_t)tensor->ndim, &bytes, NULL);
  if (status != DEVBUF_OK) return status;
  if (tensor->strides && !empty) {
    uint64_t expected = 1; // elements; a stride past INT64_MAX matches no int64_t stride
    for (int32_t d = tensor->ndim; d-- > 0;) {
      if (shape[d] != 1 && (tensor->strides[d] < 0 || (uint64_t)tensor->strides[d] != expected))
        return devbuf__error(DEVBUF_UNSUPPORTED,
                             "dlpack import: strides[%d] is %lld where a compact row-major "
                             "tensor has %llu; copy it to a contiguous tensor first",
                             (int)d, (long long)tensor->strides[d], (unsigned long long)expected);
      if (__builtin_mul_overflow(expected, (uint64_t)shape[d], &expected)) expected = UINT64_MAX;
    }
  }
  uintptr_t address;
  size_t extent; // byte_offset + bytes: the storage, when data is a handle rather than an address
  if (__builtin_add_overflow((uintptr_t)tensor->data, tensor->byte_offset, &address) ||
      (bytes && __builtin_add_overflow(address, bytes, &(uintptr_t){0})) ||
      __builtin_add_overflow(tensor->byte_offset, bytes, &extent) || extent > (uint64_t)INT64_MAX)
    return devbuf__error(DEVBUF_OVERFLOW,
                         "dlpack import: data %p + byte_offset %llu + %zu bytes overflows",
                         tensor->data, (unsigned long long)tensor->byte_offset, bytes);
  if (!tensor->data && bytes)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dlpack import: data is NULL for %zu bytes",
                         bytes);
  devbuf_device_t *device;
  status = import_device(tensor->device, &device);
  if (status != DEVBUF_OK) return status;
  // Host memory is addressed at data + byte_offset; device memory (a cl_mem, say) is a
  // handle, so the view keeps the offset.
  bool host = device->host_accessible;
  size_t view_offset = host ? 0 : (size_t)tensor->byte_offset;
  // A host address (or a device handle's byte offset) off the element's alignment would
  // hand out misaligned typed pointers.
  size_t alignment = devbuf__dtype_alignment(dtype);
  if (bytes && (host ? address : tensor->byte_offset) % alignment != 0) {
    devbuf_device_release(device);
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "dlpack import: data %p + byte_offset %llu is not aligned to the %zu "
                         "bytes of a %s element",
                         tensor->data, (unsigned long long)tensor->byte_offset, alignment,
                         devbuf_dtype_name(dtype));
  }
  devbuf_memory_t memory = {.host = host ? (void *)address : NULL,
                            .device = host ? (uint64_t)address : (uint64_t)(uintptr_t)tensor->data};
  if (!host && bytes && device->backend->import_handle) {
    status = device->backend->import_handle(device, memory.device, extent, &memory);
    if (status != DEVBUF_OK) {
      devbuf_device_release(device);
      return devbuf__error_cause(status, "dlpack import");
    }
  }
  devbuf__storage *storage;
  status = devbuf__storage_create(NULL, device, host ? bytes : extent, 0, &storage);
  devbuf_device_release(device); // the storage holds its own reference
  if (status != DEVBUF_OK) return status;
  storage->read_only = read_only;
  storage->memory.host = memory.host;
  storage->memory.device = memory.device;
  storage->memory.offset = memory.offset;
  storage->memory.size = storage->size;
  atomic_store_explicit(&storage->state, DEVBUF__ALLOCATED, memory_order_release);
  status = devbuf__buffer_wrap(storage, view_offset, bytes, dtype, shape, (size_t)tensor->ndim,
                               out_buffer);
  if (status != DEVBUF_OK) return status; // the tensor stays the caller's
  storage->kind = kind;
  storage->external = managed;
  return DEVBUF_OK;
}

devbuf_status devbuf_buffer_from_dlpack_versioned(struct DLManagedTensorVersioned *tensor,
                                                  devbuf_buffer_t **out_buffer) {
  if (!tensor) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dlpack import: tensor is NULL");
  if (tensor->version.major != DEVBUF_DLPACK_MAJOR)
    return devbuf__error(
        DEVBUF_UNSUPPORTED, "dlpack import: DLPack version %u.%u; devbuf reads %d.x",
        (unsigned)tensor->version.major, (unsigned)tensor->version.minor, DEVBUF_DLPACK_MAJOR);
  if (tensor->flags & DEVBUF_DL_FLAG_SUBBYTE_PADDED)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "dlpack import: sub-byte elements padded to bytes; devbuf packs them");
  return import_tensor(&tensor->dl_tensor, tensor->flags & DEVBUF_DL_FLAG_READ_ONLY,
                       &import_versioned, tensor, out_buffer);
}

devbuf_status devbuf_buffer_from_dlpack(struct DLManagedTensor *tensor,
                                        devbuf_buffer_t **out_buffer) {
  if (!tensor) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "dlpack import: tensor is NULL");
  return import_tensor(&tensor->dl_tensor, false, &import_legacy, tensor, out_buffer);
}
