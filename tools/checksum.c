// The checksum of checksum.h.
#include "checksum.h"

#include <string.h>

#define MIX_A UINT64_C(0x9e3779b97f4a7c15) // 2^64 / golden ratio, odd
#define MIX_B UINT64_C(0xd6e8feb86659fd93)

static inline uint64_t rotate(uint64_t x, int bits) { return x << bits | x >> (64 - bits); }

static inline uint64_t lane(uint64_t accumulator, uint64_t word) {
  return rotate(accumulator + word * MIX_B, 31) * MIX_A;
}

static inline uint64_t load64(const unsigned char *p) {
  uint64_t word;
  memcpy(&word, p, 8); // any alignment; compiles to one load
  return word;
}

uint64_t devbuf_tool_checksum(const void *data, size_t size) {
  const unsigned char *p = data;
  uint64_t a = MIX_A, b = MIX_B, c = ~MIX_A, d = ~MIX_B;
  size_t blocks = size / 32;
  for (size_t i = 0; i < blocks; i++, p += 32) {
    a = lane(a, load64(p));
    b = lane(b, load64(p + 8));
    c = lane(c, load64(p + 16));
    d = lane(d, load64(p + 24));
  }
  uint64_t h = rotate(a, 1) + rotate(b, 7) + rotate(c, 12) + rotate(d, 18) + (uint64_t)size;
  for (size_t rest = size % 32; rest >= 8; rest -= 8, p += 8) h = lane(h, load64(p));
  for (size_t rest = size % 8; rest; rest--, p++) h = rotate(h ^ (*p * MIX_A), 11) * MIX_B;
  h ^= h >> 33; // avalanche: every input bit reaches every output bit
  h *= MIX_B;
  h ^= h >> 29;
  h *= MIX_A;
  return h ^ (h >> 32);
}
