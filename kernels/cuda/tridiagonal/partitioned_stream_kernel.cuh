// The streamed one-pass partitioned kernel (persistent blocks copying their next systems into
// shared memory while they solve the current ones), flat, interleaved and as overlapping
// windows. Its loads and the partitioned method's parts: partitioned_kernels.cuh,
// partitioned.cuh. Included by tridiagonal.cu only.
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

// ---- one pass, streamed: persistent blocks that prefetch the next systems --------------------
// The one-pass kernel (above) loads a block's rows, then computes, then stores; with a few large
// blocks an SM (n >= 1024) the memory idles while they compute. Here each block loops over
// groups of S systems (flat layout, whole 16-byte words: n a multiple of 16 / sizeof(T), every
// array 16-byte aligned) and, as soon as it has read a group from shared memory into registers,
// starts the asynchronous copy (cp.async, 16 bytes a thread at a time, coalesced) of its next
// group into the same buffer; the copy runs under the group's reduction, PCR and stores.
// Buffer layout: the 16-byte word c of an array at Swizzle16(c) (common/numerics.cuh), so that a
// thread reading its own M consecutive rows as 16-byte words, M * sizeof(T) bytes after its
// neighbour's, meets no bank conflict.

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
  // 16 bytes off, and each warp's copies then read twice the sectors (NOTES.md t31).
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
  // latency (an L2 round trip under a full memory system) stalled every block every task
  // (NOTES.md t43).
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
    // (The windows passed their own, stricter limit above.)
    if constexpr (!kWindow) dominant = ChunkDominant<M>(a, b, c);
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
    if constexpr (kWindow) {
      if (!ok || !dominant) atomicOr(&bad[sl], 1);
    } else if (const int v = (ok ? 0 : kFlagVanished) | (dominant ? 0 : kFlagNotDominant); v) {
      atomicOr(&bad[sl], v);
    }
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
      flags[g * S + tid] |= uint8_t(bad[tid]);
    }
  }
  if constexpr (kWindow) {
    __syncthreads();  // (tid 0's write to the answer is its block's last)
    if (tid == 0) PublishAnswer(win.fail, win.answer);
  }
}

}  // namespace
}  // namespace trisolve::cuda
