// The thesis' block Gauss-Seidel / red-black / Jacobi iterations on the GPU.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda/atomic>
#include <cuda_pipeline.h>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "block_cuda.h"
#include "bulk_copy.cuh"
#include "check.h"
#include "launch.h"
#include "partitioned.cuh"
#include "pinned_word.h"
#include "tridiagonal_cuda.h"
#include "trisolve/windows.h"

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

// Row i's place in the colour-major layout: even rows first, then odd rows.
__device__ __forceinline__ int64_t Perm(int64_t i, int64_t N) {
  return (i & 1) ? (N + 1) / 2 + i / 2 : i / 2;
}

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

// ---- The multigrid V-cycle of multigrid-cg (trisolve/block_tridiagonal.h), level by level.
// A level: N x M cells, couplings w (k - 1), e (k + 1), n (i - 1), s (i + 1) zero where the
// neighbour does not exist, diagonal c. The arithmetic follows the CPU reference's order.
template <typename T>
struct MgDev {
  int64_t N, M;
  T *w, *c, *e, *n, *s;
  T *r, *z;  // the level's right-hand side and correction (level 0: CG's own vectors)
};

template <typename T>
__global__ void MgFineKernel(BlockTridiagonalProblem<T> p, MgDev<T> a) {
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= a.N * a.M) return;
  const int64_t i = q / a.M, k = q - i * a.M;
  a.w[q] = k > 0 ? p.aC[q] : T(0);
  a.e[q] = k + 1 < a.M ? p.bC[q] : T(0);
  a.n[q] = i > 0 ? p.cA[q] : T(0);
  a.s[q] = i + 1 < a.N ? p.cB[q] : T(0);
  a.c[q] = p.cC[q];
}

// The Galerkin coarse level of 2 x 2 aggregates: one thread a coarse cell.
template <typename T>
__global__ void MgCoarsenKernel(MgDev<T> a, MgDev<T> b) {
  const int64_t Q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (Q >= b.N * b.M) return;
  const int64_t I = Q / b.M, K = Q - I * b.M;
  T c = 0, w = 0, e = 0, n = 0, s = 0;
  for (int di = 0; di < 2; ++di)
    for (int dk = 0; dk < 2; ++dk) {
      const int64_t i = 2 * I + di, k = 2 * K + dk;
      if (i >= a.N || k >= a.M) continue;
      const int64_t q = i * a.M + k;
      c += a.c[q] + (dk ? a.w[q] : T(0)) + (dk ? T(0) : a.e[q]) + (di ? a.n[q] : T(0)) +
           (di ? T(0) : a.s[q]);
      if (!dk) w += a.w[q];
      if (dk) e += a.e[q];
      if (!di) n += a.n[q];
      if (di) s += a.s[q];
    }
  b.c[Q] = c;
  b.w[Q] = w;
  b.e[Q] = e;
  b.n[Q] = n;
  b.s[Q] = s;
}

template <typename T>
__device__ __forceinline__ void MgRelax(const MgDev<T>& a, int64_t q, int64_t i, int64_t k) {
  T v = a.r[q];
  if (k > 0) v -= a.w[q] * a.z[q - 1];
  if (k + 1 < a.M) v -= a.e[q] * a.z[q + 1];
  if (i > 0) v -= a.n[q] * a.z[q - a.M];
  if (i + 1 < a.N) v -= a.s[q] * a.z[q + a.M];
  a.z[q] = v / a.c[q];
}

// A red-black half-sweep (cells with (i + k) % 2 == colour); `first`: z starts at zero (the
// other colour's cells are zeroed here instead of by a memset).
template <typename T>
__global__ void MgHalfSweepKernel(MgDev<T> a, int colour, bool first) {
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= a.N * a.M) return;
  const int64_t i = q / a.M, k = q - i * a.M;
  if (((i + k) & 1) != colour) {
    if (first) a.z[q] = T(0);
    return;
  }
  if (first) {
    a.z[q] = a.r[q] / a.c[q];  // its neighbours are all zero
    return;
  }
  MgRelax(a, q, i, k);
}

// rc = sum over the aggregate of (r - A z): one thread a coarse cell.
template <typename T>
__global__ void MgRestrictKernel(MgDev<T> a, MgDev<T> b) {
  const int64_t Q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (Q >= b.N * b.M) return;
  const int64_t I = Q / b.M, K = Q - I * b.M;
  T acc = 0;
  for (int di = 0; di < 2; ++di)
    for (int dk = 0; dk < 2; ++dk) {
      const int64_t i = 2 * I + di, k = 2 * K + dk;
      if (i >= a.N || k >= a.M) continue;
      const int64_t q = i * a.M + k;
      T v = a.r[q] - a.c[q] * a.z[q];
      if (k > 0) v -= a.w[q] * a.z[q - 1];
      if (k + 1 < a.M) v -= a.e[q] * a.z[q + 1];
      if (i > 0) v -= a.n[q] * a.z[q - a.M];
      if (i + 1 < a.N) v -= a.s[q] * a.z[q + a.M];
      acc += v;
    }
  b.r[Q] = acc;
}

template <typename T>
__global__ void MgProlongKernel(MgDev<T> a, MgDev<T> b, T factor) {
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= a.N * a.M) return;
  const int64_t i = q / a.M, k = q - i * a.M;
  a.z[q] += factor * b.z[(i / 2) * b.M + k / 2];
}

// The coarsest level (at most kMgCoarsest cells) in one block: sweeps forward, then as many
// backward, barriers between the half-sweeps.
template <typename T>
__global__ void MgCoarsestKernel(MgDev<T> a, int sweeps) {
  const int64_t size = a.N * a.M;
  for (int64_t q = threadIdx.x; q < size; q += blockDim.x) a.z[q] = T(0);
  __syncthreads();
  for (int pass = 0; pass < 2 * sweeps; ++pass) {
    const bool forward = pass < sweeps;
    for (int h = 0; h < 2; ++h) {
      const int colour = forward ? h : 1 - h;
      for (int64_t q = threadIdx.x; q < size; q += blockDim.x) {
        const int64_t i = q / a.M, k = q - i * a.M;
        if (((i + k) & 1) == colour) MgRelax(a, q, i, k);
      }
      __syncthreads();
    }
  }
}

// Flags the diagonals' signs on any level: flag[0] some diagonal not positive and finite,
// flag[1] some not negative and finite, flag[2] some zero or not finite.
template <typename T>
__global__ void MgDiagonalCheck(int64_t n, const T* c, uint8_t* flag) {
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= n) return;
  const T big = sizeof(T) == 8 ? T(DBL_MAX) : T(FLT_MAX);
  const T v = c[q];
  if (!(v > T(0) && v <= big)) flag[0] = 1;
  if (!(v < T(0) && v >= -big)) flag[1] = 1;
  if (!(v != T(0) && v <= big && v >= -big)) flag[2] = 1;
}

// The sign the diagonals share (+1, -1; 0 neither) and whether none is zero, from the flags.
struct DiagonalSigns {
  int sign = 0;
  bool nonzero = false;
};
inline DiagonalSigns SignsOf(const uint8_t f[3]) {
  return {f[0] == 0 ? 1 : f[1] == 0 ? -1 : 0, f[2] == 0};
}

template <typename T>
absl::Status VCycleDevice(std::vector<MgDev<T>>& L, size_t l, cudaStream_t stream) {
  MgDev<T>& a = L[l];
  const int64_t size = a.N * a.M;
  if (l + 1 == L.size()) {
    MgCoarsestKernel<T><<<1, 256, 0, stream>>>(a, kMgCoarseSweeps);
    return CudaStatus(cudaGetLastError(), "MgCoarsestKernel");
  }
  MgDev<T>& b = L[l + 1];
  MgHalfSweepKernel<T><<<Blocks(size), kThreads, 0, stream>>>(a, 0, true);
  MgHalfSweepKernel<T><<<Blocks(size), kThreads, 0, stream>>>(a, 1, false);
  MgRestrictKernel<T><<<Blocks(b.N * b.M), kThreads, 0, stream>>>(a, b);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (auto st = VCycleDevice(L, l + 1, stream); !st.ok()) return st;
  MgProlongKernel<T><<<Blocks(size), kThreads, 0, stream>>>(a, b, T(kMgCorrection));
  MgHalfSweepKernel<T><<<Blocks(size), kThreads, 0, stream>>>(a, 1, false);
  MgHalfSweepKernel<T><<<Blocks(size), kThreads, 0, stream>>>(a, 0, false);
  return CudaStatus(cudaGetLastError(), "V-cycle");
}

// The multigrid hierarchy on the device: level sizes as the CPU reference's, 5 coefficient
// arrays a level and r and z for the coarse ones (the fine level's r and z are the Krylov
// method's vectors, set by ApplyVCycle).
template <typename T>
struct MgHierarchy {
  std::vector<MgDev<T>> levels;
  Pool::Buffer buf;
  // The diagonals' common sign on every level (+1, -1; 0: neither, an indefinite matrix) and
  // whether none is zero (the point smoother divides by them).
  DiagonalSigns signs;
};

// Builds the levels and checks their diagonals (through the device bytes flag[0..2], zeroed
// here).
template <typename T>
absl::StatusOr<MgHierarchy<T>> BuildMgDevice(const BlockTridiagonalProblem<T>& p, Pool& pool,
                                             uint8_t* flag, cudaStream_t stream) {
  std::vector<std::pair<int64_t, int64_t>> dims = {{p.N, p.M}};
  while (dims.back().first * dims.back().second > kMgCoarsest && dims.size() < 32)
    dims.push_back({(dims.back().first + 1) / 2, (dims.back().second + 1) / 2});
  int64_t total = 0;
  for (size_t l = 0; l < dims.size(); ++l)
    total += dims[l].first * dims[l].second * (l == 0 ? 5 : 7);
  MgHierarchy<T> h;
  auto b = pool.Get(int64_t(sizeof(T)) * total);
  if (!b.ok()) return b.status();
  h.buf = std::move(*b);
  T* next = static_cast<T*>(h.buf.get());
  for (size_t l = 0; l < dims.size(); ++l) {
    MgDev<T> lv{dims[l].first, dims[l].second};
    const int64_t sz = lv.N * lv.M;
    for (T** a : {&lv.w, &lv.c, &lv.e, &lv.n, &lv.s}) {
      *a = next;
      next += sz;
    }
    if (l > 0) {
      lv.r = next;
      lv.z = next + sz;
      next += 2 * sz;
    }
    h.levels.push_back(lv);
  }
  MgFineKernel<T><<<Blocks(p.N * p.M), kThreads, 0, stream>>>(p, h.levels[0]);
  for (size_t l = 1; l < h.levels.size(); ++l)
    MgCoarsenKernel<T><<<Blocks(h.levels[l].N * h.levels[l].M), kThreads, 0, stream>>>(
        h.levels[l - 1], h.levels[l]);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag, 0, 3, stream));
  for (const auto& lv : h.levels)
    MgDiagonalCheck<T><<<Blocks(lv.N * lv.M), kThreads, 0, stream>>>(lv.N * lv.M, lv.c, flag);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  uint8_t bad[3] = {0, 0, 0};
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bad, flag, 3, cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag, 0, 3, stream));
  h.signs = SignsOf(bad);
  return h;
}

// out = V(in), in and out on the fine level.
template <typename T>
absl::Status ApplyVCycle(MgHierarchy<T>& h, const T* in, T* out, cudaStream_t stream) {
  h.levels[0].r = const_cast<T*>(in);
  h.levels[0].z = out;
  return VCycleDevice(h.levels, 0, stream);
}

// A method that cannot run on this matrix (CG on one that is not definite, the point smoother
// on a zero diagonal): the matrix may well be nonsingular, so never SINGULAR -- NOT_CONVERGED
// with the initial guess, its true residual, and the reason in the method string (as the CPU
// reference: "multigrid-cg (not run: ...)"). auto's caller falls back on the host.
template <typename T>
absl::StatusOr<SolveInfo> NotRun(const BlockTridiagonalProblem<T>& p, const std::string& method,
                                 const T* y, double* acc, SystemStatus* status,
                                 cudaStream_t stream) {
  const unsigned rb = unsigned(std::min<int64_t>(Blocks(p.N * p.M), kReduceBlocks));
  ResidualKernel<T><<<rb, kThreads, 0, stream>>>(p, y, acc, false);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  double h[2];
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(h, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  SolveInfo info;
  info.method = method;
  info.residual = h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
  *status = SystemStatus::kNotConverged;
  return info;
}

// Conjugate gradients preconditioned by the line solves (one batched partitioned tridiagonal
// solve over all N block rows) or by the multigrid V-cycle, natural layout; y in: the initial
// guess, out: the iterate. A negative definite matrix (every diagonal negative, on every
// level) runs as CG on -A with -P (the CPU reference's BlockCg says why nothing is negated:
// only the definiteness tests read sign * (d, Ad) and sign * (r, z)); "(negated: negative
// definite)" in the method. Where those tests fail CG stops, "(stopped: indefinite)", status
// NOT_CONVERGED: auto's caller falls back to the CPU reference's BiCGStab.
template <typename T>
absl::StatusOr<SolveInfo> CgDevice(const BlockTridiagonalProblem<T>& p, const BlockOptions& o,
                                   T* y, SystemStatus* status, Pool& pool,
                                   const SolveControl& control, cudaStream_t stream,
                                   bool multigrid) {
  const int64_t N = p.N, M = p.M, size = N * M;
  auto buf = pool.Get(kAccBytes + int64_t(sizeof(T)) * 4 * size + N + 3);
  if (!buf.ok()) return buf.status();
  auto* acc = static_cast<double*>(buf->get());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, kAccBytes, stream));
  T *r = reinterpret_cast<T*>(acc + kAccBytes / 8), *z = r + size, *d = z + size, *q = d + size;
  auto* flags = reinterpret_cast<uint8_t*>(q + size);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(N) + 3, stream));
  const unsigned rb = unsigned(std::min<int64_t>(Blocks(size), kReduceBlocks));
  auto dots = [&](const T* u, const T* v, const T* w, const T* x, double* h) -> absl::Status {
    DotKernel<T><<<rb, kThreads, 0, stream>>>(size, u, v, w, x, acc);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(h, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
    return CudaStatus(cudaStreamSynchronize(stream), "CG dot");
  };
  MgHierarchy<T> mg;
  const char* name = multigrid ? "multigrid-cg" : "cg";
  int sign = 0;
  if (multigrid) {
    auto h = BuildMgDevice(p, pool, flags, stream);
    if (!h.ok()) return h.status();
    mg = std::move(*h);
    sign = mg.signs.sign;
  } else {  // the line solves: the fine diagonals' sign
    MgDiagonalCheck<T><<<Blocks(size), kThreads, 0, stream>>>(size, p.cC, flags);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    uint8_t bad[3] = {0, 0, 0};
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bad, flags, 3, cudaMemcpyDeviceToHost, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, 3, stream));
    sign = SignsOf(bad).sign;
  }
  if (sign == 0)
    return NotRun(p, std::string(name) + " (not run: not definite: diagonals of both signs)", y,
                  acc, status, stream);
  auto precondition = [&]() -> absl::Status {
    if (multigrid) return ApplyVCycle(mg, r, z, stream);
    TridiagonalProblem<T> tp{N, M, Layout::kFlat, p.aC, p.cC, p.bC, r};
    auto k = SolveTridiagonalDevice(tp, TridiagonalMethod::kPartitioned, z, flags, pool, stream);
    return k.ok() ? absl::OkStatus() : k.status();
  };
  ApplyKernel<T><<<Blocks(size), kThreads, 0, stream>>>(p, y, r, true);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (auto st = precondition(); !st.ok()) return st;
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d, z, size * sizeof(T), cudaMemcpyDeviceToDevice, stream));
  double h[2];
  if (auto st = dots(p.f, p.f, nullptr, nullptr, h); !st.ok()) return st;
  const double scale = h[0] > 0 ? std::sqrt(h[0]) : 1;
  if (auto st = dots(r, r, r, z, h); !st.ok()) return st;
  double res = std::sqrt(h[0]) / scale, rz = h[1];
  bool indefinite = !(sign * rz > 0) && res > o.tol && res > 0;
  int64_t it = 0;
  for (; it < o.max_iterations && !indefinite; ++it) {
    if (res <= o.tol) break;
    if (control.Cancelled()) return absl::CancelledError("solve cancelled");
    ApplyKernel<T><<<Blocks(size), kThreads, 0, stream>>>(p, d, q, false);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (auto st = dots(d, q, nullptr, nullptr, h); !st.ok()) return st;
    if (!(sign * h[0] > 0) || !std::isfinite(h[0])) {  // not definite: stop
      indefinite = true;
      break;
    }
    UpdateYR<T><<<Blocks(size), kThreads, 0, stream>>>(size, T(rz / h[0]), d, q, y, r);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (auto st = precondition(); !st.ok()) return st;
    if (auto st = dots(r, r, r, z, h); !st.ok()) return st;
    res = std::sqrt(h[0]) / scale;
    if (!(sign * h[1] > 0) && res > o.tol && res > 0) {  // the preconditioner is not definite
      indefinite = true;
      ++it;
      break;
    }
    const double beta = h[1] / rz;
    rz = h[1];
    UpdateD<T><<<Blocks(size), kThreads, 0, stream>>>(size, T(beta), z, d);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  // The true residual, from the original arrays.
  ResidualKernel<T><<<rb, kThreads, 0, stream>>>(p, y, acc, false);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  std::vector<uint8_t> hf(static_cast<size_t>(N));
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(h, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(hf.data(), flags, size_t(N), cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  SolveInfo info;
  info.method = name;
  if (sign < 0) info.method += " (negated: negative definite)";
  if (indefinite) info.method += " (stopped: indefinite)";
  info.iterations = it;
  info.residual = h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
  bool singular = false;  // a line block's pivot vanished (cg): the line solves cannot run
  for (uint8_t v : hf) singular |= v != 0;
  if (singular)
    *status = SystemStatus::kSingular;
  else if (!std::isfinite(info.residual))
    *status = SystemStatus::kDiverged;
  else if ((o.tol > 0 || indefinite) && !(info.residual <= o.tol))
    *status = SystemStatus::kNotConverged;
  else
    *status = SystemStatus::kOk;
  return info;
}

// p = r + beta (p - omega v).
template <typename T>
__global__ void BicgP(int64_t n, T beta, T omega, const T* __restrict__ r, const T* __restrict__ v,
                      T* __restrict__ p) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) p[e] = r[e] + beta * (p[e] - omega * v[e]);
}
// y += a u; out = in - a w.
template <typename T>
__global__ void BicgUpdate(int64_t n, T a, const T* __restrict__ u, const T* __restrict__ in,
                           const T* __restrict__ w, T* __restrict__ y, T* __restrict__ out) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  y[e] += a * u[e];
  out[e] = in[e] - a * w[e];
}

// BiCGStab right-preconditioned by the V-cycle (the CPU reference's BlockBicgstab, step for
// step), natural layout; y in: the initial guess, out: the iterate. Any sign of diagonal: the
// point smoother needs only nonzero ones.
template <typename T>
absl::StatusOr<SolveInfo> BicgstabDevice(const BlockTridiagonalProblem<T>& p,
                                         const BlockOptions& o, T* y, SystemStatus* status,
                                         Pool& pool, const SolveControl& control,
                                         cudaStream_t stream) {
  const int64_t N = p.N, M = p.M, size = N * M;
  // r, r0, p, v, y-hat, s, z, t; the levels in their own buffer.
  auto buf = pool.Get(kAccBytes + int64_t(sizeof(T)) * 8 * size + 16);
  if (!buf.ok()) return buf.status();
  auto* acc = static_cast<double*>(buf->get());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, kAccBytes, stream));
  T* r = reinterpret_cast<T*>(acc + kAccBytes / 8);
  T *r0 = r + size, *pv = r0 + size, *v = pv + size, *yh = v + size, *sv = yh + size,
    *zv = sv + size, *tv = zv + size;
  auto* flag = reinterpret_cast<uint8_t*>(tv + size);
  auto mg = BuildMgDevice(p, pool, flag, stream);
  if (!mg.ok()) return mg.status();
  if (!mg->signs.nonzero)
    return NotRun(p, "multigrid-bicgstab (not run: a zero diagonal on a multigrid level)", y,
                  acc, status, stream);
  const unsigned rb = unsigned(std::min<int64_t>(Blocks(size), kReduceBlocks));
  double h[2];
  auto dots = [&](const T* u, const T* w, const T* u2, const T* w2) -> absl::Status {
    DotKernel<T><<<rb, kThreads, 0, stream>>>(size, u, w, u2, w2, acc);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(h, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
    return CudaStatus(cudaStreamSynchronize(stream), "BiCGStab dot");
  };
  auto precondition = [&](const T* in, T* out) { return ApplyVCycle(*mg, in, out, stream); };
  ApplyKernel<T><<<Blocks(size), kThreads, 0, stream>>>(p, y, r, true);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(r0, r, size * sizeof(T), cudaMemcpyDeviceToDevice, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(pv, 0, size * sizeof(T), stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(v, 0, size * sizeof(T), stream));
  if (auto st = dots(p.f, p.f, r, r); !st.ok()) return st;
  const double scale = h[0] > 0 ? std::sqrt(h[0]) : 1;
  double res = std::sqrt(h[1]) / scale;
  SolveInfo info;
  info.method = "multigrid-bicgstab";
  double rho = 1, alpha = 1, omega = 1;
  int64_t it = 0;
  for (; it < o.max_iterations; ++it) {
    if (res <= o.tol) break;
    if (control.Cancelled()) return absl::CancelledError("solve cancelled");
    if (auto st = dots(r0, r, nullptr, nullptr); !st.ok()) return st;
    const double rho_new = h[0];
    if (rho_new == 0 || !std::isfinite(rho_new)) break;
    const double beta = (rho_new / rho) * (alpha / omega);
    BicgP<T><<<Blocks(size), kThreads, 0, stream>>>(size, T(beta), T(omega), r, v, pv);
    if (auto st = precondition(pv, yh); !st.ok()) return st;
    ApplyKernel<T><<<Blocks(size), kThreads, 0, stream>>>(p, yh, v, false);
    if (auto st = dots(r0, v, nullptr, nullptr); !st.ok()) return st;
    if (h[0] == 0 || !std::isfinite(h[0])) break;
    alpha = rho_new / h[0];
    BicgUpdate<T><<<Blocks(size), kThreads, 0, stream>>>(size, T(alpha), yh, r, v, y, sv);
    if (auto st = dots(sv, sv, nullptr, nullptr); !st.ok()) return st;
    res = std::sqrt(h[0]) / scale;
    if (res <= o.tol) {
      ++it;
      break;
    }
    if (auto st = precondition(sv, zv); !st.ok()) return st;
    ApplyKernel<T><<<Blocks(size), kThreads, 0, stream>>>(p, zv, tv, false);
    if (auto st = dots(tv, tv, tv, sv); !st.ok()) return st;
    omega = h[0] > 0 ? h[1] / h[0] : 0;
    BicgUpdate<T><<<Blocks(size), kThreads, 0, stream>>>(size, T(omega), zv, sv, tv, y, r);
    if (auto st = dots(r, r, nullptr, nullptr); !st.ok()) return st;
    res = std::sqrt(h[0]) / scale;
    rho = rho_new;
    if (omega == 0 || !std::isfinite(omega)) {
      ++it;
      break;
    }
  }
  ResidualKernel<T><<<rb, kThreads, 0, stream>>>(p, y, acc, false);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(h, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  info.iterations = it;
  info.residual = h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
  if (!std::isfinite(info.residual))
    *status = SystemStatus::kDiverged;
  else if (o.tol > 0 && info.residual > o.tol)
    *status = SystemStatus::kNotConverged;
  else
    *status = SystemStatus::kOk;
  return info;
}


// ---- the fused sweeps: one kernel launch for up to 64 sweeps of a thesis method ---------------
// A task is one block row's line solve in one sweep, (s, i), done by one thread block. Blocks
// take tasks in an order in which every task's inputs come from earlier tasks, wait (thread 0
// spinning on the rows' completed-sweep counters) until the neighbour rows it reads are at the
// right sweep, form F_i - A_i Y_{i-1} - B_i Y_{i+1} while staging the row (no D array, no second
// kernel), solve the row with the partitioned kernel's on-chip method (CH rows a thread, the
// reduced system by PCR in shared memory), write Y_i and publish done[i] = s + 1. No launch
// boundary between half-sweeps or sweeps: rows of sweep s + 1 start while rows of sweep s
// finish, so the memory stream never drains to one partial wave. What a task waits for (done[]
// counts sweeps):
//   red-black (red = even natural rows, taken first in each sweep): a red row at sweep s needs
//     its black neighbours at s (done >= s), a black row its red neighbours at s + 1;
//   jacobi: the neighbours at s (they have read the buffer it overwrites);
//   gauss-seidel: row i - 1 at s + 1 and row i + 1 at s; tasks are taken by diagonals
//     d = i + 2s (all independent), so the sweeps overlap as a wavefront;
// and always its own row at s. Every wait is on a task taken earlier by a running block, so no
// block waits forever. (Red-black and jacobi taken by such diagonals too, for Y reads from L2,
// measured 2-4x slower: each task then waits on the one just before it; NOTES.md t25.)
// Rows longer than one block holds (4096) run on the Q = 2 or 4 blocks of a thread-block
// cluster (sm_90): block 0 takes the task and the others read it from its shared memory, each
// block loads and reduces its part of the row, the cluster solves the reduced system
// (SolveReducedCluster, partitioned.cuh, as partitioned-cluster does), and each block publishes
// its part: done[] then counts Q a sweep.
enum class SweepKind : int { kRedBlack = 0, kJacobi = 1, kGaussSeidel = 2 };

template <typename T>
struct SweepArgs {
  int64_t N, M;
  const T *aC, *cC, *bC, *cA, *cB, *f;  // colour-major rows (Perm)
  T* Y0;                                 // the iterate (jacobi: sweeps read Y0 at even s)
  T* Y1;                                 // jacobi's second buffer
  int* done;                             // per natural row: sweeps of this launch completed
  unsigned* next;                        // the task counter
  uint8_t* bad;                          // per colour-major row: a pivot vanished
  const int* diag;                       // gauss-seidel: tasks before diagonal d, d <= ndiag
  int ndiag;
  int sweeps;
  SweepKind kind;
  bool vec;  // 16-byte loads and stores: M a multiple of 16 / sizeof(T), arrays aligned
  // Rows solved alone (SolveRowsStreamed: a batch of tridiagonal systems, one jacobi sweep from
  // F into Y1): no neighbours (cA, cB, Y0 unused), no waits on other rows, nothing published
  // but the flags; `done` unused. The streamed kernel only, instantiated with kQB = 0 for it.
  bool uncoupled = false;
  // The windowed form (the streamed kernel with kWin, one block a window): each row's line
  // solve as win.per_system overlapping windows (trisolve/windows.h), a task each; done[] then
  // counts per_system a sweep. per_system 0: not windowed.
  WindowPlan win{};
};

// The parts a row's sweep is published in: Q blocks, or (kWin) its windows.
template <int Q, bool kWin, typename T>
__device__ __forceinline__ int RowParts(const SweepArgs<T>& g) {
  return kWin ? Q * int(g.win.per_system) : Q;
}

// Threads a block at most: 16 rows a thread need ~200-226 registers (256 threads), 8 rows
// ~113-122 (512; sm_90 build, staged or direct). Rows of up to 4096 either way.
constexpr int SweepMaxThreads(int ch) { return ch >= 16 ? 256 : 512; }

// Takes the next task in order (the counter g.next) and decodes it into (sweep s, row i), or
// (-1, -1) when none is left. One thread calls it.
// Windowed (g.win): task t is window t % W of the row task t / W, so a row's windows follow one
// another.
template <bool kWin = false, typename T>
__device__ __forceinline__ void TakeTask(const SweepArgs<T>& g, int64_t& s, int64_t& i,
                                         int64_t* w = nullptr) {
  const int64_t N = g.N, W = kWin ? g.win.per_system : 1;
  const int64_t total = int64_t(g.sweeps) * N * W, half = (N + 1) / 2;
  int64_t t = atomicAdd(g.next, 1u);
  s = -1;
  i = -1;
  if (t >= total) return;
  if constexpr (kWin) {
    *w = t % W;
    t /= W;
  }
  if (g.kind == SweepKind::kGaussSeidel) {
    int lo = 0, hi = g.ndiag;  // the last d with diag[d] <= t
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (g.diag[mid] <= t) lo = mid; else hi = mid;
    }
    const int64_t d = lo;
    const int64_t smin = d > N - 1 ? (d - (N - 1) + 1) / 2 : 0;
    s = smin + (t - g.diag[lo]);
    i = d - 2 * s;
  } else {
    s = t / N;
    const int64_t j = t - s * N;
    i = g.kind == SweepKind::kRedBlack ? (j < half ? 2 * j : 2 * (j - half) + 1) : j;
  }
}

// Waits until the tasks that (sweep s, row i) reads are done (thread 0 only). The three
// counters are polled together with relaxed loads (one round trip to L2 a poll, where acquire
// loads would wait on one another), then one acquire fence orders the reads of Y after them.
template <int Q, bool kWin = false, typename T>
__device__ __forceinline__ void WaitInputs(const SweepArgs<T>& g, int s, int64_t i) {
  using Ref = ::cuda::atomic_ref<int, ::cuda::thread_scope_device>;
  const bool has_l = i > 0, has_r = i + 1 < g.N;
  int need_l = s, need_r = s;
  if (g.kind == SweepKind::kRedBlack && (i & 1)) need_l = need_r = s + 1;
  if (g.kind == SweepKind::kGaussSeidel) need_l = s + 1;
  const int parts = RowParts<Q, kWin>(g);  // each of a row's Q blocks (windows) counts its part
  need_l *= parts;
  need_r *= parts;
  for (;;) {
    const int l = has_l ? Ref(g.done[i - 1]).load(::cuda::memory_order_relaxed) : need_l;
    const int r = has_r ? Ref(g.done[i + 1]).load(::cuda::memory_order_relaxed) : need_r;
    const int own = Ref(g.done[i]).load(::cuda::memory_order_relaxed);
    if (l >= need_l && r >= need_r && own >= parts * s) break;
    __nanosleep(64);
  }
  ::cuda::atomic_thread_fence(::cuda::memory_order_acquire, ::cuda::thread_scope_device);
}

// Thread 0 of a block whose Y_i stores all precede a barrier: flags a vanished pivot and
// publishes (sweep s, row i) -- done[i] = s + 1, or with Q blocks (windows) a row one more of
// its parts.
// The release publishes every thread's stores: they precede it through the barrier, and a
// release at device scope is cumulative (the pattern of CUTLASS's GenericBarrier:
// __syncthreads, then fence.acq_rel.gpu and a relaxed store by one thread).
template <int Q, bool kWin = false, typename T>
__device__ __forceinline__ void PublishTask(const SweepArgs<T>& g, int s, int64_t i, bool bad) {
  if (bad) g.bad[Perm(i, g.N)] = 1;
  ::cuda::atomic_ref<int, ::cuda::thread_scope_device> done(g.done[i]);
  if (!kWin && Q == 1)
    done.store(s + 1, ::cuda::memory_order_release);
  else
    done.fetch_add(1, ::cuda::memory_order_release);
}

// The cluster of the Q > 1 forms (launched only on devices of compute capability 9.0 or newer;
// elsewhere its calls trap).
struct SweepCluster {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group c = cooperative_groups::this_cluster();
  __device__ unsigned block_rank() { return c.block_rank(); }
  __device__ void sync() { c.sync(); }
  __device__ void barrier_arrive() { c.barrier_arrive(); }
  __device__ void barrier_wait() { c.barrier_wait(); }
  template <typename U>
  __device__ U* map_shared_rank(U* p, unsigned r) {
    return c.map_shared_rank(p, r);
  }
#else
  __device__ unsigned block_rank() { __trap(); }
  __device__ void sync() { __trap(); }
  __device__ void barrier_arrive() { __trap(); }
  __device__ void barrier_wait() { __trap(); }
  template <typename U>
  __device__ U* map_shared_rank(U*, unsigned) { __trap(); }
#endif
};

// Shared memory of the fused sweeps, in T values for P threads: the reduced system (8P: PCR or
// the second level's rows), the staging tile (4 P (CH + 1)) and, Q > 1
// (SolveReducedClusterTwoLevel), the cluster's rows after the second level (3 (PQ / 2 + PQ / 16)),
// which the other blocks write while this one may still read its tile.
constexpr int64_t SweepSharedValues(int64_t P, int CH, int Q, bool staged) {
  const int64_t tile = staged ? 4 * P * (CH + 1) : 0;
  const int64_t gather = Q > 1 ? 3 * (P * Q / 2 + P * Q / 16) : 0;
  return 8 * P + tile + gather;
}

// Element e of a block's part of a row in the staging tile: e + e / CH (a word of padding a
// chunk), or kSwz (the streamed kernel's bulk tensor copies, CH = 16 float64: chunk r = e / 16
// is 128 bytes, its 16-byte pieces permuted by the copy engine's 128-byte swizzle, piece p at
// p ^ (r % 8), so that the 8 threads of a quarter warp reading their own chunks' piece p meet
// 8 different bank groups).
template <bool kSwz, int CH>
__device__ __forceinline__ int TileSlot(int e) {
  if constexpr (kSwz) {
    static_assert(CH == 16, "the swizzled tile holds 16 float64 values a chunk");
    const int r = e >> 4, k = e & 15;
    return (r << 4) | ((((k >> 1) ^ (r & 7)) << 1) | (k & 1));
  } else {
    return e + e / CH;
  }
}

// The staged forms' F_i - A_i Y_{i-1} - B_i Y_{i+1}: for this thread's elements r0 + e of the
// row (e = tid + q P < Ml, coalesced) the neighbours' coefficients and Y are loaded -- both
// sides issued before either is used (one memory latency, not two; a missing neighbour reads as
// zero coefficients) -- then `ready()` is called and tf[e + e / CH] (F, in the tile) updated in
// the CPU reference's order: (f - A Y_{i-1}) - B Y_{i+1}. Only this thread's own slots.
// QB: the q's loaded at once (CH: all, one latency; fewer hold fewer registers).
// kP: the block's threads when known at compile time (0: blockDim.x). kSwz: the tile in the
// bulk copies' swizzled layout (TileSlot).
template <int CH, int QB = CH, int kP = 0, bool kSwz = false, typename T, typename Ready>
__device__ __forceinline__ void SubtractNeighboursStaged(const SweepArgs<T>& g, const T* yin,
                                                         int64_t i, int64_t base, int64_t r0,
                                                         int64_t Ml, T* tf, Ready ready) {
  const int64_t N = g.N, M = g.M;
  const int P = kP > 0 ? kP : int(blockDim.x), tid = threadIdx.x;
  const bool has_l = i > 0, has_r = i + 1 < N;
  const T* yl = yin + Perm(has_l ? i - 1 : i, N) * M + r0;
  const T* yr = yin + Perm(has_r ? i + 1 : i, N) * M + r0;
  static_assert(CH % QB == 0, "whole groups of q");
#pragma unroll
  for (int q0 = 0; q0 < CH; q0 += QB) {
    T ul[QB], vl[QB], ur[QB], vr[QB];
#pragma unroll
    for (int u = 0; u < QB; ++u) {
      const int e = tid + (q0 + u) * P;
      if (e < Ml) {
        ul[u] = has_l ? __ldg(g.cA + base + r0 + e) : T(0);
        vl[u] = has_l ? __ldcg(yl + e) : T(0);
        ur[u] = has_r ? __ldg(g.cB + base + r0 + e) : T(0);
        vr[u] = has_r ? __ldcg(yr + e) : T(0);
      }
    }
    if (q0 == 0) ready();
#pragma unroll
    for (int u = 0; u < QB; ++u) {
      const int e = tid + (q0 + u) * P;
      if (e < Ml) {
        T& t = tf[TileSlot<kSwz, CH>(e)];
        t = t - ul[u] * vl[u] - ur[u] * vr[u];
      }
    }
  }
}

// kStaged: the row goes through a shared-memory tile (coalesced loads, P * (CH + 1) values an
// array) instead of straight into registers; measured faster only for long rows (NOTES.md b6).
// Q: blocks a row (a cluster when Q > 1); block `rank` holds elements r0 = rank * P * CH ..
// of the row.
template <int CH, int Q, typename T, bool kLazy, bool kStaged>
__global__ void __launch_bounds__(SweepMaxThreads(CH)) FusedSweepKernel(SweepArgs<T> g) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int P = blockDim.x;
  const int tid = threadIdx.x;
  const int64_t N = g.N, M = g.M;
  T* sa = reinterpret_cast<T*>(smem_raw);  // 8P: the reduced system (SolveReducedBlock)
  const int tsz = P * (CH + 1);
  T* tile = sa + 8 * P;  // kStaged: 4 arrays of P * (CH + 1)
  // Q > 1: the cluster's rows after the second level (3 (PQ / 2 + PQ / 16))
  T* gather = tile + (kStaged ? 4 * tsz : 0);
  __shared__ int64_t task_row;
  __shared__ int task_sweep, task_bad;
  [[maybe_unused]] SweepCluster cluster;
  const int rank = Q > 1 ? int(cluster.block_rank()) : 0;
  // One task a block (a cluster): the block takes the next task in order (not its blockIdx), so
  // a task's inputs are always tasks of blocks already running. (A persistent loop over tasks
  // was tried: the compiler hoisted the staging addresses out of it and spilled, 255
  // registers.)
  if (tid == 0) {
    if (rank == 0) {
      int64_t s, i;
      TakeTask(g, s, i);
      task_sweep = int(s);
      task_row = i;
    }
    task_bad = 0;
  }
  int s;
  int64_t i;
  if constexpr (Q == 1) {
    __syncthreads();
    s = task_sweep;
    i = task_row;
    if (i < 0) return;
  } else {
    cluster.sync();  // block 0's task written, every block of the cluster running
    s = *cluster.map_shared_rank(&task_sweep, 0);
    i = *cluster.map_shared_rank(&task_row, 0);
    if (i < 0) {
      cluster.sync();  // block 0 stays until every block has read its task
      return;
    }
  }
  const int64_t base = Perm(i, N) * M;
  const int64_t r0 = int64_t(rank) * P * CH;  // this block's part of the row: r0 .. r0 + Ml - 1
  const int64_t Ml = std::max<int64_t>(0, std::min<int64_t>(M - r0, int64_t(P) * CH));
  const int64_t k0 = r0 + int64_t(tid) * CH;  // this thread's rows of the line
  // The matrix part of the row (read-only: no wait needed): straight into registers, or staged
  // with element r0 + e of the row at tile slot e + e / CH (thread e / CH's chunk, read back
  // below).
  T a[CH], b[CH], c[CH], d[CH];
  auto where = [&](int e, int64_t& gi, int& pos) {
    if (e >= Ml) return false;
    gi = e;
    pos = e + e / CH;
    return true;
  };
  const bool has_l = i > 0, has_r = i + 1 < N;
  if constexpr (kStaged) {
    // Written out rather than StageFlat4 (partitioned.cuh): with its per-element 64-bit indices
    // the 16-row kernel took 7 more registers and 3.5% longer at M = 4096 (H100, NOTES.md b6).
    T va[CH], vb[CH], vc[CH], vf[CH];
#pragma unroll
    for (int q = 0; q < CH; ++q) {
      const int e = tid + q * P;
      if (e < Ml) {
        va[q] = __ldg(g.aC + base + r0 + e);
        vb[q] = __ldg(g.cC + base + r0 + e);
        vc[q] = __ldg(g.bC + base + r0 + e);
        vf[q] = __ldg(g.f + base + r0 + e);
      }
    }
    // Thread 0 polls the inputs' counters while its loads are in flight.
    if (tid == 0) WaitInputs<Q>(g, s, i);
#pragma unroll
    for (int q = 0; q < CH; ++q) {
      const int e = tid + q * P;
      if (e < Ml) {
        const int pos = e + e / CH;
        tile[pos] = va[q];
        tile[tsz + pos] = vb[q];
        tile[2 * tsz + pos] = vc[q];
        tile[3 * tsz + pos] = vf[q];
      }
    }
  } else {
    LoadChunkDirect<CH>(g.aC + base, g.cC + base, g.bC + base, g.f + base, k0, M, g.vec, a, b, c,
                        d);
  }
  if (!kStaged && tid == 0) WaitInputs<Q>(g, s, i);
  __syncthreads();
  const bool odd = g.kind == SweepKind::kJacobi && (s & 1);
  const T* yin = odd ? g.Y1 : g.Y0;
  T* yout = g.kind != SweepKind::kJacobi ? g.Y0 : odd ? g.Y0 : g.Y1;
  // d = F_i - A_i Y_{i-1} - B_i Y_{i+1}. Y is written by other blocks while the kernel runs:
  // read through L2 only.
  if constexpr (kStaged)
    SubtractNeighboursStaged<CH>(g, yin, i, base, r0, Ml, tile + 3 * tsz, [] {});
#pragma unroll
  for (int side = 0; side < 2 && !kStaged; ++side) {
    if (!(side == 0 ? has_l : has_r)) continue;
    const T* coef = (side == 0 ? g.cA : g.cB) + base;
    const T* yn = yin + Perm(side == 0 ? i - 1 : i + 1, N) * M;
    T u[CH], v[CH];
    {
      LoadRowsDirect<CH>(coef, k0, M, g.vec, T(0), u);
      LoadRowsDirect<CH, true>(yn, k0, M, g.vec, T(0), v);
#pragma unroll
      for (int q = 0; q < CH; ++q) d[q] -= u[q] * v[q];
    }
  }
  if constexpr (kStaged) {
    __syncthreads();
    // Chunk rank * P + tid of the row: rows past M identity rows, a[0] and c[M - 1] zeroed.
    ReadChunkFromTile<CH>(tile, tsz, 0, int64_t(rank) * P + tid, M, a, b, c, d);
  }
  bool ok = ChunkReduce<CH>(a, b, c, d);
  T x0, xl;
  if constexpr (Q == 1) {
    ok &= SolveReducedBlock<false, kLazy>(sa, 0, tid, P, 1, a[0], c[0], d[0], a[CH - 1],
                                          c[CH - 1], d[CH - 1], x0, xl);
  } else {  // P Q >= kClusterTwoLevelMin (LaunchFusedSweeps)
    // One task a block: the others write this block's `gather` during this task only.
    ok &= SolveReducedClusterTwoLevel<Q, kTwoLevelChunk, kTwoLevelChunk>(
        cluster, sa, gather, tid, P, a[0], c[0], d[0], a[CH - 1], c[CH - 1], d[CH - 1], x0, xl,
        [] {});
  }
  ChunkBack<CH>(a, c, d, x0, xl);
#pragma unroll
  for (int q = 0; q < CH; ++q) ok &= Finite(d[q]);
  if (!ok) task_bad = 1;
  if constexpr (kStaged) {
    StoreFlat<CH>(yout + base + r0, tile, P, where, d);  // ends with a barrier
  } else {
    StoreRowsDirect<CH>(yout + base, k0, M, g.vec, d);
    __syncthreads();  // every thread's Y_i stores issued before thread 0 publishes
  }
  if (tid == 0) PublishTask<Q>(g, s, i, task_bad);
}


// Where a streamed sweep task's time goes (diagnostics, a build with -DTRISOLVE_SWEEP_PROFILE=ON;
// nothing is compiled in otherwise): thread 0 of each block adds the clock64() cycles from one
// mark to the next into shared counters, flushed to g_sweep_profile as the block exits. Thread
// 0's view is the block's: the barriers after each phase make the slowest thread's time its.
enum SweepPhase : int {
  kPhaseClusterWait,   // the cluster's split barrier: the others done with this block's memory
  kPhaseInputs,        // thread 0 polling the neighbours' counters; the next task taken
  kPhaseNeighbours,    // the neighbours' coefficients and Y loaded, the right-hand side formed
  kPhaseReduce,        // the row read from the tile, ChunkReduce (Q = 1: the next copies issued)
  kPhaseFirstLevel,    // Q > 1: the reduced rows written, reduced by the second level
  kPhaseClusterSync,   // Q > 1: the cluster barrier
  kPhaseNext,          // Q > 1: the next task read from block 0, its copies issued
  kPhaseGathered,      // Q > 1: the cluster's rows (written by every block) solved
  kPhaseReducedSolve,  // the reduced system solved (Q > 1: the second level's back substitution)
  kPhaseBack,          // ChunkBack, the finiteness checks
  kPhaseStore,         // Y staged and stored
  kPhasePublish,       // the task published
  kPhaseCount
};
#ifdef TRISOLVE_SWEEP_PROFILE
const char* const kSweepPhaseNames[kPhaseCount] = {
    "cluster wait", "inputs", "neighbours", "reduce", "first level", "cluster sync", "next task",
    "gathered", "reduced", "back", "store", "publish"};
// The phases' cycles, then the tasks, then the most blocks a launch ran.
__device__ unsigned long long g_sweep_profile[kPhaseCount + 2];
struct PhaseClock {
  unsigned long long* acc;  // shared, kPhaseCount + 1
  long long last = 0;
  __device__ explicit PhaseClock(unsigned long long* shared) : acc(shared) {
    if (threadIdx.x == 0) {
      for (int k = 0; k <= kPhaseCount; ++k) acc[k] = 0;
      last = clock64();
    }
  }
  __device__ void Mark(int k) {
    if (threadIdx.x != 0) return;
    const long long t = clock64();
    acc[k] += t - last;
    last = t;
  }
  __device__ void Task() {
    if (threadIdx.x == 0) acc[kPhaseCount] += 1;
  }
  __device__ void Flush() {
    if (threadIdx.x != 0) return;
    for (int k = 0; k <= kPhaseCount; ++k) atomicAdd(&g_sweep_profile[k], acc[k]);
    atomicMax(&g_sweep_profile[kPhaseCount + 1], (unsigned long long)gridDim.x);
  }
};
#define TRISOLVE_PHASE_CLOCK(name)                       \
  __shared__ unsigned long long name##_acc[kPhaseCount + 1]; \
  PhaseClock name(name##_acc)
#else
struct PhaseClock {
  __device__ void Mark(int) {}
  __device__ void Task() {}
  __device__ void Flush() {}
};
#define TRISOLVE_PHASE_CLOCK(name) PhaseClock name
#endif

// The streamed fused sweeps: persistent blocks (clusters of Q), each taking its next task as
// soon as it has read the current row from its tile and copying that task's matrix part (aC,
// cC, bC and F: half the bytes a task moves, none of which waits on another task) into the tile
// (bulk tensor copies, StreamMaps, or cp.async) while it solves the current row. A block then
// waits on memory only for the neighbours' Y (and their coefficients), read coalesced once the
// counters allow. A block takes tasks in order and finishes each before the next, so the
// smallest unfinished task always has its inputs done and its block free to run it: no
// deadlock, whatever the grid. 16 rows a thread, the row's elements r0 + e at tile slot
// TileSlot(e); Y staged for coalesced stores in a second tile (the tile holds the next row by
// then): with Q > 1 the memory of the reduced system's rows and gathered rows, free once this
// block has its x, else its own (StreamLayout). With Q > 1 the next task is read from block 0
// after the reduced system's cluster barrier (no barrier of its own), and its copies start
// there; a split cluster barrier around each task (arrive once Y is stored, wait before the
// next task) keeps the blocks from writing into each other's gathered rows, or block 0 its next
// task, too early. kP threads, 256 or 128 (two blocks an SM, in clusters
// of up to 8), a compile-time constant: the staging offsets are then immediates (with
// blockDim.x the loop kept them in registers and spilled 270-330 bytes in float64); a row
// shorter than the cluster holds leaves the last blocks identity rows.
constexpr int kStreamThreads = 256;

// The streamed kernel's shared memory, in values of T from the start: the tile (4 arrays of
// P (CH + 1), or kBulk P CH swizzled, 1024-byte aligned); the reduced system's rows
// (3 (2P + P / 4)) and, Q > 1, the cluster's gathered rows (3 (Rg + Rg / 8), Rg = P Q / 2),
// which Y's staging tile (P (CH + 1)) overlays for Q > 1 (so at least that); for Q = 1 Y's
// staging tile. (H100: 163 KB a block at P = 256, Q = 4; 85 KB at P = 128, Q = 8, two an SM.)
// kBulk: 1 KB more, for the alignment.
template <int CH, int Q, bool kBulk, int P = kStreamThreads>
struct StreamLayout {
  static constexpr int kP = P, kYs = kP * (CH + 1);
  static constexpr int kTsz = kBulk ? kP * CH : kYs;
  static constexpr int kRows = 4 * kTsz;
  static constexpr int kWork = 3 * (2 * kP + kP / 4) + (Q > 1 ? 3 * (kP * Q / 2 + kP * Q / 16) : 0);
  static constexpr int kYstage = Q > 1 ? kRows : kRows + kWork;
  static constexpr int kTotal = kRows + (Q > 1 && kYs > kWork ? kYs : kWork) + (Q == 1 ? kYs : 0);
  static constexpr int kAlignSlack = kBulk ? 1024 : 0;  // bytes
};

// The streamed kernel's bulk tensor copies (sm_90; float64 rows of a multiple of 16 values,
// arrays 16-byte aligned): aC, cC, bC and F each seen as rows of 16 values (128 bytes); a
// block's part of a task row is one box of 256 such rows (32 KB), copied by the copy engine
// into the tile with the 128-byte swizzle (TileSlot) and counted on an mbarrier. One thread
// issues the four copies: the per-thread cp.async of 64 values each held every thread until
// the SM's outstanding requests drained (the phase profile: issuing a block's 128 KB took
// 4,900-6,800 cycles of a ~31,000-cycle task, NOTES.md t28), and those threads are the ones
// that solve.
struct StreamMaps {
  CUtensorMap m[4];
};

// ReadChunkFromTile for the swizzled tile: thread t's chunk is row t (128 bytes), read as 8
// pieces of 16 bytes; rows past n identity rows, a[0] and c[n - 1] zeroed.
template <int CH>
__device__ __forceinline__ void ReadChunkSwizzled(const double* tile, int tsz, int64_t j,
                                                  int64_t n, double (&a)[CH], double (&b)[CH],
                                                  double (&c)[CH], double (&d)[CH]) {
  static_assert(CH == 16, "a chunk is one 128-byte row");
  const int t = threadIdx.x;
#pragma unroll
  for (int p = 0; p < 8; ++p) {
    const int at = t * 16 + ((p ^ (t & 7)) << 1);
    const double2 va = *reinterpret_cast<const double2*>(tile + at);
    const double2 vb = *reinterpret_cast<const double2*>(tile + tsz + at);
    const double2 vc = *reinterpret_cast<const double2*>(tile + 2 * tsz + at);
    const double2 vd = *reinterpret_cast<const double2*>(tile + 3 * tsz + at);
    a[2 * p] = va.x, a[2 * p + 1] = va.y;
    b[2 * p] = vb.x, b[2 * p + 1] = vb.y;
    c[2 * p] = vc.x, c[2 * p + 1] = vc.y;
    d[2 * p] = vd.x, d[2 * p + 1] = vd.y;
  }
#pragma unroll
  for (int i = 0; i < CH; ++i) {
    const int64_t k = j * CH + i;
    if (k == 0) a[i] = 0;
    if (k + 1 >= n) c[i] = 0;
    if (k >= n) a[i] = 0, b[i] = 1, d[i] = 0;
  }
}

// The windowed form's copies (kWin, kBulk): boxes of 16 rows of 16 float64 values (2 KB), as
// many as the window needs, so that a window shorter than the tile reads no more than it holds
// (to 255 values).
constexpr int kWinBoxRows = 16, kWinBox = 16 * kWinBoxRows;

// kWin (Q = 1, g.win): a task is one window of a row's line solve (trisolve/windows.h), rows
// [lo, hi) of the row in the tile, solved alone (the couplings past them dropped; the caller has
// checked every row dominant enough for the halo, SweepWindowHalo) and Y stored on its core
// [c0, c1) only.
template <int CH, int Q, int kQB, typename T, bool kLazy, bool kBulk, int kP, bool kWin>
__global__ void __launch_bounds__(kP, kStreamThreads / kP)
    FusedSweepStreamKernel(SweepArgs<T> g, const __grid_constant__ StreamMaps maps) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int P = kP;
  const int tid = threadIdx.x;
  const int64_t N = g.N, M = g.M;
  // kQB = 0: rows solved alone (SweepArgs::uncoupled).
  constexpr bool kUncoupled = kQB == 0;
  static_assert(!kWin || (Q == 1 && !kUncoupled), "windows: one block a task, rows coupled");
  using L = StreamLayout<CH, Q, kBulk, kP>;
  static_assert(!kBulk || std::is_same_v<T, double>, "bulk copies: float64 tiles");
  const uint32_t skip = kBulk ? (1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u : 0u;
  T* tile = reinterpret_cast<T*>(smem_raw + skip);
  T* sa = tile + L::kRows;
  T* gather = sa + 3 * (2 * P + P / 4);
  constexpr int tsz = L::kTsz;
  T* ystage = tile + L::kYstage;
  __shared__ uint64_t bar;  // kBulk: the tile's copies
  uint32_t parity = 0;
  if (kBulk && tid == 0) BarInit(&bar);
  __shared__ int64_t next_row, next_win;
  __shared__ int next_sweep, task_bad;
  [[maybe_unused]] SweepCluster cluster;
  const int rank = Q > 1 ? int(cluster.block_rank()) : 0;
  const int64_t r0 = int64_t(rank) * P * CH;
  const int64_t Ml = std::max<int64_t>(0, std::min<int64_t>(M - r0, int64_t(P) * CH));
  auto take = [&] {  // block 0, thread 0; read by every block after a cluster barrier
    if (rank == 0 && tid == 0) {
      int64_t s, i, w = 0;
      TakeTask<kWin>(g, s, i, &w);
      next_sweep = int(s);
      next_row = i;
      next_win = w;
    }
  };
  auto read = [&](int& s, int64_t& i, int64_t& w) {
    if constexpr (Q > 1) {
      s = *cluster.map_shared_rank(&next_sweep, 0);
      i = *cluster.map_shared_rank(&next_row, 0);
    } else {
      s = next_sweep;
      i = next_row;
    }
    w = kWin ? next_win : 0;
  };
  // The rows of the task's row that this block holds: [lo, lo + ml) of it, stored [c0, c1).
  auto part = [&](int64_t w, int64_t& lo, int64_t& ml, int64_t& c0, int64_t& c1) {
    if constexpr (kWin) {
      const WindowRows r = WindowAt(g.win, M, w);
      lo = r.lo, ml = r.hi - r.lo, c0 = r.c0, c1 = r.c1;
    } else {
      lo = r0, ml = Ml, c0 = r0, c1 = r0 + Ml;
    }
  };
  auto prefetch = [&](int64_t i, int64_t w) {
    int64_t lo, ml, c0, c1;
    part(w, lo, ml, c0, c1);
    const int64_t base = Perm(i, N) * M + lo;
    if constexpr (kBulk && kWin) {
      // Warp 0 issues the window's boxes, array by array (ml <= P CH: at most 64).
      const int boxes = int((ml + kWinBox - 1) / kWinBox);
      if (tid < 32) {
        if (tid == 0) BarExpect(&bar, 4u * boxes * kWinBox * sizeof(T));
        __syncwarp();
        for (int k = tid; k < 4 * boxes; k += 32) {
          const int a = k / boxes, b = k - a * boxes;
          BulkLoad2D(tile + a * tsz + b * kWinBox, &maps.m[a], 0,
                     int(base / CH) + b * kWinBoxRows, &bar);
        }
      }
      return;
    }
    if constexpr (kBulk) {
      if (tid == 0) {
        BarExpect(&bar, 4u * P * CH * sizeof(T));
#pragma unroll
        for (int a = 0; a < 4; ++a) BulkLoad2D(tile + a * tsz, &maps.m[a], 0, int(base / CH), &bar);
      }
      return;
    }
    const T* src[4] = {g.aC + base, g.cC + base, g.bC + base, g.f + base};
#pragma unroll
    for (int q = 0; q < CH; ++q) {
      const int e = tid + q * P;
      if (e < ml)
#pragma unroll
        for (int a = 0; a < 4; ++a)
          __pipeline_memcpy_async(tile + a * tsz + e + e / CH, src[a] + e, sizeof(T));
    }
    __pipeline_commit();
  };
  take();
  if constexpr (Q > 1) cluster.sync(); else __syncthreads();  // bar initialized too
  int s;
  int64_t i, w;
  read(s, i, w);
  if (i < 0) {
    if constexpr (Q > 1) cluster.sync();  // block 0 stays until every block has read
    return;
  }
  if constexpr (Q > 1) cluster.barrier_arrive();  // done reading block 0's task
  prefetch(i, w);
  TRISOLVE_PHASE_CLOCK(clock);
  for (;;) {
    // Q > 1: every block is done with its `gather` (and Y's staging over it) and with block 0's
    // next task (the arrivals above and below): the blocks may write into each other's
    // `gather` again, block 0 its next task.
    if constexpr (Q > 1) cluster.barrier_wait();
    clock.Mark(kPhaseClusterWait);
    if (tid == 0) {
      task_bad = 0;
      if constexpr (!kUncoupled) WaitInputs<Q, kWin>(g, s, i);
    }
    take();
    __syncthreads();  // the inputs are done
    clock.Mark(kPhaseInputs);
    const int64_t base = Perm(i, N) * M;
    int64_t lo, ml, c0, c1;
    part(w, lo, ml, c0, c1);
    const bool odd = g.kind == SweepKind::kJacobi && (s & 1);
    const T* yin = odd ? g.Y1 : g.Y0;
    T* yout = g.kind != SweepKind::kJacobi ? g.Y0 : odd ? g.Y0 : g.Y1;
    auto ready = [&] {
      if constexpr (kBulk)
        BarWait(&bar, parity);
      else
        __pipeline_wait_prior(0);
    };
    if constexpr (kUncoupled)
      ready();  // the right-hand side is F
    else
      SubtractNeighboursStaged<CH, kQB, P, kBulk>(g, yin, i, base, lo, ml, tile + 3 * tsz,
                                                  ready);
    parity ^= 1;
    __syncthreads();
    clock.Mark(kPhaseNeighbours);
    // The chunk's rows as rows of the system the block solves: the row (from r0), or the
    // window (from lo; its first and last couplings dropped).
    const int64_t chunk = kWin ? tid : int64_t(rank) * P + tid, rows = kWin ? ml : M;
    T a[CH], b[CH], c[CH], d[CH];
    if constexpr (kBulk) {
      ReadChunkSwizzled<CH>(tile, tsz, chunk, rows, a, b, c, d);
      FenceProxyAsync();  // the barrier before the next copies follows
    } else {
      ReadChunkFromTile<CH>(tile, tsz, 0, chunk, rows, a, b, c, d);
    }
    int s2;
    int64_t i2, w2;
    // Once every thread has read the tile (and block 0 has taken the next task): the next
    // task's copies.
    auto next = [&] {
      read(s2, i2, w2);
      if (i2 >= 0) prefetch(i2, w2);
    };
    if constexpr (Q == 1) {
      __syncthreads();
      next();
    }
    bool ok = ChunkReduce<CH>(a, b, c, d);
    clock.Mark(kPhaseReduce);
    T x0, xl;
    if constexpr (Q == 1) {
      ok &= SolveReducedBlock<false, kLazy>(sa, 0, tid, P, 1, a[0], c[0], d[0], a[CH - 1],
                                            c[CH - 1], d[CH - 1], x0, xl);
    } else {
      ok &= SolveReducedClusterTwoLevel<Q, kTwoLevelChunk, kTwoLevelChunk>(
          cluster, sa, gather, tid, P, a[0], c[0], d[0], a[CH - 1], c[CH - 1], d[CH - 1], x0,
          xl,
          [&] {
            clock.Mark(kPhaseClusterSync);
            next();
            clock.Mark(kPhaseNext);
          },
          [&](int k) { clock.Mark(k == 0 ? kPhaseFirstLevel : kPhaseGathered); });
    }
    clock.Mark(kPhaseReducedSolve);
    ChunkBack<CH>(a, c, d, x0, xl);
#pragma unroll
    for (int q = 0; q < CH; ++q) ok &= Finite(d[q]);
    if (!ok) task_bad = 1;
    if constexpr (Q > 1) __syncthreads();  // this block's threads have their x: ystage free
    clock.Mark(kPhaseBack);
    auto where = [&](int e, int64_t& gi, int& pos) {
      if (kWin ? e < c0 - lo || e >= c1 - lo : e >= Ml) return false;
      gi = e;
      pos = e + e / CH;
      return true;
    };
    StoreFlat<CH>(yout + base + lo, ystage, P, where, d);  // ends with a barrier
    // Q > 1: this block is done with its `gather` (and Y's staging over it) and with block 0's
    // next task: the others may write into them. (Arriving right after the reduced system,
    // before Y's staging, with memory of its own for it, measured no faster on the H100: the
    // arrival's release then waited for the next task's bulk copies, thread 0's; NOTES.md t29.)
    if constexpr (Q > 1) cluster.barrier_arrive();
    clock.Mark(kPhaseStore);
    if (tid == 0) {
      if constexpr (kUncoupled) {
        if (task_bad) g.bad[Perm(i, N)] = 1;
      } else {
        PublishTask<Q, kWin>(g, s, i, task_bad);
      }
    }
    clock.Mark(kPhasePublish);
    clock.Task();
    if (i2 < 0) {
      if constexpr (Q > 1) cluster.barrier_wait();
      clock.Flush();
      return;
    }
    s = s2;
    i = i2;
    w = w2;
  }
}

SweepTuning g_sweep;
constexpr int kSweepsPerLaunch = 64;
constexpr int kMaxSweepCluster = 4;  // blocks a row at most: rows of 16384

// The fused sweeps' form for rows of M: rows a thread (the tuning's, else 8, or 16 for rows
// over 2048; H100, NOTES.md b5-b6), blocks a row (the tuning's, else the fewest that hold the
// row: 1, 2 or 4 of 256 x 16, 2 to 8 of the streamed 128 x 16; more than 1 only on sm_90) and
// whether streamed (the tuning's, else float64 red-black and jacobi with 2048 < M <= 16384 and
// gauss-seidel with 4096 < M <= 16384, where the H100 measured it faster: 4096 0.524 -> 0.486
// ms a red-black sweep, 8192 2.65 -> 2.33, 16384 on 4 blocks 9.8 against the two-kernel
// half-sweeps' 11.9 once the cluster's reduced system took the second level before its
// exchange; gauss-seidel at 4096 slower, 0.685 -> 0.805-0.828 ms, at 8192 faster, 2.47 -> 2.10;
// NOTES.md t23-t24, t28-t29). chunk 0: no fused form holds the row.
struct SweepForm {
  int chunk = 0, Q = 1;
  bool stream = false;
  int threads = kStreamThreads;  // stream: a block's threads
  WindowPlan win{};              // the windowed form (per_system > 1)
};
SweepForm SweepFormFor(int64_t M, bool float64, SweepKind kind) {
  // gauss-seidel keeps 8 rows a thread (512 threads) up to 4096: 0.767 -> 0.682 ms a sweep at
  // 4096 against 16 rows once the reduced system took the second level (NOTES.md t26).
  const bool gs = kind == SweepKind::kGaussSeidel;
  const int ch = g_sweep.chunk != 0 ? g_sweep.chunk : M > (gs ? 4096 : 2048) ? 16 : 8;
  const bool stream =
      ch == 16 && (g_sweep.stream != 0 ? g_sweep.stream > 0 : float64 && M > (gs ? 4096 : 2048));
  // Streamed blocks of 128 threads (two an SM, clusters of 2 to 8; float64 on sm_90): the
  // tuning's, else for rows over 4096 (H100, 16384: 8.44 -> 8.11 ms a red-black sweep against
  // 4 blocks of 256; 8192 1.87 -> 1.84; 4096 0.435 on one block of 256 against 0.439; NOTES.md
  // t29).
  const bool small = g_sweep.stream_threads != 0 ? g_sweep.stream_threads == 128 : M > 4096;
  const int threads = stream && float64 && ClustersAvailable() && small ? 128
                      : stream                                          ? kStreamThreads
                                                                        : SweepMaxThreads(ch);
  const int64_t per_block = int64_t(ch) * threads;
  const int max_q = threads < kStreamThreads ? 2 * kMaxSweepCluster : kMaxSweepCluster;
  int Q = g_sweep.cluster;
  if (Q == 0 || (threads < kStreamThreads && Q == 1))
    for (Q = threads < kStreamThreads ? 2 : 1; Q < max_q && Q * per_block < M;) Q *= 2;
  Q = std::min(Q, max_q);  // a tuning's larger cluster: the largest this form has
  if (Q > 1 && !ClustersAvailable()) Q = 1;
  if (Q * per_block < M) return SweepForm{};
  return SweepForm{ch, Q, stream, threads};
}

// The windowed form's tile (one streamed block of 256 threads x 16 rows) and the halos it may
// read: multiples of 16 rows (the bulk copies' boxes stay aligned), the least the rows allow.
constexpr int64_t kSweepWindowRows = int64_t(kStreamThreads) * 16;
constexpr int kSweepHaloStep = 16, kSweepHaloLevels = 16;  // halos of 16, 32, ..., 256 rows

// Whether the sweeps may run windowed (before the rows' check): the tuning's (window 1: any
// row over one window, -1 never), else red-black and jacobi in float64 where no other fused
// form holds the row (M over 16384). Gauss-seidel never: its tasks are taken by diagonals.
bool SweepWindowsWanted(int64_t M, bool float64, SweepKind kind, bool fused_form) {
  if (!g_sweep.fused || g_sweep.window < 0 || kind == SweepKind::kGaussSeidel ||
      M <= kSweepWindowRows)
    return false;
  return g_sweep.window > 0 || (float64 && !fused_form);
}

// limit[k]: the dominance limit of a halo of kSweepHaloStep (k + 1) rows (trisolve/windows.h).
template <typename T>
struct HaloLimits {
  T limit[kSweepHaloLevels];
};

// The least halo level every row of every block row's line system allows: the largest over
// the rows of the least k with (|a| + |c|) <= limit[k] |b| (the couplings past the line
// excluded), kSweepHaloLevels where a row passes none (NaN included). *level is raised, never
// lowered (zero it first).
template <typename T>
__global__ void WindowHaloKernel(int64_t N, int64_t M, const T* __restrict__ a,
                                 const T* __restrict__ b, const T* __restrict__ c,
                                 HaloLimits<T> lim, int* level, int* answer) {
  int need = 0;
  // The element's column k = e mod M kept up to date as e strides (no division in the loop).
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, step = stride % M;
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, k = e % M;
  for (; e < N * M; e += stride) {
    const T off = (k > 0 ? std::abs(a[e]) : T(0)) + (k + 1 < M ? std::abs(c[e]) : T(0));
    const T diag = std::abs(b[e]);
    while (need < kSweepHaloLevels && !(off <= lim.limit[need] * diag)) ++need;
    k += step;
    if (k >= M) k -= M;
  }
  for (int o = 16; o > 0; o /= 2) need = max(need, __shfl_xor_sync(0xffffffffu, need, o));
  if ((threadIdx.x & 31) == 0 && need > 0) atomicMax(level, need);
  __syncthreads();  // the block's warps' levels before its count
  if (threadIdx.x == 0) PublishAnswer(level, answer);
}

// The halo the windows take for these rows, checked on the device (one pass over aC, cC, bC,
// waited for): the least of 16, 32, ..., 256 rows under whose limit every row falls (the rows
// of the thesis' experiments: 64 in float64 for experiment 1, whose rows have ratios up to 1/2,
// and 96 for experiment 2's 2/3); the tuning's window_halo where the rows allow it. 0: none
// does (a row over float64's 0.864 or float32's 0.935, or not finite).
template <typename T>
absl::StatusOr<int64_t> SweepWindowHalo(const BlockTridiagonalProblem<T>& p,
                                        cudaStream_t stream) {
  HaloLimits<T> lim;
  for (int k = 0; k < kSweepHaloLevels; ++k)
    lim.limit[k] = T(WindowDominanceLimit(kSweepHaloStep * (k + 1),
                                          std::numeric_limits<T>::digits));
  // The level counted into the word's scratch, written into the host word by the last block
  // (PublishAnswer, as the tridiagonal windows answer).
  auto word = PinnedWord::Take();
  if (!word.ok()) return word.status();
  const unsigned blocks = unsigned(std::min<int64_t>(Blocks(p.N * p.M), 8 * 1024));
  WindowHaloKernel<T><<<blocks, kThreads, 0, stream>>>(p.N, p.M, p.aC, p.cC, p.bC, lim,
                                                       word->scratch(), word->mapped());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const int h = *static_cast<volatile int*>(word->get());
  if (h >= kSweepHaloLevels) return 0;
  const int64_t need = int64_t(kSweepHaloStep) * (h + 1);
  if (g_sweep.window_halo <= 0) return need;
  const int64_t tuned = std::min<int64_t>((g_sweep.window_halo + kSweepHaloStep - 1) /
                                              kSweepHaloStep * kSweepHaloStep,
                                          kSweepWindowRows / 4);  // whole steps, cores of half
  return tuned >= need ? tuned : 0;
}

// Whether the fused sweeps stage rows through shared memory: the tuning's, else for rows over
// 2048 at 16 rows a thread (H100: 4096 staged 0.666 ms a sweep, direct 0.689-0.714; 1024 direct
// 0.030 against 0.031; NOTES.md b6; 8 rows a thread at 4096 direct, gauss-seidel 0.682 against
// 0.696 staged, t26).
bool SweepStaged(int64_t M, int chunk) {
  return g_sweep.staged != 0 ? g_sweep.staged > 0 : M > 2048 && chunk == 16;
}

template <int CH, int Q, bool kStaged, typename T>
absl::Status LaunchFusedSweeps(SweepArgs<T> g, cudaStream_t stream) {
  int P = Q > 1 ? kClusterTwoLevelMin / Q : 1;  // the last blocks' rows past M: identity rows
  while (int64_t(P) * CH * Q < g.M) P *= 2;
  const size_t smem = sizeof(T) * size_t(SweepSharedValues(P, CH, Q, kStaged));
  // float32 reads the PCR neighbours lazily, float64 eagerly (as the tridiagonal kernel, t6b).
  auto kernel = FusedSweepKernel<CH, Q, T, sizeof(T) == 4, kStaged>;
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int64_t total = int64_t(g.sweeps) * g.N;
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.done, 0, sizeof(int) * size_t(g.N), stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.next, 0, sizeof(unsigned), stream));
  LaunchConfig launch(total * Q, P, smem, stream, Q);
  return CudaStatus(cudaLaunchKernelEx(&launch.cfg, kernel, g), "FusedSweepKernel launch");
}

template <int Q, int P, int kQB, typename T, bool kBulk, bool kWin = false>
absl::Status LaunchFusedStreamKernel(SweepArgs<T> g, const StreamMaps& maps,
                                     cudaStream_t stream) {
  constexpr int CH = 16;
  using L = StreamLayout<CH, Q, kBulk, P>;
  const size_t smem = sizeof(T) * size_t(L::kTotal) + L::kAlignSlack;
  auto kernel = FusedSweepStreamKernel<CH, Q, kQB, T, sizeof(T) == 4, kBulk, P, kWin>;
  LaunchConfig launch(0, P, smem, stream, Q);
  // The shared-memory attribute and the blocks (clusters) that run at once: asked once a
  // kernel, not at every launch (a solve to a tolerance launches one sweep at a time). One
  // device a process, as ClustersAvailable assumes.
  static PerDevice asked;  // (once a device: the attribute is the current device's)
  const absl::StatusOr<int64_t> groups = asked.Get([&] { return ResidentGroups(kernel, launch); });
  if (!groups.ok()) return groups.status();
  if (!g.uncoupled)
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(g.done, 0, sizeof(int) * size_t(g.N), stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.next, 0, sizeof(unsigned), stream));
  if (*groups < 1) return absl::ResourceExhaustedError("the streamed sweep kernel cannot run");
  const int64_t tasks = int64_t(g.sweeps) * g.N * std::max<int64_t>(g.win.per_system, 1);
  launch.cfg.gridDim = dim3(unsigned(std::min<int64_t>(*groups, tasks) * Q));
  return CudaStatus(cudaLaunchKernelEx(&launch.cfg, kernel, g, maps),
                    "FusedSweepStreamKernel launch");
}

// The streamed kernel's tensor maps (StreamMaps): aC, cC, bC and F as N M / 16 rows of 16
// float64 values, boxes of 16 x `box_rows` (P: a block's part of a row; the windowed form's
// kWinBoxRows), 128-byte swizzle. False where they cannot be made (the caller then copies by
// cp.async).
bool EncodeStreamMaps(const SweepArgs<double>& g, int box_rows, StreamMaps& maps) {
  const auto encode = TensorMapEncoder();
  if (!encode || g.M % 16 != 0 || !ClustersAvailable()) return false;  // sm_90+
  const double* arrays[4] = {g.aC, g.cC, g.bC, g.f};
  for (int a = 0; a < 4; ++a) {
    if (reinterpret_cast<uintptr_t>(arrays[a]) % 16 != 0) return false;
    const cuuint64_t dims[2] = {16, cuuint64_t(g.N * g.M / 16)};
    const cuuint64_t strides[1] = {16 * sizeof(double)};
    const cuuint32_t box[2] = {16, cuuint32_t(box_rows)};
    const cuuint32_t elem[2] = {1, 1};
    if (encode(&maps.m[a], CU_TENSOR_MAP_DATA_TYPE_FLOAT64, 2, const_cast<double*>(arrays[a]),
               dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  return true;
}

// The streamed form: as many persistent blocks (clusters) of P threads as run at once; float64
// rows of a multiple of 16 values by bulk tensor copies (unless the tuning says bulk = -1). The
// neighbours' loads 8 rows a thread at a time with the bulk copies (unless the tuning says
// group = 4), else 4: with the copies' registers free, 8 in flight took 4-6% off a sweep (H100:
// 4096 0.461 -> 0.435 ms, 8192 2.11 -> 2.01, 16384 9.28 -> 8.87); all 16 at once spilled ~300
// bytes and was 1.5x slower (NOTES.md t29).
template <int Q, int P, typename T>
absl::Status LaunchFusedStream(SweepArgs<T> g, cudaStream_t stream) {
  StreamMaps maps{};
  if constexpr (Q == 1 && P == kStreamThreads) {  // the windowed form
    if (g.win.per_system > 1) {
      if constexpr (std::is_same_v<T, double>) {
        if (g_sweep.bulk >= 0 && EncodeStreamMaps(g, kWinBoxRows, maps))
          return LaunchFusedStreamKernel<Q, P, 8, T, true, true>(g, maps, stream);
      }
      return LaunchFusedStreamKernel<Q, P, 4, T, false, true>(g, maps, stream);
    }
  }
  if constexpr (std::is_same_v<T, double>) {
    if (g_sweep.bulk >= 0 && EncodeStreamMaps(g, P, maps))
      return g.uncoupled            ? LaunchFusedStreamKernel<Q, P, 0, T, true>(g, maps, stream)
             : g_sweep.group == 4 ? LaunchFusedStreamKernel<Q, P, 4, T, true>(g, maps, stream)
                                  : LaunchFusedStreamKernel<Q, P, 8, T, true>(g, maps, stream);
  }
  if constexpr (std::is_same_v<T, double>) {
    if (g.uncoupled) return LaunchFusedStreamKernel<Q, P, 0, T, false>(g, maps, stream);
  }
  return LaunchFusedStreamKernel<Q, P, 4, T, false>(g, maps, stream);
}

template <typename T>
absl::Status LaunchStreamForm(const SweepForm& form, const SweepArgs<T>& g, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, double>) {
    if (form.threads == 128)
      return form.Q == 2   ? LaunchFusedStream<2, 128>(g, stream)
             : form.Q == 4 ? LaunchFusedStream<4, 128>(g, stream)
                           : LaunchFusedStream<8, 128>(g, stream);
  }
  return form.Q == 1   ? LaunchFusedStream<1, kStreamThreads>(g, stream)
         : form.Q == 2 ? LaunchFusedStream<2, kStreamThreads>(g, stream)
                       : LaunchFusedStream<4, kStreamThreads>(g, stream);
}

template <int CH, typename T>
absl::Status LaunchFusedForm(int Q, bool staged, const SweepArgs<T>& g, cudaStream_t stream) {
  switch (Q) {
    case 1:
      return staged ? LaunchFusedSweeps<CH, 1, true>(g, stream)
                    : LaunchFusedSweeps<CH, 1, false>(g, stream);
    case 2:
      return staged ? LaunchFusedSweeps<CH, 2, true>(g, stream)
                    : LaunchFusedSweeps<CH, 2, false>(g, stream);
    default:
      return staged ? LaunchFusedSweeps<CH, 4, true>(g, stream)
                    : LaunchFusedSweeps<CH, 4, false>(g, stream);
  }
}

// Tasks before each diagonal d = i + 2s of `sweeps` gauss-seidel sweeps over N rows.
std::vector<int> DiagonalStarts(int64_t N, int sweeps) {
  const int64_t nd = (N - 1) + 2 * int64_t(sweeps - 1) + 1;
  std::vector<int> start(size_t(nd + 1), 0);
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t smin = d > N - 1 ? (d - (N - 1) + 1) / 2 : 0;
    const int64_t smax = std::min<int64_t>(sweeps - 1, d / 2);
    start[size_t(d + 1)] = start[size_t(d)] + int(std::max<int64_t>(0, smax - smin + 1));
  }
  return start;
}

}  // namespace

int64_t RowsStreamCapacity(int64_t n) {
  const SweepForm form = SweepFormFor(n, true, SweepKind::kJacobi);
  return form.stream ? int64_t(form.Q) * form.threads * form.chunk : 0;
}

absl::StatusOr<bool> SolveRowsStreamed(const TridiagonalProblem<double>& p, double* x,
                                       uint8_t* flags, Pool& pool, cudaStream_t stream) {
  if (p.layout != Layout::kFlat && p.batch > 1) return false;
  const SweepForm form = SweepFormFor(p.n, true, SweepKind::kJacobi);
  if (!form.stream || p.batch < 1 || p.batch > (int64_t{1} << 30)) return false;
  auto buf = pool.Get(16);  // the task counter
  if (!buf.ok()) return buf.status();
  bool vec = p.n % 2 == 0;
  for (const double* q : {p.a, p.b, p.c, p.d, static_cast<const double*>(x)})
    vec &= reinterpret_cast<uintptr_t>(q) % 16 == 0;
  // The sweep's arrays: aC the sub-diagonal, cC the diagonal, bC the super-diagonal (as the
  // fused kernels read them, LoadChunkDirect(aC, cC, bC, f)); system s is the colour-major row
  // Perm(i) of the task i that solves it, read and written there.
  SweepArgs<double> g{p.batch, p.n,     p.a,   p.b,     p.c, nullptr, nullptr, p.d, nullptr,
                      x,       nullptr, buf->as<unsigned>(), flags, nullptr, 0,       1,
                      SweepKind::kJacobi, vec};
  g.uncoupled = true;
  if (auto st = LaunchStreamForm(form, g, stream); !st.ok()) return st;
  // The counter goes back to the pool now: wait for the kernel first.
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return true;
}

void SetSweepTuning(const SweepTuning& t) { g_sweep = t; }
SweepTuning GetSweepTuning() { return g_sweep; }

std::vector<SweepPhaseTime> TakeSweepProfile() {
  std::vector<SweepPhaseTime> out;
#ifdef TRISOLVE_SWEEP_PROFILE
  unsigned long long h[kPhaseCount + 2];
  if (cudaMemcpyFromSymbol(h, g_sweep_profile, sizeof(h)) != cudaSuccess) return out;
  const unsigned long long zero[kPhaseCount + 2] = {};
  if (cudaMemcpyToSymbol(g_sweep_profile, zero, sizeof(zero)) != cudaSuccess) return out;
  const double tasks = h[kPhaseCount] > 0 ? double(h[kPhaseCount]) : 1.0;
  for (int k = 0; k < kPhaseCount; ++k) out.push_back({kSweepPhaseNames[k], double(h[k]) / tasks});
  out.push_back({"blocks", double(h[kPhaseCount + 1])});
#endif
  return out;
}

template <typename T>
absl::StatusOr<SolveInfo> SolveBlockTridiagonalDevice(const BlockTridiagonalProblem<T>& p,
                                                      BlockMethod method,
                                                      const BlockOptions& o, T* y,
                                                      SystemStatus* status, Pool& pool,
                                                      const SolveControl& control,
                                                      cudaStream_t stream) {
  if (method == BlockMethod::kAuto) method = BlockMethod::kRedBlack;  // the caller picks cg
  if (method == BlockMethod::kMultigridBicgstab)
    return BicgstabDevice(p, o, y, status, pool, control, stream);
  if (method == BlockMethod::kCg || method == BlockMethod::kMultigridCg)
    return CgDevice(p, o, y, status, pool, control, stream,
                    method == BlockMethod::kMultigridCg);
  const int64_t N = p.N, M = p.M, size = N * M, half = (N + 1) / 2;
  // The fused sweeps (one kernel launch for many sweeps) where a row fits one block and the
  // tuning has not turned them off; otherwise a right-hand-side kernel and a batched
  // partitioned solve a half-sweep.
  const SweepKind kind = method == BlockMethod::kJacobi        ? SweepKind::kJacobi
                         : method == BlockMethod::kGaussSeidel ? SweepKind::kGaussSeidel
                                                               : SweepKind::kRedBlack;
  SweepForm form = g_sweep.fused ? SweepFormFor(M, sizeof(T) == 8, kind) : SweepForm{};
  // Rows too long for the fused forms: the streamed form over overlapping windows of each row
  // (SweepArgs::win), where every row of the line systems is dominant enough for them (checked
  // once a solve, on the caller's arrays: the row scaling leaves the ratios as they are). The
  // check costs about a third of a sweep (3 of 8 arrays): a solve of one sweep skips it unless
  // the tuning asks for the windows (H100, 20480: L = 1 45.5 ms windowed, 44.2 two-kernel).
  if (SweepWindowsWanted(M, sizeof(T) == 8, kind, form.chunk > 0) &&
      (o.max_iterations > 1 || g_sweep.window > 0)) {
    auto halo = SweepWindowHalo(p, stream);
    if (!halo.ok()) return halo.status();
    if (*halo > 0)
      form = SweepForm{16, 1, true, kStreamThreads,
                       PlanWindows(M, kSweepWindowRows, *halo, kSweepHaloStep)};
  }
  const int chunk = form.chunk;
  const int64_t parts = std::max<int64_t>(form.win.per_system, 1);  // tasks a row and sweep
  // Sweeps a launch: long enough that the launches cost nothing, short enough that a cancelled
  // request stops soon and the task counter (32 bits) cannot overflow.
  const int per_launch = int(std::clamp<int64_t>(
      (int64_t{1} << 30) / std::max<int64_t>(N * parts, 1), 1, kSweepsPerLaunch));
  // Colour-major copies: aC cC bC cA cB f, the iterate, a second iterate (Jacobi), D (the
  // two-kernel path's right-hand sides only); flags. The double accumulators first, then the
  // fused sweeps' counters (done[N], next, the diagonal table), padded to 16 bytes: every array
  // aligned whatever T and N * M are.
  const int64_t ints = N + 1 + (N + 2 * int64_t(per_launch) + 1);
  const int64_t int_bytes = (4 * ints + 15) / 16 * 16;
  const int64_t arrays = chunk > 0 ? 8 : 9;
  auto buf = pool.Get(kAccBytes + int_bytes + int64_t(sizeof(T)) * arrays * size + N);
  if (!buf.ok()) return buf.status();
  auto* acc = static_cast<double*>(buf->get());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, kAccBytes, stream));
  int* done = reinterpret_cast<int*>(acc + kAccBytes / 8);
  auto* next = reinterpret_cast<unsigned*>(done + N);
  int* diag = reinterpret_cast<int*>(next + 1);
  T* base = reinterpret_cast<T*>(reinterpret_cast<char*>(done) + int_bytes);
  T *aC = base, *cC = aC + size, *bC = cC + size, *cA = bC + size, *cB = cA + size,
    *f = cB + size, *Y = f + size, *Y2 = Y + size, *D = chunk > 0 ? nullptr : Y2 + size;
  auto* flags = reinterpret_cast<uint8_t*>(Y2 + (arrays - 7) * size);
  const bool sc = o.scale_rows;
  const T* src[6] = {p.aC, p.cC, p.bC, p.cA, p.cB, p.f};
  T* dst[6] = {aC, cC, bC, cA, cB, f};
  for (int q = 0; q < 6; ++q) {
    PermuteKernel<T><<<Blocks(size), kThreads, 0, stream>>>(N, M, src[q], p.cC, dst[q], sc, q == 1);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  PermuteKernel<T><<<Blocks(size), kThreads, 0, stream>>>(N, M, y, p.cC, Y, false, false);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(N), stream));

  // The relative residual of the original system.
  auto residual = [&](const T* Ycur) -> absl::StatusOr<double> {
    const unsigned blocks = unsigned(std::min<int64_t>(Blocks(size), kReduceBlocks));
    ResidualKernel<T><<<blocks, kThreads, 0, stream>>>(p, Ycur, acc, true);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    double h[2];
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(h, acc, sizeof h, cudaMemcpyDeviceToHost, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
  };
  // Solves rows r0 .. r1-1 (colour-major) from D into out.
  auto solve_rows = [&](int64_t r0, int64_t r1, T* out) -> absl::Status {
    TridiagonalProblem<T> tp{r1 - r0, M, Layout::kFlat, aC + r0 * M, cC + r0 * M, bC + r0 * M,
                             D + r0 * M};
    auto k = SolveTridiagonalDevice(tp, TridiagonalMethod::kPartitioned, out + r0 * M,
                                    flags + r0, pool, stream);
    return k.ok() ? absl::OkStatus() : k.status();
  };
  auto rhs = [&](int64_t r0, int64_t r1, const T* Ycur) -> absl::Status {
    RhsKernel<T><<<Blocks((r1 - r0) * M), kThreads, 0, stream>>>(N, M, r0, r1, f, cA, cB, Ycur, D);
    return CudaStatus(cudaGetLastError(), "RhsKernel");
  };

  SolveInfo info;
  info.method = std::string(MethodName(method)) + (sc ? "+scaled" : "");
  // The initial residual: the tolerance's first test, and the base of the divergence check
  // (BlockResidualDiverged: after every sweep with a tolerance; without one, every 1024 sweeps
  // here, not the host's 64: each check synchronises the stream, which the fused launches
  // otherwise never do, and 1024 sweeps make that bubble negligible).
  constexpr int64_t kDeviceDivergenceCheckSweeps = 16 * kBlockDivergenceCheckSweeps;
  auto r0 = residual(Y);
  if (!r0.ok()) return r0.status();
  const double initial_res = *r0;
  double res = initial_res;
  bool diverged = false;
  int64_t checked_at = 0;
  auto check = [&](int64_t sweeps_done) -> absl::Status {
    if (o.tol <= 0 && sweeps_done - checked_at < kDeviceDivergenceCheckSweeps)
      return absl::OkStatus();
    auto r = residual(Y);
    if (!r.ok()) return r.status();
    res = *r;
    checked_at = sweeps_done;
    diverged = BlockResidualDiverged(res, initial_res);
    return absl::OkStatus();
  };
  int64_t it = 0;
  // The fused path: `sweeps` sweeps a launch (one when a tolerance is checked after each).
  std::vector<int> starts;  // gauss-seidel's diagonal table of the last upload
  int starts_sweeps = 0;
  // 16-byte row loads: every colour-major array starts 16-byte aligned when M is a multiple of
  // 16 / sizeof(T) (they follow one another in one buffer), so rows do too.
  bool vec = M % (16 / int64_t(sizeof(T))) == 0;
  for (const T* q : std::initializer_list<const T*>{aC, cC, bC, cA, cB, f, Y, Y2})
    vec &= reinterpret_cast<uintptr_t>(q) % 16 == 0;
  auto fused_sweeps = [&](int sweeps) -> absl::Status {
    SweepArgs<T> g{N,    M,    aC,   cC,    bC,   cA,     cB,     f,   Y,
                   Y2,   done, next, flags, diag, 0,      sweeps, kind, vec};
    g.win = form.win;
    if (kind == SweepKind::kGaussSeidel) {
      if (starts_sweeps != sweeps) {
        starts = DiagonalStarts(N, sweeps);
        starts_sweeps = sweeps;
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(diag, starts.data(),
                                                      sizeof(int) * starts.size(),
                                                      cudaMemcpyHostToDevice, stream));
      }
      g.ndiag = int(starts.size()) - 1;
    }
    const bool staged = SweepStaged(M, chunk);
    auto st = form.stream ? LaunchStreamForm(form, g, stream)
              : chunk == 16 ? LaunchFusedForm<16>(form.Q, staged, g, stream)
                            : LaunchFusedForm<8>(form.Q, staged, g, stream);
    if (!st.ok()) return st;
    if (kind == SweepKind::kJacobi && (sweeps & 1)) std::swap(Y, Y2);
    return absl::OkStatus();
  };
  if (chunk > 0) {
    info.method += form.win.per_system > 1
                       ? "+fused+windows(halo " + std::to_string(form.win.halo) + ")"
                       : "+fused";
    while (it < o.max_iterations && !diverged) {
      if (o.tol > 0 && res <= o.tol) break;
      if (control.Cancelled()) return absl::CancelledError("solve cancelled");
      const int sweeps =
          o.tol > 0 ? 1 : int(std::min<int64_t>(per_launch, o.max_iterations - it));
      if (auto st = fused_sweeps(sweeps); !st.ok()) return st;
      it += sweeps;
      if (auto st = check(it); !st.ok()) return st;
    }
  }
  for (; chunk == 0 && it < o.max_iterations && !diverged; ++it) {
    if (o.tol > 0 && res <= o.tol) break;
    if (control.Cancelled()) return absl::CancelledError("solve cancelled");
    switch (method) {
      case BlockMethod::kRedBlack:  // the thesis' updateOdd (rows 0, 2, ...), then updateEven
        for (auto [r0, r1] : {std::pair{int64_t(0), half}, {half, N}}) {
          if (r0 == r1) continue;
          if (auto st = rhs(r0, r1, Y); !st.ok()) return st;
          if (auto st = solve_rows(r0, r1, Y); !st.ok()) return st;
        }
        break;
      case BlockMethod::kJacobi:
        if (auto st = rhs(0, N, Y); !st.ok()) return st;
        if (auto st = solve_rows(0, N, Y2); !st.ok()) return st;
        std::swap(Y, Y2);
        break;
      case BlockMethod::kGaussSeidel:  // lexicographic: row i sees the new Y_{i-1}
        for (int64_t i = 0; i < N; ++i) {
          const int64_t r = (i & 1) ? half + i / 2 : i / 2;
          if (auto st = rhs(r, r + 1, Y); !st.ok()) return st;
          if (auto st = solve_rows(r, r + 1, Y); !st.ok()) return st;
        }
        break;
      case BlockMethod::kAuto:
      case BlockMethod::kCg:
      case BlockMethod::kMultigridCg:
      case BlockMethod::kMultigridBicgstab:
        break;
    }
    if (auto st = check(it + 1); !st.ok()) return st;
  }
  if (o.tol <= 0 && !diverged && checked_at != it) {
    auto r = residual(Y);
    if (!r.ok()) return r.status();
    res = *r;
  }
  if (diverged) info.method += " (stopped: diverged)";
  UnpermuteKernel<T><<<Blocks(size), kThreads, 0, stream>>>(N, M, Y, y);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  std::vector<uint8_t> hf(static_cast<size_t>(N));
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(hf.data(), flags, size_t(N), cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  bool singular = false;
  for (uint8_t v : hf) singular |= v != 0;
  info.iterations = it;
  info.residual = res;
  if (singular)
    *status = SystemStatus::kSingular;
  else if (diverged || !std::isfinite(res))
    *status = SystemStatus::kDiverged;
  else if (o.tol > 0 && res > o.tol)
    *status = SystemStatus::kNotConverged;
  else
    *status = SystemStatus::kOk;
  return info;
}

template absl::StatusOr<SolveInfo> SolveBlockTridiagonalDevice(
    const BlockTridiagonalProblem<double>&, BlockMethod, const BlockOptions&, double*,
    SystemStatus*, Pool&, const SolveControl&, cudaStream_t);
template absl::StatusOr<SolveInfo> SolveBlockTridiagonalDevice(
    const BlockTridiagonalProblem<float>&, BlockMethod, const BlockOptions&, float*,
    SystemStatus*, Pool&, const SolveControl&, cudaStream_t);

}  // namespace trisolve::cuda
