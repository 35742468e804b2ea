// The registry of backends: the one place that lists them. Everything that depends on the
// kind of a device (spec parsing, the public kind numbers and names, DLPack's device types,
// `devbuf info`, the Python package) asks it. Adding a backend is its folder under
// src/backend/ and one entry here (docs/backends.md, "Adding a backend").
#include "backend.h"

#include <stdio.h>
#include <string.h>

#define DEVBUF__BACKEND_ENTRY(name) \
  { #name, &devbuf__backend_##name }

// Kind K is entry K - 1: the public enum devbuf_device_kind numbers the first three, so their
// order is part of the ABI. Backends for the tests only come last (never installed).
static const devbuf__backend_entry entries[] = {
    DEVBUF__BACKEND_ENTRY(cpu),    // 1: host memory, the default device
    DEVBUF__BACKEND_ENTRY(opencl), // 2: through the ICD loader, found at run time
    DEVBUF__BACKEND_ENTRY(cuda),   // 3: through the driver API, found at run time
#ifdef DEVBUF_TEST_BACKENDS
    DEVBUF__BACKEND_ENTRY(null), // host memory, kernels refused: proves the registry's reach
#endif
};

size_t devbuf__backend_count(void) { return sizeof entries / sizeof entries[0]; }

const devbuf__backend_entry *devbuf__backend_of_kind(devbuf_device_kind kind) {
  size_t index = (size_t)kind - 1; // kind 0 wraps past the end
  return index < devbuf__backend_count() ? &entries[index] : NULL;
}

const devbuf__backend_entry *devbuf__backend_named(const char *name, size_t length) {
  for (size_t i = 0; i < devbuf__backend_count(); i++)
    if (strlen(entries[i].name) == length && strncmp(name, entries[i].name, length) == 0)
      return &entries[i];
  return NULL;
}

const devbuf__backend_entry *devbuf__backend_of_dlpack_type(int32_t type) {
  for (size_t i = 0; i < devbuf__backend_count(); i++)
    if (entries[i].backend->dlpack_device_type == type) return &entries[i];
  return NULL;
}

devbuf_device_kind devbuf__backend_kind(const devbuf__backend_entry *entry) {
  return (devbuf_device_kind)(entry - entries + 1);
}

void devbuf__backend_names(char *out, size_t capacity) {
  size_t used = 0;
  if (capacity) out[0] = '\0';
  for (size_t i = 0; i < devbuf__backend_count() && used < capacity; i++) {
    int n = snprintf(out + used, capacity - used, "%s%s%s", i ? ", " : "", entries[i].name,
                     entries[i].backend->one_device ? "" : ":N");
    if (n > 0) used += (size_t)n;
  }
}

// ---- the table's shape --------------------------------------------------------------------

// How many of `count` entries are set.
static size_t set_count(const void *const *entries_of_group, size_t count) {
  size_t set = 0;
  for (size_t i = 0; i < count; i++) set += entries_of_group[i] != NULL;
  return set;
}

// Checks one "all or none" group; the message names the group's first entry left out.
static bool group_whole(const char *backend, const char *group, const void *const *members,
                        const char *const *names, size_t count, char *why, size_t capacity) {
  size_t set = set_count(members, count);
  if (set == 0 || set == count) return true;
  for (size_t i = 0; i < count; i++)
    if (!members[i]) {
      snprintf(why, capacity, "backend %s sets part of its %s entries but not %s", backend, group,
               names[i]);
      break;
    }
  return false;
}

bool devbuf__backend_table_check(const char *name, const devbuf__backend *b, char *why,
                                 size_t capacity) {
  // Pointers to functions of different types are compared by being set, nothing else.
#define AS(f) ((const void *)(uintptr_t)(b->f))
  const void *const required[] = {AS(open), AS(raw_alloc), AS(raw_free), AS(write),
                                  AS(read), AS(copy),      AS(zero)};
  static const char *const required_names[] = {"open", "raw_alloc", "raw_free", "write",
                                               "read", "copy",      "zero"};
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
    if (!required[i]) {
      snprintf(why, capacity, "backend %s has no %s, which every backend must have", name,
               required_names[i]);
      return false;
    }
  static const char *const reserve_names[] = {"raw_reserve", "raw_map", "raw_unmap",
                                              "raw_unreserve"};
  static const char *const share_names[] = {"raw_export", "raw_import", "raw_unimport"};
  static const char *const gate_names[] = {"gate_enqueue", "gate_open", "gate_release"};
  static const char *const program_names[] = {"program_build", "program_release",
                                              "program_check_launch"};
  static const char *const queue_names[] = {"queue_create", "queue_destroy", "event_release"};
  const void *const reserve[] = {AS(raw_reserve), AS(raw_map), AS(raw_unmap), AS(raw_unreserve)};
  const void *const share[] = {AS(raw_export), AS(raw_import), AS(raw_unimport)};
  const void *const gate[] = {AS(gate_enqueue), AS(gate_open), AS(gate_release)};
  const void *const program[] = {AS(program_build), AS(program_release), AS(program_check_launch)};
  const void *const device_queue[] = {AS(queue_create), AS(queue_destroy), AS(event_release)};
  if (!group_whole(name, "address-space", reserve, reserve_names, 4, why, capacity) ||
      !group_whole(name, "sharing", share, share_names, 3, why, capacity) ||
      !group_whole(name, "gate", gate, gate_names, 3, why, capacity) ||
      !group_whole(name, "program", program, program_names, 3, why, capacity) ||
      !group_whole(name, "device-queue", device_queue, queue_names, 3, why, capacity))
    return false;
  // What needs an enqueue to mean anything.
  const char *needs_enqueue = b->queue_create     ? "queue_create"
                              : b->complete       ? "complete"
                              : b->gate_enqueue   ? "gate_enqueue"
                              : b->program_build  ? "program_build"
                              : b->runs_c_kernels ? "runs_c_kernels"
                                                  : NULL;
  if (needs_enqueue && !b->enqueue) {
    snprintf(why, capacity, "backend %s has %s but no enqueue", name, needs_enqueue);
    return false;
  }
  if (b->dlpack_device_type <= 0) {
    snprintf(why, capacity, "backend %s declares no DLPack device type", name);
    return false;
  }
#undef AS
  return true;
}
