// Copy benchmark: copyin, copyout and copy_from at every pair of source and destination
// offsets 0, 16, 64 and 2048 bytes from a page, for 1 MiB and 256 MiB (64 MiB with
// --quick), each against memcpy between the same two addresses, alternating run by run.
// The target is devbuf's rate at every pair against memcpy's between page-aligned
// addresses of the same memory (what the machine can do): at least 0.95x.
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_RUNS  101
#define OFFSETS   4
#define PAGE_ROOM 8192 // room for the largest offset, and then some

// Through a pointer, so the compiler cannot turn the reference copy into something else.
static void *(*volatile plain_memcpy)(void *, const void *, size_t) = memcpy;

static const size_t offsets[OFFSETS] = {0, 16, 64, 2048};

typedef enum copy_kind { COPYIN, COPYOUT, COPY_FROM, KINDS } copy_kind;
static const char *const kind_names[KINDS] = {"copyin", "copyout", "copy_from"};

typedef struct copy_setup {
  size_t size;
  int repeats;                     // copies per timed sample (small sizes take many)
  unsigned char *host;             // page-aligned, size + PAGE_ROOM
  devbuf_buffer_t *first, *second; // devbuf memory of the same size, page-aligned
  unsigned char *first_bytes, *second_bytes;
} copy_setup;

// One sample of `repeats` copies, in ns per copy: memcpy when `reference`, else devbuf's.
static double sample(const copy_setup *setup, copy_kind kind, size_t src_offset, size_t dst_offset,
                     devbuf_buffer_t *src_view, devbuf_buffer_t *dst_view, bool reference) {
  unsigned char *host = setup->host;
  uint64_t t0 = bench_now_ns();
  for (int i = 0; i < setup->repeats; i++) {
    if (reference) {
      unsigned char *dst = kind == COPYIN    ? setup->first_bytes
                           : kind == COPYOUT ? host
                                             : setup->second_bytes;
      const unsigned char *src = kind == COPYIN ? host : setup->first_bytes;
      plain_memcpy(dst + dst_offset, src + src_offset, setup->size);
    } else if (kind == COPYIN) {
      devbuf_buffer_copyin(dst_view, host + src_offset, setup->size);
    } else if (kind == COPYOUT) {
      devbuf_buffer_copyout(src_view, host + dst_offset, setup->size);
    } else {
      devbuf_buffer_copy_from(dst_view, src_view);
    }
  }
  return (double)(bench_now_ns() - t0) / setup->repeats;
}

// Medians, alternating run by run (so that the machine's drifting load touches all three
// alike): memcpy between page-aligned addresses of the same memory, memcpy between the
// pair's two addresses, and devbuf between the same two.
static void measure(const copy_setup *setup, copy_kind kind, size_t src_offset, size_t dst_offset,
                    int runs, double *out_aligned, double *out_reference, double *out_devbuf) {
  devbuf_buffer_t *src_view = NULL, *dst_view = NULL;
  devbuf_buffer_view(setup->first, kind == COPYOUT || kind == COPY_FROM ? src_offset : dst_offset,
                     setup->size, kind == COPYIN ? &dst_view : &src_view);
  if (kind == COPY_FROM) devbuf_buffer_view(setup->second, dst_offset, setup->size, &dst_view);
  double aligned[MAX_RUNS], reference[MAX_RUNS], devbuf[MAX_RUNS];
  sample(setup, kind, src_offset, dst_offset, src_view, dst_view, true); // warm both
  sample(setup, kind, src_offset, dst_offset, src_view, dst_view, false);
  for (int r = 0; r < runs; r++) {
    aligned[r] = sample(setup, kind, 0, 0, src_view, dst_view, true);
    reference[r] = sample(setup, kind, src_offset, dst_offset, src_view, dst_view, true);
    devbuf[r] = sample(setup, kind, src_offset, dst_offset, src_view, dst_view, false);
  }
  *out_aligned = bench_median(aligned, runs);
  *out_reference = bench_median(reference, runs);
  *out_devbuf = bench_median(devbuf, runs);
  devbuf_buffer_release(src_view);
  devbuf_buffer_release(dst_view);
}

static void bench_copy_size(const bench_config *config, size_t size) {
  int runs = config->runs > MAX_RUNS ? MAX_RUNS : config->runs;
  copy_setup setup = {.size = size,
                      .repeats = size <= ((size_t)4 << 20) ? (int)(((size_t)64 << 20) / size) : 1};
  size_t room = size + PAGE_ROOM;
  void *host = mmap(NULL, room, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  devbuf_allocator_t *allocator = devbuf_device_allocator(config->device);
  void *first = NULL, *second = NULL;
  if (host == MAP_FAILED ||
      devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &room, 1, 0, &setup.first) != DEVBUF_OK ||
      devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &room, 1, 0, &setup.second) != DEVBUF_OK ||
      devbuf_buffer_unsynchronized_ptr(setup.first, &first, NULL) != DEVBUF_OK ||
      devbuf_buffer_unsynchronized_ptr(setup.second, &second, NULL) != DEVBUF_OK) {
    printf("== copies of %zu MiB: skipped (%s; %s memory) ==\n\n", size >> 20, devbuf_last_error(),
           devbuf_device_spec(config->device));
  } else {
    setup.host = host;
    setup.first_bytes = first;
    setup.second_bytes = second;
    memset(host, 1, room);
    memset(first, 2, room);
    memset(second, 3, room);
    double worst[KINDS] = {1e9, 1e9, 1e9}, aligned_sum[KINDS] = {0};
    printf("== copies of %zu MiB by offsets from a page: devbuf GiB/s and x memcpy between "
           "page-aligned "
           "addresses (target >= 0.95x); memcpy at the same offsets ==\n",
           size >> 20);
    printf("   src  dst |");
    for (int k = 0; k < KINDS; k++) printf(" %-10s GiB/s     x  memcpy |", kind_names[k]);
    printf("\n");
    double gib = (double)size / (1 << 30);
    for (int s = 0; s < OFFSETS; s++) {
      for (int d = 0; d < OFFSETS; d++) {
        printf("  %4zu %4zu |", offsets[s], offsets[d]);
        for (int k = 0; k < KINDS; k++) {
          double aligned, reference, devbuf;
          measure(&setup, (copy_kind)k, offsets[s], offsets[d], runs, &aligned, &reference,
                  &devbuf);
          double ratio = aligned / devbuf;
          aligned_sum[k] += gib / (aligned * 1e-9);
          if (ratio < worst[k]) worst[k] = ratio;
          printf("            %7.2f %5.2f %7.2f |", gib / (devbuf * 1e-9), ratio,
                 gib / (reference * 1e-9));
          char label[96];
          snprintf(label, sizeof label, "%zu MiB %s, offsets %zu/%zu", size >> 20, kind_names[k],
                   offsets[s], offsets[d]);
          bench_figure("copy", label, gib / (devbuf * 1e-9), "GiB/s", -1);
          snprintf(label, sizeof label, "%zu MiB %s, offsets %zu/%zu, against aligned memcpy",
                   size >> 20, kind_names[k], offsets[s], offsets[d]);
          bench_figure("copy", label, ratio, "x", ratio >= 0.95);
        }
        printf("\n");
      }
    }
    printf("   aligned memcpy (mean of its medians):");
    for (int k = 0; k < KINDS; k++)
      printf(" %s %.2f GiB/s;", kind_names[k], aligned_sum[k] / (OFFSETS * OFFSETS));
    printf("\n   worst pair:");
    for (int k = 0; k < KINDS; k++)
      printf(" %s %.*fx %s;", kind_names[k], bench_decimals(worst[k], 0.95), worst[k],
             worst[k] >= 0.95 ? "met" : "MISSED");
    printf("\n\n");
  }
  devbuf_buffer_release(setup.first);
  devbuf_buffer_release(setup.second);
  if (host != MAP_FAILED) munmap(host, room);
}

void bench_copy(const bench_config *config) {
  bench_copy_size(config, (size_t)1 << 20);
  bench_copy_size(config, config->quick ? (size_t)64 << 20 : (size_t)256 << 20);
}
