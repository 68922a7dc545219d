// Grid-wide sums in a fixed order (bit-reproducible reductions) for the Krylov methods and the
// residuals of the block family.
#pragma once

#include <cstdint>

namespace trisolve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kReduceBlocks = 1024;  // blocks of the reduction kernels at most

// The scratch of a grid-wide sum of two values: acc[0..1] the sums, acc[2] the count of blocks
// done, acc[4 + 2b ..] block b's partial sums. Zeroed once when allocated.
constexpr int64_t kAccBytes = 8 * (4 + 2 * int64_t(kReduceBlocks));

// Thread 0 of the block gets the block's sums of a and b (a fixed-order tree).
__device__ __forceinline__ void BlockSum2(double& a, double& b) {
  __shared__ double s0[kThreads / 32], s1[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  __syncthreads();  // s0/s1 free (the helper may run twice in a kernel)
  if ((threadIdx.x & 31) == 0) {
    s0[threadIdx.x >> 5] = a;
    s1[threadIdx.x >> 5] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    a = 0;
    b = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      a += s0[w];
      b += s1[w];
    }
  }
}

// acc[0], acc[1] = the grid's sums of a and b, added in an order fixed by the grid size, so
// that a solve gives the same bits run to run (float atomics would not: CG and BiCGStab
// iteration counts wandered by 2). Each block stores its partial sums; the last block to
// finish adds them up in block order and resets the count.
__device__ __forceinline__ void GridSum2(double a, double b, double* acc) {
  __shared__ bool last;
  BlockSum2(a, b);
  if (threadIdx.x == 0) {
    acc[4 + 2 * blockIdx.x] = a;
    acc[5 + 2 * blockIdx.x] = b;
    __threadfence();
    last = atomicAdd(reinterpret_cast<unsigned*>(acc + 2), 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  double ta = 0, tb = 0;
  for (unsigned q = threadIdx.x; q < gridDim.x; q += blockDim.x) {
    ta += __ldcg(acc + 4 + 2 * q);
    tb += __ldcg(acc + 5 + 2 * q);
  }
  BlockSum2(ta, tb);
  if (threadIdx.x == 0) {
    acc[0] = ta;
    acc[1] = tb;
    *reinterpret_cast<unsigned*>(acc + 2) = 0;
  }
}

}  // namespace
}  // namespace trisolve::cuda
