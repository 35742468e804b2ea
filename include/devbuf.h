// devbuf: device memory buffers for array libraries, ML compilers and runtimes.
//
// One C API over CPU, OpenCL and CUDA memory: devices, a caching allocator per device,
// reference-counted buffers and views with dtype and shape, host access that never races
// with device work, copies, and read-only mapped files.
//
// Conventions (every declaration below follows them):
// - Every fallible call returns a devbuf_status; DEVBUF_OK is 0. Results go to trailing
//   `out_` parameters, which are written only on success.
// - When a call fails, devbuf_last_error() holds a message for the calling thread that
//   names the offending values. A failure caused by another carries the cause after it,
//   each part with its status: "IO_ERROR: queue 3 on opencl:0 failed: allocating 64 MiB on
//   opencl:0: OUT_OF_MEMORY: ...". Reporting an error never allocates.
// - Objects are reference counted. A `_release` of NULL does nothing. Every object a call
//   hands out through an `out_` parameter is owned by the caller, who releases it once.
// - NULL, one rule for every function: a call that returns a status answers
//   INVALID_ARGUMENT (naming the argument) for a NULL object or a NULL required pointer,
//   and does nothing else; an `out_` parameter described as optional may be NULL. A getter
//   given NULL answers 0, NULL or false (devbuf_buffer_dtype: DEVBUF_DTYPE_COUNT, which is
//   no dtype; devbuf_device_kind_of: 0, which is no kind); `_retain(NULL)` returns NULL.
// - Unless a function says otherwise it is thread-safe: any thread may call it on any
//   object it holds a reference to.
// - The library never prints and never aborts on input from a caller or a file.
#ifndef DEVBUF_H
#define DEVBUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define DEVBUF_API __declspec(dllexport)
#else
#define DEVBUF_API __attribute__((visibility("default")))
#endif

#define DEVBUF_VERSION_MAJOR 0
#define DEVBUF_VERSION_MINOR 1
#define DEVBUF_VERSION_PATCH 0

// The most dimensions a buffer's shape may have.
#define DEVBUF_MAX_NDIM 32

// ---------------------------------------------------------------------------------------
// Status codes
// ---------------------------------------------------------------------------------------

// X(name, value, description). One table makes the enum, the names and the descriptions.
#define DEVBUF_STATUS_TABLE(X)                                                        \
  X(OK, 0, "success")                                                                 \
  X(INVALID_ARGUMENT, 1, "an argument is invalid")                                    \
  X(OUT_OF_MEMORY, 2, "out of memory, or over a memory, cache or buffer-count limit") \
  X(OVERFLOW, 3, "a size computation overflows")                                      \
  X(OUT_OF_RANGE, 4, "a range lies outside its buffer")                               \
  X(TYPE_MISMATCH, 5, "the requested dtype differs from the buffer's")                \
  X(SIZE_MISMATCH, 6, "byte sizes differ")                                            \
  X(NOT_ALLOCATED, 7, "the buffer has no memory yet")                                 \
  X(NOT_CPU_ACCESSIBLE, 8, "the memory cannot be accessed by the CPU; use copies")    \
  X(READ_ONLY, 9, "the memory is read-only")                                          \
  X(IN_USE, 10, "submitted device work uses the bytes")                               \
  X(HOST_ACCESS_OPEN, 11, "a host access to the bytes is open")                       \
  X(UNAVAILABLE, 12, "the backend or device is not available")                        \
  X(TIMEOUT, 13, "the wait timed out")                                                \
  X(IO_ERROR, 14, "an operating-system call on a file failed")                        \
  X(FORMAT_ERROR, 15, "malformed input data")                                         \
  X(DEVICE_FAILURE, 16, "device work failed")                                         \
  X(UNSUPPORTED, 17, "the operation is not supported by this backend or dtype")       \
  X(NOT_FOUND, 18, "no such item")                                                    \
  X(INJECTED_FAULT, 19, "a fault injected for testing")                               \
  X(CANCELLED, 20, "the work was cancelled before it ran")

typedef enum devbuf_status {
#define DEVBUF_STATUS_ENUM_(name, value, text) DEVBUF_##name = value,
  DEVBUF_STATUS_TABLE(DEVBUF_STATUS_ENUM_)
#undef DEVBUF_STATUS_ENUM_
} devbuf_status;

// The constant's name without prefix ("OUT_OF_MEMORY"); "UNKNOWN" for other values.
DEVBUF_API const char *devbuf_status_name(devbuf_status status);
// A one-line description of the code (not of the call that failed: see devbuf_last_error).
DEVBUF_API const char *devbuf_status_str(devbuf_status status);
// The message of the calling thread's most recent failed call, naming the values that
// were wrong. Valid until the thread's next failing call. Never NULL ("" before any error).
// UTF-8: bytes of no character, and control characters other than newline and tab (ESC, a
// name's own escape sequences), appear as \xNN.
DEVBUF_API const char *devbuf_last_error(void);

// ---------------------------------------------------------------------------------------
// Data types
// ---------------------------------------------------------------------------------------

// X(name, bits, dlpack_code, dlpack_bits, safetensors_name)
// DLPack codes follow dlpack.h 1.x (kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4,
// kDLComplex 5, kDLBool 6, kDLFloat8_e4m3fn 10, ...).
#define DEVBUF_DTYPE_TABLE(X)                 \
  X(BOOL, 8, 6, 8, "BOOL")                    \
  X(INT8, 8, 0, 8, "I8")                      \
  X(INT16, 16, 0, 16, "I16")                  \
  X(INT32, 32, 0, 32, "I32")                  \
  X(INT64, 64, 0, 64, "I64")                  \
  X(UINT8, 8, 1, 8, "U8")                     \
  X(UINT16, 16, 1, 16, "U16")                 \
  X(UINT32, 32, 1, 32, "U32")                 \
  X(UINT64, 64, 1, 64, "U64")                 \
  X(FLOAT16, 16, 2, 16, "F16")                \
  X(BFLOAT16, 16, 4, 16, "BF16")              \
  X(FLOAT32, 32, 2, 32, "F32")                \
  X(FLOAT64, 64, 2, 64, "F64")                \
  X(COMPLEX64, 64, 5, 64, "C64")              \
  X(FLOAT8_E4M3, 8, 10, 8, "F8_E4M3")         \
  X(FLOAT8_E5M2, 8, 12, 8, "F8_E5M2")         \
  X(FLOAT8_E8M0, 8, 14, 8, "F8_E8M0")         \
  X(FLOAT8_E4M3FNUZ, 8, 11, 8, "F8_E4M3FNUZ") \
  X(FLOAT8_E5M2FNUZ, 8, 13, 8, "F8_E5M2FNUZ") \
  X(FLOAT6_E2M3, 6, 15, 6, "F6_E2M3")         \
  X(FLOAT6_E3M2, 6, 16, 6, "F6_E3M2")         \
  X(FLOAT4_E2M1, 4, 17, 4, "F4")

typedef enum devbuf_dtype {
#define DEVBUF_DTYPE_ENUM_(name, bits, code, dlbits, st) DEVBUF_##name,
  DEVBUF_DTYPE_TABLE(DEVBUF_DTYPE_ENUM_)
#undef DEVBUF_DTYPE_ENUM_
      DEVBUF_DTYPE_COUNT
} devbuf_dtype;

// Lower-case name ("float32", "float8_e4m3"); NULL for a value outside the enum.
DEVBUF_API const char *devbuf_dtype_name(devbuf_dtype dtype);
// Size of one element in bits (4 for float4_e2m1); 0 for a value outside the enum.
DEVBUF_API unsigned devbuf_dtype_bits(devbuf_dtype dtype);
// The DLPack type code (DLDataTypeCode) and bit width (both outputs optional);
// DEVBUF_INVALID_ARGUMENT if unknown.
DEVBUF_API devbuf_status devbuf_dtype_dlpack(devbuf_dtype dtype, uint8_t *out_code,
                                             uint8_t *out_bits);
// The dtype with a lower-case devbuf name or a safetensors name ("F32"); NOT_FOUND if none.
DEVBUF_API devbuf_status devbuf_dtype_from_name(const char *name, devbuf_dtype *out_dtype);
// The safetensors name ("BF16"); NULL for a value outside the enum.
DEVBUF_API const char *devbuf_dtype_safetensors_name(devbuf_dtype dtype);
// Bytes taken by `count` elements: OVERFLOW if the product overflows, INVALID_ARGUMENT
// if sub-byte elements do not fill a whole number of bytes.
DEVBUF_API devbuf_status devbuf_dtype_bytes(devbuf_dtype dtype, size_t count, size_t *out_bytes);

// ---------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------

typedef struct devbuf_device devbuf_device_t;
typedef struct devbuf_allocator devbuf_allocator_t;
typedef struct devbuf_buffer devbuf_buffer_t;

// The kinds of device, one per backend. The library's registry of backends numbers them from
// 1 (devbuf_device_kind_count, devbuf_device_kind_name): these three first, then any other
// backend of the build.
typedef enum devbuf_device_kind {
  DEVBUF_DEVICE_CPU = 1,
  DEVBUF_DEVICE_OPENCL = 2,
  DEVBUF_DEVICE_CUDA = 3,
} devbuf_device_kind;

// How many kinds of device this build has: kinds 1 to this number exist (a kind whose driver
// is missing exists; opening its devices answers UNAVAILABLE).
DEVBUF_API size_t devbuf_device_kind_count(void);
// A kind's name, which is also its specs' prefix ("cpu", "opencl", "cuda"); NULL for a number
// that is no kind of this build.
DEVBUF_API const char *devbuf_device_kind_name(devbuf_device_kind kind);

// Kinds of memory a device's allocators hand out.
typedef enum devbuf_memory_kind {
  DEVBUF_MEMORY_DEVICE = 0,       // the device's own memory (on the CPU, host memory)
  DEVBUF_MEMORY_HOST_VISIBLE = 1, // addressed by the device and the CPU alike (host access follows
                                  // the usual rules); on CUDA, pinned host memory the device maps
  DEVBUF_MEMORY_MANAGED =
      2, // CUDA managed (unified) memory, migrating on demand (host access rules apply)
  // Memory other processes can map (devbuf_buffer_export): on the CPU memory files (memfd),
  // on CUDA device memory with a POSIX descriptor handle. Not on OpenCL.
  DEVBUF_MEMORY_SHAREABLE = 3,
} devbuf_memory_kind;

// What runs a device's kernels.
typedef enum devbuf_processor {
  DEVBUF_PROCESSOR_CPU = 1,         // the host's cores (the cpu backend; OpenCL CPU devices, PoCL)
  DEVBUF_PROCESSOR_GPU = 2,         // a GPU (every CUDA device; OpenCL GPU devices)
  DEVBUF_PROCESSOR_ACCELERATOR = 3, // another kind (OpenCL accelerators and custom devices)
} devbuf_processor;

// What a device is, as its driver reports it.
typedef struct devbuf_device_info {
  const char *name;          // valid while the device lives
  const char *version;       // the driver's version text ("OpenCL 3.0 PoCL ..."); "" if none
  uint64_t global_memory;    // bytes
  uint64_t max_allocation;   // the largest single allocation, in bytes
  size_t alignment;          // of allocations, and of views handed to kernels
  int host_unified;          // device memory is host memory
  uint64_t svm_capabilities; // OpenCL shared virtual memory bits (0: none)
  // What runs its kernels: how an OpenCL program, say, picks its code for CPUs or GPUs.
  devbuf_processor processor;
  uint32_t capabilities; // DEVBUF_CAN_* bits: what its backend does
} devbuf_device_info_t;

// What a device can do (devbuf_device_info_t.capabilities), as its backend declares it; a
// call that needs a missing one answers UNSUPPORTED.
enum {
  DEVBUF_CAN_QUEUE = 1u << 0,     // queues: fills, copies, events, host tasks
  DEVBUF_CAN_C_KERNELS = 1u << 1, // C kernels over its memory (devbuf_queue_submit)
  DEVBUF_CAN_PROGRAMS = 1u << 2,  // device programs (devbuf_program_build, devbuf_queue_launch)
  DEVBUF_CAN_SHARE = 1u << 3,     // memory other processes map (devbuf_buffer_export)
  DEVBUF_CAN_GROW = 1u << 4,      // growable segments: addresses reserved, memory mapped in
};

// Opens a device by spec: "cpu" (also "cpu:0"), "opencl:N", "cuda:N". Opening a spec
// twice hands out the same device (one caching allocator per device). A backend that is
// not built or whose driver is missing answers UNAVAILABLE with the reason; a malformed
// spec answers INVALID_ARGUMENT. `out_device` must be released by the caller.
DEVBUF_API devbuf_status devbuf_device_open(const char *spec, devbuf_device_t **out_device);
DEVBUF_API devbuf_device_t *devbuf_device_retain(devbuf_device_t *device);
DEVBUF_API void devbuf_device_release(devbuf_device_t *device);
DEVBUF_API devbuf_device_kind devbuf_device_kind_of(const devbuf_device_t *device);
// Canonical spec ("cpu", "opencl:0"). Valid while the device lives.
DEVBUF_API const char *devbuf_device_spec(const devbuf_device_t *device);
// Human-readable device name ("x86_64 host (2 cores)").
DEVBUF_API const char *devbuf_device_name(const devbuf_device_t *device);
// The allocation granularity of large blocks (a page on the CPU).
DEVBUF_API size_t devbuf_device_page_size(const devbuf_device_t *device);
// The device's caching allocator, borrowed: valid while the device lives; retain it to
// keep it longer.
DEVBUF_API devbuf_allocator_t *devbuf_device_allocator(devbuf_device_t *device);
// The caching allocator of one kind of memory, borrowed like devbuf_device_allocator; NULL
// for a kind the device does not have (managed memory outside CUDA, shareable memory on
// OpenCL). On devices whose own memory the CPU addresses (the CPU), every kind but
// DEVBUF_MEMORY_SHAREABLE is the same allocator.
DEVBUF_API devbuf_allocator_t *devbuf_device_allocator_for(devbuf_device_t *device,
                                                           devbuf_memory_kind kind);
DEVBUF_API devbuf_status devbuf_device_info(const devbuf_device_t *device,
                                            devbuf_device_info_t *out_info);
// Waits until all work submitted to the device has completed.
DEVBUF_API devbuf_status devbuf_device_synchronize(devbuf_device_t *device);

// ---------------------------------------------------------------------------------------
// Allocators
// ---------------------------------------------------------------------------------------

// Memory handed out by an allocator.
typedef struct devbuf_memory {
  void *host;      // CPU address, or NULL when the CPU cannot access the memory
  uint64_t device; // backend address or handle (on the CPU: the same as `host`)
  size_t size;     // bytes reserved, >= the bytes requested
  void *token;     // the allocator's own bookkeeping; opaque to everyone else
  // Where `device` is a handle (OpenCL: a cl_mem), the byte offset of this memory within
  // it: a caching allocator hands out blocks of one upstream allocation. 0 where `device`
  // is an address (the CPU, CUDA), whose blocks carry their offset in the address.
  size_t offset;
} devbuf_memory_t;

// The interface any allocator implements; a user supplies one to devbuf_allocator_create.
// `ctx` is the pointer given at creation. alloc returns memory of at least `size` bytes
// (size > 0), aligned to at least 64 bytes (where memory is a handle and an offset, as on
// OpenCL, the offset to the device's alignment, devbuf_device_info.alignment: views reach
// kernels as sub-buffers there; INVALID_ARGUMENT otherwise), or a status (with a message set by
// devbuf_set_error; without one, devbuf says which call failed). Memory with no host address
// where the CPU addresses memory (the cpu device) serves devbuf_allocator_alloc (a
// simulation's address space), not buffers, which refuse it. free takes back exactly what
// alloc handed out. Both may be called from any thread at once. destroy (optional) runs
// when the last reference goes.
// Optionally (all four or none), address space for growable segments: reserve `size`
// bytes of addresses with no memory behind them (out_reservation->size may be smaller),
// map memory behind [offset, offset + size) of a reservation (offsets and sizes are whole
// pages), unmap whole pages that are mapped (any part of what one map call mapped, or parts
// of several adjacent ones: an implementation that keeps a handle per map call maps page
// by page, as devbuf's CUDA backend does), and unreserve once nothing is mapped. map and
// unmap run while the caching allocator above holds its lock: they must not call into it.
// clear_cache (optional; new in the table's last place: a program built against an older
// devbuf.h is built again) gives back what the allocator keeps cached, when
// devbuf_allocator_clear_cache reaches it (directly, through adaptors, or from a replay's
// "# E"): from any thread, while alloc and free run on others; it must not clear the cache
// of an allocator over it, which would call it again.
typedef struct devbuf_allocator_vtable {
  devbuf_status (*alloc)(void *ctx, size_t size, devbuf_memory_t *out_memory);
  void (*free)(void *ctx, const devbuf_memory_t *memory);
  void (*destroy)(void *ctx);
  devbuf_status (*reserve)(void *ctx, size_t size, devbuf_memory_t *out_reservation);
  devbuf_status (*map)(void *ctx, const devbuf_memory_t *reservation, size_t offset, size_t size);
  void (*unmap)(void *ctx, const devbuf_memory_t *reservation, size_t offset, size_t size);
  void (*unreserve)(void *ctx, const devbuf_memory_t *reservation);
  void (*clear_cache)(void *ctx);
} devbuf_allocator_vtable_t;

// Statistics. Byte figures count the sizes the allocator reserved (after rounding).
typedef struct devbuf_allocator_stats {
  uint64_t active;             // bytes held by live allocations
  uint64_t peak;               // the highest `active` since creation or the last reset_peak
  uint64_t reserved;           // bytes held from upstream: active + cached
  uint64_t cached;             // bytes kept for reuse, not in use (reserved - active)
  uint64_t released_in_flight; // of those, bytes released while submitted work still uses
                               // them: only work ordered after that work gets them
  uint64_t segments;           // upstream allocations held
  uint64_t largest_free_block; // the largest request the cache can serve without upstream
  double fragmentation;        // 1 - active / reserved (0 when nothing is reserved)
  uint64_t mapped;             // bytes of files mapped through this allocator's device
  uint64_t live_buffers;       // allocations not yet freed
  uint64_t system_allocs;      // calls that reached the underlying (system/driver) allocator
  uint64_t system_frees;       // blocks given back to the underlying allocator
  uint64_t cache_hits;         // allocations served from the cache
  uint64_t alloc_calls;        // all allocation requests, including failed ones
  uint64_t failed_allocs;      // requests answered with an error
  uint64_t peak_reserved;      // the highest `reserved` since creation or the last reset_peak
} devbuf_allocator_stats_t;

// Wraps a user's allocator for `device`. `device` is retained; `vtable` must outlive the
// allocator (a static const table). Statistics count what passes through.
DEVBUF_API devbuf_status devbuf_allocator_create(devbuf_device_t *device,
                                                 const devbuf_allocator_vtable_t *vtable, void *ctx,
                                                 devbuf_allocator_t **out_allocator);

// Options of a caching allocator; zero means "no limit" for each limit.
typedef struct devbuf_caching_options {
  uint64_t memory_limit; // reserved bytes may not exceed it (idle segments go back first)
  uint64_t cache_limit;  // free bytes above it: idle segments go back, the longest idle first
  uint64_t max_buffers;  // live allocations may not exceed it
  // The page segments round to (a power of two from 4096 to 2^30); 0: the upstream
  // device's page. Read at creation only (set_options ignores it): a replay can take
  // another device's policy, such as a CUDA device's 2 MiB on the CPU.
  uint64_t page_size;
  // Growable segments (read at creation and by configure; set_options ignores it): each
  // pool is one segment in reserved address space that maps memory as it grows (in steps
  // of at least a 32nd of what it maps, up to 2 MiB; into interior holes, just the pages a
  // block lacks) and unmaps free pages, interior ones too: under a limit, at clear_cache,
  // and before a mapping would hold over 1/50 more than the most the blocks ever used (as
  // PyTorch's expandable segments, with a ceiling). UNSUPPORTED at creation when the
  // upstream cannot map memory into reserved addresses (the CPU's raw allocator can, and a
  // user's allocator with reserve/map/unmap/unreserve); INVALID_ARGUMENT for a page_size
  // that is not a multiple of the page the device maps in, over its raw allocator (CUDA maps
  // 2 MiB at a time).
  uint32_t growable; // nonzero: on
} devbuf_caching_options_t;

// A caching allocator over `upstream`: segments from upstream (requests up to 1 MiB share
// 2 MiB segments, below 10 MiB share 20 MiB ones, from 10 MiB on they get their own, rounded to
// 2 MiB or the page), blocks carved by best fit on (size, address), split on allocation and
// coalesced on release; sizes round to 512 bytes; limits give back whole idle segments,
// the longest idle first (docs/allocator.md). `upstream` is retained. Thread-safe.
// Speed: while no limit is set, each thread keeps a few released small blocks in its own
// bins, so the common alloc/free pair takes no lock; a thread's bins return to the shared
// pools when the thread exits, when a limit is set, and at clear_cache (other threads'
// bins at their next call). The pools have 16 shards with a short lock each.
DEVBUF_API devbuf_status devbuf_caching_allocator_create(devbuf_allocator_t *upstream,
                                                         const devbuf_caching_options_t *options,
                                                         devbuf_allocator_t **out_allocator);
// Changes the limits of a caching allocator at run time; INVALID_ARGUMENT for other kinds.
// Lowering a limit gives idle segments back at once.
DEVBUF_API devbuf_status devbuf_caching_allocator_set_options(
    devbuf_allocator_t *allocator, const devbuf_caching_options_t *options);
// Sets every option of a caching allocator that holds nothing yet (no segment, no live
// allocation), `growable` included: a device's own allocator (devbuf_device_allocator)
// takes growable segments this way before its first allocation. `page_size` is fixed at
// creation: 0 or the allocator's page. INVALID_ARGUMENT naming what it holds once it holds
// something; UNSUPPORTED for growable where the upstream cannot map (OpenCL, host-visible
// and managed memory). Allocations racing with it may take segments of either kind.
DEVBUF_API devbuf_status devbuf_caching_allocator_configure(
    devbuf_allocator_t *allocator, const devbuf_caching_options_t *options);

// The raw allocator of the device's backend (on the CPU: 64-byte aligned host memory,
// page-aligned at a page and above), without caching. Caller releases.
DEVBUF_API devbuf_status devbuf_device_raw_allocator(devbuf_device_t *device,
                                                     devbuf_allocator_t **out_allocator);

DEVBUF_API devbuf_allocator_t *devbuf_allocator_retain(devbuf_allocator_t *allocator);
DEVBUF_API void devbuf_allocator_release(devbuf_allocator_t *allocator);
// The device whose memory this allocator hands out (borrowed).
DEVBUF_API devbuf_device_t *devbuf_allocator_device(const devbuf_allocator_t *allocator);
// A short name: "raw", "caching", "stats", "trace", "fault", "custom".
DEVBUF_API const char *devbuf_allocator_kind(const devbuf_allocator_t *allocator);
// Allocates `size` bytes (> 0). OUT_OF_MEMORY names requested, active and limit figures.
DEVBUF_API devbuf_status devbuf_allocator_alloc(devbuf_allocator_t *allocator, size_t size,
                                                devbuf_memory_t *out_memory);
// Gives back memory from devbuf_allocator_alloc on the same allocator. A caching
// allocator's block that is not handed out now (freed twice), directly or through stats and
// fault adaptors, is left alone and not counted, with an INVALID_ARGUMENT in
// devbuf_last_error naming its address; also once its bytes went to other blocks or back
// upstream (clear_cache), while the allocator lives. Only a block handed out again with the
// very same bytes (address and size) cannot be told from it, as with any allocator.
DEVBUF_API void devbuf_allocator_free(devbuf_allocator_t *allocator, const devbuf_memory_t *memory);
// Statistics of this allocator. Every figure is exact while no other thread is allocating
// at the moment. `peak` is exact while one thread allocates; when several threads allocate
// (at once or in turns) it is the highest total seen when any thread reached a new high of
// its own, which may be below the true peak.
DEVBUF_API devbuf_status devbuf_allocator_stats(devbuf_allocator_t *allocator,
                                                devbuf_allocator_stats_t *out_stats);
// Sets peak to the current active figure.
DEVBUF_API void devbuf_allocator_reset_peak(devbuf_allocator_t *allocator);
// Gives every cached block back to the upstream allocator: a caching allocator's, a user
// allocator's through its vtable's clear_cache; an adaptor passes the call to its upstream
// (the trace adaptor records it, "# E"); a no-op elsewhere.
DEVBUF_API void devbuf_allocator_clear_cache(devbuf_allocator_t *allocator);

// A caching allocator's memory picture: every segment it holds and every block of it.
typedef enum devbuf_block_state {
  DEVBUF_BLOCK_FREE = 0,          // cached: any request that fits may take it
  DEVBUF_BLOCK_ACTIVE = 1,        // handed out
  DEVBUF_BLOCK_IN_FLIGHT = 2,     // released while submitted work still uses it: only work
                                  // ordered after that work may take it
  DEVBUF_BLOCK_THREAD_CACHED = 3, // free, kept in one thread's bin (or parked) for its next request
  DEVBUF_BLOCK_UNMAPPED = 4,      // free addresses of a growable segment with no memory
                                  // behind them (given back, or never mapped)
} devbuf_block_state;

typedef struct devbuf_snapshot_block {
  uint64_t offset, size; // bytes within the segment
  devbuf_block_state state;
} devbuf_snapshot_block_t;

typedef struct devbuf_snapshot_segment {
  uint64_t serial; // creation order (0, 1, ...)
  uint64_t device; // the upstream memory's `device` (an address or a handle)
  uint64_t size;
  const char *pool; // "small" or "large" (which requests it serves)
  size_t block_count;
  // In address order; their sizes add up to `size`, whatever other threads do meanwhile (of a
  // growable segment, `size` runs to its highest mapped byte: what it holds is `size` less
  // its unmapped blocks).
  const devbuf_snapshot_block_t *blocks;
} devbuf_snapshot_segment_t;

typedef struct devbuf_allocator_snapshot {
  size_t segment_count;
  const devbuf_snapshot_segment_t *segments; // in creation order
} devbuf_allocator_snapshot_t;

// Takes a snapshot of a caching allocator, or of the one a statistics, trace or fault
// adaptor wraps (exact while no other thread allocates or frees); UNSUPPORTED for other kinds. Free
// it with devbuf_allocator_snapshot_free.
DEVBUF_API devbuf_status devbuf_allocator_snapshot(devbuf_allocator_t *allocator,
                                                   devbuf_allocator_snapshot_t **out_snapshot);
DEVBUF_API void devbuf_allocator_snapshot_free(devbuf_allocator_snapshot_t *snapshot);

// Adaptors. Each wraps `upstream` (retained) and is itself an allocator.
// Counts calls and bytes; read them with devbuf_allocator_stats.
DEVBUF_API devbuf_status devbuf_stats_adaptor_create(devbuf_allocator_t *upstream,
                                                     devbuf_allocator_t **out_allocator);
// Appends one line per alloc and free to the file at `path` (created or truncated):
// "a <id> <size>" and "f <id>", where <id> numbers the allocations from 1, and "# E" for each
// devbuf_allocator_clear_cache through it (which it passes to the upstream). The file is a
// complete record once the adaptor is released; devbuf_trace_replay plays it back. A free
// of memory the adaptor does not hold now (freed already) is refused with a message and
// reaches neither the file nor the upstream. At most 2^26 allocations live at once (beyond,
// UNSUPPORTED).
DEVBUF_API devbuf_status devbuf_trace_adaptor_create(devbuf_allocator_t *upstream, const char *path,
                                                     devbuf_allocator_t **out_allocator);
// When a fault adaptor fails allocations (SQLite's test_malloc modes, plus a periodic one).
typedef enum devbuf_fault_mode {
  DEVBUF_FAULT_ONCE = 0,       // only call number fail_at
  DEVBUF_FAULT_PERSISTENT = 1, // call fail_at and every later call
  DEVBUF_FAULT_EVERY = 2,      // every fail_at-th call (fail_at, 2 x fail_at, ...)
} devbuf_fault_mode;

// Fails allocation calls (counted from 1) with INJECTED_FAULT as `mode` says; fail_at 0
// never fails. Frees always pass.
DEVBUF_API devbuf_status devbuf_fault_adaptor_create(devbuf_allocator_t *upstream, uint64_t fail_at,
                                                     devbuf_fault_mode mode,
                                                     devbuf_allocator_t **out_allocator);
// Re-arms a fault adaptor: counts calls from zero again.
DEVBUF_API devbuf_status devbuf_fault_adaptor_arm(devbuf_allocator_t *fault_adaptor,
                                                  uint64_t fail_at, devbuf_fault_mode mode);
// Number of faults a fault adaptor has injected so far.
DEVBUF_API uint64_t devbuf_fault_adaptor_fired(const devbuf_allocator_t *fault_adaptor);

// Result of replaying a trace (cache_clears is new: a program built against an older devbuf.h
// is built again).
typedef struct devbuf_trace_summary {
  uint64_t allocs;          // "a" lines replayed
  uint64_t frees;           // "f" lines replayed
  uint64_t failed_allocs;   // allocations the target allocator refused
  uint64_t peak_live_bytes; // most bytes requested and not yet freed at once
  uint64_t leaked;          // allocations the trace never freed (freed by the replay)
  uint64_t cache_clears;    // "# E" lines: the allocator's cache given back there
} devbuf_trace_summary_t;

// Replays a trace file against `allocator`, freeing anything still live at the end. A
// "# E" line (the trace adaptor's record of a clear_cache; in a trace of a PyTorch run, its
// allocator giving its cached segments back: torch.cuda.empty_cache(), or a retry after the
// GPU ran out of memory) calls devbuf_allocator_clear_cache(allocator) there; other lines
// that start with '#' are comments.
// Allocation ids must come as 1, 2, 3, ... (as the trace adaptor writes them); the replay's
// memory grows with the allocations live at once, at most 2^26 (UNSUPPORTED past that).
// FORMAT_ERROR names the line of a malformed or inconsistent record; IO_ERROR for a path
// that is not a regular file.
DEVBUF_API devbuf_status devbuf_trace_replay(const char *path, devbuf_allocator_t *allocator,
                                             devbuf_trace_summary_t *out_summary);
// Called once a record of a trace has been played: an allocation of `size` bytes (> 0), or
// the free (`size` 0) of allocation `id`; `refused` when the allocator refused that
// allocation (whose free then frees nothing). For pictures and statistics over time.
typedef void (*devbuf_trace_observer_fn)(void *context, uint64_t id, uint64_t size, int refused);
// devbuf_trace_replay, telling `observer` (optional) of every record in order.
DEVBUF_API devbuf_status devbuf_trace_replay_observed(const char *path,
                                                      devbuf_allocator_t *allocator,
                                                      devbuf_trace_observer_fn observer,
                                                      void *context,
                                                      devbuf_trace_summary_t *out_summary);

// Sets the calling thread's error message (printf format; NULL: the status name alone) and
// returns `status`; for user allocators and backends.
DEVBUF_API devbuf_status devbuf_set_error(devbuf_status status, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

// The host memory devbuf allocates for itself (object records, tables, lists; not the
// memory of buffers, which allocators hand out) all goes through these four functions,
// libc's by default: a program may count it, put it in its own heap, or fail it to test
// its error paths (as devbuf's own tests do, SQLite-style). Set them before any other
// devbuf call, or give functions that can free what libc's malloc returned (a counter or a
// fault injector that forwards to libc): memory allocated before is freed through the new
// `free`. `ctx` is passed to each. NULL restores libc's. INVALID_ARGUMENT if a function is
// missing. The memory they return must be aligned as libc's is (alignof(max_align_t)):
// devbuf keeps atomics and kernels' scalars in it. Not to be called while another thread is
// inside devbuf (queues' workers included).
typedef struct devbuf_host_memory_hooks {
  void *(*malloc)(void *ctx, size_t size);
  void *(*calloc)(void *ctx, size_t count, size_t size);
  void *(*realloc)(void *ctx, void *pointer, size_t size);
  void (*free)(void *ctx, void *pointer);
  void *ctx;
} devbuf_host_memory_hooks_t;
DEVBUF_API devbuf_status devbuf_set_host_memory_hooks(const devbuf_host_memory_hooks_t *hooks);

// ---------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------

// Options of devbuf_buffer_new/allocate.
enum {
  DEVBUF_BUFFER_ZERO = 1u << 0, // memory reads back zero once allocated
};

// A lazy buffer of `dtype` and `shape` (ndim entries; ndim 0 is a scalar of one element)
// from `allocator`: nothing is allocated until the first access that needs memory, and
// threads racing to that access allocate exactly once.
// OVERFLOW if the shape spans more than INT64_MAX elements or bytes (strides and offsets are
// signed 64-bit: the span is the product of the extents other than 0, which strides reach
// even where an extent of 0 leaves no element); INVALID_ARGUMENT for sub-byte dtypes whose
// elements do not fill whole bytes, ndim > DEVBUF_MAX_NDIM or unknown flags. `allocator` is
// retained. Caller releases `out_buffer`.
DEVBUF_API devbuf_status devbuf_buffer_new(devbuf_allocator_t *allocator, devbuf_dtype dtype,
                                           const size_t *shape, size_t ndim, uint32_t flags,
                                           devbuf_buffer_t **out_buffer);
// As devbuf_buffer_new, then allocates at once (errors of the allocator are returned).
DEVBUF_API devbuf_status devbuf_buffer_allocate(devbuf_allocator_t *allocator, devbuf_dtype dtype,
                                                const size_t *shape, size_t ndim, uint32_t flags,
                                                devbuf_buffer_t **out_buffer);
// Maps the file at `path` read-only and zero-copy (pages are read on first touch) as a
// uint8 buffer of the file's size on a CPU-accessible `device`. Every write access is
// refused (READ_ONLY). The mapping lives while any view of it does, counts in the device
// allocator's `mapped` statistic, and survives closing or deleting the file. It keeps one
// descriptor of the file open (devbuf's reads ask the file's size through it).
DEVBUF_API devbuf_status devbuf_buffer_map_file(devbuf_device_t *device, const char *path,
                                                devbuf_buffer_t **out_buffer);

// A view of `size` bytes at `offset` within `buffer` (relative to the buffer's own
// offset), with the same dtype and shape [size / element size]. OUT_OF_RANGE if it
// does not fit (overflow-safe), INVALID_ARGUMENT if offset or size is not a whole number
// of elements. May be taken before allocation; shares the storage and keeps it alive.
DEVBUF_API devbuf_status devbuf_buffer_view(devbuf_buffer_t *buffer, size_t offset, size_t size,
                                            devbuf_buffer_t **out_view);
// A view of the same bytes with another dtype and shape (a reinterpretation); the byte
// size must be equal (SIZE_MISMATCH), and the view's offset in its storage a multiple of the
// new dtype's alignment (INVALID_ARGUMENT: typed pointers to the elements must be aligned).
DEVBUF_API devbuf_status devbuf_buffer_reshape(devbuf_buffer_t *buffer, devbuf_dtype dtype,
                                               const size_t *shape, size_t ndim,
                                               devbuf_buffer_t **out_view);

// A typed view in one step: the bytes at `offset` within `buffer` (relative to its own
// offset) as `dtype` and `shape`, however the buffer is typed (a part of a uint8 buffer as
// a float32 matrix, say). OUT_OF_RANGE if the shape's bytes do not fit (overflow-safe),
// INVALID_ARGUMENT if `offset` is not a whole number of `dtype` elements or the view's
// offset in its storage is not a multiple of `dtype`'s alignment, and the errors of
// devbuf_buffer_new for the shape. Shares the storage and keeps it alive.
DEVBUF_API devbuf_status devbuf_buffer_view_as(devbuf_buffer_t *buffer, size_t offset,
                                               devbuf_dtype dtype, const size_t *shape, size_t ndim,
                                               devbuf_buffer_t **out_view);

DEVBUF_API devbuf_buffer_t *devbuf_buffer_retain(devbuf_buffer_t *buffer);
// Drops a reference. The last reference to a storage returns its memory at once: to
// the allocator's cache when no submitted work uses it; otherwise, from a caching
// allocator, to its cache in flight (counted as cached and as released in flight): a
// buffer allocated by a submission may reuse those bytes at once, also merged into a larger
// block (its work is ordered after the old work, and the CPU waits for it); the CPU never
// gets them before the old work completes. Other allocators get the memory back then.
DEVBUF_API void devbuf_buffer_release(devbuf_buffer_t *buffer);

// Allocates the storage if it has no memory yet. When threads race, exactly one allocates.
DEVBUF_API devbuf_status devbuf_buffer_ensure_allocated(devbuf_buffer_t *buffer);
DEVBUF_API int devbuf_buffer_is_allocated(const devbuf_buffer_t *buffer);

DEVBUF_API size_t devbuf_buffer_size(const devbuf_buffer_t *buffer);   // bytes of this view
DEVBUF_API int devbuf_buffer_is_empty(const devbuf_buffer_t *buffer);  // size == 0
DEVBUF_API size_t devbuf_buffer_offset(const devbuf_buffer_t *buffer); // bytes into storage
DEVBUF_API devbuf_dtype devbuf_buffer_dtype(const devbuf_buffer_t *buffer);
DEVBUF_API size_t devbuf_buffer_ndim(const devbuf_buffer_t *buffer);
// The shape (ndim entries), valid while the buffer lives.
DEVBUF_API const size_t *devbuf_buffer_shape(const devbuf_buffer_t *buffer);
DEVBUF_API size_t devbuf_buffer_count(const devbuf_buffer_t *buffer); // elements
// The allocator (borrowed; NULL for mapped files).
DEVBUF_API devbuf_allocator_t *devbuf_buffer_allocator(const devbuf_buffer_t *buffer);
DEVBUF_API devbuf_device_t *devbuf_buffer_device(const devbuf_buffer_t *buffer);
// Shared by a buffer, its retains and its views (morok-device's id()), and by the
// buffers imported from it (devbuf_buffer_import): ids carry the process id, so two storages
// alive on the machine share an id only when one is an import of the other.
DEVBUF_API uint64_t devbuf_buffer_storage_id(const devbuf_buffer_t *buffer);
// Unique per handle: every view has its own.
DEVBUF_API uint64_t devbuf_buffer_handle_id(const devbuf_buffer_t *buffer);
DEVBUF_API int devbuf_buffer_is_mapped(const devbuf_buffer_t *buffer);
DEVBUF_API int devbuf_buffer_is_read_only(const devbuf_buffer_t *buffer);
DEVBUF_API int devbuf_buffer_is_cpu_accessible(const devbuf_buffer_t *buffer);
// Whether submitted device work still uses the bytes: true from submission until the last
// such work has completed.
DEVBUF_API int devbuf_buffer_in_use(const devbuf_buffer_t *buffer);

// Host access: the CPU and the device never race on a buffer. Each call opens an access
// that stays open until devbuf_buffer_end_access(buffer, pointer) closes it, or until the
// handle that opened it is released (which closes it: the pointer must not be used after
// that, even where other handles keep the memory alive); allocates first if needed. While
// it is open, submitting work that would race with it is refused (HOST_ACCESS_OPEN).
// contents: read access. NOT_CPU_ACCESSIBLE for device-only memory; IN_USE while
// submitted work writes the bytes. Zero-length buffers give a NULL pointer and size 0.
// Memory reused from a released buffer whose work is still running is first waited for.
DEVBUF_API devbuf_status devbuf_buffer_contents(devbuf_buffer_t *buffer, const void **out_data,
                                                size_t *out_size);
// contents_mut: write access. Also READ_ONLY for mapped files; IN_USE while submitted work
// reads or writes the bytes.
DEVBUF_API devbuf_status devbuf_buffer_contents_mut(devbuf_buffer_t *buffer, void **out_data,
                                                    size_t *out_size);
// Blocking variants: wait for the conflicting submitted work to complete (or fail, or be
// cancelled: the queue and its events report that) instead of answering IN_USE.
DEVBUF_API devbuf_status devbuf_buffer_contents_wait(devbuf_buffer_t *buffer, const void **out_data,
                                                     size_t *out_size);
DEVBUF_API devbuf_status devbuf_buffer_contents_mut_wait(devbuf_buffer_t *buffer, void **out_data,
                                                         size_t *out_size);
// Closes the access that handed out `data` through this handle. INVALID_ARGUMENT if no
// such access is open.
DEVBUF_API devbuf_status devbuf_buffer_end_access(devbuf_buffer_t *buffer, const void *data);
// Number of host accesses open on the bytes of this handle (through any handle). An access
// to zero bytes covers no bytes: it is counted only by the handle that opened it, and it
// never conflicts with copies, submissions or other accesses.
DEVBUF_API size_t devbuf_buffer_open_accesses(const devbuf_buffer_t *buffer);

// An ndarray-like view. Strides count elements (C order for buffers).
typedef struct devbuf_array {
  void *data;
  devbuf_dtype dtype;
  size_t ndim;
  size_t shape[DEVBUF_MAX_NDIM];
  int64_t strides[DEVBUF_MAX_NDIM];
} devbuf_array_t;

// Typed read (as_array) and write (as_array_mut) access; `dtype` must equal the buffer's
// (TYPE_MISMATCH). Open accesses like contents/contents_mut; end with out_array->data.
DEVBUF_API devbuf_status devbuf_buffer_as_array(devbuf_buffer_t *buffer, devbuf_dtype dtype,
                                                devbuf_array_t *out_array);
DEVBUF_API devbuf_status devbuf_buffer_as_array_mut(devbuf_buffer_t *buffer, devbuf_dtype dtype,
                                                    devbuf_array_t *out_array);
// A typed slice: pointer and element count; read access, ended with *out_data.
DEVBUF_API devbuf_status devbuf_buffer_as_slice(devbuf_buffer_t *buffer, devbuf_dtype dtype,
                                                const void **out_data, size_t *out_count);
// Reads the single element into `out_value` (room for one element of `dtype`, whole
// bytes). INVALID_ARGUMENT naming the count if the buffer does not hold exactly one.
DEVBUF_API devbuf_status devbuf_buffer_item(devbuf_buffer_t *buffer, devbuf_dtype dtype,
                                            void *out_value);

// Copies. Byte sizes must match (SIZE_MISMATCH). They work on every backend and
// across backends; copies between overlapping views of one storage behave like memmove.
// They wait for submitted work on their bytes, answer HOST_ACCESS_OPEN for bytes under an
// open host access, and while they run, racing submissions are refused. copy_from reads
// the source's bytes and writes the destination's, nothing else, also when both are views
// of one storage: a read access open on the source does not refuse it, and bytes between
// the two views are neither waited for nor locked.
DEVBUF_API devbuf_status devbuf_buffer_copyin(devbuf_buffer_t *buffer, const void *src,
                                              size_t size);
DEVBUF_API devbuf_status devbuf_buffer_copyout(devbuf_buffer_t *buffer, void *dst, size_t size);
DEVBUF_API devbuf_status devbuf_buffer_copy_from(devbuf_buffer_t *dst, devbuf_buffer_t *src);

// Waits for all work submitted to the buffer's device.
DEVBUF_API devbuf_status devbuf_buffer_synchronize(devbuf_buffer_t *buffer);
// Waits only for submitted work that uses this buffer's bytes.
DEVBUF_API devbuf_status devbuf_buffer_wait(devbuf_buffer_t *buffer);
// The device address of the view's first byte; NOT_ALLOCATED if it has no memory.
// On the CPU it is the host address. UNSUPPORTED on OpenCL, whose memory has no address:
// see devbuf_buffer_device_handle.
DEVBUF_API devbuf_status devbuf_buffer_device_ptr(devbuf_buffer_t *buffer, uint64_t *out_address);
// The backend's handle of the memory under the view and the view's byte offset within it:
// on OpenCL the cl_mem of the caching allocator's segment and the offset of the view in
// it (pass both, as a sub-buffer or a kernel offset); elsewhere the address of the
// view's allocation block and the view's offset in it. NOT_ALLOCATED without memory.
DEVBUF_API devbuf_status devbuf_buffer_device_handle(devbuf_buffer_t *buffer, uint64_t *out_handle,
                                                     size_t *out_offset);
// Address and length for CPU writes that the caller orders with an event; no host
// access is opened and in-flight work is not checked. It first waits for the work of a
// previous owner of reused memory. NOT_CPU_ACCESSIBLE for device memory, READ_ONLY for
// mapped files.
DEVBUF_API devbuf_status devbuf_buffer_unsynchronized_ptr(devbuf_buffer_t *buffer, void **out_data,
                                                          size_t *out_size);
// One line describing the buffer, like snprintf: writes at most `capacity` bytes
// (terminated when capacity > 0) and returns the length it needed.
DEVBUF_API size_t devbuf_buffer_describe(const devbuf_buffer_t *buffer, char *out_text,
                                         size_t capacity);

// ---------------------------------------------------------------------------------------
// Events: timelines. An event holds a counter that only grows; work and the host
// signal values and wait for them. A failure of the work that was to signal it marks the
// event failed: a wait for a value the event had reached before then still succeeds, and
// every other wait returns that failure, whatever signals the event later (another queue's
// signal of a higher value counts for nothing, and the host's is refused).
// ---------------------------------------------------------------------------------------

typedef struct devbuf_event devbuf_event_t;

// A new event whose value is `initial`. Caller releases.
DEVBUF_API devbuf_status devbuf_event_create(uint64_t initial, devbuf_event_t **out_event);
DEVBUF_API devbuf_event_t *devbuf_event_retain(devbuf_event_t *event);
DEVBUF_API void devbuf_event_release(devbuf_event_t *event);
// Signals `value` from the host. INVALID_ARGUMENT if it is below the current value; the
// event's failure status (its message after the values) if it failed.
DEVBUF_API devbuf_status devbuf_event_signal(devbuf_event_t *event, uint64_t value);
// Waits until the value is at least `value`: spins briefly, then blocks. timeout_ns 0
// only checks; UINT64_MAX waits forever. TIMEOUT when the time passes first; the failure
// status (DEVICE_FAILURE, CANCELLED, ...) if the event failed.
DEVBUF_API devbuf_status devbuf_event_wait(devbuf_event_t *event, uint64_t value,
                                           uint64_t timeout_ns);
// The current value; once the event failed, the value it failed at (what is raised after a
// failure counts for nothing, here as for waits).
DEVBUF_API uint64_t devbuf_event_value(const devbuf_event_t *event);
// OK, or the status of the failure that reached the event (its message goes to
// devbuf_last_error).
DEVBUF_API devbuf_status devbuf_event_status(const devbuf_event_t *event);

// ---------------------------------------------------------------------------------------
// Other processes on this machine: buffers and events shared between processes. An export
// describes one buffer or event together with the descriptors that carry it; it travels
// over a Unix socket (devbuf_export_send, devbuf_export_receive) or is imported in the
// process that made it. docs/processes.md tells the whole story.
//
// Buffers: the memory must come from a device's DEVBUF_MEMORY_SHAREABLE allocator (the CPU:
// memory files; CUDA: device memory with POSIX descriptor handles); elsewhere export answers
// UNSUPPORTED with the reason. The importer maps the whole segment that holds the buffer
// (up to 20 MiB for buffers below 10 MiB): memory that must stay private belongs to another
// allocator. The imported buffer has the same bytes, dtype, shape and storage id, its own
// handle, and no ordering with the exporter's work: order it with an exported event.
//
// Lifetime: each export is one lease on the memory, held by the export object until it is
// sent or freed, then by the importer's storage. The exporter's memory does not go back to
// its allocator while any lease on it is held, even after every exporter handle is released;
// a lease ends when the importer's last handle goes, or when the importer dies (the kernel
// closes its descriptors). Memory kept for importers returns at the next reclaim: on each
// export, each release of an exported storage, each allocation from a shareable
// allocator (at most once a millisecond), and devbuf_export_reclaim.
//
// Events: the exporter signals (from the host or its queues), importers wait, from the host
// or on their queues, with the usual rules. An importer's event fails when the exporter's
// does, when the exporter releases it, and when the exporter's process dies (waits for
// values already reached still succeed). Signalling an imported event is refused.
// ---------------------------------------------------------------------------------------

typedef struct devbuf_export devbuf_export_t;

typedef enum devbuf_export_kind {
  DEVBUF_EXPORT_BUFFER = 1,
  DEVBUF_EXPORT_EVENT = 2,
} devbuf_export_kind;

// Exports `buffer` (allocating it if it is not yet). Caller frees the export.
DEVBUF_API devbuf_status devbuf_buffer_export(devbuf_buffer_t *buffer,
                                              devbuf_export_t **out_export);
// Exports `event`: its value, failure and end reach importers. Caller frees the export.
DEVBUF_API devbuf_status devbuf_event_export(devbuf_event_t *event, devbuf_export_t **out_export);
// Sends the export as one message with its descriptors on a connected Unix socket
// (SCM_RIGHTS); they are closed here once sent, so the importer holds the lease. IO_ERROR
// with the reason when sending fails (the export keeps its descriptors then);
// INVALID_ARGUMENT for a socket that is no Unix socket, an export sent or imported already,
// or one another thread is sending or importing at the moment.
DEVBUF_API devbuf_status devbuf_export_send(devbuf_export_t *shared, int socket);
// Receives one export from a Unix socket, blocking (set SO_RCVTIMEO for a limit). Every
// field is checked: FORMAT_ERROR names what is wrong with a message that is not a devbuf
// export (its descriptors are closed); IO_ERROR when the socket ends or fails;
// INVALID_ARGUMENT for a socket that is no Unix socket; UNAVAILABLE when this process had no
// descriptor left for the export's (the kernel dropped them: the sender must export again).
DEVBUF_API devbuf_status devbuf_export_receive(int socket, devbuf_export_t **out_export);
DEVBUF_API devbuf_export_kind devbuf_export_kind_of(const devbuf_export_t *shared);
// The process that made the export.
DEVBUF_API int devbuf_export_pid(const devbuf_export_t *shared);
// Maps the exported buffer on `device` (of the exporter's kind) as a new buffer. The
// export's descriptors move into it: each export is imported once (INVALID_ARGUMENT after).
DEVBUF_API devbuf_status devbuf_buffer_import(devbuf_device_t *device, devbuf_export_t *shared,
                                              devbuf_buffer_t **out_buffer);
// An event that follows the exported one (a watcher thread mirrors it). Once per export.
DEVBUF_API devbuf_status devbuf_event_import(devbuf_export_t *shared, devbuf_event_t **out_event);
// Frees the export, closing the descriptors it still holds (its lease ends with them).
DEVBUF_API void devbuf_export_free(devbuf_export_t *shared);
// Gives memory that importers no longer hold back to its allocators. *out_bytes_held
// (optional): the bytes exported storages this process released still keep for importers.
DEVBUF_API devbuf_status devbuf_export_reclaim(uint64_t *out_bytes_held);

// ---------------------------------------------------------------------------------------
// Queues: in-order queues of device work. On the CPU each queue has a worker
// thread, so work runs while the caller goes on. Every submission declares the buffers it
// uses; the tracker makes work on other queues that touches the same bytes (read after
// write, write after read, write after write) wait for it, while work on disjoint views
// runs freely. A submission never blocks on device work. When work fails, work on other
// queues that reads or overwrites its buffers' bytes fails too; work on memory reused from
// a released buffer only waits for that buffer's work, whatever its outcome.
// ---------------------------------------------------------------------------------------

typedef struct devbuf_queue devbuf_queue_t;

typedef enum devbuf_access {
  DEVBUF_ACCESS_READ = 1,
  DEVBUF_ACCESS_WRITE = 2,
  DEVBUF_ACCESS_READ_WRITE = 3,
} devbuf_access;

// One buffer (or view: its byte range) that a submission uses, and how.
typedef struct devbuf_use {
  devbuf_buffer_t *buffer;
  devbuf_access access;
} devbuf_use_t;

// What a CPU kernel receives: the address and size of each use, in submission order, and
// a copy of the scalar arguments, aligned as malloc aligns (alignof(max_align_t)), so that
// the kernel may read them as its parameters' struct.
typedef struct devbuf_kernel_args {
  void *const *data;
  const size_t *sizes;
  size_t count;
  const void *scalars;
  size_t scalars_size;
} devbuf_kernel_args_t;

// A CPU kernel. Returning anything but DEVBUF_OK fails the work: the message it set with
// devbuf_set_error reaches the queue, its events and their waiters.
typedef devbuf_status (*devbuf_cpu_kernel_fn)(const devbuf_kernel_args_t *args);

// Queues are bounded: a new queue holds at most DEVBUF_QUEUE_DEFAULT_DEPTH items submitted
// and not yet retired (devbuf_queue_set_depth changes it). As many as each of the library's
// pools of recycled work items: a producer held at the bound makes and frees no item.
#define DEVBUF_QUEUE_DEFAULT_DEPTH 4096u
enum {
  DEVBUF_QUEUE_FULL_REFUSES = 1u << 0, // a submission to a full queue refuses, never waits
};
// A new queue on `device`. Caller releases.
DEVBUF_API devbuf_status devbuf_queue_create(devbuf_device_t *device, devbuf_queue_t **out_queue);
DEVBUF_API devbuf_queue_t *devbuf_queue_retain(devbuf_queue_t *queue);
// Bounds the work `queue` holds: at most `max_items` submitted and not yet retired (0: no
// bound). A submission to a full queue waits until the worker retires some (a brief spin,
// then sleep); with DEVBUF_QUEUE_FULL_REFUSES it answers TIMEOUT at once, naming the
// depth. From a kernel or host task of the queue itself it is refused (INVALID_ARGUMENT),
// never waited for. Threads that submit at once may each take one item over the bound.
// Items held back behind a host event that only the submitting thread would signal never
// retire: such a program needs a depth above what it queues, or the refusing mode.
DEVBUF_API devbuf_status devbuf_queue_set_depth(devbuf_queue_t *queue, uint64_t max_items,
                                                uint32_t flags);
// The last release does not wait: work already submitted still runs, and the queue goes
// away when it is done. Use devbuf_queue_finish or devbuf_queue_cancel first to wait or stop.
DEVBUF_API void devbuf_queue_release(devbuf_queue_t *queue);
DEVBUF_API devbuf_device_t *devbuf_queue_device(const devbuf_queue_t *queue);

// Submits a CPU kernel over `uses` (use_count entries; buffers of the queue's device, each
// allocated now if lazy) with `scalars_size` bytes of scalars copied at once. Refused
// (nothing is submitted) with HOST_ACCESS_OPEN when a host access races with a use, with
// INVALID_ARGUMENT for bad uses, READ_ONLY for writes to mapped files, and with the
// original failure once the queue has failed. The kernel is ordinary C in this process:
// devbuf orders it by the byte ranges of its uses, but does not contain it. Bytes it reads
// or writes outside args->sizes[i] of a use (or writes to a use it declared read-only) are
// not ordered against other work, and a write there corrupts whatever lies there, as any C
// code's would.
DEVBUF_API devbuf_status devbuf_queue_submit(devbuf_queue_t *queue, devbuf_cpu_kernel_fn kernel,
                                             const devbuf_use_t *uses, size_t use_count,
                                             const void *scalars, size_t scalars_size);
// Host work in the queue, on any device: `task` runs on the queue's worker thread (on the
// CPU's queues, or on the thread in devbuf_queue_finish, below), one at a time, in queue
// order: after the queue's earlier work has completed on the device, before its later work
// starts; its uses are tracked and refused like a kernel's, so work of other queues that
// conflicts with them is ordered around it. It gets each use's host address where the CPU
// can address the memory, NULL where it cannot (device memory: take its address with
// devbuf_buffer_device_ptr for a library that reads it, such as a CUDA-aware MPI). What it
// returns fails the queue as a kernel's would. This is how a communication call
// (MPI_Allreduce) sits between the kernel that writes its input and the one that reads its
// output without a synchronize. On the CPU it is devbuf_queue_submit.
DEVBUF_API devbuf_status devbuf_queue_host_task(devbuf_queue_t *queue, devbuf_cpu_kernel_fn task,
                                                const devbuf_use_t *uses, size_t use_count,
                                                const void *scalars, size_t scalars_size);
// Device programs. On opencl:N, `source` is OpenCL C, built once per device, source and
// options, and cached (building the same source again hands out the same build); a build
// that fails answers DEVICE_FAILURE with the compiler's log in the message. On cuda:N,
// `source` is PTX text or a cubin/fatbin image, loaded as a module (options must be empty).
// The CPU runs C functions instead (devbuf_queue_submit): UNSUPPORTED there.
typedef struct devbuf_program devbuf_program_t;
DEVBUF_API devbuf_status devbuf_program_build(devbuf_device_t *device, const char *source,
                                              const char *options, devbuf_program_t **out_program);
DEVBUF_API devbuf_program_t *devbuf_program_retain(devbuf_program_t *program);
DEVBUF_API void devbuf_program_release(devbuf_program_t *program);

// The grid of a launch: `dims` (1 to 3) global sizes, and local sizes (all 0: the driver
// chooses).
typedef struct devbuf_launch {
  unsigned dims;
  size_t global[3];
  size_t local[3];
} devbuf_launch_t;
// A scalar argument: its bytes are copied at submission.
typedef struct devbuf_arg {
  const void *data;
  size_t size;
} devbuf_arg_t;
// Launches kernel `name` of `program`: its arguments are the uses' buffers (each view as
// a buffer of its own bytes; a view's offset must be a multiple of the device's alignment,
// INVALID_ARGUMENT otherwise), then the scalars, in order. Refused at submission: a grid
// whose work items overflow a size_t (OVERFLOW), local sizes given for some dimensions only
// or not dividing their global sizes, a grid the driver cannot run (CUDA's block and grid
// limits and the kernel's own threads per block; OpenCL's local sizes per dimension and per
// group, and more than 2^32 - 1 OpenCL work-groups, counted where the driver chooses in the
// largest groups that divide the grid), and arguments the kernel does not take: another
// count, or (OpenCL) a buffer where it declares a value or the reverse, or an image, sampler
// or pipe, each named (INVALID_ARGUMENT). Ordered like every submission; a launch the
// driver refuses later (a scalar of the wrong size) fails the queue as a failing kernel does.
DEVBUF_API devbuf_status devbuf_queue_launch(devbuf_queue_t *queue, devbuf_program_t *program,
                                             const char *name, const devbuf_launch_t *launch,
                                             const devbuf_use_t *uses, size_t use_count,
                                             const devbuf_arg_t *args, size_t arg_count);
// Built-ins: fill `buffer` with a repeated pattern (pattern_size divides the buffer size),
// and copy `src` into `dst` (equal sizes; overlapping views of one storage like memmove;
// refused, INVALID_ARGUMENT, between overlapping bytes of an import and its exporter in one
// process, one memory at two addresses: devbuf_buffer_copy_from copies those).
DEVBUF_API devbuf_status devbuf_queue_fill(devbuf_queue_t *queue, devbuf_buffer_t *buffer,
                                           const void *pattern, size_t pattern_size);
DEVBUF_API devbuf_status devbuf_queue_copy(devbuf_queue_t *queue, devbuf_buffer_t *dst,
                                           devbuf_buffer_t *src);
// Signals `value` on `event` when the work submitted before has completed. A value at or
// below the event's by then changes nothing (two queues may raise one timeline in turn).
DEVBUF_API devbuf_status devbuf_queue_signal(devbuf_queue_t *queue, devbuf_event_t *event,
                                             uint64_t value);
// Holds the work submitted after this until `event` reaches `value`. A value that only a
// later item of the same queue would signal, or that nothing can signal any more (its event
// released by everyone else), holds the queue for good: devbuf_queue_cancel ends such a
// wait, and a queue released while held never drains (nor does devbuf_device_synchronize).
DEVBUF_API devbuf_status devbuf_queue_wait(devbuf_queue_t *queue, devbuf_event_t *event,
                                           uint64_t value);
// Waits on the host until every submitted work item has completed; returns the queue's
// failure, if any. On the CPU's queues, when the queue's worker sleeps, the calling thread
// runs what is queued itself, in order, one item at a time as the worker would (and with the
// same waits refused to it), instead of waking the worker and sleeping until it is done:
// kernels and host tasks must not count on running on one particular thread. Where the
// finishes keep coming soon after the submissions, the worker stops being woken for them:
// it dozes on a timer (1 ms; the environment's DEVBUF_QUEUE_DOZE_US, in microseconds, sets
// it for the queues made after it), and takes the work when any thread blocks on it another
// way (an event, a host access, a synchronize), when the queue is released, or when a doze
// ends with the work still queued (docs/hazards.md).
DEVBUF_API devbuf_status devbuf_queue_finish(devbuf_queue_t *queue);
// Drops the work not yet started (its events fail with CANCELLED at once) and waits for the
// item that is running. The dropped work counts as done only after that item: work ordered
// after it (a buffer's reused memory included) never overlaps the running item. Cancels
// from several threads at once each return once the running item is done. The queue stays
// usable. Work of other queues that reads or writes what dropped work would have written,
// or waits for an event it would have signalled, fails with CANCELLED naming the cause, and
// stops its own queue as a failure does (memory reuse alone passes nothing on).
DEVBUF_API devbuf_status devbuf_queue_cancel(devbuf_queue_t *queue);
// OK, or the failure that stopped the queue (its message goes to devbuf_last_error).
DEVBUF_API devbuf_status devbuf_queue_status(const devbuf_queue_t *queue);

// ---------------------------------------------------------------------------------------
// Weight files: safetensors (https://github.com/huggingface/safetensors), read strictly.
// A file is 8 bytes of little-endian header length N, N bytes of JSON header, then the
// tensors' bytes. Every rule of the reference reader is enforced: N at most 100,000,000
// and inside the file; a JSON object whose members are tensors {"dtype", "shape",
// "data_offsets"} and an optional "__metadata__" map of strings; known dtype names; valid
// UTF-8; no duplicate names; shape x dtype size equal to the offsets' span (sub-byte
// tensors in whole bytes); offsets inside the data, with no overlaps and no holes. A file
// that breaks one is refused with FORMAT_ERROR naming the tensor and the values.
// ---------------------------------------------------------------------------------------

typedef struct devbuf_tensor_file devbuf_tensor_file_t;

// The largest header the reader accepts, as in the reference reader.
#define DEVBUF_SAFETENSORS_MAX_HEADER 100000000u

typedef struct devbuf_tensor_info {
  const char *name; // UTF-8, valid while the table lives
  devbuf_dtype dtype;
  size_t ndim;
  const size_t *shape;  // ndim entries, valid while the table lives
  uint64_t begin, end;  // byte offsets within the data section
  uint64_t file_offset; // where the tensor's bytes start in the file
} devbuf_tensor_info_t;

// Options of devbuf_safetensors_load (all fields may be zero).
enum {
  // Writable copies from the device's allocator even where zero-copy views are possible.
  DEVBUF_LOAD_COPY = 1u << 0,
  // Copies in one allocation: every tensor loaded is a view of one buffer of the allocator,
  // each at a multiple of the device's alignment (at least 64 bytes), in file order. A
  // model's weights then take one segment of its own size, where one allocation per tensor
  // leaves parts of the caching allocator's shared segments empty. Zero-copy loads are one
  // mapping already: there it changes nothing.
  DEVBUF_LOAD_ONE_ALLOCATION = 1u << 1,
};
typedef struct devbuf_load_options {
  uint32_t flags; // DEVBUF_LOAD_*
  // Called on the loading thread as each tensor's buffer becomes ready, in file order
  // (`buffer` is borrowed; retain it to keep it). Optional.
  void (*on_tensor)(void *context, size_t index, const devbuf_tensor_info_t *info,
                    devbuf_buffer_t *buffer);
  void *context;
  // Where the tensors' memory comes from (NULL: the device's own allocator): an allocator
  // of `device`, such as the device's allocator wrapped by a user (statistics, limits,
  // faults). Giving one makes every tensor a copy. Optional.
  devbuf_allocator_t *allocator;
  // Which tensors to load (NULL: all), asked once per tensor in file order before any is
  // read: one it answers 0 for gets no buffer (devbuf_tensor_file_buffer gives NULL) and
  // none of its bytes are read or copied. `context` as for on_tensor. Optional.
  int (*select)(void *context, size_t index, const devbuf_tensor_info_t *info);
} devbuf_load_options_t;

// Loads the file at `path` as a table of named buffers on `device`. On a CPU-accessible
// device (without DEVBUF_LOAD_COPY) each tensor is a zero-copy, read-only view of one
// read-only mapping of the file; elsewhere each is a buffer from the allocator filled
// by reading the file (pread: a file that shrinks meanwhile is IO_ERROR, never a crash).
// Buffers outlive the table (retain them) and the file.
// While zero-copy tensors live, the file may be deleted or renamed, and replaced by a new
// file under its name (what an atomic writer such as devbuf_safetensors_write does), but
// not truncated or rewritten in place: the mapping shows the file's current bytes, so a
// rewrite changes the tensors, and reading bytes past a shrunk end faults. devbuf's own
// reads of such memory (copyout, copy_from) report IO_ERROR instead of faulting, or instead
// of the zeros read past an end cut inside a page; pointers
// handed out (contents, as_array, DLPack) read the memory directly. Load with
// DEVBUF_LOAD_COPY for tensors that are immune to later changes of the file.
// IO_ERROR for files that cannot be opened or mapped, FORMAT_ERROR for a broken file,
// UNSUPPORTED for ndim > DEVBUF_MAX_NDIM.
DEVBUF_API devbuf_status devbuf_safetensors_load(devbuf_device_t *device, const char *path,
                                                 const devbuf_load_options_t *options,
                                                 devbuf_tensor_file_t **out_file);
// Reads and validates only the header of the file at `path` (the data is not read): a
// table without buffers.
DEVBUF_API devbuf_status devbuf_safetensors_inspect(const char *path,
                                                    devbuf_tensor_file_t **out_file);
// Validates a whole file image held in memory: a table without buffers.
DEVBUF_API devbuf_status devbuf_safetensors_parse(const void *data, size_t size,
                                                  devbuf_tensor_file_t **out_file);
DEVBUF_API void devbuf_tensor_file_release(devbuf_tensor_file_t *file);

// Tensors are numbered 0..count-1 in the order of their bytes in the file.
DEVBUF_API size_t devbuf_tensor_file_count(const devbuf_tensor_file_t *file);
DEVBUF_API devbuf_status devbuf_tensor_file_info(const devbuf_tensor_file_t *file, size_t index,
                                                 devbuf_tensor_info_t *out_info);
// The index of the tensor called `name`; NOT_FOUND naming it if there is none.
DEVBUF_API devbuf_status devbuf_tensor_file_find(const devbuf_tensor_file_t *file, const char *name,
                                                 size_t *out_index);
// The tensor's buffer, borrowed (valid while the table lives; retain it to keep it); NULL
// for tables made by inspect/parse, a tensor the load's `select` left out, or an index out
// of range.
DEVBUF_API devbuf_buffer_t *devbuf_tensor_file_buffer(const devbuf_tensor_file_t *file,
                                                      size_t index);
// The header's "__metadata__" entries, in file order; strings valid while the table lives.
DEVBUF_API size_t devbuf_tensor_file_metadata_count(const devbuf_tensor_file_t *file);
DEVBUF_API devbuf_status devbuf_tensor_file_metadata(const devbuf_tensor_file_t *file, size_t index,
                                                     const char **out_key, const char **out_value);
// The value of metadata `key`, or NULL.
DEVBUF_API const char *devbuf_tensor_file_metadata_get(const devbuf_tensor_file_t *file,
                                                       const char *key);
// Byte sizes: the header (N), the data section, the whole file.
DEVBUF_API uint64_t devbuf_tensor_file_header_size(const devbuf_tensor_file_t *file);
DEVBUF_API uint64_t devbuf_tensor_file_data_size(const devbuf_tensor_file_t *file);

typedef struct devbuf_named_buffer {
  const char *name;        // UTF-8, unique, not "__metadata__"
  devbuf_buffer_t *buffer; // any device; its dtype and shape are written
} devbuf_named_buffer_t;
typedef struct devbuf_metadata_entry {
  const char *key, *value; // UTF-8
} devbuf_metadata_entry_t;

// Writes `count` buffers and optional metadata to `path` atomically: a temporary file in
// the same folder is written, synced and renamed over `path`, so readers see the old file
// or the whole new one. Tensors are laid out by decreasing element size, then name, after
// a header padded to 8 bytes, so that every tensor is aligned to its element size. Each
// buffer is read like devbuf_buffer_copyout (waiting for work that writes it).
DEVBUF_API devbuf_status devbuf_safetensors_write(const char *path,
                                                  const devbuf_named_buffer_t *tensors,
                                                  size_t count,
                                                  const devbuf_metadata_entry_t *metadata,
                                                  size_t metadata_count);

// ---------------------------------------------------------------------------------------
// DLPack 1.x interop (https://dmlc.github.io/dlpack/latest/). The structures are those of
// dlpack.h, which callers include themselves; devbuf only names them here.
// ---------------------------------------------------------------------------------------

struct DLManagedTensor;
struct DLManagedTensorVersioned;

// Export flags.
enum {
  // Export for reading only: the tensor carries DLPack's read-only flag and holds a read
  // access instead of a write access (mapped files are always exported read-only).
  DEVBUF_DLPACK_READ_ONLY = 1u << 0,
  // CUDA's pinned and managed memory exported as kDLCUDA, device memory at the same address
  // (unified addressing), for consumers that take no other CUDA type: PyTorch's
  // torch.from_dlpack refuses kDLCUDAHost and kDLCUDAManaged. No effect on other memory.
  DEVBUF_DLPACK_AS_DEVICE = 1u << 1,
};

// Exports a buffer or view as a DLPack tensor (version 1.1) of its dtype and shape, with
// C-order strides and the view's byte offset. The tensor keeps the storage alive and holds
// a host access (write unless read-only, waiting first for conflicting work) until the
// consumer calls its deleter, so submitted work cannot race with the consumer. Device-only
// memory is exported without a host access, with its device address. Buffers are allocated
// first if needed. The tensor's device type is its device's (devbuf_device_dlpack_type),
// except on CUDA for pinned host memory (DEVBUF_MEMORY_HOST_VISIBLE: kDLCUDAHost, 3) and
// managed memory (kDLCUDAManaged, 13), which numpy reads as the CPU's memory and PyTorch
// refuses (DEVBUF_DLPACK_AS_DEVICE exports them as kDLCUDA).
// DLPack's device type (DLDeviceType) of the device's own memory: kDLCPU (1), kDLCUDA (2),
// kDLOpenCL (4); 0 for NULL. Its device id is the index of the device's spec.
DEVBUF_API int32_t devbuf_device_dlpack_type(const devbuf_device_t *device);
DEVBUF_API devbuf_status devbuf_buffer_to_dlpack_versioned(
    devbuf_buffer_t *buffer, uint32_t flags, struct DLManagedTensorVersioned **out_tensor);
// The same as a legacy (unversioned) DLManagedTensor, which has no read-only flag: READ_ONLY
// for read-only memory (mapped files), and INVALID_ARGUMENT for the DEVBUF_DLPACK_READ_ONLY
// flag; only the versioned export can describe either.
DEVBUF_API devbuf_status devbuf_buffer_to_dlpack(devbuf_buffer_t *buffer, uint32_t flags,
                                                 struct DLManagedTensor **out_tensor);
// Imports a DLPack tensor without copying: a buffer over its memory that calls the
// producer's deleter when its last view is released. Only compact row-major tensors (strides
// NULL or C-order; any stride on dimensions of size 1) of one lane of a devbuf dtype on a
// device devbuf can open are accepted; otherwise UNSUPPORTED naming the field, and
// ownership stays with the caller. Data off its element's alignment (as C has it: 4 bytes
// for complex64) is INVALID_ARGUMENT. A versioned tensor of another major version is refused;
// its read-only flag makes the buffer read-only. Pinned host memory (kDLCUDAHost) arrives as
// the CPU's memory, managed memory (kDLCUDAManaged) as device memory of its CUDA device.
DEVBUF_API devbuf_status devbuf_buffer_from_dlpack_versioned(
    struct DLManagedTensorVersioned *tensor, devbuf_buffer_t **out_buffer);
DEVBUF_API devbuf_status devbuf_buffer_from_dlpack(struct DLManagedTensor *tensor,
                                                   devbuf_buffer_t **out_buffer);

#ifdef __cplusplus
}
#endif
#endif // DEVBUF_H
