// One large tridiagonal system by partial pivoting on every core (cpu::PivotingSplit): the 20
// stability matrices against LAPACK dgtsv with the split forced, the fallbacks (a block that
// does not factor, a truly singular system), float32, and the batch entry points that use it
// for fewer large systems than threads (pivoting, and auto's second solve).
#include <lapacke.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "stability_matrices.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

using namespace ::trisolve::stability;

double DgtsvBackwardError(const Tri& t, const std::vector<double>& d) {
  const int n = int(d.size());
  std::vector<double> dl(t.a.begin() + 1, t.a.end()), dd = t.b, du(t.c.begin(), t.c.end() - 1),
      x = d;
  const lapack_int info =
      LAPACKE_dgtsv(LAPACK_COL_MAJOR, n, 1, dl.data(), dd.data(), du.data(), x.data(), n);
  return BackwardError(t, d, x, info == 0);
}

// The twenty matrices, in 16 and 64 parts: every answer within 10x of max(dgtsv's backward
// error, eps), split or not.
TEST(PivotingSplit, TwentyMatricesWithinTenTimesDgtsv) {
  for (int n : {1 << 14, 1 << 16}) {
    const std::vector<Tri> suite = Suite(n, 2021 + n);
    std::mt19937_64 rng(11 + n);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t parts : {int64_t(16), int64_t(64)}) {
      int split = 0;
      for (size_t m = 0; m < suite.size(); ++m) {
        const Tri& t = suite[m];
        std::vector<double> d(n);
        for (double& v : d) v = u(rng);
        std::vector<double> x(n, std::nan(""));
        const cpu::SplitPivoting r = cpu::PivotingSplit<double>(
            n, 1, t.a.data(), t.b.data(), t.c.data(), d.data(), x.data(), parts);
        const double lb = DgtsvBackwardError(t, d);
        const double gb = BackwardError(t, d, x, r.ok);
        split += r.split;
        if (std::isfinite(lb)) {
          EXPECT_TRUE(r.ok) << "#" << m + 1 << " " << t.name;
          EXPECT_LE(gb, 10 * std::max(lb, DBL_EPSILON))
              << "#" << m + 1 << " " << t.name << " n " << n << " in " << parts << " parts"
              << (r.split ? " (split)" : " (serial)") << ": " << gb << " against dgtsv's " << lb;
        }
        if (r.split) {
          EXPECT_LE(r.backward_error, cpu::kSplitPivotingTolerance * DBL_EPSILON);
        }
      }
      std::printf("n %d in %lld parts: %d of 20 answered split\n", n, (long long)parts, split);
      // Most of the suite is split (the rest fall back by design, e.g. the randsvd blocks whose
      // condition 1e15 lets the split's residual pass 8 eps): the split is not dead code.
      EXPECT_GE(split, 12);
    }
  }
}

// A zero diagonal (a = c = 1, b = 0, n even: nonsingular): every block has an even length,
// so every block factors and the split answers where its backward error passes the check (the
// sweep elsewhere: 16 parts gave 8.3 eps); for n odd the matrix is singular, and is reported so.
TEST(PivotingSplit, ZeroDiagonalSplitsAndItsOddFormIsSingular) {
  for (int n : {1 << 16, (1 << 16) + 1}) {
    Tri t{"zero diagonal", std::vector<double>(n, 1), std::vector<double>(n, 0),
          std::vector<double>(n, 1)};
    t.a[0] = 0, t.c[n - 1] = 0;
    std::vector<double> d(n);
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> u(-1, 1);
    for (double& v : d) v = u(rng);
    int split = 0;
    for (int64_t parts : {int64_t(15), int64_t(16), int64_t(64)}) {
      std::vector<double> x(n);
      const cpu::SplitPivoting r = cpu::PivotingSplit<double>(
          n, 1, t.a.data(), t.b.data(), t.c.data(), d.data(), x.data(), parts);
      if (n % 2 == 1) {
        EXPECT_FALSE(r.ok) << n << " " << parts;
        continue;
      }
      ASSERT_TRUE(r.ok) << parts;
      split += r.split;
      EXPECT_LE(BackwardError(t, d, x, r.ok),
                10 * std::max(DgtsvBackwardError(t, d), DBL_EPSILON));
    }
    if (n % 2 == 0) {
      EXPECT_GE(split, 2);
    }
  }
}

// A block that does not factor in a nonsingular matrix (the first two rows of a part's
// interior equal once the coupling to the interface before them is dropped): the serial
// sweep answers, as well.
TEST(PivotingSplit, ABlockThatDoesNotFactorFallsBackToTheSweep) {
  const int n = 1 << 16;
  const cpu::SplitLayout l = cpu::SplitPivotingLayout(n, 16);
  ASSERT_GE(l.parts, 3);
  Tri t{"", std::vector<double>(n, 1), std::vector<double>(n, 4), std::vector<double>(n, 1)};
  t.a[0] = 0, t.c[n - 1] = 0;
  const int r0 = int(l.rows);  // part 1's first row, after interface row rows - 1
  t.a[r0] = 1, t.b[r0] = 1, t.c[r0] = 1;
  t.a[r0 + 1] = 1, t.b[r0 + 1] = 1, t.c[r0 + 1] = 0;
  std::vector<double> d(n, 1.0), x(n);
  const cpu::SplitPivoting r = cpu::PivotingSplit<double>(n, 1, t.a.data(), t.b.data(),
                                                          t.c.data(), d.data(), x.data(), 16);
  ASSERT_TRUE(r.ok);
  EXPECT_FALSE(r.split);
  EXPECT_LE(BackwardError(t, d, x, r.ok), 10 * std::max(DgtsvBackwardError(t, d), DBL_EPSILON));
}

// Singular to working precision (two equal rows): not OK, as the serial sweep says.
TEST(PivotingSplit, ASingularSystemIsReportedNotAnswered) {
  const int n = 1 << 16;
  std::vector<double> a(n, 1), b(n, 4), c(n, 1), d(n, 1), x(n);
  a[0] = 0, c[n - 1] = 0;
  // Rows 5000 and 5001 the same: [.. 0 2 2 0 ..].
  a[5000] = 0, b[5000] = 2, c[5000] = 2;
  a[5001] = 2, b[5001] = 2, c[5001] = 0;
  a[5002] = 0;
  const cpu::SplitPivoting r =
      cpu::PivotingSplit<double>(n, 1, a.data(), b.data(), c.data(), d.data(), x.data(), 64);
  EXPECT_FALSE(r.ok);
}

TEST(PivotingSplit, Float32AndAStridedSystem) {
  const int n = 1 << 16, stride = 3;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(size_t(n) * stride), b(a.size()), c(a.size()), d(a.size()),
      x(a.size(), 0.f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = u(rng), b[i] = u(rng), c[i] = u(rng), d[i] = u(rng);
  const cpu::SplitPivoting r =
      cpu::PivotingSplit<float>(n, stride, a.data(), b.data(), c.data(), d.data(), x.data(), 128);
  ASSERT_TRUE(r.ok);
  // The residual of the strided system (its first column), from the original arrays.
  double rm = 0, am = 0, xm = 0, dm = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = k * stride;
    double ax = double(b[i]) * x[i], row = std::abs(b[i]);
    if (k > 0) ax += double(a[i]) * x[i - stride], row += std::abs(a[i]);
    if (k + 1 < n) ax += double(c[i]) * x[i + stride], row += std::abs(c[i]);
    rm = std::max(rm, std::abs(double(d[i]) - ax));
    am = std::max(am, row), xm = std::max(xm, double(std::abs(x[i]))),
    dm = std::max(dm, double(std::abs(d[i])));
  }
  EXPECT_LE(rm / (am * xm + dm), 64 * FLT_EPSILON) << (r.split ? "split" : "serial");
}

// Through the batch solver with four threads: one system of 2^17 rows by pivoting, and by auto
// on a zero diagonal (Thomas fails, the second solve splits): both as the serial sweep answers.
TEST(PivotingSplit, TheBatchSolverSplitsFewLargeSystems) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(4);
  ASSERT_GT(cpu::SplitPivotingParts<double>(1 << 17), 0);
  const int n = 1 << 17;
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(-1, 1);
  for (bool zero_diagonal : {false, true}) {
    Tri t{"", std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
    for (int k = 0; k < n; ++k)
      t.a[k] = u(rng), t.b[k] = zero_diagonal ? 0 : u(rng), t.c[k] = u(rng);
    if (zero_diagonal) std::fill(t.a.begin(), t.a.end(), 1.0), std::fill(t.c.begin(), t.c.end(), 1.0);
    t.a[0] = 0, t.c[n - 1] = 0;
    std::vector<double> d(n);
    for (double& v : d) v = u(rng);
    const double lb = DgtsvBackwardError(t, d);
    for (TridiagonalMethod m : {TridiagonalMethod::kPivoting, TridiagonalMethod::kAuto}) {
      std::vector<double> x(n, std::nan(""));
      SystemStatus st = SystemStatus::kDiverged;
      TridiagonalProblem<double> p{1, n, Layout::kFlat, t.a.data(), t.b.data(), t.c.data(),
                                   d.data()};
      const SolveInfo info = cpu::SolveTridiagonal(p, m, TridiagonalOutput<double>{x.data(), &st});
      ASSERT_EQ(st, SystemStatus::kOk) << MethodName(m) << " " << info.method;
      EXPECT_LE(BackwardError(t, d, x, true), 10 * std::max(lb, DBL_EPSILON))
          << MethodName(m) << " " << info.method;
      if (m == TridiagonalMethod::kAuto && zero_diagonal) {
        EXPECT_EQ(info.method, "thomas + pivoting (1 systems)");
      }
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace trisolve
