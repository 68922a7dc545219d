#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "trisolve/tridiagonal.h"

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
    worst = std::max(worst, r / (an * xn + dn));
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
                                         TridiagonalMethod::kPartitioned)));

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

TEST(Tridiagonal, AllZeroRowIsSingularInFloat32) {
  Batch<float> s{1, 3, Layout::kFlat, {0, 0, 1}, {1, 0, 1}, {1, 0, 0}, {1, 1, 1}};
  Solve(s, TridiagonalMethod::kThomas);
  EXPECT_EQ(s.status[0], SystemStatus::kSingular);
}

TEST(Tridiagonal, MethodNames) {
  EXPECT_EQ(*ParseTridiagonalMethod("pcr"), TridiagonalMethod::kPcr);
  EXPECT_EQ(*ParseTridiagonalMethod(""), TridiagonalMethod::kAuto);
  EXPECT_FALSE(ParseTridiagonalMethod("cr").ok());
}

}  // namespace
}  // namespace trisolve
