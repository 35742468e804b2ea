// Shared pieces of the benchmarks: a clock, medians, and the system allocators devbuf is
// compared with (glibc malloc always; jemalloc and mimalloc when installed, found with dlopen).
#ifndef DEVBUF_BENCH_H
#define DEVBUF_BENCH_H

#include "decimals.h"
#include "devbuf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bench_config {
  int runs;  // repetitions; every figure is the median over them
  int quick; // fewer sizes and iterations (the README's main command)
  devbuf_device_t *device;
  const char *traces; // the folder of allocation traces (--traces; NULL: tests/data/traces)
  const char *only;   // the one section to run (--only, --load); NULL: every section
} bench_config;

// Whether the device's benchmarks run section `name` (config->only NULL: every section).
bool bench_section_runs(const bench_config *config, const char *name);

// A malloc-like allocator to compare with.
typedef struct bench_malloc {
  const char *name;
  void *(*alloc)(size_t size);
  void (*release)(void *pointer);
  const char *missing; // why it is absent, or NULL when usable
} bench_malloc;

enum { BENCH_GLIBC, BENCH_JEMALLOC, BENCH_MIMALLOC, BENCH_MALLOC_COUNT };

// Fills `out` with glibc, jemalloc and mimalloc (the last two may be missing).
void bench_find_mallocs(bench_malloc out[BENCH_MALLOC_COUNT]);

// The path of the generated weight file the load benchmarks read (1 GiB, 256 MiB with
// --quick, under $TMPDIR or /tmp), written on first use; false (and a message) if it cannot be.
bool bench_sample_file(const bench_config *config, char *path, size_t capacity);

// Records one figure for `bench --json` (every printed figure is also recorded): the
// section ("alloc", "copy", ...), what was measured, its value and unit, and whether it
// meets its target (-1: no target).
void bench_figure(const char *section, const char *name, double value, const char *unit,
                  int target_met);

uint64_t bench_now_ns(void);
// "256 B", "4 KiB", "64 MiB": a size as the tables print it.
void bench_size_label(size_t size, char *out, size_t capacity);
double bench_median(double *values, int count);

// Writes one byte in every page of [p, p + size) and the last byte, so that every page is
// really backed; volatile so the compiler cannot drop the writes.
void bench_touch(volatile unsigned char *p, size_t size);

void bench_alloc(const bench_config *config);
void bench_copy(const bench_config *config);
void bench_threads(const bench_config *config);
// Alloc + free pairs on 1 and 2 threads: devbuf, the buffer path, the system allocators.
void bench_pairs(const bench_config *config);
void bench_queue(const bench_config *config);
void bench_queue_ring(const bench_config *config); // queue items against ring-buffer queues
void bench_load(const bench_config *config);
// Real allocation traces replayed against PyTorch's figures (memory figures, no timing).
// Returns how many rows could not be replayed, and figures.json files or entries that could
// not be read, each also said on stderr: a folder named on purpose is measured whole.
int bench_traces(const bench_config *config);
// Sharing with another process: event round trips and buffer handovers (bench_share.c).
void bench_share(const bench_config *config);
// OpenCL devices: allocation and copies against the driver's own calls.
void bench_opencl(const bench_config *config);
// CUDA devices: allocation against cuMemAlloc, the stream-ordered pool and PyTorch; copies.
void bench_cuda(const bench_config *config);

#endif
