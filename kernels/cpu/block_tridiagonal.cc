// CPU reference for the hemodynamics block-tridiagonal systems: the thesis' implicit block
// iterations. Each block row solves C_i Y_i = F_i - A_i Y_{i-1} - B_i Y_{i+1} by the Thomas
// algorithm written as the thesis writes it (alpha/beta sweep), so that fixed-L results match
// a transcription of its loops.
#include "trisolve/block_tridiagonal.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "block_multigrid.h"
#include "block_steps.h"
#include "common.h"
#include "trisolve/driver/block_krylov.h"
#include "trisolve/reference/block_tridiagonal.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace cpu {
namespace {

// The thesis' прогонка on one block row: a sub, c main, b super diagonal; rhs -> x.
// alpha, beta need M + 1 values.
template <typename T>
void ThesisThomas(int64_t M, const T* a, const T* c, const T* b, const T* rhs, T* x,
                  T* alpha, T* beta) {
  if (M == 1) {
    x[0] = rhs[0] / c[0];
    return;
  }
  T gamma = c[0];
  alpha[1] = -b[0] / gamma;
  beta[1] = rhs[0] / gamma;
  for (int64_t k = 1; k < M - 1; ++k) {
    gamma = c[k] + a[k] * alpha[k];
    alpha[k + 1] = -b[k] / gamma;
    beta[k + 1] = (rhs[k] - a[k] * beta[k]) / gamma;
  }
  gamma = c[M - 1] + a[M - 1] * alpha[M - 1];
  beta[M] = (rhs[M - 1] - a[M - 1] * beta[M - 1]) / gamma;
  x[M - 1] = beta[M];
  for (int64_t k = M - 2; k >= 0; --k) x[k] = alpha[k + 1] * x[k + 1] + beta[k + 1];
}

// Whether any C_i meets a vanishing pivot in the Thomas sweep (the pivots depend on C_i
// alone, so one pass before iterating tells).
template <typename T>
bool AnyLineSingular(const BlockTridiagonalProblem<T>& p) {
  bool singular = false;
#pragma omp parallel for schedule(static) reduction(|| : singular)
  for (int64_t i = 0; i < p.N; ++i) {
    const T* a = p.aC + i * p.M;
    const T* c = p.cC + i * p.M;
    const T* b = p.bC + i * p.M;
    T alpha = T(0);
    for (int64_t k = 0; k < p.M && !singular; ++k) {
      const T t = k > 0 ? a[k] * alpha : T(0);
      const T gamma = c[k] + t;
      if (PivotVanishes(gamma, std::abs(c[k]) + std::abs(t))) {
        singular = true;
        break;
      }
      alpha = -b[k] / gamma;
    }
  }
  return singular;
}

template <typename T>
struct LineWork {
  explicit LineWork(int64_t M) : phi(M), tmp(M), alpha(M + 1), beta(M + 1) {}
  std::vector<T> phi, tmp, alpha, beta;
};

// Solves block row i against the neighbours in `yin`, writing the row into `yout`.
template <typename T>
void UpdateRow(const BlockTridiagonalProblem<T>& p, int64_t i, const T* yin, T* yout,
               LineWork<T>& w) {
  const int64_t M = p.M, off = i * M;
  for (int64_t k = 0; k < M; ++k) {
    T phi = p.f[off + k];
    if (i > 0) phi -= p.cA[off + k] * yin[off - M + k];
    if (i < p.N - 1) phi -= p.cB[off + k] * yin[off + M + k];
    w.phi[k] = phi;
  }
  ThesisThomas(M, p.aC + off, p.cC + off, p.bC + off, w.phi.data(), w.tmp.data(),
               w.alpha.data(), w.beta.data());
  std::copy(w.tmp.begin(), w.tmp.end(), yout + off);
}

template <typename T>
int FineDiagonalSign(const BlockTridiagonalProblem<T>& p) {
  bool pos = true, neg = true;
  for (int64_t e = 0; e < p.N * p.M; ++e) {
    pos &= p.cC[e] > T(0) && std::isfinite(p.cC[e]);
    neg &= p.cC[e] < T(0) && std::isfinite(p.cC[e]);
  }
  return pos ? 1 : neg ? -1 : 0;
}

// A row of A with no nonzero entry: the matrix is singular (exactly), whatever the method.
template <typename T>
bool AnyZeroRow(const BlockTridiagonalProblem<T>& p) {
  const int64_t N = p.N, M = p.M;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      if (p.cC[e] == T(0) && (k == 0 || p.aC[e] == T(0)) && (k + 1 == M || p.bC[e] == T(0)) &&
          (i == 0 || p.cA[e] == T(0)) && (i + 1 == N || p.cB[e] == T(0)))
        return true;
    }
  return false;
}

// The multigrid hierarchy and its diagonals' tests (DiagonalSign, MgDiagonalsNonzero).
template <typename T>
struct MgSetup {
  std::vector<MgLevel<T>> levels;
  int sign = 0;
  bool nonzero = false;
};
// The line solves' factors, where every line factored (ok).
template <typename T>
struct KeptLines {
  bool ok = false;
  LineFactors<T> f;
};

}  // namespace

// Each member is set where it was built: a solve builds what is missing (SetupOf).
template <typename T>
struct BlockSetup {
  std::optional<bool> symmetric;             // IsSymmetric: auto's choice
  std::optional<bool> zero_row;              // AnyZeroRow
  std::optional<bool> lines_singular;        // AnyLineSingular of the arrays as given
  std::optional<bool> sweep_lines_singular;  // the same of the sweeps' (rows scaled or not)
  std::optional<int> fine_sign;              // FineDiagonalSign: cg's
  std::optional<MgSetup<T>> multigrid;
  std::optional<KeptLines<T>> lines;
};

namespace {

// A solve's setup: the kept one's parts where present, the rest built here at the first use
// (once a solve: auto's fall-backs test the hierarchy and then precondition with it). The
// kept parts are only read.
template <typename T>
class SetupOf {
 public:
  SetupOf(const BlockTridiagonalProblem<T>& p, const BlockSetup<T>* kept) : p_(p), kept_(kept) {}
  bool Symmetric() {
    return Get(&BlockSetup<T>::symmetric, [&] { return IsSymmetric(p_); });
  }
  bool ZeroRow() {
    return Get(&BlockSetup<T>::zero_row, [&] { return AnyZeroRow(p_); });
  }
  bool LinesSingular() {
    return Get(&BlockSetup<T>::lines_singular, [&] { return AnyLineSingular(p_); });
  }
  // q: the arrays the sweeps run on (p's rows scaled where the options ask).
  bool SweepLinesSingular(const BlockTridiagonalProblem<T>& q) {
    return Get(&BlockSetup<T>::sweep_lines_singular, [&] { return AnyLineSingular(q); });
  }
  int FineSign() {
    return Get(&BlockSetup<T>::fine_sign, [&] { return FineDiagonalSign(p_); });
  }
  const MgSetup<T>& Multigrid() {
    return Get(&BlockSetup<T>::multigrid, [&] {
      MgSetup<T> m;
      m.levels = BuildMultigrid(p_);
      m.sign = DiagonalSign(m.levels);
      m.nonzero = MgDiagonalsNonzero(m.levels);
      return m;
    });
  }
  // nullptr where a line's pivot vanishes (the line solves then eliminate as they go).
  const LineFactors<T>* Lines() {
    const KeptLines<T>& l = Get(&BlockSetup<T>::lines, [&] {
      KeptLines<T> k;
      k.ok = FactorLines(p_, k.f);
      if (!k.ok) k.f = {};
      return k;
    });
    return l.ok ? &l.f : nullptr;
  }
  // What was built here, for a prepared system to keep.
  BlockSetup<T> Built() && { return std::move(own_); }

 private:
  template <typename V, typename F>
  const V& Get(std::optional<V> BlockSetup<T>::*member, F build) {
    if (kept_ != nullptr && (kept_->*member).has_value()) return *(kept_->*member);
    if (!(own_.*member).has_value()) own_.*member = build();
    return *(own_.*member);
  }
  const BlockTridiagonalProblem<T>& p_;
  const BlockSetup<T>* kept_;
  BlockSetup<T> own_;
};

// CG preconditioned by the line solves (levels null; their factors `lines` where kept) or the
// V-cycle of `levels`; sign: the diagonals' (driver::Cg).
template <typename T>
absl::StatusOr<driver::KrylovResult> BlockCg(const BlockTridiagonalProblem<T>& p,
                                             const BlockOptions& o, T* y,
                                             const SolveControl& control, BlockMonitor& mon,
                                             const std::vector<MgLevel<T>>* levels,
                                             const LineFactors<T>* lines, int sign) {
  const size_t size = size_t(p.N * p.M);
  std::vector<T> r(size), z(size), d(size), q(size);
  CpuSteps<T> steps(p, levels ? Precond::kVCycle : Precond::kLines, levels, lines);
  return driver::Cg(steps, driver::CgVectors<T>{r.data(), z.data(), d.data(), q.data()}, y, o,
                    sign, levels ? "multigrid-cg" : "cg", control, mon);
}

// BiCGStab preconditioned by `kind` (driver::Bicgstab; levels for the V-cycle, lines the
// line solves' factors where kept); the caller checks that it can run (nonzero diagonals on
// every level, nonsingular lines).
template <typename T>
absl::StatusOr<driver::KrylovResult> BlockBicgstab(const BlockTridiagonalProblem<T>& p,
                                                   const BlockOptions& o, T* y,
                                                   const SolveControl& control,
                                                   BlockMonitor& mon, Precond kind,
                                                   int64_t max_iterations,
                                                   const std::vector<MgLevel<T>>* levels,
                                                   const LineFactors<T>* lines) {
  const size_t size = size_t(p.N * p.M);
  std::vector<T> work(8 * size);
  CpuSteps<T> steps(p, kind, kind == Precond::kVCycle ? levels : nullptr,
                    kind == Precond::kLines ? lines : nullptr);
  T* w = work.data();
  driver::BicgstabVectors<T> v{w,            w + size,     w + 2 * size, w + 3 * size,
                               w + 4 * size, w + 5 * size, w + 6 * size, w + 7 * size};
  return driver::Bicgstab(steps, v, y, o, max_iterations, BicgstabName(kind), control, mon);
}

// The answer of a method that could not run (stopped: NOT_CONVERGED unless y is already within
// the tolerance): the true residual of y and the status, by driver::Finish.
template <typename T>
SolveInfo Finish(const BlockTridiagonalProblem<T>& p, const BlockOptions& o, std::string method,
                 T* y, SystemStatus* status, bool stopped) {
  CpuSteps<T> steps(p, Precond::kNone, nullptr);
  auto r = driver::Finish(steps, y, std::move(method), 0, o.tol, stopped);
  *status = r->status;  // the CPU steps report no error
  return r->info;
}

// auto's fallback where CG cannot run or meets indefiniteness, or the thesis' line iterations
// cannot run: BiCGStab, which needs neither symmetry nor definiteness, from y, preconditioned
// by the V-cycle where every level's diagonals share a sign, else by the line solves where no
// line is singular, else by nothing.
template <typename T>
absl::StatusOr<SolveInfo> BicgstabFallback(const BlockTridiagonalProblem<T>& p,
                                           const BlockOptions& o, T* y, SystemStatus* status,
                                           const SolveControl& control, BlockMonitor& mon,
                                           int64_t max_iterations, SetupOf<T>& setup) {
  Precond kind = Precond::kNone;
  if (setup.Multigrid().sign != 0)
    kind = Precond::kVCycle;
  else if (!setup.LinesSingular())
    kind = Precond::kLines;
  auto r = BlockBicgstab(p, o, y, control, mon, kind, max_iterations, &setup.Multigrid().levels,
                         kind == Precond::kLines ? setup.Lines() : nullptr);
  if (!r.ok()) return r.status();
  *status = r->status;
  return r->info;
}

}  // namespace
}  // namespace cpu

template <typename T>
bool IsSymmetric(const BlockTridiagonalProblem<T>& p) {
  const int64_t N = p.N, M = p.M;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      if (k + 1 < M && !SymmetricPair(p.aC[e + 1], p.bC[e])) return false;
      if (i + 1 < N && !SymmetricPair(p.cA[e + M], p.cB[e])) return false;
    }
  return true;
}
template bool IsSymmetric(const BlockTridiagonalProblem<double>&);
template bool IsSymmetric(const BlockTridiagonalProblem<float>&);

namespace cpu {

namespace {

// A zero row of A: SINGULAR (to working precision, whatever the method), y zero.
template <typename T>
SolveInfo ZeroRowAnswer(const BlockTridiagonalProblem<T>& p, std::string method,
                        BlockOutput<T> out) {
  std::fill(out.y, out.y + p.N * p.M, T(0));
  out.status[0] = SystemStatus::kSingular;
  SolveInfo info;
  info.method = std::move(method) + " (a row of A is zero)";
  info.iterations = 0;
  info.residual = BlockRelativeResidual(p, out.y);
  return info;
}

// The method's setup comes from `setup` (SetupOf: kept, or built at its first use).
template <typename T>
absl::StatusOr<SolveInfo> SolveBlock(const BlockTridiagonalProblem<T>& p0, BlockMethod method,
                                     const BlockOptions& options, BlockOutput<T> out,
                                     const SolveControl& control, BlockMonitor& mon,
                                     SetupOf<T>& setup) {
  const int64_t N = p0.N, M = p0.M, size = N * M;
  const bool automatic = method == BlockMethod::kAuto;
  if (automatic)
    method = options.tol > 0 && setup.Symmetric() ? BlockMethod::kMultigridCg
                                                   : BlockMethod::kGaussSeidel;
  auto start = [&] {
    if (p0.y0)
      std::copy(p0.y0, p0.y0 + size, out.y);
    else
      std::fill(out.y, out.y + size, T(0));
  };
  // A method that cannot run on this matrix (not definite for CG, a zero diagonal for the
  // point smoother, a singular line for the line solves): NOT_CONVERGED with the initial guess
  // and the reason -- the matrix may well be nonsingular, so never SINGULAR.
  auto not_run = [&](std::string why) {
    start();
    return Finish(p0, options, std::string(MethodName(method)) + " (not run: " + why + ")",
                  out.y, out.status, true);
  };
  // auto's fallback (BicgstabFallback) from y; `before`: what ran or was skipped.
  auto fallback = [&](const std::string& before, const std::string& why,
                      int64_t used) -> absl::StatusOr<SolveInfo> {
    if (!AllFinite(size, 1, out.y)) start();
    mon.set_offset(used);
    auto info = BicgstabFallback(p0, options, out.y, out.status, control, mon,
                                 std::max<int64_t>(options.max_iterations - used, 1), setup);
    if (!info.ok()) return info;
    info->method = before + " -> " + info->method + " (" + why + ")";
    info->iterations += used;
    return info;
  };
  if (method == BlockMethod::kCg || method == BlockMethod::kMultigridCg ||
      method == BlockMethod::kMultigridBicgstab) {
    // The line preconditioner already holds the diagonal: the row scaling (which would break
    // the symmetry CG needs) is not applied.
    if (setup.ZeroRow())  // singular to working precision whatever the method
      return ZeroRowAnswer(p0, std::string(MethodName(method)), out);
    start();
    if (method == BlockMethod::kMultigridBicgstab) {
      if (!setup.Multigrid().nonzero) return not_run("a zero diagonal on a multigrid level");
      auto r = BlockBicgstab(p0, options, out.y, control, mon, Precond::kVCycle,
                             options.max_iterations, &setup.Multigrid().levels,
                             static_cast<const LineFactors<T>*>(nullptr));
      if (!r.ok()) return r.status();
      out.status[0] = r->status;
      return r->info;
    }
    const bool multigrid = method == BlockMethod::kMultigridCg;
    const int sign = multigrid ? setup.Multigrid().sign : setup.FineSign();
    const char* why = "not definite: diagonals of both signs";
    // (auto never runs cg by name: it picks multigrid-cg.)
    if (!multigrid && sign != 0 && setup.LinesSingular())
      return not_run("a line block is singular");
    if (sign == 0) {
      if (!automatic) return not_run(why);
      return fallback(std::string(MethodName(method)) + " skipped", why, 0);
    }
    auto r = BlockCg(p0, options, out.y, control, mon,
                     multigrid ? &setup.Multigrid().levels : nullptr,
                     multigrid ? nullptr : setup.Lines(), sign);
    if (!r.ok()) return r.status();
    out.status[0] = r->status;
    if (automatic && r->indefinite)
      return fallback(std::string(MethodName(method)) + (sign < 0 ? " (negated)" : ""),
                      "indefinite", r->info.iterations);
    return r->info;
  }
  SolveInfo info;
  info.method = std::string(MethodName(method));

  // The thesis' Jacobi row scaling: each scalar row divided by its diagonal element (rows
  // whose diagonal is below 1e-16 in magnitude are left as they are, as the thesis does).
  std::vector<T> scaled;
  BlockTridiagonalProblem<T> p = p0;
  if (options.scale_rows) {
    scaled.resize(static_cast<size_t>(6 * size));
    T *aC = scaled.data(), *cC = aC + size, *bC = cC + size, *cA = bC + size,
      *cB = cA + size, *f = cB + size;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size; ++e) {
      const T diag = p0.cC[e];
      const bool keep = std::abs(diag) < T(1e-16);
      aC[e] = keep ? p0.aC[e] : p0.aC[e] / diag;
      bC[e] = keep ? p0.bC[e] : p0.bC[e] / diag;
      cA[e] = keep ? p0.cA[e] : p0.cA[e] / diag;
      cB[e] = keep ? p0.cB[e] : p0.cB[e] / diag;
      f[e] = keep ? p0.f[e] : p0.f[e] / diag;
      cC[e] = keep ? diag : T(1);
    }
    p.aC = aC;
    p.cC = cC;
    p.bC = bC;
    p.cA = cA;
    p.cB = cB;
    p.f = f;
    info.method += "+scaled";
  }

  T* y = out.y;
  if (setup.SweepLinesSingular(p)) {
    if (automatic) {  // the thesis' line solves cannot run; the matrix may be nonsingular
      if (setup.ZeroRow()) {  // (the residual left unset, NaN: as the Krylov paths it is not)
        std::fill(y, y + size, T(0));
        out.status[0] = SystemStatus::kSingular;
        info.method += " (a row of A is zero)";
        return info;
      }
      start();
      return fallback(info.method + " skipped", "a line block is singular", 0);
    }
    std::fill(y, y + size, T(0));
    out.status[0] = SystemStatus::kSingular;
    return info;
  }
  if (p0.y0)
    std::copy(p0.y0, p0.y0 + size, y);
  else
    std::fill(y, y + size, T(0));

  std::vector<T> yalt;
  if (method == BlockMethod::kJacobi) yalt.resize(size);
  const int64_t L = options.max_iterations;
  double residual = BlockRelativeResidual(p0, y);
  const double initial_residual = residual;
  mon.Check(0, residual);
  bool diverged = false;
  int64_t it = 0;
  for (; it < L && !diverged; ++it) {
    if (options.tol > 0 && residual <= options.tol) break;
    if (control.Cancelled()) return absl::CancelledError("solve cancelled");
    switch (method) {
      case BlockMethod::kGaussSeidel: {
        // Lexicographic: row i sees the new Y_{i-1} and the old Y_{i+1}.
        LineWork<T> w(M);
        for (int64_t i = 0; i < N; ++i) UpdateRow(p, i, y, y, w);
        break;
      }
      case BlockMethod::kRedBlack: {
        // The thesis' CUDA ordering: rows 0, 2, 4, ... (updateOdd), then 1, 3, 5, ...
        for (int64_t colour = 0; colour < 2; ++colour) {
#pragma omp parallel
          {
            LineWork<T> w(M);
#pragma omp for schedule(static)
            for (int64_t i = colour; i < N; i += 2) UpdateRow(p, i, y, y, w);
          }
        }
        break;
      }
      case BlockMethod::kJacobi: {
#pragma omp parallel
        {
          LineWork<T> w(M);
#pragma omp for schedule(static)
          for (int64_t i = 0; i < N; ++i) UpdateRow(p, i, y, yalt.data(), w);
        }
        std::copy(yalt.begin(), yalt.end(), y);
        break;
      }
      case BlockMethod::kAuto:
      case BlockMethod::kCg:  // handled above
      case BlockMethod::kMultigridCg:
      case BlockMethod::kMultigridBicgstab:
        break;
    }
    if (options.tol > 0 || (it + 1) % kBlockDivergenceCheckSweeps == 0) {
      residual = BlockRelativeResidual(p0, y);
      diverged = BlockResidualDiverged(residual, initial_residual);
      mon.Check(it + 1, residual);
    }
  }
  if (options.tol <= 0 && !diverged) residual = BlockRelativeResidual(p0, y);
  info.iterations = it;
  info.residual = residual;
  if (diverged) info.method += " (stopped: diverged)";
  if (diverged || !std::isfinite(residual) || !AllFinite(size, 1, y)) {
    std::fill(y, y + size, T(0));
    out.status[0] = SystemStatus::kDiverged;
  } else if (options.tol > 0 && residual > options.tol) {
    out.status[0] = SystemStatus::kNotConverged;
  } else {
    out.status[0] = SystemStatus::kOk;
  }
  return info;
}

template <typename T>
absl::StatusOr<SolveInfo> BlockIndefinite(const BlockTridiagonalProblem<T>& p,
                                          const BlockOptions& options, BlockOutput<T> out,
                                          const SolveControl& control, BlockMonitor& mon) {
  SetupOf<T> setup(p, nullptr);
  if (setup.ZeroRow()) return ZeroRowAnswer(p, "bicgstab", out);
  const int64_t size = p.N * p.M;
  if (p.y0)
    std::copy(p.y0, p.y0 + size, out.y);
  else
    std::fill(out.y, out.y + size, T(0));
  return BicgstabFallback(p, options, out.y, out.status, control, mon, options.max_iterations,
                          setup);
}

}  // namespace

template <typename T>
absl::StatusOr<SolveInfo> SolveBlockTridiagonal(const BlockTridiagonalProblem<T>& p,
                                                BlockMethod method, const BlockOptions& options,
                                                BlockOutput<T> out, const SolveControl& control,
                                                const BlockSetup<T>* kept) {
  BlockMonitor mon(control);
  SetupOf<T> setup(p, kept);
  auto info = SolveBlock(p, method, options, out, control, mon, setup);
  if (info.ok()) mon.Finish(&*info);
  return info;
}

// Builds what SolveBlock would ask `setup` for on this matrix, whatever the right-hand side
// (the paths that depend on it -- CG meeting indefiniteness, auto's fall-backs -- included):
// its steps, in its order.
template <typename T>
std::shared_ptr<const BlockSetup<T>> PrepareBlock(const BlockTridiagonalProblem<T>& p,
                                                  BlockMethod method,
                                                  const BlockOptions& options) {
  SetupOf<T> setup(p, nullptr);
  const bool automatic = method == BlockMethod::kAuto;
  if (automatic)
    method = options.tol > 0 && setup.Symmetric() ? BlockMethod::kMultigridCg
                                                  : BlockMethod::kGaussSeidel;
  // auto's fall-back (BicgstabFallback): the hierarchy, else the line solves.
  auto fallback = [&] {
    if (setup.Multigrid().sign == 0 && !setup.LinesSingular()) setup.Lines();
  };
  if (method == BlockMethod::kCg || method == BlockMethod::kMultigridCg ||
      method == BlockMethod::kMultigridBicgstab) {
    if (!setup.ZeroRow()) {
      if (method == BlockMethod::kMultigridBicgstab) {
        setup.Multigrid();
      } else if (method == BlockMethod::kMultigridCg) {
        if (automatic) fallback();  // (CG may meet indefiniteness with either sign)
        setup.Multigrid();
      } else if (setup.FineSign() != 0 && !setup.LinesSingular()) {
        setup.Lines();
      }
    }
  } else if (!options.scale_rows) {  // the sweeps' test on scaled rows is left to each solve
    if (setup.SweepLinesSingular(p) && automatic && !setup.ZeroRow()) fallback();
  }
  return std::make_shared<const BlockSetup<T>>(std::move(setup).Built());
}

template <typename T>
int64_t BlockSetupBytes(const BlockSetup<T>& s) {
  int64_t values = 0;
  if (s.multigrid)
    for (const auto& l : s.multigrid->levels) values += 5 * l.N * l.M;
  if (s.lines) values += int64_t(s.lines->f.inv.size() + s.lines->f.cp.size());
  return values * int64_t(sizeof(T)) + int64_t(sizeof(BlockSetup<T>));
}

template <typename T>
std::string DescribeBlockSetup(const BlockSetup<T>& s) {
  std::vector<std::string> parts;
  if (s.multigrid)
    parts.push_back("multigrid hierarchy (" + std::to_string(s.multigrid->levels.size()) +
                    " levels)");
  if (s.lines && s.lines->ok) parts.push_back("line factors");
  if (s.symmetric) parts.push_back(*s.symmetric ? "symmetric" : "not symmetric");
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

#define TRISOLVE_BLOCK_SETUP(T)                                                           \
  template std::shared_ptr<const BlockSetup<T>> PrepareBlock(                             \
      const BlockTridiagonalProblem<T>&, BlockMethod, const BlockOptions&);               \
  template int64_t BlockSetupBytes(const BlockSetup<T>&);                                 \
  template std::string DescribeBlockSetup(const BlockSetup<T>&);
TRISOLVE_BLOCK_SETUP(double)
TRISOLVE_BLOCK_SETUP(float)
#undef TRISOLVE_BLOCK_SETUP

template <typename T>
absl::StatusOr<SolveInfo> SolveBlockIndefinite(const BlockTridiagonalProblem<T>& p,
                                               const BlockOptions& options, BlockOutput<T> out,
                                               const SolveControl& control) {
  BlockMonitor mon(control);
  auto info = BlockIndefinite(p, options, out, control, mon);
  if (info.ok()) mon.Finish(&*info);
  return info;
}

template absl::StatusOr<SolveInfo> SolveBlockIndefinite(const BlockTridiagonalProblem<double>&,
                                                        const BlockOptions&, BlockOutput<double>,
                                                        const SolveControl&);
template absl::StatusOr<SolveInfo> SolveBlockIndefinite(const BlockTridiagonalProblem<float>&,
                                                        const BlockOptions&, BlockOutput<float>,
                                                        const SolveControl&);
template absl::StatusOr<SolveInfo> SolveBlockTridiagonal(
    const BlockTridiagonalProblem<double>&, BlockMethod, const BlockOptions&,
    BlockOutput<double>, const SolveControl&, const BlockSetup<double>*);
template absl::StatusOr<SolveInfo> SolveBlockTridiagonal(
    const BlockTridiagonalProblem<float>&, BlockMethod, const BlockOptions&,
    BlockOutput<float>, const SolveControl&, const BlockSetup<float>*);

}  // namespace cpu

template <typename T>
double BlockRelativeResidual(const BlockTridiagonalProblem<T>& p, const T* y) {
  const int64_t N = p.N, M = p.M;
  // Rows in chunks of about 16384 values, added in order (cpu::OrderedSum: the same bits every
  // run).
  const int64_t rows = 16384 / std::max<int64_t>(M, 1);
  const auto sums = cpu::OrderedSum<2>(N, rows, [&](int64_t i, std::array<double, 2>& s) {
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      double ay = double(p.cC[e]) * y[e];
      if (k > 0) ay += double(p.aC[e]) * y[e - 1];
      if (k + 1 < M) ay += double(p.bC[e]) * y[e + 1];
      if (i > 0) ay += double(p.cA[e]) * y[e - M];
      if (i + 1 < N) ay += double(p.cB[e]) * y[e + M];
      const double r = double(p.f[e]) - ay;
      s[0] += r * r;
      s[1] += double(p.f[e]) * double(p.f[e]);
    }
  });
  const double rr = sums[0], ff = sums[1];
  return ff > 0 ? std::sqrt(rr / ff) : std::sqrt(rr);
}
template double BlockRelativeResidual(const BlockTridiagonalProblem<double>&,
                                      const double*);
template double BlockRelativeResidual(const BlockTridiagonalProblem<float>&, const float*);

}  // namespace trisolve
