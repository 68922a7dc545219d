// The error measures themselves (issue 35, item 8): the backward errors of kernels/cpu, which
// the server reports as its residual and the GPU tests use as their check, and the tests'
// WorseOf. A NaN or Inf anywhere in an answer the status calls OK must score as the worst
// error there is: std::max(worst, NaN) keeps worst, so a measure that forgets it scores an
// unwritten or broken element as no error at all. tests/mutations/19 reverts the measures to
// that and these tests must fail.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "error_measure.h"
#include "gtest/gtest.h"
#include "trisolve/dense.h"
#include "trisolve/reference/dense.h"
#include "trisolve/reference/tree.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tree.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ErrorMeasures, WorseOfTakesNaNAsTheWorst) {
  const double nan = std::nan("");
  EXPECT_EQ(testing::WorseOf(0.0, nan), kInf);
  EXPECT_EQ(testing::WorseOf(nan, 0.0), kInf);
  EXPECT_EQ(testing::WorseOf(1e-3, 2e-3), 2e-3);
  double worst = 0;
  for (double e : {1e-16, nan, 1e-15}) worst = testing::WorseOf(worst, e);
  EXPECT_EQ(worst, kInf);
}

// Where a bad value goes: the first, a middle and the last element of the second of three
// systems (the first is clean, so a measure must not stop at it).
template <typename T, typename Measure>
void ExpectBadValuesAreInfinite(const std::vector<T>& good, int64_t n, int64_t batch,
                                Layout layout, Measure measure, const std::string& what) {
  const std::vector<SystemStatus> ok(static_cast<size_t>(batch), SystemStatus::kOk);
  const double clean = measure(good.data(), ok.data());
  EXPECT_LT(clean, sizeof(T) == 8 ? 1e-14 : 1e-5) << what << ": the unbroken answer";
  for (T bad : {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                -std::numeric_limits<T>::infinity()})
    for (int64_t i : {int64_t{0}, n / 2, n - 1}) {
      std::vector<T> x = good;
      x[static_cast<size_t>(ElementIndex(layout, batch, n, 1, i))] = bad;
      EXPECT_EQ(measure(x.data(), ok.data()), kInf)
          << what << ": " << double(bad) << " at element " << i << " of system 1";
      // A system whose status says it is not OK is not judged: its x is the caller's to ignore.
      std::vector<SystemStatus> st = ok;
      st[1] = SystemStatus::kSingular;
      EXPECT_LT(measure(x.data(), st.data()), sizeof(T) == 8 ? 1e-14 : 1e-5)
          << what << ": system 1 flagged singular";
    }
}

template <typename T>
void Tridiagonal(Layout layout) {
  const int64_t n = 9, batch = 3;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> a(n * batch), b(n * batch), c(n * batch), d(n * batch), x(n * batch);
  for (int64_t e = 0; e < n * batch; ++e) {
    a[e] = T(u(rng));
    c[e] = T(u(rng));
    b[e] = T(3 + u(rng));
    d[e] = T(u(rng));
  }
  TridiagonalProblem<T> p{batch, n, layout, a.data(), b.data(), c.data(), d.data()};
  std::vector<SystemStatus> st(batch);
  cpu::SolveTridiagonal(p, TridiagonalMethod::kThomas, TridiagonalOutput<T>{x.data(), st.data()});
  ExpectBadValuesAreInfinite<T>(
      x, n, batch, layout,
      [&](const T* y, const SystemStatus* s) { return TridiagonalBackwardError(p, y, s); },
      "tridiagonal");
}

template <typename T>
void Tree(Layout layout) {
  const int64_t n = 11, batch = 3;
  const std::vector<int32_t> parent = {-1, 0, 1, 1, 0, 4, 5, 5, 2, 8, 4};
  std::mt19937_64 rng(6);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> lo(n * batch), up(n * batch), dg(n * batch), rhs(n * batch), x(n * batch);
  for (int64_t e = 0; e < n * batch; ++e) {
    lo[e] = T(u(rng));
    up[e] = T(u(rng));
    dg[e] = T(5 + u(rng));
    rhs[e] = T(u(rng));
  }
  TreeProblem<T> p{batch, n, layout, parent.data(), false, lo.data(), up.data(), dg.data(),
                   rhs.data()};
  std::vector<SystemStatus> st(batch);
  cpu::SolveTree(p, TreeMethod::kHines, TreeOutput<T>{x.data(), st.data()});
  ExpectBadValuesAreInfinite<T>(
      x, n, batch, layout,
      [&](const T* y, const SystemStatus* s) { return TreeBackwardError(p, y, s); }, "tree");
}

template <typename T>
void Dense() {
  const int64_t n = 7, batch = 3;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> A(n * n * batch), b(n * batch), x(n * batch);
  for (auto& v : A) v = T(u(rng));
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t i = 0; i < n; ++i) A[s * n * n + i * n + i] += T(4);
  for (auto& v : b) v = T(u(rng));
  DenseProblem<T> p{batch, n, A.data(), b.data()};
  std::vector<SystemStatus> st(batch);
  cpu::SolveDense(p, DenseMethod::kLu, DenseOutput<T>{x.data(), st.data()});
  ExpectBadValuesAreInfinite<T>(
      x, n, batch, Layout::kFlat,
      [&](const T* y, const SystemStatus* s) { return DenseBackwardError(p, y, s); }, "dense");
}

TEST(ErrorMeasures, TridiagonalBackwardErrorOfANonFiniteAnswerIsInfinite) {
  for (Layout l : {Layout::kFlat, Layout::kInterleaved}) {
    Tridiagonal<double>(l);
    Tridiagonal<float>(l);
  }
}

TEST(ErrorMeasures, TreeBackwardErrorOfANonFiniteAnswerIsInfinite) {
  for (Layout l : {Layout::kFlat, Layout::kInterleaved}) {
    Tree<double>(l);
    Tree<float>(l);
  }
}

TEST(ErrorMeasures, DenseBackwardErrorOfANonFiniteAnswerIsInfinite) {
  Dense<double>();
  Dense<float>();
}

}  // namespace
}  // namespace trisolve
