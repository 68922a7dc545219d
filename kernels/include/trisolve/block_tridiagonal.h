// Block-tridiagonal systems of 2D parabolic (hemodynamics) problems, named as in the thesis:
// N block rows of order M; block row i reads
//   A_i Y_{i-1} + C_i Y_i + B_i Y_{i+1} = F_i,
// C_i tridiagonal (aC sub, cC main, bC super diagonal), A_i = diag(cA[i]), B_i = diag(cB[i]).
// Every array is N x M, row-major (block row i, element k at i * M + k).
#pragma once

#include "absl/strings/string_view.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trisolve/host_device.h"
#include "trisolve/types.h"

namespace trisolve {

// kCg: conjugate gradients preconditioned by the block-row line solves (C_i z_i = r_i), for
// symmetric systems (C_i symmetric, B_i = A_{i+1}) whose blocks C_i are positive definite.
// kMultigridCg: conjugate gradients preconditioned by one multigrid V-cycle on the 5-point
// grid the system is (cell (i, k) coupled to k +- 1 by aC/bC and to i -+ 1 by cA/cB): 2 x 2
// aggregates, piecewise-constant interpolation and its transpose as restriction, Galerkin
// coarse matrices (5-point again), one red-black point Gauss-Seidel sweep before and after
// the coarse correction (red then black, black then red: a symmetric preconditioner), down to
// at most kMgCoarsest cells, solved by kMgCoarseSweeps sweeps forward and backward. The coarse
// correction is doubled (kMgCorrection): piecewise-constant interpolation underestimates
// smooth errors by about that factor, and with it the iterations to 1e-10 on the thesis'
// experiment 2 stay at 12-13 from 128 x 128 to 1024 x 1024 (31 -> 60+ without). Any factor
// keeps the preconditioner symmetric positive definite. For symmetric positive definite
// systems.
// Either sign: cg and multigrid-cg solve a symmetric NEGATIVE definite system (every
// diagonal negative, on every multigrid level) as CG on -A with the preconditioner negated,
// which changes no iterate -- only the definiteness tests -- and say so: "multigrid-cg
// (negated: negative definite)". On a matrix whose diagonals have both signs they do not run
// ("(not run: not definite: ...)", NOT_CONVERGED, y the initial guess); where CG meets
// indefiniteness it stops ("(stopped: indefinite)", NOT_CONVERGED unless within tol).
// kAuto: multigrid-cg when a tolerance is asked and the system is symmetric; otherwise
// gauss-seidel on the CPU, red-black on the GPU. Where CG cannot run or meets indefiniteness,
// or the line solves cannot run (a singular C_i), auto goes on with BiCGStab, preconditioned
// by the V-cycle where every level's diagonals share a sign, else by the line solves
// ("bicgstab+lines") where no C_i is singular, else by nothing ("bicgstab"), and the method
// says why: "multigrid-cg -> multigrid-bicgstab (indefinite)". (The CUDA backend runs that
// fallback on the host: "... (host)".)
// kMultigridBicgstab: BiCGStab right-preconditioned by the same V-cycle, for systems that are
// not symmetric or not definite (two V-cycles an iteration; the point smoother needs nonzero
// diagonals on every level, else "(not run: ...)").
// SINGULAR from the Krylov methods and auto only where a row of A is zero (singular to working
// precision); the thesis' line methods by name report a vanished line pivot as SINGULAR.
enum class BlockMethod : uint8_t {
  kAuto,
  kGaussSeidel,
  kRedBlack,
  kJacobi,
  kCg,
  kMultigridCg,
  kMultigridBicgstab
};
constexpr int64_t kMgCoarsest = 256;
constexpr int kMgCoarseSweeps = 32;
constexpr double kMgCorrection = 2.0;
absl::StatusOr<BlockMethod> ParseBlockMethod(absl::string_view name);
absl::string_view MethodName(BlockMethod m);

template <typename T>
struct BlockTridiagonalProblem {
  int64_t N = 0;  // block rows
  int64_t M = 0;  // order of each block
  const T* aC = nullptr;
  const T* cC = nullptr;
  const T* bC = nullptr;
  const T* cA = nullptr;
  const T* cB = nullptr;
  const T* f = nullptr;
  const T* y0 = nullptr;  // initial guess; nullptr means zero
};

struct BlockOptions {
  int64_t max_iterations = 1000;  // L
  double tol = 0;                 // on ||f - A y||_2 / ||f||_2; 0: run exactly L sweeps
  bool scale_rows = false;        // the thesis' Jacobi row scaling before iterating
};

// The line iterations (gauss-seidel, red-black, jacobi) stop at once, DIVERGED, when the
// relative residual is not finite or has grown past kBlockDivergedGrowth times the initial one
// (at least 1): a residual 1e8 times the right-hand side's is no iterate on its way anywhere,
// and running the sweeps left (up to 10^8 of them) only burns the slot. Checked after every
// sweep with a tolerance (the residual is computed anyway), every kBlockDivergenceCheckSweeps
// sweeps without one (tol = 0, the thesis' fixed sweep counts: one residual pass per 64
// sweeps on the host; the CUDA backend, where each check synchronises its stream, every 1024).
inline constexpr double kBlockDivergedGrowth = 1e8;
inline constexpr int64_t kBlockDivergenceCheckSweeps = 64;
inline bool BlockResidualDiverged(double residual, double initial_residual) {
  const double base = initial_residual > 1 ? initial_residual : 1;
  return !(residual <= kBlockDivergedGrowth * base);  // NaN and Inf included
}

template <typename T>
struct BlockOutput {
  T* y = nullptr;                  // N * M
  SystemStatus* status = nullptr;  // one value: the system's status
};

// The block solvers' progress and residual history (SolveControl::progress, history_limit),
// fed where a method already knows its relative residual: the Krylov methods every iteration
// (the recursively updated residual, on the GPU read back by the dot product the iteration
// needs anyway), the line iterations at their checks (every sweep with a tolerance, every
// kBlockDivergenceCheckSweeps -- 1024 on the GPU -- without). The history keeps at most
// history_limit points (at least 2): when full it drops every other point and records every
// other check from then on, so it spans the whole solve at an even stride; Finish ends it with
// the reported (iterations, true residual). `offset` counts the iterations an earlier method
// ran (auto's fallbacks continue the count).
class BlockMonitor {
 public:
  explicit BlockMonitor(const SolveControl& control)
      : progress_(control.progress ? &control.progress : nullptr),
        limit_(control.history_limit > 0 ? std::max<int64_t>(control.history_limit, 2) : 0) {}
  bool active() const { return progress_ != nullptr || limit_ > 0; }
  void set_offset(int64_t offset) { offset_ = offset; }
  void Check(int64_t iteration, double residual) {
    iteration += offset_;
    if (progress_) (*progress_)(iteration, residual);
    if (limit_ == 0) return;
    if (!points_.empty() && points_.back().iteration >= iteration) {
      points_.back().residual = residual;  // the same iteration seen again (a restart)
      return;
    }
    const int64_t check = checks_++;
    if (check % stride_ != 0) return;
    if (int64_t(points_.size()) >= limit_ - 1) {  // keep one place for Finish's point
      // The points are the checks 0, stride, 2 stride, ...: keep those at multiples of twice.
      size_t kept = 0;
      for (size_t i = 0; i < points_.size(); i += 2) points_[kept++] = points_[i];
      points_.resize(kept);
      stride_ *= 2;
      if (check % stride_ != 0) return;
    }
    points_.push_back({iteration, residual});
  }
  void Finish(SolveInfo* info) {
    if (limit_ == 0) return;
    while (!points_.empty() && points_.back().iteration >= info->iterations) points_.pop_back();
    points_.push_back({info->iterations, info->residual});
    info->residual_history = std::move(points_);
    points_.clear();
  }

 private:
  const std::function<void(int64_t, double)>* progress_;
  int64_t limit_;
  int64_t offset_ = 0, checks_ = 0, stride_ = 1;
  std::vector<ResidualPoint> points_;
};

// Whether the system is symmetric to rounding: aC[i][k+1] = bC[i][k], cA[i+1][k] = cB[i][k].
template <typename T>
bool IsSymmetric(const BlockTridiagonalProblem<T>& p);
// IsSymmetric's test of one pair of couplings, which the device's (cuda::IsSymmetricDevice)
// shares: equal to 64 units of roundoff of the larger; NaN never is.
template <typename T>
TRISOLVE_HD inline bool SymmetricPair(T u, T v) {
  return std::abs(u - v) <=
         T(64) * std::numeric_limits<T>::epsilon() * std::max(std::abs(u), std::abs(v));
}

// ||f - A y||_2 / ||f||_2 (||f - A y||_2 when f = 0), in double precision.
template <typename T>
double BlockRelativeResidual(const BlockTridiagonalProblem<T>& p, const T* y);

}  // namespace trisolve
