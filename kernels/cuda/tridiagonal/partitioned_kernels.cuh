// The partitioned kernels of the tridiagonal family: the loads they share, the one-pass kernel
// (whole systems in one block), the cluster kernel and the two-pass path's level kernels. The
// streamed kernel is in partitioned_stream_kernel.cuh, cuThomasBatch and PCR in
// thomas_pcr_kernels.cuh; their launches in tridiagonal.cu, the choice among them in
// dispatch.cc. Included by tridiagonal.cu only.
#pragma once

#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/numerics.cuh"
#include "runtime/pinned_word.h"
#include "tridiagonal/internal.h"
#include "tridiagonal/partitioned.cuh"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/windows.h"

namespace trisolve::cuda {
namespace {

// ---- launch parameters (kChunk, MaxThreadsOnChip, kThomasThreads: tridiagonal/internal.h) ----
constexpr int kStreamThreads = 128;  // reduce/back kernels of the multi-level path

// Element k of system s in a layout.
__device__ __forceinline__ int64_t At(bool interleaved, int64_t batch, int64_t n, int64_t s,
                                      int64_t k) {
  return interleaved ? k * batch + s : s * n + k;
}

// Loads chunk rows k = j*M + i (i < M) of system s into registers; rows past n are identity
// rows, a[0] and c[n-1] are zeroed (unused by definition). Interleaved layout: direct loads
// (consecutive threads = consecutive systems = consecutive words).
template <int M, typename T>
__device__ __forceinline__ void LoadChunkInterleaved(const TridiagonalProblem<T>& p, int64_t s,
                                                     int64_t j, T (&a)[M], T (&b)[M], T (&c)[M],
                                                     T (&d)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const int64_t k = j * M + i;
    if (k < p.n && s < p.batch) {
      const int64_t e = k * p.batch + s;
      a[i] = k > 0 ? __ldg(p.a + e) : T(0);
      b[i] = __ldg(p.b + e);
      c[i] = k + 1 < p.n ? __ldg(p.c + e) : T(0);
      d[i] = __ldg(p.d + e);
    } else {
      a[i] = T(0);
      b[i] = T(1);
      c[i] = T(0);
      d[i] = T(0);
    }
  }
}

// Stores x of chunk rows k = j*M + i of system s (interleaved layout); rows past n, or of no
// system (s >= batch), are not stored.
template <int M, typename T>
__device__ __forceinline__ void StoreChunkInterleaved(const TridiagonalProblem<T>& p, int64_t s,
                                                      int64_t j, const T (&d)[M],
                                                      T* __restrict__ x) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const int64_t k = j * M + i;
    if (k < p.n && s < p.batch) x[k * p.batch + s] = d[i];
  }
}

// Flat layout without the staging tile (t9): a thread's M consecutive rows of system s straight
// from global memory (LoadRowsDirect). Rows past n, or of no system, are identity rows; a[0] and
// c[n-1] are zeroed.
template <int M, typename T>
__device__ __forceinline__ void LoadChunkFlatDirect(const TridiagonalProblem<T>& p, int64_t s,
                                                    int64_t j, bool vec, T (&a)[M], T (&b)[M],
                                                    T (&c)[M], T (&d)[M]) {
  const int64_t o = s < p.batch ? s * p.n : 0, n = s < p.batch ? p.n : 0;
  LoadChunkDirect<M>(p.a + o, p.b + o, p.c + o, p.d + o, j * M, n, vec, a, b, c, d);
}

// ---- one pass: whole systems in one block -------------------------------------------------
// Block = S systems x P threads (P a power of two, P * M >= n). Flat layout: thread
// tid = s_local * P + j; interleaved: tid = j * S + s_local (systems fastest, coalesced); the
// reduced rows placed by ReducedIndex (partitioned.cuh).
template <int M, typename T, bool kInterleaved, bool kLazyPcr, bool kDirect = false>
__global__ void __launch_bounds__(MaxThreadsOnChip(M))
    PartitionedOnChipKernel(TridiagonalProblem<T> p, T* __restrict__ x, uint8_t* flags, int P,
                            int S, bool vec) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int R = 2 * P;  // reduced rows per system
  const int nthreads = S * P;
  T* sa = smem;              // the reduced systems: 4 S R (SolveReducedBlock)
  T* tile = sa + 4 * S * R;  // flat staging: 4 arrays of S * P * (M + 1)
  static_assert((M & (M - 1)) == 0, "M a power of two");
  __shared__ int bad[kMaxThreadsOnChip];

  const int tid = threadIdx.x;
  const int sl = kInterleaved ? tid % S : tid / P;
  const int j = kInterleaved ? tid / S : tid % P;
  const int64_t s0 = int64_t(blockIdx.x) * S;
  const int64_t s = s0 + sl;
  if (tid < S) bad[tid] = 0;

  T a[M], b[M], c[M], d[M];
  // The block's systems are contiguous in the flat layout: element e of the block is element
  // k = e % n of system e / n, and sits at chunk k / M, row k % M of that system's threads.
  const int64_t live_elems = std::min<int64_t>(S, p.batch - s0) * p.n;
  auto where = [&](int e, int64_t& g, int& pos) {
    if (e >= live_elems) return false;
    const int es = int(e / p.n);
    const int k = e - es * int(p.n);
    g = s0 * p.n + e;
    pos = es * P * (M + 1) + k + k / M;
    return true;
  };
  const int tsz = nthreads * (M + 1);
  if (kInterleaved) {
    LoadChunkInterleaved<M>(p, s, j, a, b, c, d);
  } else if (kDirect) {
    LoadChunkFlatDirect<M>(p, s, j, vec, a, b, c, d);
  } else {
    StageFlat4<M>(p, tile, tsz, nthreads, where);
    __syncthreads();
    ReadChunkFromTile<M>(tile, tsz, s < p.batch ? s : -1, j, p.n, a, b, c, d);
  }
  const bool dominant = ChunkDominant<M>(a, b, c);
  bool ok = ChunkReduce<M>(a, b, c, d);
  // kLazyPcr (LaunchOnChipM picks; H100, NOTES.md t6b): reading the neighbours only when
  // present is 1.3-1.45x faster in float32 at n = 256-4096, 5-9% slower in float32 flat
  // n <= 64 and 2-6% slower in float64.
  T x0, xl;
  ok &= SolveReducedBlock<kInterleaved, kLazyPcr, !kInterleaved && M >= 16>(
      sa, sl, j, P, S, a[0], c[0], d[0], a[M - 1], c[M - 1], d[M - 1], x0, xl);
  ChunkBack<M>(a, c, d, x0, xl);
#pragma unroll
  for (int i = 0; i < M; ++i) ok &= Finite(d[i]);
  if (const int v = (ok ? 0 : kFlagVanished) | (dominant ? 0 : kFlagNotDominant); v)
    atomicOr(&bad[sl], v);
  if (kInterleaved) {
    StoreChunkInterleaved<M>(p, s, j, d, x);
    __syncthreads();
  } else if (kDirect) {
    if (s < p.batch) StoreRowsDirect<M>(x + s * p.n, int64_t(j) * M, p.n, vec, d);
    __syncthreads();
  } else {
    StoreFlat<M>(x, tile, nthreads, where, d);
  }
  if (tid < S && s0 + tid < p.batch && bad[tid]) flags[s0 + tid] |= uint8_t(bad[tid]);
}

// ---- one pass, a system over a cluster of Q blocks (sm_90) -----------------------------------
// For n above one block's worth (n > 1024 rows in 64 threads of 16 rows) the one-pass kernel
// runs a few large blocks an SM (one at n = 4096: 256 threads x ~200 registers), whose loads,
// arithmetic and stores then follow one another instead of overlapping. Here a system's rows
// are split over the Q blocks of a thread-block cluster, each block the size of an n <= 1024
// block (several an SM). Block = S systems x Pb threads (the one-pass kernel's mapping, tid =
// sl * Pb + j flat, j * S + sl interleaved); block `rank` of the cluster owns chunks
// J = rank * Pb + j, rows J * M .. J * M + M - 1. Each thread reduces its chunk to two rows
// (ChunkReduce), the cluster solves the reduced system (SolveReducedCluster: every block the
// whole of it, gathered through distributed shared memory), and each thread substitutes back.
template <int M, int K, typename T, bool kInterleaved>
__global__ void __launch_bounds__(256)
    PartitionedClusterKernel(TridiagonalProblem<T> p, T* __restrict__ x, uint8_t* flags, int Pb,
                             int S, bool vec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int Q = K / 2;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int Rb = 2 * Pb;  // reduced rows a system in this block
  T* own = smem;          // 3 * S * Rb: this block's reduced rows
  T* pcr = own + 3 * S * Rb;
  T* gather = pcr + 4 * S * Rb;  // 3 * S * (R + R / K)
  __shared__ int bad[128];  // S <= 256 / Pb, Pb >= Q >= 2
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int rank = int(cluster.block_rank());
  const int tid = threadIdx.x;
  const int sl = kInterleaved ? tid % S : tid / Pb;
  const int j = kInterleaved ? tid / S : tid % Pb;
  const int64_t s0 = int64_t(blockIdx.x / Q) * S;
  const int64_t s = s0 + sl;
  const int64_t J = int64_t(rank) * Pb + j;
  if (tid < S) bad[tid] = 0;

  T a[M], b[M], c[M], d[M];
  if (kInterleaved)
    LoadChunkInterleaved<M>(p, s, J, a, b, c, d);
  else
    LoadChunkFlatDirect<M>(p, s, J, vec, a, b, c, d);
  const bool dominant = ChunkDominant<M>(a, b, c);
  bool ok = ChunkReduce<M>(a, b, c, d);
  T x0, xl;
  ok &= SolveReducedCluster<K, kInterleaved>(cluster, own, pcr, gather, sl, j, Pb, S, a[0], c[0],
                                             d[0], a[M - 1], c[M - 1], d[M - 1], x0, xl, [] {});
  ChunkBack<M>(a, c, d, x0, xl);
#pragma unroll
  for (int i = 0; i < M; ++i) ok &= Finite(d[i]);
  if (const int v = (ok ? 0 : kFlagVanished) | (dominant ? 0 : kFlagNotDominant); v)
    atomicOr(&bad[sl], v);
  if (kInterleaved) {
    StoreChunkInterleaved<M>(p, s, J, d, x);
  } else if (s < p.batch) {
    StoreRowsDirect<M>(x + s * p.n, J * M, p.n, vec, d);
  }
  __syncthreads();
  // (Each block of the cluster flags the systems it holds a part of: FlagOr.)
  if (tid < S && s0 + tid < p.batch && bad[tid]) FlagOr(flags, s0 + tid, unsigned(bad[tid]));
  cluster.barrier_wait();  // the other blocks are done with this block's shared memory
#else
  __trap();  // launched only on devices of compute capability 9.0 or newer
#endif
}

// ---- multi-level: reduce to 2 rows per chunk in global memory, then substitute back ----------
// Chunk g of the problem: flat (s, j) = (g / nch, g % nch); interleaved (j, s) = (g / batch,
// g % batch). The reduced system is flat: system s, rows 2j and 2j+1 of 2 * nch.
// Threads a block of the level kernels: the staging tile (4 arrays of M + 1 values a thread)
// must stay under the 48 KB of static shared memory.
// kDirect (flat): a thread's rows straight from global memory into registers (LoadRowsDirect,
// 16-byte loads where `vec`) and x stored the same way. Without the tile (direct, or the
// interleaved layout) any block size.
template <int M, typename T, bool kNoTile = false>
constexpr int LevelThreads() {
  return !kNoTile && M * sizeof(T) > 64 ? kStreamThreads / 2 : kStreamThreads;
}

template <int M, typename T, bool kInterleaved, bool kBack, bool kDirect = false>
__global__ void __launch_bounds__(LevelThreads<M, T, kInterleaved || kDirect>())
    PartitionedLevelKernel(TridiagonalProblem<T> p, int64_t nch, T* __restrict__ ra,
                           T* __restrict__ rb, T* __restrict__ rc, T* __restrict__ rd,
                           const T* __restrict__ xr, T* __restrict__ x, uint8_t* flags,
                           bool vec) {
  constexpr int kThreads = LevelThreads<M, T, kInterleaved || kDirect>();
  constexpr int tsz = kThreads * (M + 1);
  T* tile = nullptr;
  if constexpr (!kInterleaved && !kDirect) {
    __shared__ T staged[4 * tsz];
    tile = staged;
  }
  const int64_t total = p.batch * nch;
  const int64_t g0 = int64_t(blockIdx.x) * blockDim.x;
  const int64_t g = g0 + threadIdx.x;
  auto decode = [&](int64_t gg, int64_t& s, int64_t& j) {
    if (gg >= total) {
      s = -1;
      j = 0;
    } else if (kInterleaved) {
      j = gg / p.batch;
      s = gg - j * p.batch;
    } else {
      s = gg / nch;
      j = gg - s * nch;
    }
  };
  int64_t s, j;
  decode(g, s, j);
  T a[M], b[M], c[M], d[M];
  // Flat: element e of the block is row e % M of the block's chunk e / M.
  auto where = [&](int e, int64_t& gi, int& pos) {
    const int cidx = e / M, i = e - cidx * M;
    int64_t cs, cj;
    decode(g0 + cidx, cs, cj);
    const int64_t k = cj * M + i;
    if (cs < 0 || k >= p.n) return false;
    gi = cs * p.n + k;
    pos = cidx * (M + 1) + i;
    return true;
  };
  if constexpr (kInterleaved) {
    LoadChunkInterleaved<M>(p, s < 0 ? p.batch : s, j, a, b, c, d);
  } else if constexpr (kDirect) {
    LoadChunkFlatDirect<M>(p, s < 0 ? p.batch : s, j, vec, a, b, c, d);
  } else {
    StageFlat4<M>(p, tile, tsz, kThreads, where);
    __syncthreads();
    ReadChunkFromTile<M>(tile, tsz, s, j, p.n, a, b, c, d);
    __syncthreads();
  }
  // The reducing pass certifies the rows (its reduced system's rows are dominant where these
  // are): several threads a system, so FlagOr.
  const bool dominant = kBack || ChunkDominant<M>(a, b, c);
  const bool ok = ChunkReduce<M>(a, b, c, d);
  const int64_t rn = 2 * nch;
  if (!kBack) {
    if (s >= 0) {
      const int64_t r = s * rn + 2 * j;
      ra[r] = a[0];
      rb[r] = T(1);
      rc[r] = c[0];
      rd[r] = d[0];
      ra[r + 1] = a[M - 1];
      rb[r + 1] = T(1);
      rc[r + 1] = c[M - 1];
      rd[r + 1] = d[M - 1];
      if (const unsigned v = (ok ? 0u : kFlagVanished) | (dominant ? 0u : kFlagNotDominant); v)
        FlagOr(flags, s, v);
    }
  } else {
    T x0 = T(0), xl = T(0);
    if (s >= 0) {
      x0 = xr[s * rn + 2 * j];
      xl = xr[s * rn + 2 * j + 1];
    }
    ChunkBack<M>(a, c, d, x0, xl);
    bool finite = true;
#pragma unroll
    for (int i = 0; i < M; ++i) finite &= Finite(d[i]);
    if (s >= 0 && !finite) FlagOr(flags, s, kFlagVanished);
    if constexpr (kInterleaved) {
      StoreChunkInterleaved<M>(p, s < 0 ? p.batch : s, j, d, x);
    } else if constexpr (kDirect) {
      if (s >= 0) StoreRowsDirect<M>(x + s * p.n, j * M, p.n, vec, d);
    } else {
      StoreFlat<M>(x, tile, kThreads, where, d);
    }
  }
}

}  // namespace
}  // namespace trisolve::cuda
