// The part of the OpenCL 1.2 C API devbuf calls, declared from the specification so that
// the library builds without OpenCL headers and loads the ICD loader at run time. Values
// and signatures are the ABI every OpenCL implementation shares.
#ifndef DEVBUF_OPENCL_ABI_H
#define DEVBUF_OPENCL_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_uint cl_bool;
typedef cl_ulong cl_bitfield;
typedef cl_bitfield cl_device_type;
typedef cl_bitfield cl_mem_flags;
typedef cl_bitfield cl_map_flags;
typedef cl_bitfield cl_command_queue_properties;
typedef cl_uint cl_platform_info;
typedef cl_uint cl_device_info;
typedef cl_uint cl_program_build_info;
typedef cl_uint cl_event_info;
typedef cl_uint cl_buffer_create_type;
typedef cl_uint cl_kernel_info;
typedef cl_uint cl_mem_info;
typedef intptr_t cl_context_properties;

typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_program *cl_program;
typedef struct _cl_kernel *cl_kernel;
typedef struct _cl_event *cl_event;

typedef struct {
  size_t origin, size;
} cl_buffer_region;

enum {
  CL_SUCCESS = 0,
  CL_DEVICE_NOT_FOUND = -1,
  CL_MEM_OBJECT_ALLOCATION_FAILURE = -4,
  CL_OUT_OF_RESOURCES = -5,
  CL_OUT_OF_HOST_MEMORY = -6,
  CL_BUILD_PROGRAM_FAILURE = -11,
  CL_MISALIGNED_SUB_BUFFER_OFFSET = -13,
  CL_INVALID_KERNEL_ARGS = -52,
  CL_INVALID_BUFFER_SIZE = -61,
  CL_PLATFORM_NOT_FOUND_KHR = -1001,
};

#define CL_FALSE                          0u
#define CL_TRUE                           1u
#define CL_DEVICE_TYPE_ALL                0xFFFFFFFFu
#define CL_PLATFORM_VERSION               0x0901u
#define CL_PLATFORM_NAME                  0x0902u
#define CL_DEVICE_TYPE                    0x1000u
#define CL_DEVICE_TYPE_CPU                (1u << 1)
#define CL_DEVICE_TYPE_GPU                (1u << 2)
#define CL_DEVICE_MAX_WORK_GROUP_SIZE     0x1004u
#define CL_DEVICE_MAX_WORK_ITEM_SIZES     0x1005u
#define CL_DEVICE_MAX_MEM_ALLOC_SIZE      0x1010u
#define CL_DEVICE_MEM_BASE_ADDR_ALIGN     0x1019u // bits
#define CL_DEVICE_GLOBAL_MEM_SIZE         0x101Fu
#define CL_DEVICE_NAME                    0x102Bu
#define CL_DEVICE_VERSION                 0x102Fu
#define CL_DEVICE_HOST_UNIFIED_MEMORY     0x1035u
#define CL_DEVICE_SVM_CAPABILITIES        0x1053u
#define CL_CONTEXT_PLATFORM               0x1084
#define CL_MEM_READ_WRITE                 (1u << 0)
#define CL_MEM_ALLOC_HOST_PTR             (1u << 4)
#define CL_MAP_READ                       (1u << 0)
#define CL_MAP_WRITE                      (1u << 1)
#define CL_PROGRAM_BUILD_LOG              0x1183u
#define CL_KERNEL_NUM_ARGS                0x1191u
#define CL_KERNEL_ARG_ADDRESS_QUALIFIER   0x1196u
#define CL_KERNEL_ARG_ADDRESS_GLOBAL      0x119Bu
#define CL_KERNEL_ARG_ADDRESS_LOCAL       0x119Cu
#define CL_KERNEL_ARG_ADDRESS_CONSTANT    0x119Du
#define CL_KERNEL_ARG_ADDRESS_PRIVATE     0x119Eu
#define CL_KERNEL_ARG_ACCESS_QUALIFIER    0x1197u
#define CL_KERNEL_ARG_ACCESS_NONE         0x11A3u
#define CL_KERNEL_ARG_TYPE_NAME           0x1198u
#define CL_KERNEL_ARG_TYPE_QUALIFIER      0x1199u
#define CL_KERNEL_ARG_TYPE_PIPE           (1u << 3)
#define CL_KERNEL_WORK_GROUP_SIZE         0x11B0u
#define CL_BUFFER_CREATE_TYPE_REGION      0x1220u
#define CL_MEM_SIZE                       0x1102u
#define CL_MEM_CONTEXT                    0x1106u
#define CL_MEM_ASSOCIATED_MEMOBJECT       0x1107u
#define CL_MEM_OFFSET                     0x1108u
#define CL_COMPLETE                       0x0
#define CL_EVENT_COMMAND_EXECUTION_STATUS 0x11D3u

// Every entry point devbuf resolves, with its name: X(return, name, parameters).
#define DEVBUF_OPENCL_FUNCTIONS(X)                                                                \
  X(cl_int, clGetPlatformIDs, (cl_uint, cl_platform_id *, cl_uint *))                             \
  X(cl_int, clGetPlatformInfo, (cl_platform_id, cl_platform_info, size_t, void *, size_t *))      \
  X(cl_int, clGetDeviceIDs, (cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *)) \
  X(cl_int, clGetDeviceInfo, (cl_device_id, cl_device_info, size_t, void *, size_t *))            \
  X(cl_context, clCreateContext,                                                                  \
    (const cl_context_properties *, cl_uint, const cl_device_id *,                                \
     void (*)(const char *, const void *, size_t, void *), void *, cl_int *))                     \
  X(cl_int, clReleaseContext, (cl_context))                                                       \
  X(cl_command_queue, clCreateCommandQueue,                                                       \
    (cl_context, cl_device_id, cl_command_queue_properties, cl_int *))                            \
  X(cl_int, clReleaseCommandQueue, (cl_command_queue))                                            \
  X(cl_mem, clCreateBuffer, (cl_context, cl_mem_flags, size_t, void *, cl_int *))                 \
  X(cl_mem, clCreateSubBuffer,                                                                    \
    (cl_mem, cl_mem_flags, cl_buffer_create_type, const void *, cl_int *))                        \
  X(cl_int, clReleaseMemObject, (cl_mem))                                                         \
  X(cl_int, clGetMemObjectInfo, (cl_mem, cl_mem_info, size_t, void *, size_t *))                  \
  X(cl_int, clEnqueueWriteBuffer,                                                                 \
    (cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint, const cl_event *,  \
     cl_event *))                                                                                 \
  X(cl_int, clEnqueueReadBuffer,                                                                  \
    (cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint, const cl_event *,        \
     cl_event *))                                                                                 \
  X(cl_int, clEnqueueCopyBuffer,                                                                  \
    (cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint, const cl_event *,         \
     cl_event *))                                                                                 \
  X(cl_int, clEnqueueFillBuffer,                                                                  \
    (cl_command_queue, cl_mem, const void *, size_t, size_t, size_t, cl_uint, const cl_event *,   \
     cl_event *))                                                                                 \
  X(void *, clEnqueueMapBuffer,                                                                   \
    (cl_command_queue, cl_mem, cl_bool, cl_map_flags, size_t, size_t, cl_uint, const cl_event *,  \
     cl_event *, cl_int *))                                                                       \
  X(cl_int, clEnqueueUnmapMemObject,                                                              \
    (cl_command_queue, cl_mem, void *, cl_uint, const cl_event *, cl_event *))                    \
  X(cl_int, clFlush, (cl_command_queue))                                                          \
  X(cl_int, clFinish, (cl_command_queue))                                                         \
  X(cl_int, clWaitForEvents, (cl_uint, const cl_event *))                                         \
  X(cl_int, clRetainEvent, (cl_event))                                                            \
  X(cl_int, clGetEventInfo, (cl_event, cl_event_info, size_t, void *, size_t *))                  \
  X(cl_int, clReleaseEvent, (cl_event))                                                           \
  X(cl_int, clSetEventCallback, (cl_event, cl_int, void (*)(cl_event, cl_int, void *), void *))   \
  X(cl_event, clCreateUserEvent, (cl_context, cl_int *))                                          \
  X(cl_int, clSetUserEventStatus, (cl_event, cl_int))                                             \
  X(cl_int, clEnqueueMarkerWithWaitList,                                                          \
    (cl_command_queue, cl_uint, const cl_event *, cl_event *))                                    \
  X(cl_program, clCreateProgramWithSource,                                                        \
    (cl_context, cl_uint, const char **, const size_t *, cl_int *))                               \
  X(cl_int, clBuildProgram,                                                                       \
    (cl_program, cl_uint, const cl_device_id *, const char *, void (*)(cl_program, void *),       \
     void *))                                                                                     \
  X(cl_int, clGetProgramBuildInfo,                                                                \
    (cl_program, cl_device_id, cl_program_build_info, size_t, void *, size_t *))                  \
  X(cl_int, clReleaseProgram, (cl_program))                                                       \
  X(cl_kernel, clCreateKernel, (cl_program, const char *, cl_int *))                              \
  X(cl_int, clReleaseKernel, (cl_kernel))                                                         \
  X(cl_int, clGetKernelInfo, (cl_kernel, cl_kernel_info, size_t, void *, size_t *))               \
  X(cl_int, clGetKernelArgInfo, (cl_kernel, cl_uint, cl_uint, size_t, void *, size_t *))          \
  X(cl_int, clGetKernelWorkGroupInfo,                                                             \
    (cl_kernel, cl_device_id, cl_uint, size_t, void *, size_t *))                                 \
  X(cl_int, clSetKernelArg, (cl_kernel, cl_uint, size_t, const void *))                           \
  X(cl_int, clEnqueueNDRangeKernel,                                                               \
    (cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *, const size_t *,        \
     cl_uint, const cl_event *, cl_event *))

// The resolved entry points (opencl_loader.c); valid once devbuf__opencl_load succeeded.
typedef struct devbuf__opencl_api {
#define DEVBUF_OPENCL_POINTER_(ret, name, params) ret(*name) params;
  DEVBUF_OPENCL_FUNCTIONS(DEVBUF_OPENCL_POINTER_)
#undef DEVBUF_OPENCL_POINTER_
} devbuf__opencl_api;

#endif
