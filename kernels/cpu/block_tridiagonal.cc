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

// Point Gauss-Seidel divides by the diagonals: they must be positive on every level (an SPD
// matrix has positive ones, and so have its Galerkin coarse matrices).
template <typename T>
bool MgDiagonalsPositive(const std::vector<MgLevel<T>>& levels) {
  for (const auto& lv : levels)
    for (T v : lv.c)
      if (!(v > T(0)) || !std::isfinite(v)) return false;
  return true;
}

// The answer of a Krylov solve: the true residual from the original arrays and the status;
// y is zeroed for a singular or diverged system.
template <typename T>
SolveInfo Finish(const BlockTridiagonalProblem<T>& p, const BlockOptions& o, const char* method,
                 int64_t iterations, bool singular, T* y, SystemStatus* status) {
  const int64_t size = p.N * p.M;
  SolveInfo info;
  info.method = method;
  info.iterations = iterations;
  info.residual = BlockRelativeResidual(p, y);
  if (singular) {
    std::fill(y, y + size, T(0));
    *status = SystemStatus::kSingular;
  } else if (!std::isfinite(info.residual) || !AllFinite(size, 1, y)) {
    std::fill(y, y + size, T(0));
    *status = SystemStatus::kDiverged;
  } else if (o.tol > 0 && info.residual > o.tol) {
    *status = SystemStatus::kNotConverged;
  } else {
    *status = SystemStatus::kOk;
  }
  return info;
}

// Conjugate gradients preconditioned by the line solves C_i z_i = r_i (Thomas, every block row
// independently), or by a multigrid V-cycle. Stops when the recursively updated residual
// reaches tol; reports the true one.
template <typename T>
SolveInfo BlockCg(const BlockTridiagonalProblem<T>& p, const BlockOptions& o, T* y,
                  SystemStatus* status, const SolveControl& control, bool* cancelled,
                  bool multigrid) {
  const int64_t N = p.N, M = p.M, size = N * M;
  std::vector<T> r(size), z(size), d(size), q(size);
  ApplyBlock(p, y, q.data());
  for (int64_t e = 0; e < size; ++e) r[e] = p.f[e] - q[e];
  bool singular = false;
  std::vector<MgLevel<T>> levels;
  std::vector<std::vector<T>> tmp;
  if (multigrid) {
    levels = BuildMultigrid(p);
    tmp.resize(2 * levels.size());
    singular = !MgDiagonalsPositive(levels);
  }
  auto precondition = [&](const T* in, T* out) {
    if (multigrid) {
      VCycle(levels, 0, in, out, tmp);
      return;
    }
#pragma omp parallel reduction(|| : singular)
    {
      std::vector<T> work(M);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < N; ++i)
        if (!ThomasStrided<T>(M, 1, p.aC + i * M, p.cC + i * M, p.bC + i * M, in + i * M,
                              out + i * M, work.data()))
          singular = true;
    }
  };
  const double fnorm = std::sqrt(Dot(size, p.f, p.f));
  const double scale = fnorm > 0 ? fnorm : 1;
  if (!singular) precondition(r.data(), z.data());
  d = z;
  double rz = Dot(size, r.data(), z.data());
  double res = std::sqrt(Dot(size, r.data(), r.data())) / scale;
  int64_t it = 0;
  for (; it < o.max_iterations && !singular; ++it) {
    if (res <= o.tol) break;
    if (control.Cancelled()) {
      *cancelled = true;
      break;
    }
    ApplyBlock(p, d.data(), q.data());
    const double dq = Dot(size, d.data(), q.data());
    if (!(dq > 0) || !std::isfinite(dq)) break;  // not positive definite: stop
    const T alpha = T(rz / dq);
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size; ++e) {
      y[e] += alpha * d[e];
      r[e] -= alpha * q[e];
    }
    res = std::sqrt(Dot(size, r.data(), r.data())) / scale;
    precondition(r.data(), z.data());
    const double rz_new = Dot(size, r.data(), z.data());
    const T beta = T(rz_new / rz);
    rz = rz_new;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size; ++e) d[e] = z[e] + beta * d[e];
  }
  return Finish(p, o, multigrid ? "multigrid-cg" : "cg", it, singular, y, status);
}

// BiCGStab (van der Vorst), right-preconditioned by the multigrid V-cycle, for systems that
// are not symmetric. Two V-cycles and two products with A an iteration; stops when the
// recursively updated residual reaches tol (or at a breakdown: rho or (r0, v) or omega zero),
// reports the true residual.
template <typename T>
SolveInfo BlockBicgstab(const BlockTridiagonalProblem<T>& p, const BlockOptions& o, T* y,
                        SystemStatus* status, const SolveControl& control, bool* cancelled) {
  const int64_t size = p.N * p.M;
  std::vector<T> r(size), r0(size), pv(size, T(0)), v(size, T(0)), yv(size), sv(size),
      zv(size), tv(size);
  ApplyBlock(p, y, tv.data());
  for (int64_t e = 0; e < size; ++e) r[e] = p.f[e] - tv[e];
  r0 = r;
  const std::vector<MgLevel<T>> levels = BuildMultigrid(p);
  std::vector<std::vector<T>> tmp(2 * levels.size());
  const bool singular = !MgDiagonalsPositive(levels);
  const double fnorm = std::sqrt(Dot(size, p.f, p.f));
  const double scale = fnorm > 0 ? fnorm : 1;
  double res = std::sqrt(Dot(size, r.data(), r.data())) / scale;
  double rho = 1, alpha = 1, omega = 1;
  int64_t it = 0;
  for (; it < o.max_iterations && !singular; ++it) {
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
    VCycle(levels, 0, pv.data(), yv.data(), tmp);
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
      break;
    }
    VCycle(levels, 0, sv.data(), zv.data(), tmp);
    ApplyBlock(p, zv.data(), tv.data());
    const double tt = Dot(size, tv.data(), tv.data());
    omega = tt > 0 ? Dot(size, tv.data(), sv.data()) / tt : 0;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size; ++e) {
      y[e] += T(omega) * zv[e];
      r[e] = sv[e] - T(omega) * tv[e];
    }
    res = std::sqrt(Dot(size, r.data(), r.data())) / scale;
    rho = rho_new;
    if (omega == 0 || !std::isfinite(omega)) {
      ++it;
      break;
    }
  }
  return Finish(p, o, "multigrid-bicgstab", it, singular, y, status);
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

template <typename T>
absl::StatusOr<SolveInfo> SolveBlockTridiagonal(const BlockTridiagonalProblem<T>& p0,
                                                BlockMethod method,
                                                const BlockOptions& options,
                                                BlockOutput<T> out,
                                                const SolveControl& control) {
  if (method == BlockMethod::kAuto)
    method = options.tol > 0 && IsSymmetric(p0) ? BlockMethod::kMultigridCg
                                                 : BlockMethod::kGaussSeidel;
  const int64_t N = p0.N, M = p0.M, size = N * M;
  if (method == BlockMethod::kCg || method == BlockMethod::kMultigridCg ||
      method == BlockMethod::kMultigridBicgstab) {
    // The line preconditioner already holds the diagonal: the row scaling (which would break
    // the symmetry CG needs) is not applied.
    if (p0.y0)
      std::copy(p0.y0, p0.y0 + size, out.y);
    else
      std::fill(out.y, out.y + size, T(0));
    bool cancelled = false;
    SolveInfo info =
        method == BlockMethod::kMultigridBicgstab
            ? BlockBicgstab(p0, options, out.y, out.status, control, &cancelled)
            : BlockCg(p0, options, out.y, out.status, control, &cancelled,
                      method == BlockMethod::kMultigridCg);
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
  int64_t it = 0;
  for (; it < L; ++it) {
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
    if (options.tol > 0) residual = BlockRelativeResidual(p0, y);
  }
  if (options.tol <= 0) residual = BlockRelativeResidual(p0, y);
  info.iterations = it;
  info.residual = residual;
  if (!std::isfinite(residual) || !AllFinite(size, 1, y)) {
    std::fill(y, y + size, T(0));
    out.status[0] = SystemStatus::kDiverged;
  } else if (options.tol > 0 && residual > options.tol) {
    out.status[0] = SystemStatus::kNotConverged;
  } else {
    out.status[0] = SystemStatus::kOk;
  }
  return info;
}

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
