#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "error_measure.h"
#include "gtest/gtest.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"
#include "trisolve/windows.h"

namespace trisolve {
namespace {

template <typename T>
struct Batch {
  int64_t batch, n;
  Layout layout;
  std::vector<T> a, b, c, d, x;
  std::vector<SystemStatus> status;
  TridiagonalProblem<T> problem() const {
    return {batch, n, layout, a.data(), b.data(), c.data(), d.data()};
  }
};

// Random diagonally dominant systems.
template <typename T>
Batch<T> Random(int64_t batch, int64_t n, Layout layout, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Batch<T> s{batch, n, layout};
  const size_t N = batch * n;
  s.a.resize(N); s.b.resize(N); s.c.resize(N); s.d.resize(N);
  for (size_t e = 0; e < N; ++e) {
    s.a[e] = T(u(rng));
    s.c[e] = T(u(rng));
    s.b[e] = T((std::abs(double(s.a[e])) + std::abs(double(s.c[e])) + 0.5 + std::abs(u(rng))) *
               (u(rng) < 0 ? -1 : 1));
    s.d[e] = T(u(rng));
  }
  return s;
}

template <typename T>
void Solve(Batch<T>& s, TridiagonalMethod m) {
  s.x.assign(s.batch * s.n, T(std::nan("")));  // poisoned: every element must be written
  s.status.assign(s.batch, SystemStatus::kDiverged);
  cpu::SolveTridiagonal(s.problem(), m, TridiagonalOutput<T>{s.x.data(), s.status.data()});
}

// ||d - A x||_inf / (||A||_inf ||x||_inf + ||d||_inf), from the original arrays, per system.
template <typename T>
double WorstResidual(const Batch<T>& s) {
  double worst = 0;
  for (int64_t sys = 0; sys < s.batch; ++sys) {
    auto at = [&](const std::vector<T>& v, int64_t k) {
      return double(v[ElementIndex(s.layout, s.batch, s.n, sys, k)]);
    };
    double r = 0, an = 0, xn = 0, dn = 0;
    for (int64_t k = 0; k < s.n; ++k) {
      double ax = at(s.b, k) * at(s.x, k), row = std::abs(at(s.b, k));
      if (k > 0) ax += at(s.a, k) * at(s.x, k - 1), row += std::abs(at(s.a, k));
      if (k + 1 < s.n) ax += at(s.c, k) * at(s.x, k + 1), row += std::abs(at(s.c, k));
      r = std::max(r, std::abs(at(s.d, k) - ax));
      an = std::max(an, row);
      xn = std::max(xn, std::abs(at(s.x, k)));
      dn = std::max(dn, std::abs(at(s.d, k)));
    }
    bool finite = true;
    for (int64_t k = 0; k < s.n; ++k) finite &= std::isfinite(at(s.x, k));
    const double e = finite ? r / (an * xn + dn) : std::numeric_limits<double>::infinity();
    if (!(e <= worst)) worst = e;  // a non-finite x never scores small
  }
  return worst;
}

TEST(Tridiagonal, HandWorked3x3) {
  // [2 1 0; 1 2 1; 0 1 2] x = [4 8 8] has x = [1 2 3].
  for (auto m : {TridiagonalMethod::kThomas, TridiagonalMethod::kPcr, TridiagonalMethod::kPartitioned}) {
    Batch<double> s{1, 3, Layout::kFlat, {0, 1, 1}, {2, 2, 2}, {1, 1, 0}, {4, 8, 8}};
    Solve(s, m);
    EXPECT_EQ(s.status[0], SystemStatus::kOk);
    EXPECT_NEAR(s.x[0], 1, 1e-15);
    EXPECT_NEAR(s.x[1], 2, 1e-15);
    EXPECT_NEAR(s.x[2], 3, 1e-15);
  }
}

TEST(Tridiagonal, HandWorkedOneAndTwo) {
  for (auto m : {TridiagonalMethod::kThomas, TridiagonalMethod::kPcr, TridiagonalMethod::kPartitioned}) {
    Batch<double> one{1, 1, Layout::kFlat, {7}, {4}, {9}, {2}};
    Solve(one, m);
    EXPECT_DOUBLE_EQ(one.x[0], 0.5);
    // [3 1; 2 4] x = [5 10] -> x = [1 2]
    Batch<double> two{1, 2, Layout::kFlat, {0, 2}, {3, 4}, {1, 0}, {5, 10}};
    Solve(two, m);
    EXPECT_NEAR(two.x[0], 1, 1e-15);
    EXPECT_NEAR(two.x[1], 2, 1e-15);
  }
}

TEST(Tridiagonal, InterleavedLayoutIsTheFlatOneTransposed) {
  auto flat = Random<double>(5, 7, Layout::kFlat, 1);
  Batch<double> inter{5, 7, Layout::kInterleaved};
  for (auto* v : {&inter.a, &inter.b, &inter.c, &inter.d}) v->resize(35);
  for (int s = 0; s < 5; ++s)
    for (int k = 0; k < 7; ++k) {
      inter.a[k * 5 + s] = flat.a[s * 7 + k];
      inter.b[k * 5 + s] = flat.b[s * 7 + k];
      inter.c[k * 5 + s] = flat.c[s * 7 + k];
      inter.d[k * 5 + s] = flat.d[s * 7 + k];
    }
  for (auto m : {TridiagonalMethod::kThomas, TridiagonalMethod::kPcr, TridiagonalMethod::kPartitioned}) {
    Solve(flat, m);
    Solve(inter, m);
    for (int s = 0; s < 5; ++s)
      for (int k = 0; k < 7; ++k) EXPECT_DOUBLE_EQ(inter.x[k * 5 + s], flat.x[s * 7 + k]);
  }
}

class TridiagonalSizes : public ::testing::TestWithParam<std::tuple<int64_t, Layout, TridiagonalMethod>> {};

TEST_P(TridiagonalSizes, ResidualAndAgreementFloat64) {
  const auto [n, layout, m] = GetParam();
  auto s = Random<double>(9, n, layout, 100 + n);
  Solve(s, m);
  for (auto st : s.status) EXPECT_EQ(st, SystemStatus::kOk);
  EXPECT_LT(WorstResidual(s), 1e-15) << "n=" << n;
  EXPECT_LT(TridiagonalBackwardError(s.problem(), s.x.data(), s.status.data()), 1e-15);
  // Both methods compute the same solution.
  auto t = s;
  Solve(t, m == TridiagonalMethod::kPcr ? TridiagonalMethod::kThomas : TridiagonalMethod::kPcr);
  for (size_t e = 0; e < s.x.size(); ++e) EXPECT_NEAR(s.x[e], t.x[e], 1e-12 * (1 + std::abs(t.x[e])));
}

TEST_P(TridiagonalSizes, ResidualFloat32) {
  const auto [n, layout, m] = GetParam();
  auto s = Random<float>(9, n, layout, 200 + n);
  Solve(s, m);
  for (auto st : s.status) EXPECT_EQ(st, SystemStatus::kOk);
  EXPECT_LT(WorstResidual(s), 2e-6) << "n=" << n;
}

// PCR at n = 1, 2, 3, 11, 1000 and other non-powers of two, against powers of two.
INSTANTIATE_TEST_SUITE_P(
    Sizes, TridiagonalSizes,
    ::testing::Combine(::testing::Values(1, 2, 3, 5, 7, 8, 11, 16, 31, 32, 33, 100, 1000, 1025),
                       ::testing::Values(Layout::kFlat, Layout::kInterleaved),
                       ::testing::Values(TridiagonalMethod::kThomas, TridiagonalMethod::kPcr,
                                         TridiagonalMethod::kPartitioned,
                                         TridiagonalMethod::kPivoting, TridiagonalMethod::kAuto)));

TEST(Tridiagonal, SingularSystemsAreFlaggedAndZeroed) {
  // System 1 has a zero first pivot; system 2's second pivot cancels exactly:
  // [1 1; 1 1]. The others must be untouched by their neighbours' failure.
  auto s = Random<double>(4, 2, Layout::kFlat, 7);
  s.b[2] = 0;
  s.b[4] = 1; s.c[4] = 1; s.a[5] = 1; s.b[5] = 1;
  for (auto m : {TridiagonalMethod::kThomas, TridiagonalMethod::kPcr, TridiagonalMethod::kPartitioned}) {
    Solve(s, m);
    EXPECT_EQ(s.status[0], SystemStatus::kOk);
    EXPECT_EQ(s.status[1], SystemStatus::kSingular);
    EXPECT_EQ(s.status[2], SystemStatus::kSingular);
    EXPECT_EQ(s.status[3], SystemStatus::kOk);
    for (int k = 2; k < 6; ++k) EXPECT_EQ(s.x[k], 0.0);
    for (double v : s.x) EXPECT_TRUE(std::isfinite(v));
  }
}

TEST(Tridiagonal, PivotingSolvesWhatOnlyLooksSingular) {
  // The same batch: system 1 ([0 c; a b], a zero first pivot) is nonsingular and pivoting
  // solves it; system 2 ([1 1; 1 1]) is singular to working precision and stays SINGULAR,
  // zeroed. auto re-solves both by pivoting and says so.
  auto s = Random<double>(4, 2, Layout::kFlat, 7);
  s.b[2] = 0;
  s.b[4] = 1; s.c[4] = 1; s.a[5] = 1; s.b[5] = 1;
  for (auto m : {TridiagonalMethod::kPivoting, TridiagonalMethod::kAuto}) {
    s.x.assign(8, std::nan(""));
    s.status.assign(4, SystemStatus::kDiverged);
    const SolveInfo info =
        cpu::SolveTridiagonal(s.problem(), m, TridiagonalOutput<double>{s.x.data(), s.status.data()});
    EXPECT_EQ(info.method, m == TridiagonalMethod::kAuto ? "thomas + pivoting (2 systems)" : "pivoting");
    EXPECT_EQ(s.status[0], SystemStatus::kOk);
    EXPECT_EQ(s.status[1], SystemStatus::kOk);
    EXPECT_EQ(s.status[2], SystemStatus::kSingular);
    EXPECT_EQ(s.status[3], SystemStatus::kOk);
    EXPECT_EQ(s.x[4], 0.0);
    EXPECT_EQ(s.x[5], 0.0);
    // [0 c2; a3 b3] x = d: x1 = d2 / c2, x0 = (d3 - b3 x1) / a3.
    EXPECT_NEAR(s.x[3], s.d[2] / s.c[2], 1e-14 * std::abs(s.x[3]) + 1e-300);
    EXPECT_NEAR(s.x[2], (s.d[3] - s.b[3] * s.x[3]) / s.a[3], 1e-13 * (1 + std::abs(s.x[2])));
  }
}

// b = 0, a = c = 1: the example (n even: nonsingular, condition number 41 at every
// size tried; n odd: singular). Every method without pivoting meets a zero pivot; pivoting and
// auto solve it to rounding, both layouts, float64 and float32, mixed with dominant systems.
template <typename T>
void ZeroDiagonal(Layout layout, int64_t n, T tol) {
  const int64_t batch = 7;
  auto s = Random<T>(batch, n, layout, 31 + n);
  std::vector<T> xs(batch * n);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  for (auto& v : xs) v = T(u(rng));
  for (int64_t sys : {1, 4, 5})
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = ElementIndex(layout, batch, n, sys, k);
      s.a[i] = T(1);
      s.b[i] = T(0);
      s.c[i] = T(1);
    }
  for (int64_t sys = 0; sys < batch; ++sys)
    for (int64_t k = 0; k < n; ++k) {
      auto at = [&](int64_t kk) { return ElementIndex(layout, batch, n, sys, kk); };
      double v = double(s.b[at(k)]) * xs[at(k)];
      if (k > 0) v += double(s.a[at(k)]) * xs[at(k - 1)];
      if (k + 1 < n) v += double(s.c[at(k)]) * xs[at(k + 1)];
      s.d[at(k)] = T(v);
    }
  for (auto m : {TridiagonalMethod::kThomas, TridiagonalMethod::kPcr, TridiagonalMethod::kPartitioned}) {
    Solve(s, m);
    EXPECT_EQ(s.status[1], SystemStatus::kSingular) << MethodName(m);
    EXPECT_EQ(s.status[0], SystemStatus::kOk) << MethodName(m);
  }
  for (auto m : {TridiagonalMethod::kPivoting, TridiagonalMethod::kAuto}) {
    s.x.assign(batch * n, T(std::nan("")));
    s.status.assign(batch, SystemStatus::kDiverged);
    const SolveInfo info =
        cpu::SolveTridiagonal(s.problem(), m, TridiagonalOutput<T>{s.x.data(), s.status.data()});
    for (auto st : s.status) ASSERT_EQ(st, SystemStatus::kOk) << info.method << " n " << n;
    if (m == TridiagonalMethod::kAuto) {
      EXPECT_EQ(info.method, "thomas + pivoting (3 systems)");
    }
    double err = 0;
    for (int64_t e = 0; e < batch * n; ++e) {
      const double d = std::abs(double(s.x[e]) - double(xs[e]));
      if (!(d <= err)) err = d;  // NaN wins
    }
    EXPECT_TRUE(err <= double(tol)) << info.method << " n " << n << " error " << err;
    EXPECT_TRUE(TridiagonalBackwardError(s.problem(), s.x.data(), s.status.data()) <= double(tol) / 10);
  }
  // The re-solve the CUDA backend calls: only the SINGULAR systems, x and status patched.
  Solve(s, TridiagonalMethod::kThomas);
  auto before = s.x;
  SolveInfo info;
  info.method = "thomas";
  EXPECT_EQ(cpu::ResolveSingularWithPivoting(s.problem(), TridiagonalOutput<T>{s.x.data(), s.status.data()}, &info), 3);
  EXPECT_EQ(info.method, "thomas + pivoting (3 systems)");
  for (auto st : s.status) EXPECT_EQ(st, SystemStatus::kOk);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = ElementIndex(layout, batch, n, 0, k);
    EXPECT_EQ(s.x[i], before[i]);  // a system that was OK is not touched
  }
  EXPECT_EQ(cpu::ResolveSingularWithPivoting(s.problem(), TridiagonalOutput<T>{s.x.data(), s.status.data()}, &info), 0);
}

TEST(Tridiagonal, ZeroDiagonalNeedsPivoting) {
  for (Layout l : {Layout::kFlat, Layout::kInterleaved})
    for (int64_t n : {2, 4, 10, 64, 1000}) {
      ZeroDiagonal<double>(l, n, 1e-13);
      ZeroDiagonal<float>(l, n, 1e-5f);
    }
  // n odd: singular (a zero determinant), and pivoting says so.
  Batch<double> s{1, 3, Layout::kFlat, {0, 1, 1}, {0, 0, 0}, {1, 1, 0}, {1, 1, 1}};
  Solve(s, TridiagonalMethod::kPivoting);
  EXPECT_EQ(s.status[0], SystemStatus::kSingular);
  for (double v : s.x) EXPECT_EQ(v, 0.0);
  Solve(s, TridiagonalMethod::kAuto);
  EXPECT_EQ(s.status[0], SystemStatus::kSingular);
}

TEST(Tridiagonal, PivotingNeedsNoDominance) {
  // Random U(-1, 1) entries (not dominant) and a tiny diagonal: pivoting's backward error stays
  // at rounding level; auto's growth check sends such systems to pivoting.
  for (Layout l : {Layout::kFlat, Layout::kInterleaved})
    for (double diag : {-1.0, 1e-8}) {
      auto s = Random<double>(16, 500, l, 3);
      std::mt19937_64 rng(9);
      std::uniform_real_distribution<double> u(-1, 1);
      for (auto& v : s.b) v = diag < 0 ? u(rng) : diag;
      Solve(s, TridiagonalMethod::kPivoting);
      for (auto st : s.status) ASSERT_EQ(st, SystemStatus::kOk);
      const double piv = TridiagonalBackwardError(s.problem(), s.x.data(), s.status.data());
      EXPECT_TRUE(piv <= 1e-15) << piv;
      s.x.assign(s.x.size(), std::nan(""));
      const SolveInfo info = cpu::SolveTridiagonal(
          s.problem(), TridiagonalMethod::kAuto,
          TridiagonalOutput<double>{s.x.data(), s.status.data()});
      for (auto st : s.status) ASSERT_EQ(st, SystemStatus::kOk);
      EXPECT_NE(info.method.find("thomas + pivoting ("), std::string::npos) << info.method;
      const double au = TridiagonalBackwardError(s.problem(), s.x.data(), s.status.data());
      EXPECT_TRUE(au <= 1e-15) << au;
    }
  // A NaN in x must never score as a small error.
  auto s = Random<double>(1, 8, Layout::kFlat, 1);
  Solve(s, TridiagonalMethod::kPivoting);
  s.x[3] = std::nan("");
  EXPECT_FALSE(WorstResidual(s) <= 1.0);
  EXPECT_FALSE(TridiagonalBackwardError(s.problem(), s.x.data(), s.status.data()) <= 1.0);
}

TEST(Tridiagonal, AllZeroRowIsSingularInFloat32) {
  Batch<float> s{1, 3, Layout::kFlat, {0, 0, 1}, {1, 0, 1}, {1, 0, 0}, {1, 1, 1}};
  Solve(s, TridiagonalMethod::kThomas);
  EXPECT_EQ(s.status[0], SystemStatus::kSingular);
}

// The overlapping windows of the CUDA backend's partitioned-window kernel (trisolve/windows.h):
// the cores tile each system, every window reads `halo` rows past its core on each side that has
// a neighbour and no more than `rows`, cores are whole multiples of `align`.
TEST(TridiagonalWindows, PlanCoversEveryRowOnce) {
  int planned = 0;
  for (int64_t rows : {64, 4096})
    for (int64_t halo : {0, 8, 16, 128, 256, 512})
      for (int64_t align : {1, 2, 4})
        for (int64_t n : {1, 2, 63, 64, 65, 100, 4095, 4096, 4097, 4098, 5000, 16384, 50000,
                          1 << 20, (1 << 20) + 4}) {
          SCOPED_TRACE(::testing::Message() << "rows " << rows << " halo " << halo << " align "
                                            << align << " n " << n);
          const WindowPlan w = PlanWindows(n, rows, halo, align);
          if (n > rows && rows <= 2 * halo) {
            EXPECT_EQ(w.per_system, 0);
            continue;
          }
          ASSERT_GE(w.per_system, 1);
          if (n <= rows) {
            EXPECT_EQ(w.per_system, 1);
          }
          // The fewest windows of at most `rows` rows: one fewer would not hold n.
          if (w.per_system > 1) {
            EXPECT_EQ(w.core % align, 0);
            EXPECT_GT(n, (w.per_system - 1) * (rows - 2 * halo));
          }
          int64_t next = 0;
          for (int64_t k = 0; k < w.per_system; ++k) {
            const WindowRows r = WindowAt(w, n, k);
            ASSERT_EQ(r.c0, next);
            ASSERT_LT(r.c0, r.c1);
            EXPECT_EQ(r.lo, std::max<int64_t>(0, r.c0 - halo));
            EXPECT_EQ(r.hi, std::min<int64_t>(n, r.c1 + halo));
            EXPECT_LE(r.hi - r.lo, std::max(rows, n <= rows ? n : rows));
            next = r.c1;
          }
          EXPECT_EQ(next, n);
          ++planned;
        }
  EXPECT_GT(planned, 400);
}

// One system as a chain of windows, 32 a warp (thomas-window's): the parts tile the system,
// each of equal cores, multiples of the alignment and at least the least core; where there are
// two the first is whole tasks and the second's cores one alignment longer; the tasks fit the
// warps; and the longest core is the shortest that does (no plan of a shorter one fits: a
// search over every single core and every split into the two parts). Worked by hand: 2^24 rows
// on the H100's 528 warps are 496 tasks of 992-row windows and 32 of 1008-row ones
// (496 * 32 * 992 + 1024 * 1008 = 2^24), where windows of 1024 would take 512 warps.
TEST(TridiagonalWindows, ChainPlanFitsTheWarpsWithTheShortestCores) {
  const ChainPlan h100 = PlanChain(int64_t(1) << 24, 528, 32, 16, 512);
  ASSERT_EQ(h100.parts, 2);
  EXPECT_EQ(h100.part[0].start, 0);
  EXPECT_EQ(h100.part[0].core, 992);
  EXPECT_EQ(h100.part[0].windows, 496 * 32);
  EXPECT_EQ(h100.part[1].start, 496 * 32 * 992);
  EXPECT_EQ(h100.part[1].core, 1008);
  EXPECT_EQ(h100.part[1].windows, 1024);
  EXPECT_EQ(h100.tasks, 528);
  const ChainPlan mirrored = PlanChain(int64_t(1) << 24, 528, 32, 16, 512, true);
  ASSERT_EQ(mirrored.parts, 1);
  EXPECT_EQ(mirrored.part[0].core, 1024);
  EXPECT_EQ(mirrored.tasks, 512);
  EXPECT_EQ(PlanChain((int64_t(1) << 24) + 8, 528, 32, 16, 512).parts, 0);  // (not whole chunks)
  EXPECT_EQ(PlanChain(32 * 512 - 16, 528, 32, 16, 512).parts, 0);  // (under one task)
  // Does a plan whose longest core is m units (of 16 rows) fit `warps`?
  auto fits = [](int64_t units, int64_t warps, int64_t m, bool one_part) {
    if (m >= 32 && units % m == 0 && (units / m + 31) / 32 <= warps) return true;
    for (int64_t ta = 1; !one_part && m - 1 >= 32 && 32 * ta * (m - 1) + m <= units; ++ta) {
      const int64_t rest = units - 32 * ta * (m - 1);
      if (rest % m == 0 && ta + (rest / m + 31) / 32 <= warps) return true;
    }
    return false;
  };
  int planned = 0;
  for (int64_t warps : {1, 7, 40, 264, 528})
    for (int64_t n : {int64_t(16384), int64_t(40000), int64_t(65536), int64_t(1) << 20,
                      int64_t(3000000), int64_t(10000000), int64_t(1) << 24,
                      (int64_t(1) << 24) + 16, int64_t(3) << 23, int64_t(1) << 25})
      for (bool one_part : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "warps " << warps << " n " << n
                                          << (one_part ? " one part" : ""));
        const ChainPlan p = PlanChain(n, warps, 32, 16, 512, one_part);
        ASSERT_GE(p.parts, 1);
        ASSERT_LE(p.parts, one_part ? 1 : 2);
        int64_t next = 0, tasks = 0;
        for (int i = 0; i < p.parts; ++i) {
          const ChainPart& c = p.part[i];
          EXPECT_EQ(c.start, next);
          EXPECT_EQ(c.core % 16, 0);
          EXPECT_GE(c.core, 512);
          EXPECT_GE(c.windows, 1);
          next += c.core * c.windows;
          tasks += (c.windows + 31) / 32;
        }
        EXPECT_EQ(next, n);
        EXPECT_EQ(tasks, p.tasks);
        EXPECT_LE(p.tasks, warps);
        if (p.parts == 2) {
          EXPECT_EQ(p.part[0].windows % 32, 0);
          EXPECT_EQ(p.part[1].core, p.part[0].core + 16);
        }
        const int64_t longest = p.part[p.parts - 1].core / 16;
        for (int64_t m = 32; m < longest; ++m) ASSERT_FALSE(fits(n / 16, warps, m, one_part)) << m;
        ++planned;
      }
  EXPECT_EQ(planned, 100);
}

// x by the windows of `w`, each solved alone (the couplings past it dropped) by Thomas, kept on
// its core.
template <typename T>
std::vector<T> SolveByWindows(const Batch<T>& s, const WindowPlan& w) {
  std::vector<T> x(s.n), xw(s.n), work(s.n);
  for (int64_t k = 0; k < w.per_system; ++k) {
    const WindowRows r = WindowAt(w, s.n, k);
    const int64_t len = r.hi - r.lo;
    std::vector<T> a(s.a.begin() + r.lo, s.a.begin() + r.hi);
    std::vector<T> c(s.c.begin() + r.lo, s.c.begin() + r.hi);
    a[0] = 0;
    c[len - 1] = 0;
    EXPECT_TRUE(cpu::ThomasStrided<T>(len, 1, a.data(), s.b.data() + r.lo, c.data(),
                                      s.d.data() + r.lo, xw.data(), work.data()));
    for (int64_t i = r.c0; i < r.c1; ++i) x[i] = xw[i - r.lo];
  }
  return x;
}

// The truncation bound of windows.h, |error| <= 2 rho^(halo + 1) max |x|, is attained by a lower
// bidiagonal system (a = rho b, c = 0: the dropped coupling's effect decays by exactly rho a
// row): with halos short enough that the error is far above rounding, the windows' error is the
// bound to within 1%. Float64.
TEST(TridiagonalWindows, TruncationErrorIsTheBoundAtWorst) {
  for (double rho : {0.3, 0.6, 0.9})
    for (int64_t halo : {4, 10, 20}) {
      SCOPED_TRACE(::testing::Message() << "rho " << rho << " halo " << halo);
      const int64_t n = 4000;
      Batch<double> s{1, n, Layout::kFlat};
      s.a.assign(n, rho);
      s.b.assign(n, 1.0);
      s.c.assign(n, 0.0);
      s.d.assign(n, 1.0);
      s.d[0] = 1 / (1 + rho);
      Solve(s, TridiagonalMethod::kThomas);  // x = 1 / (1 + rho) on every row
      const auto x = SolveByWindows(s, PlanWindows(n, 256, halo, 1));
      double err = 0, xmax = 0;
      for (int64_t i = 0; i < n; ++i) {
        err = testing::WorseOf(err, std::abs(x[i] - s.x[i]));
        xmax = testing::WorseOf(xmax, std::abs(s.x[i]));
      }
      const double bound = std::pow(rho, double(halo + 1)) * xmax;  // one side drops a coupling
      if (bound < 1e-13) continue;
      EXPECT_LE(err, bound * (1 + 1e-9) + 1e-15);
      EXPECT_GE(err, 0.99 * bound);
    }
}

// At the limit WindowDominanceLimit gives, the windows' solution of random systems whose rows
// all have (|a| + |c|) / |b| = rho (signs random) is the full solution to rounding, with the
// CUDA kernel's halo of 256 rows and windows of 4096 rows.
template <typename T>
void WindowsAtTheLimit(int64_t halo, double tol) {
  const double limit = WindowDominanceLimit(halo, std::numeric_limits<T>::digits);
  for (double rho : {0.5, limit}) {
    SCOPED_TRACE(::testing::Message() << "rho " << rho);
    const int64_t n = 40000;
    auto s = Random<T>(1, n, Layout::kFlat, 11);
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<double> u(0, 1);
    for (int64_t i = 0; i < n; ++i) {  // |a| + |c| = rho |b|, split at random
      const double b = std::abs(double(s.b[i])), t = u(rng);
      s.a[i] = T((s.a[i] < 0 ? -1 : 1) * rho * b * t);
      s.c[i] = T((s.c[i] < 0 ? -1 : 1) * rho * b * (1 - t));
    }
    Solve(s, TridiagonalMethod::kThomas);
    const auto x = SolveByWindows(s, PlanWindows(n, 4096, halo, 16 / sizeof(T)));
    double err = 0, xmax = 0;
    for (int64_t i = 0; i < n; ++i) {
      err = testing::WorseOf(err, std::abs(double(x[i]) - double(s.x[i])));
      xmax = testing::WorseOf(xmax, std::abs(double(s.x[i])));
    }
    EXPECT_LE(err, tol * xmax);
  }
}
TEST(TridiagonalWindows, ExactToRoundingAtTheLimit) {
  EXPECT_NEAR(WindowDominanceLimit(256, 53), 0.8644, 1e-4);
  EXPECT_NEAR(WindowDominanceLimit(256, 24), 0.9348, 1e-4);
  WindowsAtTheLimit<double>(256, 1e-14);
  WindowsAtTheLimit<float>(256, 1e-5);
}

TEST(Tridiagonal, MethodNames) {
  EXPECT_EQ(*ParseTridiagonalMethod("pcr"), TridiagonalMethod::kPcr);
  EXPECT_EQ(*ParseTridiagonalMethod("pivoting"), TridiagonalMethod::kPivoting);
  EXPECT_EQ(MethodName(TridiagonalMethod::kPivoting), "pivoting");
  EXPECT_EQ(*ParseTridiagonalMethod(""), TridiagonalMethod::kAuto);
  EXPECT_FALSE(ParseTridiagonalMethod("cr").ok());
}

}  // namespace
}  // namespace trisolve
