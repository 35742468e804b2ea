// Kernels of the CUDA tests, compiled by nvcc at build time (SASS for sm_80 and sm_90, PTX
// for later GPUs) and embedded in test_cuda as a fatbin.
extern "C" __global__ void scale(float *out, const float *in, float factor, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * factor;
}

extern "C" __global__ void add_one(int *data, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) data[i] += 1;
}

// add_one for blocks of at most 128 threads: the driver reports the bound as the kernel's
// CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK and refuses larger blocks.
extern "C" __global__ void __launch_bounds__(128) add_one_bounded(int *data, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) data[i] += 1;
}

// Writes where no memory is: a device fault (CUDA_ERROR_ILLEGAL_ADDRESS), which poisons the
// context for the rest of the process.
extern "C" __global__ void fault(unsigned long long nowhere) { *(volatile int *)nowhere = 1; }
