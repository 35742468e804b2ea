// devbuf's own CUDA kernels, compiled by nvcc at build time (SASS for sm_80 and sm_90, PTX
// for later GPUs) and embedded in the library. Copies need none: the driver's copy engines
// do them (cuMemcpyAsync).

// A fill with a pattern of 1 to 64 bytes that the driver's memsets (1, 2 and 4 bytes, at
// aligned addresses) do not cover: each thread writes 16 bytes, the grid strides.
struct devbuf_pattern {
  unsigned char bytes[64];
};

extern "C" __global__ void devbuf_fill(unsigned char *dst, unsigned long long size,
                                       devbuf_pattern pattern, unsigned pattern_size) {
  unsigned long long stride = 16ull * gridDim.x * blockDim.x;
  for (unsigned long long i = 16ull * (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x);
       i < size; i += stride) {
    unsigned phase = (unsigned)(i % pattern_size);
    for (unsigned k = 0; k < 16 && i + k < size; k++) {
      dst[i + k] = pattern.bytes[phase];
      if (++phase == pattern_size) phase = 0;
    }
  }
}
