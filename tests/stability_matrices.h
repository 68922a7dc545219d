// The stability suite of issue 33, shared by the CPU (test_stability) and GPU
// (test_cuda_pivoting) tests: the 20 tridiagonal test matrices of Chang et al. (SC 2012) as
// extended by Klein & Strzodka (ICPP 2021, Table 1; /work/shared/ANCHORS.md), a high-accuracy
// reference solution, and the forward and backward error measures.
//
// The reference: Gaussian elimination with partial pivoting in long double (x86-64: 64-bit
// significand, eps 5.4e-20) refined by iterative refinement whose residuals d - A x are formed
// in __float128 (113-bit significand): each step gains about -log10(kappa eps_ld) >= 4 digits
// for kappa <= 1e15, and 8 steps take x to long-double accuracy, far below the double-precision
// errors measured. Every error measure treats a non-finite x, or a system not reported OK, as
// an infinite error (comparisons are written !(err <= tol): a NaN never passes).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace trisolve::stability {

using Quad = __float128;
using Ld = long double;

struct Tri {
  std::string name;
  std::vector<double> a, b, c;  // a[0] and c[n-1] unused (zero)
};

// ---- MATLAB's gallery('randsvd', n, kappa, mode, 1, 1), dense: A = U diag(sigma) V^T with
// random orthogonal U, V (products of Householder reflectors of Gaussian vectors, as qmult),
// then reduced to tridiagonal by two-sided Householder transformations (as bandred with
// kl = ku = 1), which keep the singular values.
inline void ApplyHouseholder(std::vector<double>& A, int n, const std::vector<double>& v, int k,
                      bool left, int from) {
  // H = I - 2 v v^T / (v^T v) on rows (left) or columns (right) k .. k + len - 1; only the
  // columns (rows) from `from` on are touched (the others are zero there).
  const int len = int(v.size());
  double vv = 0;
  for (double t : v) vv += t * t;
  if (vv == 0) return;
  for (int j = from; j < n; ++j) {
    double s = 0;
    for (int i = 0; i < len; ++i) s += v[i] * (left ? A[(k + i) * n + j] : A[j * n + k + i]);
    s *= 2 / vv;
    for (int i = 0; i < len; ++i) (left ? A[(k + i) * n + j] : A[j * n + k + i]) -= s * v[i];
  }
}

inline std::vector<double> HouseholderVector(std::vector<double> x) {
  double nx = 0;
  for (double t : x) nx += t * t;
  nx = std::sqrt(nx);
  x[0] += x[0] < 0 ? -nx : nx;
  return x;
}

inline void RandsvdBlock(int n, double kappa, int mode, std::mt19937_64& rng, double* a, double* b,
                  double* c) {
  std::vector<double> sigma(n);
  for (int i = 0; i < n; ++i) {
    const double t = n > 1 ? double(i) / (n - 1) : 0;
    switch (mode) {
      case 1: sigma[i] = i == 0 ? 1 : 1 / kappa; break;        // one large
      case 2: sigma[i] = i == n - 1 ? 1 / kappa : 1; break;    // one small
      case 3: sigma[i] = std::pow(kappa, -t); break;           // geometric
      default: sigma[i] = 1 - t * (1 - 1 / kappa); break;      // arithmetic (mode 4)
    }
  }
  std::vector<double> A(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i) A[size_t(i) * n + i] = sigma[i];
  std::normal_distribution<double> g(0, 1);
  for (bool left : {true, false})
    for (int k = n - 2; k >= 0; --k) {
      std::vector<double> v(n - k);
      for (double& t : v) t = g(rng);
      ApplyHouseholder(A, n, v, k, left, 0);
    }
  for (int j = 0; j + 2 < n; ++j) {
    std::vector<double> x(n - j - 1);
    for (int i = 0; i < n - j - 1; ++i) x[i] = A[size_t(j + 1 + i) * n + j];
    ApplyHouseholder(A, n, HouseholderVector(x), j + 1, true, j);
    for (int i = 0; i < n - j - 1; ++i) x[i] = A[size_t(j) * n + j + 1 + i];
    ApplyHouseholder(A, n, HouseholderVector(x), j + 1, false, j);
  }
  for (int k = 0; k < n; ++k) {
    a[k] = k > 0 ? A[size_t(k) * n + k - 1] : 0;
    b[k] = A[size_t(k) * n + k];
    c[k] = k + 1 < n ? A[size_t(k) * n + k + 1] : 0;
  }
}

// The 20 matrices (ANCHORS.md, MATLAB notation there), n rows.
inline std::vector<Tri> Suite(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  auto random = [&](const std::string& name) {
    Tri t{name, std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
    for (int k = 0; k < n; ++k) t.a[k] = u(rng), t.b[k] = u(rng), t.c[k] = u(rng);
    return t;
  };
  auto constant = [&](const std::string& name, double a, double b, double c) {
    return Tri{name, std::vector<double>(n, a), std::vector<double>(n, b),
               std::vector<double>(n, c)};
  };
  std::vector<Tri> s;
  s.push_back(random("U(-1,1)"));
  s.push_back(random("U(-1,1), diagonal 1e8"));
  for (double& v : s.back().b) v = 1e8;
  {  // gallery('lesp', n) as lesp.m builds it: tridiag(1./x, -(2*[x n+1]+1), x), x = 2:n
    Tri t = constant("gallery('lesp')", 0, 0, 0);
    for (int k = 0; k < n; ++k) {
      t.a[k] = k > 0 ? 1.0 / (k + 1) : 0;
      t.b[k] = -(2.0 * (k + 2) + 1);
      t.c[k] = k + 1 < n ? k + 2.0 : 0;
    }
    s.push_back(t);
  }
  s.push_back(random("U(-1,1), a(n/2+1, n/2) * 1e-50"));
  s.back().a[n / 2] *= 1e-50;
  s.push_back(random("U(-1,1), half the off-diagonals zero"));
  for (int k = 0; k < n; ++k) {
    if (u(rng) < 0) s.back().a[k] = 0;
    if (u(rng) < 0) s.back().c[k] = 0;
  }
  s.push_back(random("U(-1,1), diagonal 64"));
  for (double& v : s.back().b) v = 64;
  {  // inv(gallery('kms', n, 0.5)) in closed form: tridiag(-r, [1 1+r^2 ... 1+r^2 1], -r)/(1-r^2)
    const double r = 0.5, q = 1 / (1 - r * r);
    Tri t = constant("inv(gallery('kms', n, 0.5))", -r * q, (1 + r * r) * q, -r * q);
    t.b[0] = t.b[n - 1] = q;
    s.push_back(t);
  }
  // randsvd, kappa 1e15, modes 2, 3, 1, 4: at n <= 512 one dense construction; at larger n
  // (dense O(n^3) is out of reach at 2^14) independent 64 x 64 randsvd blocks down the
  // diagonal (uncoupled), each of condition 1e15 -- the closest construction we could afford:
  // the same singular-value distribution per block, not over the whole matrix.
  for (int mode : {2, 3, 1, 4}) {
    Tri t = constant("gallery('randsvd', n, 1e15, " + std::to_string(mode) + ", 1, 1)" +
                         (n > 512 ? " (64-blocks)" : ""),
                     0, 0, 0);
    const int block = n > 512 ? 64 : n;
    for (int k0 = 0; k0 < n; k0 += block)
      RandsvdBlock(std::min(block, n - k0), 1e15, mode, rng, &t.a[k0], &t.b[k0], &t.c[k0]);
    s.push_back(t);
  }
  s.push_back(random("U(-1,1), off-diagonals * 1e-50"));
  for (int k = 0; k < n; ++k) s.back().a[k] *= 1e-50, s.back().c[k] *= 1e-50;
  {  // gallery('dorr', n, 1e-4) as dorr.m builds it
    const double theta = 1e-4, h = 1.0 / (n + 1), term = theta / (h * h);
    const int m = (n + 1) / 2;
    std::vector<double> cc(n + 1), dd(n + 1), ee(n + 1);  // 1-based as dorr.m
    for (int i = 1; i <= m; ++i) {
      cc[i] = -term;
      ee[i] = cc[i] - (0.5 - i * h) / h;
      dd[i] = -(cc[i] + ee[i]);
    }
    for (int i = m + 1; i <= n; ++i) {
      ee[i] = -term;
      cc[i] = ee[i] + (0.5 - i * h) / h;
      dd[i] = -(cc[i] + ee[i]);
    }
    Tri t = constant("gallery('dorr', n, 1e-4)", 0, 0, 0);
    for (int k = 0; k < n; ++k) {
      t.a[k] = k > 0 ? cc[k + 1] : 0;      // sub-diagonal c(2:n)
      t.b[k] = dd[k + 1];
      t.c[k] = k + 1 < n ? ee[k + 1] : 0;  // super-diagonal e(1:n-1)
    }
    s.push_back(t);
  }
  s.push_back(random("U(-1,1), diagonal 1e-8"));
  for (double& v : s.back().b) v = 1e-8;
  s.push_back(random("U(-1,1), diagonal 0"));
  for (double& v : s.back().b) v = 0;
  s.push_back(constant("tridiag(1, 1e-8, 1)", 1, 1e-8, 1));
  s.push_back(constant("tridiag(1, 1e8, 1)", 1, 1e8, 1));
  s.push_back(constant("tridiag(-1, 4, -1)", -1, 4, -1));
  s.push_back(constant("tridiag(-1, 4, 1)", -1, 4, 1));
  s.push_back(random("tridiag(U(-1,1), 4, U(-1,1))"));
  for (double& v : s.back().b) v = 4;
  for (Tri& t : s) t.a[0] = 0, t.c[n - 1] = 0;
  return s;
}

// dgtsv's elimination in any precision (the reference's factorisation).
template <typename T>
bool Gtsv(int n, std::vector<T> D, std::vector<T> DU, std::vector<T> DL, std::vector<T>& x) {
  for (int i = 0; i + 1 < n; ++i) {
    if (std::abs(D[i]) >= std::abs(DL[i])) {
      if (D[i] == 0) return false;
      const T f = DL[i] / D[i];
      D[i + 1] -= f * DU[i];
      x[i + 1] -= f * x[i];
      DL[i] = 0;
    } else {
      const T f = D[i] / DL[i];
      D[i] = DL[i];
      const T t = D[i + 1];
      D[i + 1] = DU[i] - f * t;
      if (i + 2 < n) {
        DL[i] = DU[i + 1];
        DU[i + 1] = -f * DL[i];
      } else {
        DL[i] = 0;
      }
      DU[i] = t;
      const T xb = x[i];
      x[i] = x[i + 1];
      x[i + 1] = xb - f * x[i + 1];
    }
  }
  if (D[n - 1] == 0) return false;
  x[n - 1] /= D[n - 1];
  if (n > 1) x[n - 2] = (x[n - 2] - DU[n - 2] * x[n - 1]) / D[n - 2];
  for (int i = n - 3; i >= 0; --i) x[i] = (x[i] - DU[i] * x[i + 1] - DL[i] * x[i + 2]) / D[i];
  return true;
}

inline std::vector<Ld> Reference(const Tri& t, const std::vector<double>& d) {
  const int n = int(d.size());
  std::vector<Ld> D(n), DU(n), DL(n), x(n), r(n);
  for (int k = 0; k < n; ++k) {
    D[k] = t.b[k];
    DU[k] = t.c[k];
    DL[k] = k + 1 < n ? t.a[k + 1] : 0;
    x[k] = d[k];
  }
  EXPECT_TRUE(Gtsv<Ld>(n, D, DU, DL, x)) << t.name;
  for (int step = 0; step < 8; ++step) {
    for (int k = 0; k < n; ++k) {
      Quad ax = Quad(t.b[k]) * Quad(x[k]);
      if (k > 0) ax += Quad(t.a[k]) * Quad(x[k - 1]);
      if (k + 1 < n) ax += Quad(t.c[k]) * Quad(x[k + 1]);
      r[k] = Ld(Quad(d[k]) - ax);
    }
    if (!Gtsv<Ld>(n, D, DU, DL, r)) break;
    for (int k = 0; k < n; ++k) x[k] += r[k];
  }
  return x;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// max |x - xref| / max |xref|; infinite for a system not OK or a non-finite x.
inline double ForwardError(const std::vector<double>& x, bool ok, const std::vector<Ld>& ref) {
  if (!ok) return kInf;
  Ld err = 0, xm = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    if (!std::isfinite(x[k])) return kInf;
    err = std::max(err, std::abs(Ld(x[k]) - ref[k]));
    xm = std::max(xm, std::abs(ref[k]));
  }
  return xm > 0 ? double(err / xm) : double(err);
}

// ||d - A x||_inf / (||A||_inf ||x||_inf + ||d||_inf), the residual in __float128.
inline double BackwardError(const Tri& t, const std::vector<double>& d, const std::vector<double>& x,
                     bool ok) {
  if (!ok) return kInf;
  const int n = int(d.size());
  double rm = 0, am = 0, xm = 0, dm = 0;
  for (int k = 0; k < n; ++k) {
    if (!std::isfinite(x[k])) return kInf;
    Quad ax = Quad(t.b[k]) * Quad(x[k]);
    double row = std::abs(t.b[k]);
    if (k > 0) ax += Quad(t.a[k]) * Quad(x[k - 1]), row += std::abs(t.a[k]);
    if (k + 1 < n) ax += Quad(t.c[k]) * Quad(x[k + 1]), row += std::abs(t.c[k]);
    const Quad rq = Quad(d[k]) - ax;
    rm = std::max(rm, std::abs(double(rq)));
    am = std::max(am, row);
    xm = std::max(xm, std::abs(x[k]));
    dm = std::max(dm, std::abs(d[k]));
  }
  const double den = am * xm + dm;
  return den > 0 ? rm / den : 0;
}

}  // namespace trisolve::stability
