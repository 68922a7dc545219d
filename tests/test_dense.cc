#include <cmath>
#include <cstring>
#include <vector>

#include <lapacke.h>

#include <random>

#include "dense_bound.h"
#include "gtest/gtest.h"
#include "trisolve/dense.h"
#include "trisolve/examples.h"
#include "trisolve/reference/dense.h"

namespace trisolve {
namespace {

template <typename T>
struct Run {
  std::vector<T> x;
  std::vector<SystemStatus> status;
};

template <typename T>
Run<T> Solve(const std::vector<T>& A, const std::vector<T>& b, int64_t batch, int64_t n,
             DenseMethod m) {
  Run<T> r;
  r.x.assign(batch * n, T(std::nan("")));
  r.status.assign(batch, SystemStatus::kDiverged);
  cpu::SolveDense(DenseProblem<T>{batch, n, A.data(), b.data()}, m,
                  DenseOutput<T>{r.x.data(), r.status.data()});
  return r;
}

TEST(Dense, HandWorkedNeedsARowExchange) {
  // [0 1; 1 1] x = [2 3]: the first pivot is zero without the exchange. x = [1 2].
  auto r = Solve<double>({0, 1, 1, 1}, {2, 3}, 1, 2, DenseMethod::kGaussJordan);
  EXPECT_EQ(r.status[0], SystemStatus::kOk);
  EXPECT_DOUBLE_EQ(r.x[0], 1);
  EXPECT_DOUBLE_EQ(r.x[1], 2);
  // [2 1 1; 4 -6 0; -2 7 2] x = [5 -2 9] -> x = [1 1 2].
  auto s = Solve<double>({2, 1, 1, 4, -6, 0, -2, 7, 2}, {5, -2, 9}, 1, 3, DenseMethod::kGaussJordan);
  EXPECT_NEAR(s.x[0], 1, 1e-15);
  EXPECT_NEAR(s.x[1], 1, 1e-15);
  EXPECT_NEAR(s.x[2], 2, 1e-15);
  // The same two by LU: same pivots, same answers.
  auto lr = Solve<double>({0, 1, 1, 1}, {2, 3}, 1, 2, DenseMethod::kLu);
  EXPECT_EQ(lr.status[0], SystemStatus::kOk);
  EXPECT_DOUBLE_EQ(lr.x[0], 1);
  EXPECT_DOUBLE_EQ(lr.x[1], 2);
  auto ls = Solve<double>({2, 1, 1, 4, -6, 0, -2, 7, 2}, {5, -2, 9}, 1, 3, DenseMethod::kLu);
  EXPECT_NEAR(ls.x[0], 1, 1e-15);
  EXPECT_NEAR(ls.x[1], 1, 1e-15);
  EXPECT_NEAR(ls.x[2], 2, 1e-15);
}

TEST(Dense, HandWorkedSymmetricHouseholderPcr) {
  // [4 1 2; 1 3 0; 2 0 5] x = [7 4 7] -> x = [1 1 1].
  std::vector<double> A = {4, 1, 2, 1, 3, 0, 2, 0, 5}, b = {7, 4, 7};
  auto r = Solve(A, b, 1, 3, DenseMethod::kHouseholderPcr);
  ASSERT_EQ(r.status[0], SystemStatus::kOk);
  for (double v : r.x) EXPECT_NEAR(v, 1, 1e-14);
  auto one = Solve<double>({4}, {2}, 1, 1, DenseMethod::kHouseholderPcr);
  EXPECT_DOUBLE_EQ(one.x[0], 0.5);
}

TEST(Dense, SingularMatricesAreFlagged) {
  // Batch: [1 2; 2 4] (exactly singular), [1 2 3; 4 5 6; 7 8 9] (singular to rounding),
  // padded as 3x3 systems: system 0 = diag(1, 1, 1) with the 2x2 block singular.
  std::vector<double> A = {1, 2, 0, 2, 4, 0, 0, 0, 1,  1, 2, 3, 4, 5, 6, 7, 8, 9,
                           2, 0, 0, 0, 2, 0, 0, 0, 2};
  std::vector<double> b = {1, 1, 1, 1, 1, 1, 2, 2, 2};
  for (DenseMethod m : {DenseMethod::kGaussJordan, DenseMethod::kLu}) {
    auto r = Solve(A, b, 3, 3, m);
    EXPECT_EQ(r.status[0], SystemStatus::kSingular);
    EXPECT_EQ(r.status[1], SystemStatus::kSingular);
    EXPECT_EQ(r.status[2], SystemStatus::kOk);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(r.x[i], 0.0);
    for (int i = 6; i < 9; ++i) EXPECT_DOUBLE_EQ(r.x[i], 1.0);
  }
  std::vector<double> z(4, 0.0), bz = {1, 1};
  EXPECT_EQ(Solve(z, bz, 1, 2, DenseMethod::kHouseholderPcr).status[0], SystemStatus::kSingular);
}

// The kept elimination (FactorDense, SolveFactored: what a dense system by handle reuses on the
// CPU backend) gives the one-shot solve's x bit for bit, for many right-hand sides (both are the
// elimination followed by its operations on b; this keeps them so); a singular matrix is
// SINGULAR with x = 0 for each of them.
template <typename T>
void FactoredMatchesOneShot() {
  std::mt19937_64 rng(77);
  std::uniform_real_distribution<double> u(-1, 1);
  for (const int64_t n : {1, 2, 7, 33, 64}) {
    const int64_t batch = 5;
    std::vector<T> A(size_t(batch * n * n));
    for (auto& v : A) v = T(u(rng));
    // Matrix 3 singular (two equal rows), where n allows.
    if (n >= 2)
      for (int64_t j = 0; j < n; ++j) A[size_t(3 * n * n + n + j)] = A[size_t(3 * n * n + j)];
    for (DenseMethod m : {DenseMethod::kAuto, DenseMethod::kGaussJordan, DenseMethod::kLu}) {
      SCOPED_TRACE(::testing::Message() << "n = " << n << ", " << MethodName(m));
      const cpu::DenseFactors<T> f = cpu::FactorDense(batch, n, A.data(), m);
      for (int rhs = 0; rhs < 4; ++rhs) {
        std::vector<T> b(size_t(batch * n));
        for (auto& v : b) v = T(u(rng)) * T(rhs == 3 ? 1e30 : 1);
        const Run<T> want = Solve(A, b, batch, n, m);
        std::vector<T> x(size_t(batch * n), T(std::nan("")));
        std::vector<SystemStatus> status(size_t(batch), SystemStatus::kDiverged);
        cpu::SolveFactored(f, b.data(), x.data(), status.data());
        EXPECT_EQ(status, want.status);
        if (n >= 2) {
          EXPECT_EQ(status[3], SystemStatus::kSingular);
        }
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_EQ(std::memcmp(&x[i], &want.x[i], sizeof(T)), 0)
              << "value " << i << ": " << x[i] << " against " << want.x[i];
      }
    }
  }
}

TEST(Dense, KeptEliminationGivesTheOneShotAnswerBitForBit) {
  FactoredMatchesOneShot<double>();
  FactoredMatchesOneShot<float>();
  EXPECT_FALSE(cpu::Factorable(DenseMethod::kHouseholderPcr));
}

TEST(Dense, HilbertWithinWhatItsConditionAllows) {
  // H_n has condition ~ 1e13 at n = 10: the forward error may be ~ cond * eps, the backward
  // error must stay at rounding level.
  for (int n : {4, 8, 10}) {
    std::vector<double> A(n * n), x(n, 1.0), b(n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) A[i * n + j] = 1.0 / (i + j + 1), b[i] += A[i * n + j];
    auto r = Solve(A, b, 1, n, DenseMethod::kGaussJordan);
    ASSERT_EQ(r.status[0], SystemStatus::kOk) << n;
    const double cond = n == 4 ? 1.6e4 : n == 8 ? 1.5e10 : 1.6e13;
    for (double v : r.x) EXPECT_NEAR(v, 1.0, 50 * cond * 2.2e-16) << n;
    EXPECT_LT(DenseBackwardError(DenseProblem<double>{1, n, A.data(), b.data()}, r.x.data(),
                                 r.status.data()),
              1e-15);
  }
}

class DenseSizes : public ::testing::TestWithParam<int64_t> {};

TEST_P(DenseSizes, RandomWellConditionedBothMethodsAndPrecisions) {
  const int64_t n = GetParam(), batch = n > 64 ? 2 : 6;
  auto ex = examples::RandomDense(batch, n, /*symmetric=*/true, 11 + n);
  std::vector<double> A(ex["a"].as<double>(), ex["a"].as<double>() + batch * n * n);
  std::vector<double> b(ex["b"].as<double>(), ex["b"].as<double>() + batch * n);
  DenseProblem<double> p{batch, n, A.data(), b.data()};
  ASSERT_EQ(FirstNonSymmetric(p), -1);
  auto gj = Solve(A, b, batch, n, DenseMethod::kGaussJordan);
  auto hp = Solve(A, b, batch, n, DenseMethod::kHouseholderPcr);
  auto lu = Solve(A, b, batch, n, DenseMethod::kLu);
  for (int64_t s = 0; s < batch; ++s) {
    EXPECT_EQ(gj.status[s], SystemStatus::kOk);
    EXPECT_EQ(hp.status[s], SystemStatus::kOk);
    EXPECT_EQ(lu.status[s], SystemStatus::kOk);
  }
  EXPECT_LT(DenseBackwardError(p, gj.x.data(), gj.status.data()), 1e-15);
  EXPECT_LT(DenseBackwardError(p, hp.x.data(), hp.status.data()), 1e-14);
  EXPECT_LT(DenseBackwardError(p, lu.x.data(), lu.status.data()), 1e-15);
  for (size_t i = 0; i < gj.x.size(); ++i) {
    EXPECT_NEAR(gj.x[i], hp.x[i], 1e-10);
    EXPECT_NEAR(gj.x[i], lu.x[i], 1e-10);
  }

  std::vector<float> Af(A.begin(), A.end()), bf(b.begin(), b.end());
  for (DenseMethod m : {DenseMethod::kGaussJordan, DenseMethod::kLu}) {
    auto f = Solve(Af, bf, batch, n, m);
    EXPECT_LT(DenseBackwardError(DenseProblem<float>{batch, n, Af.data(), bf.data()},
                                 f.x.data(), f.status.data()),
              1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Orders, DenseSizes, ::testing::Values(1, 2, 3, 17, 32, 33, 128));

// The CPU references against LAPACK (dgesv: LU with partial pivoting; dsysv: Bunch-Kaufman for
// symmetric indefinite A): forward errors within what the conditioning allows, the same
// verdict on exactly singular matrices.
TEST(Dense, AgreesWithLapack) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int n : {1, 2, 7, 33, 64, 200}) {
    for (bool symmetric : {false, true}) {
      std::vector<double> A(n * n), b(n);
      for (auto& v : A) v = u(rng);
      if (symmetric)
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < i; ++j) A[i * n + j] = A[j * n + i];
      for (int i = 0; i < n; ++i) A[i * n + i] += (i % 2 ? -1 : 1) * std::sqrt(double(n));
      for (auto& v : b) v = u(rng);
      std::vector<double> Al = A, xl = b;
      std::vector<lapack_int> ipiv(n);
      const lapack_int info =
          symmetric ? LAPACKE_dsysv(LAPACK_ROW_MAJOR, 'U', n, 1, Al.data(), n, ipiv.data(),
                                    xl.data(), 1)
                    : LAPACKE_dgesv(LAPACK_ROW_MAJOR, n, 1, Al.data(), n, ipiv.data(),
                                    xl.data(), 1);
      ASSERT_EQ(info, 0) << n;
      double xm = 0;
      for (double v : xl) xm = std::max(xm, std::abs(v));
      std::vector<DenseMethod> methods = {DenseMethod::kGaussJordan, DenseMethod::kLu};
      if (symmetric) methods.push_back(DenseMethod::kHouseholderPcr);
      for (DenseMethod m : methods) {
        auto r = Solve(A, b, 1, n, m);
        ASSERT_EQ(r.status[0], SystemStatus::kOk) << MethodName(m) << " n = " << n;
        double dm = 0;
        for (int i = 0; i < n; ++i) dm = std::max(dm, std::abs(r.x[i] - xl[i]));
        // These matrices have condition numbers of a few hundred at most.
        EXPECT_LE(dm, 1e-11 * xm) << MethodName(m) << " n = " << n << (symmetric ? " sym" : "");
      }
    }
  }
  // Hilbert n = 8 (condition 1.5e10): LAPACK and Gauss-Jordan agree to what it allows.
  const int n = 8;
  std::vector<double> H(n * n), b(n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) H[i * n + j] = 1.0 / (i + j + 1), b[i] += H[i * n + j];
  std::vector<double> Hl = H, xl = b;
  std::vector<lapack_int> ipiv(n);
  ASSERT_EQ(LAPACKE_dgesv(LAPACK_ROW_MAJOR, n, 1, Hl.data(), n, ipiv.data(), xl.data(), 1), 0);
  for (DenseMethod m : {DenseMethod::kGaussJordan, DenseMethod::kLu}) {
    auto r = Solve(H, b, 1, n, m);
    ASSERT_EQ(r.status[0], SystemStatus::kOk);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(r.x[i], xl[i], 1.5e10 * 1e-15 * 10);
  }
  // Exactly singular: LAPACK reports info > 0, the references flag the system.
  std::vector<double> S = {1, 2, 3, 2, 4, 6, 1, 0, 1}, bs = {1, 2, 3};
  std::vector<double> Sl = S, xs = bs;
  std::vector<lapack_int> ip3(3);
  EXPECT_GT(LAPACKE_dgesv(LAPACK_ROW_MAJOR, 3, 1, Sl.data(), 3, ip3.data(), xs.data(), 1), 0);
  for (DenseMethod m : {DenseMethod::kGaussJordan, DenseMethod::kLu})
    EXPECT_EQ(Solve(S, bs, 1, 3, m).status[0], SystemStatus::kSingular);
}

// float32 judged by what backward stability promises (tests/dense_bound.h): backward error
// <= n u, forward error against dgesv on the same data <= 8 kappa eta. Uniform entries, no
// diagonal weight (row exchanges needed; kappa in the hundreds to ten thousands), and LAPACK's
// own float32 solver, sgesv, held to the same bound so the bound is one LAPACK meets.
TEST(Dense, Float32WithinWhatBackwardStabilityAllows) {
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t n : {1, 2, 8, 33, 128, 300}) {
    const int64_t batch = n <= 33 ? 20 : 3;
    std::vector<float> A(batch * n * n), b(batch * n);
    for (auto& v : A) v = float(u(rng));
    for (auto& v : b) v = float(u(rng));
    for (int64_t s = 0; s < batch; ++s) {
      std::vector<float> Al(A.begin() + s * n * n, A.begin() + (s + 1) * n * n),
          xl(b.begin() + s * n, b.begin() + (s + 1) * n);
      std::vector<lapack_int> ipiv(n);
      ASSERT_EQ(LAPACKE_sgesv(LAPACK_ROW_MAJOR, n, 1, Al.data(), n, ipiv.data(), xl.data(), 1), 0);
      auto lapack = testing::JudgeFloat32(n, &A[s * n * n], &b[s * n], xl.data());
      EXPECT_EQ(lapack.fault, "") << "sgesv, n = " << n << ", system " << s;
    }
    for (DenseMethod m : {DenseMethod::kGaussJordan, DenseMethod::kLu}) {
      auto r = Solve(A, b, batch, n, m);
      for (int64_t s = 0; s < batch; ++s) {
        ASSERT_EQ(r.status[s], SystemStatus::kOk) << MethodName(m) << " n = " << n;
        auto v = testing::JudgeFloat32(n, &A[s * n * n], &b[s * n], &r.x[s * n]);
        EXPECT_EQ(v.fault, "") << MethodName(m) << ", n = " << n << ", system " << s;
      }
    }
  }
}

TEST(Dense, SymmetryCheck) {
  std::vector<double> A = {1, 2, 2, 1, 1, 2, 3, 1}, b(4);
  EXPECT_EQ(FirstNonSymmetric(DenseProblem<double>{2, 2, A.data(), b.data()}), 1);
}

}  // namespace
}  // namespace trisolve
