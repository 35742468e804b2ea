// SHA-256 (FIPS 180-4), so that `devbuf load --verify` prints the digest any tool
// (sha256sum, Python's hashlib) reproduces from a tensor's bytes.
#ifndef DEVBUF_TOOL_SHA256_H
#define DEVBUF_TOOL_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct devbuf_sha256 {
  uint32_t state[8];
  uint64_t length;         // bytes hashed so far
  unsigned char block[64]; // the partial block
  size_t used;             // bytes of it
} devbuf_sha256;

void devbuf_sha256_init(devbuf_sha256 *hash);
void devbuf_sha256_update(devbuf_sha256 *hash, const void *data, size_t size);
void devbuf_sha256_final(devbuf_sha256 *hash, unsigned char digest[32]);
// The digest as 64 lower-case hex digits and a terminating zero.
void devbuf_sha256_hex(const unsigned char digest[32], char out[65]);

#endif
