// The block family's element-wise kernels: layout permutations, right-hand sides, residuals,
// the operator's application, dot products and vector updates.
#pragma once

#include <cstdint>

#include "common/grid_reduce.cuh"
#include "tridiagonal/row_sweeps.h"
#include "trisolve/block_tridiagonal.h"

namespace trisolve::cuda {
namespace {

// dst[Perm(i)] = src[i] for every row; with scale, each value divided by cC (rows whose
// diagonal is below 1e-16 kept, as the thesis does) and cC itself set to 1.
template <typename T>
__global__ void PermuteKernel(int64_t N, int64_t M, const T* __restrict__ src,
                              const T* __restrict__ cC, T* __restrict__ dst, bool scale,
                              bool is_diag) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= N * M) return;
  const int64_t i = e / M, k = e - i * M;
  T v = src[e];
  if (scale) {
    const T dg = cC[e];
    if (fabs(dg) >= T(1e-16)) v = is_diag ? T(1) : v / dg;
  }
  dst[Perm(i, N) * M + k] = v;
}

template <typename T>
__global__ void UnpermuteKernel(int64_t N, int64_t M, const T* __restrict__ src,
                                T* __restrict__ dst) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= N * M) return;
  const int64_t i = e / M, k = e - i * M;
  dst[e] = src[Perm(i, N) * M + k];
}

// D for the rows r0 .. r1-1 of the colour-major layout: F_i - A_i Y_{i-1} - B_i Y_{i+1}.
template <typename T>
__global__ void RhsKernel(int64_t N, int64_t M, int64_t r0, int64_t r1, const T* __restrict__ f,
                          const T* __restrict__ cA, const T* __restrict__ cB,
                          const T* __restrict__ y, T* __restrict__ D) {
  const int64_t e = r0 * M + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= r1 * M) return;
  const int64_t r = e / M, k = e - r * M;
  const int64_t half = (N + 1) / 2;
  const int64_t i = r < half ? 2 * r : 2 * (r - half) + 1;  // the natural row
  T v = f[e];
  if (i > 0) v -= cA[e] * y[Perm(i - 1, N) * M + k];
  if (i + 1 < N) v -= cB[e] * y[Perm(i + 1, N) * M + k];
  D[e] = v;
}

// Sums of (f - A y)^2 and f^2 over the system (natural arrays, y colour-major) into acc[0..1]
// (GridSum2's scratch).
template <typename T>
__global__ void ResidualKernel(BlockTridiagonalProblem<T> p, const T* __restrict__ y,
                               double* acc, bool permuted) {
  const int64_t N = p.N, M = p.M;
  double rr = 0, ff = 0;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < N * M;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / M, k = e - i * M;
    auto row = [&](int64_t r) { return y + (permuted ? Perm(r, N) : r) * M; };
    const T* yi = row(i);
    double ay = double(p.cC[e]) * yi[k];
    if (k > 0) ay += double(p.aC[e]) * yi[k - 1];
    if (k + 1 < M) ay += double(p.bC[e]) * yi[k + 1];
    if (i > 0) ay += double(p.cA[e]) * row(i - 1)[k];
    if (i + 1 < N) ay += double(p.cB[e]) * row(i + 1)[k];
    const double r = double(p.f[e]) - ay;
    rr += r * r;
    ff += double(p.f[e]) * double(p.f[e]);
  }
  GridSum2(rr, ff, acc);
}

unsigned Blocks(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

// out = f - A v (subtract) or out = A v, natural layout.
template <typename T>
__global__ void ApplyKernel(BlockTridiagonalProblem<T> p, const T* __restrict__ v,
                            T* __restrict__ out, bool residual) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t N = p.N, M = p.M;
  if (e >= N * M) return;
  const int64_t i = e / M, k = e - i * M;
  T s = p.cC[e] * v[e];
  if (k > 0) s += p.aC[e] * v[e - 1];
  if (k + 1 < M) s += p.bC[e] * v[e + 1];
  if (i > 0) s += p.cA[e] * v[e - M];
  if (i + 1 < N) s += p.cB[e] * v[e + M];
  out[e] = residual ? p.f[e] - s : s;
}

// acc[0] = u.v, acc[1] = w.x (w may be null), in double (GridSum2's scratch).
template <typename T>
__global__ void DotKernel(int64_t n, const T* __restrict__ u, const T* __restrict__ v,
                          const T* __restrict__ w, const T* __restrict__ x, double* acc) {
  double a = 0, b = 0;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    a += double(u[e]) * v[e];
    if (w) b += double(w[e]) * x[e];
  }
  GridSum2(a, b, acc);
}

// y += alpha d, r -= alpha q.
template <typename T>
__global__ void UpdateYR(int64_t n, T alpha, const T* __restrict__ d, const T* __restrict__ q,
                         T* __restrict__ y, T* __restrict__ r) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  y[e] += alpha * d[e];
  r[e] -= alpha * q[e];
}

// d = z + beta d.
template <typename T>
__global__ void UpdateD(int64_t n, T beta, const T* __restrict__ z, T* __restrict__ d) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  d[e] = z[e] + beta * d[e];
}


}  // namespace
}  // namespace trisolve::cuda
