// The CUDA backend's dense solves against the CPU reference. Skips, saying so, without a GPU.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "gtest/gtest.h"
#include "trisolve/backend.h"
#include "trisolve/dense.h"
#include "trisolve/examples.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;


template <typename T>
void Check(int64_t n, int64_t batch, double tol_x, double tol_be) {
  std::mt19937_64 rng(n * 31 + batch);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> A(batch * n * n), b(batch * n);
  for (auto& v : A) v = T(u(rng));  // no diagonal weight: row exchanges are needed
  for (auto& v : b) v = T(u(rng));
  // System 0: a Hilbert matrix where its verdict is clear (n <= 10: cond <= 1.6e13; beyond,
  // it is singular to rounding and either verdict is right); system 1: two equal rows
  // (singular); system 2: a zero column (singular).
  const bool hilbert = batch >= 3 && n >= 2 && n <= (sizeof(T) == 8 ? 10 : 4);
  if (batch >= 3 && n >= 2) {
    for (int64_t i = 0; i < n && hilbert; ++i)
      for (int64_t j = 0; j < n; ++j) A[i * n + j] = T(1.0 / double(i + j + 1));
    for (int64_t j = 0; j < n; ++j) A[n * n + (n - 1) * n + j] = A[n * n + j];
    for (int64_t i = 0; i < n; ++i) A[2 * n * n + i * n] = T(0);
  }
  DenseProblem<T> p{batch, n, A.data(), b.data()};
  std::vector<T> xg(batch * n, T(std::nan(""))), xc(batch * n);
  std::vector<SystemStatus> sg(batch), sc(batch);
  auto info = Cuda()->Solve(p, DenseMethod::kAuto, DenseOutput<T>{xg.data(), sg.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->method, n <= 32   ? "gauss-jordan-warp"
                          : n <= 64 ? "gauss-jordan-2warps"
                                    : "lu (cublas getrfBatched)");
  cpu::SolveDense(p, n <= 64 ? DenseMethod::kGaussJordan : DenseMethod::kLu,
                  DenseOutput<T>{xc.data(), sc.data()});
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s) {
    ASSERT_EQ(sg[s], sc[s]) << "system " << s << " of n = " << n;
    if (sc[s] != SystemStatus::kOk) {
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(xg[s * n + i], T(0));
      continue;
    }
    if (s == 0 && hilbert) continue;  // Hilbert: judged by backward error only
    double dm = 0, xm = 0;
    for (int64_t i = 0; i < n; ++i) {
      dm = std::max(dm, std::abs(double(xg[s * n + i]) - double(xc[s * n + i])));
      xm = std::max(xm, std::abs(double(xc[s * n + i])));
    }
    worst = std::max(worst, dm / xm);
  }
  EXPECT_LE(worst, tol_x) << "n = " << n;
  EXPECT_LE(DenseBackwardError(p, xg.data(), sg.data()), tol_be) << "n = " << n;
}

class CudaDense : public ::testing::TestWithParam<int64_t> {};

TEST_P(CudaDense, MatchesTheCpuReference) {
  REQUIRE_GPU();
  Check<double>(GetParam(), 2000, 1e-9, 1e-14);
  Check<float>(GetParam(), 500, 5e-2, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Orders, CudaDense, ::testing::Values(1, 2, 3, 8, 9, 17, 32, 33, 47, 64, 65, 128));

// Large systems: LU through cuBLAS (batched) or cuSOLVER (one at a time), householder-pcr
// through cuSOLVER's sytrd and the tridiagonal kernels. b = A x_true; the CPU reference where
// it is quick enough (n <= 1000), the backward error and x_true everywhere.
template <typename T>
void CheckLarge(int64_t n, int64_t batch, DenseMethod m, bool symmetric, const char* expect,
                double tol_be, double tol_x) {
  std::mt19937_64 rng(n * 7 + batch);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> A(batch * n * n), b(batch * n, T(0)), xt(batch * n);
  for (int64_t s = 0; s < batch; ++s) {
    T* As = A.data() + s * n * n;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) As[i * n + j] = T(u(rng));
    if (symmetric) {  // indefinite: diagonal of both signs
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < i; ++j) As[i * n + j] = As[j * n + i];
        As[i * n + i] += T((i % 2 ? -2 : 2) * std::sqrt(double(n)));
      }
    }
    for (int64_t i = 0; i < n; ++i) xt[s * n + i] = T(u(rng));
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += double(As[i * n + j]) * double(xt[s * n + j]);
      b[s * n + i] = T(acc);
    }
  }
  // The last system of a batch (LU): two equal rows, singular. (A singular symmetric system
  // is not used for householder-pcr: PCR on a singular T may return a huge x whose normwise
  // backward error is small, which is a valid answer to a singular system, not a test.)
  const bool singular_last = batch > 1 && !symmetric;
  if (singular_last)
    for (int64_t j = 0; j < n; ++j)
      A[(batch - 1) * n * n + (n - 1) * n + j] = A[(batch - 1) * n * n + j];
  DenseProblem<T> p{batch, n, A.data(), b.data()};
  std::vector<T> xg(batch * n, T(std::nan("")));
  std::vector<SystemStatus> sg(batch);
  auto info = Cuda()->Solve(p, m, DenseOutput<T>{xg.data(), sg.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->method, expect) << "n = " << n;
  const int64_t good = singular_last ? batch - 1 : batch;
  for (int64_t s = 0; s < good; ++s) {
    ASSERT_EQ(sg[s], SystemStatus::kOk) << "system " << s << ", n = " << n;
    double dm = 0;
    for (int64_t i = 0; i < n; ++i)
      dm = std::max(dm, std::abs(double(xg[s * n + i]) - double(xt[s * n + i])));
    EXPECT_LE(dm, tol_x) << "system " << s << ", n = " << n;
  }
  if (singular_last) {
    EXPECT_EQ(sg[batch - 1], SystemStatus::kSingular);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(xg[(batch - 1) * n + i], T(0));
  }
  EXPECT_LE(DenseBackwardError(p, xg.data(), sg.data()), tol_be) << "n = " << n;
  if (n <= 1000) {
    std::vector<T> xc(batch * n);
    std::vector<SystemStatus> sc(batch);
    cpu::SolveDense(p, m == DenseMethod::kAuto ? DenseMethod::kLu : m,
                    DenseOutput<T>{xc.data(), sc.data()});
    for (int64_t s = 0; s < good; ++s) {
      ASSERT_EQ(sc[s], SystemStatus::kOk);
      double dm = 0;
      for (int64_t i = 0; i < n; ++i)
        dm = std::max(dm, std::abs(double(xg[s * n + i]) - double(xc[s * n + i])));
      EXPECT_LE(dm, tol_x) << "against the CPU, system " << s << ", n = " << n;
    }
  }
}

TEST(CudaDenseLarge, LuBatchedAndSingle) {
  REQUIRE_GPU();
  CheckLarge<double>(100, 50, DenseMethod::kAuto, false, "lu (cublas getrfBatched)", 1e-14, 1e-10);
  CheckLarge<double>(512, 4, DenseMethod::kLu, false, "lu (cublas getrfBatched)", 1e-14, 1e-9);
  CheckLarge<double>(1000, 1, DenseMethod::kAuto, false, "lu (cusolver getrf)", 1e-14, 1e-9);
  CheckLarge<double>(1000, 3, DenseMethod::kAuto, false, "lu (cusolver getrf)", 1e-14, 1e-9);
  CheckLarge<double>(4096, 1, DenseMethod::kAuto, false, "lu (cusolver getrf)", 1e-14, 1e-7);
  CheckLarge<float>(300, 8, DenseMethod::kAuto, false, "lu (cublas getrfBatched)", 1e-5, 2e-2);
  CheckLarge<float>(2000, 1, DenseMethod::kAuto, false, "lu (cusolver getrf)", 1e-5, 5e-1);
}

// gauss-jordan for n > 64: blocked, panels of 512 columns. One panel (65, 128, 512), a panel
// and one column (513), several with a short last one (1000, 4096); the last system of each
// batch singular; float32 too. The CPU's Gauss-Jordan picks the same pivots.
TEST(CudaDenseLarge, GaussJordanBlocked) {
  REQUIRE_GPU();
  const char* gj = "gauss-jordan-blocked";
  CheckLarge<double>(65, 5, DenseMethod::kGaussJordan, false, gj, 1e-14, 1e-10);
  CheckLarge<double>(128, 3, DenseMethod::kGaussJordan, false, gj, 1e-14, 1e-10);
  CheckLarge<double>(512, 2, DenseMethod::kGaussJordan, false, gj, 1e-14, 1e-10);
  CheckLarge<double>(513, 3, DenseMethod::kGaussJordan, false, gj, 1e-14, 1e-10);
  CheckLarge<double>(1000, 3, DenseMethod::kGaussJordan, false, gj, 1e-14, 1e-9);
  // Gauss-Jordan is forward stable but not backward stable (Peters and Wilkinson): its
  // residual grows with cond(A), and this matrix (uniform entries, no diagonal weight) is not
  // well conditioned: 1.3e-14 measured, where LU gets 3e-16.
  CheckLarge<double>(4096, 1, DenseMethod::kGaussJordan, false, gj, 5e-14, 1e-7);
  CheckLarge<float>(300, 4, DenseMethod::kGaussJordan, false, gj, 1e-5, 2e-2);
  CheckLarge<float>(2000, 1, DenseMethod::kGaussJordan, false, gj, 1e-5, 5e-1);
}

TEST(CudaDense, HouseholderPcrBatchedSmall) {
  REQUIRE_GPU();
  // One block a system up to n = 64 against the CPU's householder-pcr: symmetric indefinite
  // matrices, float64 and float32, and a zero matrix (PCR meets a zero pivot: flagged).
  for (int64_t n : {1, 2, 3, 17, 32, 33, 64}) {
    auto ex = examples::RandomDense(300, n, /*symmetric=*/true, 40 + n);
    std::vector<double> A(ex["a"].as<double>(), ex["a"].as<double>() + 300 * n * n);
    std::vector<double> b(ex["b"].as<double>(), ex["b"].as<double>() + 300 * n);
    for (int64_t e = 0; e < n * n; ++e) A[299 * n * n + e] = 0;  // the last system: zero
    DenseProblem<double> p{300, n, A.data(), b.data()};
    std::vector<double> xg(300 * n, std::nan("")), xc(300 * n);
    std::vector<SystemStatus> sg(300), sc(300);
    auto info = Cuda()->Solve(p, DenseMethod::kHouseholderPcr,
                              DenseOutput<double>{xg.data(), sg.data()}, SolveControl{});
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->method, "householder-pcr-block");
    cpu::SolveDense(p, DenseMethod::kHouseholderPcr, DenseOutput<double>{xc.data(), sc.data()});
    for (int64_t s = 0; s < 300; ++s) ASSERT_EQ(sg[s], sc[s]) << "system " << s << ", n " << n;
    EXPECT_EQ(sg[299], SystemStatus::kSingular);
    double dm = 0, xm = 0;
    for (int64_t e = 0; e < 299 * n; ++e) {
      dm = std::max(dm, std::abs(xg[e] - xc[e]));
      xm = std::max(xm, std::abs(xc[e]));
    }
    EXPECT_LE(dm, 1e-11 * xm) << "n = " << n;
    // PCR has no pivoting: on these indefinite T the backward error is the method's, the same
    // as the CPU's (up to 1e-13 here), not Gauss-Jordan's.
    const double be = DenseBackwardError(p, xg.data(), sg.data());
    EXPECT_LE(be, 10 * DenseBackwardError(p, xc.data(), sc.data()) + 1e-14) << "n = " << n;
    EXPECT_LE(be, 1e-12) << "n = " << n;
    std::vector<float> Af(A.begin(), A.end()), bf(b.begin(), b.end()), xf(300 * n);
    std::vector<SystemStatus> sf(300);
    DenseProblem<float> pf{300, n, Af.data(), bf.data()};
    auto fi = Cuda()->Solve(pf, DenseMethod::kHouseholderPcr, DenseOutput<float>{xf.data(), sf.data()},
                            SolveControl{});
    ASSERT_TRUE(fi.ok()) << fi.status();
    std::vector<float> xfc(300 * n);
    std::vector<SystemStatus> sfc(300);
    cpu::SolveDense(pf, DenseMethod::kHouseholderPcr, DenseOutput<float>{xfc.data(), sfc.data()});
    EXPECT_LE(DenseBackwardError(pf, xf.data(), sf.data()),
              4 * DenseBackwardError(pf, xfc.data(), sfc.data()) + 1e-6)
        << "n = " << n;
  }
}

TEST(CudaDenseLarge, HouseholderPcrSymmetricIndefinite) {
  REQUIRE_GPU();
  const char* hp = "householder-pcr (cusolver sytrd)";
  CheckLarge<double>(128, 3, DenseMethod::kHouseholderPcr, true, hp, 1e-14, 1e-11);
  CheckLarge<double>(1000, 1, DenseMethod::kHouseholderPcr, true, hp, 1e-14, 1e-10);
  CheckLarge<double>(1500, 1, DenseMethod::kHouseholderPcr, true, hp, 1e-14, 1e-10);
  CheckLarge<double>(4096, 1, DenseMethod::kHouseholderPcr, true, hp, 1e-14, 1e-9);
  CheckLarge<float>(1000, 1, DenseMethod::kHouseholderPcr, true, hp, 1e-5, 1e-2);
}

}  // namespace
}  // namespace trisolve
