// What backward stability promises for one float32 dense answer, and a check of it against
// LAPACK: no tolerance picked to make a test pass, a bound derived from the precision, the
// order and the matrix's condition number.
//
//   eta = ||b - A x^||_inf / (||A||_inf ||x^||_inf + ||b||_inf)  <=  n u
//
// (u = 2^-24; LU with partial pivoting and Gauss-Jordan on matrices of modest growth land far
// below it), and, with x the solution of the same float32 data computed in double by dgesv and
// kappa = ||A||_inf ||A^-1||_inf (dgecon's estimate, within a factor 3 in practice):
//
//   ||x^ - x||_inf / ||x||_inf  <=  4 * 2 kappa eta / (1 - kappa eta)
//
// (Higham, Accuracy and Stability of Numerical Algorithms, Thm 7.2: a perturbation of
// normwise size eta in A and b moves x by at most 2 kappa eta / (1 - kappa eta); 4 covers the
// estimate), plus the reference's own error, 4 n kappa 2^-53. The measured eta goes into the bound, so an answer whose forward error is not
// explained by its own residual -- a wrong answer that happens to be near -- fails.
#pragma once

#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "error_measure.h"

namespace trisolve::testing {

struct DenseFloat32Verdict {
  double eta = 0, eta_bound = 0, kappa = 0, forward = 0, forward_bound = 0;
  std::string fault;  // empty when the answer is within both bounds
};

// One system: A (row-major n x n) and b as stored in float32, x^ the answer to judge.
inline DenseFloat32Verdict JudgeFloat32(int64_t n, const float* A, const float* b,
                                        const float* xhat) {
  DenseFloat32Verdict v;
  constexpr double u = 0x1p-24;
  double anorm = 0, bnorm = 0, xnorm = 0, rnorm = 0;
  for (int64_t i = 0; i < n; ++i) {
    double row = 0, ax = 0;
    for (int64_t j = 0; j < n; ++j) {
      row += std::abs(double(A[i * n + j]));
      ax += double(A[i * n + j]) * double(xhat[j]);
    }
    anorm = WorseOf(anorm, row);
    bnorm = WorseOf(bnorm, std::abs(double(b[i])));
    xnorm = WorseOf(xnorm, std::abs(double(xhat[i])));
    rnorm = WorseOf(rnorm, std::abs(double(b[i]) - ax));
  }
  v.eta = rnorm / (anorm * xnorm + bnorm);
  if (std::isnan(v.eta)) v.eta = INFINITY;
  v.eta_bound = double(n) * u;
  // The float32 data in double: dgetrf, dgecon (infinity norm), dgetrs.
  std::vector<double> lu(A, A + n * n), x(b, b + n);
  std::vector<lapack_int> ipiv(n);
  if (LAPACKE_dgetrf(LAPACK_ROW_MAJOR, n, n, lu.data(), n, ipiv.data()) != 0) {
    v.fault = "dgetrf: the float32 matrix is singular in double";
    return v;
  }
  double rcond = 0;
  LAPACKE_dgecon(LAPACK_ROW_MAJOR, 'I', n, lu.data(), n, anorm, &rcond);
  LAPACKE_dgetrs(LAPACK_ROW_MAJOR, 'N', n, 1, lu.data(), n, ipiv.data(), x.data(), 1);
  v.kappa = rcond > 0 ? 1 / rcond : INFINITY;
  double dx = 0, xm = 0;
  for (int64_t i = 0; i < n; ++i) {
    dx = WorseOf(dx, std::abs(double(xhat[i]) - x[i]));
    xm = WorseOf(xm, std::abs(x[i]));
  }
  v.forward = dx / xm;
  // eta is the exact backward error of x^ as stored (Rigal and Gaches), so the bound holds for
  // it; the second term is the double reference's own error.
  const double ke = v.kappa * v.eta;
  v.forward_bound = ke < 0.5 ? 4 * 2 * ke / (1 - ke) + 4 * double(n) * v.kappa * 0x1p-53
                             : INFINITY;
  if (!(v.eta <= v.eta_bound))
    v.fault = absl::StrFormat("backward error %.3g over n u = %.3g", v.eta, v.eta_bound);
  else if (!(v.forward <= v.forward_bound))
    v.fault = absl::StrFormat("forward error %.3g over 8 kappa eta = %.3g (kappa %.3g, eta %.3g)",
                              v.forward, v.forward_bound, v.kappa, v.eta);
  return v;
}

}  // namespace trisolve::testing
