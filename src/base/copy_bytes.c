// Host copies at the machine's bandwidth whatever the relative alignment of source and
// destination. glibc's memcpy copies most sizes above 2 KiB with rep movsb, which some
// machines run at a quarter of their bandwidth for some pairs of offsets from a page, and
// switches to non-temporal stores only far above the cache size. So, measured on the
// project's machines (devbuf bench --only copy):
//   - below 4 KiB, memcpy (its vector code is as fast as anything there);
//   - up to twice the per-core cache, rep movsb from a destination aligned to a cache line
//     (a vector store covers the head): in the cache nothing beats it, as it writes whole
//     lines without reading them first; a vector loop where the CPU lacks fast rep movsb;
//   - above that, a vector loop with non-temporal stores that aligns the destination and
//     reads four pages at once, so that the hardware prefetchers run on four streams.
// AVX-512 where the CPU has it, else AVX2, else memcpy. Overlapping ranges use memmove.
#include "base.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86_COPIES 1
#endif

#define PAGE             4096
#define STREAMS          4    // pages read at once by the streaming loop
#define VECTOR_MIN_BYTES 4096 // below this, memcpy

static size_t streaming_threshold(void) {
  static _Atomic size_t threshold;
  size_t known = atomic_load_explicit(&threshold, memory_order_relaxed);
  if (known) return known;
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  size_t chosen = l2 > 0 ? 2 * (size_t)l2 : (size_t)4 << 20;
  if (chosen < ((size_t)1 << 20)) chosen = (size_t)1 << 20;
  atomic_store_explicit(&threshold, chosen, memory_order_relaxed);
  return chosen;
}

#ifdef HAVE_X86_COPIES
// One routine per vector width and store kind. The head (unaligned) brings the destination
// to a cache line; with `page_streams`, whole groups of STREAMS pages go line by line from
// each page in turn; the rest goes four lines, then one line, at a time; the tail
// (unaligned) ends exactly at the last byte. Streamed lines are fenced before the tail.
#define VECTOR_COPY(name, isa, vector, load, store_edge, store_body, width, page_streams)  \
  __attribute__((target(isa))) static void name(char *dst, const char *src, size_t size) { \
    vector head[64 / width], tail[64 / width];                                             \
    for (int v = 0; v < 64 / width; v++) {                                                 \
      head[v] = load((const void *)(src + v * width));                                     \
      tail[v] = load((const void *)(src + size - 64 + v * width));                         \
    }                                                                                      \
    char *end = dst + size - 64;                                                           \
    for (int v = 0; v < 64 / width; v++) store_edge((void *)(dst + v * width), head[v]);   \
    size_t skew = (64 - ((uintptr_t)dst & 63)) & 63;                                       \
    dst += skew, src += skew, size -= skew;                                                \
    for (; page_streams && size >= STREAMS * PAGE;                                         \
         dst += STREAMS * PAGE, src += STREAMS * PAGE, size -= STREAMS * PAGE)             \
      for (size_t line = 0; line < PAGE; line += 64)                                       \
        for (int p = 0; p < STREAMS; p++)                                                  \
          for (int v = 0; v < 64 / width; v++)                                             \
            store_body((void *)(dst + p * PAGE + line + v * width),                        \
                       load((const void *)(src + p * PAGE + line + v * width)));           \
    for (; size >= 256; dst += 256, src += 256, size -= 256)                               \
      for (int v = 0; v < 256 / width; v++)                                                \
        store_body((void *)(dst + v * width), load((const void *)(src + v * width)));      \
    for (; size >= 64; dst += 64, src += 64, size -= 64)                                   \
      for (int v = 0; v < 64 / width; v++)                                                 \
        store_body((void *)(dst + v * width), load((const void *)(src + v * width)));      \
    if (page_streams) _mm_sfence(); /* streamed lines reach memory before anyone reads */  \
    for (int v = 0; v < 64 / width; v++) store_edge((void *)(end + v * width), tail[v]);   \
  }

static inline __attribute__((target("avx512f"), always_inline)) __m512i load512(const void *p) {
  return _mm512_loadu_si512(p);
}
static inline __attribute__((target("avx512f"), always_inline)) void store512(void *p, __m512i v) {
  _mm512_storeu_si512(p, v);
}
static inline __attribute__((target("avx512f"), always_inline)) void stream512(void *p, __m512i v) {
  _mm512_stream_si512(p, v);
}
static inline __attribute__((target("avx512f"), always_inline)) void store512_aligned(void *p,
                                                                                      __m512i v) {
  _mm512_store_si512(p, v);
}
static inline __attribute__((target("avx2"), always_inline)) __m256i load256(const void *p) {
  return _mm256_loadu_si256((const __m256i *)p);
}
static inline __attribute__((target("avx2"), always_inline)) void store256(void *p, __m256i v) {
  _mm256_storeu_si256((__m256i *)p, v);
}
static inline __attribute__((target("avx2"), always_inline)) void stream256(void *p, __m256i v) {
  _mm256_stream_si256((__m256i *)p, v);
}

static inline __attribute__((target("avx2"), always_inline)) void store256_aligned(void *p,
                                                                                   __m256i v) {
  _mm256_store_si256((__m256i *)p, v);
}

// rep movsb after a vector store has brought the destination to a cache line.
__attribute__((target("avx2"))) static void aligned_movsb(char *dst, const char *src, size_t size) {
  __m256i head[2] = {load256(src), load256(src + 32)};
  store256(dst, head[0]);
  store256(dst + 32, head[1]);
  size_t skew = (64 - ((uintptr_t)dst & 63)) & 63;
  dst += skew, src += skew, size -= skew;
  __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(size) : : "memory");
}

VECTOR_COPY(stream_copy_avx512, "avx512f", __m512i, load512, store512, stream512, 64, true)
VECTOR_COPY(stream_copy_avx2, "avx2", __m256i, load256, store256, stream256, 32, true)
VECTOR_COPY(cached_copy_avx512, "avx512f", __m512i, load512, store512, store512_aligned, 64, false)
VECTOR_COPY(cached_copy_avx2, "avx2", __m256i, load256, store256, store256_aligned, 32, false)
#endif

typedef struct copy_paths {
  int vector;      // 0: none, 2: AVX2, 5: AVX-512
  bool fast_movsb; // enhanced rep movsb (ERMS)
} copy_paths;

// What the CPU has. DEVBUF_COPY_PATH narrows it, so that the tests run every routine:
// "avx512" or "avx2" (those loops alone, no rep movsb), "memcpy" (none of them).
static copy_paths chosen_paths(void) {
  static _Atomic int known; // 0: not yet; else 1 + vector * 2 + fast_movsb
  int code = atomic_load_explicit(&known, memory_order_relaxed);
  if (!code) {
    copy_paths best = {0, false};
#ifdef HAVE_X86_COPIES
    unsigned eax, ebx = 0, ecx, edx;
    if (__builtin_cpu_supports("avx2")) best.vector = 2;
    if (__builtin_cpu_supports("avx512f")) best.vector = 5;
    best.fast_movsb =
        __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 9)) && best.vector;
#endif
    const char *wanted = getenv("DEVBUF_COPY_PATH");
    if (wanted && strcmp(wanted, "memcpy") == 0) best = (copy_paths){0, false};
    if (wanted && strcmp(wanted, "avx512") == 0) best.fast_movsb = false;
    if (wanted && strcmp(wanted, "avx2") == 0) best = (copy_paths){best.vector ? 2 : 0, false};
    code = 1 + best.vector * 2 + best.fast_movsb;
    atomic_store_explicit(&known, code, memory_order_relaxed);
  }
  return (copy_paths){(code - 1) / 2, (code - 1) % 2};
}

void devbuf__copy_bytes(void *dst, const void *src, size_t size) {
  const char *from = src;
  char *to = dst;
  bool overlap = to < from + size && from < to + size;
  if (overlap) {
    memmove(dst, src, size);
    return;
  }
#ifdef HAVE_X86_COPIES
  copy_paths paths = size >= VECTOR_MIN_BYTES ? chosen_paths() : (copy_paths){0, false};
  if (paths.vector && size >= streaming_threshold()) {
    (paths.vector == 5 ? stream_copy_avx512 : stream_copy_avx2)(to, from, size);
    return;
  }
  if (paths.fast_movsb) {
    aligned_movsb(to, from, size);
    return;
  }
  if (paths.vector) {
    (paths.vector == 5 ? cached_copy_avx512 : cached_copy_avx2)(to, from, size);
    return;
  }
#endif
  memcpy(dst, src, size);
}
