// SHA-256 as FIPS 180-4 defines it: 64 rounds over 512-bit blocks, big-endian words. With
// the x86 SHA extensions where the CPU has them (several times the portable code's speed),
// the portable rounds elsewhere; both give the same digests (test_tool_cli checks them
// against Python's hashlib).
#include "sha256.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHA_EXTENSIONS 1
#endif

static const uint32_t round_constants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t rotate_right(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

static void compress(uint32_t state[8], const unsigned char *block) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
           (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = rotate_right(w[i - 15], 7) ^ rotate_right(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotate_right(w[i - 2], 17) ^ rotate_right(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3], e = state[4], f = state[5],
           g = state[6], h = state[7];
  for (int i = 0; i < 64; i++) {
    uint32_t s1 = rotate_right(e, 6) ^ rotate_right(e, 11) ^ rotate_right(e, 25);
    uint32_t choice = (e & f) ^ (~e & g);
    uint32_t t1 = h + s1 + choice + round_constants[i] + w[i];
    uint32_t s0 = rotate_right(a, 2) ^ rotate_right(a, 13) ^ rotate_right(a, 22);
    uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = s0 + majority;
    h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  state[0] += a, state[1] += b, state[2] += c, state[3] += d;
  state[4] += e, state[5] += f, state[6] += g, state[7] += h;
}

#ifdef HAVE_SHA_EXTENSIONS
// The state lives in two registers as ABEF and CDGH, the order the instructions want; each
// sha256rnds2 does two rounds, and sha256msg1/msg2 extend the message schedule 4 words at once.
__attribute__((target("sha,sse4.1,ssse3"))) static void
compress_extensions(uint32_t state[8], const unsigned char *data, size_t blocks) {
  const __m128i byte_swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[0]), 0xB1);
  __m128i cdgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[4]), 0x1B);
  __m128i abef = _mm_alignr_epi8(dcba, cdgh, 8);
  cdgh = _mm_blend_epi16(cdgh, dcba, 0xF0);
  for (; blocks--; data += 64) {
    __m128i saved_abef = abef, saved_cdgh = cdgh, w[4];
    for (int i = 0; i < 4; i++)
      w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(data + 16 * i)), byte_swap);
    for (int i = 0; i < 16; i++) {
      __m128i m =
          _mm_add_epi32(w[i % 4], _mm_loadu_si128((const __m128i *)&round_constants[4 * i]));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, m);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(m, 0x0E));
      if (i < 12) { // the words of 4 steps later
        __m128i x = _mm_sha256msg1_epu32(w[i % 4], w[(i + 1) % 4]);
        x = _mm_add_epi32(x, _mm_alignr_epi8(w[(i + 3) % 4], w[(i + 2) % 4], 4));
        w[i % 4] = _mm_sha256msg2_epu32(x, w[(i + 3) % 4]);
      }
    }
    abef = _mm_add_epi32(abef, saved_abef);
    cdgh = _mm_add_epi32(cdgh, saved_cdgh);
  }
  __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128((__m128i *)&state[0], _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128((__m128i *)&state[4], _mm_alignr_epi8(dchg, feba, 8));
}
#endif

static void compress_blocks(uint32_t state[8], const unsigned char *data, size_t blocks) {
#ifdef HAVE_SHA_EXTENSIONS
  static _Atomic int extensions = -1; // racing threads store the same answer
  int have = atomic_load_explicit(&extensions, memory_order_relaxed);
  if (have < 0) {
    unsigned eax, ebx = 0, ecx = 0, edx;
    bool sha = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 29));
    bool sse41 = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 19));
    have = sha && sse41 && !getenv("DEVBUF_SHA256_PORTABLE"); // the tests run both
    atomic_store_explicit(&extensions, have, memory_order_relaxed);
  }
  if (have) {
    compress_extensions(state, data, blocks);
    return;
  }
#endif
  for (; blocks--; data += 64) compress(state, data);
}

void devbuf_sha256_init(devbuf_sha256 *hash) {
  static const uint32_t initial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(hash->state, initial, sizeof initial);
  hash->length = 0;
  hash->used = 0;
}

void devbuf_sha256_update(devbuf_sha256 *hash, const void *data, size_t size) {
  if (size == 0) return; // data may be NULL (an empty tensor's)
  const unsigned char *bytes = data;
  hash->length += size;
  if (hash->used) {
    size_t take = 64 - hash->used < size ? 64 - hash->used : size;
    memcpy(hash->block + hash->used, bytes, take);
    hash->used += take, bytes += take, size -= take;
    if (hash->used < 64) return;
    compress_blocks(hash->state, hash->block, 1);
    hash->used = 0;
  }
  compress_blocks(hash->state, bytes, size / 64);
  bytes += size / 64 * 64;
  size %= 64;
  memcpy(hash->block, bytes, size);
  hash->used = size;
}

void devbuf_sha256_final(devbuf_sha256 *hash, unsigned char digest[32]) {
  uint64_t bits = hash->length * 8;
  unsigned char pad[72] = {0x80};
  size_t pad_size = (hash->used < 56 ? 56 : 120) - hash->used;
  for (int i = 0; i < 8; i++) pad[pad_size + i] = (unsigned char)(bits >> (56 - 8 * i));
  devbuf_sha256_update(hash, pad, pad_size + 8);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) digest[4 * i + j] = (unsigned char)(hash->state[i] >> (24 - 8 * j));
}

void devbuf_sha256_hex(const unsigned char digest[32], char out[65]) {
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", digest[i]);
}
