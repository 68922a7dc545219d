// The partitioned, cuThomasBatch and PCR kernels of the tridiagonal family (their launches and
// the choice among them: tridiagonal.cu). Included by tridiagonal.cu only.
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
  if (!ok) atomicOr(&bad[sl], 1);
  if (kInterleaved) {
    StoreChunkInterleaved<M>(p, s, j, d, x);
    __syncthreads();
  } else if (kDirect) {
    if (s < p.batch) StoreRowsDirect<M>(x + s * p.n, int64_t(j) * M, p.n, vec, d);
    __syncthreads();
  } else {
    StoreFlat<M>(x, tile, nthreads, where, d);
  }
  if (tid < S && s0 + tid < p.batch && bad[tid]) flags[s0 + tid] = 1;
}

// ---- one pass, streamed: persistent blocks that prefetch the next systems --------------------
// The one-pass kernel (above) loads a block's rows, then computes, then stores; with a few large
// blocks an SM (n >= 1024) the memory idles while they compute. Here each block loops over
// groups of S systems (flat layout, whole 16-byte words: n a multiple of 16 / sizeof(T), every
// array 16-byte aligned) and, as soon as it has read a group from shared memory into registers,
// starts the asynchronous copy (cp.async, 16 bytes a thread at a time, coalesced) of its next
// group into the same buffer; the copy runs under the group's reduction, PCR and stores.
// Buffer layout: the 16-byte word c of an array at c ^ ((c >> 3) & 7) (an XOR swizzle within
// each 128-byte line), so that a thread reading its own M consecutive rows as 16-byte words,
// M * sizeof(T) bytes after its neighbour's, meets no bank conflict.
__device__ __forceinline__ int Swizzle16(int c) { return c ^ ((c >> 3) & 7); }

// The interleaved layout (kInterleaved): a group is S consecutive systems (S * sizeof(T)
// bytes a row: 16 to 256, whole 16-byte words), and its rows are copied with cp.async into a
// buffer of 16-byte units u = k * SW + h (row k, word h < SW = S / W of the row), so that the
// copies are sector-sized runs of the interleaved arrays. Threads are mapped as the interleaved
// one-pass kernel's (tid = j * S + sl: a warp reads several systems' values of the same rows).
// Unit u sits at u ^ ((j * SW) & 7), j = k / M the chunk it belongs to: the words of a 128-byte
// line (8 units, one chunk: M * SW >= 8) permuted by chunk, so that the warp's reads of row
// j * M + i over its chunks j spread over the line and meet no bank conflict beyond the minimum.
//
// kWindow (flat, S = 1): group g is window g of the plan `win` (trisolve/windows.h), system
// g / per_system: the block reads the window's rows, checks that every one is dominant enough
// for the plan's halo (win.limit), solves them alone (the couplings past the window dropped)
// and stores x on the core only. A window that fails the check, or whose pivots vanish, sets
// *win.fail (its stores, issued before the block knows, are left for the caller to overwrite);
// every block stops at its next window once one has, and the caller solves the whole problem
// again by the exact path.
struct Windows {
  WindowPlan plan;
  double limit = 0;  // (|a| + |c|) <= limit |b| on every row read
  int* fail = nullptr;    // set to 1 where a window fails (PinnedWord's scratch)
  int* answer = nullptr;  // *fail at the end, written by the last block (PinnedWord::mapped)
};

// Window g's system and rows (one 32-bit division: fewer than 2^31 windows, SolveWindowed).
__device__ __forceinline__ WindowRows WindowOf(const Windows& win, int64_t n, int64_t g,
                                               int64_t& system) {
  const unsigned per = unsigned(win.plan.per_system);
  system = unsigned(g) / per;
  return WindowAt(win.plan, n, unsigned(g) - unsigned(system) * per);
}

template <int M, typename T, bool kInterleaved, bool kWindow = false>
__global__ void __launch_bounds__(256)
    PartitionedStreamKernel(TridiagonalProblem<T> p, T* __restrict__ x, uint8_t* flags, int P,
                            int S, int64_t groups, Windows win) {
  using V = typename Vec16<T>::type;
  constexpr int W = 16 / sizeof(T);
  static_assert(kInterleaved || M % W == 0, "a flat chunk is whole 16-byte words");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int R = 2 * P;
  const int nthreads = S * P;
  const int n = int(p.n);
  const int SW = kInterleaved ? S / W : 1;  // interleaved: 16-byte words a row of the group
  const int lsw = __ffs(SW) - 1;            // (a power of two)
  // 16-byte units an array a group (a window: at most P M rows)
  const int units = kInterleaved ? n * SW : kWindow ? P * M / W : S * n / W;
  const int cap = (units + 7) / 8 * 8;                  // whole 128-byte lines
  T* sa = reinterpret_cast<T*>(smem_raw);         // the reduced systems: 4 S R
  V* buf = reinterpret_cast<V*>(sa + 4 * S * R);  // 4 arrays of cap units
  // bad[256]: kWindow's stop flag. The static shared memory stays whole 128-byte lines, so
  // that the dynamic buffer's lines (the swizzle's unit) start on one: a lone extra int put it
  // 16 bytes off, and each warp's copies then read twice the sectors (H100, Nsight Compute:
  // 38.4 M sectors against 19.2 M; one system of 2^24 0.379 -> 0.339 ms; NOTES.md t31).
  __shared__ int bad[256 + 32];
  static_assert(sizeof(bad) % 128 == 0);

  const int tid = threadIdx.x;
  const int sl = kInterleaved ? tid % S : tid / P, j = kInterleaved ? tid / S : tid % P;
  // Starts the copy of group g (systems g * S ..) into buf. Interleaved: the units of systems
  // past the batch are left out (batch is a multiple of W, so a unit is all in or all out);
  // unit u of chunk u / (M * SW) (a multiple of 8 units, the launch checks) at
  // u ^ ((chunk * SW) & 7).
  auto issue = [&](int64_t g) {
    const int64_t s0 = g * S;
    const int live = int(std::min<int64_t>(S, p.batch - s0));  // systems in the batch
    if constexpr (kInterleaved) {
      const T* src[4] = {p.a + s0, p.b + s0, p.c + s0, p.d + s0};
      for (int u = tid; u < units; u += nthreads) {
        const int k = u >> lsw, h = u & (SW - 1);
        if (h >= live / W) continue;
        const int64_t e = int64_t(k) * p.batch + h * W;
        const int ph = u ^ ((k / M * SW) & 7);
#pragma unroll
        for (int q = 0; q < 4; ++q) __pipeline_memcpy_async(buf + q * cap + ph, src[q] + e, 16);
      }
    } else {
      int64_t first;  // the group's first element, and its 16-byte words
      int words;
      if constexpr (kWindow) {
        int64_t system;
        const WindowRows r = WindowOf(win, p.n, g, system);
        first = system * p.n + r.lo;
        words = int(r.hi - r.lo) / W;
      } else {
        first = s0 * n;
        words = live * n / W;
      }
      const V* src[4] = {reinterpret_cast<const V*>(p.a + first),
                         reinterpret_cast<const V*>(p.b + first),
                         reinterpret_cast<const V*>(p.c + first),
                         reinterpret_cast<const V*>(p.d + first)};
      for (int w = tid; w < words; w += nthreads) {
        const int ph = Swizzle16(w);
#pragma unroll
        for (int q = 0; q < 4; ++q) __pipeline_memcpy_async(buf + q * cap + ph, src[q] + w, 16);
      }
    }
    __pipeline_commit();
  };
  // kWindow: a window has failed (this block's or another's). The flag is loaded as a task
  // starts and looked at when it ends: loaded before the barrier that waits for the copies, its
  // latency (an L2 round trip under a full memory system) stalled every block every task (H100,
  // one system of 2^24, halo 64: 0.312-0.319 -> 0.291-0.296 ms; NOTES.md t43).
  int& stop = bad[256];
  if (kWindow && tid == 0) stop = 0;
  int64_t g = blockIdx.x;
  if (g < groups) issue(g);
  for (; g < groups; g += gridDim.x) {
    __pipeline_wait_prior(0);
    __syncthreads();  // group g in buf
    if (kWindow && stop) break;
    int failed_elsewhere = 0;
    if (kWindow && tid == 0) failed_elsewhere = *static_cast<volatile int*>(win.fail);
    int64_t s = g * S + sl;
    // kWindow: the window's system, rows and core; else the system's rows.
    WindowRows wr{0, n, 0, n};
    if constexpr (kWindow) wr = WindowOf(win, p.n, g, s);
    const bool live = kWindow || s < p.batch;
    const int rows = int(wr.hi - wr.lo);
    const int k0 = j * M;
    T a[M], b[M], c[M], d[M];
    auto identity = [&](int i) {
      a[i] = T(0);
      b[i] = T(1);
      c[i] = T(0);
      d[i] = T(0);
    };
    if constexpr (kInterleaved) {
      const T* tb = reinterpret_cast<const T*>(buf);
      const int ct = cap * W;         // values an array
      const int perm = (j * SW) & 7;  // where this chunk's units sit
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const int k = k0 + i;
        if (live && k < n) {
          const int v = (((k << lsw) + sl / W) ^ perm) * W + sl % W;
          a[i] = tb[v];
          b[i] = tb[ct + v];
          c[i] = tb[2 * ct + v];
          d[i] = tb[3 * ct + v];
        } else {
          identity(i);
        }
      }
    } else {
#pragma unroll
      for (int q = 0; q < M / W; ++q) {
        if (live && k0 + q * W < rows) {
          const int ph = Swizzle16((sl * rows + k0) / W + q);
          Unpack(buf[ph], a + q * W);
          Unpack(buf[cap + ph], b + q * W);
          Unpack(buf[2 * cap + ph], c + q * W);
          Unpack(buf[3 * cap + ph], d + q * W);
        } else {
#pragma unroll
          for (int i = 0; i < W; ++i) identity(q * W + i);
        }
      }
    }
    bool dominant = true;
    if constexpr (kWindow) {
      // Every row read against the limit, the couplings the window drops included: the system's
      // own ends zeroed first (unused by definition), the window's after. Rows past the window
      // are identity rows and pass.
      if (wr.lo == 0 && k0 == 0) a[0] = T(0);
#pragma unroll
      for (int i = 0; i < M; ++i)
        if (wr.hi == p.n && k0 + i + 1 >= rows) c[i] = T(0);
      const T limit = T(win.limit);
#pragma unroll
      for (int i = 0; i < M; ++i) dominant &= fabs(a[i]) + fabs(c[i]) <= limit * fabs(b[i]);
    }
    EndRows<M>(k0, rows, a, c);
    if (tid < S) bad[tid] = 0;
    __syncthreads();  // buf read: the next group may land in it
    if (g + gridDim.x < groups) issue(g + gridDim.x);
    bool ok = ChunkReduce<M>(a, b, c, d);
    T x0, xl;
    ok &= SolveReducedBlock<kInterleaved, sizeof(T) == 4, !kInterleaved>(
        sa, sl, j, P, S, a[0], c[0], d[0], a[M - 1], c[M - 1], d[M - 1], x0, xl);
    ChunkBack<M>(a, c, d, x0, xl);
#pragma unroll
    for (int i = 0; i < M; ++i) ok &= Finite(d[i]);
    if (!ok || !dominant) atomicOr(&bad[sl], 1);
    if constexpr (kInterleaved) {
      StoreChunkInterleaved<M>(p, s, j, d, x);
    } else if constexpr (kWindow) {  // the core's rows: whole 16-byte words
      V* dst = reinterpret_cast<V*>(x + s * p.n + wr.lo + k0);
      const int c0 = int(wr.c0 - wr.lo) - k0, c1 = int(wr.c1 - wr.lo) - k0;
#pragma unroll
      for (int q = 0; q < M / W; ++q)
        if (q * W >= c0 && q * W < c1) __stwb(dst + q, Pack(d + q * W));  // (one vector store)
    } else if (live) {
      StoreRowsDirect<M>(x + s * n, k0, n, true, d);
    }
    __syncthreads();
    if constexpr (kWindow) {
      if (tid == 0) {
        if (bad[0]) *static_cast<volatile int*>(win.fail) = 1;
        stop = failed_elsewhere | bad[0];
      }
    } else if (tid < S && g * S + tid < p.batch && bad[tid]) {
      flags[g * S + tid] = 1;
    }
  }
  if constexpr (kWindow) {
    __syncthreads();  // (tid 0's write to the answer is its block's last)
    if (tid == 0) PublishAnswer(win.fail, win.answer);
  }
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
  bool ok = ChunkReduce<M>(a, b, c, d);
  T x0, xl;
  ok &= SolveReducedCluster<K, kInterleaved>(cluster, own, pcr, gather, sl, j, Pb, S, a[0], c[0],
                                             d[0], a[M - 1], c[M - 1], d[M - 1], x0, xl, [] {});
  ChunkBack<M>(a, c, d, x0, xl);
#pragma unroll
  for (int i = 0; i < M; ++i) ok &= Finite(d[i]);
  if (!ok) atomicOr(&bad[sl], 1);
  if (kInterleaved) {
    StoreChunkInterleaved<M>(p, s, J, d, x);
  } else if (s < p.batch) {
    StoreRowsDirect<M>(x + s * p.n, J * M, p.n, vec, d);
  }
  __syncthreads();
  if (tid < S && s0 + tid < p.batch && bad[tid]) flags[s0 + tid] = 1;
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
      if (!ok) flags[s] = 1;
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
    if (s >= 0 && !finite) flags[s] = 1;
    if constexpr (kInterleaved) {
      StoreChunkInterleaved<M>(p, s < 0 ? p.batch : s, j, d, x);
    } else if constexpr (kDirect) {
      if (s >= 0) StoreRowsDirect<M>(x + s * p.n, j * M, p.n, vec, d);
    } else {
      StoreFlat<M>(x, tile, kThreads, where, d);
    }
  }
}

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
