// TRISOLVE_HD: a function the CPU reference and the CUDA kernels share (one definition, so both
// compute the same bits): __host__ __device__ under nvcc, nothing elsewhere.
#pragma once

#ifdef __CUDACC__
#define TRISOLVE_HD __host__ __device__
#else
#define TRISOLVE_HD
#endif
