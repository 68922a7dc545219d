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
  double s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s)
  for (int64_t e = 0; e < n; ++e) s += double(a[e]) * b[e];
  return s;
}

// Conjugate gradients preconditioned by the line solves C_i z_i = r_i (Thomas, every block row
// independently). Stops when the recursively updated residual reaches tol; reports the true one.
template <typename T>
SolveInfo BlockCg(const BlockTridiagonalProblem<T>& p, const BlockOptions& o, T* y,
                  SystemStatus* status, const SolveControl& control, bool* cancelled) {
  const int64_t N = p.N, M = p.M, size = N * M;
  std::vector<T> r(size), z(size), d(size), q(size);
  ApplyBlock(p, y, q.data());
  for (int64_t e = 0; e < size; ++e) r[e] = p.f[e] - q[e];
  bool singular = false;
  auto precondition = [&](const T* in, T* out) {
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
  precondition(r.data(), z.data());
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
  SolveInfo info;
  info.method = "cg";
  info.iterations = it;
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
    method = options.tol > 0 && IsSymmetric(p0) ? BlockMethod::kCg : BlockMethod::kGaussSeidel;
  const int64_t N = p0.N, M = p0.M, size = N * M;
  if (method == BlockMethod::kCg) {
    // The line preconditioner already holds the diagonal: the row scaling (which would break
    // the symmetry CG needs) is not applied.
    if (p0.y0)
      std::copy(p0.y0, p0.y0 + size, out.y);
    else
      std::fill(out.y, out.y + size, T(0));
    bool cancelled = false;
    SolveInfo info = BlockCg(p0, options, out.y, out.status, control, &cancelled);
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
  double rr = 0, ff = 0;
#pragma omp parallel for schedule(static) reduction(+ : rr, ff)
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      double ay = double(p.cC[e]) * y[e];
      if (k > 0) ay += double(p.aC[e]) * y[e - 1];
      if (k + 1 < M) ay += double(p.bC[e]) * y[e + 1];
      if (i > 0) ay += double(p.cA[e]) * y[e - M];
      if (i + 1 < N) ay += double(p.cB[e]) * y[e + M];
      const double r = double(p.f[e]) - ay;
      rr += r * r;
      ff += double(p.f[e]) * double(p.f[e]);
    }
  }
  return ff > 0 ? std::sqrt(rr / ff) : std::sqrt(rr);
}
template double BlockRelativeResidual(const BlockTridiagonalProblem<double>&,
                                      const double*);
template double BlockRelativeResidual(const BlockTridiagonalProblem<float>&, const float*);

}  // namespace trisolve
