// The backend layer's interface: one table of functions per device kind. A backend sees raw
// memory and operations handed to it as data; it never sees buffers, queues, work items,
// events or other devices, and hands back the driver's own events. Not installed.
#ifndef DEVBUF_BACKEND_H
#define DEVBUF_BACKEND_H

#include "../base/base.h"

// An operation a queue hands to its device.
typedef enum devbuf__op_kind {
  DEVBUF__OP_FILL,   // operands[0] with `pattern`, repeated
  DEVBUF__OP_COPY,   // operands[1] into operands[0], of the same size
  DEVBUF__OP_LAUNCH, // a device program's kernel over the operands, then the arguments
  DEVBUF__OP_CALL,   // a C kernel on the CPU, over host memory
} devbuf__op_kind;

// Bytes [offset, offset + size) of an allocation. A zero-length operand is tracked by
// nothing, so its memory may already be gone: backends must not touch it.
typedef struct devbuf__operand {
  devbuf_memory_t memory;
  size_t offset, size;
  bool mapped; // a file mapping: its pages fault if the file shrank, so reads are guarded
} devbuf__operand;

// Only the fields its kind reads are set.
typedef struct devbuf__op {
  devbuf__op_kind kind;
  const devbuf__operand *operands;
  size_t operand_count;
  const void *pattern; // FILL
  size_t pattern_size;
  void *program; // LAUNCH: the backend's build (program_build)
  const char *kernel_name;
  const devbuf_launch_t *launch;
  size_t arg_count; // LAUNCH: the scalars' sizes, then their bytes one after another
  const size_t *arg_sizes;
  const void *arg_bytes;
  devbuf_cpu_kernel_fn kernel; // CALL
  const devbuf_kernel_args_t *kernel_args;
  // Driver events of earlier operations on this device that the operation must wait for
  // on the device (from enqueue or gate_enqueue; alive until enqueue returns).
  void *const *waits;
  size_t wait_count;
} devbuf__op;

// What `complete` reports on: one enqueued operation, its driver event (NULL where it left
// none), a name for messages, and its status (in: OK, or a failure the queue knows of
// already; out: the device's failure where it found one).
typedef struct devbuf__device_done {
  void *event;
  const char *what;
  devbuf_status status;
} devbuf__device_done;

// Optional entries may be NULL. Its name and kind come from the registry (registry.c).
typedef struct devbuf__backend {
  int32_t dlpack_device_type;   // DLPack's DLDeviceType of its memory (kDLCPU 1, kDLCUDA 2, ...)
  bool one_device;              // its spec is the bare name ("cpu"; "cpu:0" opens it too)
  bool host_memory_in_children; // a forked child may use its allocators (host memory): they
                                // are locked across fork()
  // Fills device->name, page_size, host_accessible, backend_state for device `index`.
  // UNAVAILABLE with the reason when the driver or device is missing.
  devbuf_status (*open)(devbuf_device_t *device, int index);
  void (*close)(devbuf_device_t *device); // (optional)
  devbuf_status (*raw_alloc)(devbuf_device_t *device, devbuf_memory_kind kind, size_t size,
                             devbuf_memory_t *out);
  void (*raw_free)(devbuf_device_t *device, const devbuf_memory_t *memory);
  // (optional, all four or none) Address space for growable segments: reserve `size`
  // bytes of addresses with no memory behind them (out->size may come back smaller), put
  // memory behind [offset, offset + size) of a reservation, take back exactly such a range,
  // give the reservation back once nothing is mapped in it.
  devbuf_status (*raw_reserve)(devbuf_device_t *device, size_t size, devbuf_memory_t *out);
  devbuf_status (*raw_map)(devbuf_device_t *device, const devbuf_memory_t *reservation,
                           size_t offset, size_t size);
  void (*raw_unmap)(devbuf_device_t *device, const devbuf_memory_t *reservation, size_t offset,
                    size_t size);
  void (*raw_unreserve)(devbuf_device_t *device, const devbuf_memory_t *reservation);
  // (optional, all three or none) Memory another process maps: raw_alloc of
  // DEVBUF_MEMORY_SHAREABLE makes it; raw_export hands out a new descriptor for such an
  // allocation (the caller's to close); raw_import maps `size` bytes of memory another
  // process exported (the descriptor stays the caller's), raw_unimport unmaps it.
  devbuf_status (*raw_export)(devbuf_device_t *device, const devbuf_memory_t *memory, int *out_fd);
  devbuf_status (*raw_import)(devbuf_device_t *device, int fd, size_t size, devbuf_memory_t *out);
  void (*raw_unimport)(devbuf_device_t *device, const devbuf_memory_t *memory);
  // (optional) Checks a device handle a caller hands over (a DLPack tensor's data) before any
  // operation uses it: that it is memory of this device's context with at least `bytes`
  // bytes. Sets out->device and out->offset (a sub-buffer: its parent and its place there,
  // so that views of it can be sub-buffers too). Without it the handle is taken as given.
  devbuf_status (*import_handle)(devbuf_device_t *device, uint64_t handle, size_t bytes,
                                 devbuf_memory_t *out);
  // Copies between host memory and device memory, and within the device. `offset` is
  // in bytes from the start of the memory. Ranges of one memory may overlap (memmove).
  devbuf_status (*write)(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                         const void *src, size_t size);
  devbuf_status (*read)(devbuf_device_t *device, const devbuf_memory_t *src, size_t offset,
                        void *dst, size_t size);
  devbuf_status (*copy)(devbuf_device_t *device, const devbuf_memory_t *dst, size_t dst_offset,
                        const devbuf_memory_t *src, size_t src_offset, size_t size);
  // Fills `size` bytes at `offset` with zero.
  devbuf_status (*zero)(devbuf_device_t *device, const devbuf_memory_t *dst, size_t offset,
                        size_t size);
  devbuf_status (*synchronize)(devbuf_device_t *device); // (optional)

  // ---- execution (optional: a device without it has no queues) ----
  // A device queue of the driver's, in order (optional: the CPU runs operations on the
  // calling thread, and `queue` is NULL for it below).
  devbuf_status (*queue_create)(devbuf_device_t *device, void **out_queue);
  void (*queue_destroy)(devbuf_device_t *device, void *queue);
  // Runs `op` after op->waits, or enqueues it behind them. *out_event: a driver event that
  // completes with the operation (the caller's, for event_release), or NULL when the
  // operation is over on return or failed.
  devbuf_status (*enqueue)(devbuf_device_t *device, void *queue, const devbuf__op *op,
                           void **out_event);
  // (optional) Waits until the `count` operations, enqueued on `queue` in this order, have
  // completed, and sets the status of those that failed on the device; the first such
  // failure, its message set.
  devbuf_status (*complete)(devbuf_device_t *device, void *queue, devbuf__device_done *items,
                            size_t count);
  void (*event_release)(devbuf_device_t *device, void *event); // (with queue_create)
  bool runs_c_kernels; // DEVBUF__OP_CALL: C kernels over host memory
  // Whether a command behind a failed event fails too (OpenCL's wait lists): waits that
  // only order memory reuse, whose failure is not the waiter's, are then left to the host.
  bool waits_pass_failure;
  // (optional, all three or none) Host-signalled waits on the device: a barrier enqueued on
  // `queue` holds what is enqueued after it until gate_open; *out_event completes once it
  // has opened. UNSUPPORTED where the driver cannot (the host then waits instead). The
  // gate is opened exactly once and released after that, never opened again.
  devbuf_status (*gate_enqueue)(devbuf_device_t *device, void *queue, void **out_gate,
                                void **out_event);
  void (*gate_open)(devbuf_device_t *device, void *queue, void *gate);
  void (*gate_release)(devbuf_device_t *device, void *queue, void *gate);
  // Programs (optional): build (cached by source and options), release, and the check of a
  // launch at submission: the kernel exists, the grid is one the driver runs, and, as far as
  // the driver tells, the kernel takes `buffers` buffers then `scalars` scalars (NOT_FOUND,
  // INVALID_ARGUMENT naming the argument): what a driver would crash on never reaches it.
  devbuf_status (*program_build)(devbuf_device_t *device, const char *source, const char *options,
                                 void **out_program);
  void (*program_release)(devbuf_device_t *device, void *program);
  devbuf_status (*program_check_launch)(devbuf_device_t *device, void *program, const char *name,
                                        const devbuf_launch_t *launch, size_t buffers,
                                        size_t scalars);
} devbuf__backend;

extern const devbuf__backend devbuf__backend_cpu;
extern const devbuf__backend devbuf__backend_opencl;
extern const devbuf__backend devbuf__backend_cuda;
extern const devbuf__backend devbuf__backend_null; // the tests' builds only

// ---- the registry (registry.c) ----

typedef struct devbuf__backend_entry {
  const char *name; // the kind's name, and its specs' prefix
  const devbuf__backend *backend;
} devbuf__backend_entry;

size_t devbuf__backend_count(void);
// Kind K's entry, or NULL for no kind of this build.
const devbuf__backend_entry *devbuf__backend_of_kind(devbuf_device_kind kind);
// The entry of the `length` characters at `name`, or NULL.
const devbuf__backend_entry *devbuf__backend_named(const char *name, size_t length);
// The first entry whose memory is of DLPack's device type `type`, or NULL.
const devbuf__backend_entry *devbuf__backend_of_dlpack_type(int32_t type);
devbuf_device_kind devbuf__backend_kind(const devbuf__backend_entry *entry);
// The specs the registry knows, for messages ("cpu, opencl:N, cuda:N").
void devbuf__backend_names(char *out, size_t capacity);
// Whether a backend's table is whole: every required entry set, every "all or none" group
// all or none, what needs an enqueue with one. If not, `why` says what is missing.
bool devbuf__backend_table_check(const char *name, const devbuf__backend *backend, char *why,
                                 size_t capacity);

// A device: what its backend fills in when it opens it, and what the layers above keep of
// it (the registry and synchronization are core/device.c's, the allocators the memory
// layer's). Backends get it to read and fill their own fields.
struct devbuf_device {
  devbuf__refcount refs; // external references; 0 destroys (under registry lock)
  // devbuf_device_release, given as data by core/device.c: layers below the devices (the
  // allocators) keep a device alive without calling into the core layer.
  void (*release)(devbuf_device_t *device);
  const devbuf__backend *backend;
  devbuf_device_kind kind; // its backend's place in the registry
  int index;               // N of "kind:N"
  char spec[32];           // canonical spec, e.g. "cpu"
  char name[128];          // filled by the backend
  size_t page_size;        // granularity of large blocks, a power of two
  bool host_accessible;    // device memory has a CPU address
  char version[96];        // the driver's version text ("OpenCL 3.0 PoCL ...")
  uint64_t global_memory, max_allocation;
  size_t alignment;                        // of allocations and of views passed to kernels
  bool unified_memory;                     // device and host share physical memory
  bool managed_memory;                     // the device has CUDA managed memory
  uint64_t svm_capabilities;               // OpenCL SVM bits; 0 where there is no SVM
  devbuf_processor processor;              // what runs its kernels (set by open)
  bool shares_memory;                      // raw_alloc makes DEVBUF_MEMORY_SHAREABLE memory
  unsigned char uuid[16];                  // the device's identity across processes (0s: none)
  devbuf_allocator_t *allocator;           // the device's caching allocator (embedded)
  devbuf_allocator_t *host_allocator;      // host-visible memory (the same as `allocator` when
                                           // device memory is host-accessible)
  devbuf_allocator_t *managed_allocator;   // managed memory; NULL without it
  devbuf_allocator_t *shareable_allocator; // memory other processes map; NULL without it
  bool memory_handles;                     // memory.device is a handle and memory.offset applies
                                           // (OpenCL cl_mem); elsewhere an address
  atomic_uint_least64_t mapped_bytes;      // bytes of live file mappings on this device
  void *backend_state;                     // owned by the backend
  struct devbuf_device *next_open;         // registry list
  // Work items of all its queues, retired (by their workers) and submitted (under
  // submit_lock, below): none is pending when the two agree, retired read first. Two counts
  // on two lines, where one count of pending items made every submission a locked
  // instruction on a line that every worker wrote.
  atomic_uint_least64_t work_retired;
  atomic_uint queues_made;    // for each queue's number, which messages use
  atomic_size_t sync_waiters; // threads in devbuf_device_synchronize
  pthread_mutex_t work_lock;  // with work_idle: synchronize's wait
  pthread_cond_t work_idle;
  devbuf__spinlock submit_lock;         // one submission at a time records its uses (submit.c)
  atomic_uint_least64_t work_submitted; // under submit_lock (see work_retired)
  // Holds on the device by the storages of its own allocators (core.h), counted apart from
  // `refs` on the line of the thread that takes or drops one (base.h): threads that make
  // and drop buffers each write a line of their own. A thread may drop what another took, so
  // each line counts holds taken and dropped, both only growing: what is held is all taken
  // less all dropped, read dropped first (core/device.c). The device goes once `refs` and
  // that are both 0, and its record is kept for the next device to open (a thread that
  // dropped the last hold still reads `unreferenced`).
  struct {
    atomic_uint_least64_t taken, dropped;
    char apart[64 - 2 * sizeof(atomic_uint_least64_t)]; // no two lines' counts share one
  } holds[DEVBUF__THREAD_LINES + 1];
  atomic_bool unreferenced; // `refs` reached 0 while holds were left: each drop checks
  bool open;                // in the registry (not a kept record)
};

// Whether work submitted to the device's queues has not retired. Retired is read first: it
// never passes submitted (counted before an item is queued), so equal counts mean that at
// that read, everything submitted had retired.
static inline bool devbuf__device_work_pending(const devbuf_device_t *device) {
  uint64_t retired = atomic_load(&device->work_retired);
  return atomic_load(&device->work_submitted) != retired;
}

// A reference to a device for the layers below it (see `release` above).
static inline devbuf_device_t *devbuf__device_keep(devbuf_device_t *device) {
  devbuf__ref_retain(&device->refs);
  return device;
}
static inline void devbuf__device_drop(devbuf_device_t *device) { device->release(device); }

#endif // DEVBUF_BACKEND_H
