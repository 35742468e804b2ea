// The part of the CUDA driver API devbuf calls, declared from NVIDIA's documentation so
// that the library builds without the CUDA toolkit and loads libcuda.so.1 at run time.
// Each entry point is resolved by its versioned symbol name (cuMemAlloc_v2 and so on).
#ifndef DEVBUF_CUDA_ABI_H
#define DEVBUF_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef unsigned long long CUmemGenericAllocationHandle;

// Virtual memory management (CUDA 10.2 and later): the layouts of cuda.h.
typedef struct CUmemLocation {
  int type; // CU_MEM_LOCATION_TYPE_DEVICE
  int id;
} CUmemLocation;

typedef struct CUmemAllocationProp {
  int type;                 // CU_MEM_ALLOCATION_TYPE_PINNED
  int requestedHandleTypes; // 0: none
  CUmemLocation location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc {
  CUmemLocation location;
  int flags; // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
} CUmemAccessDesc;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_STUB_LIBRARY = 34,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_INVALID_PTX = 218,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
};

enum {
  CU_STREAM_NON_BLOCKING = 0x1,
  CU_JIT_ERROR_LOG_BUFFER = 5, // CUjit_option
  CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
  CU_EVENT_BLOCKING_SYNC = 0x1,
  CU_EVENT_DISABLE_TIMING = 0x2,
  CU_MEM_ATTACH_GLOBAL = 0x1,
  CU_MEMHOSTREGISTER_READ_ONLY = 0x08,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_MEM_ALLOCATION_TYPE_PINNED = 1,
  CU_MEM_LOCATION_TYPE_DEVICE = 1,
  CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
  CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
};

enum {
  CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT = 14,
  CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
  CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
  CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
};

enum {
  CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0, // CUfunction_attribute
};

// X(return, field, symbol, parameters)
#define DEVBUF_CUDA_FUNCTIONS(X)                                                                   \
  X(CUresult, cuInit, "cuInit", (unsigned))                                                        \
  X(CUresult, cuDriverGetVersion, "cuDriverGetVersion", (int *))                                   \
  X(CUresult, cuGetErrorName, "cuGetErrorName", (CUresult, const char **))                         \
  X(CUresult, cuDeviceGetCount, "cuDeviceGetCount", (int *))                                       \
  X(CUresult, cuDeviceGet, "cuDeviceGet", (CUdevice *, int))                                       \
  X(CUresult, cuDeviceGetName, "cuDeviceGetName", (char *, int, CUdevice))                         \
  X(CUresult, cuDeviceTotalMem, "cuDeviceTotalMem_v2", (size_t *, CUdevice))                       \
  X(CUresult, cuDeviceGetAttribute, "cuDeviceGetAttribute", (int *, int, CUdevice))                \
  X(CUresult, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice))       \
  X(CUresult, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice))               \
  X(CUresult, cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext))                                     \
  X(CUresult, cuCtxGetCurrent, "cuCtxGetCurrent", (CUcontext *))                                   \
  X(CUresult, cuMemAlloc, "cuMemAlloc_v2", (CUdeviceptr *, size_t))                                \
  X(CUresult, cuMemFree, "cuMemFree_v2", (CUdeviceptr))                                            \
  X(CUresult, cuMemAllocHost, "cuMemAllocHost_v2", (void **, size_t))                              \
  X(CUresult, cuMemFreeHost, "cuMemFreeHost", (void *))                                            \
  X(CUresult, cuMemAllocManaged, "cuMemAllocManaged", (CUdeviceptr *, size_t, unsigned))           \
  X(CUresult, cuMemcpyAsync, "cuMemcpyAsync", (CUdeviceptr, CUdeviceptr, size_t, CUstream))        \
  X(CUresult, cuMemsetD8Async, "cuMemsetD8Async", (CUdeviceptr, unsigned char, size_t, CUstream))  \
  X(CUresult, cuMemsetD16Async, "cuMemsetD16Async",                                                \
    (CUdeviceptr, unsigned short, size_t, CUstream))                                               \
  X(CUresult, cuMemsetD32Async, "cuMemsetD32Async", (CUdeviceptr, unsigned int, size_t, CUstream)) \
  X(CUresult, cuStreamCreate, "cuStreamCreate", (CUstream *, unsigned))                            \
  X(CUresult, cuStreamDestroy, "cuStreamDestroy_v2", (CUstream))                                   \
  X(CUresult, cuStreamSynchronize, "cuStreamSynchronize", (CUstream))                              \
  X(CUresult, cuStreamWaitEvent, "cuStreamWaitEvent", (CUstream, CUevent, unsigned))               \
  X(CUresult, cuEventCreate, "cuEventCreate", (CUevent *, unsigned))                               \
  X(CUresult, cuEventRecord, "cuEventRecord", (CUevent, CUstream))                                 \
  X(CUresult, cuEventSynchronize, "cuEventSynchronize", (CUevent))                                 \
  X(CUresult, cuEventDestroy, "cuEventDestroy_v2", (CUevent))                                      \
  X(CUresult, cuModuleLoadData, "cuModuleLoadData", (CUmodule *, const void *))                    \
  X(CUresult, cuModuleLoadDataEx, "cuModuleLoadDataEx",                                            \
    (CUmodule *, const void *, unsigned, int *, void **))                                          \
  X(CUresult, cuModuleUnload, "cuModuleUnload", (CUmodule))                                        \
  X(CUresult, cuModuleGetFunction, "cuModuleGetFunction", (CUfunction *, CUmodule, const char *))  \
  X(CUresult, cuFuncGetAttribute, "cuFuncGetAttribute", (int *, int, CUfunction))                  \
  X(CUresult, cuLaunchKernel, "cuLaunchKernel",                                                    \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,   \
     void **, void **))                                                                            \
  X(CUresult, cuPointerGetAttribute, "cuPointerGetAttribute", (void *, int, CUdeviceptr))

typedef struct devbuf__cuda_api {
#define DEVBUF_CUDA_POINTER_(ret, field, symbol, params) ret(*field) params;
  DEVBUF_CUDA_FUNCTIONS(DEVBUF_CUDA_POINTER_)
#undef DEVBUF_CUDA_POINTER_
  // Optional: NULL where the driver lacks them. Parameter layouts (CUDA 12.4 and later).
  CUresult (*cuFuncGetParamInfo)(CUfunction, size_t, size_t *, size_t *);
  // Virtual memory management, for growable segments (all or none).
  CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
  // Sharing physical memory with other processes (CUDA 10.2 and later, with the above).
  CUresult (*cuMemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int,
                                           unsigned long long);
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
  CUresult (*cuDeviceGetUuid)(unsigned char *, CUdevice); // a CUuuid: 16 bytes
} devbuf__cuda_api;

#endif
