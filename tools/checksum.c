// The checksum of checksum.h. Eight lanes of a keyed multiply-accumulate (the NH
// construction of universal hashing: one 32x32->64 multiply per 8 bytes, which compilers
// turn into SIMD multiplies), with a key that moves on every 64-byte block so that
// reordered blocks change the sum, and a multiply-rotate scramble of the lanes every
// 4 KiB so that every input bit reaches every lane. The tail and the final mix use
// plain multiply-rotate rounds.
#include "checksum.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#define MIX_A             UINT64_C(0x9e3779b97f4a7c15) // 2^64 / golden ratio, odd
#define MIX_B             UINT64_C(0xd6e8feb86659fd93)
#define LANES             8
#define BLOCK             (LANES * 8)
#define BLOCKS_PER_STRIPE 64

static inline uint64_t rotate(uint64_t x, int bits) { return x << bits | x >> (64 - bits); }

static inline uint64_t load64(const unsigned char *p) {
  uint64_t word;
  memcpy(&word, p, 8); // any alignment; compiles to one load
  return word;
}

static inline uint64_t round64(uint64_t h, uint64_t word) {
  return rotate(h + word * MIX_B, 31) * MIX_A;
}

static const uint64_t lane_keys[LANES] = {0,         MIX_B,     2 * MIX_B, 3 * MIX_B,
                                          4 * MIX_B, 5 * MIX_B, 6 * MIX_B, 7 * MIX_B};

typedef void stripe_fn(uint64_t lanes[LANES], const unsigned char *p, size_t blocks,
                       uint64_t *step);

// One stripe of `blocks` 64-byte blocks into the lanes; `step` is the block counter.
static void stripe_portable(uint64_t lanes[LANES], const unsigned char *p, size_t blocks,
                            uint64_t *step) {
  for (size_t b = 0; b < blocks; b++, p += BLOCK) {
    uint64_t key = *step * MIX_A;
    (*step)++;
    for (int i = 0; i < LANES; i++) {
      uint64_t word = load64(p + 8 * i);
      uint64_t x = word ^ (key + lane_keys[i]);
      lanes[i] += (x & 0xffffffffu) * (x >> 32) + word;
    }
  }
}

// The SIMD stripes compute exactly what the portable one does. Every x86-64 CPU has SSE2;
// AVX2 is asked of the CPU at run time, so one build runs everywhere and takes the wider
// path where it can (figures in docs/testing.md, --only load).
#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__) && \
    (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86_STRIPES 1

// A block's key is step * MIX_A, so the next block's is this one's + MIX_A: the SIMD stripes
// add a vector per block where the portable one multiplies.
static inline __m128i sse2_lane_pair(__m128i acc, __m128i word, __m128i key) {
  __m128i x = _mm_xor_si128(word, key);
  __m128i product = _mm_mul_epu32(x, _mm_srli_epi64(x, 32)); // low half times high half
  return _mm_add_epi64(acc, _mm_add_epi64(product, word));
}

// Named registers, not arrays: compilers that do not unroll a loop over an array keep it in
// memory (gcc -O2 did, and the stripe ran at less than half the speed).
static void stripe_sse2(uint64_t lanes[LANES], const unsigned char *p, size_t blocks,
                        uint64_t *step) {
  const __m128i *keys = (const __m128i *)lane_keys;
  __m128i key = _mm_set1_epi64x((long long)(*step * MIX_A)),
          advance = _mm_set1_epi64x((long long)MIX_A);
  __m128i key0 = _mm_add_epi64(key, _mm_loadu_si128(keys)),
          key1 = _mm_add_epi64(key, _mm_loadu_si128(keys + 1)),
          key2 = _mm_add_epi64(key, _mm_loadu_si128(keys + 2)),
          key3 = _mm_add_epi64(key, _mm_loadu_si128(keys + 3));
  __m128i *acc = (__m128i *)lanes;
  __m128i acc0 = _mm_loadu_si128(acc), acc1 = _mm_loadu_si128(acc + 1),
          acc2 = _mm_loadu_si128(acc + 2), acc3 = _mm_loadu_si128(acc + 3);
  for (size_t b = 0; b < blocks; b++, p += BLOCK) {
    const __m128i *words = (const __m128i *)p;
    acc0 = sse2_lane_pair(acc0, _mm_loadu_si128(words), key0);
    acc1 = sse2_lane_pair(acc1, _mm_loadu_si128(words + 1), key1);
    acc2 = sse2_lane_pair(acc2, _mm_loadu_si128(words + 2), key2);
    acc3 = sse2_lane_pair(acc3, _mm_loadu_si128(words + 3), key3);
    key0 = _mm_add_epi64(key0, advance);
    key1 = _mm_add_epi64(key1, advance);
    key2 = _mm_add_epi64(key2, advance);
    key3 = _mm_add_epi64(key3, advance);
  }
  *step += blocks;
  _mm_storeu_si128(acc, acc0);
  _mm_storeu_si128(acc + 1, acc1);
  _mm_storeu_si128(acc + 2, acc2);
  _mm_storeu_si128(acc + 3, acc3);
}

__attribute__((target("avx2"))) static void
stripe_avx2(uint64_t lanes[LANES], const unsigned char *p, size_t blocks, uint64_t *step) {
  __m256i low = _mm256_loadu_si256((const __m256i *)lanes),
          high = _mm256_loadu_si256((const __m256i *)(lanes + 4));
  __m256i key = _mm256_set1_epi64x((long long)(*step * MIX_A)),
          advance = _mm256_set1_epi64x((long long)MIX_A);
  __m256i key_low = _mm256_add_epi64(key, _mm256_loadu_si256((const __m256i *)lane_keys)),
          key_high = _mm256_add_epi64(key, _mm256_loadu_si256((const __m256i *)(lane_keys + 4)));
  for (size_t b = 0; b < blocks; b++, p += BLOCK) {
    __m256i word_low = _mm256_loadu_si256((const __m256i *)p),
            word_high = _mm256_loadu_si256((const __m256i *)(p + 32));
    __m256i x_low = _mm256_xor_si256(word_low, key_low),
            x_high = _mm256_xor_si256(word_high, key_high);
    low = _mm256_add_epi64(
        low, _mm256_add_epi64(_mm256_mul_epu32(x_low, _mm256_srli_epi64(x_low, 32)), word_low));
    high = _mm256_add_epi64(
        high, _mm256_add_epi64(_mm256_mul_epu32(x_high, _mm256_srli_epi64(x_high, 32)), word_high));
    key_low = _mm256_add_epi64(key_low, advance);
    key_high = _mm256_add_epi64(key_high, advance);
  }
  *step += blocks;
  _mm256_storeu_si256((__m256i *)lanes, low);
  _mm256_storeu_si256((__m256i *)(lanes + 4), high);
}

static bool cpu_has_avx2(void) {
  static _Atomic int known; // 0: not asked yet; 1: no; 2: yes
  int answer = atomic_load_explicit(&known, memory_order_relaxed);
  if (!answer) {
    __builtin_cpu_init(); // the sum may be asked for before constructors ran
    answer = __builtin_cpu_supports("avx2") ? 2 : 1;
    atomic_store_explicit(&known, answer, memory_order_relaxed);
  }
  return answer == 2;
}
#endif

typedef struct checksum_way {
  const char *name;
  stripe_fn *stripe;
} checksum_way;

static const checksum_way every_way[] = {
    {"portable", stripe_portable},
#ifdef HAVE_X86_STRIPES
    {"sse2", stripe_sse2},
    {"avx2", stripe_avx2},
#endif
};

unsigned devbuf_tool_checksum_ways(void) {
#ifdef HAVE_X86_STRIPES
  return cpu_has_avx2() ? 3 : 2;
#else
  return 1;
#endif
}

const char *devbuf_tool_checksum_way_name(unsigned way) {
  return way < devbuf_tool_checksum_ways() ? every_way[way].name : NULL;
}

static uint64_t checksum_with(stripe_fn *stripe, const unsigned char *p, size_t size) {
  uint64_t lanes[LANES];
  for (int i = 0; i < LANES; i++) lanes[i] = MIX_A * (uint64_t)(i + 1);
  uint64_t step = 1;
  size_t blocks = size / BLOCK;
  while (blocks) {
    size_t n = blocks < BLOCKS_PER_STRIPE ? blocks : BLOCKS_PER_STRIPE;
    stripe(lanes, p, n, &step);
    for (int i = 0; i < LANES; i++) lanes[i] = (lanes[i] ^ (lanes[i] >> 47)) * MIX_B;
    p += n * BLOCK;
    blocks -= n;
  }
  uint64_t h = (uint64_t)size * MIX_A;
  for (int i = 0; i < LANES; i++) h = round64(h, lanes[i]);
  size_t rest = size % BLOCK;
  for (; rest >= 8; rest -= 8, p += 8) h = round64(h, load64(p));
  for (; rest; rest--, p++) h = rotate(h ^ (*p * MIX_A), 11) * MIX_B;
  h ^= h >> 33; // avalanche: every input bit reaches every output bit
  h *= MIX_B;
  h ^= h >> 29;
  h *= MIX_A;
  return h ^ (h >> 32);
}

uint64_t devbuf_tool_checksum_by(unsigned way, const void *data, size_t size) {
  if (way >= devbuf_tool_checksum_ways()) way = 0;
  return checksum_with(every_way[way].stripe, data, size);
}

uint64_t devbuf_tool_checksum(const void *data, size_t size) {
  return devbuf_tool_checksum_by(devbuf_tool_checksum_ways() - 1, data, size);
}
