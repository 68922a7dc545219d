// Batched tridiagonal systems in the interleaved layout by Thomas' algorithm, one thread a
// system, the rows streamed through shared memory by the copy engine and x stored by a
// look-ahead back substitution: "thomas-window" (tridiagonal_cuda.h says when it runs).
//
// Why: the interleaved layout puts row k of 32 consecutive systems in 256 contiguous bytes
// (float64), so a warp of threads, one a system, reads every row coalesced -- the layout
// cuThomasBatch was made for. What cuThomasBatch cannot do is keep the forward sweep's c' and d'
// on chip: it writes them and reads them back (9 arrays of traffic, not 5). Here they stay in a
// ring of shared memory, and rows are stored before the forward sweep reaches the end of the
// system: chunk [out, out + 16) is substituted back from the forward sweep's front f with
// x[f + 1] taken as 0. The error that makes is exact to write down: x_k = d'_k - c'_k x_{k+1}
// carries it back multiplied by -c'_i a row, so at row k it is prod_{i=k..f} c'_i times
// x[f + 1]. The kernel keeps log2 |c'| summed along the sweep and stores a chunk once that
// product is under 2^-(digits + 2) for every row of it in every system of the warp: bounded by
// the unit roundoff times max |x|, the accuracy of the overlapping windows (windows.h). It is
// measured, not assumed: diagonally dominant rows (|c'| <= rho) need about (digits + 2) /
// log2(1 / rho) rows of look-ahead, the benchmark's random rows ~32, an implicit diffusion step
// with r = D dt / dx^2 = 1 ~40 and r = 10 ~120. A chunk that needs more than the ring holds (48
// rows) runs the problem again with a longer ring (112), and past that by the exact paths.
//
// The left end is exact: the sweep starts at row 0 of the system. Where the batch has too few
// groups of 32 systems to fill the GPU, each system is also cut into windows (windows.h's plan:
// cores tiling the system, `halo` rows read before each core but the first); a window past the
// first starts its sweep `halo` rows early with the coupling before it dropped, which is exact
// to rounding where every row it reads has (|a| + |c|) <= limit |b| (windows.h's bound, checked
// on every row: else the problem fails as above).
//
// Per system, as the CPU reference does: a vanishing pivot or a non-finite x flags the system
// (the caller zeroes its x), but in a window past the first, where it fails the problem.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "bulk_copy.cuh"
#include "check.h"
#include "launch.h"
#include "numerics.cuh"
#include "pinned_word.h"
#include "tridiagonal_cuda.h"
#include "trisolve/windows.h"

namespace trisolve::cuda {
namespace {

constexpr int kLanes = 32;      // systems a task: one warp, one a block
constexpr int kOut = 16;        // rows a back substitution stores (a chunk)
constexpr int64_t kDefaultHalo = 256;  // windows past a system's first: limit 0.864 / 0.935
// Why these sizes (H100): one warp a block, and a warp's rows are one dependent chain (a
// division a row), so the SM's four schedulers need four warps or more: shared memory for 4
// blocks of float64 holds two copies in flight and a ring of 64 rows (48 of look-ahead, what
// the benchmark's rows and a diffusion step with r = 1 need); problems that need more are run
// again with a ring of 128 rows (2 blocks an SM) before the exact path.
constexpr int kShortRing = 64, kLongRing = 128;
// Rows a copy (a box of 32 systems an array) and copies in flight a block: float64 8 and 2,
// float32 16 and 4 (H100, 2^24 unknowns interleaved: float64 in copies of 16 rows fit 3 blocks
// an SM, n = 1024 0.263 -> 0.433 ms; float32 in copies of 8 rows 0.162 against 0.147; copies of
// 4 rows, 4 / 8 in flight, were slower in both, 0.299 / 0.208).
template <typename T>
constexpr int StageRows() {
  return sizeof(T) == 8 ? 8 : 16;
}
template <typename T>
constexpr int Stages() {
  return sizeof(T) == 8 ? 2 : 4;
}
constexpr int Snaps(int ring) {  // chunks open at once at most, a power of 2
  int s = 1;
  while (s < ring / kOut + 1) s *= 2;
  return s;
}

struct Maps {
  CUtensorMap m[4];  // a, b, c, d as (batch x n), boxes of 32 systems x StageRows rows
};

// The answers in *fail: a window needed more look-ahead than the ring holds (worth a longer
// ring), or its rows fail otherwise (the exact path).
constexpr int kFailLookAhead = 1, kFailRows = 2;

struct Args {
  WindowPlan plan;      // windows of a system (per_system 1: whole systems)
  int64_t tasks = 0;    // groups of 32 systems x plan.per_system
  double limit = 1;     // windows past the first: (|a| + |c|) <= limit |b| on every row read
  double tau = 0;       // a chunk is stored once prod |c'| over its look-ahead is under tau
  int* fail = nullptr;  // kFail* where a window cannot be solved here
};

template <typename T, int kRing>
struct Smem {
  T raw[Stages<T>()][4][StageRows<T>()][kLanes];  // the copies' boxes: a, b, c, d
  T ring[kRing][2][kLanes];                   // c', d' of row k at k % kRing
  T map[Snaps(kRing)][3][kLanes];             // swept chunks' alpha, beta, most (the kernel)
  uint64_t bar[Stages<T>()];
};

// Windows start on a multiple of StageRows rows past the system's first row (cores are whole
// chunks, the halo whole copies), so that a copy never straddles a chunk's end (but at n) nor
// the ring's end.
template <typename T, int kRing>
__global__ void __launch_bounds__(kLanes)
    ThomasWindowKernel(TridiagonalProblem<T> p, T* __restrict__ x, uint8_t* flags,
                       const __grid_constant__ Maps maps, Args w) {
  constexpr int kStages = Stages<T>(), kSnaps = Snaps(kRing), kStageRows = StageRows<T>();
  static_assert((kRing & (kRing - 1)) == 0 && kRing % kStageRows == 0 && kOut % kStageRows == 0);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem<T, kRing>& sm = *reinterpret_cast<Smem<T, kRing>*>(
      smem_raw + ((128 - (SmemAddr(smem_raw) & 127)) & 127));  // boxes on 128 bytes
  const int lane = threadIdx.x;
  if (lane == 0)
    for (int i = 0; i < kStages; ++i) BarInit(&sm.bar[i]);
  __syncwarp();
  constexpr uint32_t kBytes = 4u * kStageRows * kLanes * sizeof(T);
  const int64_t n = p.n;
  uint32_t issued = 0, used = 0;  // copies issued and consumed by this block: slot and parity
  for (int64_t t = blockIdx.x; t < w.tasks; t += gridDim.x) {
    if (*static_cast<volatile int*>(w.fail)) break;
    const int64_t g = t / w.plan.per_system;
    const WindowRows r = WindowAt(w.plan, n, t - g * w.plan.per_system);
    const int64_t s = g * kLanes + lane;
    const bool live = s < p.batch;
    const bool first = r.lo == 0;
    // The copies: rows r.lo, r.lo + 8, .. while the ring could still use them.
    const int64_t end = std::min<int64_t>(n, r.c1 + kRing);
    int64_t next = r.lo;
    auto issue = [&] {
      while (next < end && issued - used < kStages) {
        const int slot = int(issued % kStages);
        if (lane == 0) {
          BarExpect(&sm.bar[slot], kBytes);
#pragma unroll
          for (int q = 0; q < 4; ++q)
            BulkLoad2D(&sm.raw[slot][q][0][0], &maps.m[q], int(g * kLanes), int(next),
                       &sm.bar[slot]);
        }
        ++issued;
        next += kStageRows;
      }
    };
    issue();
    T cp = T(0), dp = T(0);  // the forward sweep's c', d' of the row before
    // The chunk being swept (rows from `bstart`), as the back substitution will see it:
    // x[bstart] = alpha + beta x[row] for the rows swept so far (beta = prod -c'), and
    // most = max over its rows k of prod_{i = k..row-1} |c'_i|.
    T alpha = T(0), beta = T(1), most = T(0);
    bool bad = false;  // a pivot vanished, x not finite, a row not dominant enough
    int failed = 0;    // kFail* (uniform)
    int64_t row = r.lo;                          // next row to sweep
    int64_t fend = std::min(r.c0 + kOut, r.c1);  // end of the chunk being swept
    int fchunk = 0;                              // its index
    int64_t out = r.c0;                          // the chunk to store next: index ochunk
    int ochunk = 0;
    const T limit = T(w.limit), tau = T(w.tau);
    T* xs = x + s;
    while (out < r.c1) {
      // Row k goes to ring slot k % kRing, over row k - kRing: that must be stored already.
      if (row >= end || row + kStageRows > out + kRing) {
        failed = kFailLookAhead;
        break;
      }
      const int slot = int(used % kStages);
      BarWait(&sm.bar[slot], (used / kStages) & 1);
      const int rows = int(std::min<int64_t>(kStageRows, n - row));
      const int last = int(std::min<int64_t>(n - 1 - row, kStageRows));  // row n - 1, if here
      const bool at_lo = row == r.lo, core = row >= r.c0;
      const int base = int(row & (kRing - 1));
      T av[kStageRows], bv[kStageRows], cv[kStageRows], dv[kStageRows];
#pragma unroll
      for (int i = 0; i < kStageRows; ++i) {
        av[i] = sm.raw[slot][0][i][lane];
        bv[i] = sm.raw[slot][1][i][lane];
        cv[i] = sm.raw[slot][2][i][lane];
        dv[i] = sm.raw[slot][3][i][lane];
      }
      bool weak = false;
#pragma unroll
      for (int i = 0; i < kStageRows; ++i) {
        const bool valid = i < rows;
        T a = av[i];
        const T b = bv[i];
        const T c = i == last ? T(0) : cv[i];  // c[n - 1]: unused by definition
        // A window past the first: every row read, the dropped coupling's included.
        weak |= valid && !(fabs(a) + fabs(c) <= limit * fabs(b));
        if (i == 0 && at_lo) a = T(0);  // the system's a[0], or the coupling the window drops
        const T ac = a * cp;
        const T den = b - ac;
        bad |= valid && Vanishes(den, fabs(b) + fabs(ac));
        const T rr = Rcp(den);
        cp = c * rr;
        dp = (dv[i] - a * dp) * rr;
        sm.ring[base + i][0][lane] = cp;
        sm.ring[base + i][1][lane] = dp;
        if (core && valid) {  // (uniform)
          alpha = fma(beta, dp, alpha);
          beta *= -cp;
          most = fabs(cp) * fmax(most, T(1));
        }
      }
      bad |= weak && !first;
      FenceProxyAsync();  // the slot's reads before the copy engine's next writes into it
      __syncwarp();
      ++used;
      row += rows;
      issue();
      if (row >= fend) {  // the chunk is swept (chunks end with a copy): keep its map
        const int q = fchunk & (kSnaps - 1);
        sm.map[q][0][lane] = alpha;
        sm.map[q][1][lane] = beta;
        sm.map[q][2][lane] = most;
        alpha = T(0);
        beta = T(1);
        most = T(0);
        ++fchunk;
        fend = fend < r.c1 ? std::min(fend + kOut, r.c1) : INT64_MAX;
      }
      // Store each swept chunk whose look-ahead now suffices in every system of the warp:
      // x past it from the chunks after it (x[row] taken as 0), and the bound of the error
      // that makes at its rows, most * prod |beta| of the chunks after it.
      while (ochunk < fchunk) {
        T xn = alpha, bound = fabs(beta);
        for (int m = fchunk - 1; m > ochunk; --m) {
          const int q = m & (kSnaps - 1);
          xn = fma(sm.map[q][1][lane], xn, sm.map[q][0][lane]);
          bound *= fabs(sm.map[q][1][lane]);
        }
        bound *= sm.map[ochunk & (kSnaps - 1)][2][lane];
        const bool enough = !live || bad || row == n || bound <= tau;
        if (!__all_sync(0xffffffffu, enough)) break;
        const int count = int(std::min<int64_t>(kOut, r.c1 - out));
        const int k0 = int(out & (kRing - 1));  // (chunks do not wrap the ring)
        T cs[kOut], ds[kOut];
#pragma unroll
        for (int i = 0; i < kOut; ++i) {
          cs[i] = sm.ring[k0 + i][0][lane];
          ds[i] = sm.ring[k0 + i][1][lane];
        }
        T* xo = xs + out * p.batch;
#pragma unroll
        for (int i = kOut - 1; i >= 0; --i) {
          if (i < count) {
            xn = ds[i] - cs[i] * xn;
            bad |= !Finite(xn);
            if (live) xo[i * p.batch] = xn;
          }
        }
        out += count;
        ++ochunk;
      }
    }
    // Copies issued past what the window used: wait for them before the slots are reused.
    for (; used < issued; ++used) BarWait(&sm.bar[used % kStages], (used / kStages) & 1);
    __syncwarp();
    if (!failed && __any_sync(0xffffffffu, live && bad && !first)) failed = kFailRows;
    if (failed) {
      if (lane == 0) atomicMax(w.fail, failed);
      break;
    }
    if (live && bad) flags[s] = 1;
  }
}

template <typename T>
bool EncodeMaps(const TridiagonalProblem<T>& p, Maps& maps) {
  const auto encode = TensorMapEncoder();
  if (!encode) return false;
  const T* arrays[4] = {p.a, p.b, p.c, p.d};
  for (int q = 0; q < 4; ++q) {
    const cuuint64_t dims[2] = {cuuint64_t(p.batch), cuuint64_t(p.n)};
    const cuuint64_t strides[1] = {cuuint64_t(p.batch) * sizeof(T)};
    const cuuint32_t box[2] = {kLanes, StageRows<T>()};
    const cuuint32_t elem[2] = {1, 1};
    if (encode(&maps.m[q],
               sizeof(T) == 8 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT64 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
               2, const_cast<T*>(arrays[q]), dims, strides, box, elem,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  return true;
}

// One launch with a ring of kRing rows: the answer in *fail (0, or kFail*).
template <typename T, int kRing>
absl::StatusOr<int> LaunchThomasWindow(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                       const Maps& maps, int64_t windows, int64_t halo,
                                       Pool& pool, cudaStream_t stream) {
  auto kernel = ThomasWindowKernel<T, kRing>;
  const size_t smem = sizeof(Smem<T, kRing>) + 128;
  // The shared-memory attribute and the blocks that run at once: asked once (one device a
  // process, as ClustersAvailable assumes).
  static const absl::StatusOr<int64_t> resident = [&] {
    LaunchConfig launch(0, kLanes, smem, nullptr);
    return ResidentGroups(kernel, launch);
  }();
  if (!resident.ok()) return resident.status();
  if (*resident < 1) return kFailRows;
  const int64_t groups = (p.batch + kLanes - 1) / kLanes;
  // Windows a system: enough tasks for the blocks that run at once, cores of 4 halos or more.
  if (halo <= 0) halo = kDefaultHalo;
  halo = (halo + StageRows<T>() - 1) / StageRows<T>() * StageRows<T>();
  if (windows <= 0) windows = groups >= *resident ? 1 : (*resident + groups - 1) / groups;
  windows = std::max<int64_t>(1, std::min(windows, p.n / (4 * halo)));
  Args args;
  args.plan.halo = halo;
  args.plan.core = (p.n + windows - 1) / windows;
  args.plan.core = (args.plan.core + kOut - 1) / kOut * kOut;
  args.plan.per_system = (p.n + args.plan.core - 1) / args.plan.core;
  args.tasks = groups * args.plan.per_system;
  args.limit = WindowDominanceLimit(halo, std::numeric_limits<T>::digits);
  args.tau = std::ldexp(1.0, -(std::numeric_limits<T>::digits + 2));
  auto fail = pool.Get(sizeof(int));
  if (!fail.ok()) return fail.status();
  args.fail = fail->as<int>();
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(args.fail, 0, sizeof(int), stream));
  auto word = PinnedWord::Take();
  if (!word.ok()) return word.status();
  kernel<<<unsigned(std::min(args.tasks, *resident)), kLanes, smem, stream>>>(p, x, flags, maps,
                                                                               args);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(word->get(), args.fail, sizeof(int), cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return *word->get();
}

}  // namespace

bool ThomasWindowApplies(int64_t n, int64_t batch, Layout layout, bool float32) {
  const int64_t word = float32 ? 4 : 2;  // systems in 16 bytes: the copies' row stride
  return layout == Layout::kInterleaved && batch >= 2 && batch % word == 0 && n >= 1 &&
         n < (int64_t(1) << 31) - kLongRing && ClustersAvailable() &&
         TensorMapEncoder() != nullptr;
}

template <typename T>
absl::StatusOr<bool> SolveThomasWindowed(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                         Pool& pool, cudaStream_t stream, int64_t windows,
                                         int64_t halo) {
  if (!ThomasWindowApplies(p.n, p.batch, p.layout, sizeof(T) == 4)) return false;
  const T* arrays[4] = {p.a, p.b, p.c, p.d};
  for (const T* q : arrays)
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  Maps maps;
  if (!EncodeMaps(p, maps)) return false;
  absl::StatusOr<int> failed =
      LaunchThomasWindow<T, kShortRing>(p, x, flags, maps, windows, halo, pool, stream);
  if (!failed.ok()) return failed.status();
  int answer = *failed;
  if (answer == kFailLookAhead) {
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(p.batch), stream));
    absl::StatusOr<int> longer =
        LaunchThomasWindow<T, kLongRing>(p, x, flags, maps, windows, halo, pool, stream);
    if (!longer.ok()) return longer.status();
    answer = *longer;
  }
  if (answer == 0) return true;
  // Systems flagged before the failure: the exact path decides again.
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(p.batch), stream));
  return false;
}

template absl::StatusOr<bool> SolveThomasWindowed(const TridiagonalProblem<double>&, double*,
                                                  uint8_t*, Pool&, cudaStream_t, int64_t,
                                                  int64_t);
template absl::StatusOr<bool> SolveThomasWindowed(const TridiagonalProblem<float>&, float*,
                                                  uint8_t*, Pool&, cudaStream_t, int64_t,
                                                  int64_t);

}  // namespace trisolve::cuda
