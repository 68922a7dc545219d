// The fused sweeps' device code: task order, waits and publication, and the one-launch fused
// kernel (FusedSweepKernel). Included by row_sweeps.cu only.
#pragma once

#include <cooperative_groups.h>
#include <cuda/atomic>

#include "tridiagonal/partitioned.cuh"
#include "tridiagonal/row_sweeps.h"

namespace trisolve::cuda {
namespace {

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

}  // namespace
}  // namespace trisolve::cuda
