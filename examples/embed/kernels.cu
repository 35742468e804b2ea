// The forward pass's kernels for CUDA: kernels.cl compiled as CUDA C++. nvcc turns this file
// into a fatbin at build time (SASS for sm_80 and sm_90, PTX for later devices), which
// devbuf_program_build loads as a module; kernels are found by their C names.
typedef unsigned int uint;

#define KERNEL extern "C" __global__ void
#define GLOBAL
#define LOCAL
#define LOCAL_ARRAY __shared__
#define BARRIER()   __syncthreads()
#define LOCAL_ID(d) ((d) == 0 ? threadIdx.x : (d) == 1 ? threadIdx.y : threadIdx.z)
#define GROUP_ID(d) ((d) == 0 ? blockIdx.x : (d) == 1 ? blockIdx.y : blockIdx.z)
#define EXP(x)      expf(x)
#define ERF(x)      erff(x)
#define RSQRT(x)    rsqrtf(x)
#define SQRT(x)     sqrtf(x)
#define MAX(a, b)   fmaxf(a, b)
#define FUNC        static __device__ __forceinline__

#include "kernels.cl"
