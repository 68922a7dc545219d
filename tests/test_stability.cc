// The stability suite of issue 33: the 20 tridiagonal test matrices of Chang et al. (SC 2012)
// as extended by Klein & Strzodka (ICPP 2021, Table 1; /work/shared/ANCHORS.md), at n = 512
// and n = 2^14, random right-hand sides U(-1, 1); for every CPU method the forward error
// against a high-accuracy reference and the normwise backward error from the original arrays,
// beside LAPACK dgtsv's. Prints the tables as markdown (docs/stability.md is this output). The
// matrices, the reference and the measures: stability_matrices.h.
#include <lapacke.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "stability_matrices.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

using namespace ::trisolve::stability;  // the suite, the reference, the error measures

struct Result {
  double fwd, bwd;
  bool ok;
};

constexpr TridiagonalMethod kMethods[] = {TridiagonalMethod::kThomas, TridiagonalMethod::kPcr,
                                          TridiagonalMethod::kPartitioned,
                                          TridiagonalMethod::kPivoting, TridiagonalMethod::kAuto};
constexpr int kColumns = 6;  // the five methods and dgtsv

std::string Cell(const Result& r) {
  if (!r.ok) return "SINGULAR";
  if (!std::isfinite(r.fwd)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", r.fwd);
  return buf;
}
std::string CellB(const Result& r) {
  if (!r.ok) return "SINGULAR";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", r.bwd);
  return buf;
}

TEST(Stability, TwentyMatricesAgainstDgtsv) {
  for (int n : {512, 1 << 14}) {
    const std::vector<Tri> suite = Suite(n, 2021 + n);
    ASSERT_EQ(suite.size(), 20u);
    std::vector<std::array<Result, kColumns>> table;
    std::vector<std::string> autos;
    std::mt19937_64 rng(7 + n);
    std::uniform_real_distribution<double> u(-1, 1);
    for (const Tri& t : suite) {
      std::vector<double> d(n);
      for (double& v : d) v = u(rng);
      const std::vector<Ld> ref = Reference(t, d);
      std::array<Result, kColumns> row{};
      for (int m = 0; m < 5; ++m) {
        std::vector<double> x(n, std::nan(""));
        SystemStatus st = SystemStatus::kDiverged;
        TridiagonalProblem<double> p{1, n, Layout::kFlat, t.a.data(), t.b.data(), t.c.data(),
                                     d.data()};
        const SolveInfo info =
            cpu::SolveTridiagonal(p, kMethods[m], TridiagonalOutput<double>{x.data(), &st});
        const bool ok = st == SystemStatus::kOk;
        row[m] = {ForwardError(x, ok, ref), BackwardError(t, d, x, ok), ok};
        if (kMethods[m] == TridiagonalMethod::kAuto) autos.push_back(info.method);
      }
      {  // LAPACK dgtsv
        std::vector<double> dl(t.a.begin() + 1, t.a.end()), dd = t.b, du(t.c.begin(), t.c.end() - 1),
            x = d;
        const lapack_int info = LAPACKE_dgtsv(LAPACK_COL_MAJOR, n, 1, dl.data(), dd.data(),
                                              du.data(), x.data(), n);
        const bool ok = info == 0;
        row[5] = {ForwardError(x, ok, ref), BackwardError(t, d, x, ok), ok};
      }
      table.push_back(row);
    }
    // The tables, markdown.
    const char* heads = "| # | matrix | thomas | pcr | partitioned | pivoting | auto | dgtsv |\n"
                        "|---|---|---|---|---|---|---|---|\n";
    for (int which = 0; which < 2; ++which) {
      std::printf("\n### %s error, n = %d\n\n%s", which == 0 ? "Backward" : "Forward", n, heads);
      for (size_t i = 0; i < suite.size(); ++i) {
        std::printf("| %zu | %s |", i + 1, suite[i].name.c_str());
        for (int m = 0; m < kColumns; ++m)
          std::printf(" %s |", (which == 0 ? CellB(table[i][m]) : Cell(table[i][m])).c_str());
        std::printf("\n");
      }
    }
    std::printf("\nauto's methods, n = %d:", n);
    for (size_t i = 0; i < autos.size(); ++i) std::printf(" %zu: %s;", i + 1, autos[i].c_str());
    std::printf("\n");
    double worst_piv = 0, worst_lapack = 0, worst_ratio = 0;
    for (size_t i = 0; i < suite.size(); ++i) {
      const Result& piv = table[i][3];
      const Result& au = table[i][4];
      const Result& lp = table[i][5];
      // Every matrix of the suite is nonsingular (n even for the zero diagonal): pivoting and
      // auto never call one SINGULAR; dgtsv solves all of them too.
      EXPECT_TRUE(lp.ok) << i + 1;
      EXPECT_TRUE(piv.ok) << "pivoting, matrix " << i + 1 << " n " << n;
      EXPECT_TRUE(au.ok) << "auto, matrix " << i + 1 << " n " << n;
      // Backward error within 10x of dgtsv's, the floor eps: a backward error below eps is
      // rounding luck on either side (dgtsv's is often ~1e-18), not a property to match.
      const double bound = 10 * std::max(lp.bwd, DBL_EPSILON);
      EXPECT_TRUE(piv.bwd <= bound) << "pivoting, matrix " << i + 1 << " n " << n << ": "
                                    << piv.bwd << " against dgtsv " << lp.bwd;
      EXPECT_TRUE(au.bwd <= bound) << "auto, matrix " << i + 1 << " n " << n << ": " << au.bwd
                                   << " against dgtsv " << lp.bwd;
      // The same elimination as dgtsv: the same forward error up to rounding.
      EXPECT_TRUE(piv.fwd <= 10 * std::max(lp.fwd, DBL_EPSILON))
          << "pivoting forward, matrix " << i + 1 << ": " << piv.fwd << " against " << lp.fwd;
      worst_piv = std::max(worst_piv, piv.bwd);
      worst_lapack = std::max(worst_lapack, lp.bwd);
      if (lp.bwd > 0) worst_ratio = std::max(worst_ratio, piv.bwd / std::max(lp.bwd, DBL_EPSILON));
    }
    std::printf("\nn = %d: worst backward error pivoting %.2e, dgtsv %.2e; worst ratio to "
                "max(dgtsv, eps) %.2f\n", n, worst_piv, worst_lapack, worst_ratio);
  }
}

TEST(Stability, ErrorMeasuresNeverScoreANaNAsSmall) {
  Tri t{"", {0, 1, 1}, {4, 4, 4}, {1, 1, 0}};
  const std::vector<double> d = {1, 2, 3};
  const std::vector<Ld> ref = Reference(t, d);
  std::vector<double> x = {double(ref[0]), std::nan(""), double(ref[2])};
  EXPECT_FALSE(ForwardError(x, true, ref) <= 1.0);
  EXPECT_FALSE(BackwardError(t, d, x, true) <= 1.0);
  x[1] = double(ref[1]);
  EXPECT_TRUE(ForwardError(x, true, ref) <= 1e-16);
  EXPECT_TRUE(BackwardError(t, d, x, true) <= 1e-16);
  EXPECT_FALSE(BackwardError(t, d, x, false) <= 1.0);  // not OK: a failure, whatever x holds
}

}  // namespace
}  // namespace trisolve
