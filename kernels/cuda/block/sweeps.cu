// The thesis' block Gauss-Seidel / red-black / Jacobi iterations on the GPU: the fused sweeps
// (tridiagonal/row_sweeps.h) where a row fits them, else a right-hand-side kernel and a batched
// partitioned solve a half-sweep.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "block/internal.h"
#include "block/block.h"
#include "block/vector_kernels.cuh"
#include "runtime/check.h"
#include "runtime/pinned_word.h"
#include "tridiagonal/row_sweeps.h"
#include "tridiagonal/flags.h"
#include "tridiagonal/tridiagonal.h"

namespace trisolve::cuda {
namespace {

constexpr int kSweepsPerLaunch = 64;

// The windowed form's tile (one streamed block of 256 threads x 16 rows) and the halos it may
// read: multiples of 16 rows (the bulk copies' boxes stay aligned), the least the rows allow.
constexpr int64_t kSweepWindowRows = int64_t(kStreamThreads) * 16;
constexpr int kSweepHaloStep = 16, kSweepHaloLevels = 16;  // halos of 16, 32, ..., 256 rows

// Whether the sweeps may run windowed (before the rows' check): the tuning's (window 1: any
// row over one window, -1 never), else red-black and jacobi in float64 where no other fused
// form holds the row (M over 16384). Gauss-seidel never: its tasks are taken by diagonals.
bool SweepWindowsWanted(int64_t M, bool float64, SweepKind kind, bool fused_form) {
  const SweepTuning g_sweep = GetSweepTuning();
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
  const SweepTuning g_sweep = GetSweepTuning();
  if (g_sweep.window_halo <= 0) return need;
  const int64_t tuned = std::min<int64_t>((g_sweep.window_halo + kSweepHaloStep - 1) /
                                              kSweepHaloStep * kSweepHaloStep,
                                          kSweepWindowRows / 4);  // whole steps, cores of half
  return tuned >= need ? tuned : 0;
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

template <typename T>
absl::StatusOr<SolveInfo> SweepsDevice(const BlockTridiagonalProblem<T>& p, BlockMethod method,
                                       const BlockOptions& o, T* y, SystemStatus* status,
                                       Pool& pool, const SolveControl& control,
                                       BlockMonitor& mon, cudaStream_t stream) {
  const SweepTuning g_sweep = GetSweepTuning();
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
  mon.Check(0, res);
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
    mon.Check(sweeps_done, res);
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
    auto st = LaunchRowSweeps(form, g, stream);
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
  for (uint8_t v : hf) singular |= (v & kFlagVanished) != 0;  // (not dominance)
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

template absl::StatusOr<SolveInfo> SweepsDevice(const BlockTridiagonalProblem<double>&,
                                                BlockMethod, const BlockOptions&, double*,
                                                SystemStatus*, Pool&, const SolveControl&,
                                                BlockMonitor&, cudaStream_t);
template absl::StatusOr<SolveInfo> SweepsDevice(const BlockTridiagonalProblem<float>&,
                                                BlockMethod, const BlockOptions&, float*,
                                                SystemStatus*, Pool&, const SolveControl&,
                                                BlockMonitor&, cudaStream_t);

}  // namespace trisolve::cuda
