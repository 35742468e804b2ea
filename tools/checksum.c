// The checksum of checksum.h. Eight lanes of a keyed multiply-accumulate (the NH
// construction of universal hashing: one 32x32->64 multiply per 8 bytes, which compilers
// turn into SIMD multiplies), with a key that moves on every 64-byte block so that
// reordered blocks change the sum, and a multiply-rotate scramble of the lanes every
// 4 KiB so that every input bit reaches every lane. The tail and the final mix use
// plain multiply-rotate rounds.
#include "checksum.h"

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

// One stripe of `blocks` 64-byte blocks into the lanes; `step` is the block counter. The
// SSE2 path (every x86-64 CPU has it) computes exactly what the portable one does.
#if defined(__SSE2__) && !defined(DEVBUF_CHECKSUM_PORTABLE)
#include <emmintrin.h>
static void stripe(uint64_t lanes[LANES], const unsigned char *p, size_t blocks, uint64_t *step) {
  __m128i acc[LANES / 2], keys[LANES / 2];
  for (int j = 0; j < LANES / 2; j++) {
    acc[j] = _mm_loadu_si128((const __m128i *)(lanes + 2 * j));
    keys[j] = _mm_loadu_si128((const __m128i *)(lane_keys + 2 * j));
  }
  for (size_t b = 0; b < blocks; b++, p += BLOCK) {
    __m128i key = _mm_set1_epi64x((long long)(*step * MIX_A));
    (*step)++;
    for (int j = 0; j < LANES / 2; j++) {
      __m128i word = _mm_loadu_si128((const __m128i *)(p + 16 * j));
      __m128i x = _mm_xor_si128(word, _mm_add_epi64(key, keys[j]));
      __m128i product = _mm_mul_epu32(x, _mm_srli_epi64(x, 32)); // low half times high half
      acc[j] = _mm_add_epi64(acc[j], _mm_add_epi64(product, word));
    }
  }
  for (int j = 0; j < LANES / 2; j++) _mm_storeu_si128((__m128i *)(lanes + 2 * j), acc[j]);
}
#else
static void stripe(uint64_t lanes[LANES], const unsigned char *p, size_t blocks, uint64_t *step) {
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
#endif

uint64_t devbuf_tool_checksum(const void *data, size_t size) {
  const unsigned char *p = data;
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
