// The multigrid V-cycle of multigrid-cg and multigrid-bicgstab on the device.
#pragma once

#include <algorithm>
#include <cfloat>
#include <utility>
#include <vector>

#include "block/vector_kernels.cuh"
#include "runtime/check.h"
#include "runtime/memory_pool.h"

namespace trisolve::cuda {
namespace {

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
// here). vectors = false: the coarse levels' r and z are left out (null), for a hierarchy that
// a prepared system keeps and each solve gives vectors of its own (WithOwnVectors).
template <typename T>
absl::StatusOr<MgHierarchy<T>> BuildMgDevice(const BlockTridiagonalProblem<T>& p, Pool& pool,
                                             uint8_t* flag, cudaStream_t stream,
                                             bool vectors = true) {
  std::vector<std::pair<int64_t, int64_t>> dims = {{p.N, p.M}};
  while (dims.back().first * dims.back().second > kMgCoarsest && dims.size() < 32)
    dims.push_back({(dims.back().first + 1) / 2, (dims.back().second + 1) / 2});
  int64_t total = 0;
  for (size_t l = 0; l < dims.size(); ++l)
    total += dims[l].first * dims[l].second * (l == 0 || !vectors ? 5 : 7);
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
    lv.r = lv.z = nullptr;
    if (l > 0 && vectors) {
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

// A solve's hierarchy over kept levels (BuildMgDevice without vectors): their coefficients
// shared and only read, the coarse levels' r and z in a buffer of the solve's own, so that two
// solves over the same kept levels never write the same memory.
template <typename T>
absl::StatusOr<MgHierarchy<T>> WithOwnVectors(const MgHierarchy<T>& kept, Pool& pool) {
  MgHierarchy<T> h;
  h.levels = kept.levels;
  h.signs = kept.signs;
  int64_t total = 0;
  for (size_t l = 1; l < h.levels.size(); ++l) total += 2 * h.levels[l].N * h.levels[l].M;
  auto b = pool.Get(std::max<int64_t>(int64_t(sizeof(T)) * total, 256));
  if (!b.ok()) return b.status();
  h.buf = std::move(*b);
  T* next = static_cast<T*>(h.buf.get());
  for (size_t l = 1; l < h.levels.size(); ++l) {
    const int64_t sz = h.levels[l].N * h.levels[l].M;
    h.levels[l].r = next;
    h.levels[l].z = next + sz;
    next += 2 * sz;
  }
  return h;
}

// out = V(in), in and out on the fine level.
template <typename T>
absl::Status ApplyVCycle(MgHierarchy<T>& h, const T* in, T* out, cudaStream_t stream) {
  h.levels[0].r = const_cast<T*>(in);
  h.levels[0].z = out;
  return VCycleDevice(h.levels, 0, stream);
}

// ApplyVCycle(h, in, out) captured from `stream` as an executable graph: the same kernels with
// the same arguments and launch shapes, in the same order (one chain of kernel nodes), so its
// replay computes the same bits; nullptr where it cannot be made. The capture is thread-local
// (cudaStreamCaptureModeThreadLocal): the server's other threads launch on their own streams
// meanwhile, which a global capture would make fail. On every failure the capture is ended, what
// was made destroyed and the runtime's last error cleared, so the stream and the next launch's
// error check are as if nothing had been tried (the legacy default stream, which cannot be
// captured, takes that path). The graph names h's coarse vectors, in and out: it is valid
// while they are.
template <typename T>
cudaGraphExec_t CaptureVCycle(MgHierarchy<T>& h, const T* in, T* out, cudaStream_t stream) {
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  const bool launched = ApplyVCycle(h, in, out, stream).ok();
  cudaGraph_t graph = nullptr;
  const bool ended = cudaStreamEndCapture(stream, &graph) == cudaSuccess;
  cudaGraphExec_t exec = nullptr;
  if (launched && ended && graph != nullptr &&
      cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
    exec = nullptr;
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (exec == nullptr) (void)cudaGetLastError();
  return exec;
}


}  // namespace
}  // namespace trisolve::cuda
