// Devices: spec parsing, the registry of open devices (one per spec), and lifetime.
#include "core.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Thread_local devbuf_queue_t *devbuf__worker_queue;
_Thread_local bool (*devbuf__worker_settle)(void);
_Thread_local devbuf_device_t *devbuf__worker_device;

devbuf_status devbuf__refuse_self_wait(const char *what) {
  return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                       "%s called from a kernel or host task running on a queue of %s: it would "
                       "wait for work of that queue, which cannot go on until this work returns",
                       what, devbuf__worker_device ? devbuf__worker_device->spec : "?");
}

static pthread_mutex_t registry_lock = DEVBUF__MUTEX_INITIALIZER;
static devbuf_device_t *open_devices;

// ---- fork: the registry, then each open device's submission lock, then the allocators ----

// The allocators a forked child may meet on the device, distinct (some kinds share one); how
// many. Only the CPU's: a child uses no GPU device (docs/processes.md), and TSan follows at
// most 64 locks held at once.
static size_t device_allocators(devbuf_device_t *device, devbuf_allocator_t *list[4]) {
  size_t count = 0;
  if (!device->backend->host_memory_in_children) return 0;
  devbuf_allocator_t *all[] = {device->allocator, device->host_allocator, device->managed_allocator,
                               device->shareable_allocator};
  for (size_t i = 0; i < 4; i++) {
    bool seen = !all[i];
    for (size_t j = 0; j < count && !seen; j++) seen = list[j] == all[i];
    if (!seen) list[count++] = all[i];
  }
  return count;
}

static void devices_fork_prepare(void) {
  pthread_mutex_lock(&registry_lock);
  for (devbuf_device_t *device = open_devices; device; device = device->next_open)
    devbuf__spin_lock(&device->submit_lock);
  devbuf__caching_fork_lock_threads();
  for (devbuf_device_t *device = open_devices; device; device = device->next_open) {
    devbuf_allocator_t *list[4];
    size_t count = device_allocators(device, list);
    for (size_t i = 0; i < count; i++) devbuf__caching_fork_lock(list[i]);
  }
}

static void devices_fork_release(bool child) {
  for (devbuf_device_t *device = open_devices; device; device = device->next_open) {
    devbuf_allocator_t *list[4];
    size_t count = device_allocators(device, list);
    for (size_t i = count; i-- > 0;) devbuf__caching_fork_unlock(list[i]);
  }
  devbuf__caching_fork_unlock_threads();
  for (devbuf_device_t *device = open_devices; device; device = device->next_open) {
    if (child) { // the parent's work never completes here, and none of its threads waits
      atomic_store(&device->work_retired, 0);
      atomic_store(&device->work_submitted, 0);
      atomic_store(&device->sync_waiters, 0);
      devbuf__mutex_init(&device->work_lock);
      pthread_cond_init(&device->work_idle, NULL);
    }
    devbuf__spin_unlock(&device->submit_lock);
  }
  pthread_mutex_unlock(&registry_lock);
}

static void devices_fork_parent(void) { devices_fork_release(false); }
static void devices_fork_child(void) { devices_fork_release(true); }
DEVBUF__FORK_HOOK(10, devices_fork_prepare, devices_fork_parent, devices_fork_child)

// Splits "kind[:N]" into its backend's registry entry and index.
static devbuf_status parse_spec(const char *spec, const devbuf__backend_entry **out_entry,
                                int *out_index) {
  if (!spec) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "device spec is NULL");
  size_t kind_length = strcspn(spec, ":");
  const devbuf__backend_entry *entry = devbuf__backend_named(spec, kind_length);
  if (!entry) {
    char known[256];
    devbuf__backend_names(known, sizeof known);
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "device spec '%.64s' names no device kind (expected %s)", spec, known);
  }
  long index = 0;
  if (spec[kind_length] == ':') {
    const char *digits = spec + kind_length + 1;
    char *end = NULL;
    errno = 0;
    if (*digits < '0' || *digits > '9')
      return devbuf__error(DEVBUF_INVALID_ARGUMENT, "device spec '%.64s': index is not a number",
                           spec);
    index = strtol(digits, &end, 10);
    if (errno || *end != '\0' || index > 1000000)
      return devbuf__error(DEVBUF_INVALID_ARGUMENT, "device spec '%.64s': bad index", spec);
  }
  *out_entry = entry;
  *out_index = (int)index;
  return DEVBUF_OK;
}

// A caching allocator of one kind of memory, part of the device.
static devbuf_status embedded_allocator(devbuf_device_t *device, devbuf_memory_kind kind,
                                        devbuf_allocator_t **out) {
  devbuf_allocator_t *raw = NULL;
  devbuf_status status = devbuf__raw_allocator_create(device, kind, true, &raw);
  if (status != DEVBUF_OK) return status;
  devbuf_caching_options_t no_limits = {0};
  return devbuf__caching_allocator_create(raw, &no_limits, DEVBUF__EMBEDDED, out);
}

// Records of destroyed devices, for the next to open (under registry_lock): a thread that
// dropped a device's last hold reads its `unreferenced` flag after the drop, which may
// have let another thread destroy it, so a device's record is never given back.
static devbuf_device_t *kept_records;

static void keep_record_locked(devbuf_device_t *device) {
  device->next_open = kept_records;
  kept_records = device;
}

static devbuf_device_t *new_record_locked(void) {
  devbuf_device_t *device = kept_records;
  if (!device) return devbuf__calloc(1, sizeof *device);
  kept_records = device->next_open;
  // A thread that dropped the old device's last hold may still load `unreferenced`: it is
  // written atomically, and the record's other fields are cleared as calloc clears them.
  memset(device, 0, offsetof(devbuf_device_t, holds));
  device->open = false;
  atomic_store(&device->unreferenced, false);
  return device;
}

static devbuf_status device_create(const devbuf__backend_entry *entry, int index,
                                   devbuf_device_t **out) {
  devbuf_device_t *device = new_record_locked();
  if (!device) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a device object");
  devbuf__ref_init(&device->refs, 1);
  device->release = devbuf_device_release;
  atomic_init(&device->mapped_bytes, 0);
  atomic_init(&device->work_retired, 0);
  atomic_init(&device->work_submitted, 0);
  atomic_init(&device->queues_made, 0);
  atomic_init(&device->sync_waiters, 0);
  for (size_t i = 0; i <= DEVBUF__SHARED_LINE; i++) {
    atomic_init(&device->holds[i].taken, 0);
    atomic_init(&device->holds[i].dropped, 0);
  }
  devbuf__mutex_init(&device->work_lock);
  atomic_init(&device->submit_lock.held, false);
  pthread_cond_init(&device->work_idle, NULL);
  device->backend = entry->backend;
  device->kind = devbuf__backend_kind(entry);
  device->index = index;
  if (entry->backend->one_device)
    snprintf(device->spec, sizeof device->spec, "%s", entry->name);
  else
    snprintf(device->spec, sizeof device->spec, "%s:%d", entry->name, index);
  devbuf_status status = entry->backend->open(device, index);
  if (status != DEVBUF_OK) {
    keep_record_locked(device);
    return status;
  }
  status = embedded_allocator(device, DEVBUF_MEMORY_DEVICE, &device->allocator);
  device->host_allocator = device->allocator;
  if (status == DEVBUF_OK && !device->host_accessible)
    status = embedded_allocator(device, DEVBUF_MEMORY_HOST_VISIBLE, &device->host_allocator);
  device->managed_allocator = device->host_accessible ? device->allocator : NULL;
  if (status == DEVBUF_OK && device->managed_memory)
    status = embedded_allocator(device, DEVBUF_MEMORY_MANAGED, &device->managed_allocator);
  if (status == DEVBUF_OK && device->shares_memory)
    status = embedded_allocator(device, DEVBUF_MEMORY_SHAREABLE, &device->shareable_allocator);
  if (status != DEVBUF_OK) {
    if (device->managed_allocator && device->managed_allocator != device->allocator)
      devbuf__allocator_destroy(device->managed_allocator);
    if (device->host_allocator && device->host_allocator != device->allocator)
      devbuf__allocator_destroy(device->host_allocator);
    if (device->allocator) devbuf__allocator_destroy(device->allocator);
    if (entry->backend->close) entry->backend->close(device);
    keep_record_locked(device);
    return status;
  }
  device->open = true;
  *out = device;
  return DEVBUF_OK;
}

devbuf_status devbuf_device_open(const char *spec, devbuf_device_t **out_device) {
  const devbuf__backend_entry *entry = NULL;
  int index = 0;
  if (!out_device) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "out_device is NULL");
  devbuf_status status = parse_spec(spec, &entry, &index);
  if (status != DEVBUF_OK) return status;
  char why[160];
  if (!devbuf__backend_table_check(entry->name, entry->backend, why, sizeof why))
    return devbuf__error(DEVBUF_UNAVAILABLE, "%s: the backend is incomplete: %s", spec, why);
  pthread_mutex_lock(&registry_lock);
  for (devbuf_device_t *device = open_devices; device; device = device->next_open) {
    if (device->backend == entry->backend && device->index == index) {
      devbuf__ref_retain(&device->refs);
      atomic_store(&device->unreferenced, false); // if only holds kept it
      pthread_mutex_unlock(&registry_lock);
      *out_device = device;
      return DEVBUF_OK;
    }
  }
  devbuf_device_t *device = NULL;
  status = device_create(entry, index, &device);
  if (status == DEVBUF_OK) {
    device->next_open = open_devices;
    open_devices = device;
    *out_device = device;
  }
  pthread_mutex_unlock(&registry_lock);
  return status;
}

devbuf_device_t *devbuf_device_retain(devbuf_device_t *device) {
  if (device) devbuf__ref_retain(&device->refs);
  return device;
}

// Whether any hold is left. Every drop is read before any take: a hold is taken only by a
// thread that holds the device otherwise (a reference, another hold), so each take that
// came before a drop read here is seen by the reads of takes after it, and a sum read line
// by line never shows 0 while a hold is left.
static bool held(devbuf_device_t *device) {
  uint64_t dropped = 0, taken = 0;
  for (size_t i = 0; i <= DEVBUF__SHARED_LINE; i++)
    dropped += atomic_load(&device->holds[i].dropped);
  for (size_t i = 0; i <= DEVBUF__SHARED_LINE; i++) taken += atomic_load(&device->holds[i].taken);
  return taken != dropped;
}

// Destroys a device no one refers to or holds any more: takes it out of the registry (whose
// lock the caller holds, and which this releases), so that device_open never hands it out
// again, then lets go of what it has, and keeps the record.
static void device_destroy_locked(devbuf_device_t *device) {
  for (devbuf_device_t **link = &open_devices; *link; link = &(*link)->next_open) {
    if (*link == device) {
      *link = device->next_open;
      break;
    }
  }
  device->open = false;
  atomic_store(&device->unreferenced, false);
  pthread_mutex_unlock(&registry_lock);
  if (device->shareable_allocator) devbuf__allocator_destroy(device->shareable_allocator);
  if (device->managed_allocator && device->managed_allocator != device->allocator)
    devbuf__allocator_destroy(device->managed_allocator);
  if (device->host_allocator != device->allocator)
    devbuf__allocator_destroy(device->host_allocator);
  devbuf__allocator_destroy(device->allocator);
  if (device->backend->close) device->backend->close(device);
  pthread_cond_destroy(&device->work_idle);
  pthread_mutex_destroy(&device->work_lock);
  pthread_mutex_lock(&registry_lock);
  keep_record_locked(device);
  pthread_mutex_unlock(&registry_lock);
}

void devbuf_device_release(devbuf_device_t *device) {
  if (!device) return;
  // Dropping a reference that is not the last needs no lock.
  if (devbuf__ref_drop_unless_last(&device->refs)) return;
  // The last one: the registry lock makes "drop it" and "find the device in the registry"
  // one step, so device_open never hands out a device that is being destroyed.
  pthread_mutex_lock(&registry_lock);
  if (!devbuf__ref_drop(&device->refs)) {
    pthread_mutex_unlock(&registry_lock);
    return;
  }
  // Against each drop of a hold and its load of the flag after it (core.h).
  atomic_store(&device->unreferenced, true);
  devbuf__heavy_barrier();
  if (held(device)) { // the last hold's drop sees the flag and destroys it
    pthread_mutex_unlock(&registry_lock);
    return;
  }
  device_destroy_locked(device);
}

void devbuf__device_drop_unreferenced(devbuf_device_t *device) {
  pthread_mutex_lock(&registry_lock);
  // Another drop may have destroyed it first, and the record may hold a newer device now.
  if (device->open && atomic_load(&device->unreferenced) && atomic_load(&device->refs.count) == 0 &&
      !held(device)) {
    device_destroy_locked(device);
    return;
  }
  pthread_mutex_unlock(&registry_lock);
}

size_t devbuf_device_kind_count(void) { return devbuf__backend_count(); }

const char *devbuf_device_kind_name(devbuf_device_kind kind) {
  const devbuf__backend_entry *entry = devbuf__backend_of_kind(kind);
  return entry ? entry->name : NULL;
}

int32_t devbuf_device_dlpack_type(const devbuf_device_t *device) {
  return device ? device->backend->dlpack_device_type : 0;
}

devbuf_device_kind devbuf_device_kind_of(const devbuf_device_t *device) {
  return device ? device->kind : (devbuf_device_kind)0;
}
const char *devbuf_device_spec(const devbuf_device_t *device) {
  return device ? device->spec : NULL;
}
const char *devbuf_device_name(const devbuf_device_t *device) {
  return device ? device->name : NULL;
}
size_t devbuf_device_page_size(const devbuf_device_t *device) {
  return device ? device->page_size : 0;
}
devbuf_allocator_t *devbuf_device_allocator(devbuf_device_t *device) {
  return device ? device->allocator : NULL;
}

devbuf_allocator_t *devbuf_device_allocator_for(devbuf_device_t *device, devbuf_memory_kind kind) {
  if (!device) return NULL;
  switch (kind) {
  case DEVBUF_MEMORY_DEVICE:
    return device->allocator;
  case DEVBUF_MEMORY_HOST_VISIBLE:
    return device->host_allocator;
  case DEVBUF_MEMORY_MANAGED:
    return device->managed_allocator;
  case DEVBUF_MEMORY_SHAREABLE:
    return device->shareable_allocator;
  }
  return NULL;
}

// What the device's backend declares it does, by the entries its table fills.
static uint32_t capabilities(const devbuf_device_t *device) {
  const devbuf__backend *backend = device->backend;
  uint32_t can = 0;
  if (backend->enqueue) can |= DEVBUF_CAN_QUEUE;
  if (backend->runs_c_kernels) can |= DEVBUF_CAN_C_KERNELS;
  if (backend->program_build) can |= DEVBUF_CAN_PROGRAMS;
  if (backend->raw_export && device->shares_memory) can |= DEVBUF_CAN_SHARE;
  if (backend->raw_reserve) can |= DEVBUF_CAN_GROW;
  return can;
}

devbuf_status devbuf_device_info(const devbuf_device_t *device, devbuf_device_info_t *out_info) {
  if (!device || !out_info)
    return devbuf__null_argument("device_info", "device, out_info",
                                 (const void *[]){device, out_info});
  *out_info = (devbuf_device_info_t){
      .name = device->name,
      .version = device->version,
      .global_memory = device->global_memory,
      .max_allocation = device->max_allocation,
      .alignment = device->alignment,
      .host_unified = device->unified_memory,
      .svm_capabilities = device->svm_capabilities,
      .processor = device->processor,
      .capabilities = capabilities(device),
  };
  return DEVBUF_OK;
}

devbuf_status devbuf_device_synchronize(devbuf_device_t *device) {
  if (!device) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "device is NULL");
  if (DEVBUF_UNLIKELY(devbuf__worker_device == device))
    return devbuf__refuse_self_wait("device_synchronize");
  if (devbuf__device_work_pending(device)) {
    devbuf__settle_before_blocking();
    devbuf__wait_begins();
    pthread_mutex_lock(&device->work_lock);
    atomic_fetch_add(&device->sync_waiters, 1);
    while (devbuf__device_work_pending(device))
      pthread_cond_wait(&device->work_idle, &device->work_lock);
    atomic_fetch_sub(&device->sync_waiters, 1);
    pthread_mutex_unlock(&device->work_lock);
    devbuf__wait_ends();
  }
  return device->backend->synchronize ? device->backend->synchronize(device) : DEVBUF_OK;
}
