// The tridiagonal family's two textbook kernels: cuThomasBatch (one thread a system) and the
// PCR notes' kernel (one thread a row). Included by tridiagonal.cu only.
#pragma once

#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include <cstdint>

#include "common/numerics.cuh"
#include "runtime/pinned_word.h"
#include "tridiagonal/partitioned_kernels.cuh"
#include "trisolve/windows.h"

namespace trisolve::cuda {
namespace {

// ---- cuThomasBatch: one thread per system ------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThomasThreads)
    ThomasKernel(TridiagonalProblem<T> p, T* __restrict__ x, T* __restrict__ cp, uint8_t* flags,
                 bool interleaved) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= p.batch) return;
  const int64_t st = interleaved ? p.batch : 1;
  const int64_t off = interleaved ? s : s * p.n;
  const T* a = p.a + off;
  const T* b = p.b + off;
  const T* c = p.c + off;
  const T* d = p.d + off;
  T* xs = x + off;
  T* cs = cp + off;
  bool ok = !Vanishes(b[0], fabs(b[0]));
  T inv = T(1) / b[0];
  T cprev = p.n > 1 ? c[0] * inv : T(0);
  T dprev = d[0] * inv;
  cs[0] = cprev;
  xs[0] = dprev;
  for (int64_t k = 1; k < p.n; ++k) {
    const T ak = a[k * st];
    const T t = ak * cprev;
    const T piv = b[k * st] - t;
    ok &= !Vanishes(piv, fabs(b[k * st]) + fabs(t));
    inv = T(1) / piv;
    cprev = k + 1 < p.n ? c[k * st] * inv : T(0);
    dprev = (d[k * st] - ak * dprev) * inv;
    cs[k * st] = cprev;
    xs[k * st] = dprev;
  }
  T xn = dprev;
  ok &= Finite(xn);
  for (int64_t k = p.n - 2; k >= 0; --k) {
    xn = xs[k * st] - cs[k * st] * xn;
    ok &= Finite(xn);
    xs[k * st] = xn;
  }
  if (!ok) flags[s] = 1;
}

// ---- the PCR notes' kernel: one thread per row, blockDim / d systems per block ------------
template <typename T>
__global__ void PcrNotesKernel(TridiagonalProblem<T> p, T* __restrict__ x, uint8_t* flags,
                               bool interleaved) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sm = reinterpret_cast<T*>(smem_raw);
  const int d = int(p.n);
  const int per_block = blockDim.x / d;
  const int tidx = threadIdx.x % d;                       // the row
  const int Qt = (threadIdx.x - tidx) / d;                // the system within the block
  const int64_t gbx = Qt + int64_t(blockIdx.x) * per_block;  // the system
  const bool live = Qt < per_block && gbx < p.batch;
  T* A = sm + 8 * d * Qt;  // two buffers of a, b, c, d per system
  T* B = A + d;
  T* C = B + d;
  T* D = C + d;
  T* A2 = D + d;
  T* B2 = A2 + d;
  T* C2 = B2 + d;
  T* D2 = C2 + d;
  bool ok = true;
  if (live) {
    const int64_t e = At(interleaved, p.batch, p.n, gbx, tidx);
    A[tidx] = tidx > 0 ? p.a[e] : T(0);
    B[tidx] = p.b[e];
    C[tidx] = tidx + 1 < d ? p.c[e] : T(0);
    D[tidx] = p.d[e];
  }
  __syncthreads();
  for (int stride = 1; stride < d; stride *= 2) {
    if (live) {
      // The neighbours read only when present: reading them always cost this kernel 20% (H100,
      // n = 32).
      const int il = tidx - stride, ir = tidx + stride;
      T an, bn, cn, dn;
      ok &= PcrCombine<true>(A, B, C, D, tidx, il >= 0, il, ir < d, ir, [](int r) { return r; },
                             an, bn, cn, dn);
      A2[tidx] = an;
      B2[tidx] = bn;
      C2[tidx] = cn;
      D2[tidx] = dn;
    }
    __syncthreads();
    T* t;
    t = A; A = A2; A2 = t;
    t = B; B = B2; B2 = t;
    t = C; C = C2; C2 = t;
    t = D; D = D2; D2 = t;
  }
  if (live) {
    const T xv = D[tidx] / B[tidx];
    ok &= !Vanishes(B[tidx], fabs(B[tidx])) && Finite(xv);
    x[At(interleaved, p.batch, p.n, gbx, tidx)] = xv;
    if (!ok) flags[gbx] = 1;
  }
}

}  // namespace
}  // namespace trisolve::cuda
