// The block family's Krylov iterations, written once: conjugate gradients and BiCGStab (each
// with whatever preconditioner the backend applies: the line solves, the multigrid V-cycle or
// nothing), their progress and residual history (BlockMonitor) and the final status, as
// templates over a backend's step kernels. The CPU reference (cpu/block_tridiagonal.cc) and the
// CUDA backend (cuda/block/krylov.cu) each implement the steps; a fix to an iteration lands here.
//
// Steps (T the element type; every vector holds N * M values, natural layout; each returns
// absl::Status, or absl::StatusOr as shown, for the errors a device may report):
//   const T* rhs()                           f
//   Residual(y, r)                           r = f - A y
//   Apply(v, out)                            out = A v
//   StatusOr<array<double, 2>> Dots(u, v, w, x)   {(u, v), (w, x)} summed in double, in a fixed
//                                            order; w = nullptr: the second is 0. Two dots a call
//                                            because the device reads both back with one wait.
//   StatusOr<bool> Precondition(in, out)     out = P in; false: P could not be applied (a line's
//                                            pivot vanished)
//   Copy(src, dst), Zero(v)
//   CgStep(alpha, d, q, y, r)                y += alpha d, r -= alpha q
//   CgDirection(beta, z, d)                  d = z + beta d
//   BicgstabDirection(beta, omega, r, v, p)  p = r + beta (p - omega v)
//   BicgstabStep(a, u, in, w, y, out)        y += a u, out = in - a w
//   StatusOr<FinalResidual> Final(y)         the true relative residual from the original
//                                            arrays, and what else the backend knows of y
// Scalars reach the steps as T, rounded from the double recurrences (as both backends always
// did: the iterates are bit for bit those of the loops this replaces).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trisolve/block_tridiagonal.h"

namespace trisolve::driver {

// What a backend reports of the final iterate: ||f - A y|| / ||f|| from the original arrays,
// whether a line solve met a vanished pivot on the way (the preconditioner then produced no
// direction: SINGULAR), and whether y is finite (where the backend checks; a NaN in y shows in
// the residual anyway).
struct FinalResidual {
  double residual = 0;
  bool singular = false;
  bool finite = true;
};

// The status of a Krylov solve from its final residual: SINGULAR where a line pivot vanished,
// DIVERGED where the residual or y is not finite, NOT_CONVERGED where a tolerance was asked (or
// the method stopped early: indefinite, or the preconditioner could not run) and not reached.
inline SystemStatus KrylovStatus(const FinalResidual& f, double tol, bool stopped) {
  if (f.singular) return SystemStatus::kSingular;
  if (!std::isfinite(f.residual) || !f.finite) return SystemStatus::kDiverged;
  if ((tol > 0 || stopped) && !(f.residual <= tol)) return SystemStatus::kNotConverged;
  return SystemStatus::kOk;
}

struct KrylovResult {
  SolveInfo info;
  SystemStatus status = SystemStatus::kOk;
  bool indefinite = false;  // CG: a definiteness test failed and CG stopped there
};

template <typename T>
struct CgVectors {
  T *r, *z, *d, *q;
};
template <typename T>
struct BicgstabVectors {
  T *r, *r0, *p, *v, *yh, *s, *z, *t;
};

#define TRISOLVE_DRIVER_TRY(expr)          \
  do {                                     \
    if (absl::Status st_ = (expr); !st_.ok()) return st_; \
  } while (0)
#define TRISOLVE_DRIVER_ASSIGN(lhs, expr)  \
  do {                                     \
    auto v_ = (expr);                      \
    if (!v_.ok()) return v_.status();      \
    lhs = *std::move(v_);                  \
  } while (0)

// The true residual, the status and the answer; y zeroed for a singular or diverged system.
template <typename T, typename Steps>
absl::StatusOr<KrylovResult> Finish(Steps& s, T* y, std::string method, int64_t iterations,
                                    double tol, bool stopped) {
  KrylovResult out;
  FinalResidual f;
  TRISOLVE_DRIVER_ASSIGN(f, s.Final(y));
  out.info.method = std::move(method);
  out.info.iterations = iterations;
  out.info.residual = f.residual;
  out.status = KrylovStatus(f, tol, stopped);
  if (out.status == SystemStatus::kSingular || out.status == SystemStatus::kDiverged)
    TRISOLVE_DRIVER_TRY(s.Zero(y));
  return out;
}

// Preconditioned conjugate gradients from y (in: the initial guess, out: the iterate). Stops when
// the recursively updated residual reaches o.tol; reports the true one (Final).
// sign = -1: A is negative definite (its diagonals, and every level's, negative). CG runs on
// -A y = -f preconditioned by -P (P the line solves or the V-cycle of A, both negative definite
// then; the V-cycle of -A is -P exactly): r, z, alpha and beta come out the same as the
// recurrences below with (d, Ad) and (r, z) multiplied by sign, so nothing is copied or negated
// -- only the definiteness tests read sign * (d, Ad) > 0 and sign * (r, z) > 0. Where one fails
// (the matrix or the preconditioner is not definite) CG stops, "(stopped: indefinite)", and
// KrylovResult::indefinite says so (auto falls back to BiCGStab).
template <typename T, typename Steps>
absl::StatusOr<KrylovResult> Cg(Steps& s, const CgVectors<T>& v, T* y, const BlockOptions& o,
                                int sign, const char* name, const SolveControl& control,
                                BlockMonitor& mon) {
  std::array<double, 2> h;
  bool applied = true;
  TRISOLVE_DRIVER_TRY(s.Residual(y, v.r));
  TRISOLVE_DRIVER_ASSIGN(applied, s.Precondition(v.r, v.z));
  TRISOLVE_DRIVER_TRY(s.Copy(v.z, v.d));
  TRISOLVE_DRIVER_ASSIGN(h, s.Dots(s.rhs(), s.rhs(), nullptr, nullptr));
  const double scale = h[0] > 0 ? std::sqrt(h[0]) : 1;
  TRISOLVE_DRIVER_ASSIGN(h, s.Dots(v.r, v.r, v.r, v.z));
  double res = std::sqrt(h[0]) / scale, rz = h[1];
  bool indefinite = !(sign * rz > 0) && res > o.tol && res > 0;
  mon.Check(0, res);
  int64_t it = 0;
  for (; it < o.max_iterations && !indefinite && applied; ++it) {
    if (res <= o.tol) break;
    if (control.Cancelled()) return absl::CancelledError("solve cancelled");
    TRISOLVE_DRIVER_TRY(s.Apply(v.d, v.q));
    TRISOLVE_DRIVER_ASSIGN(h, s.Dots(v.d, v.q, nullptr, nullptr));
    if (!(sign * h[0] > 0) || !std::isfinite(h[0])) {  // not definite: stop
      indefinite = true;
      break;
    }
    TRISOLVE_DRIVER_TRY(s.CgStep(T(rz / h[0]), v.d, v.q, y, v.r));
    TRISOLVE_DRIVER_ASSIGN(applied, s.Precondition(v.r, v.z));
    TRISOLVE_DRIVER_ASSIGN(h, s.Dots(v.r, v.r, v.r, v.z));
    res = std::sqrt(h[0]) / scale;
    mon.Check(it + 1, res);
    if (!(sign * h[1] > 0) && res > o.tol && res > 0) {  // the preconditioner is not definite
      indefinite = true;
      ++it;
      break;
    }
    const double beta = h[1] / rz;
    rz = h[1];
    TRISOLVE_DRIVER_TRY(s.CgDirection(T(beta), v.z, v.d));
  }
  std::string method = name;
  if (sign < 0) method += " (negated: negative definite)";
  if (indefinite) method += " (stopped: indefinite)";
  auto out = Finish(s, y, std::move(method), it, o.tol, indefinite || !applied);
  if (out.ok()) out->indefinite = indefinite;
  return out;
}

// BiCGStab (van der Vorst), right-preconditioned (by the V-cycle, the line solves or nothing:
// the caller has checked that its preconditioner can run), from y. Two preconditioner
// applications and two products with A an iteration; stops when the recursively updated
// residual reaches o.tol, or at a breakdown (rho, (r0, v) or omega zero or not finite); reports
// the true residual.
template <typename T, typename Steps>
absl::StatusOr<KrylovResult> Bicgstab(Steps& s, const BicgstabVectors<T>& v, T* y,
                                      const BlockOptions& o, int64_t max_iterations,
                                      const char* name, const SolveControl& control,
                                      BlockMonitor& mon) {
  std::array<double, 2> h;
  TRISOLVE_DRIVER_TRY(s.Residual(y, v.r));
  TRISOLVE_DRIVER_TRY(s.Copy(v.r, v.r0));
  TRISOLVE_DRIVER_TRY(s.Zero(v.p));
  TRISOLVE_DRIVER_TRY(s.Zero(v.v));
  TRISOLVE_DRIVER_ASSIGN(h, s.Dots(s.rhs(), s.rhs(), v.r, v.r));
  const double scale = h[0] > 0 ? std::sqrt(h[0]) : 1;
  double res = std::sqrt(h[1]) / scale;
  double rho = 1, alpha = 1, omega = 1;
  mon.Check(0, res);
  int64_t it = 0;
  for (; it < max_iterations; ++it) {
    if (res <= o.tol) break;
    if (control.Cancelled()) return absl::CancelledError("solve cancelled");
    TRISOLVE_DRIVER_ASSIGN(h, s.Dots(v.r0, v.r, nullptr, nullptr));
    const double rho_new = h[0];
    if (rho_new == 0 || !std::isfinite(rho_new)) break;
    const double beta = (rho_new / rho) * (alpha / omega);
    TRISOLVE_DRIVER_TRY(s.BicgstabDirection(T(beta), T(omega), v.r, v.v, v.p));
    TRISOLVE_DRIVER_TRY(s.Precondition(v.p, v.yh).status());
    TRISOLVE_DRIVER_TRY(s.Apply(v.yh, v.v));
    TRISOLVE_DRIVER_ASSIGN(h, s.Dots(v.r0, v.v, nullptr, nullptr));
    if (h[0] == 0 || !std::isfinite(h[0])) break;
    alpha = rho_new / h[0];
    TRISOLVE_DRIVER_TRY(s.BicgstabStep(T(alpha), v.yh, v.r, v.v, y, v.s));
    TRISOLVE_DRIVER_ASSIGN(h, s.Dots(v.s, v.s, nullptr, nullptr));
    res = std::sqrt(h[0]) / scale;
    if (res <= o.tol) {
      ++it;
      mon.Check(it, res);
      break;
    }
    TRISOLVE_DRIVER_TRY(s.Precondition(v.s, v.z).status());
    TRISOLVE_DRIVER_TRY(s.Apply(v.z, v.t));
    TRISOLVE_DRIVER_ASSIGN(h, s.Dots(v.t, v.t, v.t, v.s));
    omega = h[0] > 0 ? h[1] / h[0] : 0;
    TRISOLVE_DRIVER_TRY(s.BicgstabStep(T(omega), v.z, v.s, v.t, y, v.r));
    TRISOLVE_DRIVER_ASSIGN(h, s.Dots(v.r, v.r, nullptr, nullptr));
    res = std::sqrt(h[0]) / scale;
    mon.Check(it + 1, res);
    rho = rho_new;
    if (omega == 0 || !std::isfinite(omega)) {
      ++it;
      break;
    }
  }
  return Finish(s, y, name, it, o.tol, false);
}

#undef TRISOLVE_DRIVER_TRY
#undef TRISOLVE_DRIVER_ASSIGN

}  // namespace trisolve::driver
