// CPU reference for dense systems: Gauss-Jordan elimination with partial pivoting on the
// augmented matrix [A | b] (the report's tasks A..F in order), and for symmetric A the
// Householder reduction to tridiagonal T = Q^T A Q, PCR on T, x = Q y (the PCR notes), then
// one step of iterative refinement with the same reduction.
#include "trisolve/dense.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common.h"
#include "trisolve/reference/dense.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {

template <typename T>
int64_t FirstNonSymmetric(const DenseProblem<T>& p) {
  const int64_t n = p.n;
  for (int64_t s = 0; s < p.batch; ++s) {
    const T* A = p.A + s * n * n;
    T amax = T(0);
    for (int64_t e = 0; e < n * n; ++e) amax = std::max(amax, std::abs(A[e]));
    const T tol = T(64) * std::numeric_limits<T>::epsilon() * amax;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j)
        if (std::abs(A[i * n + j] - A[j * n + i]) > tol) return s;
  }
  return -1;
}
template int64_t FirstNonSymmetric(const DenseProblem<double>&);
template int64_t FirstNonSymmetric(const DenseProblem<float>&);

namespace cpu {
namespace {

// The largest |A| of each column: a pivot vanishes when it is below the rounding level of its
// column in A, a test that does not change when a column or the whole matrix is scaled.
template <typename T>
void ColumnMax(int64_t n, const T* A, std::vector<T>& colmax) {
  for (int64_t j = 0; j < n; ++j) {
    T m = T(0);
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(A[i * n + j]));
    colmax[j] = m;
  }
}

// Gauss-Jordan on A, recorded in F (n x n): row k's multiplier of step i at F[k][i] (k > i),
// the normalised pivot rows above the diagonal, 1 / pivot in inv, the exchanges in pivot. Phase
// 1 (rows i = 0 .. n-1: zeros below the diagonal, each pivot row normalised) as the seed's
// tasks: A_i pivot choice, B_{i,j,p} row exchange, C/D/F multipliers and subtraction below the
// pivot, E_{i,j} normalisation. Phase 2 (zeros above the diagonal) changes b alone: it is
// ApplyGaussJordanOne's.
template <typename T>
bool FactorGaussJordanOne(int64_t n, const T* A, T* F, T* inv, int64_t* pivot,
                          std::vector<T>& colmax) {
  std::copy(A, A + n * n, F);
  ColumnMax(n, A, colmax);
  for (int64_t i = 0; i < n; ++i) {
    int64_t piv = i;
    for (int64_t k = i + 1; k < n; ++k)
      if (std::abs(F[k * n + i]) > std::abs(F[piv * n + i])) piv = k;
    const T pv = F[piv * n + i];
    if (PivotVanishes(pv, T(n) * colmax[i])) return false;
    pivot[i] = piv;
    if (piv != i)
      for (int64_t j = i; j < n; ++j) std::swap(F[i * n + j], F[piv * n + j]);
    for (int64_t k = i + 1; k < n; ++k) {
      const T m = F[k * n + i] / pv;
      F[k * n + i] = m;  // (the eliminated entry is never read again)
      if (m == T(0)) continue;
      for (int64_t j = i + 1; j < n; ++j) F[k * n + j] -= F[i * n + j] * m;
    }
    inv[i] = T(1) / pv;
    for (int64_t j = i + 1; j < n; ++j) F[i * n + j] *= inv[i];
  }
  return true;
}

// Gauss-Jordan's operations on b, from the recorded elimination: the same in the same order as
// when b is eliminated beside A (its augmented column), so x does not depend on which is done.
template <typename T>
bool ApplyGaussJordanOne(int64_t n, const T* F, const T* inv, const int64_t* pivot, const T* b,
                         T* x) {
  std::copy(b, b + n, x);
  for (int64_t i = 0; i < n; ++i) {
    if (pivot[i] != i) std::swap(x[i], x[pivot[i]]);
    for (int64_t k = i + 1; k < n; ++k) {
      const T m = F[k * n + i];
      if (m == T(0)) continue;
      x[k] -= x[i] * m;
    }
    x[i] *= inv[i];
  }
  for (int64_t i = n - 1; i >= 1; --i)
    for (int64_t k = i - 1; k >= 0; --k) x[k] -= x[i] * F[k * n + i];
  return AllFinite(n, 1, x);
}

// LU with partial pivoting (right-looking, as LAPACK's getf2; rows exchanged whole, L kept in
// place). The vanishing-pivot test is Gauss-Jordan's.
template <typename T>
bool FactorLuOne(int64_t n, const T* A, T* F, int64_t* pivot, std::vector<T>& colmax) {
  std::copy(A, A + n * n, F);
  ColumnMax(n, A, colmax);
  for (int64_t k = 0; k < n; ++k) {
    int64_t piv = k;
    for (int64_t i = k + 1; i < n; ++i)
      if (std::abs(F[i * n + k]) > std::abs(F[piv * n + k])) piv = i;
    const T pv = F[piv * n + k];
    if (PivotVanishes(pv, T(n) * colmax[k])) return false;
    pivot[k] = piv;
    if (piv != k)
      for (int64_t j = 0; j < n; ++j) std::swap(F[k * n + j], F[piv * n + j]);
    for (int64_t i = k + 1; i < n; ++i) {
      const T l = F[i * n + k] / pv;
      F[i * n + k] = l;
      if (l == T(0)) continue;
      for (int64_t j = k + 1; j < n; ++j) F[i * n + j] -= l * F[k * n + j];
    }
  }
  return true;
}

// LU's operations on b: every interchange first, then L and U (a value receives the same
// updates in the same order as when the interchanges came between them, since each one moves
// its row's multipliers along).
template <typename T>
bool ApplyLuOne(int64_t n, const T* F, const int64_t* pivot, const T* b, T* x) {
  std::copy(b, b + n, x);
  for (int64_t k = 0; k < n; ++k)
    if (pivot[k] != k) std::swap(x[k], x[pivot[k]]);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t i = k + 1; i < n; ++i) {
      const T l = F[i * n + k];
      if (l == T(0)) continue;
      x[i] -= l * x[k];
    }
  for (int64_t i = n - 1; i >= 0; --i) {
    T acc = x[i];
    for (int64_t j = i + 1; j < n; ++j) acc -= F[i * n + j] * x[j];
    x[i] = acc / F[i * n + i];
  }
  return AllFinite(n, 1, x);
}

// One system, one right-hand side: the elimination, then its operations on b. F (n x n), inv
// and pivot (n) are the caller's work space.
template <typename T>
bool GaussJordanOne(int64_t n, const T* A, const T* b, T* x, T* F, T* inv, int64_t* pivot,
                    std::vector<T>& colmax) {
  return FactorGaussJordanOne(n, A, F, inv, pivot, colmax) &&
         ApplyGaussJordanOne(n, F, inv, pivot, b, x);
}
template <typename T>
bool LuOne(int64_t n, const T* A, const T* b, T* x, T* F, int64_t* pivot,
           std::vector<T>& colmax) {
  return FactorLuOne(n, A, F, pivot, colmax) && ApplyLuOne(n, F, pivot, b, x);
}

// Householder tridiagonalisation of symmetric A (n x n work copy W, overwritten), the
// reflectors kept in V (row k holds u_k, zero before k+1) with their H_k = |u_k|^2 / 2.
// Then T y = Q^T b by PCR, x = Q y.
template <typename T>
bool HouseholderPcrOne(int64_t n, const T* A, const T* b, T* x, std::vector<T>& W,
                       std::vector<T>& V, std::vector<T>& H, std::vector<T>& work) {
  std::copy(A, A + n * n, W.begin());
  std::fill(V.begin(), V.end(), T(0));
  std::vector<T> p(n), q(n);
  for (int64_t k = 0; k + 2 < n; ++k) {
    // x = W[k+1:, k]; u = x + sign(x_0)|x| e_1 so that P x = -sign(x_0)|x| e_1.
    T sigma = T(0);
    for (int64_t i = k + 1; i < n; ++i) sigma += W[i * n + k] * W[i * n + k];
    T* u = &V[k * n];
    H[k] = T(0);
    if (sigma == T(0)) continue;  // column already reduced: P = I
    const T x0 = W[(k + 1) * n + k];
    const T g = x0 >= T(0) ? std::sqrt(sigma) : -std::sqrt(sigma);
    for (int64_t i = k + 1; i < n; ++i) u[i] = W[i * n + k];
    u[k + 1] += g;
    const T h = sigma + x0 * g;  // |u|^2 / 2
    H[k] = h;
    // p = A u / H, K = u^T p / (2H), q = p - K u; A' = A - q u^T - u q^T.
    T K = T(0);
    for (int64_t i = k; i < n; ++i) {
      T acc = T(0);
      for (int64_t j = k + 1; j < n; ++j) acc += W[i * n + j] * u[j];
      p[i] = acc / h;
      K += u[i] * p[i];
    }
    K /= (T(2) * h);
    for (int64_t i = k; i < n; ++i) q[i] = p[i] - K * u[i];
    for (int64_t i = k; i < n; ++i)
      for (int64_t j = k; j < n; ++j) W[i * n + j] -= q[i] * u[j] + u[i] * q[j];
  }
  // v <- Q T^-1 Q^T v: Q^T v = P_{n-3} ... P_0 v (P_0 first; P = I - u u^T / H), PCR on T (the
  // reduced W's three diagonals; symmetric: sub-diagonal = super-diagonal), Q y = P_0 ... y
  // (the last reflector first).
  auto apply = [&](int64_t k, T* v) {
    if (H[k] == T(0)) return;
    const T* u = &V[k * n];
    T dot = T(0);
    for (int64_t i = k + 1; i < n; ++i) dot += u[i] * v[i];
    const T f = dot / H[k];
    for (int64_t i = k + 1; i < n; ++i) v[i] -= f * u[i];
  };
  std::vector<T> ta(n), tb(n), tc(n), y(n), r(n);
  for (int64_t i = 0; i < n; ++i) {
    tb[i] = W[i * n + i];
    ta[i] = i > 0 ? W[i * n + i - 1] : T(0);
    tc[i] = i + 1 < n ? W[i * n + i + 1] : T(0);
  }
  auto solve = [&](T* v) {
    for (int64_t k = 0; k + 2 < n; ++k) apply(k, v);
    if (!PcrStrided(n, 1, ta.data(), tb.data(), tc.data(), v, y.data(), work.data()))
      return false;
    for (int64_t i = 0; i < n; ++i) v[i] = y[i];
    for (int64_t k = n - 3; k >= 0; --k) apply(k, v);
    return true;
  };
  for (int64_t i = 0; i < n; ++i) x[i] = b[i];
  if (!solve(x)) return false;
  // One step of iterative refinement with the same reduction (PCR does not pivot, so an
  // indefinite T can cost digits): r = b - A x, x += Q T^-1 Q^T r.
  for (int64_t i = 0; i < n; ++i) {
    T acc = T(0);
    for (int64_t j = 0; j < n; ++j) acc += A[i * n + j] * x[j];
    r[i] = b[i] - acc;
  }
  if (!solve(r.data())) return false;
  for (int64_t i = 0; i < n; ++i) x[i] += r[i];
  return AllFinite(n, 1, x);
}

}  // namespace

template <typename T>
SolveInfo SolveDense(const DenseProblem<T>& p, DenseMethod method, DenseOutput<T> out) {
  if (method == DenseMethod::kAuto) method = DenseMethod::kGaussJordan;
  const int64_t n = p.n;
#pragma omp parallel
  {
    std::vector<T> M, inv, colmax, W, V, H, work;
    std::vector<int64_t> pivot;
    if (method == DenseMethod::kGaussJordan || method == DenseMethod::kLu) {
      M.resize(n * n);
      inv.resize(n);
      pivot.resize(n);
      colmax.resize(n);
    } else {
      W.resize(n * n);
      V.resize(n * n);
      H.resize(n);
      work.resize(8 * n);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t s = 0; s < p.batch; ++s) {
      const T* A = p.A + s * n * n;
      const T* b = p.b + s * n;
      T* x = out.x + s * n;
      const bool ok =
          method == DenseMethod::kGaussJordan
              ? GaussJordanOne(n, A, b, x, M.data(), inv.data(), pivot.data(), colmax)
          : method == DenseMethod::kLu ? LuOne(n, A, b, x, M.data(), pivot.data(), colmax)
                                                      : HouseholderPcrOne(n, A, b, x, W, V, H, work);
      if (!ok) ZeroStrided(n, 1, x);
      out.status[s] = ok ? SystemStatus::kOk : SystemStatus::kSingular;
    }
  }
  SolveInfo info;
  info.method = std::string(MethodName(method));
  return info;
}
template SolveInfo SolveDense(const DenseProblem<double>&, DenseMethod, DenseOutput<double>);
bool Factorable(DenseMethod method) {
  return method == DenseMethod::kAuto || method == DenseMethod::kGaussJordan ||
         method == DenseMethod::kLu;
}

template <typename T>
DenseFactors<T> FactorDense(int64_t batch, int64_t n, const T* A, DenseMethod method) {
  DenseFactors<T> f;
  f.method = method == DenseMethod::kLu ? DenseMethod::kLu : DenseMethod::kGaussJordan;
  f.batch = batch;
  f.n = n;
  f.f.resize(size_t(batch * n * n));
  f.pivot.resize(size_t(batch * n));
  f.ok.resize(size_t(batch));
  if (f.method == DenseMethod::kGaussJordan) f.inv.resize(size_t(batch * n));
#pragma omp parallel
  {
    std::vector<T> colmax(static_cast<size_t>(n));
#pragma omp for schedule(dynamic, 1)
    for (int64_t s = 0; s < batch; ++s) {
      T* F = f.f.data() + s * n * n;
      int64_t* piv = f.pivot.data() + s * n;
      f.ok[size_t(s)] =
          f.method == DenseMethod::kLu
              ? FactorLuOne(n, A + s * n * n, F, piv, colmax)
              : FactorGaussJordanOne(n, A + s * n * n, F, f.inv.data() + s * n, piv, colmax);
    }
  }
  return f;
}

template <typename T>
void SolveFactored(const DenseFactors<T>& f, const T* b, T* x, SystemStatus* status) {
  const int64_t n = f.n;
#pragma omp parallel for schedule(static) if (f.batch * n * n >= (int64_t{1} << 16))
  for (int64_t s = 0; s < f.batch; ++s) {
    const T* F = f.f.data() + s * n * n;
    const int64_t* piv = f.pivot.data() + s * n;
    bool ok = f.ok[size_t(s)] != 0;
    if (ok)
      ok = f.method == DenseMethod::kLu
               ? ApplyLuOne(n, F, piv, b + s * n, x + s * n)
               : ApplyGaussJordanOne(n, F, f.inv.data() + s * n, piv, b + s * n, x + s * n);
    if (!ok) ZeroStrided(n, 1, x + s * n);
    status[s] = ok ? SystemStatus::kOk : SystemStatus::kSingular;
  }
}

template DenseFactors<double> FactorDense(int64_t, int64_t, const double*, DenseMethod);
template DenseFactors<float> FactorDense(int64_t, int64_t, const float*, DenseMethod);
template void SolveFactored(const DenseFactors<double>&, const double*, double*, SystemStatus*);
template void SolveFactored(const DenseFactors<float>&, const float*, float*, SystemStatus*);

template SolveInfo SolveDense(const DenseProblem<float>&, DenseMethod, DenseOutput<float>);

}  // namespace cpu

template <typename T>
double DenseBackwardError(const DenseProblem<T>& p, const T* x, const SystemStatus* status) {
  const int64_t n = p.n;
  double worst = 0;
#pragma omp parallel for schedule(static) reduction(max : worst)
  for (int64_t s = 0; s < p.batch; ++s) {
    if (status && status[s] != SystemStatus::kOk) continue;
    const T* A = p.A + s * n * n;
    const T* b = p.b + s * n;
    const T* xs = x + s * n;
    double rmax = 0, amax = 0, xmax = 0, bmax = 0;
    for (int64_t i = 0; i < n; ++i) {
      double ax = 0, arow = 0;
      for (int64_t j = 0; j < n; ++j) {
        ax += double(A[i * n + j]) * xs[j];
        arow += std::abs(double(A[i * n + j]));
      }
      rmax = std::max(rmax, std::abs(double(b[i]) - ax));
      amax = std::max(amax, arow);
      xmax = std::max(xmax, std::abs(double(xs[i])));
      bmax = std::max(bmax, std::abs(double(b[i])));
    }
    const double denom = amax * xmax + bmax;
    // A non-finite x is the worst error there is (std::max would drop a NaN).
    const double e = !cpu::AllFinite(n, 1, xs) ? std::numeric_limits<double>::infinity()
                     : denom > 0               ? rmax / denom
                                               : 0.0;
    worst = std::max(worst, e);
  }
  return worst;
}
template double DenseBackwardError(const DenseProblem<double>&, const double*,
                                   const SystemStatus*);
template double DenseBackwardError(const DenseProblem<float>&, const float*,
                                   const SystemStatus*);

}  // namespace trisolve
