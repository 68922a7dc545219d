// The streamed fused sweeps (FusedSweepStreamKernel): persistent blocks that copy their next
// row into shared memory while they solve the current one. Included by row_sweeps.cu only.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_pipeline.h>

#include "common/bulk_copy.cuh"
#include "tridiagonal/row_sweep_kernels.cuh"

namespace trisolve::cuda {
namespace {

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
    // Uncoupled rows (a batch of tridiagonal systems): each certified by dominance too
    // (partitioned.cuh, kFlagNotDominant); the sweeps' rows need no certificate.
    bool dominant = true;
    if constexpr (kUncoupled) dominant = ChunkDominant<CH>(a, b, c);
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
    if constexpr (kUncoupled) {
      if (const int v = (ok ? 0 : kFlagVanished) | (dominant ? 0 : kFlagNotDominant); v)
        atomicOr(&task_bad, v);
    } else if (!ok) {
      task_bad = 1;
    }
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
        // (A cluster's blocks each flag the row they hold a part of: FlagOr.)
        if (task_bad) FlagOr(g.bad, Perm(i, N), unsigned(task_bad));
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


}  // namespace
}  // namespace trisolve::cuda
