// CPU reference for the hemodynamics block-tridiagonal systems: the thesis' implicit block
// iterations. Each block row solves C_i Y_i = F_i - A_i Y_{i-1} - B_i Y_{i+1} by the Thomas
// algorithm written as the thesis writes it (alpha/beta sweep), so that fixed-L results match
// a transcription of its loops.
#include "trisolve/block_tridiagonal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "common.h"
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

// q = A v (double accumulation, stored in T).
template <typename T>
void ApplyBlock(const BlockTridiagonalProblem<T>& p, const T* v, T* q) {
  const int64_t N = p.N, M = p.M;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      double s = double(p.cC[e]) * v[e];
      if (k > 0) s += double(p.aC[e]) * v[e - 1];
      if (k + 1 < M) s += double(p.bC[e]) * v[e + 1];
      if (i > 0) s += double(p.cA[e]) * v[e - M];
      if (i + 1 < N) s += double(p.cB[e]) * v[e + M];
      q[e] = T(s);
    }
}

template <typename T>
double Dot(int64_t n, const T* a, const T* b) {
  return OrderedSum<1>(n, 16384, [&](int64_t e, std::array<double, 1>& s) {
    s[0] += double(a[e]) * b[e];
  })[0];
}

// One 5-point grid level of the multigrid hierarchy (trisolve/block_tridiagonal.h): couplings
// to the west (k - 1), east (k + 1), north (i - 1) and south (i + 1) neighbours, zero where
// the neighbour does not exist.
template <typename T>
struct MgLevel {
  int64_t N, M;
  std::vector<T> w, c, e, n, s;
};

template <typename T>
std::vector<MgLevel<T>> BuildMultigrid(const BlockTridiagonalProblem<T>& p) {
  std::vector<MgLevel<T>> L;
  MgLevel<T> f{p.N, p.M};
  const int64_t size = p.N * p.M;
  for (auto* v : {&f.w, &f.c, &f.e, &f.n, &f.s}) v->resize(size);
  for (int64_t i = 0; i < p.N; ++i)
    for (int64_t k = 0; k < p.M; ++k) {
      const int64_t q = i * p.M + k;
      f.w[q] = k > 0 ? p.aC[q] : T(0);
      f.e[q] = k + 1 < p.M ? p.bC[q] : T(0);
      f.n[q] = i > 0 ? p.cA[q] : T(0);
      f.s[q] = i + 1 < p.N ? p.cB[q] : T(0);
      f.c[q] = p.cC[q];
    }
  L.push_back(std::move(f));
  while (L.back().N * L.back().M > kMgCoarsest && L.size() < 32) {
    const MgLevel<T>& a = L.back();
    MgLevel<T> b{(a.N + 1) / 2, (a.M + 1) / 2};
    for (auto* v : {&b.w, &b.c, &b.e, &b.n, &b.s}) v->assign(b.N * b.M, T(0));
    for (int64_t i = 0; i < a.N; ++i)
      for (int64_t k = 0; k < a.M; ++k) {
        const int64_t q = i * a.M + k, Q = (i / 2) * b.M + k / 2;
        const bool west_in = k & 1, east_in = !(k & 1), north_in = i & 1, south_in = !(i & 1);
        b.c[Q] += a.c[q] + (west_in ? a.w[q] : T(0)) + (east_in ? a.e[q] : T(0)) +
                  (north_in ? a.n[q] : T(0)) + (south_in ? a.s[q] : T(0));
        if (!west_in) b.w[Q] += a.w[q];
        if (!east_in) b.e[Q] += a.e[q];
        if (!north_in) b.n[Q] += a.n[q];
        if (!south_in) b.s[Q] += a.s[q];
      }
    L.push_back(std::move(b));
  }
  return L;
}

// One red-black half-sweep of point Gauss-Seidel on level a: cells with (i + k) % 2 == colour.
template <typename T>
void MgHalfSweep(const MgLevel<T>& a, const T* r, T* z, int colour) {
  const int64_t N = a.N, M = a.M;
#pragma omp parallel for schedule(static) if (N * M > 65536)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = (i + colour) & 1; k < M; k += 2) {
      const int64_t q = i * M + k;
      T v = r[q];
      if (k > 0) v -= a.w[q] * z[q - 1];
      if (k + 1 < M) v -= a.e[q] * z[q + 1];
      if (i > 0) v -= a.n[q] * z[q - M];
      if (i + 1 < N) v -= a.s[q] * z[q + M];
      z[q] = v / a.c[q];
    }
}

// z = V(r) on level l: z = 0, red then black half-sweep, the residual restricted to level
// l + 1 (sums over the 2 x 2 aggregates), the coarse correction added back (constant over
// each aggregate, times kMgCorrection), black then red. A symmetric operator, as CG needs. The coarsest level
// runs kMgCoarseSweeps sweeps forward and as many backward.
template <typename T>
void VCycle(const std::vector<MgLevel<T>>& L, size_t l, const T* r, T* z,
            std::vector<std::vector<T>>& tmp, double factor = kMgCorrection) {
  const MgLevel<T>& a = L[l];
  const int64_t N = a.N, M = a.M;
  std::fill(z, z + N * M, T(0));
  if (l + 1 == L.size()) {
    for (int q = 0; q < kMgCoarseSweeps; ++q) {
      MgHalfSweep(a, r, z, 0);
      MgHalfSweep(a, r, z, 1);
    }
    for (int q = 0; q < kMgCoarseSweeps; ++q) {
      MgHalfSweep(a, r, z, 1);
      MgHalfSweep(a, r, z, 0);
    }
    return;
  }
  MgHalfSweep(a, r, z, 0);
  MgHalfSweep(a, r, z, 1);
  const MgLevel<T>& b = L[l + 1];
  std::vector<T>& rc = tmp[2 * l];
  std::vector<T>& zc = tmp[2 * l + 1];
  rc.assign(b.N * b.M, T(0));
  zc.resize(b.N * b.M);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t q = i * M + k;
      T v = r[q] - a.c[q] * z[q];
      if (k > 0) v -= a.w[q] * z[q - 1];
      if (k + 1 < M) v -= a.e[q] * z[q + 1];
      if (i > 0) v -= a.n[q] * z[q - M];
      if (i + 1 < N) v -= a.s[q] * z[q + M];
      rc[(i / 2) * b.M + k / 2] += v;
    }
  VCycle(L, l + 1, rc.data(), zc.data(), tmp, factor);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) z[i * M + k] += T(factor) * zc[(i / 2) * b.M + k / 2];
  MgHalfSweep(a, r, z, 1);
  MgHalfSweep(a, r, z, 0);
}

// The sign the diagonals share on every level: +1 all positive, -1 all negative, 0 neither
// (both signs, a zero or a value that is not finite). A symmetric definite matrix has
// diagonals of one sign, and so have its Galerkin coarse matrices (P^T A P is definite with
// A): a hierarchy whose diagonals do not share one sign belongs to an indefinite matrix.
template <typename T>
int DiagonalSign(const std::vector<MgLevel<T>>& levels) {
  bool pos = true, neg = true;
  for (const auto& lv : levels)
    for (T v : lv.c) {
      pos &= v > T(0) && std::isfinite(v);
      neg &= v < T(0) && std::isfinite(v);
    }
  return pos ? 1 : neg ? -1 : 0;
}
// Point Gauss-Seidel divides by the diagonals: the V-cycle runs where none is zero.
template <typename T>
bool MgDiagonalsNonzero(const std::vector<MgLevel<T>>& levels) {
  for (const auto& lv : levels)
    for (T v : lv.c)
      if (v == T(0) || !std::isfinite(v)) return false;
  return true;
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

// The answer of a Krylov solve: the true residual from the original arrays and the status;
// y is zeroed for a singular or diverged system. `stopped`: the method broke down (CG met
// indefiniteness, a preconditioner could not run) -- not converged unless the residual is
// already within the tolerance.
template <typename T>
SolveInfo Finish(const BlockTridiagonalProblem<T>& p, const BlockOptions& o, std::string method,
                 int64_t iterations, bool singular, T* y, SystemStatus* status,
                 bool stopped = false) {
  const int64_t size = p.N * p.M;
  SolveInfo info;
  info.method = std::move(method);
  info.iterations = iterations;
  info.residual = BlockRelativeResidual(p, y);
  if (singular) {
    std::fill(y, y + size, T(0));
    *status = SystemStatus::kSingular;
  } else if (!std::isfinite(info.residual) || !AllFinite(size, 1, y)) {
    std::fill(y, y + size, T(0));
    *status = SystemStatus::kDiverged;
  } else if ((o.tol > 0 && !(info.residual <= o.tol)) || (stopped && !(info.residual <= o.tol))) {
    *status = SystemStatus::kNotConverged;
  } else {
    *status = SystemStatus::kOk;
  }
  return info;
}

// Conjugate gradients preconditioned by the line solves C_i z_i = r_i (Thomas, every block row
// independently), or by a multigrid V-cycle. Stops when the recursively updated residual
// reaches tol; reports the true one.
// sign = -1: A is negative definite (its diagonals, and every level's, negative). CG runs on
// -A y = -f preconditioned by -P (P the line solves or the V-cycle of A, both negative
// definite then; the V-cycle of -A is -P exactly): r, z, alpha and beta come out the same as
// the recurrences below with (d, Ad) and (r, z) multiplied by sign, so nothing is copied or
// negated -- only the definiteness tests read sign * (d, Ad) > 0 and sign * (r, z) > 0.
// *indefinite: one of them failed (the matrix or the preconditioner is not definite): CG
// stopped there, y holds its iterate.
template <typename T>
SolveInfo BlockCg(const BlockTridiagonalProblem<T>& p, const BlockOptions& o, T* y,
                  SystemStatus* status, const SolveControl& control, BlockMonitor& mon,
                  bool* cancelled, const std::vector<MgLevel<T>>* levels, int sign,
                  bool* indefinite) {
  const int64_t N = p.N, M = p.M, size = N * M;
  const bool multigrid = levels != nullptr;
  std::vector<T> r(size), z(size), d(size), q(size);
  ApplyBlock(p, y, q.data());
  for (int64_t e = 0; e < size; ++e) r[e] = p.f[e] - q[e];
  std::vector<std::vector<T>> tmp;
  if (multigrid) tmp.resize(2 * levels->size());
  bool line_failed = false;
  auto precondition = [&](const T* in, T* out) {
    if (multigrid) {
      VCycle(*levels, 0, in, out, tmp);
      return;
    }
#pragma omp parallel reduction(|| : line_failed)
    {
      std::vector<T> work(M);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < N; ++i)
        if (!ThomasStrided<T>(M, 1, p.aC + i * M, p.cC + i * M, p.bC + i * M, in + i * M,
                              out + i * M, work.data()))
          line_failed = true;
    }
  };
  const double fnorm = std::sqrt(Dot(size, p.f, p.f));
  const double scale = fnorm > 0 ? fnorm : 1;
  precondition(r.data(), z.data());
  d = z;
  double rz = Dot(size, r.data(), z.data());
  double res = std::sqrt(Dot(size, r.data(), r.data())) / scale;
  *indefinite = false;
  if (!(sign * rz > 0) && res > o.tol && res > 0) *indefinite = true;
  mon.Check(0, res);
  int64_t it = 0;
  for (; it < o.max_iterations && !*indefinite && !line_failed; ++it) {
    if (res <= o.tol) break;
    if (control.Cancelled()) {
      *cancelled = true;
      break;
    }
    ApplyBlock(p, d.data(), q.data());
    const double dq = Dot(size, d.data(), q.data());
    if (!(sign * dq > 0) || !std::isfinite(dq)) {  // not definite: stop
      *indefinite = true;
      break;
    }
    const T alpha = T(rz / dq);
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size; ++e) {
      y[e] += alpha * d[e];
      r[e] -= alpha * q[e];
    }
    res = std::sqrt(Dot(size, r.data(), r.data())) / scale;
    mon.Check(it + 1, res);
    precondition(r.data(), z.data());
    const double rz_new = Dot(size, r.data(), z.data());
    if (!(sign * rz_new > 0) && res > o.tol && res > 0) {  // the preconditioner is not definite
      *indefinite = true;
      ++it;
      break;
    }
    const T beta = T(rz_new / rz);
    rz = rz_new;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size; ++e) d[e] = z[e] + beta * d[e];
  }
  std::string method = multigrid ? "multigrid-cg" : "cg";
  if (sign < 0) method += " (negated: negative definite)";
  if (*indefinite) method += " (stopped: indefinite)";
  return Finish(p, o, method, it, false, y, status, *indefinite || line_failed);
}

// BiCGStab (van der Vorst), right-preconditioned by the multigrid V-cycle (kVCycle), by the
// line solves C_i z_i = r_i (kLines: block Jacobi, for systems whose coarse levels are not
// fit for the point smoother) or by nothing, for systems that are not symmetric or not
// definite. Two preconditioner applications and two products with A an iteration; stops when
// the recursively updated residual reaches tol (or at a breakdown: rho or (r0, v) or omega
// zero), reports the true residual. The caller checks that the preconditioner can run
// (nonzero diagonals on every level, nonsingular lines).
enum class Precond { kVCycle, kLines, kNone };
const char* BicgstabName(Precond k) {
  return k == Precond::kVCycle ? "multigrid-bicgstab"
         : k == Precond::kLines ? "bicgstab+lines"
                                : "bicgstab";
}
template <typename T>
SolveInfo BlockBicgstab(const BlockTridiagonalProblem<T>& p, const BlockOptions& o, T* y,
                        SystemStatus* status, const SolveControl& control, BlockMonitor& mon,
                        bool* cancelled, Precond kind, int64_t max_iterations) {
  const int64_t size = p.N * p.M;
  std::vector<T> r(size), r0(size), pv(size, T(0)), v(size, T(0)), yv(size), sv(size),
      zv(size), tv(size);
  ApplyBlock(p, y, tv.data());
  for (int64_t e = 0; e < size; ++e) r[e] = p.f[e] - tv[e];
  r0 = r;
  std::vector<MgLevel<T>> levels;
  if (kind == Precond::kVCycle) levels = BuildMultigrid(p);
  std::vector<std::vector<T>> tmp(2 * levels.size());
  const int64_t M = p.M;
  auto precondition = [&](const T* in, T* out) {
    if (kind == Precond::kVCycle) {
      VCycle(levels, 0, in, out, tmp);
    } else if (kind == Precond::kLines) {
#pragma omp parallel
      {
        std::vector<T> work(M);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < p.N; ++i)
          ThomasStrided<T>(M, 1, p.aC + i * M, p.cC + i * M, p.bC + i * M, in + i * M,
                           out + i * M, work.data());
      }
    } else {
      std::copy(in, in + size, out);
    }
  };
  const double fnorm = std::sqrt(Dot(size, p.f, p.f));
  const double scale = fnorm > 0 ? fnorm : 1;
  double res = std::sqrt(Dot(size, r.data(), r.data())) / scale;
  double rho = 1, alpha = 1, omega = 1;
  mon.Check(0, res);
  int64_t it = 0;
  for (; it < max_iterations; ++it) {
    if (res <= o.tol) break;
    if (control.Cancelled()) {
      *cancelled = true;
      break;
    }
    const double rho_new = Dot(size, r0.data(), r.data());
    if (rho_new == 0 || !std::isfinite(rho_new)) break;
    const double beta = (rho_new / rho) * (alpha / omega);
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size; ++e) pv[e] = r[e] + T(beta) * (pv[e] - T(omega) * v[e]);
    precondition(pv.data(), yv.data());
    ApplyBlock(p, yv.data(), v.data());
    const double r0v = Dot(size, r0.data(), v.data());
    if (r0v == 0 || !std::isfinite(r0v)) break;
    alpha = rho_new / r0v;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size; ++e) {
      y[e] += T(alpha) * yv[e];
      sv[e] = r[e] - T(alpha) * v[e];
    }
    res = std::sqrt(Dot(size, sv.data(), sv.data())) / scale;
    if (res <= o.tol) {
      r = sv;
      ++it;
      mon.Check(it, res);
      break;
    }
    precondition(sv.data(), zv.data());
    ApplyBlock(p, zv.data(), tv.data());
    const double tt = Dot(size, tv.data(), tv.data());
    omega = tt > 0 ? Dot(size, tv.data(), sv.data()) / tt : 0;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size; ++e) {
      y[e] += T(omega) * zv[e];
      r[e] = sv[e] - T(omega) * tv[e];
    }
    res = std::sqrt(Dot(size, r.data(), r.data())) / scale;
    mon.Check(it + 1, res);
    rho = rho_new;
    if (omega == 0 || !std::isfinite(omega)) {
      ++it;
      break;
    }
  }
  return Finish(p, o, BicgstabName(kind), it, false, y, status);
}

// auto's fallback where CG cannot run or meets indefiniteness, or the thesis' line iterations
// cannot run: BiCGStab, which needs neither symmetry nor definiteness, from y, preconditioned
// by the V-cycle where every level's diagonals share a sign, else by the line solves where no
// line is singular, else by nothing.
template <typename T>
SolveInfo BicgstabFallback(const BlockTridiagonalProblem<T>& p, const BlockOptions& o, T* y,
                           SystemStatus* status, const SolveControl& control,
                           BlockMonitor& mon, bool* cancelled, int64_t max_iterations) {
  Precond kind = Precond::kNone;
  if (DiagonalSign(BuildMultigrid(p)) != 0)
    kind = Precond::kVCycle;
  else if (!AnyLineSingular(p))
    kind = Precond::kLines;
  return BlockBicgstab(p, o, y, status, control, mon, cancelled, kind, max_iterations);
}

}  // namespace
}  // namespace cpu

template <typename T>
bool IsSymmetric(const BlockTridiagonalProblem<T>& p) {
  const int64_t N = p.N, M = p.M;
  auto close = [](T u, T v) {
    return std::abs(u - v) <= T(64) * std::numeric_limits<T>::epsilon() *
                                  std::max(std::abs(u), std::abs(v));
  };
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      if (k + 1 < M && !close(p.aC[e + 1], p.bC[e])) return false;
      if (i + 1 < N && !close(p.cA[e + M], p.cB[e])) return false;
    }
  return true;
}
template bool IsSymmetric(const BlockTridiagonalProblem<double>&);
template bool IsSymmetric(const BlockTridiagonalProblem<float>&);

namespace cpu {

namespace {

template <typename T>
absl::StatusOr<SolveInfo> SolveBlock(const BlockTridiagonalProblem<T>& p0, BlockMethod method,
                                     const BlockOptions& options, BlockOutput<T> out,
                                     const SolveControl& control, BlockMonitor& mon) {
  const int64_t N = p0.N, M = p0.M, size = N * M;
  const bool automatic = method == BlockMethod::kAuto;
  if (automatic)
    method = options.tol > 0 && IsSymmetric(p0) ? BlockMethod::kMultigridCg
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
    SolveInfo info = Finish(p0, options, std::string(MethodName(method)) + " (not run: " + why + ")",
                            0, false, out.y, out.status, true);
    return info;
  };
  // auto's fallback (BicgstabFallback) from y; `before`: what ran or was skipped.
  auto fallback = [&](const std::string& before, const std::string& why, int64_t used,
                      bool* cancelled) {
    if (!AllFinite(size, 1, out.y)) start();
    mon.set_offset(used);
    SolveInfo info = BicgstabFallback(p0, options, out.y, out.status, control, mon, cancelled,
                                      std::max<int64_t>(options.max_iterations - used, 1));
    info.method = before + " -> " + info.method + " (" + why + ")";
    info.iterations += used;
    return info;
  };
  if (method == BlockMethod::kCg || method == BlockMethod::kMultigridCg ||
      method == BlockMethod::kMultigridBicgstab) {
    // The line preconditioner already holds the diagonal: the row scaling (which would break
    // the symmetry CG needs) is not applied.
    if (AnyZeroRow(p0)) {  // singular to working precision whatever the method
      std::fill(out.y, out.y + size, T(0));
      out.status[0] = SystemStatus::kSingular;
      SolveInfo info;
      info.method = std::string(MethodName(method)) + " (a row of A is zero)";
      info.iterations = 0;
      info.residual = BlockRelativeResidual(p0, out.y);
      return info;
    }
    start();
    bool cancelled = false;
    SolveInfo info;
    if (method == BlockMethod::kMultigridBicgstab) {
      if (!MgDiagonalsNonzero(BuildMultigrid(p0)))
        return not_run("a zero diagonal on a multigrid level");
      info = BlockBicgstab(p0, options, out.y, out.status, control, mon, &cancelled,
                           Precond::kVCycle, options.max_iterations);
    } else {
      const bool multigrid = method == BlockMethod::kMultigridCg;
      std::vector<MgLevel<T>> levels;
      if (multigrid) levels = BuildMultigrid(p0);
      const int sign = multigrid ? DiagonalSign(levels) : FineDiagonalSign(p0);
      const char* why = "not definite: diagonals of both signs";
      if (!multigrid && sign != 0 && AnyLineSingular(p0)) {
        if (!automatic) return not_run("a line block is singular");
      } else if (sign == 0) {
        if (!automatic) return not_run(why);
        info = fallback(std::string(MethodName(method)) + " skipped", why, 0, &cancelled);
      } else {
        bool indefinite = false;
        info = BlockCg(p0, options, out.y, out.status, control, mon, &cancelled,
                       multigrid ? &levels : nullptr, sign, &indefinite);
        if (automatic && indefinite && !cancelled) {
          std::string ran = std::string(MethodName(method)) + (sign < 0 ? " (negated)" : "");
          info = fallback(ran, "indefinite", info.iterations, &cancelled);
        }
      }
    }
    if (cancelled) return absl::CancelledError("solve cancelled");
    return info;
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
  if (AnyLineSingular(p)) {
    if (automatic) {  // the thesis' line solves cannot run; the matrix may be nonsingular
      if (AnyZeroRow(p0)) {
        std::fill(y, y + size, T(0));
        out.status[0] = SystemStatus::kSingular;
        info.method += " (a row of A is zero)";
        return info;
      }
      start();
      bool cancelled = false;
      SolveInfo fb = fallback(info.method + " skipped", "a line block is singular", 0, &cancelled);
      if (cancelled) return absl::CancelledError("solve cancelled");
      return fb;
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
  const int64_t size = p.N * p.M;
  if (AnyZeroRow(p)) {
    std::fill(out.y, out.y + size, T(0));
    out.status[0] = SystemStatus::kSingular;
    SolveInfo info;
    info.method = "bicgstab (a row of A is zero)";
    info.iterations = 0;
    info.residual = BlockRelativeResidual(p, out.y);
    return info;
  }
  if (p.y0)
    std::copy(p.y0, p.y0 + size, out.y);
  else
    std::fill(out.y, out.y + size, T(0));
  bool cancelled = false;
  SolveInfo info = BicgstabFallback(p, options, out.y, out.status, control, mon, &cancelled,
                                    options.max_iterations);
  if (cancelled) return absl::CancelledError("solve cancelled");
  return info;
}

}  // namespace

template <typename T>
absl::StatusOr<SolveInfo> SolveBlockTridiagonal(const BlockTridiagonalProblem<T>& p,
                                                BlockMethod method, const BlockOptions& options,
                                                BlockOutput<T> out, const SolveControl& control) {
  BlockMonitor mon(control);
  auto info = SolveBlock(p, method, options, out, control, mon);
  if (info.ok()) mon.Finish(&*info);
  return info;
}

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
    BlockOutput<double>, const SolveControl&);
template absl::StatusOr<SolveInfo> SolveBlockTridiagonal(
    const BlockTridiagonalProblem<float>&, BlockMethod, const BlockOptions&,
    BlockOutput<float>, const SolveControl&);

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
